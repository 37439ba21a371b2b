// Small AVX2 helpers shared by linear_kernels.cpp, linear_kernels_avx512.cpp and layer_ops.cpp.
//
// Every function is `static inline` (internal linkage): each file gets its own copy, compiled for that
// file's instruction set — linear_kernels_avx512.cpp includes this under an AVX-512 target pragma, and
// a shared (external) inline function could have been linked from its AVX-512 copy into AVX2 code.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

// Software prefetch distance (bytes ahead in the weight stream of the current thread's rows): a
// single-token step streams ~1 GB of weights and the hardware prefetcher alone left it at ~60 % of
// the 2-thread read bandwidth; 2 KB ahead took 5-15 % off a 1.5B int4 step and the 0.5B draft step
// on an AVX2 EPYC (chunks of 4+ rows are compute-bound and unchanged). Addresses past the end are
// harmless: a prefetch never faults.
static constexpr int64_t kPrefetch = 2048;
// A second prefetch, 8 KB ahead into L2 only (prefetcht1): the L1 prefetch alone keeps ~2 KB in flight
// per core — the L1's few miss buffers — while a loaded server's DRAM latency times a core's share of the
// bandwidth is more than that; the L2 has more. Interleaved A/B on a Zen 4 EPYC (1.5B-shaped 4-bit
// stack from DRAM): 1 row -3..5 %, 2 rows -9..12 %, 3 rows -5..7 %, 4+ rows (compute-bound) unchanged.
static constexpr int64_t kFarPrefetch = 8192;

// Prefetch `lines` cache lines of a weight stream at `p` (where the kernel reads now), `ahead` bytes
// ahead into L1 and 4x that into L2 — every kernel's two prefetch distances in one place. A stream read
// at half the weights' rate (Q6_K's top bits) passes half the distance.
static inline void prefetch_ahead(const void* p, int lines, int64_t ahead = kPrefetch) {
  const char* base = static_cast<const char*>(p);
  for (int line = 0; line < lines; ++line) {
    _mm_prefetch(base + ahead + 64 * line, _MM_HINT_T0);
    _mm_prefetch(base + ahead * (kFarPrefetch / kPrefetch) + 64 * line, _MM_HINT_T1);
  }
}

// The sum of 8 floats in one fixed order (so every caller's results are reproducible).
static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// e^x, Cephes' expf: x = n·ln2 + r, a degree-7 polynomial for e^r, 2^n through the exponent bits (~1 ulp for
// x in [-87, 88]). The constants are shared with the AVX-512 16-lane copy (attention_avx512.cpp: exp16),
// which runs the same operations per lane, so both give the same bits.
static constexpr float kExpHi = 88.0f, kExpLo = -87.0f, kLog2e = 1.44269504088896341f;
static constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
static constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                      4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// e^x for 8 lanes (the scalar std::exp call per score was most of the attention time at long contexts)
static inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(kExpHi)), _mm256_set1_ps(kExpLo));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 y = _mm256_set1_ps(kExpPoly[0]);
  for (int k = 1; k < 6; ++k) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExpPoly[k]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

// The softmax normaliser's two passes from element i on (every path's: the AVX-512 one calls them for what
// its 16-lane loops leave, so both give the same bits).
// p[j] *= scale for i <= j < n; returns the largest of `top` and the products (a max is exact in any order)
static inline float scale_max_from(float* p, int64_t i, int64_t n, float scale, float top) {
  const __m256 factor = _mm256_set1_ps(scale);
  __m256 top8 = _mm256_set1_ps(top);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(p + i), factor);
    _mm256_storeu_ps(p + i, x);
    top8 = _mm256_max_ps(top8, x);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, top8);
  for (float lane : lanes) top = std::max(top, lane);
  for (; i < n; ++i) {
    p[i] = p[i] * scale;
    top = std::max(top, p[i]);
  }
  return top;
}

// p[j] = e^(p[j] - top) for i <= j < n, every element through exp8 (a partial last chunk via a buffer);
// returns Σ p in one fixed order for a given n: `sum8` (the 8 lane sums of the chunks before i) plus the
// whole 8-element chunks from i, in order, their hsum, then the tail in order. (A serial scalar sum was a
// dependency chain of n additions: ~5 % of a 9-row pass.)
static inline float exp_shifted_sum_from(float* p, int64_t i, int64_t n, float top, __m256 sum8) {
  const __m256 shift = _mm256_set1_ps(top);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + i), shift));
    _mm256_storeu_ps(p + i, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  float total = hsum(sum8);
  if (i < n) {
    float tail[8] = {0};
    std::copy(p + i, p + n, tail);
    _mm256_storeu_ps(tail, exp8(_mm256_sub_ps(_mm256_loadu_ps(tail), shift)));
    std::copy(tail, tail + (n - i), p + i);
    for (int64_t j = 0; j < n - i; ++j) total += tail[j];
  }
  return total;
}

// The sum of 8 int32 lanes (exact).
static inline int32_t hsum_epi32(__m256i v) {
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  t = _mm_hadd_epi32(t, t);
  t = _mm_hadd_epi32(t, t);
  return _mm_cvtsi128_si32(t);
}

// 4-bit (linear_kernels.cpp's format), block b's float step for R activation rows, given their exact int32
// sums times the groups' sc (`isum`, one lane per group): one FMA applies d, one the mins (group sums x mn x
// dmin). Every path's 4-bit kernel ends its blocks with these operations, so every path gives the same bits.
template <int R>
static inline void block_accumulate(const int8_t* mn, const float* d, const float* dmin, int64_t b, const __m256i isum[R],
                             const float* gsum, int64_t gstride, __m256 acc[R], __m256 min_acc[R]) {
  const __m256 D = _mm256_set1_ps(d[b]);
  const __m256 mins = _mm256_mul_ps(
      _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn + b * 8)))),
      _mm256_set1_ps(dmin[b]));
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), D, acc[r]);
    min_acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(gsum + r * gstride + b * 8), mins, min_acc[r]);
  }
}

// 4-bit, a partial last block b (input sizes like the 0.5B draft's 896): Q4_K's pairs of groups (32 bytes,
// low and high nibbles), activations in order. `scaled(w, a, scale)` is the path's int32 lanes of
// (group sum of the 32 codes w against the 32 activations at a) x scale; isum[r] is their exact total, whatever
// the order of the additions, so every path gets the same int32s.
template <int R, typename Scaled>
static inline void q4_partial_block(const uint8_t* qs, const uint8_t* sc, int64_t groups, int64_t b, const int8_t* xq,
                                    int64_t K, __m256i isum[R], Scaled scaled) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
  for (int64_t g = b * 8; g < groups; g += 2) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + g * 16));
    const __m256i w0 = _mm256_and_si256(packed, low);
    const __m256i w1 = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
    for (int r = 0; r < R; ++r) {
      const int8_t* a = xq + r * K + g * 32;
      isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(scaled(w0, a, sc[g]), scaled(w1, a + 32, sc[g + 1])));
    }
  }
}

// 4-bit, R activation rows against one weight row: for each block, `block_sums(b, full_block, isum)` (each
// path's own instructions: the exact int32 sums times the groups' sc) then block_accumulate; the result per
// row is its two horizontal sums' difference. The float part is this one function on every path.
template <int R, typename BlockSums>
static inline void q4_pass(const int8_t* mn, const float* d, const float* dmin, int64_t groups, const float* gsum,
                           int64_t gstride, float* result, BlockSums block_sums) {
  const int64_t blocks = (groups + 7) / 8, full = groups / 8;
  __m256 acc[R], min_acc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm256_setzero_ps(); min_acc[r] = _mm256_setzero_ps(); }
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i isum[R];
    block_sums(b, b < full, isum);
    block_accumulate<R>(mn, d, dmin, b, isum, gsum, gstride, acc, min_acc);
  }
  for (int r = 0; r < R; ++r) result[r] = hsum(acc[r]) - hsum(min_acc[r]);
}

// int8 weights on a VNNI path: vpdpbusd wants an unsigned operand, so each weight byte is read as w + 128
// (xor 0x80) and 128 x (the row's activation total, gsum[r * gstride]) is taken off after — the exact
// int32 the AVX2 sign trick computes. `dot(acc, u, s)` is the path's 256-bit vpdpbusd (EVEX or VEX).
template <int R, typename Dot>
static inline void q8_vnni_rows(const int8_t* w, const int8_t* xq, int64_t K, const int32_t* gsum, int64_t gstride,
                                int32_t* result, Dot dot) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
  for (int64_t k = 0; k < K; k += 32) {
    if ((k & 63) == 0) prefetch_ahead(w + k, 1);
    const __m256i wv = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k)), flip);
    for (int r = 0; r < R; ++r)
      acc[r] = dot(acc[r], wv, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * K + k)));
  }
  for (int r = 0; r < R; ++r) result[r] = hsum_epi32(acc[r]) - 128 * gsum[r * gstride];
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

// The 6-bit format's group scales as the int16 lanes of a maddubs result see them: lanes 2m and 2m + 1 of a
// vector of even groups (vectors 0-3) belong to group 2m, of odd groups (4-7) to group 2m + 1.
static inline void q6_pair_scales(__m128i s, __m256i* even, __m256i* odd) {
  *even = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s, _mm_setr_epi8(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14)));
  *odd = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s, _mm_setr_epi8(1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15)));
}

// Where a block's activation vector v is (linear_common.h stores v and v + 4 side by side), in 32-byte units.
static constexpr int kQ6ActivationAt[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// R activation rows against one 6-bit weight row (the format: q6_linear in linear_kernels.cpp). Per row and
// block: isum lane j = Σ over groups 2j and 2j + 1 of scale x (their code-activation sum - 32 x their
// activation sum), exact: it starts at the -32 offset, then each pair of maddubs results of one parity (exact
// in 16 bits) is added with its groups' scales by `add_scaled(isum, t, scales)` — madd + add on AVX2, one
// vpdpwssd on a VNNI path: the same int32s as the 512-bit vpdpbusd kernel — and one FMA applies d. So every
// path gives the same bits.
template <int R, typename AddScaled>
static inline void q6_pass(const uint8_t* ql, const uint8_t* qh, const int8_t* sc, const float* d, int64_t blocks,
                           const int8_t* xq, const int16_t* asum, int64_t K, int64_t astride, float* result,
                           AddScaled add_scaled) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    prefetch_ahead(ql + b * 128, 2);
    prefetch_ahead(qh + b * 64, 1, kPrefetch / 2);
    __m256i w[8];
    unpack_q6_block(ql + b * 128, qh + b * 64, w);
    const __m128i sc_bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + b * 16));
    const __m256i scales = _mm256_cvtepi8_epi16(sc_bytes);  // group order: the -32 offset's madd
    __m256i even, odd;
    q6_pair_scales(sc_bytes, &even, &odd);
    const __m256 D = _mm256_set1_ps(d[b]);
    for (int r = 0; r < R; ++r) {
      const __m256i* a = reinterpret_cast<const __m256i*>(xq + r * K + b * 256);
      const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(asum + r * astride + b * 16));
      __m256i isum = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sums, scales), 5));
      for (int i = 0; i < 8; i += 2) {
        const __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(w[i], _mm256_loadu_si256(a + kQ6ActivationAt[i])),
                                           _mm256_maddubs_epi16(w[i + 1], _mm256_loadu_si256(a + kQ6ActivationAt[i + 1])));
        isum = add_scaled(isum, t, i < 4 ? even : odd);
      }
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), D, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) result[r] = hsum(acc[r]);
}

// R (1..8) activation rows against one 6-bit weight row in passes of at most 4 rows (with 16 vector registers 8
// would spill; the weight row is in L1 for the second pass): q6_pass with the path's `add_scaled`.
template <int R, typename AddScaled>
static inline void q6_rows(const uint8_t* ql, const uint8_t* qh, const int8_t* sc, const float* d, int64_t blocks,
                           const int8_t* xq, const int16_t* asum, int64_t K, int64_t astride, float* result,
                           AddScaled add_scaled) {
  constexpr int first = R < 4 ? R : 4;
  q6_pass<first>(ql, qh, sc, d, blocks, xq, asum, K, astride, result, add_scaled);
  if constexpr (R > 4)
    q6_pass<R - 4>(ql, qh, sc, d, blocks, xq + 4 * K, asum + 4 * astride, K, astride, result + 4, add_scaled);
}
