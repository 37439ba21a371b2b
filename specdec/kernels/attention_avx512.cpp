// AVX-512 versions of attention's inner loops (dot_kernels.h: AttentionKernels; layer_ops.cpp runs the rest).
//
// Why: verifying several tokens over a long context is compute-bound in attention — 9 rows over 1 536
// cached tokens took 1.4 ms a layer for the 1.5B (37 ms a forward) at ~30 GMAC/s, while one row is
// bandwidth-bound. 512-bit FMAs double the arithmetic per instruction.
//
// Exactness: a 512-bit register holds two heads' 8-lane chains side by side — lanes 0-7 one head's, lanes
// 8-15 the next head's, for the same key (scores) or the same 8 output dimensions (values). Each half runs
// the very FMA sequence the AVX2 code runs for that head (dimension order for a score, then the same
// horizontal sum of 8; slot order for an output lane), so both paths give the same bits, and a row's
// bits never depend on the rows beside it. An odd last head of a group runs the AVX2 code.
//
// Compiled for AVX-512 (the pragma below) and reached only through the avx512-vnni kernel path, which runs
// only where the CPU reports avx512f/bw/vl/dq/vnni (linear_kernels.cpp decides).
#include <immintrin.h>
#include <cstdint>
#include <type_traits>
#include "dot_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#include "simd.h"  // static inline helpers: this file's own copies, compiled for AVX-512

namespace {

using specdec_kernels::kAttentionAvx2;

// the widest head this file handles (wider ones take the AVX2 kernels): 3 pairs of interleaved queries
constexpr int64_t kMaxDim = 256;

// [a[0..8) | b[0..8)]
inline __m512 halves(const float* a, const float* b) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1);
}

// [x[0..8) | x[0..8)]: one load, no shuffle
inline __m512 twice(const float* x) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(x)); }

// hsum() of both 8-lane halves of four registers at once (acc[j] = [head a's chain for key j | head b's]):
// out_a[j] = hsum(low half of acc[j]), out_b[j] = hsum(high half), by hsum's additions in hsum's tree —
// lane i + lane i+4, then + lane i+2, then + lane i+1 (and a + b is b + a, exactly) — 15 instructions
// for 8 sums instead of ~6 each.
inline void hsum_halves4(const __m512 acc[4], float* out_a, float* out_b) {
  // 128-bit lanes of acc[j]: [a_j low, a_j high, b_j low, b_j high]; s01's: [a0, b0, a1, b1] (low + high)
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(acc[0], acc[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(acc[0], acc[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2], acc[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(acc[2], acc[3], _MM_SHUFFLE(3, 1, 3, 1)));
  // per 128-bit lane [x.0 + x.2, x.1 + x.3, y.0 + y.2, y.1 + y.3]: lanes [a0|a2], [b0|b2], [a1|a3], [b1|b3]
  const __m512 v = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))),
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))));
  // element 2k of each lane + element 2k+1: the sums at elements 0, 2 of each lane
  const __m512 r = _mm512_add_ps(v, _mm512_movehdup_ps(v));
  const __m512 ordered = _mm512_permutexvar_ps(
      _mm512_setr_epi32(0, 8, 2, 10, 4, 12, 6, 14, 0, 0, 0, 0, 0, 0, 0, 0), r);  // [a0 a1 a2 a3 b0 b1 b2 b3 …]
  _mm_storeu_ps(out_a, _mm512_castps512_ps128(ordered));
  _mm_storeu_ps(out_b, _mm512_extractf32x4_ps(ordered, 1));
}

// P pairs of heads against the keys at slots slot[0..K): acc[pp][j] lanes 0-7 = head 2pp's chain, 8-15 =
// head 2pp+1's, over qq (the pairs' queries interleaved by 8-dim chunk: [pair][chunk][16]).
template <int P, int K>
inline void scores_tile(const float* qq, int64_t D, const float* keys, const int64_t* slot, float* p, int64_t L) {
  const int64_t chunks = D / 8;
  const float* k[K];
  for (int j = 0; j < K; ++j) k[j] = keys + slot[j] * D;
  __m512 acc[P][K];
  for (int pp = 0; pp < P; ++pp)
    for (int j = 0; j < K; ++j) acc[pp][j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    __m512 kv[K];
    for (int j = 0; j < K; ++j) kv[j] = twice(k[j] + 8 * c);
    for (int pp = 0; pp < P; ++pp) {
      const __m512 x = _mm512_loadu_ps(qq + (pp * chunks + c) * 16);
      for (int j = 0; j < K; ++j) acc[pp][j] = _mm512_fmadd_ps(x, kv[j], acc[pp][j]);
    }
  }
  for (int pp = 0; pp < P; ++pp) {
    if constexpr (K == 4) {
      hsum_halves4(acc[pp], p + 2 * pp * L, p + (2 * pp + 1) * L);
    } else {
      for (int j = 0; j < K; ++j) {
        p[2 * pp * L + j] = hsum(_mm512_castps512_ps256(acc[pp][j]));
        p[(2 * pp + 1) * L + j] = hsum(_mm512_extractf32x8_ps(acc[pp][j], 1));
      }
    }
  }
}

// P pairs of heads (queries q [2P, D]) against slots [i0, i1)
template <int P>
void scores_pairs(const float* q, const float* keys, const int64_t* slot, int64_t i0, int64_t i1, int64_t D, float* p,
                  int64_t L) {
  alignas(64) float qq[P * 2 * kMaxDim];
  const int64_t chunks = D / 8;
  for (int pp = 0; pp < P; ++pp)
    for (int64_t c = 0; c < chunks; ++c)
      _mm512_store_ps(qq + (pp * chunks + c) * 16, halves(q + 2 * pp * D + 8 * c, q + (2 * pp + 1) * D + 8 * c));
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4) scores_tile<P, 4>(qq, D, keys, slot + i, p + i, L);
  for (; i < i1; ++i) scores_tile<P, 1>(qq, D, keys, slot + i, p + i, L);
}

// The heads in groups of 3, 2, then 1 pair(s): pairs(P, h) with P a std::integral_constant (the pairs in the
// group) and h the group's first head; then odd(h) for a last odd head (the AVX2 kernel's).
template <typename Pairs, typename Odd>
inline void for_head_pairs(int64_t heads, Pairs pairs, Odd odd) {
  int64_t h = 0;
  for (; h + 6 <= heads; h += 6) pairs(std::integral_constant<int, 3>{}, h);
  if (h + 4 <= heads) {
    pairs(std::integral_constant<int, 2>{}, h);
    h += 4;
  }
  if (h + 2 <= heads) {
    pairs(std::integral_constant<int, 1>{}, h);
    h += 2;
  }
  if (h < heads) odd(h);
}

void scores_avx512(const float* q, int64_t heads, const float* keys, const int64_t* slot, int64_t i0, int64_t i1,
                   int64_t D, float* p, int64_t L) {
  if (D > kMaxDim) return kAttentionAvx2.scores(q, heads, keys, slot, i0, i1, D, p, L);
  for_head_pairs(
      heads,
      [&](auto pairs, int64_t h) { scores_pairs<decltype(pairs)::value>(q + h * D, keys, slot, i0, i1, D, p + h * L, L); },
      [&](int64_t h) { kAttentionAvx2.scores(q + h * D, heads - h, keys, slot, i0, i1, D, p + h * L, L); });
}

// P pairs of heads, output dimensions [0, 8N) of acc (rows D apart) += Σ p · v over slots [i0, i1), in
// slot order; lanes 0-7 of s[pp][c] are head 2pp's chunk c, lanes 8-15 head 2pp+1's.
template <int P, int N>
inline void values_tile(const float* p, int64_t L, const int64_t* slot, int64_t i0, int64_t i1, const float* v,
                        int64_t D, float* acc) {
  __m512 s[P][N];
  for (int pp = 0; pp < P; ++pp)
    for (int c = 0; c < N; ++c) s[pp][c] = halves(acc + 2 * pp * D + 8 * c, acc + (2 * pp + 1) * D + 8 * c);
  for (int64_t i = i0; i < i1; ++i) {
    __m512 w[P];
    for (int pp = 0; pp < P; ++pp)
      w[pp] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(p[2 * pp * L + i])),
                                 _mm256_set1_ps(p[(2 * pp + 1) * L + i]), 1);
    const float* row = v + slot[i] * D;
    for (int c = 0; c < N; ++c) {
      const __m512 x = twice(row + 8 * c);
      for (int pp = 0; pp < P; ++pp) s[pp][c] = _mm512_fmadd_ps(w[pp], x, s[pp][c]);
    }
  }
  for (int pp = 0; pp < P; ++pp)
    for (int c = 0; c < N; ++c) {
      _mm256_storeu_ps(acc + 2 * pp * D + 8 * c, _mm512_castps512_ps256(s[pp][c]));
      _mm256_storeu_ps(acc + (2 * pp + 1) * D + 8 * c, _mm512_extractf32x8_ps(s[pp][c], 1));
    }
}

template <int P>
void values_pairs(const float* p, int64_t L, const int64_t* slot, int64_t i0, int64_t i1, const float* v, int64_t D,
                  float* acc) {
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) values_tile<P, 8>(p, L, slot, i0, i1, v + d0, D, acc + d0);
  for (; d0 + 32 <= D; d0 += 32) values_tile<P, 4>(p, L, slot, i0, i1, v + d0, D, acc + d0);
  for (; d0 < D; d0 += 8) values_tile<P, 1>(p, L, slot, i0, i1, v + d0, D, acc + d0);
}

void values_avx512(const float* p, int64_t heads, int64_t L, const int64_t* slot, int64_t i0, int64_t i1,
                   const float* v, int64_t D, float* acc) {
  for_head_pairs(
      heads,
      [&](auto pairs, int64_t h) { values_pairs<decltype(pairs)::value>(p + h * L, L, slot, i0, i1, v, D, acc + h * D); },
      [&](int64_t h) { kAttentionAvx2.values(p + h * L, heads - h, L, slot, i0, i1, v, D, acc + h * D); });
}

// exp8 (simd.h) for 16 lanes: the same operations per lane, so the same bits
inline __m512 exp16(__m512 x) {
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

// The AVX2 normaliser (layer_ops.cpp) 16 lanes at a time: scaling and the max are exact in any order; the
// exponentials go 16 at a time and are summed into the same 8 lane sums in the same chunk order (low half,
// then high half), and what the 16-lane loops leave goes through the AVX2 passes (simd.h), so the bits are
// the AVX2 path's. A 15 % share of a long prompt's attention on AVX2 lanes.
float normalize_avx512(float* p, int64_t n, float scale) {
  const int64_t whole = n - n % 16;  // elements the 16-lane loops take
  const __m512 factor = _mm512_set1_ps(scale);
  __m512 top16 = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < whole; i += 16) {
    const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(p + i), factor);
    _mm512_storeu_ps(p + i, x);
    top16 = _mm512_max_ps(top16, x);
  }
  const float top = scale_max_from(p, whole, n, scale, _mm512_reduce_max_ps(top16));
  const __m512 shift = _mm512_set1_ps(top);
  __m256 sum8 = _mm256_setzero_ps();
  for (int64_t i = 0; i < whole; i += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p + i), shift));
    _mm512_storeu_ps(p + i, e);
    sum8 = _mm256_add_ps(sum8, _mm512_castps512_ps256(e));
    sum8 = _mm256_add_ps(sum8, _mm512_extractf32x8_ps(e, 1));
  }
  return 1.0f / exp_shifted_sum_from(p, whole, n, top, sum8);
}

}  // namespace

const specdec_kernels::AttentionKernels specdec_kernels::kAttentionAvx512 = {scores_avx512, values_avx512,
                                                                             normalize_avx512};

#pragma GCC pop_options
