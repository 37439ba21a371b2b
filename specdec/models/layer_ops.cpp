// The non-linear work of a decoder layer (RMSNorm, RoPE, KV-cache write, attention) for the int4
// CPU path, compiled into the same extension as q4_kernel.cpp.
//
// Why: at one token per step the linear layers of the 0.5B draft take ~27 ms and everything else
// ~12 ms — not arithmetic but ~40 small ATen ops per layer, each paying Python and dispatcher
// overhead. Here a layer's glue is three calls. Each function treats every token row with the same
// instruction sequence whatever the number of rows (fixed summation orders, no reduction across
// rows), so a token's result is bit-identical alone or inside a verification chunk.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <vector>

namespace {

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// sum of a[i] * b[i], n a multiple of 8, one fixed order
inline float dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  return hsum8(acc);
}

// dot() of q with the keys at 4 slots, interleaved: each result is computed exactly as dot() does
inline void dot4(const float* q, const float* keys, const int64_t* slot, int64_t n, float* out) {
  const float* k0 = keys + slot[0] * n;
  const float* k1 = keys + slot[1] * n;
  const float* k2 = keys + slot[2] * n;
  const float* k3 = keys + slot[3] * n;
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + i), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + i), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + i), a3);
  }
  out[0] = hsum8(a0);
  out[1] = hsum8(a1);
  out[2] = hsum8(a2);
  out[3] = hsum8(a3);
}

// HF's half-rotation RoPE: out = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]
inline void rope(const float* x, const float* cos, const float* sin, int64_t dim, float* out) {
  const int64_t half = dim / 2;
  for (int64_t d = 0; d < dim; ++d) {
    const float rotated = d < half ? -x[d + half] : x[d - half];
    const float a = x[d] * cos[d];
    const float b = rotated * sin[d];
    out[d] = a + b;
  }
}

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.scalar_type() == torch::kFloat32 && t.is_contiguous(), name,
              ": contiguous [rows, n] float32");
}

}  // namespace

// x += residual (when given, in place: the residual stream), then y = w * (x * rsqrt(mean(x²) + eps)).
// Folding the residual add in saves a call per sub-layer.
torch::Tensor rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual, torch::Tensor w, double eps) {
  check_rows(x, "x");
  const int64_t M = x.size(0), N = x.size(1);
  TORCH_CHECK(N % 8 == 0 && w.numel() == N && w.is_contiguous() && w.scalar_type() == torch::kFloat32, "weight of ", N);
  float* xp = x.data_ptr<float>();
  if (residual.has_value()) {
    check_rows(*residual, "residual");
    TORCH_CHECK(residual->size(0) == M && residual->size(1) == N, "residual shape differs from x");
    const float* rp = residual->data_ptr<float>();
    for (int64_t i = 0; i < M * N; ++i) xp[i] = xp[i] + rp[i];
  }
  auto y = torch::empty_like(x);
  float* yp = y.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* row = xp + m * N;
    const float inv = 1.0f / std::sqrt(dot(row, row, N) / static_cast<float>(N) + static_cast<float>(eps));
    for (int64_t n = 0; n < N; ++n) yp[m * N + n] = wp[n] * (row[n] * inv);
  }
  return y;
}

// One attention sub-layer after the q|k|v projection, for T new tokens at cache slots start..start+T:
// RoPE on q and k, k and v written into this layer's cache ([kv_heads, max_seq, head_dim] each), then
// for each (token, head) softmax(q·kᵀ/√d)·v over the slots it sees: 0..start+t (causal) or, with
// `mask` [T, ≥start+T] (tree verification), the slots marked true below start+T. Grouped-query
// heads read their KV head in place. Returns [T, heads·head_dim].
torch::Tensor attention(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                        torch::Tensor v_cache, int64_t start, int64_t heads, int64_t kv_heads,
                        c10::optional<torch::Tensor> mask) {
  check_rows(qkv, "qkv");
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  const int64_t T = qkv.size(0), D = cos.size(1), S = k_cache.size(1), group = heads / kv_heads;
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * D && D % 8 == 0, "qkv is not [T, (heads + 2 kv_heads) * head_dim]");
  TORCH_CHECK(cos.size(0) == T && sin.size(0) == T && sin.size(1) == D, "cos/sin must be [T, head_dim]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.scalar_type() == torch::kFloat32 &&
              v_cache.sizes() == k_cache.sizes() && k_cache.size(0) == kv_heads && k_cache.size(2) == D,
              "caches: contiguous float32 [kv_heads, max_seq, head_dim]");
  TORCH_CHECK(start >= 0 && start + T <= S, "cache has ", S, " slots; need ", start + T);
  const bool* mp = nullptr;
  int64_t mask_stride = 0;
  if (mask.has_value()) {
    TORCH_CHECK(mask->scalar_type() == torch::kBool && mask->dim() == 2 && mask->size(0) == T &&
                mask->size(1) >= start + T && mask->stride(1) == 1, "mask: [T, >= start+T] bool");
    mp = mask->data_ptr<bool>();
    mask_stride = mask->stride(0);
  }
  const float* in = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  const int64_t width = qkv.size(1);
  std::vector<float> q(T * heads * D);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = in + t * width;
    for (int64_t h = 0; h < heads; ++h) rope(row + h * D, cp + t * D, sp + t * D, D, q.data() + (t * heads + h) * D);
    for (int64_t h = 0; h < kv_heads; ++h) {
      rope(row + (heads + h) * D, cp + t * D, sp + t * D, D, kc + (h * S + start + t) * D);
      std::copy_n(row + (heads + kv_heads + h) * D, D, vc + (h * S + start + t) * D);
    }
  }
  auto out = torch::empty({T, heads * D}, qkv.options());
  float* op = out.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, T * heads, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> prob(start + T);
    std::vector<int64_t> slot(start + T);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t t = u / heads, h = u % heads, kvh = h / group;
      const float* qh = q.data() + u * D;
      const float* keys = kc + kvh * S * D;
      const float* values = vc + kvh * S * D;
      int64_t count = 0;
      if (mp == nullptr) {
        for (int64_t j = 0; j <= start + t; ++j) slot[count++] = j;
      } else {
        for (int64_t j = 0; j < start + T; ++j) if (mp[t * mask_stride + j]) slot[count++] = j;
      }
      TORCH_CHECK(count > 0, "token ", t, " sees no cache slot: check the mask");
      float top = -INFINITY;
      int64_t i = 0;
      for (; i + 4 <= count; i += 4) dot4(qh, keys, slot.data() + i, D, prob.data() + i);  // 4 chains in flight
      for (; i < count; ++i) prob[i] = dot(qh, keys + slot[i] * D, D);
      for (i = 0; i < count; ++i) {
        prob[i] = prob[i] * scale;
        top = std::max(top, prob[i]);
      }
      float total = 0.0f;
      for (int64_t i = 0; i < count; ++i) {
        prob[i] = std::exp(prob[i] - top);
        total += prob[i];
      }
      const __m256 inv = _mm256_set1_ps(1.0f / total);
      float* dst = op + t * heads * D + h * D;
      // Σ p_i v_i in slot order for every output lane; up to 64 lanes per pass so the 8 FMA chains
      // run side by side (the order per lane is the same for any pass width)
      for (int64_t d0 = 0; d0 < D; d0 += 64) {
        const int64_t lanes = std::min<int64_t>(8, (D - d0) / 8);
        __m256 acc[8];
        for (int64_t c = 0; c < lanes; ++c) acc[c] = _mm256_setzero_ps();
        for (int64_t j = 0; j < count; ++j) {
          const __m256 p = _mm256_set1_ps(prob[j]);
          const float* v = values + slot[j] * D + d0;
          for (int64_t c = 0; c < lanes; ++c) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * c), acc[c]);
        }
        for (int64_t c = 0; c < lanes; ++c) _mm256_storeu_ps(dst + d0 + 8 * c, _mm256_mul_ps(acc[c], inv));
      }
    }
  });
  return out;
}
