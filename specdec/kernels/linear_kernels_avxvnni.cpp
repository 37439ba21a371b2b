// AVX-VNNI versions of the linear kernels' dot products (formats: linear_kernels.cpp): the VEX-encoded,
// 256-bit vpdpbusd / vpdpwssd of CPUs that have int8 dot products but no AVX-512 — Intel's client cores
// since Alder Lake and its E-core Xeons (Sierra Forest). Without them such a CPU ran the AVX2 code, where
// every 4 weights x 1 activation row cost a maddubs, an add and part of a madd: a verification chunk's
// extra rows were multiply-bound there, and speculation paid ~1.0x on AVX2-only machines.
//
// The same blocks as the AVX2 code (16 vector registers: passes of at most 4 rows), with each block's
// 8 maddubs + 7 adds + madd per row replaced by 8 vpdpbusd into one int32 accumulator (lane g sums
// group g's 32 products: the activations' interleaved order puts a group's 4 bytes in one lane) and one
// multiply by the groups' scales. Exactness: those int32s are the AVX2 path's (exact integers: no
// saturation anywhere), and the float operations after them are simd.h's, shared by every path, so a
// row's output is bit-identical on every path — and, as there, alone and inside a chunk.
//
// This file is compiled for AVX-VNNI (the pragma below) and runs only where the CPU reports avxvnni
// (linear_kernels.cpp decides). AVX-VNNI intrinsics arrived in GCC 11 and clang 12: an older compiler
// builds the rest of the extension and this file then reports the path as not compiled.
#include <immintrin.h>
#include <cstdint>
#include "dot_kernels.h"

#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)

#pragma GCC push_options
#pragma GCC target("avx2,fma,avxvnni")
#include "simd.h"  // static inline helpers: this file's own copies, compiled for AVX-VNNI

namespace {

inline __m256i load(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 4-bit, one block (b) of one weight row against R activation rows: isum[r] lane g = sc_g x group g's sum.
// A full block is unpacked one 32-byte vector (two code vectors) at a time and applied to every row before
// the next, so a row's running sums are all it keeps in registers: 8 rows fit one pass over the weights
// (the AVX2 code, holding the 8 code vectors, makes passes of 4: 5 rows unpacked every block twice). With 4
// rows or fewer each row keeps two chains (low and high nibbles), added at the end: vpdpbusd's latency is
// ~5 cycles, and 4 chains alone left the multiply ports idle between their steps.
template <int R>
inline void block_sums(const uint8_t* qs, const uint8_t* sc, int64_t groups, int64_t b, bool full_block,
                       const int8_t* xq, int64_t K, __m256i isum[R]) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  prefetch_ahead(qs + b * 128, 2);
  if (full_block) {
    constexpr int kChains = R <= 4 ? 2 : 1;
    __m256i sums[R][kChains];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < kChains; ++c) sums[r][c] = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      const __m256i packed = load(qs + b * 128 + 32 * i);
      const __m256i lo = _mm256_and_si256(packed, low);                        // code vector 2i
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);  // code vector 2i + 1
      for (int r = 0; r < R; ++r) {
        const int8_t* a = xq + r * K + b * 256 + 64 * i;
        sums[r][0] = _mm256_dpbusd_avx_epi32(sums[r][0], lo, load(a));
        sums[r][kChains - 1] = _mm256_dpbusd_avx_epi32(sums[r][kChains - 1], hi, load(a + 32));
      }
    }
    const __m256i scales = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + b * 8)));
    for (int r = 0; r < R; ++r) {
      const __m256i total = kChains == 2 ? _mm256_add_epi32(sums[r][0], sums[r][kChains - 1]) : sums[r][0];
      isum[r] = _mm256_mullo_epi32(total, scales);
    }
    return;
  }
  q4_partial_block<R>(qs, sc, groups, b, xq, K, isum, [](__m256i w, const int8_t* a, uint8_t scale) {
    return _mm256_mullo_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, load(a)), _mm256_set1_epi32(scale));
  });
}

// R (2..8) activation rows against one weight row, in one pass (see block_sums)
template <int R>
void dot_rows(const uint8_t* qs, const uint8_t* sc, const int8_t* mn, const float* d, const float* dmin,
              int64_t groups, const int8_t* xq, const float* gsum, int64_t K, int64_t gstride, float* result) {
  q4_pass<R>(mn, d, dmin, groups, gsum, gstride, result, [&](int64_t b, bool full_block, __m256i* isum) {
    block_sums<R>(qs, sc, groups, b, full_block, xq, K, isum);
  });
}

template <int R>
void dot_rows_q8(const int8_t* w, const int8_t* xq, int64_t K, const int32_t* gsum, int64_t gstride, int32_t* result) {
  q8_vnni_rows<R>(w, xq, K, gsum, gstride, result, [](__m256i acc, __m256i u, __m256i s) {
    return _mm256_dpbusd_avx_epi32(acc, u, s);
  });
}

// 6-bit: the AVX2 passes (simd.h's q6_rows) with each madd + add of group scales fused into one vpdpwssd.
template <int R>
void dot_rows_q6(const uint8_t* ql, const uint8_t* qh, const int8_t* sc, const float* d, int64_t blocks,
                 const int8_t* xq, const int16_t* asum, int64_t K, int64_t astride, float* result) {
  q6_rows<R>(ql, qh, sc, d, blocks, xq, asum, K, astride, result, [](__m256i isum, __m256i t, __m256i scales) {
    return _mm256_dpwssd_avx_epi32(isum, t, scales);
  });
}

}  // namespace

#pragma GCC pop_options

namespace specdec_kernels {

bool avx_vnni_compiled() { return true; }

// Entry 1 stays empty: a single row is memory-bound and runs the AVX2 code (linear_kernels.cpp).
const DotFn kDotAvxVnni[kMaxRows + 1] = {nullptr, nullptr, dot_rows<2>, dot_rows<3>, dot_rows<4>,
                                         dot_rows<5>, dot_rows<6>, dot_rows<7>, dot_rows<8>};
const DotQ8Fn kDotQ8AvxVnni[kMaxRows + 1] = {nullptr, nullptr, dot_rows_q8<2>, dot_rows_q8<3>, dot_rows_q8<4>,
                                             dot_rows_q8<5>, dot_rows_q8<6>, dot_rows_q8<7>, dot_rows_q8<8>};
const DotQ6Fn kDotQ6AvxVnni[kMaxRows + 1] = {nullptr, nullptr, dot_rows_q6<2>, dot_rows_q6<3>, dot_rows_q6<4>,
                                             dot_rows_q6<5>, dot_rows_q6<6>, dot_rows_q6<7>, dot_rows_q6<8>};

}  // namespace specdec_kernels

#else  // no AVX-VNNI intrinsics in this compiler: the path is never offered

namespace specdec_kernels {

bool avx_vnni_compiled() { return false; }

const DotFn kDotAvxVnni[kMaxRows + 1] = {};
const DotQ8Fn kDotQ8AvxVnni[kMaxRows + 1] = {};
const DotQ6Fn kDotQ6AvxVnni[kMaxRows + 1] = {};

}  // namespace specdec_kernels

#endif
