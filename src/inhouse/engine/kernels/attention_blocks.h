// Attention's register blocks: a block of queries against a few keys (scores), and their
// weights against the values (weighted sums), for attention.cpp.
#pragma once

#include <cstdint>
#include <cstring>

#include "kv_rows.h"
#include "simd.h"

namespace inhouse {

// Attention's register blocks. Each query's score for a key is one fixed computation, with
// dim a multiple of 16: eight float lanes, lane l the FMA chain e_l over features 16c + l
// plus the chain o_l over 16c + 8 + l (c = 0, 1, ...); then b_l = e_l + o_l,
// c_l = b_l + b_(l+4), score = ((c0 + c2) + (c1 + c3)) * scale. Each output feature is one
// FMA chain over the keys in position order. Neither depends on which other queries or
// keys share a block, nor on the vector width (AVX-512 holds two keys' eight lanes in one
// register, and 16 features of a value), so blocking changes speed, never bits. A block is
// the query heads of a GQA group (and, in a prefill, neighbouring rows) meeting
// kKeysAtOnce keys, or kChunksAtOnce chunks of each value, loaded and converted once.
// AVX-512's 32 vector registers hold twice the queries of AVX2's 16.
#ifdef INHOUSE_AVX2
#ifdef INHOUSE_AVX512
constexpr int kQueriesAtOnce = 6;
constexpr int kKeysAtOnce = 4;
// Keys 2j and 2j + 1 share register j: their eight lanes in its two halves.
using KeyLanes = __m512;
constexpr int kKeyRegisters = kKeysAtOnce / 2;

// vhaddps within each 128-bit lane, as AVX's 256-bit hadd does in each of its two.
inline __m512 hadd16(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

// c_l = b_l + b_(l+4) of two keys, the first's in 128-bit lane 0 and the second's in lane 2.
inline __m512 fold_halves(__m512 even, __m512 odd) {
  const __m512 b = _mm512_add_ps(even, odd);
  return _mm512_add_ps(b, _mm512_shuffle_f32x4(b, b, _MM_SHUFFLE(2, 3, 0, 1)));
}

// Four keys' scores (before the scale) from their chains, keys 2j, 2j + 1 in even[j], odd[j].
inline __m128 key_scores(const __m512* even, const __m512* odd) {
  const __m512 c01 = fold_halves(even[0], odd[0]), c23 = fold_halves(even[1], odd[1]);
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(c01, c23, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(c01, c23, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 r = hadd16(s, s);  // lane 0: keys 0, 2; lane 2: keys 1, 3
  const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(order, r));
}
#else
constexpr int kQueriesAtOnce = 3;
constexpr int kKeysAtOnce = 2;
using KeyLanes = __m256;
constexpr int kKeyRegisters = kKeysAtOnce;

// Two keys' scores (before the scale), in lanes 0 and 4.
inline __m256 key_scores(const __m256* even, const __m256* odd) {
  const __m256 b0 = _mm256_add_ps(even[0], odd[0]), b1 = _mm256_add_ps(even[1], odd[1]);
  const __m256 c = _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20),
                                 _mm256_permute2f128_ps(b0, b1, 0x31));
  const __m256 s = _mm256_add_ps(c, _mm256_permute_ps(c, _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_add_ps(s, _mm256_movehdup_ps(s));
}
#endif
constexpr int kChunksAtOnce = 4;

// Eight features of key j (AVX2) or of keys 2j and 2j + 1 (AVX-512) from feature f.
template <typename T>
inline KeyLanes key_chunk(const T* const* k, int j, int64_t f) {
#ifdef INHOUSE_AVX512
  return load8x2(k[2 * j] + f, k[2 * j + 1] + f);
#else
  return load8(k[j] + f);
#endif
}

// Eight query features from f, for every key of a register.
inline KeyLanes query_chunk(const float* q, int64_t f) {
#ifdef INHOUSE_AVX512
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q + f))));
#else
  return _mm256_loadu_ps(q + f);
#endif
}

inline KeyLanes fma_lanes(KeyLanes a, KeyLanes b, KeyLanes c) {
#ifdef INHOUSE_AVX512
  return _mm512_fmadd_ps(a, b, c);
#else
  return _mm256_fmadd_ps(a, b, c);
#endif
}

// Cache rows asked for this many positions ahead of the one being read: a paged cache's
// rows sit in blocks at scattered addresses that the hardware's prefetchers cannot guess, and
// a decode row's keys come from memory, not cache (timing only; no result changes).
constexpr int64_t kRowsAhead = 16;

// scores[i][t] = (q[i] . keys[t]) * scale for Q queries and n keys, dim a multiple of 16;
// the keys' and values' rows are fetched kRowsAhead ahead (the values for weigh_values) when
// `fetch` (the first query block over these keys; the next ones find them in cache). An
// int8 cache's scores are then times their key's scale, and value_scales[t] is values[t]'s
// (read as the keys' are: after a fetch asked for kRowsAhead keys before).
template <typename T, int Q>
void score_block(const float* const* q, const T* const* keys, const T* const* values, int64_t n,
                 int64_t dim, float scale, float* const* scores, float* value_scales, bool fetch) {
  const int64_t row_bytes = row_width<T>(dim) * static_cast<int64_t>(sizeof(T));
  for (int64_t j = 0; fetch && j < std::min(n, kRowsAhead); ++j) {
    prefetch(keys[j], row_bytes);
    prefetch(values[j], row_bytes);
  }
  for (int64_t t = 0; t < n; t += kKeysAtOnce) {
    if (fetch) {
      for (int64_t j = t + kRowsAhead; j < std::min(n, t + kRowsAhead + kKeysAtOnce); ++j) {
        prefetch(keys[j], row_bytes);
        prefetch(values[j], row_bytes);
      }
    }
    const T* k[kKeysAtOnce];  // the last block repeats its last key; only n are stored
    INHOUSE_UNROLL for (int j = 0; j < kKeysAtOnce; ++j) k[j] = keys[std::min<int64_t>(t + j, n - 1)];
    KeyLanes even[Q][kKeyRegisters], odd[Q][kKeyRegisters];
    INHOUSE_UNROLL for (int i = 0; i < Q; ++i) {
      INHOUSE_UNROLL for (int j = 0; j < kKeyRegisters; ++j) even[i][j] = odd[i][j] = KeyLanes{};
    }
    for (int64_t f = 0; f < dim; f += 16) {
      KeyLanes ke[kKeyRegisters], ko[kKeyRegisters];
      INHOUSE_UNROLL for (int j = 0; j < kKeyRegisters; ++j) {
        ke[j] = key_chunk(k, j, f);
        ko[j] = key_chunk(k, j, f + 8);
      }
      INHOUSE_UNROLL for (int i = 0; i < Q; ++i) {
        const KeyLanes qe = query_chunk(q[i], f), qo = query_chunk(q[i], f + 8);
        INHOUSE_UNROLL for (int j = 0; j < kKeyRegisters; ++j) {
          even[i][j] = fma_lanes(qe, ke[j], even[i][j]);
          odd[i][j] = fma_lanes(qo, ko[j], odd[i][j]);
        }
      }
    }
    const int64_t stored = std::min<int64_t>(kKeysAtOnce, n - t);
    // An int8 cache's key scales, read now that the rows are fetched: the score times d.
    float d[kKeysAtOnce];
    if constexpr (kQ8Cache<T>) {
      INHOUSE_UNROLL for (int j = 0; j < kKeysAtOnce; ++j) d[j] = row_scale(k[j], dim);
      for (int64_t j = 0; j < stored; ++j) value_scales[t + j] = row_scale(values[t + j], dim);
    }
    INHOUSE_UNROLL for (int i = 0; i < Q; ++i) {
      float* out = scores[i] + t;
#ifdef INHOUSE_AVX512
      __m128 s = _mm_mul_ps(key_scores(even[i], odd[i]), _mm_set1_ps(scale));
      if constexpr (kQ8Cache<T>) s = _mm_mul_ps(s, _mm_loadu_ps(d));
      _mm_mask_storeu_ps(out, static_cast<__mmask8>((1u << stored) - 1), s);
#else
      __m256 s = _mm256_mul_ps(key_scores(even[i], odd[i]), _mm256_set1_ps(scale));
      if constexpr (kQ8Cache<T>) s = _mm256_mul_ps(s, _mm256_setr_ps(d[0], 0, 0, 0, d[1], 0, 0, 0));
      out[0] = _mm256_cvtss_f32(s);
      if (stored > 1) out[1] = _mm_cvtss_f32(_mm256_extractf128_ps(s, 1));
#endif
    }
  }
}

// out[i][from + f] = sum over t of p[i][t] * values[t][from + f], f < C chunks of the
// vector width: Q queries' sums in registers while the n values stream past once.
template <typename T, int Q, int C, typename Vec, Vec (*load)(const T*), Vec (*fma)(Vec, Vec, Vec)>
void weigh_block(const T* const* values, const float* const* p, int64_t n, int64_t from,
                 float* const* out) {
  constexpr int lanes = sizeof(Vec) / sizeof(float);
  Vec acc[Q][C];
  INHOUSE_UNROLL for (int i = 0; i < Q; ++i) {
    INHOUSE_UNROLL for (int c = 0; c < C; ++c) acc[i][c] = Vec{};
  }
  for (int64_t t = 0; t < n; ++t) {
    Vec w[Q];
    INHOUSE_UNROLL for (int i = 0; i < Q; ++i) {
      if constexpr (lanes == 8) {
        w[i] = _mm256_broadcast_ss(p[i] + t);
      } else {
        w[i] = _mm512_set1_ps(p[i][t]);
      }
    }
    INHOUSE_UNROLL for (int c = 0; c < C; ++c) {
      const Vec v = load(values[t] + from + lanes * c);
      INHOUSE_UNROLL for (int i = 0; i < Q; ++i) acc[i][c] = fma(w[i], v, acc[i][c]);
    }
  }
  INHOUSE_UNROLL for (int i = 0; i < Q; ++i) {
    INHOUSE_UNROLL for (int c = 0; c < C; ++c) {
      std::memcpy(out[i] + from + lanes * c, &acc[i][c], sizeof(Vec));
    }
  }
}

template <typename T, int Q>
void weigh_values(const T* const* values, const float* const* p, int64_t n, int64_t dim,
                  float* const* out) {
  int64_t from = 0;
#ifdef INHOUSE_AVX512
  for (; from + 16 * kChunksAtOnce <= dim; from += 16 * kChunksAtOnce) {
    weigh_block<T, Q, kChunksAtOnce, __m512, load16, fma16>(values, p, n, from, out);
  }
#endif
  for (; from + 8 * kChunksAtOnce <= dim; from += 8 * kChunksAtOnce) {
    weigh_block<T, Q, kChunksAtOnce, __m256, load8, fma8>(values, p, n, from, out);
  }
  for (; from < dim; from += 8) weigh_block<T, Q, 1, __m256, load8, fma8>(values, p, n, from, out);
}
#else
constexpr int kQueriesAtOnce = 1;
#endif

}  // namespace inhouse
