// Prompt passes' attention with AVX-512 BF16 dot products (vdpbf16ps) on CPUs without AMX tiles: q·kᵀ and
// p·v as bf16 pair products summed in float32, the softmax between them in float32 (bf16_rows.h, shared with
// the AMX kernel, as is the bf16 layout of the keys and values).
//
// Why: a prompt pass's attention is arithmetic (~53 GMAC/s a core of float32 FMAs; one 1.5B layer over
// 2 432 tokens 72-118 ms on a 2-core Zen 5, about a fifth of a 2.4k-token prompt's pass). On AMD's cores one
// vdpbf16ps does 32 products at the rate of one 16-lane FMA, so the products take half the instructions.
// On Intel's AVX-512 cores it issues on one port against the FMA's two (session 56 measured it level with
// float32 on a Xeon): kernels/prompt_attention.py times both once per machine and keeps the faster.
//
// Where it runs: only the passes of a prompt twin (TorchBackend.use_for_prompts), whose rows already differ
// from decoding's (another weight format): plain and speculative decoding read the same prompt cache, and no
// verification or decode row ever runs here. What it keeps: each (token, head) row's bits do not depend on
// the other rows of the pass, on the tile it falls in or on how the prompt was split into passes — a score
// is its own sum over dimension pairs in order, and a row's Σ p·v runs over 32-slot blocks from slot 0 in
// order (a block past the row's own slots adds exact zeros).
#include "dot_kernels.h"

#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>  // before the target pragma, as every standard header: no std inline compiled for AVX-512
#include <cstdint>
#include <cstring>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#include "bf16_rows.h"  // the bf16 layout, softmax row and steps around the products: this file's copies, for this target

namespace {

constexpr int64_t kTileTokens = 8;  // tokens per unit of work: 8 · group rows (16, the AMX kernel's, timed the same)
constexpr int kScoreRows = 12;       // query rows per score block: 12 rows x 32 slots = 24 accumulators
constexpr int64_t kRowPad = 12;      // a tile's rows padded to this (zero queries): every block size divides it
constexpr int64_t kValueBlocks = 8;  // 32-slot blocks of values per pass over the rows: 128 slots, 32 KB at D = 128

// two bf16 (one dimension or slot pair) broadcast to all 16 lanes
inline __m512bh pair_at(const uint16_t* x) {
  int32_t bits;
  std::memcpy(&bits, x, sizeof bits);
  return (__m512bh)_mm512_set1_epi32(bits);
}

inline __m512bh load_bh(const uint16_t* x) { return (__m512bh)_mm512_loadu_si512(x); }

// scores[r][s0 .. s0 + 32) for kScoreRows query rows (bf16, D apart): q·k over the D / 2 dimension pairs in
// order, one vdpbf16ps a pair and 16 slots. `keys`: one KV head in bf16_rows.h's layout, whose 16-slot block
// holds pair p of its 16 slots as one 64-byte row (at p · 16 pairs).
void score_block(const uint16_t* q, int64_t D, const uint16_t* keys, int64_t s0, float* scores, int64_t Lt) {
  const uint16_t* k0 = keys + (s0 / 16) * 16 * D;  // 16 slots x D bf16 a block
  const uint16_t* k1 = k0 + 16 * D;
  __m512 lo[kScoreRows], hi[kScoreRows];
  for (int r = 0; r < kScoreRows; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < D / 2; ++p) {
    const __m512bh b0 = load_bh(k0 + p * 32), b1 = load_bh(k1 + p * 32);
    for (int r = 0; r < kScoreRows; ++r) {
      const __m512bh a = pair_at(q + r * D + 2 * p);
      lo[r] = _mm512_dpbf16_ps(lo[r], a, b0);
      hi[r] = _mm512_dpbf16_ps(hi[r], a, b1);
    }
  }
  for (int r = 0; r < kScoreRows; ++r) {
    _mm512_storeu_ps(scores + r * Lt + s0, lo[r]);
    _mm512_storeu_ps(scores + r * Lt + s0 + 16, hi[r]);
  }
}

// acc[r][16 c0 .. 16 (c0 + C)) (float rows D apart) += Σ over 32-slot blocks [s_begin, s_end), each block's 16
// slot pairs in order, of p[r][pair] · v[pair], for R rows of numerators (bf16 rows Lt apart); from zero when
// s_begin is 0. `values`: one KV head in bf16_rows.h's layout (32-slot block s, dimension block c: 16 rows of a
// slot pair's 16 dimensions). The sums stay in registers across the blocks (the same additions as through memory).
template <int R, int C>
void value_block(const uint16_t* p, int64_t Lt, const uint16_t* values, int64_t s_begin, int64_t s_end,
                 int64_t cblocks, int64_t c0, float* acc, int64_t D) {
  __m512 sum[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      sum[r][c] = s_begin == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * D + (c0 + c) * 16);
  for (int64_t s = s_begin; s < s_end; ++s) {
    const uint16_t* block = values + (s * cblocks + c0) * 16 * kBlock;
    for (int64_t pair = 0; pair < 16; ++pair) {
      __m512bh v[C];
      for (int c = 0; c < C; ++c) v[c] = load_bh(block + (c * 16 + pair) * kBlock);
      for (int r = 0; r < R; ++r) {
        const __m512bh a = pair_at(p + r * Lt + s * kBlock + 2 * pair);
        for (int c = 0; c < C; ++c) sum[r][c] = _mm512_dpbf16_ps(sum[r][c], a, v[c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + r * D + (c0 + c) * 16, sum[r][c]);
}

// Σ p·v for the tile's rows [0, rows) (each row block's slots: seen(r0, R)), kValueBlocks 32-slot blocks at a
// time outermost, so their values stay in L1 for every row that sees them; R x C = 24 accumulators, C
// dimension blocks a call. A block past a row block's slots would add zeros only: skipped.
template <int R, int C, typename Seen>
void values_pass(const uint16_t* p, int64_t Lt, const uint16_t* values, int64_t D, int64_t rows, Seen seen, float* acc) {
  const int64_t cblocks = D / 16, blocks = Lt / kBlock;
  for (int64_t s0 = 0; s0 < blocks; s0 += kValueBlocks)
    for (int64_t r0 = 0; r0 < rows; r0 += R) {
      const int64_t s1 = std::min(s0 + kValueBlocks, round_up(seen(r0, R), kBlock) / kBlock);
      for (int64_t c0 = s1 > s0 ? 0 : cblocks; c0 < cblocks; c0 += C)
        value_block<R, C>(p + r0 * Lt, Lt, values, s0, s1, cblocks, c0, acc + r0 * D, D);
    }
}

}  // namespace

namespace specdec_kernels {

void prompt_attention_bf16(const float* q, int64_t T, int64_t heads, int64_t kv_heads, const float* kc, const float* vc,
                           int64_t S, int64_t D, int64_t start, float scale, float* out) {
  const int64_t group = heads / kv_heads, L = start + T, Lp = round_up(L, kBlock);
  std::vector<uint16_t> kp, vp;
  pack_heads(kc, vc, kv_heads, S, D, L, kp, vp);
  const int64_t token_tiles = (T + kTileTokens - 1) / kTileTokens;
  at::parallel_for(0, kv_heads * token_tiles, 1, [&](int64_t u0, int64_t u1) {
    const int64_t max_rows = round_up(kTileTokens * group, kRowPad);
    std::vector<uint16_t> qb(max_rows * D), pb;
    std::vector<float> scores, acc(max_rows * D), inv_total(max_rows);
    for (int64_t unit = u0; unit < u1; ++unit) {
      const int64_t kvh = unit / token_tiles, t0 = (unit % token_tiles) * kTileTokens, t1 = std::min(T, t0 + kTileTokens);
      const int64_t rows = (t1 - t0) * group, padded = round_up(rows, kRowPad);
      const int64_t Lt = round_up(start + t1, kBlock);  // the tile's score columns: every slot its last token sees
      if (static_cast<int64_t>(scores.size()) < padded * Lt) {
        scores.resize(padded * Lt);
        pb.resize(padded * Lt);
      }
      // row r: token t0 + r / group, query head kvh · group + r % group — its offset in q and out
      auto head_row = [&](int64_t r) { return ((t0 + r / group) * heads + kvh * group + r % group) * D; };
      query_rows(q, head_row, rows, padded, D, qb.data());
      const uint16_t* keys = kp.data() + kvh * Lp * D;
      const uint16_t* values = vp.data() + kvh * Lp * D;
      // the slots the last real row of the n rows from r0 sees (rows are token-major)
      auto seen = [&](int64_t r0, int64_t n) { return start + t0 + (std::min(r0 + n, rows) - 1) / group + 1; };
      for (int64_t s0 = 0; s0 < Lt; s0 += kBlock)  // slot blocks outermost: a block's keys stay in L1
        for (int64_t r0 = 0; r0 < rows; r0 += kScoreRows)
          if (s0 < seen(r0, kScoreRows)) score_block(qb.data() + r0 * D, D, keys, s0, scores.data() + r0 * Lt, Lt);
      // numerators in float32 over each row's own slots, bf16, zero up to its 12-row block's slots (every
      // values block of its rows reads no further); padding rows all zero
      for (int64_t r = 0; r < padded; ++r) {
        const int64_t count = r < rows ? start + t0 + r / group + 1 : 0;
        const int64_t width = round_up(seen(r - r % kRowPad, kRowPad), kBlock);
        inv_total[r] = softmax_row_bf16(scores.data() + r * Lt, count, width, scale, pb.data() + r * Lt);
      }
      if (D % 64 == 0)
        values_pass<6, 4>(pb.data(), Lt, values, D, rows, seen, acc.data());
      else
        values_pass<12, 2>(pb.data(), Lt, values, D, rows, seen, acc.data());
      write_rows(acc.data(), inv_total.data(), rows, D, head_row, out);
    }
  });
}

}  // namespace specdec_kernels

#pragma GCC pop_options

namespace specdec_kernels {

bool avx512_bf16_ready() {
  static const bool ready = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                            __builtin_cpu_supports("avx512bf16");
  return ready;
}

}  // namespace specdec_kernels

#else  // no AVX-512 BF16 intrinsics in this compiler

namespace specdec_kernels {

bool avx512_bf16_ready() { return false; }
void prompt_attention_bf16(const float*, int64_t, int64_t, int64_t, const float*, const float*, int64_t, int64_t,
                           int64_t, float, float*) {}

}  // namespace specdec_kernels

#endif
