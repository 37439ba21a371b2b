// 4-bit weights x int8 activations, int32 dot products per group of 32: the CPU decode kernel
// (with the 6-bit and int8-weight linears of the int4 mode below: q6_linear, q8_linear).
//
// Why our own kernel: a decode step streams every weight once, so bytes per weight set the speed
// (int8: 1 byte, this format: ~0.59), and speculative verification needs a token's result to be
// bit-identical whether it runs alone or inside a chunk. Here every activation row is quantized
// with its own scale and every (row, output) pair runs the same instruction sequence whatever the
// number of rows, so that holds by construction (no reduction order depends on M).
//
// Weight format (per output row n, K inputs (a multiple of 64), groups of 32, blocks of 8 groups; a
// last partial block has its sc/mn padded with zeros to 8 entries — sizes like the 0.5B draft's 896):
//   w[n, k] = d[n, b] * sc[n, g] * q - dmin[n, b] * mn[n, g]      q in 0..15, g = k / 32, b = k / 256
// sc is uint8, mn int8, d/dmin float32: llama.cpp's Q4_K values exactly (its 6-bit scales and mins,
// per-256 d/dmin), so Q4_K tensors of a GGUF run with their own values. The 4-bit codes of a whole
// block of 256 are stored *interleaved* (q4.py: interleave_blocks) so that one 32-byte vector holds
// 4 codes of each of the block's 8 groups, as 16-bit lanes 2g, 2g+1 after maddubs:
//   vector v (0..7), byte 4*g + t  <->  code 32*g + 4*v + t;   qs[128*b + 32*i + p] = vec[2i][p] | vec[2i+1][p] << 4
// Why: the 8 maddubs results of a block can then be summed in 16 bits (8 * 2*15*127 = 30480 < 2^15,
// exact) and scaled by their groups' sc with one madd — 17 vector ops per 256 weights and row, not 24
// (the multiply ports are this kernel's limit once a chunk has 2+ rows: verification and prefill).
// A partial last block (input sizes like 896) keeps Q4_K's pair layout:
//   qs[n, 32*p + j] = q[64*p + j] | q[64*p + 32 + j] << 4          (group pairs share 32 bytes)
// The activations of full blocks are quantized into the same interleaved order (8x8 transpose of
// 4-byte units).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include "simd.h"
#include "dot_kernels.h"
#include "tile_schedule.h"
#include <cmath>
#include <atomic>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace {

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
    for (int64_t b = 0; b < K / 256; ++b) {  // unit (group l, v) -> (v, group l), 2 bytes each
      int16_t units[128];
      std::memcpy(units, xq + b * 256, 256);
      for (int v = 0; v < 8; ++v)
        for (int l = 0; l < 16; ++l) std::memcpy(xq + b * 256 + 2 * (16 * v + l), units + 8 * l + v, 2);
    }
  }
}

// One block (b) of one weight row against R activation rows: each row's exact int32 group sums, each
// times its group's sc. Full blocks: 8 maddubs summed in 16 bits, one madd applies the 8 group scales;
// a partial last block: per pair of groups as in Q4_K's layout. Exact in int32 (255 * 30480 * 2 < 2^31).
template <int R>
inline void block_sums(const uint8_t* qs, const uint8_t* sc, int64_t groups, int64_t b, bool full_block,
                       const int8_t* xq, int64_t K, __m256i isum[R]) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  prefetch_ahead(qs + b * 128, 2);
  if (full_block) {
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m256i w[8];
    for (int i = 0; i < 4; ++i) {
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + b * 128 + 32 * i));
      w[2 * i] = _mm256_and_si256(packed, low);
      w[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
    }
    const __m256i scales = _mm256_cvtepu8_epi16(
        _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + b * 8)), dup));
    for (int r = 0; r < R; ++r) {
      const __m256i* a = reinterpret_cast<const __m256i*>(xq + r * K + b * 256);
      __m256i t = _mm256_maddubs_epi16(w[0], _mm256_loadu_si256(a));
      for (int i = 1; i < 8; ++i) t = _mm256_add_epi16(t, _mm256_maddubs_epi16(w[i], _mm256_loadu_si256(a + i)));
      isum[r] = _mm256_madd_epi16(t, scales);
    }
    return;
  }
  q4_partial_block<R>(qs, sc, groups, b, xq, K, isum, [](__m256i w, const int8_t* a, uint8_t scale) {
    const __m256i pairs = _mm256_maddubs_epi16(w, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(scale));
  });
}

// Up to 4 activation rows against one weight row (more rows: several passes, so every row runs
// the same instruction sequence for any M): per block, block_sums then simd.h's float step.
template <int R>
void dot_pass(const uint8_t* qs, const uint8_t* sc, const int8_t* mn, const float* d, const float* dmin,
              int64_t groups, const int8_t* xq, const float* gsum, int64_t K, int64_t gstride, float* result) {
  q4_pass<R>(mn, d, dmin, groups, gsum, gstride, result, [&](int64_t b, bool full_block, __m256i* isum) {
    block_sums<R>(qs, sc, groups, b, full_block, xq, K, isum);
  });
}

// One activation row (a decode step) against W consecutive weight rows, their blocks interleaved: per
// row the operations of dot_pass<1>, so the same bits. Why: a decode step's rows are short (896 or 1536
// inputs: 448-768 bytes) and one call per row left the end of each row — its two horizontal sums, the
// call and return — exposed; the 0.5B draft's step spent ~10 % there and ~18 % with the other thread
// waiting at the barrier.
constexpr int kWeightRows = 4;
void dot_weight_rows(const uint8_t* qs, const uint8_t* sc, const int8_t* mn, const float* d, const float* dmin,
                     int64_t groups, const int8_t* xq, const float* gsum, int64_t K, float* result) {
  const int64_t blocks = (groups + 7) / 8, full = groups / 8;
  __m256 acc[kWeightRows], min_acc[kWeightRows];
  for (int j = 0; j < kWeightRows; ++j) { acc[j] = _mm256_setzero_ps(); min_acc[j] = _mm256_setzero_ps(); }
  for (int64_t b = 0; b < blocks; ++b) {
    for (int j = 0; j < kWeightRows; ++j) {
      __m256i isum[1];
      block_sums<1>(qs + j * (K / 2), sc + j * blocks * 8, groups, b, b < full, xq, K, isum);
      block_accumulate<1>(mn + j * blocks * 8, d + j * blocks, dmin + j * blocks, b, isum, gsum, 0, acc + j, min_acc + j);
    }
  }
  for (int j = 0; j < kWeightRows; ++j) result[j] = hsum(acc[j]) - hsum(min_acc[j]);
}

// R (1..8) activation rows against one weight row: passes of at most 4 rows (8 would spill the 16
// vector registers); the weight row is in L1 for the second pass.
template <int R>
void dot_rows(const uint8_t* qs, const uint8_t* sc, const int8_t* mn, const float* d, const float* dmin,
              int64_t groups, const int8_t* xq, const float* gsum, int64_t K, int64_t gstride, float* result) {
  constexpr int first = R < 4 ? R : 4;
  dot_pass<first>(qs, sc, mn, d, dmin, groups, xq, gsum, K, gstride, result);
  if constexpr (R > 4)
    dot_pass<R - 4>(qs, sc, mn, d, dmin, groups, xq + 4 * K, gsum + 4 * gstride, K, gstride, result + 4);
}

using specdec_kernels::DotFn;
using specdec_kernels::DotQ6Fn;
using specdec_kernels::DotQ8Fn;
using specdec_kernels::kMaxRows;
const DotFn kDot[kMaxRows + 1] = {nullptr, dot_rows<1>, dot_rows<2>, dot_rows<3>, dot_rows<4>,
                                  dot_rows<5>, dot_rows<6>, dot_rows<7>, dot_rows<8>};

}  // namespace

// The instruction set the dot products run with: the best this CPU has unless set_kernel_path chose
// another (tests run every supported path). Every path gives the same bits (dot_kernels.h).
struct KernelPath {
  const char* name;
  const DotFn* q4;
  const DotQ8Fn* q8;
  const DotQ6Fn* q6;
  const specdec_kernels::AttentionKernels* attention;
};
const KernelPath& active_path();

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

// Calls with at least this many activation rows run the 4-bit weights on AMX tiles where the CPU has them and
// the AVX-512 VNNI path is active (same bits: linear_kernels_amx.cpp); 0: never. Settable for tests and
// measurements. Why 64: one group of 32 inputs per tile product (each group has its own scale) leaves the
// tiles latency-bound, so AMX pays only where a panel's unpacking is shared by many rows — the 1.5B int4
// target's forwards on a 2-core Xeon with AMX, AMX ÷ VNNI time: 16 rows 1.11, 32 rows 1.02, 64 rows 0.92,
// 128 rows 0.83 (benchmarks/q4_amx_ab.py): a loaded server's batched steps and prompts, not one request's
// verification chunks.
std::atomic<int64_t> g_q4_amx_min_rows{64};

int64_t q4_amx_min_rows() {
  const bool runs = specdec_kernels::amx_q4_ready() && std::strcmp(active_path().name, "avx512-vnni") == 0;
  return runs ? g_q4_amx_min_rows.load() : 0;
}

void set_q4_amx_min_rows(int64_t rows) {
  TORCH_CHECK(rows >= 0, "rows must be >= 0 (0: never AMX)");
  g_q4_amx_min_rows = rows;
}

// The 4-bit linear on AMX tiles: panels of 16 weight rows, each unpacked once for all of x's rows (full blocks
// only; linear_kernels_amx.cpp).
torch::Tensor q4_linear_amx(const torch::Tensor& x, const uint8_t* qs, const uint8_t* sc, const int8_t* mn,
                            const float* d, const float* dmin, int64_t N, const c10::optional<torch::Tensor>& bias) {
  constexpr int64_t kPanel = 16;
  const QuantizedRows q(x, Layout::kQ4Tiles);
  const int64_t M = q.M, K = q.K, blocks = K / 256;
  auto out = torch::empty({M, N}, x.options());
  float* op = out.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  specdec_kernels::run_tiles((N + kTileRows - 1) / kTileRows, [&](int64_t tile) {
    std::vector<float> result(M * kPanel);
    const int64_t nb = tile * kTileRows, ne = std::min<int64_t>(nb + kTileRows, N);
    for (int64_t n = nb; n < ne; n += kPanel) {
      const int64_t outs = std::min<int64_t>(kPanel, ne - n);
      specdec_kernels::q4_panel_amx(qs + n * (K / 2), sc + n * blocks * 8, mn + n * blocks * 8, d + n * blocks,
                                    dmin + n * blocks, K, outs, q.xq, reinterpret_cast<const float*>(q.gsum), q.gstride,
                                    M, result.data());
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < outs; ++j) op[m * N + n + j] = q.output(m, result[m * kPanel + j], bp, n + j);
    }
  });
  return out;
}

// x [M, K] float32 -> [M, N] float32 (+ bias). See the format above.
torch::Tensor q4_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor sc, torch::Tensor mn, torch::Tensor d,
                        torch::Tensor dmin, c10::optional<torch::Tensor> bias) {
  const int64_t K = x.size(-1), N = qs.size(0), groups = K / 32, blocks = (groups + 7) / 8;
  TORCH_CHECK(K % 64 == 0 && qs.size(1) == K / 2, "weights take ", qs.size(1) * 2, " inputs, x has ", K);
  TORCH_CHECK(d.size(1) == blocks && sc.size(1) == blocks * 8 && mn.size(1) == blocks * 8, "block layout does not match");
  const uint8_t* qsp = qs.data_ptr<uint8_t>();
  const uint8_t* scp = sc.data_ptr<uint8_t>();
  const int8_t* mnp = mn.data_ptr<int8_t>();
  const float* dp = d.data_ptr<float>();
  const float* dmp = dmin.data_ptr<float>();
  check_input(x);
  const int64_t amx_from = q4_amx_min_rows();
  if (amx_from && x.size(0) >= amx_from && K % 256 == 0)
    return q4_linear_amx(x, qsp, scp, mnp, dp, dmp, N, bias);
  const int64_t gstride = group_stride(K);
  const DotFn* dot = active_path().q4;
  return tiled_linear(x, N, bias, Layout::kQ4, [&](int64_t n, int64_t rows, const int8_t* xq, const int32_t* gsum, float* result) {
    dot[rows](qsp + n * (K / 2), scp + n * blocks * 8, mnp + n * blocks * 8, dp + n * blocks, dmp + n * blocks,
               groups, xq, reinterpret_cast<const float*>(gsum), K, gstride, result);
  }, [&](int64_t n, const int8_t* xq, const int32_t* gsum, float* result) {  // one activation row: every path
    dot_weight_rows(qsp + n * (K / 2), scp + n * blocks * 8, mnp + n * blocks * 8, dp + n * blocks, dmp + n * blocks,
                    groups, xq, reinterpret_cast<const float*>(gsum), K, result);
  });
}

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

const DotQ8Fn kDotQ8[kMaxRows + 1] = {nullptr, dot_rows_q8<1>, dot_rows_q8<2>, dot_rows_q8<3>, dot_rows_q8<4>,
                                      dot_rows_q8<5>, dot_rows_q8<6>, dot_rows_q8<7>, dot_rows_q8<8>};

}  // namespace

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
// Codes are stored in vector order: vector v (0..7) of a block, byte 2*l + t <-> code 16*l + 2*v + t,
// so after maddubs 16-bit lane l of every vector belongs to group l. Their low 4 bits as in the 4-bit
// format (ql[128*b + 32*i + p] = lo(vec[2i][p]) | lo(vec[2i+1][p]) << 4), their top 2 bits in
// qh[64*b + 32*h + p] = sum_j hi(vec[4h+j][p]) << 2j. Two maddubs results add exactly in 16 bits
// (2 * 2*63*127 < 2^15), one madd per pair applies the 16 group scales; the -32 offset is one more
// madd per block on the activation sums of each group. ~0.82 bytes per weight instead of int8's 1,
// and about half of int8's vector operations per row.
namespace {

template <int R>
void dot_pass_q6(const uint8_t* ql, const uint8_t* qh, const int8_t* sc, const float* d, int64_t blocks,
                 const int8_t* xq, const int16_t* asum, int64_t K, int64_t astride, float* result) {
  q6_pass<R>(ql, qh, sc, d, blocks, xq, asum, K, astride, result, [](__m256i isum, __m256i t, __m256i scales) {
    return _mm256_add_epi32(isum, _mm256_madd_epi16(t, scales));
  });
}

template <int R>
void dot_rows_q6(const uint8_t* ql, const uint8_t* qh, const int8_t* sc, const float* d, int64_t blocks,
                 const int8_t* xq, const int16_t* asum, int64_t K, int64_t astride, float* result) {
  constexpr int first = R < 4 ? R : 4;
  dot_pass_q6<first>(ql, qh, sc, d, blocks, xq, asum, K, astride, result);
  if constexpr (R > 4)
    dot_pass_q6<R - 4>(ql, qh, sc, d, blocks, xq + 4 * K, asum + 4 * astride, K, astride, result + 4);
}

const DotQ6Fn kDotQ6[kMaxRows + 1] = {nullptr, dot_rows_q6<1>, dot_rows_q6<2>, dot_rows_q6<3>, dot_rows_q6<4>,
                                      dot_rows_q6<5>, dot_rows_q6<6>, dot_rows_q6<7>, dot_rows_q6<8>};

}  // namespace

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


// Paths in order of preference; a path is usable when the CPU reports every feature it needs
// (__builtin_cpu_supports also checks that the OS saves the AVX-512 registers).
// A single activation row (a decode step) is memory-bound: there the AVX2 code streams the weights
// faster than the VNNI code (measured from DRAM on a Zen 4 EPYC, 1536x17920 4-bit layer: 0.70 vs
// 0.82 ms; 6-bit and int8 ~5 %), so the VNNI path runs it for 1 row and VNNI from 2 rows on (the
// same bits either way).
template <typename Fn>
struct VnniFromTwoRows {
  Fn table[kMaxRows + 1];
  VnniFromTwoRows(const Fn* avx2, const Fn* vnni) {
    table[0] = nullptr;
    table[1] = avx2[1];
    for (int rows = 2; rows <= kMaxRows; ++rows) table[rows] = vnni[rows];
  }
};
const VnniFromTwoRows<DotFn> kDotVnni(kDot, specdec_kernels::kDotAvx512Vnni);
const VnniFromTwoRows<DotQ8Fn> kDotQ8Vnni(kDotQ8, specdec_kernels::kDotQ8Avx512Vnni);
const VnniFromTwoRows<DotQ6Fn> kDotQ6Vnni(kDotQ6, specdec_kernels::kDotQ6Avx512Vnni);
const VnniFromTwoRows<DotFn> kDotAvxVnni(kDot, specdec_kernels::kDotAvxVnni);
const VnniFromTwoRows<DotQ8Fn> kDotQ8AvxVnni(kDotQ8, specdec_kernels::kDotQ8AvxVnni);
const VnniFromTwoRows<DotQ6Fn> kDotQ6AvxVnni(kDotQ6, specdec_kernels::kDotQ6AvxVnni);

// avx-vnni: the 256-bit VEX form of the same instructions, for CPUs with int8 dot products but no
// AVX-512 (linear_kernels_avxvnni.cpp); where both exist the AVX-512 path's 32 registers win.
const KernelPath kPaths[] = {
    {"avx512-vnni", kDotVnni.table, kDotQ8Vnni.table, kDotQ6Vnni.table, &specdec_kernels::kAttentionAvx512},
    {"avx-vnni", kDotAvxVnni.table, kDotQ8AvxVnni.table, kDotQ6AvxVnni.table, &specdec_kernels::kAttentionAvx2},
    {"avx2", kDot, kDotQ8, kDotQ6, &specdec_kernels::kAttentionAvx2},
};
constexpr int kNumPaths = sizeof(kPaths) / sizeof(kPaths[0]);

namespace specdec_kernels {

bool cpu_has_avx512_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
         __builtin_cpu_supports("avx512dq");
}

}  // namespace specdec_kernels

bool path_supported(int i) {
  if (std::strcmp(kPaths[i].name, "avx512-vnni") == 0) return specdec_kernels::cpu_has_avx512_vnni();
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (std::strcmp(kPaths[i].name, "avx-vnni") == 0)
    return avx2 && specdec_kernels::avx_vnni_compiled() && __builtin_cpu_supports("avxvnni");
  return avx2;
}

int best_path() {
  for (int i = 0; i < kNumPaths; ++i)
    if (path_supported(i)) return i;
  return kNumPaths - 1;
}

std::atomic<int> g_path{best_path()};

const KernelPath& active_path() { return kPaths[g_path.load(std::memory_order_relaxed)]; }

const specdec_kernels::AttentionKernels& specdec_kernels::attention_kernels() { return *active_path().attention; }

// The dot-product paths this CPU can run, best first.
std::vector<std::string> kernel_paths() {
  std::vector<std::string> names;
  for (int i = 0; i < kNumPaths; ++i)
    if (path_supported(i)) names.emplace_back(kPaths[i].name);
  return names;
}

std::string kernel_path() { return active_path().name; }

// Use `name` for every later call (process-wide); refused when this CPU lacks its instructions.
void set_kernel_path(const std::string& name) {
  for (int i = 0; i < kNumPaths; ++i) {
    if (name != kPaths[i].name) continue;
    TORCH_CHECK(path_supported(i), "this CPU cannot run the ", name, " kernels");
    g_path.store(i);
    return;
  }
  TORCH_CHECK(false, "unknown kernel path ", name);
}

// layer_ops.cpp: the rest of a decoder layer (one extension, specdec_cpu_kernels: build.py)
torch::Tensor rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual, torch::Tensor w, double eps);
torch::Tensor attention(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                        torch::Tensor v_cache, int64_t start, int64_t heads, int64_t kv_heads,
                        c10::optional<torch::Tensor> mask);
// layer_stack.cpp: the layer loop of a quantized decoder in one call
void register_layer_stack(pybind11::module& m);
// int8_gemm.cpp: the int8 mode's linear layer on AVX-512 VNNI
void register_int8_gemm(pybind11::module& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4_linear", &q4_linear, "4-bit x int8 linear (see source)");
  m.def("q6_linear", &q6_linear, "6-bit (Q6_K values) x int8 linear (see source)");
  m.def("q8_linear", &q8_linear, "int8 x int8 linear, per-row weight scales (see source)");
  m.def("kernel_paths", &kernel_paths, "the dot-product paths this CPU runs, best first");
  m.def("kernel_path", &kernel_path, "the path the linear kernels use now");
  m.def("set_kernel_path", &set_kernel_path, "use this path (tests; same bits on every path)");
  m.def("q4_amx_min_rows", &q4_amx_min_rows,
        "q4_linear runs AMX tiles from this many rows on (0: never, or no AMX / not the avx512-vnni path here)");
  m.def("set_q4_amx_min_rows", &set_q4_amx_min_rows, "q4_linear's AMX threshold in rows (0: never; same bits)");
  m.def("rms_norm", &rms_norm, "x += residual (in place, optional); RMSNorm(x) * w");
  m.def("attention", &attention, "RoPE, KV-cache write and row-wise attention for one layer");
  register_layer_stack(m);
  register_int8_gemm(m);
}
