// A quantized linear's prompt rows on AMX bf16 tiles; see prompt_linear.cpp.
#pragma once

#include <cstdint>
#include <vector>

namespace inhouse::prompt_linear {

// The rows `index` of x (float32 [*, k]) by q8/q4 weights in quant_linear.cpp's tiles
// (`tiles` of 8 outputs, mins null for q8), + bias (or null), into those rows of out
// (float32, row stride tiles * 8).
struct Rows {
  const float* x;
  std::vector<int64_t> index;
  int64_t k, tiles;
  const uint8_t* wq;
  const float* wd;
  const float* wm;
  const float* bias;
  float* out;
};

// Whether this process runs prompt rows on the tiles for a weight of `tiles` tiles of 8
// outputs (compiled for AMX bf16, granted by Linux, the outputs a multiple of 16).
bool ready(int64_t tiles);

// Runs `rows` on the tiles; needs ready(rows.tiles).
void linear(const Rows& rows);

}  // namespace inhouse::prompt_linear
