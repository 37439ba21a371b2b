// Intel AMX's tile configuration (ldtilecfg's 64-byte operand, palette 1), shared by the AMX kernels
// (int8_gemm_amx.cpp, linear_kernels_amx.cpp). A plain struct: no intrinsics, so any file may include it.
#pragma once
#include <cstdint>

namespace specdec_kernels {

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of each tile
  uint8_t rows[16] = {};

  void set(int tile, int64_t tile_rows, int64_t bytes_per_row) {
    rows[tile] = static_cast<uint8_t>(tile_rows);
    colsb[tile] = static_cast<uint16_t>(bytes_per_row);
  }
};

}  // namespace specdec_kernels
