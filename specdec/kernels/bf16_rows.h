// The parts both bf16 prompt-attention kernels share (attention_amx.cpp: AMX tiles; attention_bf16.cpp:
// AVX-512 BF16's vdpbf16ps): the bf16 layout of a KV head's keys and values, and the softmax row that turns
// float32 scores into bf16 numerators, and the steps around the products (packing, query rows, output rows).
// Both kernels read the same layout, so the layout lives once.
//
// Include it inside the including file's `#pragma GCC target` region, after every header it includes below (so no
// std or ATen inline is first compiled for that target): each file compiles its own copies for its own target;
// everything here has internal linkage.
#pragma once
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kBlock = 32;  // bf16 values per 64-byte row: dimensions (scores) or slots (values)

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// n floats (a multiple of 16) -> bf16, round to nearest even
inline void to_bf16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 32) {
    if (i + 32 <= n) {
      const __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
      _mm512_storeu_si512(out + i, (__m512i)pair);
    } else {
      const __m256bh half = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)half);
    }
  }
}

// Slots [0, L) of one KV head's keys and values (float [S, D]) as B tiles, into kp and vp zeroed up to Lp
// (a multiple of 32) by the caller. keys: tile (slot block of 16 s, dimension block of 32 k), row r, element 2n + j = K[16 s + n][32 k + 2r + j];
// values: tile (slot block of 32 s, dimension block of 16 c), row r, element 2n + j = V[32 s + 2r + j][16 c + n].
inline void pack_kv(const float* keys, const float* values, int64_t L, int64_t D, uint16_t* kp, uint16_t* vp) {
  std::vector<uint16_t> row(D);
  const int64_t kblocks = D / kBlock, cblocks = D / 16;
  uint32_t* kp32 = reinterpret_cast<uint32_t*>(kp);
  for (int64_t slot = 0; slot < L; ++slot) {
    to_bf16(keys + slot * D, D, row.data());
    const uint32_t* pairs = reinterpret_cast<const uint32_t*>(row.data());
    const int64_t s = slot / 16, n = slot % 16;
    for (int64_t p = 0; p < D / 2; ++p) kp32[((s * kblocks + p / 16) * 16 + p % 16) * 16 + n] = pairs[p];
    to_bf16(values + slot * D, D, row.data());
    const int64_t s2 = slot / kBlock, r = (slot % kBlock) / 2, j = slot % 2;
    for (int64_t d = 0; d < D; ++d) vp[((s2 * cblocks + d / 16) * 16 + r) * kBlock + 2 * (d % 16) + j] = row[d];
  }
}

// e^x for x <= 0 to bf16's precision, as 2^t with t = x·log2(e): 2^round(t) (vscalefps) times a degree-4
// polynomial of 2^f, |f| <= 1/2 (relative error ~4e-5; bf16 keeps 8 bits, 4e-3). Half the operations of
// exp16's float-exact form, which was a third of this kernel's time. t arrives scaled: the caller folds
// the softmax scale and log2(e) into one multiply-subtract.
inline __m512 exp2_for_bf16(__m512 t) {
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(9.618129e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550411e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// One (token, head) row's softmax numerators as bf16 in one pass over its scores: p[i] = e^(x[i]·scale −
// max·scale) for i < count (to bf16's precision), zero up to `width` (a multiple of 32: what the values pass reads); returns 1 / Σ
// (two 16-lane sums in slot order, then their fixed reduction). Float32 throughout, bf16 only when stored.
inline float softmax_row_bf16(const float* x, int64_t count, int64_t width, float scale, uint16_t* p) {
  __m512 top16 = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 live = count - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (count - i)) - 1);
    top16 = _mm512_max_ps(top16, _mm512_mask_loadu_ps(top16, live, x + i));
  }
  constexpr float kLog2e = 1.44269504088896341f;
  const __m512 factor = _mm512_set1_ps(scale * kLog2e), shift = _mm512_set1_ps(_mm512_reduce_max_ps(top16) * scale * kLog2e);
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  auto numerators = [&](int64_t i) {  // 16 slots from i: e^(x·scale − shift), zero past count
    const int64_t left = count - i;
    if (left <= 0) return _mm512_setzero_ps();
    const __mmask16 live = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    return _mm512_maskz_mov_ps(live, exp2_for_bf16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(live, x + i), factor, shift)));
  };
  for (int64_t i = 0; i < width; i += 32) {
    const __m512 e0 = numerators(i), e1 = numerators(i + 16);
    sum0 = _mm512_add_ps(sum0, e0);
    sum1 = _mm512_add_ps(sum1, e1);
    _mm512_storeu_si512(p + i, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
  }
  return 1.0f / _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
}

// Every KV head's slots [0, L) of the caches (float [kv_heads, S, D]) in pack_kv's layout, Lp = L rounded up to
// kBlock slots a head, zero past L (what a row block reads beyond its slots adds exact zeros)
inline void pack_heads(const float* kc, const float* vc, int64_t kv_heads, int64_t S, int64_t D, int64_t L,
                       std::vector<uint16_t>& kp, std::vector<uint16_t>& vp) {
  const int64_t Lp = round_up(L, kBlock);
  kp.assign(kv_heads * Lp * D, 0);
  vp.assign(kv_heads * Lp * D, 0);
  at::parallel_for(0, kv_heads, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h)
      pack_kv(kc + h * S * D, vc + h * S * D, L, D, kp.data() + h * Lp * D, vp.data() + h * Lp * D);
  });
}

// A unit's query rows as bf16, D apart: row r < rows from q + head_row(r), zero rows up to `padded`
template <typename HeadRow>
inline void query_rows(const float* q, HeadRow head_row, int64_t rows, int64_t padded, int64_t D, uint16_t* qb) {
  for (int64_t r = 0; r < rows; ++r) to_bf16(q + head_row(r), D, qb + r * D);
  std::fill(qb + rows * D, qb + padded * D, uint16_t{0});
}

// A unit's outputs: row r's Σ p·v (acc, D apart) times its 1 / Σ p, stored at out + head_row(r)
template <typename HeadRow>
inline void write_rows(const float* acc, const float* inv_total, int64_t rows, int64_t D, HeadRow head_row, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = out + head_row(r);
    const __m512 inv = _mm512_set1_ps(inv_total[r]);
    for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_loadu_ps(acc + r * D + d), inv));
  }
}

}  // namespace
