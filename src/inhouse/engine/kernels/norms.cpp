// The residual stream's update fused with the next RMSNorm.

#include <torch/types.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

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

// One token: residual += delta (when given), then the norm into out. In bfloat16 each step
// rounds where HF's bf16 modules round: the add, the normalized value, its product by
// the weight; the mean square is taken in float32 from the rounded residual.
template <typename T>
inline void add_norm_token(T* r, const T* d, const T* w, T* o, int64_t dim, float epsilon,
                           float* scratch) {
  for (int64_t i = 0; i < dim; ++i) {
    if (d) r[i] = static_cast<T>(static_cast<float>(r[i]) + static_cast<float>(d[i]));
    scratch[i] = static_cast<float>(r[i]);
  }
  const float inv = 1.f / std::sqrt(sum_of_squares(scratch, dim) / static_cast<float>(dim) + epsilon);
  for (int64_t i = 0; i < dim; ++i) {
    const T normed = static_cast<T>(scratch[i] * inv);
    o[i] = static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(normed));
  }
}

inline void add_norm_token(float* r, const float* d, const float* w, float* o, int64_t dim,
                           float epsilon, float*) {
  if (d) {
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) r[i] += d[i];
  }
  const float inv = 1.f / std::sqrt(sum_of_squares(r, dim) / static_cast<float>(dim) + epsilon);
#pragma omp simd
  for (int64_t i = 0; i < dim; ++i) o[i] = w[i] * (r[i] * inv);
}

template <typename T>
void add_rms_norm_rows(torch::Tensor& residual, const torch::Tensor& added,
                       const torch::Tensor& weight, torch::Tensor& out, float epsilon) {
  const int64_t dim = residual.size(-1), tokens = residual.numel() / dim;
  T* rp = residual.data_ptr<T>();
  const T* dp = added.defined() ? added.data_ptr<T>() : nullptr;
  const T* wp = weight.data_ptr<T>();
  T* op = out.data_ptr<T>();
  inhouse::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(std::is_same_v<T, float> ? 0 : dim);
    for (int64_t t = begin; t < end; ++t) {
      add_norm_token(rp + t * dim, dp ? dp + t * dim : nullptr, wp, op + t * dim, dim, epsilon,
                     scratch.data());
    }
  });
}

}  // namespace

// The residual stream's update and the next RMSNorm in one pass over each token:
// residual += delta (in place; no delta for the first layer), then
// out = residual / sqrt(mean(residual^2) + eps) * weight, in HF's order of operations,
// float32 or bfloat16 (residual, delta and weight alike).
torch::Tensor add_rms_norm(torch::Tensor residual, const c10::optional<torch::Tensor>& delta,
                           const torch::Tensor& weight, double eps) {
  const auto type = residual.scalar_type();
  TORCH_CHECK(residual.is_contiguous() && weight.is_contiguous() && weight.scalar_type() == type &&
                  (type == torch::kFloat32 || type == torch::kBFloat16),
              "a contiguous float32 or bfloat16 residual and weight");
  TORCH_CHECK(weight.numel() == residual.size(-1), "one weight per feature");
  torch::Tensor added;
  if (delta.has_value()) {
    added = delta->contiguous();
    TORCH_CHECK(added.sizes() == residual.sizes() && added.scalar_type() == type);
  }
  auto out = torch::empty_like(residual);
  const float epsilon = static_cast<float>(eps);
  if (type == torch::kFloat32) {
    add_rms_norm_rows<float>(residual, added, weight, out, epsilon);
  } else {
    add_rms_norm_rows<c10::BFloat16>(residual, added, weight, out, epsilon);
  }
  return out;
}

}  // namespace inhouse
