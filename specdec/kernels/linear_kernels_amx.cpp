// The 4-bit linear's dot products of several rows on Intel AMX (Sapphire Rapids and later): the same exact int32
// group sums and the same float operations per (activation row, weight row) as every other path
// (linear_kernels.cpp describes the format), so every output bit is theirs; only the speed differs.
//
// Why: verification chunks, trees, batched steps and prompts are multiply-bound on the VNNI path — 512-bit
// vpdpbusd issue on one port, four per 256 weights, row and output. One tdpbsud multiplies up to 16 activation
// rows by 16 weight rows over a group of 32 inputs.
//
// Why a copy of the weights (q4_amx_repack, made once per layer: Q4Linear.amx_copy): the stored format keeps
// each weight row's codes together (what the one-row decode kernel streams), so a panel's B tiles were a
// 16 x 16 transpose of 4-byte units per block and call, which cost as much as the products (session 46: 9 rows
// at 0.67x the VNNI path's speed). The copy stores each block's B tiles as tdpbsud reads them, two vectors to a
// byte, so a block's tiles are 32 loads, 64 masks/shifts and stores away; the same bytes as the stored layer.
// One block at a time: its B tiles, C sums and scales stay in L1 (batches of 4 blocks spilled to L2 and ran
// 1.5-1.7x slower at 9-16 rows).
//
// Per panel of 16 weight rows and block of 256 inputs:
//   B tiles: the 4-bit codes of group g as tdpbsud's B operand: row v (0..7) = the 16 weight rows' codes
//     32g + 4v .. 32g + 4v + 3 (unsigned, 4 bytes each) — the copy's codes[g][v / 2], low nibbles for even v.
//   A tile: the activation rows' 32 codes of group g, in order (signed; quantized in natural order for this
//     path) — read straight from the quantized rows, K bytes apart.
//   C tile: rows x 16 int32, each exactly Σ code x activation over the group — the sum every path computes.
// Each group has its own scale, so each product covers one group and its C tile is stored before its next use.
// The float part then runs per activation row with the 16 weight rows in the 16 lanes of a register: per
// block and group, acc = fma(float(sum) x float(sc), d, acc) and min_acc = fma(group sum, float(mn) x dmin,
// min_acc), then the result is hsum(acc) - hsum(min_acc) in hsum's order: each lane the operations of
// simd.h's block_accumulate for its weight row (|sum| x sc < 2^24, so float(sum) x float(sc) is exactly
// float(sum x sc), the AVX2 path's value).
#include "dot_kernels.h"
#include "amx_tiles.h"
#include "simd.h"

#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")

namespace {

constexpr int64_t kPanel = 16;       // weight rows per panel: the 16 int32 columns of a C tile
constexpr int64_t kMaxTileRows = 16;  // activation rows per A/C tile
constexpr int kGroups = 8;           // groups of 32 inputs per block of 256

// tiles: 0 and 2 A (rows x 32 bytes), 1 and 3 B (8 x 64 bytes), 4-7 C (rows x 64 bytes): two operand pairs
// and four products in flight
specdec_kernels::TileConfig make_config(int64_t rows) {
  specdec_kernels::TileConfig cfg;
  for (int pair = 0; pair < 2; ++pair) {
    cfg.set(2 * pair, rows, 32);
    cfg.set(2 * pair + 1, 8, 64);
  }
  for (int c = 4; c < 8; ++c) cfg.set(c, rows, 64);
  return cfg;
}

// r[j] lane q -> r[q] lane j (16 x 16 int32): 64 shuffles
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {  // u[4k + c] 128-bit lane L: rows 4k..4k+3 of column 4L + c
    u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // a 4 x 4 transpose of 128-bit lanes
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// One block's B tiles for a panel from the stored rows (q4_amx_repack: the copy is made from these):
// b_tiles[g * 512 + v * 64 + 4 j + t] = code 32 g + 4 v + t of weight row j.
// rows[j]: weight row j's 128 packed bytes of the block (chunk i: vector 2i in the low nibbles, 2i + 1 high).
inline void unpack_b_tiles(const uint8_t* const rows[kPanel], uint8_t* b_tiles) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int half = 0; half < 2; ++half) {  // chunks 2 half and 2 half + 1: 64 bytes of each weight row
    __m512i r[kPanel];
    for (int j = 0; j < kPanel; ++j) r[j] = _mm512_loadu_si512(rows[j] + 64 * half);
    transpose16(r);  // r[8 c + g]: unit g of chunk 2 half + c, for the 16 weight rows
    for (int c = 0; c < 2; ++c) {
      const int v = 4 * half + 2 * c;  // the chunk's low-nibble vector
      for (int g = 0; g < kGroups; ++g) {
        const __m512i packed = r[8 * c + g];
        _mm512_store_si512(b_tiles + g * 512 + v * 64, _mm512_and_si512(packed, low));
        _mm512_store_si512(b_tiles + g * 512 + (v + 1) * 64, _mm512_and_si512(_mm512_srli_epi16(packed, 4), low));
      }
    }
  }
}

// tdpbsud of group g's A and B into a zeroed C, and C's store (rows x 16 int32), issued a few products later so
// that the product's latency overlaps others. Macros: GCC's tile intrinsics paste the tile number into the
// instruction's text, so it must be a literal.
#define SPECDEC_GROUP_PRODUCT(TA, TB, TC, a, K, b_tile)        \
  do {                                                        \
    _tile_loadd(TA, a, K);                                    \
    _tile_loadd(TB, b_tile, 64);                              \
    _tile_zero(TC);                                           \
    _tile_dpbsud(TC, TA, TB);                                 \
  } while (0)
#define SPECDEC_STORE(TC, c_out) _tile_stored(TC, c_out, 64)

// The 8 lanes' sum in simd.h's hsum order, lane-wise over 16 weight rows: ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))
inline __m512 hsum_order(const __m512 v[kGroups]) {
  const __m512 s0 = _mm512_add_ps(v[0], v[4]), s1 = _mm512_add_ps(v[1], v[5]);
  const __m512 s2 = _mm512_add_ps(v[2], v[6]), s3 = _mm512_add_ps(v[3], v[7]);
  return _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3));
}

// A block's B tiles: group g's at tiles + 512 g; row v of it = the low (v even) or high (v odd) nibbles of the
// block's codes[g][v / 2].
inline void expand_b_tiles(const specdec_kernels::Q4AmxBlock& block, uint8_t* tiles) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int g = 0; g < kGroups; ++g)
    for (int c = 0; c < 4; ++c) {
      const __m512i packed = _mm512_load_si512(block.codes[g][c]);
      prefetch_ahead(block.codes[g][c], 1);
      _mm512_store_si512(tiles + g * 512 + 2 * c * 64, _mm512_and_si512(packed, low));
      _mm512_store_si512(tiles + g * 512 + (2 * c + 1) * 64, _mm512_and_si512(_mm512_srli_epi16(packed, 4), low));
    }
}

}  // namespace

namespace specdec_kernels {

void q4_amx_repack(const uint8_t* qs, const uint8_t* sc, const int8_t* mn, const float* d, const float* dmin, int64_t K,
                   int64_t N, Q4AmxBlock* out) {
  const int64_t blocks = K / 256, panels = (N + kPanel - 1) / kPanel;
  alignas(64) uint8_t tiles[kGroups * 512];
  for (int64_t p = 0; p < panels; ++p) {
    int64_t row[kPanel];  // a panel narrower than 16 repeats its last row (those lanes are never stored)
    for (int j = 0; j < kPanel; ++j) row[j] = std::min<int64_t>(p * kPanel + j, N - 1);
    for (int64_t b = 0; b < blocks; ++b) {
      Q4AmxBlock& block = out[p * blocks + b];
      const uint8_t* block_rows[kPanel];
      for (int j = 0; j < kPanel; ++j) block_rows[j] = qs + row[j] * (K / 2) + b * 128;
      unpack_b_tiles(block_rows, tiles);
      for (int g = 0; g < kGroups; ++g)
        for (int c = 0; c < 4; ++c)
          for (int i = 0; i < 64; ++i)
            block.codes[g][c][i] = static_cast<uint8_t>(tiles[g * 512 + 2 * c * 64 + i] |
                                                        tiles[g * 512 + (2 * c + 1) * 64 + i] << 4);
      for (int j = 0; j < kPanel; ++j) {
        for (int g = 0; g < kGroups; ++g) {
          block.sc[g][j] = sc[row[j] * blocks * 8 + b * 8 + g];
          block.mn[g][j] = mn[row[j] * blocks * 8 + b * 8 + g];
        }
        block.d[j] = d[row[j] * blocks + b];
        block.dmin[j] = dmin[row[j] * blocks + b];
      }
    }
  }
}

void q4_panel_amx(const Q4AmxBlock* panel, int64_t K, int64_t outs, const int8_t* xq, const float* gsum,
                  int64_t gstride, int64_t rows, const float* xs, const float* bias, float* out, int64_t ldo) {
  const int64_t blocks = K / 256;
  alignas(64) uint8_t b_tiles[kGroups * 512];
  alignas(64) int32_t sums[kGroups][kMaxTileRows * kPanel];
  alignas(64) float scales[kGroups][kPanel], mins[kGroups][kPanel];
  __m512 acc[kMaxTileRows][kGroups], min_acc[kMaxTileRows][kGroups];
  for (int64_t m0 = 0; m0 < rows; m0 += kMaxTileRows) {
    const int64_t pass_rows = std::min<int64_t>(kMaxTileRows, rows - m0);
    const int8_t* pass_xq = xq + m0 * K;
    const float* pass_gsum = gsum + m0 * gstride;
    const TileConfig cfg = make_config(pass_rows);
    TileConfig current;  // other code on this thread (torch's oneDNN) may have configured the tiles since
    _tile_storeconfig(&current);
    if (std::memcmp(&current, &cfg, sizeof cfg) != 0) _tile_loadconfig(&cfg);
    for (int64_t r = 0; r < pass_rows; ++r)
      for (int g = 0; g < kGroups; ++g) { acc[r][g] = _mm512_setzero_ps(); min_acc[r][g] = _mm512_setzero_ps(); }
    for (int64_t b = 0; b < blocks; ++b) {
      const Q4AmxBlock& block = panel[b];
      expand_b_tiles(block, b_tiles);
      // the block's products, four C tiles in turn (each stored two products after its own)
      const int8_t* a = pass_xq + b * 256;
      SPECDEC_GROUP_PRODUCT(0, 1, 4, a, K, b_tiles);
      SPECDEC_GROUP_PRODUCT(2, 3, 5, a + 32, K, b_tiles + 512);
      SPECDEC_GROUP_PRODUCT(0, 1, 6, a + 64, K, b_tiles + 1024);
      SPECDEC_GROUP_PRODUCT(2, 3, 7, a + 96, K, b_tiles + 1536);
      SPECDEC_STORE(4, sums[0]);
      SPECDEC_STORE(5, sums[1]);
      SPECDEC_GROUP_PRODUCT(0, 1, 4, a + 128, K, b_tiles + 2048);
      SPECDEC_GROUP_PRODUCT(2, 3, 5, a + 160, K, b_tiles + 2560);
      SPECDEC_STORE(6, sums[2]);
      SPECDEC_STORE(7, sums[3]);
      SPECDEC_GROUP_PRODUCT(0, 1, 6, a + 192, K, b_tiles + 3072);
      SPECDEC_GROUP_PRODUCT(2, 3, 7, a + 224, K, b_tiles + 3584);
      SPECDEC_STORE(4, sums[4]);
      SPECDEC_STORE(5, sums[5]);
      SPECDEC_STORE(6, sums[6]);
      SPECDEC_STORE(7, sums[7]);
      // the block's sc and mn x dmin as floats, once for all rows
      const __m512 Dmin = _mm512_load_ps(block.dmin), D = _mm512_load_ps(block.d);
      for (int g = 0; g < kGroups; ++g) {
        const __m128i sc_bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(block.sc[g]));
        const __m128i mn_bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(block.mn[g]));
        _mm512_store_ps(scales[g], _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc_bytes)));
        _mm512_store_ps(mins[g], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(mn_bytes)), Dmin));
      }
      for (int64_t r = 0; r < pass_rows; ++r)  // the float part, row by row
        for (int g = 0; g < kGroups; ++g) {
          const __m512 sum = _mm512_cvtepi32_ps(_mm512_load_si512(sums[g] + r * kPanel));
          acc[r][g] = _mm512_fmadd_ps(_mm512_mul_ps(sum, _mm512_load_ps(scales[g])), D, acc[r][g]);
          min_acc[r][g] = _mm512_fmadd_ps(_mm512_set1_ps(pass_gsum[r * gstride + b * 8 + g]), _mm512_load_ps(mins[g]),
                                          min_acc[r][g]);
        }
    }
    const __mmask16 stored = static_cast<__mmask16>((1u << outs) - 1);
    for (int64_t r = 0; r < pass_rows; ++r) {  // QuantizedRows::output's operations: times the row's scale, + bias
      const __m512 dot = _mm512_sub_ps(hsum_order(acc[r]), hsum_order(min_acc[r]));
      __m512 y = _mm512_mul_ps(dot, _mm512_set1_ps(xs[m0 + r]));
      if (bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(stored, bias));
      _mm512_mask_storeu_ps(out + (m0 + r) * ldo, stored, y);
    }
  }
}

}  // namespace specdec_kernels

#undef SPECDEC_GROUP_PRODUCT
#undef SPECDEC_STORE
#pragma GCC pop_options

namespace specdec_kernels {

bool amx_q4_ready() {
  static const bool ready = [] {
    __builtin_cpu_init();
    return amx_int8_ready();
  }();
  return ready;
}

}  // namespace specdec_kernels

#else  // no AMX intrinsics in this compiler: the 4-bit linear never takes this path

namespace specdec_kernels {

bool amx_q4_ready() { return false; }

void q4_amx_repack(const uint8_t*, const uint8_t*, const int8_t*, const float*, const float*, int64_t, int64_t,
                   Q4AmxBlock*) {}

void q4_panel_amx(const Q4AmxBlock*, int64_t, int64_t, const int8_t*, const float*, int64_t, int64_t, const float*,
                  const float*, float*, int64_t) {}

}  // namespace specdec_kernels

#endif
