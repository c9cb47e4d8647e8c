// A paged KV cache's rows, as the attention reads them and the rotary pass writes them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace inhouse {

// KV cache rows are float32, float16, bfloat16 or int8 (LoadedModel.kv_dtype); the
// arithmetic is float32 either way. An int8 row (one token's K or V of one KV head) is its
// dim codes q in [-127, 127], then its float scale d (4 bytes, unaligned): x = d * q, as
// vLLM's int8_per_token_head. Attention multiplies a key's score by its d, and a value's
// weight by its d, after summing the codes' products, so each row's bits stay its own.
constexpr int64_t kQ8Scale = sizeof(float);

template <typename T>
constexpr bool kQ8Cache = std::is_same_v<T, int8_t>;

// Elements of T one KV head's cache row takes.
template <typename T>
constexpr int64_t row_width(int64_t dim) {
  return kQ8Cache<T> ? dim + kQ8Scale : dim;
}

// An int8 row's scale, after its codes.
inline float row_scale(const int8_t* row, int64_t dim) {
  float d;
  std::memcpy(&d, row + dim, sizeof d);
  return d;
}

// x (dim floats) as an int8 row: d = max|x| / 127, q = round(x / d) (0 for an all-zero x).
inline void store_q8_row(const float* x, int64_t dim, int8_t* out) {
  float top = 0.f;
  for (int64_t f = 0; f < dim; ++f) top = std::max(top, std::fabs(x[f]));
  const float d = top / 127.f;
  for (int64_t f = 0; f < dim; ++f) {
    const float code = d > 0.f ? std::nearbyint(x[f] / d) : 0.f;
    out[f] = static_cast<int8_t>(std::clamp(code, -127.f, 127.f));
  }
  std::memcpy(out + dim, &d, sizeof d);
}

}  // namespace inhouse
