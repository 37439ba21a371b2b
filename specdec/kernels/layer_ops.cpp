// The non-linear work of a decoder layer (RMSNorm, RoPE, KV-cache write, attention) for the int4
// CPU path, compiled into the same extension as linear_kernels.cpp.
//
// Why: at one token per step the linear layers of the 0.5B draft take ~27 ms and everything else
// ~12 ms — not arithmetic but ~40 small ATen ops per layer, each paying Python and dispatcher
// overhead. Here a layer's glue is three calls. Each function treats every token row with the same
// instruction sequence whatever the number of rows (fixed summation orders, no reduction across
// rows), so a token's result is bit-identical alone or inside a verification chunk.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <iterator>
#include <memory>
#include <numeric>
#include <type_traits>
#include <vector>
#include "dot_kernels.h"
#include "simd.h"

namespace {

// sum of a[i] * b[i], n a multiple of 8, one fixed order
inline float dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  return hsum(acc);
}

// out[j] = hsum(a[j]) for four registers at once, by hsum's additions in hsum's tree (lane i + lane
// i+4, then + lane i+2, then + lane i+1; a + b is b + a exactly): 13 instructions for 4 sums instead of
// ~7 each, which was ~a fifth of a 64-wide head's score pass.
inline void hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3, float* out) {
  // [a0 low + high | a1 low + high], [a2 … | a3 …]
  const __m256 s01 = _mm256_add_ps(_mm256_permute2f128_ps(a0, a1, 0x20), _mm256_permute2f128_ps(a0, a1, 0x31));
  const __m256 s23 = _mm256_add_ps(_mm256_permute2f128_ps(a2, a3, 0x20), _mm256_permute2f128_ps(a2, a3, 0x31));
  // lanes [x.0 + x.2, x.1 + x.3, y.0 + y.2, y.1 + y.3]: [a0 | a2], [a1 | a3]
  const __m256 v = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(s01), _mm256_castps_pd(s23))),
                                 _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(s01), _mm256_castps_pd(s23))));
  const __m256 r = _mm256_add_ps(v, _mm256_movehdup_ps(v));  // the sums at elements 0 (a0), 2 (a2), 4 (a1), 6 (a3)
  // [r0 r2 r4 r6] then [r0 r4 r2 r6], by immediates: an index vector would hold a register the three-head
  // score loop needs (it spilled a query chunk to the stack)
  const __m128 even = _mm_shuffle_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1), _MM_SHUFFLE(2, 0, 2, 0));
  _mm_storeu_ps(out, _mm_shuffle_ps(even, even, _MM_SHUFFLE(3, 1, 2, 0)));
}

// dot() of H query heads (rows of q, n apart) with the keys at 4 slots: 4·H chains, each key chunk loaded
// once for all H heads, the heads' chunks held in registers (H = 3: 12 accumulators + 3 + 1 = the 16 AVX2
// registers). Why three: two heads × 4 keys loaded 10 vectors per 8 FMAs and kept only 8 chains in flight
// (2 FMA ports × 4 cycles of latency: no slack); three load 7 per 12. A 256-row prompt chunk's attention ran
// at ~14 GMAC/s a core with pairs on a CPU whose 256-bit FMAs peak at ~52. Every result is computed exactly as
// dot() does (its own accumulator, the same 8-lane order, the same hsum).
template <int H>
inline void dots_4keys(const float* q, const float* keys, const int64_t* slot, int64_t n, float* out, int64_t L) {
  const float* k[4] = {keys + slot[0] * n, keys + slot[1] * n, keys + slot[2] * n, keys + slot[3] * n};
  __m256 acc[H][4];
  for (int h = 0; h < H; ++h)
    for (int j = 0; j < 4; ++j) acc[h][j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    __m256 x[H];
    for (int h = 0; h < H; ++h) x[h] = _mm256_loadu_ps(q + h * n + i);
    for (int j = 0; j < 4; ++j) {
      const __m256 kv = _mm256_loadu_ps(k[j] + i);
      for (int h = 0; h < H; ++h) acc[h][j] = _mm256_fmadd_ps(x[h], kv, acc[h][j]);
    }
  }
  for (int h = 0; h < H; ++h) hsum4(acc[h][0], acc[h][1], acc[h][2], acc[h][3], out + h * L);
}

// H heads (q [H, D]) against slots [i0, i1): p[h·L + i]
template <int H>
void score_heads(const float* q, const float* keys, const int64_t* slot, int64_t i0, int64_t i1, int64_t D, float* p,
                 int64_t L) {
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4) dots_4keys<H>(q, keys, slot + i, D, p + i, L);
  for (; i < i1; ++i)
    for (int h = 0; h < H; ++h) p[h * L + i] = dot(q + h * D, keys + slot[i] * D, D);
}

// a[h·D + 0 .. 8N) += Σ_{i0 <= i < i1} p[h·L + i] · v[slot[i]][0 .. 8N) for H heads, one slot after another:
// H·N chains side by side, each value vector loaded once for all H heads (H = 3, N = 4: 12 accumulators, the
// 3 weights, 1 value: 16 registers); per lane the same slot order for any H and N.
template <int H, int N>
inline void accumulate_heads(const float* p, int64_t L, const int64_t* slot, int64_t i0, int64_t i1, const float* v,
                             int64_t D, float* a) {
  __m256 sum[H][N];
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < N; ++c) sum[h][c] = _mm256_loadu_ps(a + h * D + 8 * c);
  for (int64_t i = i0; i < i1; ++i) {
    __m256 w[H];
    for (int h = 0; h < H; ++h) w[h] = _mm256_broadcast_ss(p + h * L + i);
    const float* row = v + slot[i] * D;
    for (int c = 0; c < N; ++c) {
      const __m256 x = _mm256_loadu_ps(row + 8 * c);
      for (int h = 0; h < H; ++h) sum[h][c] = _mm256_fmadd_ps(w[h], x, sum[h][c]);
    }
  }
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < N; ++c) _mm256_storeu_ps(a + h * D + 8 * c, sum[h][c]);
}

// H heads' values over every output dimension: 32 at a time (64 for a head alone), then 8
template <int H>
void value_heads(const float* p, int64_t L, const int64_t* slot, int64_t i0, int64_t i1, const float* v, int64_t D,
                 float* acc) {
  constexpr int kChunks = H == 1 ? 8 : 4;
  int64_t d0 = 0;
  for (; d0 + 8 * kChunks <= D; d0 += 8 * kChunks)
    accumulate_heads<H, kChunks>(p, L, slot, i0, i1, v + d0, D, acc + d0);
  for (; d0 < D; d0 += 8) accumulate_heads<H, 1>(p, L, slot, i0, i1, v + d0, D, acc + d0);
}

// The heads in groups of three, then a last group of two or one: fn(H, h) with H a std::integral_constant
template <typename Fn>
inline void for_head_triples(int64_t heads, Fn fn) {
  int64_t h = 0;
  for (; h + 3 <= heads; h += 3) fn(std::integral_constant<int, 3>{}, h);
  if (heads - h == 2) fn(std::integral_constant<int, 2>{}, h);
  if (heads - h == 1) fn(std::integral_constant<int, 1>{}, h);
}

// The AVX2 attention kernels (dot_kernels.h: AttentionKernels): heads in threes, then a pair or one alone.
void scores_avx2(const float* q, int64_t heads, const float* keys, const int64_t* slot, int64_t i0, int64_t i1,
                 int64_t D, float* p, int64_t L) {
  for_head_triples(heads, [&](auto group, int64_t h) {
    score_heads<decltype(group)::value>(q + h * D, keys, slot, i0, i1, D, p + h * L, L);
  });
}

void values_avx2(const float* p, int64_t heads, int64_t L, const int64_t* slot, int64_t i0, int64_t i1,
                 const float* v, int64_t D, float* acc) {
  for_head_triples(heads, [&](auto group, int64_t h) {
    value_heads<decltype(group)::value>(p + h * L, L, slot, i0, i1, v, D, acc + h * D);
  });
}

// The softmax normaliser of one (token, head) row of n scores: p[i] = e^(p[i]·scale − max) in place,
// returns 1 / Σ p[i] (the sum in exp_shifted_sum_from's fixed order; simd.h)
float normalize_avx2(float* p, int64_t n, float scale) {
  return 1.0f / exp_shifted_sum_from(p, 0, n, scale_max_from(p, 0, n, scale, -INFINITY), _mm256_setzero_ps());
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

const specdec_kernels::AttentionKernels specdec_kernels::kAttentionAvx2 = {scores_avx2, values_avx2, normalize_avx2};

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

// How prompt_attention multiplies (kPromptAttentionKinds): on AMX-BF16 tiles where this CPU has them, unless
// set_prompt_attention_kind chose another (tests run each); avx512-bf16 (vdpbf16ps) where
// kernels/prompt_attention.py measured it faster than float32 on this CPU (AMD's AVX-512 cores; not Intel's)
constexpr int kFloat32 = 0, kAmxBf16 = 1, kAvx512Bf16 = 2;
constexpr const char* kPromptAttentionKinds[] = {"float32", "amx-bf16", "avx512-bf16"};
static std::atomic<int> g_prompt_attention{specdec_kernels::amx_bf16_ready() ? kAmxBf16 : kFloat32};

// One attention sub-layer after the q|k|v projection, for T new tokens at cache slots start..start+T:
// RoPE on q and k, k and v written into this layer's cache ([kv_heads, max_seq, head_dim] each), then
// for each (token, head) softmax(q·kᵀ/√d)·v over the slots it sees: 0..start+t (causal) or, with
// `mask` [T, ≥start+T] (tree verification), the slots marked true below start+T. Grouped-query
// heads read their KV head in place. Returns [T, heads·head_dim].
// `prompt`: a prompt twin's pass (prompt_attention below) — on AMX or AVX-512 BF16 the products in bf16.
static torch::Tensor attend(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                            torch::Tensor v_cache, int64_t start, int64_t heads, int64_t kv_heads,
                            c10::optional<torch::Tensor> mask, bool prompt) {
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
  // every element is written by rope below before any read: left uninitialised (a vector zeroed T·heads·D floats
  // and page-faulted them in, ~1 % of a 2.4k-token prompt pass)
  const std::unique_ptr<float[]> q(new float[T * heads * D]);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = in + t * width;
    for (int64_t h = 0; h < heads; ++h) rope(row + h * D, cp + t * D, sp + t * D, D, q.get() + (t * heads + h) * D);
    for (int64_t h = 0; h < kv_heads; ++h) {
      rope(row + (heads + h) * D, cp + t * D, sp + t * D, D, kc + (h * S + start + t) * D);
      std::copy_n(row + (heads + kv_heads + h) * D, D, vc + (h * S + start + t) * D);
    }
  }
  auto out = torch::empty({T, heads * D}, qkv.options());
  float* op = out.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int kind = g_prompt_attention.load();
  if (prompt && mp == nullptr && D % 32 == 0 && kind != kFloat32) {
    (kind == kAmxBf16 ? specdec_kernels::prompt_attention_amx : specdec_kernels::prompt_attention_bf16)(
        q.get(), T, heads, kv_heads, kc, vc, S, D, start, scale, op);
    return out;
  }
  // One unit = one KV head with its `group` query heads for a tile of up to kTile tokens: each block of
  // kBlock keys (then values) is loaded once into L1 and used by every query of the group and every
  // token of the tile that sees it. Tiles bound the probabilities held at once to kTile rows
  // (kTile · group · L floats, about L2's size at L = 3k): a prompt pass of T tokens held all T·group·L
  // at once — 226 MB a KV head for a 3 072-token prompt, streamed through memory five times — and ran
  // at ~30 GMAC/s, most of a long prompt's time to first token. Each (token, head) still runs its own
  // fixed sequence (dots, softmax in slot order, Σ p·v in slot order), so the bits do not depend on T,
  // on the tiling or on which other tokens share the pass.
  constexpr int64_t kBlock = 64;
  constexpr int64_t kTile = 32;
  const int64_t L = start + T;  // slots any token of this chunk can see
  const specdec_kernels::AttentionKernels& kernels = specdec_kernels::attention_kernels();
  // each token's visible slots, ascending: causal tokens read a prefix of one shared 0, 1, 2, … list
  // (start + t + 1 of it); masked tokens their own list
  std::vector<int64_t> ascending(mp == nullptr ? L : 0);
  std::iota(ascending.begin(), ascending.end(), int64_t{0});
  std::vector<std::vector<int64_t>> masked(mp == nullptr ? 0 : T);
  std::vector<const int64_t*> slot_of(T);
  std::vector<int64_t> count_of(T);
  for (int64_t t = 0; t < T; ++t) {
    if (mp == nullptr) {
      slot_of[t] = ascending.data();
      count_of[t] = start + t + 1;
    } else {
      masked[t].reserve(L);
      for (int64_t j = 0; j < L; ++j)
        if (mp[t * mask_stride + j]) masked[t].push_back(j);
      slot_of[t] = masked[t].data();
      count_of[t] = static_cast<int64_t>(masked[t].size());
    }
    TORCH_CHECK(count_of[t] > 0, "token ", t, " sees no cache slot: check the mask");
  }
  const int64_t tiles = (T + kTile - 1) / kTile;
  // KV head major: with as many threads as KV heads (2 and 2 for the Qwen models) each thread takes
  // one head's tiles, as evenly loaded as the heads are
  at::parallel_for(0, kv_heads * tiles, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> prob;
    std::vector<float> acc(kTile * group * D);
    std::vector<float> inv_total(kTile * group);
    std::vector<int64_t> cursor(kTile);
    for (int64_t unit = u0; unit < u1; ++unit) {
      const int64_t kvh = unit / tiles, t0 = (unit % tiles) * kTile, t1 = std::min(T, t0 + kTile), n = t1 - t0;
      const int64_t Lt = mp == nullptr ? start + t1 : L;  // the longest slot list in the tile: prob's row stride
      if (static_cast<int64_t>(prob.size()) < n * group * Lt) prob.resize(n * group * Lt);
      const float* keys = kc + kvh * S * D;
      const float* values = vc + kvh * S * D;
      // fn(t, slot list of t, i0, i1) for every block of kBlock slots and every token of the tile, block
      // by block: [i0, i1) is the part of token t's (ascending) slot list that falls in the block
      auto for_each_block = [&](auto&& fn) {
        std::fill(cursor.begin(), cursor.end(), int64_t{0});
        for (int64_t b0 = 0; b0 < Lt; b0 += kBlock)
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t* slot = slot_of[t];
            const int64_t i0 = cursor[t - t0];
            const int64_t i1 = std::lower_bound(slot + i0, slot + count_of[t], b0 + kBlock) - slot;
            cursor[t - t0] = i1;
            if (i1 > i0) fn(t, slot, i0, i1);
          }
      };
      for_each_block([&](int64_t t, const int64_t* slot, int64_t i0, int64_t i1) {
        kernels.scores(q.get() + (t * heads + kvh * group) * D, group, keys, slot, i0, i1, D,
                       prob.data() + (t - t0) * group * Lt, Lt);
      });
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t g = 0; g < group; ++g) {
          float* p = prob.data() + ((t - t0) * group + g) * Lt;
          inv_total[(t - t0) * group + g] = kernels.normalize(p, count_of[t], scale);
        }
      // Σ p_i v_i in slot order for every output lane (kept in memory between blocks: exact)
      std::fill(acc.begin(), acc.begin() + n * group * D, 0.0f);
      for_each_block([&](int64_t t, const int64_t* slot, int64_t i0, int64_t i1) {
        kernels.values(prob.data() + (t - t0) * group * Lt, group, Lt, slot, i0, i1, values, D,
                       acc.data() + (t - t0) * group * D);
      });
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t g = 0; g < group; ++g) {
          float* dst = op + (t * heads + kvh * group + g) * D;
          const float* a = acc.data() + ((t - t0) * group + g) * D;
          const __m256 inv = _mm256_set1_ps(inv_total[(t - t0) * group + g]);
          for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_loadu_ps(a + d), inv));
        }
    }
  });
  return out;
}

torch::Tensor attention(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                        torch::Tensor v_cache, int64_t start, int64_t heads, int64_t kv_heads,
                        c10::optional<torch::Tensor> mask) {
  return attend(qkv, cos, sin, k_cache, v_cache, start, heads, kv_heads, mask, false);
}

// attention() for a prompt twin's passes (kernels/layers.py: CppLayers(prompt_passes=True)): where the CPU has
// AMX-BF16 the causal rows' products run on bf16 tiles (attention_amx.cpp), on AVX-512 BF16 where that was
// measured faster (attention_bf16.cpp) — other bits than attention()'s, the same bits for a row however the
// prompt is split into passes; for float32, heads not a multiple of 32 wide or under a mask, attention().
torch::Tensor prompt_attention(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                               torch::Tensor v_cache, int64_t start, int64_t heads, int64_t kv_heads,
                               c10::optional<torch::Tensor> mask) {
  return attend(qkv, cos, sin, k_cache, v_cache, start, heads, kv_heads, mask, true);
}

std::string prompt_attention_kind() { return kPromptAttentionKinds[g_prompt_attention.load()]; }

// Use `name` for later prompt passes (process-wide; tests and measurements): refused where this CPU lacks it.
void set_prompt_attention_kind(const std::string& name) {
  for (int kind = 0; kind < static_cast<int>(std::size(kPromptAttentionKinds)); ++kind) {
    if (name != kPromptAttentionKinds[kind]) continue;
    TORCH_CHECK(kind != kAmxBf16 || specdec_kernels::amx_bf16_ready(), "this CPU (or process) has no AMX-BF16 tiles");
    TORCH_CHECK(kind != kAvx512Bf16 || specdec_kernels::avx512_bf16_ready(), "this CPU has no AVX-512 BF16");
    g_prompt_attention.store(kind);
    return;
  }
  TORCH_CHECK(false, "unknown prompt attention ", name, " (amx-bf16, avx512-bf16 or float32)");
}
