// The int4 mode's other linears: int8 weights with per-row scales (the layers a GGUF stores more precisely than
// 4 bits) and 6-bit weights (Q6_K values), both x per-token int8 activations through linear_common.h's
// tiled_linear, so a row's result is the same alone or in a chunk. Their AVX2 dot products are here; the VNNI
// versions are in linear_kernels_avx512.cpp / linear_kernels_avxvnni.cpp (the same bits).
#include <torch/extension.h>
#include <immintrin.h>
#include "simd.h"
#include "dot_kernels.h"
#include "linear_common.h"

using specdec_kernels::DotQ6Fn;
using specdec_kernels::DotQ8Fn;
using specdec_kernels::active_path;

namespace {

// R activation rows against one int8 weight row (symmetric, per-row scale applied by the caller):
// exact int32 sums, |a|·(w·sign a) keeps maddubs' unsigned×signed form without saturation (127·127·2).
template <int R>
void dot_rows_q8(const int8_t* w, const int8_t* xq, int64_t K, const int32_t*, int64_t, int32_t* result) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
  for (int64_t k = 0; k < K; k += 32) {
    if ((k & 63) == 0) prefetch_ahead(w + k, 1);
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k));
    for (int r = 0; r < R; ++r) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * K + k));
      const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(wv, a));
      acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p, ones));
    }
  }
  for (int r = 0; r < R; ++r) result[r] = hsum_epi32(acc[r]);
}

}  // namespace

const DotQ8Fn specdec_kernels::kDotQ8Avx2[kMaxRows + 1] = {
    nullptr, dot_rows_q8<1>, dot_rows_q8<2>, dot_rows_q8<3>, dot_rows_q8<4>,
    dot_rows_q8<5>, dot_rows_q8<6>, dot_rows_q8<7>, dot_rows_q8<8>};

// x [M, K] float32 -> [M, N] float32 (+ bias) with int8 weights w [N, K] and per-row scales [N]:
// the int4 mode's layers that a GGUF stores more precisely than 4 bits (LM head, some v/down).
torch::Tensor q8_linear(torch::Tensor x, torch::Tensor w, torch::Tensor scales, c10::optional<torch::Tensor> bias) {
  const int64_t K = x.size(-1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K, "weights take ", w.size(1), " inputs, x has ", K);
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  const int64_t gstride = group_stride(K);
  const DotQ8Fn* dot = active_path().q8;
  return tiled_linear(x, N, bias, Layout::kNatural, [&](int64_t n, int64_t rows, const int8_t* xq, const int32_t* gsum, float* result) {
    int32_t sums[kMaxRows];
    dot[rows](wp + n * K, xq, K, gsum, gstride, sums);
    for (int64_t r = 0; r < rows; ++r) result[r] = static_cast<float>(sums[r]) * sp[n];
  });
}

// 6-bit weights (llama.cpp's Q6_K values: the LM head and some v/down projections of a Q4_K_M file)
// x int8 activations. Per output row n, K inputs (a multiple of 256), groups of 16, blocks of 256:
//   w[n, k] = d[n, b] * sc[n, l] * (q - 32)      q in 0..63, l = k / 16, b = k / 256; sc int8, d float32
// Codes are stored in vector order: vector v (0..7) of a block, bytes 4*j + t <-> code 16*g + 4*(v % 4) + t of
// group g = 2*j + v / 4 — each 32-bit lane one group's 4 codes (what vpdpbusd sums), the even groups in vectors
// 0-3 and the odd ones in 4-7, lane j of both holding the pair of groups the float part scales together.
// Their low 4 bits as in the 4-bit format (ql[128*b + 32*i + p] = lo(vec[2i][p]) | lo(vec[2i+1][p]) << 4),
// their top 2 bits in qh[64*b + 32*h + p] = sum_j hi(vec[4h+j][p]) << 2j. On AVX2 two maddubs results of one
// parity add exactly in 16 bits (2 * 2*63*127 < 2^15) and one madd applies their groups' scales (simd.h's
// q6_pass); on AVX-512 VNNI one vpdpbusd per pair of vectors sums whole groups and one vpmulld scales them
// (linear_kernels_avx512.cpp). The -32 offset is one more madd per block on the activation sums of each
// group. ~0.82 bytes per weight instead of int8's 1. (Session 51: in the earlier order, two codes of a group
// per 16-bit lane, the VNNI paths had to run the AVX2 maddubs and a 5-row chunk cost 2.5x one row.)
namespace {

template <int R>
void dot_rows_q6(const uint8_t* ql, const uint8_t* qh, const int8_t* sc, const float* d, int64_t blocks,
                 const int8_t* xq, const int16_t* asum, int64_t K, int64_t astride, float* result) {
  q6_rows<R>(ql, qh, sc, d, blocks, xq, asum, K, astride, result, [](__m256i isum, __m256i t, __m256i scales) {
    return _mm256_add_epi32(isum, _mm256_madd_epi16(t, scales));
  });
}

}  // namespace

const DotQ6Fn specdec_kernels::kDotQ6Avx2[kMaxRows + 1] = {
    nullptr, dot_rows_q6<1>, dot_rows_q6<2>, dot_rows_q6<3>, dot_rows_q6<4>,
    dot_rows_q6<5>, dot_rows_q6<6>, dot_rows_q6<7>, dot_rows_q6<8>};

// x [M, K] float32 -> [M, N] float32 (+ bias) with the 6-bit format above.
torch::Tensor q6_linear(torch::Tensor x, torch::Tensor ql, torch::Tensor qh, torch::Tensor sc, torch::Tensor d,
                        c10::optional<torch::Tensor> bias) {
  const int64_t K = x.size(-1), N = ql.size(0), blocks = K / 256;
  TORCH_CHECK(K % 256 == 0 && ql.size(1) == K / 2 && qh.size(1) == K / 4, "weights take ", ql.size(1) * 2, " inputs, x has ", K);
  TORCH_CHECK(sc.size(1) == K / 16 && d.size(1) == blocks, "block layout does not match");
  const uint8_t* qlp = ql.data_ptr<uint8_t>();
  const uint8_t* qhp = qh.data_ptr<uint8_t>();
  const int8_t* scp = sc.data_ptr<int8_t>();
  const float* dp = d.data_ptr<float>();
  const int64_t astride = 2 * group_stride(K);  // int16 sums per row in the int32 group-sum buffer
  const DotQ6Fn* dot = active_path().q6;
  return tiled_linear(x, N, bias, Layout::kQ6, [&](int64_t n, int64_t rows, const int8_t* xq, const int32_t* gsum, float* result) {
    dot[rows](qlp + n * (K / 2), qhp + n * (K / 4), scp + n * (K / 16), dp + n * blocks, blocks, xq,
                 reinterpret_cast<const int16_t*>(gsum), K, astride, result);
  });
}
