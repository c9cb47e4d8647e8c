// LoRA adapters' low-rank products, added to a projection's output row by row.

#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels.h"
#include "simd.h"
#include "work_pool.h"

namespace inhouse {
namespace {

inline float as_float(float v) { return v; }
inline float as_float(c10::BFloat16 v) { return static_cast<float>(v); }

// low[0:used] = x[0:in] @ a_t[:, 0:used] (a_t's rows `rank` apart, `used` a multiple of 8
// within it): each lane sums over the input in order, with fused multiply-adds.
template <typename T>
void low_rank(const T* x, const float* a_t, int64_t in, int64_t rank, int64_t used, float* low) {
  for (int64_t k0 = 0; k0 < used; k0 += 32) {
    const int64_t lanes = std::min<int64_t>(32, used - k0);
#ifdef INHOUSE_AVX2
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < in; ++i) {
      const __m256 xi = _mm256_set1_ps(as_float(x[i]));
      const float* a = a_t + i * rank + k0;
      for (int64_t j = 0; j < lanes / 8; ++j) acc[j] = _mm256_fmadd_ps(xi, _mm256_loadu_ps(a + 8 * j), acc[j]);
    }
    for (int64_t j = 0; j < lanes / 8; ++j) _mm256_storeu_ps(low + k0 + 8 * j, acc[j]);
#else
    float acc[32] = {};
    for (int64_t i = 0; i < in; ++i) {
      const float xi = as_float(x[i]);
      for (int64_t k = 0; k < lanes; ++k) acc[k] = std::fma(xi, a_t[i * rank + k0 + k], acc[k]);
    }
    for (int64_t k = 0; k < lanes; ++k) low[k0 + k] = acc[k];
#endif
  }
}

constexpr int64_t kAdapterRows = 4;  // rows of one adapter sharing each load of B

// out_r[0:width] = round(out_r + (low_r[0:used] @ b_t) * scale) for `count` rows of one
// adapter (lows `rank` apart): each lane sums over the rank in order with fused
// multiply-adds, then is scaled, then added, as PEFT orders it. A block of rows shares each
// load of B; a row's sums are the same whatever block it is in.
template <typename T>
void add_products(T* const* outs, const float* lows, int64_t count, int64_t rank,
                  const float* b_t, const float* scale, int64_t used, int64_t width) {
  int64_t o = 0;
#ifdef INHOUSE_AVX2
  for (; o + 16 <= width; o += 16) {
    __m256 acc[kAdapterRows][2];
    for (int64_t r = 0; r < count; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < used; ++k) {
      const __m256 b0 = _mm256_loadu_ps(b_t + k * width + o);
      const __m256 b1 = _mm256_loadu_ps(b_t + k * width + o + 8);
      for (int64_t r = 0; r < count; ++r) {
        const __m256 l = _mm256_set1_ps(lows[r * rank + k]);
        acc[r][0] = _mm256_fmadd_ps(l, b0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(l, b1, acc[r][1]);
      }
    }
    for (int64_t r = 0; r < count; ++r) {
      alignas(32) float delta[16];
      _mm256_store_ps(delta, _mm256_mul_ps(acc[r][0], _mm256_loadu_ps(scale + o)));
      _mm256_store_ps(delta + 8, _mm256_mul_ps(acc[r][1], _mm256_loadu_ps(scale + o + 8)));
      for (int l = 0; l < 16; ++l) outs[r][o + l] = static_cast<T>(as_float(outs[r][o + l]) + delta[l]);
    }
  }
#endif
  for (; o < width; ++o) {
    for (int64_t r = 0; r < count; ++r) {
      float acc = 0.f;
      for (int64_t k = 0; k < used; ++k) acc = std::fma(lows[r * rank + k], b_t[k * width + o], acc);
      const float delta = acc * scale[o];
      outs[r][o] = static_cast<T>(as_float(outs[r][o]) + delta);
    }
  }
}

template <typename T>
void add_rows(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& row_slots,
              const torch::Tensor& a_t, const torch::Tensor& b_t, const torch::Tensor& scale,
              const torch::Tensor& used) {
  const int64_t rows = x.size(0), in = x.size(1), rank = a_t.size(2), width = out.size(1);
  const int64_t* slot_of = row_slots.data_ptr<int64_t>();
  const int64_t* used_of = used.data_ptr<int64_t>();
  // blocks of up to kAdapterRows rows of one adapter, adapter by adapter
  std::vector<int64_t> adapted;
  for (int64_t r = 0; r < rows; ++r)
    if (slot_of[r] >= 0) adapted.push_back(r);
  std::stable_sort(adapted.begin(), adapted.end(),
                   [&](int64_t a, int64_t b) { return slot_of[a] < slot_of[b]; });
  std::vector<std::pair<int64_t, int64_t>> blocks;  // [begin, end) in `adapted`
  for (size_t i = 0; i < adapted.size();) {
    size_t j = i + 1;
    while (j < adapted.size() && j - i < kAdapterRows && slot_of[adapted[j]] == slot_of[adapted[i]]) ++j;
    blocks.emplace_back(i, j);
    i = j;
  }
  T* o = out.data_ptr<T>();
  const T* xs = x.data_ptr<T>();
  const float *a = a_t.data_ptr<float>(), *b = b_t.data_ptr<float>(), *s = scale.data_ptr<float>();
  inhouse::parallel_for(0, static_cast<int64_t>(blocks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> lows(kAdapterRows * rank);
    T* outs[kAdapterRows];
    for (int64_t bi = begin; bi < end; ++bi) {
      const auto [first, last] = blocks[bi];
      const int64_t slot = slot_of[adapted[first]], n = used_of[slot];
      for (int64_t i = first; i < last; ++i) {
        const int64_t r = adapted[i];
        low_rank(xs + r * in, a + slot * in * rank, in, rank, n, lows.data() + (i - first) * rank);
        outs[i - first] = o + r * width;
      }
      add_products(outs, lows.data(), last - first, rank, b + slot * rank * width,
                   s + slot * width, n, width);
    }
  });
}

}  // namespace

// Adds each row's adapter product to ``out [T, width]`` from ``x [T, in]`` (both float32, or
// both bfloat16): ``row_slots [T]`` is each row's adapter slot (-1: the base, untouched);
// per slot, ``a_t [S, in, rank]``, ``b_t [S, rank, width]``, ``scale [S, width]`` (float32,
// as PEFT computes an adapter beside a 16-bit base) and ``used [S]``, the rank columns in use
// (a multiple of 8). A row's bits depend on nothing but its own inputs and slot.
void lora_add(torch::Tensor out, const torch::Tensor& x, const torch::Tensor& row_slots,
              const torch::Tensor& a_t, const torch::Tensor& b_t, const torch::Tensor& scale,
              const torch::Tensor& used) {
  TORCH_CHECK(out.is_contiguous() && x.is_contiguous() && a_t.is_contiguous() &&
              b_t.is_contiguous() && scale.is_contiguous() && row_slots.is_contiguous() &&
              used.is_contiguous());
  TORCH_CHECK(out.scalar_type() == x.scalar_type() && row_slots.scalar_type() == torch::kInt64 &&
              used.scalar_type() == torch::kInt64);
  TORCH_CHECK(a_t.scalar_type() == torch::kFloat32 && b_t.scalar_type() == torch::kFloat32 &&
              scale.scalar_type() == torch::kFloat32);
  TORCH_CHECK(out.dim() == 2 && x.dim() == 2 && x.size(0) == out.size(0) &&
              row_slots.size(0) == x.size(0) && a_t.size(1) == x.size(1) &&
              b_t.size(1) == a_t.size(2) && b_t.size(2) == out.size(1) &&
              scale.size(1) == out.size(1) && a_t.size(2) % 8 == 0 &&
              used.size(0) == a_t.size(0));
  if (out.scalar_type() == torch::kFloat32) {
    add_rows<float>(out, x, row_slots, a_t, b_t, scale, used);
  } else {
    TORCH_CHECK(out.scalar_type() == torch::kBFloat16, "lora_add: float32 or bfloat16 rows");
    add_rows<c10::BFloat16>(out, x, row_slots, a_t, b_t, scale, used);
  }
}

}  // namespace inhouse
