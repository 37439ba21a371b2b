// Cycle accounting of the AVX-512 VNNI 4-bit dot pass (session 24): each stage adds one part of the kernel's
// per-(row, block) work. Build: g++ -O3 -mavx2 -mfma -ffp-contract=off -DRR=4 dot-pass-cycles.cpp && ./a.out
// Calibrated in cycles by a loop of 8 independent 512-bit vpdpbusd (1 per cycle on Zen 4).
// which part of the per-(row, block) work costs the cycles: add components one at a time
#include <immintrin.h>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstdint>
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")
static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#ifndef RR
#define RR 8
#endif
constexpr int R = RR;
constexpr int64_t K = 1536, BLOCKS = K / 256, N = 256;
int8_t* xq; uint8_t* qs; uint8_t* sc; int8_t* mn; float* d; float* gsum;
template <int STAGE>
__attribute__((noinline)) void pass(const uint8_t* q, const uint8_t* s8, const int8_t* m8, const float* dd, float* out) {
  const __m512i low512 = _mm512_set1_epi8(0x0F);
  const __m512i nibble_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  __m256 acc[R], macc[R];
  __m256i iacc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm256_setzero_ps(); macc[r] = _mm256_setzero_ps(); iacc[r] = _mm256_setzero_si256(); }
  __m512i wc[4]; for (int i = 0; i < 4; ++i) wc[i] = _mm512_set1_epi8(3 + i);
  for (int64_t b = 0; b < BLOCKS; ++b) {
    __m512i w[4];
    if (STAGE >= 1 && STAGE < 6) {
      for (int i = 0; i < 4; ++i) {
        const __m512i packed = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(q + b * 128 + 32 * i)));
        w[i] = _mm512_and_si512(_mm512_srlv_epi16(packed, nibble_shift), low512);
      }
    } else for (int i = 0; i < 4; ++i) w[i] = wc[i];
    if (STAGE >= 6) {
      for (int h = 0; h < 2; ++h) {
        const __m512i packed = _mm512_loadu_si512(q + b * 128 + 64 * h);
        w[2 * h] = _mm512_and_si512(packed, low512);
        w[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low512);
      }
    }
    const __m256i scales = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(s8 + b * 8)));
    const __m256 D = _mm256_set1_ps(dd[b]);
    const __m256 DS = _mm256_mul_ps(_mm256_cvtepi32_ps(scales), D);
    const __m256 mins = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(m8 + b * 8)))), D);
    for (int r = 0; r < R; ++r) {
      const int8_t* a = xq + r * K + b * 256;
      __m512i both = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_load_si512(a));
      both = _mm512_dpbusd_epi32(both, w[1], _mm512_load_si512(a + 64));
      both = _mm512_dpbusd_epi32(both, w[2], _mm512_load_si512(a + 128));
      both = _mm512_dpbusd_epi32(both, w[3], _mm512_load_si512(a + 192));
      const __m256i g8 = _mm256_add_epi32(_mm512_castsi512_si256(both), _mm512_extracti64x4_epi64(both, 1));
      if (STAGE <= 1) iacc[r] = _mm256_add_epi32(iacc[r], g8);
      else if (STAGE == 2) iacc[r] = _mm256_add_epi32(iacc[r], _mm256_mullo_epi32(g8, scales));
      else if (STAGE == 3) acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(g8, scales)), D, acc[r]);
      else if (STAGE == 4) acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(g8, scales)), D, acc[r]);
      else acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(g8), DS, acc[r]);
      if (STAGE >= 4) macc[r] = _mm256_fmadd_ps(_mm256_load_ps(gsum + r * BLOCKS * 8 + b * 8), mins, macc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]) - hsum(macc[r]) + _mm256_extract_epi32(iacc[r], 0);
}
__attribute__((noinline)) double ns_per_cycle() {
  __m512i acc[8]; for (int i = 0; i < 8; ++i) acc[i] = _mm512_set1_epi32(i);
  __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
  long n = 20000000;
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) { for (int j = 0; j < 8; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], w, x); __asm__ volatile("" : "+v"(w), "+v"(x)); }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int sum = 0; for (int j = 0; j < 8; ++j) sum += _mm512_reduce_add_epi32(acc[j]);
  if (sum == 12345) printf("!");
  return s * 1e9 / (n * 8.0);
}
template <int STAGE> void bench(const char* name) {
  float out[R * N];
  double best = 1e9;
  for (int t = 0; t < 5; ++t) {
    auto t0 = std::chrono::steady_clock::now();
    for (int rep = 0; rep < 200; ++rep)
      for (int64_t n = 0; n < N; ++n) pass<STAGE>(qs + n * K / 2, sc + n * BLOCKS * 8, mn + n * BLOCKS * 8, d + n * BLOCKS, out + n * R);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < best) best = s;
  }
  printf("%-40s %.2f cycles per (row, block) [%g]\n", name, best * 1e9 / (200.0 * N * BLOCKS * R) / ns_per_cycle(), out[5]);
}
int main() {
  xq = (int8_t*)aligned_alloc(64, R * K); qs = (uint8_t*)aligned_alloc(64, N * K / 2); sc = (uint8_t*)aligned_alloc(64, N * BLOCKS * 8);
  mn = (int8_t*)aligned_alloc(64, N * BLOCKS * 8); d = (float*)aligned_alloc(64, N * BLOCKS * 4); gsum = (float*)aligned_alloc(64, R * BLOCKS * 32);
  for (int i = 0; i < R * K; ++i) xq[i] = rand(); for (int i = 0; i < N * K / 2; ++i) qs[i] = rand();
  for (int i = 0; i < N * BLOCKS * 8; ++i) { sc[i] = rand(); mn[i] = rand() & 63; } for (int i = 0; i < N * BLOCKS; ++i) d[i] = 0.01f;
  for (int i = 0; i < R * BLOCKS * 8; ++i) gsum[i] = i;
  bench<0>("0 dpbusd chain + extract/add (const w)"); bench<1>("1 + weight unpack from memory"); bench<2>("2 + mullo scales"); bench<3>("3 + cvt + fma D");
  bench<4>("4 + min fma (= the kernel)"); bench<5>("5 kernel with DS, no mullo"); bench<6>("6 + 64-byte unpack");
}
