// LoRA adapters' low-rank products, added to a projection's output row by row.

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "kernels.h"
#include "work_pool.h"

namespace inhouse {
namespace {

inline float as_float(float v) { return v; }
inline float as_float(c10::BFloat16 v) { return static_cast<float>(v); }

// out[r] = round(out[r] + (x[r] @ a_t @ b_t) * scale) for one row, in float32: the rank's
// sums over the input in order, then the output's sums over the rank in order, each an
// axpy the compiler vectorizes across lanes, never across the sum, so a row's bits do not
// depend on the batch or on how the rows are split.
template <typename T>
void add_row(T* out, const T* x, const float* a_t, const float* b_t, const float* scale,
             int64_t in, int64_t rank, int64_t width, float* low, float* delta) {
  for (int64_t k = 0; k < rank; ++k) low[k] = 0.f;
  for (int64_t i = 0; i < in; ++i) {
    const float xi = as_float(x[i]);
    const float* a = a_t + i * rank;
    for (int64_t k = 0; k < rank; ++k) low[k] += xi * a[k];
  }
  for (int64_t o = 0; o < width; ++o) delta[o] = 0.f;
  for (int64_t k = 0; k < rank; ++k) {
    const float lk = low[k];
    if (lk == 0.f) continue;  // a padded rank (its A rows are zero) adds nothing
    const float* b = b_t + k * width;
    for (int64_t o = 0; o < width; ++o) delta[o] += lk * b[o];
  }
  for (int64_t o = 0; o < width; ++o) out[o] = static_cast<T>(as_float(out[o]) + delta[o] * scale[o]);
}

template <typename T>
void add_rows(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& rows,
              const torch::Tensor& a_t, const torch::Tensor& b_t, const torch::Tensor& scale) {
  const int64_t in = x.size(1), rank = a_t.size(1), width = out.size(1);
  const int64_t* row = rows.data_ptr<int64_t>();
  T* o = out.data_ptr<T>();
  const T* xs = x.data_ptr<T>();
  const float *a = a_t.data_ptr<float>(), *b = b_t.data_ptr<float>(), *s = scale.data_ptr<float>();
  inhouse::parallel_for(0, rows.size(0), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> low(rank), delta(width);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = row[i];
      add_row(o + r * width, xs + r * in, a, b, s, in, rank, width, low.data(), delta.data());
    }
  });
}

}  // namespace

// Adds one adapter's product to the rows ``rows`` of ``out [T, width]`` from ``x [T, in]``
// (both float32, or both bfloat16): ``a_t [in, rank]``, ``b_t [rank, width]`` and ``scale
// [width]`` are float32, as PEFT computes an adapter beside a 16-bit base.
void lora_add(torch::Tensor out, const torch::Tensor& x, const torch::Tensor& rows,
              const torch::Tensor& a_t, const torch::Tensor& b_t, const torch::Tensor& scale) {
  TORCH_CHECK(out.is_contiguous() && x.is_contiguous() && a_t.is_contiguous() &&
              b_t.is_contiguous() && scale.is_contiguous() && rows.is_contiguous());
  TORCH_CHECK(out.scalar_type() == x.scalar_type() && rows.scalar_type() == torch::kInt64);
  TORCH_CHECK(a_t.scalar_type() == torch::kFloat32 && b_t.scalar_type() == torch::kFloat32 &&
              scale.scalar_type() == torch::kFloat32);
  TORCH_CHECK(x.size(0) == out.size(0) && a_t.size(0) == x.size(1) && b_t.size(0) == a_t.size(1) &&
              b_t.size(1) == out.size(1) && scale.size(0) == out.size(1));
  if (out.scalar_type() == torch::kFloat32) {
    add_rows<float>(out, x, rows, a_t, b_t, scale);
  } else {
    TORCH_CHECK(out.scalar_type() == torch::kBFloat16, "lora_add: float32 or bfloat16 rows");
    add_rows<c10::BFloat16>(out, x, rows, a_t, b_t, scale);
  }
}

}  // namespace inhouse
