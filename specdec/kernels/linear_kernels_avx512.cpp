// AVX-512 VNNI versions of the linear kernels' dot products (formats: linear_kernels.cpp).
//
// Why: on AVX2 a verification chunk is multiply-bound — every 4 weights x 1 activation row cost a
// maddubs, an add and part of a madd, so each extra verified token of the 1.5B target adds ~10 ms.
// vpdpbusd multiplies u8 x s8 and accumulates 4 products per int32 lane in one instruction, and
// AVX-512VL gives 32 vector registers, so 8 activation rows share one unpacking of a weight block.
//
// Exactness: the int32 sums per weight group are exact on both paths (no saturation anywhere), and
// the float operations after them are the same operations in the same order as the AVX2 code, so a
// row's output is bit-identical on either path — and, as there, identical alone and inside a chunk.
//
// This file is compiled for AVX-512 (the pragma below) and runs only where the CPU reports
// avx512f/bw/vl/vnni (linear_kernels.cpp decides). Everything in it has internal linkage except the
// three tables (simd.h's helpers are `static inline`), so no AVX-512 copy of a shared inline function
// can reach AVX2-only code.
#include <immintrin.h>
#include <cstdint>
#include "dot_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")
#include "simd.h"  // static inline helpers: this file's own copies, compiled for AVX-512

namespace {

inline __m256i load(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 4-bit: up to 8 activation rows against one weight row. A full block: vector v holds 4 codes of each
// group g in int32 lane g, so 8 vpdpbusd leave lane g = the group's exact sum, and one vpmulld applies
// its scale — the int32 the AVX2 path gets from 8 maddubs + madd.
template <int R>
void dot_pass(const uint8_t* qs, const uint8_t* sc, const int8_t* mn, const float* d, const float* dmin,
              int64_t groups, const int8_t* xq, const float* gsum, int64_t K, int64_t gstride, float* result) {
  const __m512i low512 = _mm512_set1_epi8(0x0F);
  const __m512i nibble_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const int64_t blocks = (groups + 7) / 8, full = groups / 8;
  __m256 acc[R], min_acc[R];
  for (int r = 0; r < R; ++r) { acc[r] = _mm256_setzero_ps(); min_acc[r] = _mm256_setzero_ps(); }
  for (int64_t b = 0; b < blocks; ++b) {
    prefetch_ahead(qs + b * 128, 2);
    const __m256 D = _mm256_set1_ps(d[b]);
    const __m256 mins = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn + b * 8)))),
        _mm256_set1_ps(dmin[b]));
    // each row's block result goes straight into its accumulators (no per-row temporaries held: with 8
    // rows they would not fit the registers); per row, the same float operations as the AVX2 pass
    auto accumulate_scaled = [&](int r, __m256 scaled) {  // scaled: float(the groups' sums x their scales)
      acc[r] = _mm256_fmadd_ps(scaled, D, acc[r]);
      min_acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(gsum + r * gstride + b * 8), mins, min_acc[r]);
    };
    auto accumulate = [&](int r, __m256i isum) { accumulate_scaled(r, _mm256_cvtepi32_ps(isum)); };
    if (b < full) {
      // zmm i = vectors 2i (low nibbles) and 2i+1 (high nibbles) of the block, beside each other as
      // the activations are (a + 64 i): 4 vpdpbusd of 512 bits per row; lanes g and 8 + g both hold
      // group g, added before the scale (integers: the same sums in any order)
      __m512i w[4];
      for (int i = 0; i < 4; ++i) {
        const __m512i packed = _mm512_broadcast_i64x4(load(qs + b * 128 + 32 * i));
        w[i] = _mm512_and_si512(_mm512_srlv_epi16(packed, nibble_shift), low512);
      }
      // the groups' scales as floats: |group sum| <= 32 * 15 * 128 and scale <= 63 keep every product below
      // 2^24, so float(sum) * float(scale) is exactly float(sum * scale) — the AVX2 pass's value — without
      // vpmulld (two µops on the port the vpdpbusd need)
      const __m256 scales = _mm256_cvtepi32_ps(
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + b * 8))));
      for (int r = 0; r < R; ++r) {
        const int8_t* a = xq + r * K + b * 256;
        // one chain per row (the 8 rows' chains overlap): no extra add to join two
        __m512i both = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_loadu_si512(a));
        both = _mm512_dpbusd_epi32(both, w[1], _mm512_loadu_si512(a + 64));
        both = _mm512_dpbusd_epi32(both, w[2], _mm512_loadu_si512(a + 128));
        both = _mm512_dpbusd_epi32(both, w[3], _mm512_loadu_si512(a + 192));
        const __m256i groups8 = _mm256_add_epi32(_mm512_castsi512_si256(both), _mm512_extracti64x4_epi64(both, 1));
        accumulate_scaled(r, _mm256_mul_ps(_mm256_cvtepi32_ps(groups8), scales));
      }
    } else {  // a partial last block: simd.h's, with the EVEX vpdpbusd
      __m256i isum[R];
      q4_partial_block<R>(qs, sc, groups, b, xq, K, isum, [](__m256i w, const int8_t* a, uint8_t scale) {
        return _mm256_mullo_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), w, load(a)), _mm256_set1_epi32(scale));
      });
      for (int r = 0; r < R; ++r) accumulate(r, isum[r]);
    }
  }
  for (int r = 0; r < R; ++r) result[r] = hsum(acc[r]) - hsum(min_acc[r]);
}

// int8 weights: simd.h's q8_vnni_rows with the EVEX 256-bit vpdpbusd (one instruction per 32 bytes and
// row; AVX2: two sign ops, maddubs, madd, add).
template <int R>
void dot_rows_q8(const int8_t* w, const int8_t* xq, int64_t K, const int32_t* gsum, int64_t gstride, int32_t* result) {
  q8_vnni_rows<R>(w, xq, K, gsum, gstride, result, [](__m256i acc, __m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(acc, u, s);
  });
}

// 6-bit: up to 8 activation rows against one weight row. zmm u = the block's vectors u (even groups) and u + 4
// (odd groups) side by side, as the activations store them (linear_common.h), so 4 vpdpbusd of 512 bits leave
// lane j = group 2j's exact code-activation sum and lane 8 + j group 2j + 1's; one vpmulld applies the 16
// scales and the halves' sum is the AVX2 pass's isum lane j (simd.h's q6_pass: the same int32s, then the same
// float operations). The AVX2 pass needs 8 maddubs and 4 madds per row and block.
template <int R>
void dot_pass_q6(const uint8_t* ql, const uint8_t* qh, const int8_t* sc, const float* d, int64_t blocks,
                 const int8_t* xq, const int16_t* asum, int64_t K, int64_t astride, float* result) {
  const __m512i low = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  const __m128i by_parity = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block_ql = ql + b * 128;
    prefetch_ahead(block_ql, 2);
    prefetch_ahead(qh + b * 64, 1, kPrefetch / 2);
    // ql chunk i holds vectors 2i (low nibbles) and 2i + 1 (high); qh half h the top bits of vectors 4h..4h+3
    const __m512i chunks02 = _mm512_inserti64x4(_mm512_castsi256_si512(load(block_ql)), load(block_ql + 64), 1);
    const __m512i chunks13 = _mm512_inserti64x4(_mm512_castsi256_si512(load(block_ql + 32)), load(block_ql + 96), 1);
    const __m512i high = _mm512_loadu_si512(qh + b * 64);
    __m512i w[4];
    w[0] = _mm512_or_si512(_mm512_and_si512(chunks02, low), _mm512_and_si512(_mm512_slli_epi16(high, 4), top));
    w[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(chunks02, 4), low),
                           _mm512_and_si512(_mm512_slli_epi16(high, 2), top));
    w[2] = _mm512_or_si512(_mm512_and_si512(chunks13, low), _mm512_and_si512(high, top));
    w[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(chunks13, 4), low),
                           _mm512_and_si512(_mm512_srli_epi16(high, 2), top));
    const __m128i sc_bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + b * 16));
    const __m512i lane_scales = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(sc_bytes, by_parity));
    const __m256i scales = _mm256_cvtepi8_epi16(sc_bytes);
    const __m256 D = _mm256_set1_ps(d[b]);
    for (int r = 0; r < R; ++r) {
      const int8_t* a = xq + r * K + b * 256;
      __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_loadu_si512(a));
      for (int u = 1; u < 4; ++u) sums = _mm512_dpbusd_epi32(sums, w[u], _mm512_loadu_si512(a + 64 * u));
      const __m512i scaled = _mm512_mullo_epi32(sums, lane_scales);
      const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(load(asum + r * astride + b * 16), scales), 5);
      const __m256i isum = _mm256_sub_epi32(
          _mm256_add_epi32(_mm512_castsi512_si256(scaled), _mm512_extracti64x4_epi64(scaled, 1)), offset);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), D, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) result[r] = hsum(acc[r]);
}

}  // namespace

#pragma GCC pop_options

namespace specdec_kernels {

// Entry 1 stays empty: a single row is memory-bound and runs the AVX2 code (linear_kernels.cpp).
const DotFn kDotAvx512Vnni[kMaxRows + 1] = {nullptr, nullptr, dot_pass<2>, dot_pass<3>, dot_pass<4>,
                                            dot_pass<5>, dot_pass<6>, dot_pass<7>, dot_pass<8>};
const DotQ8Fn kDotQ8Avx512Vnni[kMaxRows + 1] = {nullptr, nullptr, dot_rows_q8<2>, dot_rows_q8<3>,
                                                dot_rows_q8<4>, dot_rows_q8<5>, dot_rows_q8<6>, dot_rows_q8<7>,
                                                dot_rows_q8<8>};
const DotQ6Fn kDotQ6Avx512Vnni[kMaxRows + 1] = {nullptr, nullptr, dot_pass_q6<2>, dot_pass_q6<3>,
                                                dot_pass_q6<4>, dot_pass_q6<5>, dot_pass_q6<6>, dot_pass_q6<7>,
                                                dot_pass_q6<8>};

}  // namespace specdec_kernels
