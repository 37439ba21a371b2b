// Small AVX2 helpers shared by linear_kernels.cpp, linear_kernels_avx512.cpp and layer_ops.cpp.
//
// Every function is `static inline` (internal linkage): each file gets its own copy, compiled for that
// file's instruction set — linear_kernels_avx512.cpp includes this under an AVX-512 target pragma, and
// a shared (external) inline function could have been linked from its AVX-512 copy into AVX2 code.
#pragma once
#include <immintrin.h>
#include <cstdint>

// The sum of 8 floats in one fixed order (so every caller's results are reproducible).
static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The sum of 8 int32 lanes (exact).
static inline int32_t hsum_epi32(__m256i v) {
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  t = _mm_hadd_epi32(t, t);
  t = _mm_hadd_epi32(t, t);
  return _mm_cvtsi128_si32(t);
}

// The 8 code vectors (values 0..63, vector order) of one 6-bit block from its 128 low-nibble bytes
// `ql` and 64 top-bit bytes `qh` (the layout: q6_linear in linear_kernels.cpp).
static inline void unpack_q6_block(const uint8_t* ql, const uint8_t* qh, __m256i w[8]) {
  const __m256i low = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
  for (int i = 0; i < 4; ++i) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * i));
    w[2 * i] = _mm256_and_si256(packed, low);
    w[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
  }
  for (int h = 0; h < 2; ++h) {
    const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
    w[4 * h] = _mm256_or_si256(w[4 * h], _mm256_and_si256(_mm256_slli_epi16(high, 4), top));
    w[4 * h + 1] = _mm256_or_si256(w[4 * h + 1], _mm256_and_si256(_mm256_slli_epi16(high, 2), top));
    w[4 * h + 2] = _mm256_or_si256(w[4 * h + 2], _mm256_and_si256(high, top));
    w[4 * h + 3] = _mm256_or_si256(w[4 * h + 3], _mm256_and_si256(_mm256_srli_epi16(high, 2), top));
  }
}
