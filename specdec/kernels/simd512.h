// 16-lane forms of simd.h's helpers, for files that include this under an AVX-512 target pragma
// (attention_avx512.cpp, attention_amx.cpp). `static inline` as simd.h's: each file its own copy.
#pragma once
#include "simd.h"

// exp8 (simd.h) for 16 lanes: the same operations per lane, so the same bits
static inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(kExpHi)), _mm512_set1_ps(kExpLo));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 y = _mm512_set1_ps(kExpPoly[0]);
  for (int k = 1; k < 6; ++k) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExpPoly[k]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
}
