// A quantized decoder's whole layer loop in one call: the per-layer sequence of CppLayers.ragged
// (kernels/layers.py) — norm, q|k|v, attention per request, o, norm, gate|up, silu·up, down — run
// from C++ instead of from Python.
//
// Why: the kernels themselves take ~85 % of a decode step; the rest was the Python loop around them
// (~9 calls through pybind and a few ATen ops per layer: ~1.4 ms of an 11.6 ms 0.5B draft step on a
// Zen 4 EPYC, ~1.5 ms of a 1.5B step). The same kernel functions run on the same tensors in the same
// order (silu and the product are the same ATen ops the Python loop called), so every output bit is
// the one the Python loop gives; tests/test_layer_stack.py checks it with torch.equal.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <tuple>
#include <vector>

torch::Tensor q4_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor sc, torch::Tensor mn, torch::Tensor d,
                        torch::Tensor dmin, c10::optional<torch::Tensor> bias, c10::optional<torch::Tensor> amx_panels);
torch::Tensor q6_linear(torch::Tensor x, torch::Tensor ql, torch::Tensor qh, torch::Tensor sc, torch::Tensor d,
                        c10::optional<torch::Tensor> bias);
torch::Tensor q8_linear(torch::Tensor x, torch::Tensor w, torch::Tensor scales, c10::optional<torch::Tensor> bias);
torch::Tensor int8_gemm(torch::Tensor x, torch::Tensor packed, torch::Tensor scales, c10::optional<torch::Tensor> bias,
                        int64_t N);
torch::Tensor rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual, torch::Tensor w, double eps);
torch::Tensor attention(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                        torch::Tensor v_cache, int64_t start, int64_t heads, int64_t kv_heads,
                        c10::optional<torch::Tensor> mask);
torch::Tensor prompt_attention(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                               torch::Tensor v_cache, int64_t start, int64_t heads, int64_t kv_heads,
                               c10::optional<torch::Tensor> mask);

namespace {

// Rows of the longest segment whose attention shares a parallel region with others' (LayerStack::run)
constexpr int64_t kShortSegmentRows = 16;
// Rows per pass of a layer's MLP (LayerStack::mlp): the int8 GEMM's pass over the weights is 256 rows too
// (int8_gemm.cpp), so splitting the rows re-reads no weight.
constexpr int64_t kMlpRows = 256;

// One of the extension's linear layers: its format and tensors in the constructor order of its
// Python class (Q4Linear: qs sc mn d dmin [its AMX copy]; Q6Linear: ql qh sc6 d6; Q8Linear: w8 w8_scales), or the int8
// mode's VNNI layer ("i8": packed panels, scales; Int8Linear.spec).
struct Linear {
  std::string format;
  std::vector<torch::Tensor> t;
  c10::optional<torch::Tensor> bias;

  torch::Tensor operator()(const torch::Tensor& x) const {
    if (format == "q4")
      return q4_linear(x, t[0], t[1], t[2], t[3], t[4], bias, t.size() > 5 ? c10::optional<torch::Tensor>(t[5]) : c10::nullopt);
    if (format == "q6") return q6_linear(x, t[0], t[1], t[2], t[3], bias);
    if (format == "i8") return int8_gemm(x, t[0], t[1], bias, t[1].numel());
    return q8_linear(x, t[0], t[1], bias);
  }
};

// Several linears side by side (q|k|v or gate|up not fused into one): one call each, concatenated
// along the outputs, as the Python glue's torch.cat did.
struct Projection {
  std::vector<Linear> parts;

  torch::Tensor operator()(const torch::Tensor& x) const {
    if (parts.size() == 1) return parts[0](x);
    std::vector<torch::Tensor> outs;
    for (const auto& part : parts) outs.push_back(part(x));
    return at::cat(outs, -1);
  }
};

struct Layer {
  torch::Tensor input_norm, post_norm;
  Projection qkv;
  int64_t heads, kv_heads;
  Linear o;
  Projection gate_up;
  Linear down;
};

// (format, tensors, bias) as layers.py passes it
using LinearSpec = std::tuple<std::string, std::vector<torch::Tensor>, c10::optional<torch::Tensor>>;
// one request's rows [first, end) of x and its cache: (first, end, cos [T, D], sin [T, D],
// keys [layers, kv_heads, slots, D], values (same), first slot, mask [T, >= start + T] or None)
using Segment = std::tuple<int64_t, int64_t, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, int64_t,
                           c10::optional<torch::Tensor>>;

Linear make_linear(const LinearSpec& spec) {
  const auto& [format, tensors, bias] = spec;
  const size_t expected = format == "q4" ? 5 : format == "q6" ? 4 : format == "q8" || format == "i8" ? 2 : 0;
  TORCH_CHECK(expected > 0, "unknown linear format ", format);
  const bool amx_copy = format == "q4" && tensors.size() == expected + 1;  // Q4Linear's AMX copy, where it has one
  TORCH_CHECK(tensors.size() == expected || amx_copy, format, " takes ", expected, " tensors, got ", tensors.size());
  return Linear{format, tensors, bias};
}

Projection make_projection(const std::vector<LinearSpec>& specs) {
  TORCH_CHECK(!specs.empty(), "a projection needs at least one linear");
  Projection projection;
  for (const auto& spec : specs) projection.parts.push_back(make_linear(spec));
  return projection;
}

class LayerStack {
 public:
  // prompt_passes: the layers of a prompt twin, whose attention is prompt_attention (layer_ops.cpp)
  LayerStack(double eps, bool prompt_passes) : eps_(eps), attention_(prompt_passes ? prompt_attention : attention) {}

  void add_layer(torch::Tensor input_norm, std::vector<LinearSpec> qkv, int64_t heads, int64_t kv_heads, LinearSpec o,
                 torch::Tensor post_norm, std::vector<LinearSpec> gate_up, LinearSpec down) {
    layers_.push_back(Layer{input_norm, post_norm, make_projection(qkv), heads, kv_heads, make_linear(o),
                            make_projection(gate_up), make_linear(down)});
  }

  int64_t size() const { return static_cast<int64_t>(layers_.size()); }

  // x [ΣT, hidden] (updated in place: the residual stream) through the layers `run`, each request's
  // attention against its own cache; returns x.
  torch::Tensor run(torch::Tensor x, const std::vector<Segment>& segments, const std::vector<int64_t>& run) const {
    c10::optional<torch::Tensor> pending;  // the last sub-layer's output, added by the next norm
    // Several short segments (decode steps, drafts of several requests): their attention calls share one
    // parallel region, the threads taking whole requests, instead of one region per request splitting its
    // KV heads (a 1-token request's attention is a few µs; 8 regions per layer cost more than the work).
    // A long segment (a prompt) keeps its own region. Which thread runs a request changes no bit of it.
    bool spread_segments = segments.size() > 1;
    for (const auto& segment : segments)
      spread_segments = spread_segments && std::get<1>(segment) - std::get<0>(segment) <= kShortSegmentRows;
    for (const int64_t index : run) {
      TORCH_CHECK(index >= 0 && index < size(), "layer ", index, " out of range");
      const Layer& layer = layers_[index];
      const torch::Tensor qkv = layer.qkv(rms_norm(x, pending, layer.input_norm, eps_));
      std::vector<torch::Tensor> outs(segments.size());
      auto attend = [&](int64_t i) {
        const auto& [first, end, cos, sin, keys, values, start, mask] = segments[i];
        outs[i] = attention_(qkv.narrow(0, first, end - first), cos, sin, keys.select(0, index), values.select(0, index),
                            start, layer.heads, layer.kv_heads, mask);
      };
      if (spread_segments) {  // one parallel region for all requests (attention's own runs inline in it)
        at::parallel_for(0, static_cast<int64_t>(segments.size()), 1, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) attend(i);
        });
      } else {
        for (int64_t i = 0; i < static_cast<int64_t>(segments.size()); ++i) attend(i);
      }
      const torch::Tensor out = outs.size() == 1 ? outs[0] : at::cat(outs);
      pending = mlp(layer, rms_norm(x, layer.o(out), layer.post_norm, eps_));
    }
    return pending.has_value() ? x.add_(*pending) : x;
  }

  // down(silu(gate) · up) over h's rows, kMlpRows at a time. Why: a prompt pass's gate|up output is
  // rows x 2·intermediate floats — 174 MB a layer at 2 430 rows of the 1.5B, plus silu's 87 MB — and
  // blocks that large come from the OS fresh on every allocation (glibc maps anything over 32 MB):
  // 1.8 million page faults, ~4 s of kernel time on a 2-core Xeon, a third of that prompt's pass. At
  // 256 rows they are 18 MB, reused from the heap. Each row's bits are the same (every kernel is row by row).
  static torch::Tensor mlp(const Layer& layer, const torch::Tensor& h) {
    auto rows = [&](int64_t first, int64_t count) {
      const torch::Tensor gate_up = layer.gate_up(h.narrow(0, first, count));
      const int64_t inter = gate_up.size(-1) / 2;
      return layer.down(at::silu(gate_up.narrow(-1, 0, inter)).mul_(gate_up.narrow(-1, inter, inter)));
    };
    const int64_t M = h.size(0);
    if (M <= kMlpRows) return rows(0, M);
    std::vector<torch::Tensor> parts;
    for (int64_t first = 0; first < M; first += kMlpRows) parts.push_back(rows(first, std::min(kMlpRows, M - first)));
    return at::cat(parts);
  }

 private:
  double eps_;
  decltype(&attention) attention_;
  std::vector<Layer> layers_;
};

}  // namespace

void register_layer_stack(pybind11::module& m) {
  pybind11::class_<LayerStack>(m, "LayerStack", "a quantized decoder's layer loop in C++ (layer_stack.cpp)")
      .def(pybind11::init<double, bool>(), pybind11::arg("eps"), pybind11::arg("prompt_passes") = false)
      .def("add_layer", &LayerStack::add_layer)
      .def("__len__", &LayerStack::size)
      .def("run", &LayerStack::run, pybind11::call_guard<pybind11::gil_scoped_release>());
}
