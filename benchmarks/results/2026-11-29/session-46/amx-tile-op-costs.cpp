#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>
struct alignas(64) Cfg { uint8_t palette=1, start=0, res[14]={}; uint16_t colsb[16]={}; uint8_t rows[16]={}; };
alignas(64) int8_t A[16 * 4096];
alignas(64) uint8_t B[8][512];
alignas(64) int32_t C[8][16 * 16];
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  int rows = argc > 1 ? atoi(argv[1]) : 9;
  Cfg c;
  for (int p = 0; p < 2; ++p) { c.rows[2*p] = rows; c.colsb[2*p] = 32; c.rows[2*p+1] = 8; c.colsb[2*p+1] = 64; }
  for (int t = 4; t < 8; ++t) { c.rows[t] = rows; c.colsb[t] = 64; }
  _tile_loadconfig(&c);
  const int N = 100000;
  // (a) tdp only, 4 independent C, operands preloaded
  _tile_loadd(0, A, 4096); _tile_loadd(1, B[0], 64); _tile_loadd(2, A + 32, 4096); _tile_loadd(3, B[1], 64);
  uint64_t t0 = __rdtsc();
  for (int i = 0; i < N; ++i) { _tile_dpbsud(4, 0, 1); _tile_dpbsud(5, 2, 3); _tile_dpbsud(6, 0, 1); _tile_dpbsud(7, 2, 3); }
  uint64_t t1 = __rdtsc();
  printf("tdp only: %.1f cycles per tdp\n", double(t1 - t0) / (4.0 * N));
  // (b) zero+tdp+store, operands preloaded
  t0 = __rdtsc();
  for (int i = 0; i < N; ++i) {
    _tile_zero(4); _tile_dpbsud(4, 0, 1); _tile_zero(5); _tile_dpbsud(5, 2, 3); _tile_zero(6); _tile_dpbsud(6, 0, 1); _tile_zero(7); _tile_dpbsud(7, 2, 3);
    _tile_stored(4, C[0], 64); _tile_stored(5, C[1], 64); _tile_stored(6, C[2], 64); _tile_stored(7, C[3], 64);
  }
  t1 = __rdtsc();
  printf("zero+tdp+store: %.1f cycles per group\n", double(t1 - t0) / (4.0 * N));
  // (c) the kernel's pattern: loads of A and B each group
  t0 = __rdtsc();
  for (int i = 0; i < N; ++i) {
    for (int g = 0; g < 8; g += 4) {
      _tile_loadd(0, A + 32 * g, 4096); _tile_loadd(1, B[g], 64); _tile_zero(4); _tile_dpbsud(4, 0, 1);
      _tile_loadd(2, A + 32 * g + 32, 4096); _tile_loadd(3, B[g + 1], 64); _tile_zero(5); _tile_dpbsud(5, 2, 3);
      _tile_loadd(0, A + 32 * g + 64, 4096); _tile_loadd(1, B[g + 2], 64); _tile_zero(6); _tile_dpbsud(6, 0, 1);
      _tile_loadd(2, A + 32 * g + 96, 4096); _tile_loadd(3, B[g + 3], 64); _tile_zero(7); _tile_dpbsud(7, 2, 3);
      _tile_stored(4, C[g], 64); _tile_stored(5, C[g + 1], 64); _tile_stored(6, C[g + 2], 64); _tile_stored(7, C[g + 3], 64);
    }
  }
  t1 = __rdtsc();
  printf("load+zero+tdp+store: %.1f cycles per group\n", double(t1 - t0) / (8.0 * N));
  // (d) loads only
  t0 = __rdtsc();
  for (int i = 0; i < N; ++i) { _tile_loadd(0, A, 4096); _tile_loadd(1, B[0], 64); _tile_loadd(2, A+32, 4096); _tile_loadd(3, B[1], 64); }
  t1 = __rdtsc();
  printf("loads: %.1f cycles per A+B pair\n", double(t1 - t0) / (2.0 * N));
  // (e) stores only
  t0 = __rdtsc();
  for (int i = 0; i < N; ++i) { _tile_stored(4, C[0], 64); _tile_stored(5, C[1], 64); _tile_stored(6, C[2], 64); _tile_stored(7, C[3], 64); }
  t1 = __rdtsc();
  printf("stores: %.1f cycles per C store\n", double(t1 - t0) / (4.0 * N));
  _tile_release();
}
