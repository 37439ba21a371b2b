// What does an AMX tile load cost against a tile product on this machine? (session 57, README.md here)
// Loads alone, products alone, and the int8 GEMM's 1 A + 4 B pattern against 2 x 2 blocking (2 A + 2 B per
// four products) over panels that fit L1, L2 or neither. Not part of the package; build and run:
//   g++ -O2 -mamx-tile -mamx-int8 -o /tmp/amx-tile-loads amx-tile-loads.cpp && /tmp/amx-tile-loads
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <vector>
struct alignas(64) Cfg { uint8_t palette=1, start=0, res[14]={}; uint16_t colsb[16]={}; uint8_t rows[16]={}; };
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
#define TIME(label, iters, per, body) { double t0=now(); for(long i=0;i<(iters);i++){ body } double s=now()-t0; printf("%-55s %7.2f ns/iter %7.0f GMAC/s\n", label, s/(iters)*1e9, (iters)*(per)*16384.0/s/1e9); }
int main(){
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg c; for(int t=0;t<8;t++){c.rows[t]=16;c.colsb[t]=64;} _tile_loadconfig(&c);
  std::vector<int8_t> v(64<<20, 1); const int8_t* a = v.data();
  const long N = 5000000;
  TIME("load t4 same addr", N, 0, _tile_loadd(4, a, 64);)
  TIME("load t4,t5,t6,t7 same addr", N, 0, _tile_loadd(4, a, 64);_tile_loadd(5, a, 64);_tile_loadd(6, a, 64);_tile_loadd(7, a, 64);)
  TIME("load t4,t5,t6,t7 stride256 L1", N, 0, const int8_t*p=a+(i&3)*4096; _tile_loadd(4, p, 256);_tile_loadd(5, p+64, 256);_tile_loadd(6, p+128, 256);_tile_loadd(7, p+192, 256);)
  TIME("dp only 4 indep", N, 4, _tile_dpbsud(0,4,5); _tile_dpbsud(1,4,5); _tile_dpbsud(2,4,5); _tile_dpbsud(3,4,5);)
  TIME("dp only 1 chain", N, 1, _tile_dpbsud(0,4,5);)
  TIME("dp 2 chains", N, 2, _tile_dpbsud(0,4,5);_tile_dpbsud(1,4,5);)
  // real kernel pattern, A stride K from a 16xK block, B panel K*64
  for (long K : {256L, 1536L, 8960L}) {
    const int8_t* A = a; const int8_t* P = a + (32<<20);
    long steps = K/64; long iters = N*4/ (steps*5) + 1; char lab[80];
    snprintf(lab, 80, "1x4 pattern K=%ld (panel %ld KB)", K, K*64/1024);
    double t0=now();
    for (long it=0; it<iters; it++) { for (long k=0;k<K;k+=64){ const int8_t* w=P+k*64;
      _tile_loadd(4, A+k, K);
      _tile_loadd(5, w, 256); _tile_dpbsud(0,4,5);
      _tile_loadd(5, w+64, 256); _tile_dpbsud(1,4,5);
      _tile_loadd(5, w+128, 256); _tile_dpbsud(2,4,5);
      _tile_loadd(5, w+192, 256); _tile_dpbsud(3,4,5);} }
    double s=now()-t0; printf("%-55s %7.0f GMAC/s\n", lab, iters*steps*4*16384.0/s/1e9);
    snprintf(lab, 80, "1x4 alt B tiles K=%ld", K);
    t0=now();
    for (long it=0; it<iters; it++) { for (long k=0;k<K;k+=64){ const int8_t* w=P+k*64;
      _tile_loadd(4, A+k, K);
      _tile_loadd(5, w, 256); _tile_dpbsud(0,4,5);
      _tile_loadd(6, w+64, 256); _tile_dpbsud(1,4,6);
      _tile_loadd(7, w+128, 256); _tile_dpbsud(2,4,7);
      _tile_loadd(5, w+192, 256); _tile_dpbsud(3,4,5);} }
    s=now()-t0; printf("%-55s %7.0f GMAC/s\n", lab, iters*steps*4*16384.0/s/1e9);
    snprintf(lab, 80, "2x2 K=%ld", K);
    t0=now();
    for (long it=0; it<iters; it++) { for (long k=0;k<K;k+=64){ const int8_t* w=P+k*64;
      _tile_loadd(4, A+k, K); _tile_loadd(6, w, 256); _tile_dpbsud(0,4,6);
      _tile_loadd(7, w+64, 256); _tile_dpbsud(1,4,7);
      _tile_loadd(5, A+16*K+k, K); _tile_dpbsud(2,5,6); _tile_dpbsud(3,5,7);} }
    s=now()-t0; printf("%-55s %7.0f GMAC/s\n", lab, iters*steps*4*16384.0/s/1e9);
  }
  _tile_release();
}
