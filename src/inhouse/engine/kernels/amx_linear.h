// The quantized linears' many-row pass (a prompt's rows) on AMX int8 tiles, where the CPU
// and the kernel let this process use them; see amx_linear.cpp.
#pragma once

#include <cstdint>

namespace inhouse::amx {

// Rows from which linear_impl hands a pass to the tiles (fewer keep the VNNI loops: the same
// bits either way, so the choice is timing only).
constexpr int64_t kFromRows = 16;

// One linear's operands: activations already quantized per group (codes [rows, groups * 32],
// scales d and q4's d * sum [rows, groups]), weights in quant_linear.cpp's tiles of 8 rows
// (`tiles` of them, an even number), float32 out [rows, tiles * 8].
struct LinearArgs {
  const int8_t* xq;
  const float* xd;
  const float* xs;
  int64_t rows, groups, tiles;
  const uint8_t* wq;
  const float* wd;
  const float* wm;  // q4's mins; null for q8
  const float* bias;  // null for none
  float* out;
};

// Palette 1's configuration: each of the 8 tiles' rows and bytes a row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

#ifdef __AMX_TILE__
// Configures the calling thread's tiles (ldtilecfg).
void load_tiles(const TileConfig& config);
#endif

// Whether this process may use the tiles: compiled for AMX and granted by Linux (asked once).
bool granted();

// Whether the tiles run the passes: compiled for AMX, granted by Linux, and not turned off.
bool enabled();

// Runs `args` on the tiles (enabled() must hold); q4 when args.wm is set.
void linear(const LinearArgs& args);

}  // namespace inhouse::amx
