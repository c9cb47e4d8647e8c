// bf16 products on AMX bf16 tiles (tdpbf16ps), every row the same way at any row count: the
// pass that bf16_linear.cpp's linears and prompt_linear.cpp's quantized prompt rows share.
//
// Weights come packed in the tiles' B layout (pack_bf16): blocks of 16 outputs, per group of
// 32 inputs 16 rows of 64 bytes, row j holding each output's inputs 2j and 2j + 1, so a
// product's B tile is 1 KiB read in one stream. A pass takes two blocks of outputs at a time
// over every row, two row tiles at a time: four products a group share two A and two B
// loads. Each output is one tile's float32 sum over K in groups of 32, in order, whatever
// else the product holds; rows past the last full tile are padded with zeros.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_linear.h"
#include "simd.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define INHOUSE_AMX_BF16 1
#endif

namespace inhouse::bf16_tiles {

constexpr int64_t kBlock = 16;  // outputs a B tile gives
constexpr int64_t kDepth = 32;  // inputs a product sums
constexpr int64_t kRows = 16;   // rows an A tile holds
constexpr int64_t kAhead = 4;   // groups of weights prefetched ahead

// Whether this process may use the tiles: compiled for AMX bf16 and granted by Linux.
inline bool ready() {
#ifdef INHOUSE_AMX_BF16
  return amx::granted();
#else
  return false;
#endif
}

#ifdef INHOUSE_AMX_BF16
// C tiles 0-3 (16 rows of 16 float32: row tile a x block b at 2a + b), A tiles 4-5 (16 rows
// of 32 bf16), B tiles 6-7 (16 rows of 16 pairs): every tile 16 rows of 64 bytes.
inline void configure() {
  amx::TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = kRows;
    config.bytes_per_row[t] = 64;
  }
  amx::load_tiles(config);
}

// Rows x [rows, k] bf16 (contiguous) by weights w packed by pack_bf16.
struct Pass {
  const uint16_t* x;
  int64_t k;
  const uint16_t* w;
};

// kRowTiles (1-2) row tiles from x (`rows` of them real, the first numbered first_row) by
// kBlocks (1-2) blocks of outputs from `block`: store(row, first output, its 16 sums).
template <int kRowTiles, int kBlocks, typename Store>
void tile_pass(const Pass& pass, const uint16_t* x, int64_t rows, int64_t first_row,
               int64_t block, Store& store) {
  const int64_t groups = pass.k / kDepth, block_elems = groups * kDepth * kBlock;
  const uint16_t* w0 = pass.w + block * block_elems;
  const uint16_t* w1 = w0 + block_elems;
  _tile_zero(0);
  if constexpr (kBlocks == 2) _tile_zero(1);
  if constexpr (kRowTiles == 2) _tile_zero(2);
  if constexpr (kRowTiles == 2 && kBlocks == 2) _tile_zero(3);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t b_at = g * kDepth * kBlock;
    if (g + kAhead < groups) {  // the weights' stream, asked for ahead of its tile loads
      prefetch(w0 + b_at + kAhead * kDepth * kBlock, 1024);
      if constexpr (kBlocks == 2) prefetch(w1 + b_at + kAhead * kDepth * kBlock, 1024);
    }
    _tile_loadd(4, x + g * kDepth, pass.k * 2);
    _tile_loadd(6, w0 + b_at, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kBlocks == 2) {
      _tile_loadd(7, w1 + b_at, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (kRowTiles == 2) {
      _tile_loadd(5, x + kRows * pass.k + g * kDepth, pass.k * 2);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (kBlocks == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float sums[4][kRows * kBlock];
  _tile_stored(0, sums[0], 64);
  if constexpr (kBlocks == 2) _tile_stored(1, sums[1], 64);
  if constexpr (kRowTiles == 2) _tile_stored(2, sums[2], 64);
  if constexpr (kRowTiles == 2 && kBlocks == 2) _tile_stored(3, sums[3], 64);
  for (int a = 0; a < kRowTiles; ++a) {
    for (int b = 0; b < kBlocks; ++b) {
      for (int64_t r = 0; r < kRows && a * kRows + r < rows; ++r) {
        store(first_row + a * kRows + r, (block + b) * kBlock,
              _mm512_load_ps(sums[2 * a + b] + r * kBlock));
      }
    }
  }
}

// The rows past the last full tile, padded with zero rows to one tile (empty: none).
inline std::vector<uint16_t> tail_tile(const uint16_t* x, int64_t rows, int64_t k) {
  const int64_t full = rows / kRows * kRows;
  std::vector<uint16_t> tail(rows > full ? kRows * k : 0, 0);
  if (rows > full) std::memcpy(tail.data(), x + full * k, (rows - full) * k * 2);
  return tail;
}

// Every row by blocks [block, block + kBlocks) (kBlocks 1 or 2): pairs of full row tiles,
// then a last full one, then the last rows from `tail` (tail_tile).
template <int kBlocks, typename Store>
void column_pass(const Pass& pass, int64_t rows, int64_t block, const uint16_t* tail,
                 Store& store) {
  const int64_t full = rows / kRows * kRows, rest = rows - full;
  int64_t r = 0;
  for (; r + 2 * kRows <= full; r += 2 * kRows) {
    tile_pass<2, kBlocks>(pass, pass.x + r * pass.k, 2 * kRows, r, block, store);
  }
  if (r < full) tile_pass<1, kBlocks>(pass, pass.x + r * pass.k, kRows, r, block, store);
  if (rest) tile_pass<1, kBlocks>(pass, tail, rest, full, block, store);
}
#endif

}  // namespace inhouse::bf16_tiles
