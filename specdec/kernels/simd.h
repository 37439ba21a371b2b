// Small AVX2 helpers shared by linear_kernels.cpp and layer_ops.cpp.
#pragma once
#include <immintrin.h>

// The sum of 8 floats in one fixed order (so every caller's results are reproducible).
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
