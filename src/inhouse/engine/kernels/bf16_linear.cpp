// bfloat16 linears (`--dtype bfloat16`), every row count the same way: on AMX bf16 tiles where
// Linux grants them, else on AVX-512 BF16's vdpbf16ps (AMD Zen 4).
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
// Without the tiles, each row is its own chain of vdpbf16ps over K's pairs in order (two
// products, then the sum, a pair): a row's bits are its own whatever rows run beside it, and
// no row is padded, so a decode streams the weights once and multiplies one row.
//
// Weights are packed once (pack_bf16) in the tiles' B layout, which is also the order the
// chains read them; two blocks of outputs are a thread's unit of work. For a decode the
// weights' bytes decide the speed (the products are ~2 ms of tile time a token for a 135M
// model on one core).

#include <torch/library.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bf16_dot.h"
#include "bf16_tiles.h"
#include "simd.h"
#include "work_pool.h"

namespace inhouse {
namespace {

using bf16_tiles::kBlock;
using bf16_tiles::kDepth;

#ifdef INHOUSE_AMX_BF16
// x [rows, k] by the packed weight's `blocks` blocks of outputs on the tiles: store(row,
// first output, its 16 sums).
template <typename Store>
void linear_on_bf16_tiles(const bf16_tiles::Pass& pass, int64_t rows, int64_t blocks,
                          Store& store) {
  const std::vector<uint16_t> tail = bf16_tiles::tail_tile(pass.x, rows, pass.k);
  inhouse::parallel_for(0, (blocks + 1) / 2, 1, [&](int64_t begin, int64_t end) {
    bf16_tiles::configure();
    for (int64_t pair = begin; pair < end; ++pair) {
      if (2 * pair + 1 < blocks) {
        bf16_tiles::column_pass<2>(pass, rows, 2 * pair, tail.data(), store);
      } else {
        bf16_tiles::column_pass<1>(pass, rows, 2 * pair, tail.data(), store);
      }
    }
    _tile_release();
  });
}
#endif

#ifdef INHOUSE_BF16_DOT
constexpr int kChainRows = bf16_dot::kChains;  // rows a pass carries: 16 sums for two blocks

// Rows [row0, row0 + R) of x [rows, k] by kBlocks (1-2) blocks of outputs from `block`, the
// weights streaming past: store(row, first output, its 16 sums).
template <int R, int kBlocks, typename Store>
void chain_pass(const uint16_t* x, int64_t k, const uint16_t* w, int64_t row0, int64_t block,
                Store& store) {
  const int64_t block_elems = k * kBlock, group_elems = kDepth * kBlock;
  bf16_dot::chains<R, kBlocks>(x + row0 * k, k, w + block * block_elems, block_elems,
                               group_elems, k / kDepth, bf16_tiles::kAhead * group_elems,
                               [&](int r, int j, __m512 sums) {
                                 store(row0 + r, (block + j) * kBlock, sums);
                               });
}

template <int kBlocks, typename Store>
void chain_rows(const uint16_t* x, int64_t k, const uint16_t* w, int64_t rows, int64_t block,
                Store& store) {
  int64_t r = 0;
  for (; r + kChainRows <= rows; r += kChainRows) {
    chain_pass<kChainRows, kBlocks>(x, k, w, r, block, store);
  }
  switch (rows - r) {
    case 7: chain_pass<7, kBlocks>(x, k, w, r, block, store); break;
    case 6: chain_pass<6, kBlocks>(x, k, w, r, block, store); break;
    case 5: chain_pass<5, kBlocks>(x, k, w, r, block, store); break;
    case 4: chain_pass<4, kBlocks>(x, k, w, r, block, store); break;
    case 3: chain_pass<3, kBlocks>(x, k, w, r, block, store); break;
    case 2: chain_pass<2, kBlocks>(x, k, w, r, block, store); break;
    case 1: chain_pass<1, kBlocks>(x, k, w, r, block, store); break;
    default: break;
  }
}
#endif

// Which unit linear_bf16 multiplies on in this process: "amx" (tiles granted), "avx512_bf16"
// (vdpbf16ps chains), or "" (neither: the caller keeps torch's products).
std::string bf16_linear_unit() {
  if (bf16_tiles::ready()) return "amx";
#ifdef INHOUSE_BF16_DOT
  return "avx512_bf16";
#else
  return "";
#endif
}

#ifdef INHOUSE_BF16_DOT
// x [rows, k] by the packed weight into out [rows, n] bf16 on the unit above: each row's
// sums plus the bias (float32) rounded to bf16 once.
void linear_on_bf16_unit(const uint16_t* x, int64_t rows, int64_t k, const uint16_t* w,
                         int64_t n, const float* bias, uint16_t* out) {
  const int64_t blocks = n / kBlock;
  auto store = [&](int64_t row, int64_t column, __m512 sums) {
    if (bias) sums = _mm512_add_ps(sums, _mm512_loadu_ps(bias + column));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + row * n + column),
                        (__m256i)_mm512_cvtneps_pbh(sums));
  };
#ifdef INHOUSE_AMX_BF16
  if (bf16_tiles::ready()) {
    linear_on_bf16_tiles({x, k, w}, rows, blocks, store);
    return;
  }
#endif
  inhouse::parallel_for(0, (blocks + 1) / 2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      if (2 * pair + 1 < blocks) {
        chain_rows<2>(x, k, w, rows, 2 * pair, store);
      } else {
        chain_rows<1>(x, k, w, rows, 2 * pair, store);
      }
    }
  });
}
#endif

}  // namespace

// A [n, k] bf16 weight (n a multiple of 16, k of 32) in the tiles' B layout:
// [n / 16, k / 32, 16, 16, 2], element (block, g, j, o, i) = weight[16 block + o, 32 g + 2j + i].
torch::Tensor pack_bf16(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kBFloat16,
              "a [out, in] bfloat16 weight");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(n % kBlock == 0 && k % kDepth == 0, "out a multiple of 16, in of 32");
  return weight.contiguous()
      .view({n / kBlock, kBlock, k / kDepth, kDepth / 2, 2})
      .permute({0, 2, 3, 1, 4})
      .contiguous();
}

// x [..., k] bf16 by a weight packed by pack_bf16 (n outputs), + bias (bf16 or float32):
// [..., n] bf16. Needs a unit (bf16_linear_unit).
torch::Tensor linear_bf16(const torch::Tensor& x, const torch::Tensor& packed,
                          const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(!bf16_linear_unit().empty(), "linear_bf16 needs AMX bf16 tiles or AVX-512 BF16");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && packed.scalar_type() == torch::kBFloat16,
              "bfloat16 activations and packed weight");
  TORCH_CHECK(packed.dim() == 5 && packed.size(3) == kDepth / 2, "a weight from pack_bf16");
  const int64_t k = packed.size(1) * kDepth, n = packed.size(0) * kBlock;
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
#ifdef INHOUSE_BF16_DOT
  linear_on_bf16_unit(reinterpret_cast<const uint16_t*>(rows_x.data_ptr()), rows, k,
                      reinterpret_cast<const uint16_t*>(packed.data_ptr()), n,
                      bias.has_value() ? bias_f.data_ptr<float>() : nullptr,
                      reinterpret_cast<uint16_t*>(out.data_ptr()));
#endif
  return out;
}

}  // namespace inhouse

TORCH_LIBRARY_FRAGMENT(inhouse_cpu, m) {
  m.def("bf16_linear_unit() -> str", &inhouse::bf16_linear_unit);
  m.def("pack_bf16(Tensor weight) -> Tensor", &inhouse::pack_bf16);
  m.def("linear_bf16(Tensor x, Tensor packed, Tensor? bias) -> Tensor", &inhouse::linear_bf16);
}
