// 4-bit weights x int8 activations, int32 dot products per group of 32: the CPU decode kernel (the int4
// mode's 6-bit and int8-weight linears: linear_kernels_q6q8.cpp; what they share: linear_common.h), and the
// choice of kernel path with the extension's module definition.
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
#include <atomic>
#include <cstring>
#include <string>
#include <vector>
#include "simd.h"
#include "dot_kernels.h"
#include "linear_common.h"
#include "tile_schedule.h"

using specdec_kernels::active_path;
using specdec_kernels::KernelPath;

namespace {

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

// Calls with at least this many activation rows run the 4-bit weights on AMX tiles where the CPU has them, the
// AVX-512 VNNI path is active and the layer has its AMX copy (same bits: linear_kernels_amx.cpp); 0: never.
// Settable for tests and measurements. Why 8: the 1.5B int4 target's forwards on a 2-core Xeon with AMX,
// VNNI ÷ AMX time (benchmarks/q4_amx_ab.py, context 512): 5 rows 0.94, 7 1.02, 8 1.04, 9 1.17, 16 1.26,
// 32 1.35, 64 1.43 — the tiles' fixed cost per block (eight products, each stored before the next use of its
// tile) is what a VNNI pass spends on ~7 rows.
std::atomic<int64_t> g_q4_amx_min_rows{8};

int64_t q4_amx_min_rows() {
  const bool runs = specdec_kernels::amx_q4_ready() && std::strcmp(active_path().name, "avx512-vnni") == 0;
  return runs ? g_q4_amx_min_rows.load() : 0;
}

void set_q4_amx_min_rows(int64_t rows) {
  TORCH_CHECK(rows >= 0, "rows must be >= 0 (0: never AMX)");
  g_q4_amx_min_rows = rows;
}

// The AMX path's copy of a 4-bit layer (dot_kernels.h: Q4AmxBlock), made once per layer by Q4Linear where
// amx_q4_ready(): bytes [panels, blocks, 2432]. Full blocks only (K a multiple of 256).
torch::Tensor q4_amx_repack(torch::Tensor qs, torch::Tensor sc, torch::Tensor mn, torch::Tensor d, torch::Tensor dmin) {
  TORCH_CHECK(specdec_kernels::amx_q4_ready(), "this CPU (or this process) cannot run AMX tiles");
  const int64_t N = qs.size(0), K = qs.size(1) * 2, blocks = K / 256;
  TORCH_CHECK(K % 256 == 0, "the AMX path takes whole blocks of 256 inputs; this layer has ", K);
  TORCH_CHECK(qs.is_contiguous() && sc.is_contiguous() && mn.is_contiguous() && d.is_contiguous() && dmin.is_contiguous(),
              "the layer's tensors must be contiguous");
  TORCH_CHECK(d.size(1) == blocks && sc.size(1) == blocks * 8 && mn.size(1) == blocks * 8, "block layout does not match");
  constexpr int64_t kBytes = sizeof(specdec_kernels::Q4AmxBlock);
  auto out = torch::empty({(N + 15) / 16, blocks, kBytes}, qs.options().dtype(torch::kUInt8));
  specdec_kernels::q4_amx_repack(qs.data_ptr<uint8_t>(), sc.data_ptr<uint8_t>(), mn.data_ptr<int8_t>(),
                                 d.data_ptr<float>(), dmin.data_ptr<float>(), K, N,
                                 reinterpret_cast<specdec_kernels::Q4AmxBlock*>(out.data_ptr<uint8_t>()));
  return out;
}

// The 4-bit linear on AMX tiles: per panel of 16 weight rows of the repacked copy, all of x's rows
// (linear_kernels_amx.cpp).
torch::Tensor q4_linear_amx(const torch::Tensor& x, const torch::Tensor& panels, int64_t N,
                            const c10::optional<torch::Tensor>& bias) {
  constexpr int64_t kPanel = 16;
  check_input(x);
  const int64_t K = x.size(-1), blocks = K / 256;
  TORCH_CHECK(panels.dim() == 3 && panels.size(0) == (N + kPanel - 1) / kPanel && panels.size(1) == blocks &&
                  panels.size(2) == static_cast<int64_t>(sizeof(specdec_kernels::Q4AmxBlock)) && panels.is_contiguous() &&
                  reinterpret_cast<uintptr_t>(panels.data_ptr()) % 64 == 0,
              "the AMX copy does not match this layer (q4_amx_repack of its own tensors)");
  const auto* panel_blocks = reinterpret_cast<const specdec_kernels::Q4AmxBlock*>(panels.data_ptr<uint8_t>());
  const QuantizedRows q(x, Layout::kQ4Tiles);
  const int64_t M = q.M;
  auto out = torch::empty({M, N}, x.options());
  float* op = out.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  specdec_kernels::run_tiles((N + kTileRows - 1) / kTileRows, [&](int64_t tile) {
    const int64_t nb = tile * kTileRows, ne = std::min<int64_t>(nb + kTileRows, N);
    for (int64_t n = nb; n < ne; n += kPanel)
      specdec_kernels::q4_panel_amx(panel_blocks + (n / kPanel) * blocks, K, std::min<int64_t>(kPanel, ne - n), q.xq,
                                    reinterpret_cast<const float*>(q.gsum), q.gstride, M, q.xs.data(),
                                    bp ? bp + n : nullptr, op + n, N);
  });
  return out;
}

// x [M, K] float32 -> [M, N] float32 (+ bias). See the format above.
// amx_panels: the layer's q4_amx_repack copy, where it has one (then calls of q4_amx_min_rows() rows or more run
// on AMX tiles).
torch::Tensor q4_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor sc, torch::Tensor mn, torch::Tensor d,
                        torch::Tensor dmin, c10::optional<torch::Tensor> bias, c10::optional<torch::Tensor> amx_panels) {
  const int64_t K = x.size(-1), N = qs.size(0), groups = K / 32, blocks = (groups + 7) / 8;
  TORCH_CHECK(K % 64 == 0 && qs.size(1) == K / 2, "weights take ", qs.size(1) * 2, " inputs, x has ", K);
  TORCH_CHECK(d.size(1) == blocks && sc.size(1) == blocks * 8 && mn.size(1) == blocks * 8, "block layout does not match");
  const uint8_t* qsp = qs.data_ptr<uint8_t>();
  const uint8_t* scp = sc.data_ptr<uint8_t>();
  const int8_t* mnp = mn.data_ptr<int8_t>();
  const float* dp = d.data_ptr<float>();
  const float* dmp = dmin.data_ptr<float>();
  const int64_t amx_from = q4_amx_min_rows();
  if (amx_panels.has_value() && amx_from && x.size(0) >= amx_from) return q4_linear_amx(x, *amx_panels, N, bias);
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
const VnniFromTwoRows<DotQ8Fn> kDotQ8Vnni(specdec_kernels::kDotQ8Avx2, specdec_kernels::kDotQ8Avx512Vnni);
const VnniFromTwoRows<DotQ6Fn> kDotQ6Vnni(specdec_kernels::kDotQ6Avx2, specdec_kernels::kDotQ6Avx512Vnni);
const VnniFromTwoRows<DotFn> kDotAvxVnni(kDot, specdec_kernels::kDotAvxVnni);
const VnniFromTwoRows<DotQ8Fn> kDotQ8AvxVnni(specdec_kernels::kDotQ8Avx2, specdec_kernels::kDotQ8AvxVnni);
const VnniFromTwoRows<DotQ6Fn> kDotQ6AvxVnni(specdec_kernels::kDotQ6Avx2, specdec_kernels::kDotQ6AvxVnni);

// avx-vnni: the 256-bit VEX form of the same instructions, for CPUs with int8 dot products but no
// AVX-512 (linear_kernels_avxvnni.cpp); where both exist the AVX-512 path's 32 registers win.
const KernelPath kPaths[] = {
    {"avx512-vnni", kDotVnni.table, kDotQ8Vnni.table, kDotQ6Vnni.table, &specdec_kernels::kAttentionAvx512},
    {"avx-vnni", kDotAvxVnni.table, kDotQ8AvxVnni.table, kDotQ6AvxVnni.table, &specdec_kernels::kAttentionAvx2},
    {"avx2", kDot, specdec_kernels::kDotQ8Avx2, specdec_kernels::kDotQ6Avx2, &specdec_kernels::kAttentionAvx2},
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

const KernelPath& specdec_kernels::active_path() { return kPaths[g_path.load(std::memory_order_relaxed)]; }

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

// linear_kernels_q6q8.cpp: the int4 mode's 6-bit and int8-weight linears
torch::Tensor q6_linear(torch::Tensor x, torch::Tensor ql, torch::Tensor qh, torch::Tensor sc, torch::Tensor d,
                        c10::optional<torch::Tensor> bias);
torch::Tensor q8_linear(torch::Tensor x, torch::Tensor w, torch::Tensor scales, c10::optional<torch::Tensor> bias);
// layer_ops.cpp: the rest of a decoder layer (one extension, specdec_cpu_kernels: build.py)
torch::Tensor rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual, torch::Tensor w, double eps);
torch::Tensor attention(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                        torch::Tensor v_cache, int64_t start, int64_t heads, int64_t kv_heads,
                        c10::optional<torch::Tensor> mask);
torch::Tensor prompt_attention(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                               torch::Tensor v_cache, int64_t start, int64_t heads, int64_t kv_heads,
                               c10::optional<torch::Tensor> mask);
std::string prompt_attention_kind();
void set_prompt_attention_kind(const std::string& name);
// layer_stack.cpp: the layer loop of a quantized decoder in one call
void register_layer_stack(pybind11::module& m);
// int8_gemm.cpp: the int8 mode's linear layer on AVX-512 VNNI
void register_int8_gemm(pybind11::module& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4_linear", &q4_linear, "4-bit x int8 linear (see source)", pybind11::arg("x"), pybind11::arg("qs"),
        pybind11::arg("sc"), pybind11::arg("mn"), pybind11::arg("d"), pybind11::arg("dmin"), pybind11::arg("bias"),
        pybind11::arg("amx_panels") = pybind11::none());
  m.def("q4_amx_repack", &q4_amx_repack, "a 4-bit layer's copy for the AMX path (where amx_q4_ready)");
  m.def("amx_q4_ready", &specdec_kernels::amx_q4_ready, "whether this CPU and process run AMX tiles");
  m.def("q6_linear", &q6_linear, "6-bit (Q6_K values) x int8 linear (see source)");
  m.def("q8_linear", &q8_linear, "int8 x int8 linear, per-row weight scales (see source)");
  m.def("kernel_paths", &kernel_paths, "the dot-product paths this CPU runs, best first");
  m.def("kernel_path", &kernel_path, "the path the linear kernels use now");
  m.def("set_kernel_path", &set_kernel_path, "use this path (tests; same bits on every path)");
  m.def("q4_amx_min_rows", &q4_amx_min_rows,
        "q4_linear runs AMX tiles from this many rows on (0: never, or no AMX / not the avx512-vnni path here)");
  m.def("set_q4_amx_min_rows", &set_q4_amx_min_rows, "q4_linear's AMX threshold in rows (0: never; same bits)");
  m.def("q4_amx_threshold", [] { return g_q4_amx_min_rows.load(); },
        "the threshold set_q4_amx_min_rows last set, whatever this CPU and path run (to restore it)");
  m.def("rms_norm", &rms_norm, "x += residual (in place, optional); RMSNorm(x) * w");
  m.def("attention", &attention, "RoPE, KV-cache write and row-wise attention for one layer");
  m.def("prompt_attention", &prompt_attention,
        "attention for a prompt twin's passes: causal rows on bf16 tiles where the CPU has AMX-BF16 (other bits)");
  m.def("prompt_attention_kind", &prompt_attention_kind, "how prompt_attention multiplies now: amx-bf16, avx512-bf16 or float32");
  m.def("set_prompt_attention_kind", &set_prompt_attention_kind, "make prompt_attention multiply so (tests, measurements)");
  m.def("amx_bf16_ready", &specdec_kernels::amx_bf16_ready, "whether this CPU and process run AMX-BF16 tiles");
  m.def("avx512_bf16_ready", &specdec_kernels::avx512_bf16_ready, "whether this CPU runs AVX-512 BF16 (vdpbf16ps)");
  register_layer_stack(m);
  register_int8_gemm(m);
}
