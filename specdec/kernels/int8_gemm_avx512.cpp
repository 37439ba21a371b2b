// The int8 mode's linear layers on AVX-512 VNNI: a register-blocked GEMM (the torch-facing wrapper is
// int8_gemm.cpp).
//
// Why our own: fbgemm, which the int8 mode used everywhere, ran the 1.5B target's prompt passes at
// ~700 GOPS on a 2-core Zen 4 EPYC whose vpdpbusd peak is ~940; a prompt pass is compute-bound (~4 ms
// a row), and under load every new request's time to first token is mostly prompt passes. This kernel
// keeps 6 activation rows x 64 outputs in 24 zmm accumulators and runs at ~93 % of the peak (a
// standalone probe: 875 GOPS at 128 rows), and as one stream per thread it reads the weights at the
// bandwidth limit for a single row.
//
// Format: weights w [N, K] (int8, symmetric, a float scale per output) are stored as w + 128 (uint8:
// vpdpbusd's unsigned operand) in panels of 64 outputs: packed[p, k/4, j, t] = w[64p + j, 4(k/4) + t] + 128,
// so one 64-byte load holds 4 inputs of 16 outputs. Activation rows are int8 with their own scale
// (127 levels, symmetric); vpdpbusd's sum over (w + 128) * q is exact in int32, and 128 * (the row's
// total of q) is taken off after.
//
// Exactness: each output is (float(exact int32 sum) * row scale) * weight scale (+ bias): the same
// operations whatever the number of rows, the tile it falls in or the thread that runs it — a row's
// result is bit-identical alone or in a chunk (the premise of exact speculation).
//
// Compiled for AVX-512 (the pragma), run only where the CPU reports avx512f/bw/vl/vnni (int8_gemm.cpp
// checks); nothing here includes torch, and everything but the three entry points (the quantizer, the panel
// kernel and the epilogue int8_finish_rows, which the AMX kernel shares) has internal linkage.
#include <immintrin.h>
#include <cstdint>
#include "dot_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")

namespace {

// acc += unsigned bytes of u x signed bytes of s, 4 per int32 lane. Inline asm, not the intrinsic:
// GCC 12 kept the 24 accumulators of the intrinsic version in memory (a load and a store around every
// vpdpbusd: 45 % of the peak instead of 93 %).
inline __attribute__((always_inline)) void dot4(__m512i& acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
}

constexpr int kTileRows = 6;  // activation rows per register tile (x 4 zmm of 16 outputs: 24 accumulators)

// Named accumulators (an array of them was spilled too), rows past R compiled away.
#define SPECDEC_ROW_ACC(r) __m512i c##r##0, c##r##1, c##r##2, c##r##3;
#define SPECDEC_ROW_ZERO(r) \
  if constexpr (R > r) { c##r##0 = c##r##1 = c##r##2 = c##r##3 = _mm512_setzero_si512(); }
#define SPECDEC_ROW_STEP(r)                                                                      \
  if constexpr (R > r) {                                                                         \
    const __m512i a = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(xq + r * K + k));    \
    dot4(c##r##0, w0, a); dot4(c##r##1, w1, a); dot4(c##r##2, w2, a); dot4(c##r##3, w3, a);      \
  }
#define SPECDEC_ROW_STORE(r)                                                          \
  if constexpr (R > r) {                                                              \
    _mm512_store_si512(sums + r * 64, c##r##0); _mm512_store_si512(sums + r * 64 + 16, c##r##1); \
    _mm512_store_si512(sums + r * 64 + 32, c##r##2); _mm512_store_si512(sums + r * 64 + 48, c##r##3); \
  }

// R activation rows x one panel of 64 outputs (cols of them real), over all K inputs, then each
// output scaled and stored.
template <int R>
void panel_rows(const int8_t* xq, const float* xs, const int32_t* totals, int64_t K, const uint8_t* panel,
                const float* ws, const float* bias, int64_t cols, float* out, int64_t ldo) {
  SPECDEC_ROW_ACC(0) SPECDEC_ROW_ACC(1) SPECDEC_ROW_ACC(2) SPECDEC_ROW_ACC(3) SPECDEC_ROW_ACC(4) SPECDEC_ROW_ACC(5)
  SPECDEC_ROW_ZERO(0) SPECDEC_ROW_ZERO(1) SPECDEC_ROW_ZERO(2) SPECDEC_ROW_ZERO(3) SPECDEC_ROW_ZERO(4) SPECDEC_ROW_ZERO(5)
  for (int64_t k = 0; k < K; k += 4) {
    const uint8_t* w = panel + k * 64;
    const __m512i w0 = _mm512_loadu_si512(w), w1 = _mm512_loadu_si512(w + 64), w2 = _mm512_loadu_si512(w + 128),
                  w3 = _mm512_loadu_si512(w + 192);
    SPECDEC_ROW_STEP(0) SPECDEC_ROW_STEP(1) SPECDEC_ROW_STEP(2) SPECDEC_ROW_STEP(3) SPECDEC_ROW_STEP(4) SPECDEC_ROW_STEP(5)
  }
  alignas(64) int32_t sums[R * 64];
  SPECDEC_ROW_STORE(0) SPECDEC_ROW_STORE(1) SPECDEC_ROW_STORE(2) SPECDEC_ROW_STORE(3) SPECDEC_ROW_STORE(4)
  SPECDEC_ROW_STORE(5)
  specdec_kernels::int8_finish_rows(sums, R, totals, xs, ws, bias, cols, out, ldo);
}

#undef SPECDEC_ROW_ACC
#undef SPECDEC_ROW_ZERO
#undef SPECDEC_ROW_STEP
#undef SPECDEC_ROW_STORE

using PanelFn = void (*)(const int8_t*, const float*, const int32_t*, int64_t, const uint8_t*, const float*,
                         const float*, int64_t, float*, int64_t);
const PanelFn kPanelRows[kTileRows + 1] = {nullptr, panel_rows<1>, panel_rows<2>, panel_rows<3>,
                                           panel_rows<4>, panel_rows<5>, panel_rows<6>};

}  // namespace

#pragma GCC pop_options

namespace specdec_kernels {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")

void int8_quantize_rows_avx512(const float* x, int64_t rows, int64_t K, int8_t* xq, float* xs, int32_t* totals) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * K;
    __m512 vmax = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(row + k)));
    const float amax = _mm512_reduce_max_ps(vmax);
    xs[r] = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m512i total = _mm512_setzero_si512();
    for (int64_t k = 0; k < K; k += 16) {
      const __m512i q = _mm512_cvtps_epi32(
          _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(row + k), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      total = _mm512_add_epi32(total, q);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + r * K + k), _mm512_cvtsepi32_epi8(q));
    }
    totals[r] = _mm512_reduce_add_epi32(total);
  }
}

void int8_finish_rows(const int32_t* sums, int64_t rows, const int32_t* totals, const float* xs, const float* ws,
                      const float* bias, int64_t cols, float* out, int64_t ldo) {
  __mmask16 mask[4];
  __m512 scale[4], add[4];
  for (int j = 0; j < 4; ++j) {
    const int64_t left = cols - 16 * j;
    mask[j] = left >= 16 ? __mmask16(0xFFFF) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1);
    scale[j] = _mm512_maskz_loadu_ps(mask[j], ws + 16 * j);
    add[j] = bias ? _mm512_maskz_loadu_ps(mask[j], bias + 16 * j) : _mm512_setzero_ps();
  }
  for (int64_t r = 0; r < rows; ++r) {
    const __m512i offset = _mm512_set1_epi32(128 * totals[r]);
    const __m512 row_scale = _mm512_set1_ps(xs[r]);
    for (int j = 0; j < 4; ++j) {
      const __m512i sum = _mm512_loadu_si512(sums + r * 64 + 16 * j);
      __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum, offset)), row_scale);
      v = _mm512_mul_ps(v, scale[j]);
      if (bias) v = _mm512_add_ps(v, add[j]);
      _mm512_mask_storeu_ps(out + r * ldo + 16 * j, mask[j], v);
    }
  }
}

void int8_gemm_panel_avx512(const int8_t* xq, const float* xs, const int32_t* totals, int64_t rows, int64_t K,
                            const uint8_t* panel, const float* ws, const float* bias, int64_t cols, float* out,
                            int64_t ldo) {
  int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows)
    kPanelRows[kTileRows](xq + r * K, xs + r, totals + r, K, panel, ws, bias, cols, out + r * ldo, ldo);
  if (r < rows) kPanelRows[rows - r](xq + r * K, xs + r, totals + r, K, panel, ws, bias, cols, out + r * ldo, ldo);
}

#pragma GCC pop_options

}  // namespace specdec_kernels
