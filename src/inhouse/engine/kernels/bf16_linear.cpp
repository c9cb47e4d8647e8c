// bfloat16 linears on AMX bf16 tiles, every row count the same way (`--dtype bfloat16`).
//
// A tile product (tdpbf16ps) sums 32 products of bf16 pairs into float32 in an order of the
// hardware's own, which no chain of vector instructions reproduces (measured: 239 of 256
// sums differ from a vdpbf16ps chain, 236 from a float32 fma chain). So there is no second
// path here for few rows: one row alone (a decode) is padded to a tile of 16 and multiplied
// the same way as a prompt's thousand, and each output is one tile's float32 sum over K in
// groups of 32, in order, whatever else the product holds: batch and chunking invariance
// hold by construction, at any row count (oneDNN's bf16 matmul changes its order with the
// row count, see row_blocks.py). The sum, plus the bias, rounds to bf16 once (nearest even),
// as a float32-accumulating bf16 matmul rounds it.
//
// Weights are packed once (pack_bf16) in the tiles' B layout: blocks of 16 outputs, per
// group of 32 inputs 16 rows of 64 bytes, row j holding each output's inputs 2j and 2j + 1,
// so a product's B tile is 1 KiB read in one stream. A pass takes two blocks of outputs
// at a time (a thread's unit of work) over every row, two row tiles at a time: four
// products a group share two A and two B loads. For a decode the weights' bytes decide the
// speed (the products are ~2 ms of tile time a token for a 135M model on one core).

#include <torch/library.h>
#include <torch/types.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_linear.h"
#include "simd.h"
#include "work_pool.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define INHOUSE_AMX_BF16 1
#endif

namespace inhouse {
namespace {

constexpr int64_t kBf16Block = 16;  // outputs a B tile gives
constexpr int64_t kBf16Depth = 32;  // inputs a product sums
constexpr int64_t kBf16Rows = 16;   // rows an A tile holds
constexpr int64_t kBf16Ahead = 4;   // groups of weights prefetched ahead

bool bf16_tiles() {
#ifdef INHOUSE_AMX_BF16
  return amx::granted();
#else
  return false;
#endif
}

#ifdef INHOUSE_AMX_BF16
// C tiles 0-3 (16 rows of 16 float32: row tile a x block b at 2a + b), A tiles 4-5 (16 rows
// of 32 bf16), B tiles 6-7 (16 rows of 16 pairs): every tile 16 rows of 64 bytes.
void configure_bf16_tiles() {
  amx::TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = kBf16Rows;
    config.bytes_per_row[t] = 64;
  }
  amx::load_tiles(config);
}

// Where a pass reads and writes: x [rows, k] and out [rows, n] (bf16, rows contiguous),
// weights packed by pack_bf16.
struct Bf16Pass {
  const uint16_t* x;
  int64_t k;
  const uint16_t* w;
  const float* bias;  // [n] or null
  uint16_t* out;
  int64_t n;
};

// Rounds 16 sums (+ bias) of one row to bf16 into `to`.
inline void store_row(const float* sums, const float* bias, uint16_t* to) {
  __m512 v = _mm512_load_ps(sums);
  if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), (__m256i)_mm512_cvtneps_pbh(v));
}

// kRowTiles (1-2) row tiles from `x` (row stride `stride` elements; `rows` of them real) by
// kBlocks (1-2) blocks of outputs from `block`, into `out` (row stride pass.n).
template <int kRowTiles, int kBlocks>
void tile_pass(const Bf16Pass& pass, const uint16_t* x, int64_t stride, int64_t rows,
               int64_t block, uint16_t* out) {
  const int64_t groups = pass.k / kBf16Depth, block_elems = groups * kBf16Depth * kBf16Block;
  const uint16_t* w0 = pass.w + block * block_elems;
  const uint16_t* w1 = w0 + block_elems;
  _tile_zero(0);
  if constexpr (kBlocks == 2) _tile_zero(1);
  if constexpr (kRowTiles == 2) _tile_zero(2);
  if constexpr (kRowTiles == 2 && kBlocks == 2) _tile_zero(3);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t b_at = g * kBf16Depth * kBf16Block;
    if (g + kBf16Ahead < groups) {  // the weights' stream, asked for ahead of its tile loads
      prefetch(w0 + b_at + kBf16Ahead * kBf16Depth * kBf16Block, 1024);
      if constexpr (kBlocks == 2) prefetch(w1 + b_at + kBf16Ahead * kBf16Depth * kBf16Block, 1024);
    }
    _tile_loadd(4, x + g * kBf16Depth, stride * 2);
    _tile_loadd(6, w0 + b_at, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kBlocks == 2) {
      _tile_loadd(7, w1 + b_at, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (kRowTiles == 2) {
      _tile_loadd(5, x + kBf16Rows * stride + g * kBf16Depth, stride * 2);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (kBlocks == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float sums[4][kBf16Rows * kBf16Block];
  _tile_stored(0, sums[0], 64);
  if constexpr (kBlocks == 2) _tile_stored(1, sums[1], 64);
  if constexpr (kRowTiles == 2) _tile_stored(2, sums[2], 64);
  if constexpr (kRowTiles == 2 && kBlocks == 2) _tile_stored(3, sums[3], 64);
  for (int a = 0; a < kRowTiles; ++a) {
    for (int b = 0; b < kBlocks; ++b) {
      const float* bias = pass.bias ? pass.bias + (block + b) * kBf16Block : nullptr;
      for (int64_t r = 0; r < kBf16Rows && a * kBf16Rows + r < rows; ++r) {
        store_row(sums[2 * a + b] + r * kBf16Block, bias,
                  out + (a * kBf16Rows + r) * pass.n + b * kBf16Block);
      }
    }
  }
}

// Every row by blocks [first, first + count) (count 1 or 2): pairs of full row tiles, then
// a last full one, then the last rows padded with zeros in `tail` (16 rows).
template <int kBlocks>
void column_pass(const Bf16Pass& pass, int64_t rows, int64_t block, const uint16_t* tail) {
  const int64_t full = rows / kBf16Rows * kBf16Rows, rest = rows - full;
  uint16_t* out = pass.out + block * kBf16Block;
  int64_t r = 0;
  for (; r + 2 * kBf16Rows <= full; r += 2 * kBf16Rows) {
    tile_pass<2, kBlocks>(pass, pass.x + r * pass.k, pass.k, 2 * kBf16Rows, block, out + r * pass.n);
  }
  if (r < full) tile_pass<1, kBlocks>(pass, pass.x + r * pass.k, pass.k, kBf16Rows, block, out + r * pass.n);
  if (rest) tile_pass<1, kBlocks>(pass, tail, pass.k, rest, block, out + full * pass.n);
}

void linear_on_bf16_tiles(const Bf16Pass& pass, int64_t rows) {
  const int64_t blocks = pass.n / kBf16Block, full = rows / kBf16Rows * kBf16Rows;
  std::vector<uint16_t> tail(rows > full ? kBf16Rows * pass.k : 0, 0);
  if (rows > full) std::memcpy(tail.data(), pass.x + full * pass.k, (rows - full) * pass.k * 2);
  inhouse::parallel_for(0, (blocks + 1) / 2, 1, [&](int64_t begin, int64_t end) {
    configure_bf16_tiles();
    for (int64_t pair = begin; pair < end; ++pair) {
      if (2 * pair + 1 < blocks) {
        column_pass<2>(pass, rows, 2 * pair, tail.data());
      } else {
        column_pass<1>(pass, rows, 2 * pair, tail.data());
      }
    }
    _tile_release();
  });
}
#endif

bool bf16_linear_ready() { return bf16_tiles(); }

}  // namespace

// A [n, k] bf16 weight (n a multiple of 16, k of 32) in the tiles' B layout:
// [n / 16, k / 32, 16, 16, 2], element (block, g, j, o, i) = weight[16 block + o, 32 g + 2j + i].
torch::Tensor pack_bf16(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kBFloat16,
              "a [out, in] bfloat16 weight");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(n % kBf16Block == 0 && k % kBf16Depth == 0, "out a multiple of 16, in of 32");
  return weight.contiguous()
      .view({n / kBf16Block, kBf16Block, k / kBf16Depth, kBf16Depth / 2, 2})
      .permute({0, 2, 3, 1, 4})
      .contiguous();
}

// x [..., k] bf16 by a weight packed by pack_bf16 (n outputs), + bias (bf16 or float32):
// [..., n] bf16. Needs the tiles (bf16_linear_ready).
torch::Tensor linear_bf16(const torch::Tensor& x, const torch::Tensor& packed,
                          const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(bf16_tiles(), "linear_bf16 needs AMX bf16 tiles granted to this process");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && packed.scalar_type() == torch::kBFloat16,
              "bfloat16 activations and packed weight");
  TORCH_CHECK(packed.dim() == 5 && packed.size(3) == kBf16Depth / 2, "a weight from pack_bf16");
  const int64_t k = packed.size(1) * kBf16Depth, n = packed.size(0) * kBf16Block;
  TORCH_CHECK(x.size(-1) == k, "x's last dimension must be the weight's in features");
  auto rows_x = x.contiguous().view({-1, k});
  const int64_t rows = rows_x.size(0);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  auto out = torch::empty(shape, x.options());
  torch::Tensor bias_f;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == n, "bias must have the weight's out features");
    bias_f = bias->to(torch::kFloat32).contiguous();
  }
  if (rows == 0) return out;
#ifdef INHOUSE_AMX_BF16
  const Bf16Pass pass{reinterpret_cast<const uint16_t*>(rows_x.data_ptr()), k,
                      reinterpret_cast<const uint16_t*>(packed.data_ptr()),
                      bias.has_value() ? bias_f.data_ptr<float>() : nullptr,
                      reinterpret_cast<uint16_t*>(out.data_ptr()), n};
  linear_on_bf16_tiles(pass, rows);
#endif
  return out;
}

}  // namespace inhouse

TORCH_LIBRARY_FRAGMENT(inhouse_cpu, m) {
  m.def("bf16_linear_ready() -> bool", &inhouse::bf16_linear_ready);
  m.def("pack_bf16(Tensor weight) -> Tensor", &inhouse::pack_bf16);
  m.def("linear_bf16(Tensor x, Tensor packed, Tensor? bias) -> Tensor", &inhouse::linear_bf16);
}
