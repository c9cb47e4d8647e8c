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
// Weights are packed once (pack_bf16) in the tiles' B layout; the pass is bf16_tiles.h's,
// two blocks of outputs a thread's unit of work. For a decode the weights' bytes decide the
// speed (the products are ~2 ms of tile time a token for a 135M model on one core).

#include <torch/library.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "bf16_tiles.h"
#include "work_pool.h"

namespace inhouse {
namespace {

using bf16_tiles::kBlock;
using bf16_tiles::kDepth;

#ifdef INHOUSE_AMX_BF16
// x [rows, k] by the packed weight into out [rows, n] bf16: each row's sums plus the bias
// (float32) rounded to bf16 once.
void linear_on_bf16_tiles(const bf16_tiles::Pass& pass, int64_t rows, int64_t n,
                          const float* bias, uint16_t* out) {
  const int64_t blocks = n / kBlock;
  const std::vector<uint16_t> tail = bf16_tiles::tail_tile(pass.x, rows, pass.k);
  auto store = [&](int64_t row, int64_t column, __m512 sums) {
    if (bias) sums = _mm512_add_ps(sums, _mm512_loadu_ps(bias + column));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + row * n + column),
                        (__m256i)_mm512_cvtneps_pbh(sums));
  };
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

bool bf16_linear_ready() { return bf16_tiles::ready(); }

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
// [..., n] bf16. Needs the tiles (bf16_linear_ready).
torch::Tensor linear_bf16(const torch::Tensor& x, const torch::Tensor& packed,
                          const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(bf16_tiles::ready(), "linear_bf16 needs AMX bf16 tiles granted to this process");
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
#ifdef INHOUSE_AMX_BF16
  const bf16_tiles::Pass pass{reinterpret_cast<const uint16_t*>(rows_x.data_ptr()), k,
                              reinterpret_cast<const uint16_t*>(packed.data_ptr())};
  linear_on_bf16_tiles(pass, rows, n, bias.has_value() ? bias_f.data_ptr<float>() : nullptr,
                       reinterpret_cast<uint16_t*>(out.data_ptr()));
#endif
  return out;
}

}  // namespace inhouse

TORCH_LIBRARY_FRAGMENT(inhouse_cpu, m) {
  m.def("bf16_linear_ready() -> bool", &inhouse::bf16_linear_ready);
  m.def("pack_bf16(Tensor weight) -> Tensor", &inhouse::pack_bf16);
  m.def("linear_bf16(Tensor x, Tensor packed, Tensor? bias) -> Tensor", &inhouse::linear_bf16);
}
