// The int8 mode's linear layer on AVX-512 VNNI CPUs: torch-facing wrapper of int8_gemm_avx512.cpp (the
// format, the kernel and why it exists are described there). Elsewhere the int8 mode runs fbgemm
// (kernels/int8.py chooses per layer, once, when it packs the weights).
#include <torch/extension.h>
#include <algorithm>
#include <atomic>
#include <vector>
#include "dot_kernels.h"
#include "tile_schedule.h"

namespace {

// Activation rows per pass over the weights: a long prompt's quantized rows (x 8960 inputs for the
// 1.5B target's down projection) stay in cache while each panel of weights passes over them.
constexpr int64_t kRowsPerPass = 256;
constexpr int64_t kPanelOutputs = 64;

// Passes of at least this many rows run the AMX kernel where the CPU has it (same bits: int8_gemm_amx.cpp);
// 0: never. One row stays on VNNI: a decode step streams the weights, and there AMX's tile loads were
// 7 % slower (1.5B target, 2-core Xeon with AMX: 67.9 vs 63.3 ms), while from 2 rows AMX was as fast
// and from 4 on 1.17-1.8x faster (benchmarks/int8_gemm_ab.py). Settable for tests and measurements.
std::atomic<int64_t> g_amx_min_rows{2};

}  // namespace

int64_t int8_amx_min_rows() { return specdec_kernels::amx_int8_ready() ? g_amx_min_rows.load() : 0; }

void set_int8_amx_min_rows(int64_t rows) {
  TORCH_CHECK(rows >= 0, "rows must be >= 0 (0: never AMX)");
  g_amx_min_rows = rows;
}

// x [M, K] float32 -> [M, N] float32 (+ bias): packed [ceil(N / 64), K / 4, 64, 4] uint8 (w + 128),
// weight scales [N] float32.
torch::Tensor int8_gemm(torch::Tensor x, torch::Tensor packed, torch::Tensor scales, c10::optional<torch::Tensor> bias,
                        int64_t N) {
  TORCH_CHECK(specdec_kernels::cpu_has_avx512_vnni(), "int8_gemm needs AVX-512 VNNI");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous [M, K] float32");
  const int64_t M = x.size(0), K = x.size(1), panels = (N + kPanelOutputs - 1) / kPanelOutputs;
  TORCH_CHECK(K % 16 == 0, "input size ", K, " is not a multiple of 16");
  TORCH_CHECK(packed.scalar_type() == torch::kUInt8 && packed.is_contiguous() && packed.dim() == 4 &&
                  packed.size(0) == panels && packed.size(1) * 4 == K && packed.size(2) == kPanelOutputs &&
                  packed.size(3) == 4,
              "packed weights: [", panels, ", ", K / 4, ", 64, 4] uint8 for ", N, " outputs of ", K, " inputs");
  TORCH_CHECK(scales.scalar_type() == torch::kFloat32 && scales.is_contiguous() && scales.numel() == N,
              "weight scales: [", N, "] float32");
  const float* bp = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() && bias->numel() == N,
                "bias: [", N, "] float32");
    bp = bias->data_ptr<float>();
  }
  std::vector<int8_t> xq(M * K);
  std::vector<float> xs(M);
  std::vector<int32_t> totals(M);
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    specdec_kernels::int8_quantize_rows_avx512(xp + m0 * K, m1 - m0, K, xq.data() + m0 * K, xs.data() + m0,
                                               totals.data() + m0);
  });
  auto out = torch::empty({M, N}, x.options());
  float* op = out.data_ptr<float>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const int64_t amx_from = int8_amx_min_rows();
  for (int64_t m0 = 0; m0 < M; m0 += kRowsPerPass) {
    const int64_t rows = std::min(kRowsPerPass, M - m0);
    const auto panel_kernel = amx_from && rows >= amx_from ? specdec_kernels::int8_gemm_panel_amx
                                                           : specdec_kernels::int8_gemm_panel_avx512;
    specdec_kernels::run_tiles(panels, [&](int64_t p) {
      const int64_t n0 = p * kPanelOutputs;
      panel_kernel(xq.data() + m0 * K, xs.data() + m0, totals.data() + m0, rows, K, wp + p * K * kPanelOutputs,
                   sp + n0, bp ? bp + n0 : nullptr, std::min(kPanelOutputs, N - n0), op + m0 * N + n0, N);
    });
  }
  return out;
}

void register_int8_gemm(pybind11::module& m) {
  m.def("int8_gemm_supported", &specdec_kernels::cpu_has_avx512_vnni, "whether this CPU runs int8_gemm (AVX-512 VNNI)");
  m.def("int8_amx_min_rows", &int8_amx_min_rows, "int8_gemm runs AMX from this many rows on (0: never, or no AMX here)");
  m.def("set_int8_amx_min_rows", &set_int8_amx_min_rows, "int8_gemm's AMX threshold in rows (0: never; same bits)");
  m.def("int8_gemm", &int8_gemm, "int8 x int8 linear on AVX-512 VNNI, packed weights (see int8_gemm_avx512.cpp)");
}
