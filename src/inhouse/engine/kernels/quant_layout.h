// The quantized linears' block layout, shared by their kernel families (quant_linear.cpp's
// VNNI/AVX2 loops, amx_linear.cpp's tiles); the layouts themselves are described where
// quant_linear.cpp defines tile_byte.
#pragma once

#include <cstdint>

namespace inhouse {

constexpr int64_t kGroup = 32;  // weights (and activations) a group along K
constexpr int64_t kTile = 8;    // output rows a weight tile holds
constexpr int64_t kQ8TileGroupBytes = kTile * kGroup;
constexpr int64_t kQ4TileGroupBytes = kTile * kGroup / 2;

}  // namespace inhouse
