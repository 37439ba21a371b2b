// What the linear kernels of the int4 mode share (linear_kernels.cpp: 4-bit; linear_kernels_q6q8.cpp: 6-bit
// and int8 weights): quantizing activation rows, and tiled_linear, the loop that shares a call's weight rows
// among the threads and turns each row's dot products into outputs. Included by AVX2-compiled files only;
// everything here has internal linkage (each file its own copy), as in simd.h.
#pragma once
#include <torch/extension.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>
#include "dot_kernels.h"
#include "tile_schedule.h"

namespace {

using specdec_kernels::kMaxRows;

// How a kernel wants a quantized activation row: in order (int8 weights), or in the vector order
// of the 4-bit (see above) or 6-bit (q6_linear below) weight layouts; kQ4Tiles: in order with kQ4's float
// group sums (the 4-bit weights on AMX tiles, whose A operand is each group's 32 codes in order).
enum class Layout { kNatural, kQ4, kQ4Tiles, kQ6 };

// One activation row -> int8 (symmetric, 127 levels, its own scale), laid out for `layout`, and the
// sums of its codes per group of 32 (kQ4: as float32; kNatural: only their int32 total, first) or 16
// (kQ6: int16), in group_sum's memory.
void quantize_row(const float* x, int64_t K, int8_t* xq, float* scale, int32_t* group_sum, Layout layout) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + k), abs_mask));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  *scale = amax / 127.0f;
  const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  for (int64_t g = 0; g < K / 32; ++g) {
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + g * 32 + i * 8), inv);
      q[i] = _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    __m256i total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t = _mm_hadd_epi32(t, t);
    t = _mm_hadd_epi32(t, t);
    group_sum[g] = _mm_cvtsi128_si32(t);
    // kQ4 keeps them as floats (same memory): the kernel's per-block min term multiplies them as floats,
    // and converting once here saves a conversion per weight row
    if (layout == Layout::kQ4 || layout == Layout::kQ4Tiles)
      reinterpret_cast<float*>(group_sum)[g] = static_cast<float>(group_sum[g]);
    // pack 32 int32 -> 32 int8 in order (packs interleave 128-bit lanes: fix with a permute)
    __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
    __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
    __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + g * 32), p8);
  }
  if (layout == Layout::kNatural) {  // int8 weights need only the row's total (group_sum[0])
    int32_t total = 0;
    for (int64_t g = 0; g < K / 32; ++g) total += group_sum[g];
    group_sum[0] = total;
  } else if (layout == Layout::kQ4) {
    for (int64_t b = 0; b < K / 256; ++b) {  // full blocks: unit (group g, v) -> (v, group g), 4 bytes each
      int32_t units[64];
      std::memcpy(units, xq + b * 256, 256);
      for (int v = 0; v < 8; ++v)
        for (int g = 0; g < 8; ++g) std::memcpy(xq + b * 256 + 4 * (8 * v + g), units + 8 * g + v, 4);
    }
  } else if (layout == Layout::kQ6) {
    int16_t* sums = reinterpret_cast<int16_t*>(group_sum);
    for (int64_t j = 0; j < K / 16; ++j) {
      int32_t total = 0;
      for (int i = 0; i < 16; ++i) total += xq[16 * j + i];
      sums[j] = static_cast<int16_t>(total);
    }
    // 4-byte units as the weights' vectors v (q6.py's interleave_q6: lane j of v = unit v mod 4 of group
    // 2j + v / 4), stored pair by pair — v and v + 4 side by side (position 2 (v mod 4) + v / 4), what one
    // 512-bit vpdpbusd reads
    for (int64_t b = 0; b < K / 256; ++b) {
      int32_t units[64];
      std::memcpy(units, xq + b * 256, 256);
      for (int p = 0; p < 8; ++p)
        for (int j = 0; j < 8; ++j) std::memcpy(xq + b * 256 + 4 * (8 * p + j), units + 4 * (2 * j + p % 2) + p / 2, 4);
    }
  }
}

// With one activation row, a kernel's `rows_dot` computes this many consecutive weight rows at once
// (linear_kernels.cpp: dot_weight_rows).
constexpr int kWeightRows = 4;

// Shared by the kernels: check x, quantize every activation row, then for blocks of 32 weight rows
// (kept in L2 while each 8-row activation tile passes over them, for prefill) let row_dot(n, rows,
// xq, gsum, result) compute `rows` activation rows against weight row n, and scale each by its own
// activation scale, plus the bias. The same operations per row for any M: batch invariance.
// Group sums are stored per row in whole blocks of 8 (zero padded): group_stride(K) entries.
inline int64_t group_stride(int64_t K) { return (K / 32 + 7) / 8 * 8; }

template <typename T>
T* align64(T* p) {
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

// Weight rows per tile: kept in L2 while every 8-row activation tile passes over them.
constexpr int64_t kTileRows = 32;

// With a single activation row, `rows_dot(n, xq, gsum, result)`, where given, computes kWeightRows weight
// rows from n at once (see dot_weight_rows).
struct NoRowsDot {
  void operator()(int64_t, const int8_t*, const int32_t*, float*) const {}
};

// Every activation row of x quantized for `layout` (rows 64-byte aligned: no vector load straddles two
// cache lines — they cost ~30 % of a chunk's time in the 512-bit kernel before), each with its scale and its
// group sums (group_stride(K) apart), and the one way a row's dot product becomes its output: times the
// row's scale, then the bias.
struct QuantizedRows {
  int64_t M, K, gstride;
  std::vector<int8_t> xq_storage;
  std::vector<float> xs;
  std::vector<int32_t> gsum_storage;
  int8_t* xq;
  int32_t* gsum;

  QuantizedRows(const torch::Tensor& x, Layout layout)
      : M(x.size(0)), K(x.size(1)), gstride(group_stride(K)), xq_storage(M * K + 63), xs(M),
        gsum_storage(M * gstride + 16, 0), xq(align64(xq_storage.data())), gsum(align64(gsum_storage.data())) {
    const float* xp = x.data_ptr<float>();
    for (int64_t m = 0; m < M; ++m) quantize_row(xp + m * K, K, xq + m * K, &xs[m], gsum + m * gstride, layout);
  }

  float output(int64_t m, float dot, const float* bias, int64_t n) const {
    float v = dot * xs[m];
    if (bias) v = v + bias[n];
    return v;
  }
};

// x [M, K] float32, contiguous, K a multiple of 64 (every kernel's requirement)
void check_input(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous [M, K] float32");
  TORCH_CHECK(x.size(1) % 64 == 0, "input size ", x.size(1), " is not a multiple of 64");
}

template <typename RowDot, typename RowsDot = NoRowsDot>
torch::Tensor tiled_linear(const torch::Tensor& x, int64_t N, const c10::optional<torch::Tensor>& bias, Layout layout,
                           RowDot row_dot, RowsDot rows_dot = RowsDot()) {
  constexpr bool kHasRowsDot = !std::is_same_v<RowsDot, NoRowsDot>;
  check_input(x);
  const QuantizedRows q(x, layout);
  const int64_t M = q.M, K = q.K, gstride = q.gstride;
  auto out = torch::empty({M, N}, x.options());
  float* op = out.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  // tiles of kTileRows weight rows, shared among the threads (tile_schedule.h)
  specdec_kernels::run_tiles((N + kTileRows - 1) / kTileRows, [&](int64_t tile) {
    float result[kMaxRows];
    const int64_t nb = tile * kTileRows, ne = std::min<int64_t>(nb + kTileRows, N);
    for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
      const int64_t rows = std::min<int64_t>(kMaxRows, M - m0);
      int64_t n = nb;
      if (kHasRowsDot && rows == 1) {
        for (; n + kWeightRows <= ne; n += kWeightRows) {
          rows_dot(n, q.xq + m0 * K, q.gsum + m0 * gstride, result);
          for (int64_t j = 0; j < kWeightRows; ++j) op[m0 * N + n + j] = q.output(m0, result[j], bp, n + j);
        }
      }
      for (; n < ne; ++n) {
        row_dot(n, rows, q.xq + m0 * K, q.gsum + m0 * gstride, result);
        for (int64_t r = 0; r < rows; ++r) op[(m0 + r) * N + n] = q.output(m0 + r, result[r], bp, n);
      }
    }
  });
  return out;
}

}  // namespace
