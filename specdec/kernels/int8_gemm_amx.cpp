// The int8 mode's GEMM on Intel AMX (Sapphire Rapids and later): the same packed weights, the same
// exact int32 sums and the same float epilogue as the AVX-512 VNNI kernel (int8_gemm_avx512.cpp, which
// describes the format), so every output bit is the VNNI kernel's: which of the two runs a call changes
// its speed only.
//
// Why: a verification chunk, a batch of requests or a prompt pass multiplies many activation rows by
// every weight, and on a 2-core Xeon the VNNI kernel's int32 dot products, not memory, set the cost
// past a few rows. One AMX tile instruction (tdpbsud) does 16 rows x 16 outputs x 64 inputs of it.
//
// Layout: tile A is up to 16 activation rows x 64 inputs (signed int8 codes, straight from the
// quantized rows); tile B is 16 groups of 4 inputs x 16 outputs, which is exactly a 64-byte quarter of
// the packed panel's rows (unsigned w + 128), so the weights are read in place, 256 bytes apart;
// tile C is rows x 16 int32 sums of q * (w + 128). Four C tiles cover a panel's 64 outputs; a K that is
// not a multiple of 64 ends with a narrower A/B pair (K is a multiple of 16).
//
// The OS must grant a process the AMX tile state before its first use (Linux arch_prctl
// ARCH_REQ_XCOMP_PERM): amx_int8_ready() asks once and says whether it was granted.
#include "dot_kernels.h"
#include "amx_tiles.h"

// AMX intrinsics arrived in GCC 11 and clang 12: an older compiler builds the rest of the extension,
// and this file then only says that AMX is not ready (the VNNI kernel runs every pass).
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <cstdint>

namespace {

constexpr int64_t kTileRowsAmx = 16;  // activation rows per A/C tile
constexpr int64_t kTileInputs = 64;   // inputs per A tile row (bytes)
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

// tiles 0-3: C (one per 16 outputs), 4: A, 5: B, 6: the last A (tail inputs), 7: the last B
specdec_kernels::TileConfig make_config(int64_t rows, int64_t tail) {
  specdec_kernels::TileConfig cfg;
  for (int c = 0; c < 4; ++c) cfg.set(c, rows, 64);
  cfg.set(4, rows, kTileInputs);
  cfg.set(5, kTileInputs / 4, 64);
  if (tail) {
    cfg.set(6, rows, tail);
    cfg.set(7, tail / 4, 64);
  }
  return cfg;
}

}  // namespace

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")

namespace {

// Up to 16 rows x one panel: int32 sums of q * (w + 128) -> sums[r][0..63]. Tile numbers are
// immediates, so each B quarter is spelled out.
void panel_block(const int8_t* xq, int64_t K, const uint8_t* panel, int64_t tail, int32_t* sums) {
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  const int64_t full = K - tail;
  for (int64_t k = 0; k < full; k += kTileInputs) {
    const uint8_t* w = panel + k * 64;  // 16 groups of 4 inputs, 256 bytes each
    _tile_loadd(4, xq + k, K);
    _tile_loadd(5, w, 256); _tile_dpbsud(0, 4, 5);
    _tile_loadd(5, w + 64, 256); _tile_dpbsud(1, 4, 5);
    _tile_loadd(5, w + 128, 256); _tile_dpbsud(2, 4, 5);
    _tile_loadd(5, w + 192, 256); _tile_dpbsud(3, 4, 5);
  }
  if (tail) {
    const uint8_t* w = panel + full * 64;
    _tile_loadd(6, xq + full, K);
    _tile_loadd(7, w, 256); _tile_dpbsud(0, 6, 7);
    _tile_loadd(7, w + 64, 256); _tile_dpbsud(1, 6, 7);
    _tile_loadd(7, w + 128, 256); _tile_dpbsud(2, 6, 7);
    _tile_loadd(7, w + 192, 256); _tile_dpbsud(3, 6, 7);
  }
  _tile_stored(0, sums, 256); _tile_stored(1, sums + 16, 256);
  _tile_stored(2, sums + 32, 256); _tile_stored(3, sums + 48, 256);
}

}  // namespace

namespace specdec_kernels {

void int8_gemm_panel_amx(const int8_t* xq, const float* xs, const int32_t* totals, int64_t rows, int64_t K,
                         const uint8_t* panel, const float* ws, const float* bias, int64_t cols, float* out,
                         int64_t ldo) {
  alignas(64) int32_t sums[kTileRowsAmx * 64];
  const int64_t tail = K % kTileInputs;
  int64_t configured = 0;  // the rows the tiles are configured for (torch's other ops may use AMX between calls)
  for (int64_t r = 0; r < rows; r += kTileRowsAmx) {
    const int64_t block = std::min<int64_t>(kTileRowsAmx, rows - r);
    if (block != configured) {
      const specdec_kernels::TileConfig cfg = make_config(block, tail);
      _tile_loadconfig(&cfg);
      configured = block;
    }
    panel_block(xq + r * K, K, panel, tail, sums);
    int8_finish_rows(sums, block, totals + r, xs + r, ws, bias, cols, out + r * ldo, ldo);
  }
  _tile_release();
}

}  // namespace specdec_kernels

#pragma GCC pop_options

namespace specdec_kernels {

bool amx_int8_ready() {
  static const bool ready = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8") || !cpu_has_avx512_vnni())
      return false;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ready;
}

}  // namespace specdec_kernels

#else  // no AMX intrinsics in this compiler

namespace specdec_kernels {

bool amx_int8_ready() { return false; }

void int8_gemm_panel_amx(const int8_t* xq, const float* xs, const int32_t* totals, int64_t rows, int64_t K,
                         const uint8_t* panel, const float* ws, const float* bias, int64_t cols, float* out,
                         int64_t ldo) {
  int8_gemm_panel_avx512(xq, xs, totals, rows, K, panel, ws, bias, cols, out, ldo);
}

}  // namespace specdec_kernels

#endif
