// The quantized linears' block layout, shared by their kernel families (quant_linear.cpp's
// VNNI/AVX2 loops, amx_linear.cpp's int8 tiles, prompt_linear.cpp's bf16 tiles); the
// layouts themselves are described in quant_linear.cpp.
#pragma once

#include <cstdint>

namespace inhouse {

constexpr int64_t kGroup = 32;  // weights (and activations) a group along K
constexpr int64_t kTile = 8;    // output rows a weight tile holds
constexpr int64_t kQ8TileGroupBytes = kTile * kGroup;
constexpr int64_t kQ4TileGroupBytes = kTile * kGroup / 2;

// The byte of a tile group that holds row r's code at k (0..31); in q4 its low nibble
// when k % 8 < 4, else its high one.
template <bool kQ4>
constexpr int64_t tile_byte(int64_t r, int64_t k) {
  return (kQ4 ? (k / 8) * 32 : (k / 4) * 32) + r * 4 + k % 4;
}

// Row r's code at k (0..31) in one tile group.
template <bool kQ4>
inline int tile_code(const uint8_t* tile_group, int r, int k) {
  if constexpr (kQ4) {
    const uint8_t byte = tile_group[tile_byte<true>(r, k)];
    return (k % 8) < 4 ? byte & 0x0F : byte >> 4;
  } else {
    return static_cast<int8_t>(tile_group[tile_byte<false>(r, k)]);
  }
}

}  // namespace inhouse
