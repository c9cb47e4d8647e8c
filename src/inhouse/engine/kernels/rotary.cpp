// Rotary embedding of the queries and keys, and the keys and values stored in the paged
// cache, in one pass.

#include <c10/util/Half.h>
#include <torch/types.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "kv_rows.h"
#include "simd.h"
#include "work_pool.h"

namespace inhouse {
namespace {

#ifdef INHOUSE_AVX2
// Eight floats stored as T stores a float (static_cast: bfloat16 and float16 rounded to
// nearest even).
template <typename T>
inline void store_as(T* p, __m256 x) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    store8(p, round_bf16(x));
  } else {
    store8(p, x);
  }
}
#endif

// x rotated (HF's rotate-half) by cos c and sin s into out, dim values: in float32 sums of
// products; in bfloat16 (S) each product and the sum rounded, as HF's bf16 modules round.
template <typename S, typename T>
inline void rotate_half(const S* x, const S* c, const S* s, int64_t dim, T* out) {
  const int64_t half = dim / 2;
  if constexpr (std::is_same_v<S, float>) {
    int64_t i = 0;
#ifdef INHOUSE_AVX2
    for (; i + 8 <= half; i += 8) {  // each product and the sum rounded, as the loop below
      const __m256 x1 = load8(x + i), x2 = load8(x + i + half);
      const __m256 low = _mm256_sub_ps(_mm256_mul_ps(x1, load8(c + i)), _mm256_mul_ps(x2, load8(s + i)));
      const __m256 high = _mm256_add_ps(_mm256_mul_ps(x2, load8(c + i + half)),
                                        _mm256_mul_ps(x1, load8(s + i + half)));
      store_as(out + i, low);
      store_as(out + i + half, high);
    }
#endif
    for (; i < half; ++i) {
      out[i] = static_cast<T>(x[i] * c[i] - x[i + half] * s[i]);
      out[i + half] = static_cast<T>(x[i + half] * c[i + half] + x[i] * s[i + half]);
    }
  } else {
    int64_t i = 0;
#ifdef INHOUSE_AVX2
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (; i + 8 <= half; i += 8) {  // the same roundings, 8 at a time
      const __m256 x1 = load8(x + i), x2 = load8(x + i + half);
      const __m256 low = _mm256_add_ps(round_bf16(_mm256_mul_ps(x1, load8(c + i))),
                                       round_bf16(_mm256_mul_ps(_mm256_xor_ps(x2, sign), load8(s + i))));
      const __m256 high = _mm256_add_ps(round_bf16(_mm256_mul_ps(x2, load8(c + i + half))),
                                        round_bf16(_mm256_mul_ps(x1, load8(s + i + half))));
      store8(out + i, round_bf16(low));
      store8(out + i + half, round_bf16(high));
    }
#endif
    const auto f = [](S v) { return static_cast<float>(v); };
    const auto rounded = [&](S a, S b, S d, S e) {  // bf16(bf16(a b) + bf16(d e))
      return static_cast<float>(S(f(S(f(a) * f(b))) + f(S(f(d) * f(e)))));
    };
    for (; i < half; ++i) {
      out[i] = static_cast<T>(rounded(x[i], c[i], S(-f(x[i + half])), s[i]));
      out[i + half] = static_cast<T>(rounded(x[i + half], c[i + half], x[i], s[i + half]));
    }
  }
}

template <typename S, typename T>
void rope_write_kv_impl(const S* src, const S* cp, const S* sp, const int64_t* slot,
                        int64_t tokens, int64_t heads, int64_t kv_heads, int64_t dim, S* qp,
                        T* kp, T* vp) {
  const int64_t width = heads + 2 * kv_heads, row = row_width<T>(dim);
  inhouse::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> rotated(kQ8Cache<T> ? dim : 0), values(kQ8Cache<T> ? dim : 0);
    for (int64_t t = begin; t < end; ++t) {
      const S* c = cp + t * dim;
      const S* s = sp + t * dim;
      const S* x = src + t * width * dim;
      for (int64_t h = 0; h < heads; ++h) {
        rotate_half(x + h * dim, c, s, dim, qp + (t * heads + h) * dim);
      }
      T* k = kp + slot[t] * kv_heads * row;
      T* v_out = vp + slot[t] * kv_heads * row;
      const S* v = x + (heads + kv_heads) * dim;
      for (int64_t h = 0; h < kv_heads; ++h) {
        if constexpr (kQ8Cache<T>) {
          rotate_half(x + (heads + h) * dim, c, s, dim, rotated.data());
          store_q8_row(rotated.data(), dim, k + h * row);
          for (int64_t i = 0; i < dim; ++i) values[i] = static_cast<float>(v[h * dim + i]);
          store_q8_row(values.data(), dim, v_out + h * row);
        } else {
          rotate_half(x + (heads + h) * dim, c, s, dim, k + h * dim);
          int64_t i = 0;
#ifdef INHOUSE_AVX2
          for (; i + 8 <= dim; i += 8) store_as(v_out + h * dim + i, load8(v + h * dim + i));
#endif
          for (; i < dim; ++i) {
            v_out[h * dim + i] = static_cast<T>(static_cast<float>(v[h * dim + i]));
          }
        }
      }
    }
  });
}

// The pass for activations S into a cache of the cache tensors' type.
template <typename S>
void rope_into_cache(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                     torch::Tensor& k_cache, torch::Tensor& v_cache, const int64_t* slot,
                     int64_t heads, torch::Tensor& q) {
  const int64_t tokens = qkv.size(0), dim = qkv.size(2), kv_heads = k_cache.size(1);
  const auto run = [&](auto* k, auto* v) {
    rope_write_kv_impl(qkv.data_ptr<S>(), cos.data_ptr<S>(), sin.data_ptr<S>(), slot, tokens,
                       heads, kv_heads, dim, q.data_ptr<S>(), k, v);
  };
  switch (k_cache.scalar_type()) {
    case torch::kChar: return run(k_cache.data_ptr<int8_t>(), v_cache.data_ptr<int8_t>());
    case torch::kHalf: return run(k_cache.data_ptr<c10::Half>(), v_cache.data_ptr<c10::Half>());
    case torch::kBFloat16:
      return run(k_cache.data_ptr<c10::BFloat16>(), v_cache.data_ptr<c10::BFloat16>());
    default: return run(k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
  }
}

}  // namespace

// Rotary embedding (HF's rotate-half) of q and k, and K/V stored at their cache slots, in
// one pass. qkv [T, H + 2 KVH, D] as the fused projection gives it, float32 or bfloat16, and
// cos/sin [T, D] of its type; caches [slots, KVH, D], float32, float16 or bfloat16 (rounded
// to nearest, as torch's cast), or [slots, KVH, D + 4] int8 rows (store_q8_row). Returns
// the rotated queries [T, H, D] in qkv's type.
torch::Tensor rope_write_kv(const torch::Tensor& qkv, const torch::Tensor& cos,
                            const torch::Tensor& sin, torch::Tensor k_cache, torch::Tensor v_cache,
                            const torch::Tensor& slots, int64_t heads) {
  TORCH_CHECK(qkv.is_contiguous() && cos.is_contiguous() && sin.is_contiguous() &&
              k_cache.is_contiguous() && v_cache.is_contiguous());
  const auto type = qkv.scalar_type(), cache_type = k_cache.scalar_type();
  TORCH_CHECK((type == torch::kFloat32 || type == torch::kBFloat16) &&
                  cos.scalar_type() == type && sin.scalar_type() == type,
              "float32 or bfloat16 qkv, cos and sin of its type");
  TORCH_CHECK(v_cache.scalar_type() == cache_type &&
                  (cache_type == torch::kFloat32 || cache_type == torch::kHalf ||
                   cache_type == torch::kBFloat16 || cache_type == torch::kChar),
              "a float32, float16, bfloat16 or int8 cache");
  const int64_t tokens = qkv.size(0), dim = qkv.size(2);
  TORCH_CHECK(k_cache.size(2) == (cache_type == torch::kChar ? dim + kQ8Scale : dim) &&
                  v_cache.sizes() == k_cache.sizes(),
              "cache rows of the head dim (int8: and a scale)");
  auto q = torch::empty({tokens, heads, dim}, qkv.options());
  auto slot_list = slots.contiguous();
  const int64_t* slot = slot_list.data_ptr<int64_t>();
  if (type == torch::kFloat32) {
    rope_into_cache<float>(qkv, cos, sin, k_cache, v_cache, slot, heads, q);
  } else {
    rope_into_cache<c10::BFloat16>(qkv, cos, sin, k_cache, v_cache, slot, heads, q);
  }
  return q;
}

}  // namespace inhouse
