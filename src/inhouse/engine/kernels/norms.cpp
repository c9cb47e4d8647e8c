// The residual stream's update fused with the next RMSNorm.

#include <torch/types.h>

#include <cmath>
#include <cstdint>

#include "kernels.h"
#include "simd.h"
#include "work_pool.h"

namespace inhouse {
namespace {

// x[0]^2 + ... + x[dim - 1]^2 as eight FMA chains (feature i on chain i % 8) folded in a
// fixed order: the same bits from AVX2 and AVX-512 code (an omp simd reduction's order is
// the vector width's, and the two builds' norms differed in the last bit).
inline float sum_of_squares(const float* x, int64_t dim) {
  float c[8] = {};
  int64_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    INHOUSE_UNROLL for (int l = 0; l < 8; ++l) c[l] = std::fma(x[i + l], x[i + l], c[l]);
  }
  for (; i < dim; ++i) c[i % 8] = std::fma(x[i], x[i], c[i % 8]);
  return ((c[0] + c[4]) + (c[2] + c[6])) + ((c[1] + c[5]) + (c[3] + c[7]));
}

}  // namespace

// The residual stream's update and the next RMSNorm in one pass over each token:
// residual += delta (in place; no delta for the first layer), then
// out = residual / sqrt(mean(residual^2) + eps) * weight, in HF's order of operations.
torch::Tensor add_rms_norm(torch::Tensor residual, const c10::optional<torch::Tensor>& delta,
                           const torch::Tensor& weight, double eps) {
  TORCH_CHECK(residual.is_contiguous() && weight.is_contiguous() &&
              residual.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32);
  const int64_t dim = residual.size(-1), tokens = residual.numel() / dim;
  TORCH_CHECK(weight.numel() == dim, "one weight per feature");
  torch::Tensor added;
  if (delta.has_value()) {
    added = delta->contiguous();
    TORCH_CHECK(added.sizes() == residual.sizes() && added.scalar_type() == torch::kFloat32);
  }
  auto out = torch::empty_like(residual);
  float* rp = residual.data_ptr<float>();
  const float* dp = added.defined() ? added.data_ptr<float>() : nullptr;
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float epsilon = static_cast<float>(eps);
  inhouse::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* r = rp + t * dim;
      if (dp) {
        const float* d = dp + t * dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i) r[i] += d[i];
      }
      const float inv = 1.f / std::sqrt(sum_of_squares(r, dim) / static_cast<float>(dim) + epsilon);
      float* o = op + t * dim;
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) o[i] = wp[i] * (r[i] * inv);
    }
  });
  return out;
}

}  // namespace inhouse
