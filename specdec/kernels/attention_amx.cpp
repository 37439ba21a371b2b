// Prompt passes' attention on Intel AMX bf16 tiles (Sapphire Rapids and later): q·kᵀ and p·v as bf16
// tile products with float32 sums, the softmax between them in float32 (its exponentials to bf16's
// precision). (AVX-512 BF16's vdpbf16ps without tiles, attention_bf16.cpp, is no faster than the float32
// kernels on this Xeon — one vdpbf16ps a cycle against two FMAs —, so it runs only where timed faster: AMD's cores.)
//
// Why: since prompt passes run in token tiles (layer_ops.cpp) their attention is arithmetic — ~53 GMAC/s
// a core of float32 FMAs, ~2.5 s of a 2.4k-token prompt's pass on a 2-core Xeon. One tdpbf16ps does
// 16 rows x 16 columns x 32 products: one 1.5B layer over 2 432 tokens 94 -> 27 ms. Its limit now is the
// L2 (each step of four products loads two A and two B tiles, 4 KB), not the tile unit.
//
// Where it runs: only the passes of a prompt twin (TorchBackend.use_for_prompts), whose rows already
// differ from decoding's (another weight format): plain and speculative decoding read the same prompt
// cache, and no verification or decode row ever runs here. What it keeps: each (token, head) row's bits
// do not depend on the other rows of the pass, on the tile it falls in or on how the prompt was split
// into passes — every row's sums run over slot blocks of 32 aligned at slot 0, slots it does not see
// contribute exact zeros (a prefix cache's stored prompt continues exactly as one long pass would).
//
// Layout (per KV head): K as B tiles of 16 slots x 16 dimension pairs (a pair of bf16 per 32-bit
// element, the transpose tdpbf16ps wants), V as B tiles of 16 slot pairs x 16 dimensions; the tile's
// query rows (token-major, then head) as A tiles of 16 rows x 32 dimensions; probabilities as A tiles of
// 16 rows x 32 slots. Tiles 0-3: C (2 x 2 blocks), 4-5: A, 6-7: B.
#include "dot_kernels.h"
#include "amx_tiles.h"

#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#include "bf16_rows.h"  // the bf16 layout, softmax row and steps around the products: this file's copies, for this target

namespace {

constexpr int64_t kRows = 16;        // query rows per A / C tile
constexpr int64_t kTileTokens = 16;  // tokens per unit of work: 16 · group rows, their scores ~L2-sized at 3k slots

// C tiles 0..3 = [A0; A1] x [B0 B1], A tiles `a_stride` bytes a row, `steps` steps of 32 along the sum
// (a_step bf16 apart in A, b_step apart in B), stored as float rows `c_stride` floats apart
void block_2x2(const uint16_t* a, int64_t a_stride, int64_t a_step, const uint16_t* b0, const uint16_t* b1,
               int64_t b_step, int64_t steps, float* c, int64_t c_stride) {
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int64_t k = 0; k < steps; ++k) {
    _tile_loadd(4, a + k * a_step, a_stride);
    _tile_loadd(5, a + k * a_step + kRows * a_stride / 2, a_stride);
    _tile_loadd(6, b0 + k * b_step, 64);
    _tile_loadd(7, b1 + k * b_step, 64);
    _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, c_stride * 4); _tile_stored(1, c + 16, c_stride * 4);
  _tile_stored(2, c + kRows * c_stride, c_stride * 4); _tile_stored(3, c + kRows * c_stride + 16, c_stride * 4);
}

}  // namespace

namespace specdec_kernels {

void prompt_attention_amx(const float* q, int64_t T, int64_t heads, int64_t kv_heads, const float* kc, const float* vc,
                          int64_t S, int64_t D, int64_t start, float scale, float* out) {
  const int64_t group = heads / kv_heads, L = start + T, Lp = round_up(L, kBlock);
  const int64_t kblocks = D / kBlock, cblocks = D / 16;
  std::vector<uint16_t> kp, vp;
  pack_heads(kc, vc, kv_heads, S, D, L, kp, vp);
  const int64_t token_tiles = (T + kTileTokens - 1) / kTileTokens;
  at::parallel_for(0, kv_heads * token_tiles, 1, [&](int64_t u0, int64_t u1) {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) cfg.set(t, kRows, 64);
    _tile_loadconfig(&cfg);
    const int64_t max_rows = round_up(kTileTokens * group, 2 * kRows);
    std::vector<uint16_t> qb(max_rows * D), pb;
    std::vector<float> scores, acc(max_rows * D), inv_total(max_rows);
    for (int64_t unit = u0; unit < u1; ++unit) {
      const int64_t kvh = unit / token_tiles, t0 = (unit % token_tiles) * kTileTokens, t1 = std::min(T, t0 + kTileTokens);
      const int64_t rows = (t1 - t0) * group, padded = round_up(rows, 2 * kRows);
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
      // the slots the last real row of a 32-row block sees (rows are token-major)
      auto seen_by = [&](int64_t r0) { return start + t0 + (std::min(r0 + 2 * kRows, rows) - 1) / group + 1; };
      // scores, slot blocks outermost: a block's keys stay in L1 for every row block that sees it
      const int64_t row_blocks = (rows + 2 * kRows - 1) / (2 * kRows);
      for (int64_t s0 = 0; s0 < Lt; s0 += kBlock)
        for (int64_t b = 0; b < row_blocks; ++b) {
          const int64_t r0 = b * 2 * kRows;
          if (s0 >= seen_by(r0)) continue;
          block_2x2(qb.data() + r0 * D, D * 2, kBlock, keys + (s0 / 16) * kblocks * 16 * kBlock,
                    keys + (s0 / 16 + 1) * kblocks * 16 * kBlock, 16 * kBlock, kblocks, scores.data() + r0 * Lt + s0, Lt);
        }
      // softmax numerators in float32 over each row's own slots, stored bf16; padding rows all zero
      for (int64_t r = 0; r < padded; ++r) {
        const int64_t count = r < rows ? start + t0 + r / group + 1 : 0;
        const int64_t width = round_up(seen_by(r - r % (2 * kRows)), kBlock);  // what the values pass reads
        inv_total[r] = softmax_row_bf16(scores.data() + r * Lt, count, width, scale, pb.data() + r * Lt);
      }
      // Σ p·v over 32-slot blocks from slot 0: blocks past a row's own slots add exact zeros
      for (int64_t r0 = 0; r0 < rows; r0 += 2 * kRows) {
        const int64_t steps = round_up(seen_by(r0), kBlock) / kBlock;
        for (int64_t c = 0; c < cblocks; c += 2)
          block_2x2(pb.data() + r0 * Lt, Lt * 2, kBlock, values + c * 16 * kBlock, values + (c + 1) * 16 * kBlock,
                    cblocks * 16 * kBlock, steps, acc.data() + r0 * D + c * 16, D);
      }
      write_rows(acc.data(), inv_total.data(), rows, D, head_row, out);
    }
    _tile_release();
  });
}

}  // namespace specdec_kernels

#pragma GCC pop_options

namespace specdec_kernels {

// amx_int8_ready() checks the tiles and asks the OS for their state (once, for both kinds of tile product)
bool amx_bf16_ready() {
  static const bool ready = amx_int8_ready() && __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("avx512bf16");
  return ready;
}


}  // namespace specdec_kernels

#else  // no AMX intrinsics in this compiler

namespace specdec_kernels {

bool amx_bf16_ready() { return false; }
void prompt_attention_amx(const float*, int64_t, int64_t, int64_t, const float*, const float*, int64_t, int64_t,
                          int64_t, float, float*) {}

}  // namespace specdec_kernels

#endif
