// The 4-bit linear's many-row dot products on Intel AMX (Sapphire Rapids and later): the same exact int32 group
// sums and the same float operations per (activation row, weight row) as every other path (linear_kernels.cpp
// describes the format), so every output bit is theirs; only the speed differs.
//
// Why: a prompt's rows are multiply-bound on the VNNI path — 512-bit vpdpbusd issue on one port, four per 256
// weights, row and output. One tdpbsud multiplies up to 16 activation rows by 16 weight rows over a group of
// 32 inputs. Measured (linear_kernels.cpp: g_q4_amx_min_rows): each group has its own scale, so each product
// covers one group and is stored before the next use of its tile; the tiles are then latency-bound and the
// panel's unpacking costs as much as a VNNI pass — AMX pays only where many rows share one unpacking.
//
// Per panel of 16 weight rows and block of 256 inputs:
//   B tiles: the 4-bit codes of group g as tdpbsud's B operand: row v (0..7) = the 16 weight rows' codes
//     32g + 4v .. 32g + 4v + 3 (unsigned, 4 bytes each). The stored format keeps exactly these 4-byte units
//     ("vector v, unit g") per weight row, so the panel's 16 rows are a 16 x 16 transpose of 4-byte units
//     (before the nibbles are split), done in registers for each block.
//   A tile: the activation rows' 32 codes of group g, in order (signed; quantized in natural order for this
//     path) — read straight from the quantized rows, K bytes apart.
//   C tile: rows x 16 int32, each exactly Σ code x activation over the group — the sum every path computes.
// The float part then runs per activation row with the 16 weight rows in the 16 lanes of a register: per
// block and group, acc = fma(float(sum) x float(sc), d, acc) and min_acc = fma(group sum, float(mn) x dmin,
// min_acc), then the result is hsum(acc) - hsum(min_acc) in hsum's order: each lane the operations of
// simd.h's block_accumulate for its weight row (|sum| x sc < 2^24, so float(sum) x float(sc) is exactly
// float(sum x sc), the AVX2 path's value).
#include "dot_kernels.h"
#include "amx_tiles.h"

#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx512vbmi")

namespace {

constexpr int64_t kPanel = 16;       // weight rows per panel: the 16 int32 columns of a C tile
constexpr int64_t kMaxTileRows = 16;  // activation rows per A/C tile
constexpr int64_t kChunkBlocks = 4;  // blocks whose tile products wait in memory for the float part (L1)
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

// One block's B tiles for the panel: b_tiles[g * 512 + v * 64 + 4 j + t] = code 32 g + 4 v + t of weight row j.
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

// vpermt2b indices: half h, byte 16 g + j <- weight row j's byte 4 h + g (byte 8 j + 4 h + g of two gathers)
struct GroupByteIndex {
  alignas(64) uint8_t half[2][64];
};
constexpr GroupByteIndex make_group_byte_index() {
  GroupByteIndex index{};
  for (int h = 0; h < 2; ++h)
    for (int g = 0; g < 4; ++g)
      for (int j = 0; j < 16; ++j) index.half[h][16 * g + j] = static_cast<uint8_t>(8 * j + 4 * h + g);
  return index;
}
constexpr GroupByteIndex kGroupByteIndex = make_group_byte_index();

// A block's eight bytes per weight row (its sc or mn; weight row j's at base + row_offsets[j]) -> per group g,
// the 16 rows' bytes as floats (sign-extended when Signed)
template <bool Signed>
inline void group_bytes(const void* base, const __m512i& offsets_lo, const __m512i& offsets_hi, __m512 out[kGroups]) {
  const __m512i x0 = _mm512_i64gather_epi64(offsets_lo, base, 1);  // rows 0-7, 8 bytes each
  const __m512i x1 = _mm512_i64gather_epi64(offsets_hi, base, 1);  // rows 8-15
  for (int h = 0; h < 2; ++h) {
    const __m512i bytes = _mm512_permutex2var_epi8(x0, _mm512_load_si512(kGroupByteIndex.half[h]), x1);
    const __m128i parts[4] = {_mm512_extracti32x4_epi32(bytes, 0), _mm512_extracti32x4_epi32(bytes, 1),
                              _mm512_extracti32x4_epi32(bytes, 2), _mm512_extracti32x4_epi32(bytes, 3)};
    for (int g = 0; g < 4; ++g)
      out[4 * h + g] = _mm512_cvtepi32_ps(Signed ? _mm512_cvtepi8_epi32(parts[g]) : _mm512_cvtepu8_epi32(parts[g]));
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

// One block of a panel, ready for its tile products and float part: B tiles (group g's at 512 g), and per group
// the 16 weight rows' sc and mn x dmin as floats, and their d.
struct PanelBlock {
  alignas(64) uint8_t b_tiles[kGroups * 512];
  alignas(64) float scales[kGroups][kPanel];
  alignas(64) float mins[kGroups][kPanel];
  alignas(64) float d[kPanel];
};

// The 8 lanes' sum in simd.h's hsum order, lane-wise over 16 weight rows: ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))
inline __m512 hsum_order(const __m512 v[kGroups]) {
  const __m512 s0 = _mm512_add_ps(v[0], v[4]), s1 = _mm512_add_ps(v[1], v[5]);
  const __m512 s2 = _mm512_add_ps(v[2], v[6]), s3 = _mm512_add_ps(v[3], v[7]);
  return _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3));
}

}  // namespace

namespace specdec_kernels {

void q4_panel_amx(const uint8_t* qs, const uint8_t* sc, const int8_t* mn, const float* d, const float* dmin, int64_t K,
                  int64_t outs, const int8_t* xq, const float* gsum, int64_t gstride, int64_t rows, float* result) {
  const int64_t blocks = K / 256;
  // weight row j of the panel (a panel narrower than 16 repeats its last row; those lanes are not stored)
  const uint8_t* row_codes[kPanel];
  alignas(64) int64_t sc_offsets[kPanel];
  alignas(64) int32_t param_offsets[kPanel];
  for (int j = 0; j < kPanel; ++j) {
    const int64_t row = std::min<int64_t>(j, outs - 1);
    row_codes[j] = qs + row * (K / 2);
    sc_offsets[j] = row * blocks * 8;
    param_offsets[j] = static_cast<int32_t>(row * blocks);
  }
  const __m512i sc_lo = _mm512_load_si512(sc_offsets), sc_hi = _mm512_load_si512(sc_offsets + 8);
  const __m512i param_index = _mm512_load_si512(param_offsets);

  // The panel's B tiles and scales for every block, unpacked once for all of the call's 16-row passes (a
  // prompt's many; the 1.5B target's widest panel, 8960 inputs: 140 KB + 18 KB, in L2)
  thread_local std::vector<PanelBlock> panel_storage;
  if (panel_storage.size() < static_cast<size_t>(blocks)) panel_storage.resize(blocks);
  PanelBlock* panel = panel_storage.data();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block_rows[kPanel];
    for (int j = 0; j < kPanel; ++j) block_rows[j] = row_codes[j] + b * 128;
    unpack_b_tiles(block_rows, panel[b].b_tiles);
    __m512 sc_f[kGroups], mn_f[kGroups];
    group_bytes<false>(sc + b * 8, sc_lo, sc_hi, sc_f);
    group_bytes<true>(mn + b * 8, sc_lo, sc_hi, mn_f);
    const __m512 Dmin = _mm512_i32gather_ps(param_index, dmin + b, 4);
    _mm512_store_ps(panel[b].d, _mm512_i32gather_ps(param_index, d + b, 4));
    for (int g = 0; g < kGroups; ++g) {
      _mm512_store_ps(panel[b].scales[g], sc_f[g]);
      _mm512_store_ps(panel[b].mins[g], _mm512_mul_ps(mn_f[g], Dmin));
    }
  }

  alignas(64) int32_t sums[kChunkBlocks][kGroups][kMaxTileRows * kPanel];
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
    for (int64_t b0 = 0; b0 < blocks; b0 += kChunkBlocks) {
      const int64_t chunk = std::min<int64_t>(kChunkBlocks, blocks - b0);
      // the chunk's products, four C tiles in turn (each stored two products after its own)
      for (int64_t cb = 0; cb < chunk; ++cb) {
        const int8_t* a = pass_xq + (b0 + cb) * 256;
        const uint8_t* bt = panel[b0 + cb].b_tiles;
        SPECDEC_GROUP_PRODUCT(0, 1, 4, a, K, bt);
        SPECDEC_GROUP_PRODUCT(2, 3, 5, a + 32, K, bt + 512);
        SPECDEC_GROUP_PRODUCT(0, 1, 6, a + 64, K, bt + 1024);
        SPECDEC_GROUP_PRODUCT(2, 3, 7, a + 96, K, bt + 1536);
        SPECDEC_STORE(4, sums[cb][0]);
        SPECDEC_STORE(5, sums[cb][1]);
        SPECDEC_GROUP_PRODUCT(0, 1, 4, a + 128, K, bt + 2048);
        SPECDEC_GROUP_PRODUCT(2, 3, 5, a + 160, K, bt + 2560);
        SPECDEC_STORE(6, sums[cb][2]);
        SPECDEC_STORE(7, sums[cb][3]);
        SPECDEC_GROUP_PRODUCT(0, 1, 6, a + 192, K, bt + 3072);
        SPECDEC_GROUP_PRODUCT(2, 3, 7, a + 224, K, bt + 3584);
        SPECDEC_STORE(4, sums[cb][4]);
        SPECDEC_STORE(5, sums[cb][5]);
        SPECDEC_STORE(6, sums[cb][6]);
        SPECDEC_STORE(7, sums[cb][7]);
      }
      for (int64_t r = 0; r < pass_rows; ++r) {  // the float part, row by row (its 16 accumulators in registers)
        __m512 row_acc[kGroups], row_min[kGroups];
        for (int g = 0; g < kGroups; ++g) { row_acc[g] = acc[r][g]; row_min[g] = min_acc[r][g]; }
        for (int64_t cb = 0; cb < chunk; ++cb) {
          const int64_t b = b0 + cb;
          const __m512 D = _mm512_load_ps(panel[b].d);
          for (int g = 0; g < kGroups; ++g) {
            const __m512 sum = _mm512_cvtepi32_ps(_mm512_load_si512(sums[cb][g] + r * kPanel));
            row_acc[g] = _mm512_fmadd_ps(_mm512_mul_ps(sum, _mm512_load_ps(panel[b].scales[g])), D, row_acc[g]);
            row_min[g] = _mm512_fmadd_ps(_mm512_set1_ps(pass_gsum[r * gstride + b * 8 + g]),
                                         _mm512_load_ps(panel[b].mins[g]), row_min[g]);
          }
        }
        for (int g = 0; g < kGroups; ++g) { acc[r][g] = row_acc[g]; min_acc[r][g] = row_min[g]; }
      }
    }
    const __mmask16 stored = static_cast<__mmask16>((1u << outs) - 1);
    for (int64_t r = 0; r < pass_rows; ++r)
      _mm512_mask_storeu_ps(result + (m0 + r) * kPanel, stored,
                            _mm512_sub_ps(hsum_order(acc[r]), hsum_order(min_acc[r])));
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
    return amx_int8_ready() && __builtin_cpu_supports("avx512vbmi");
  }();
  return ready;
}

}  // namespace specdec_kernels

#else  // no AMX intrinsics in this compiler: the 4-bit linear never takes this path

namespace specdec_kernels {

bool amx_q4_ready() { return false; }

void q4_panel_amx(const uint8_t*, const uint8_t*, const int8_t*, const float*, const float*, int64_t, int64_t,
                  const int8_t*, const float*, int64_t, int64_t, float*) {}

}  // namespace specdec_kernels

#endif
