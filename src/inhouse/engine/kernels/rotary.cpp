// Rotary embedding of the queries and keys, and the keys and values stored in the paged
// cache, in one pass.

#include <c10/util/Half.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "kernels.h"
#include "kv_rows.h"
#include "work_pool.h"

namespace inhouse {
namespace {

// x rotated (HF's rotate-half) by cos c and sin s into out, dim values.
template <typename T>
inline void rotate_half(const float* x, const float* c, const float* s, int64_t dim, T* out) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    out[i] = static_cast<T>(x[i] * c[i] - x[i + half] * s[i]);
    out[i + half] = static_cast<T>(x[i + half] * c[i + half] + x[i] * s[i + half]);
  }
}

template <typename T>
void rope_write_kv_impl(const float* src, const float* cp, const float* sp, const int64_t* slot,
                        int64_t tokens, int64_t heads, int64_t kv_heads, int64_t dim, float* qp,
                        T* kp, T* vp) {
  const int64_t width = heads + 2 * kv_heads, row = row_width<T>(dim);
  inhouse::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> rotated(kQ8Cache<T> ? dim : 0);
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cp + t * dim;
      const float* s = sp + t * dim;
      const float* x = src + t * width * dim;
      for (int64_t h = 0; h < heads; ++h) {
        rotate_half(x + h * dim, c, s, dim, qp + (t * heads + h) * dim);
      }
      T* k = kp + slot[t] * kv_heads * row;
      T* v_out = vp + slot[t] * kv_heads * row;
      const float* v = x + (heads + kv_heads) * dim;
      for (int64_t h = 0; h < kv_heads; ++h) {
        if constexpr (kQ8Cache<T>) {
          rotate_half(x + (heads + h) * dim, c, s, dim, rotated.data());
          store_q8_row(rotated.data(), dim, k + h * row);
          store_q8_row(v + h * dim, dim, v_out + h * row);
        } else {
          rotate_half(x + (heads + h) * dim, c, s, dim, k + h * dim);
          for (int64_t i = 0; i < dim; ++i) v_out[h * dim + i] = static_cast<T>(v[h * dim + i]);
        }
      }
    }
  });
}

}  // namespace

// Rotary embedding (HF's rotate-half) of q and k, and K/V stored at their cache slots, in
// one pass. qkv [T, H + 2 KVH, D] as the fused projection gives it; cos/sin [T, D];
// caches [slots, KVH, D], float32 or float16 (rounded to nearest, as torch's cast), or
// [slots, KVH, D + 4] int8 rows (store_q8_row). Returns the rotated queries [T, H, D].
torch::Tensor rope_write_kv(const torch::Tensor& qkv, const torch::Tensor& cos,
                            const torch::Tensor& sin, torch::Tensor k_cache, torch::Tensor v_cache,
                            const torch::Tensor& slots, int64_t heads) {
  TORCH_CHECK(qkv.is_contiguous() && cos.is_contiguous() && sin.is_contiguous() &&
              k_cache.is_contiguous() && v_cache.is_contiguous());
  const auto cache_type = k_cache.scalar_type();
  TORCH_CHECK(v_cache.scalar_type() == cache_type &&
                  (cache_type == torch::kFloat32 || cache_type == torch::kHalf ||
                   cache_type == torch::kChar),
              "a float32, float16 or int8 cache");
  const int64_t tokens = qkv.size(0), dim = qkv.size(2), kv_heads = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == (cache_type == torch::kChar ? dim + kQ8Scale : dim) &&
                  v_cache.sizes() == k_cache.sizes(),
              "cache rows of the head dim (int8: and a scale)");
  auto q = torch::empty({tokens, heads, dim}, qkv.options());
  auto slot_list = slots.contiguous();
  const float* src = qkv.data_ptr<float>();
  const int64_t* slot = slot_list.data_ptr<int64_t>();
  if (cache_type == torch::kChar) {
    rope_write_kv_impl(src, cos.data_ptr<float>(), sin.data_ptr<float>(), slot, tokens, heads,
                       kv_heads, dim, q.data_ptr<float>(), k_cache.data_ptr<int8_t>(),
                       v_cache.data_ptr<int8_t>());
  } else if (cache_type == torch::kHalf) {
    rope_write_kv_impl(src, cos.data_ptr<float>(), sin.data_ptr<float>(), slot, tokens, heads,
                       kv_heads, dim, q.data_ptr<float>(), k_cache.data_ptr<c10::Half>(),
                       v_cache.data_ptr<c10::Half>());
  } else {
    rope_write_kv_impl(src, cos.data_ptr<float>(), sin.data_ptr<float>(), slot, tokens, heads,
                       kv_heads, dim, q.data_ptr<float>(), k_cache.data_ptr<float>(),
                       v_cache.data_ptr<float>());
  }
  return q;
}

}  // namespace inhouse
