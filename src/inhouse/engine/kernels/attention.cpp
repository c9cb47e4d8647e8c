// Paged attention of query rows straight from the KV cache (float32, float16, bfloat16 or
// int8 rows, see kv_rows.h), for decodes and prefills alike: segments of positions, folded
// in position order, over attention_blocks.h's register blocks.

#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "attention_blocks.h"
#include "attention_tiles.h"
#include "kernels.h"
#include "kv_rows.h"
#include "simd.h"
#include "work_pool.h"

namespace inhouse {
namespace {

// scores[t] = e^(scores[t] - top) for t < n; returns their sum. Eight at a time where the
// CPU has AVX2, the last n % 8 one by one: a function of n alone, as the row's keys are.
inline float exp_and_sum(float* scores, int64_t n, float top) {
  int64_t t = 0;
  float total = 0.f;
#ifdef INHOUSE_AVX2
  __m256 sums = _mm256_setzero_ps();
  const __m256 top8 = _mm256_set1_ps(top);
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + t), top8));
    _mm256_storeu_ps(scores + t, e);
    sums = _mm256_add_ps(sums, e);
  }
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1));
  half = _mm_add_ps(half, _mm_movehl_ps(half, half));
  total = _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
#endif
  for (; t < n; ++t) total += (scores[t] = std::exp(scores[t] - top));
  return total;
}

// Each query row's keys fall into segments of kSegment positions, aligned to absolute
// positions (0, 256, 512, ...), so where a segment starts depends on the position alone, never
// on the batch, the chunking or the threads. A segment gives each query its own (top, total,
// unnormalized weighted sum); the row's output folds its segments in position order
// (fold_segment) and divides once by the total. Segments of one decode row run on different
// threads (flash-decoding's split) and are folded after; a prefill tile folds them as it goes:
// the same operations in the same order either way.
constexpr int64_t kSegment = 256;

// e^(s - top) for the query's own scores s[from .. from + count - 1], top their max; returns
// {top, their sum}. Every other score of the block becomes 0, which adds nothing to the
// weighted sum's chains: a query's bits are its own keys' alone. No keys: {-inf, 0}.
inline std::pair<float, float> exp_segment(float* s, int64_t n, int64_t from, int64_t count) {
  float* own = s + from;
  float top = -INFINITY;
  int64_t t = 0;
#ifdef INHOUSE_AVX2
  __m256 tops = _mm256_set1_ps(-INFINITY);  // a max is the same in any order
  for (; t + 8 <= count; t += 8) tops = _mm256_max_ps(tops, _mm256_loadu_ps(own + t));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, tops);
  for (const float lane : lanes) top = std::max(top, lane);
#endif
  for (; t < count; ++t) top = std::max(top, own[t]);
  const float total = count > 0 ? exp_and_sum(own, count, top) : 0.f;
  std::fill(s, own, 0.f);
  std::fill(own + count, s + n, 0.f);
  return {top, total};
}

// One query's running output over the segments seen so far.
struct Running {
  float top = -INFINITY, total = 0.f;
  bool started = false;
};

// Folds a segment's (top, total, sums o) into the running (state, acc): both rescaled to the
// larger top. The first segment is copied. Explicit fmas: no contraction the compiler might
// choose differently at another call site.
inline void fold_segment(Running& state, float* acc, float top, float total, const float* o,
                         int64_t dim) {
  if (total == 0.f) return;  // the query has no key in this segment
  if (!state.started) {
    state = {top, total, true};
    std::memcpy(acc, o, dim * sizeof(float));
    return;
  }
  const float high = std::max(state.top, top);
  const float a = std::exp(state.top - high), b = std::exp(top - high);
  for (int64_t f = 0; f < dim; ++f) acc[f] = std::fma(o[f], b, acc[f] * a);
  state.total = std::fma(total, b, state.total * a);
  state.top = high;
}

inline void finish_row(const Running& state, float* acc, int64_t dim) {
  const float inv = 1.f / state.total;
  for (int64_t f = 0; f < dim; ++f) acc[f] *= inv;
}

// scores[i][t] *= the scale of rows[t] for Q queries and n keys, the plain loop's way: an
// int8 cache's key scales on the scores, or its value scales on the weights (nothing for a
// float cache).
template <typename T, int Q>
inline void scale_rows(float* const* scores, const T* const* rows, int64_t n, int64_t dim) {
  if constexpr (kQ8Cache<T>) {
    for (int64_t t = 0; t < n; ++t) {
      const float d = row_scale(rows[t], dim);
      for (int i = 0; i < Q; ++i) scores[i][t] *= d;
    }
  }
}

// Q queries over their share of n keys of one segment (query i: keys from[i] .. from[i] +
// count[i] - 1): scores, e^(s - top) and the weighted sums of the values into o[i] (dim
// each); tops and totals per query. An int8 cache's row scales go on the scores and on the
// weights after e^, the totals taken before (value_scales: n floats of scratch). Without
// AVX2 (or with dim not a multiple of 16) the same sums one at a time, in their own order.
template <typename T, int Q>
void attend(const float* const* q, const T* const* keys, const T* const* values, int64_t n,
            int64_t dim, float scale, float* const* scores, float* const* o,
            const int64_t* from, const int64_t* count, float* tops, float* totals,
            float* value_scales, bool fetch) {
#ifdef INHOUSE_AVX2
  if (dim % 16 == 0) {
    score_block<T, Q>(q, keys, values, n, dim, scale, scores, value_scales, fetch);
    for (int i = 0; i < Q; ++i) {
      std::tie(tops[i], totals[i]) = exp_segment(scores[i], n, from[i], count[i]);
      if constexpr (kQ8Cache<T>) {
        for (int64_t t = from[i]; t < from[i] + count[i]; ++t) scores[i][t] *= value_scales[t];
      }
    }
    weigh_values<T, Q>(values, scores, n, dim, o);
    return;
  }
#endif
  for (int i = 0; i < Q; ++i) {
    for (int64_t t = 0; t < n; ++t) {
      float s = 0.f;
      for (int64_t f = 0; f < dim; ++f) s = std::fma(q[i][f], static_cast<float>(keys[t][f]), s);
      scores[i][t] = s * scale;
    }
  }
  scale_rows<T, Q>(scores, keys, n, dim);
  for (int i = 0; i < Q; ++i) std::tie(tops[i], totals[i]) = exp_segment(scores[i], n, from[i], count[i]);
  scale_rows<T, Q>(scores, values, n, dim);
  for (int i = 0; i < Q; ++i) {
    for (int64_t f = 0; f < dim; ++f) {
      float total = 0.f;
      for (int64_t t = 0; t < n; ++t) total = std::fma(scores[i][t], static_cast<float>(values[t][f]), total);
      o[i][f] = total;
    }
  }
}

// attend for a block of 1 .. kQueriesAtOnce queries.
template <typename T>
void attend_any(int queries, const float* const* q, const T* const* keys, const T* const* values,
                int64_t n, int64_t dim, float scale, float* const* scores, float* const* o,
                const int64_t* from, const int64_t* count, float* tops, float* totals,
                float* value_scales, bool fetch) {
  switch (queries) {
#define INHOUSE_ATTEND(Q)                                                                   \
  case Q:                                                                                   \
    if constexpr (Q <= kQueriesAtOnce) {                                                    \
      return attend<T, Q>(q, keys, values, n, dim, scale, scores, o, from, count, tops,     \
                          totals, value_scales, fetch);                                     \
    }                                                                                       \
    break;
    INHOUSE_ATTEND(1)
    INHOUSE_ATTEND(2)
    INHOUSE_ATTEND(3)
    INHOUSE_ATTEND(4)
    INHOUSE_ATTEND(5)
    INHOUSE_ATTEND(6)
#undef INHOUSE_ATTEND
  }
  TORCH_CHECK(false, "a block of at most kQueriesAtOnce queries");
}

// Consecutive rows of one sequence (a prefill) that share one gathering of their cache rows.
constexpr int64_t kTileRows = 16;
// A step of at most this many rows (decodes, a speculative draft's rows, a short prompt)
// runs every tile's segments apart, so its few tiles still make work for every thread.
constexpr int64_t kSplitRows = 64;

// A unit of work: a tile's queries of one KV head, over one segment (a split tile: its
// segments run apart, folded after) or over all of them (segment -1).
struct AttentionItem {
  int64_t tile, kv_head, segment, partial;  // partial: the first of its queries' slots
};

template <typename T>
void attention_rows_impl(const torch::Tensor& q, const torch::Tensor& k_cache,
                         const torch::Tensor& v_cache, const torch::Tensor& tables,
                         const int64_t* seq, const int64_t* lp, int64_t block_size, float scale,
                         int64_t window, bool torch_threads, torch::Tensor& out) {
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(1), group = heads / kv_heads;
  const int64_t width = tables.size(1);
  const float* qp = q.data_ptr<float>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t row = row_width<T>(dim), slot_values = kv_heads * row, partial_floats = dim + 2;
  const auto seq_of = [&](int64_t i) { return seq == nullptr ? i : seq[i]; };
  const auto first_key = [&](int64_t i) {
    return window > 0 ? std::max<int64_t>(0, lp[i] - window) : int64_t{0};
  };
  std::vector<int64_t> tile_starts;
  for (int64_t i = 0; i < rows; ++i) {
    if (i == 0 || seq_of(i) != seq_of(i - 1) || i - tile_starts.back() == kTileRows) {
      tile_starts.push_back(i);
    }
  }
  tile_starts.push_back(rows);
  const int64_t tiles = static_cast<int64_t>(tile_starts.size()) - 1;
  // Items in an order that alternates cheap and dear ones (a prompt's tiles cost more the
  // later they come), so a static split over threads gets even shares.
  // A split tile's query i (row r0 + i / group, head i % group of the KV head) keeps one
  // partial slot per segment s0 <= s < s1 and KV head, at first + ((s - s0) * KVH + h) * Q + i.
  struct SplitTile {
    int64_t tile, s0, s1, first;
  };
  std::vector<AttentionItem> listed;
  std::vector<SplitTile> split_tiles;
  int64_t partials = 0;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t r0 = tile_starts[tile], r1 = tile_starts[tile + 1];
    if (r1 - r0 > 1 && rows > kSplitRows) {
      for (int64_t h = 0; h < kv_heads; ++h) listed.push_back({tile, h, -1, 0});
      continue;
    }
    int64_t first = first_key(r0), last = lp[r0];
    for (int64_t r = r0 + 1; r < r1; ++r) {
      first = std::min(first, first_key(r));
      last = std::max(last, lp[r]);
    }
    const int64_t s0 = first / kSegment, s1 = (last - 1) / kSegment + 1;
    const int64_t queries = (r1 - r0) * group;
    split_tiles.push_back({tile, s0, s1, partials});
    for (int64_t s = s0; s < s1; ++s) {
      for (int64_t h = 0; h < kv_heads; ++h) {
        listed.push_back({tile, h, s, partials + ((s - s0) * kv_heads + h) * queries});
      }
    }
    partials += (s1 - s0) * kv_heads * queries;
  }
  const int64_t count_items = static_cast<int64_t>(listed.size());
  std::vector<AttentionItem> items(count_items);
  for (int64_t j = 0; j < count_items; ++j) {
    items[j] = listed[dear_and_cheap(j, count_items)];
  }
  std::vector<float> partial(partials * partial_floats);
  const auto body = [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kQueriesAtOnce * kSegment), sums(kQueriesAtOnce * dim);
    std::vector<float> value_scales(kQ8Cache<T> ? kSegment : 0);  // an int8 cache's
    std::vector<const T*> keys, values;
    for (int64_t index = begin; index < end; ++index) {
      const AttentionItem& item = items[index];
      const int64_t r0 = tile_starts[item.tile], r1 = tile_starts[item.tile + 1];
      const int64_t* table = tp + seq_of(r0) * width;
      int64_t lo = first_key(r0), hi = lp[r0];
      for (int64_t r = r0 + 1; r < r1; ++r) {
        lo = std::min(lo, first_key(r));
        hi = std::max(hi, lp[r]);
      }
      if (item.segment >= 0) {
        lo = std::max(lo, item.segment * kSegment);
        hi = std::min(hi, (item.segment + 1) * kSegment);
      }
      keys.resize(hi - lo);
      values.resize(hi - lo);
      // Block by block: a division per key cost a tenth of a long decode row's attention.
      const int64_t head_at = item.kv_head * row;
      for (int64_t b = lo / block_size, t = lo; t < hi; ++b) {
        const int64_t end = std::min(hi, (b + 1) * block_size);
        const int64_t block_at = (table[b] * block_size - b * block_size) * slot_values + head_at;
        for (; t < end; ++t) {
          keys[t - lo] = kp + block_at + t * slot_values;
          values[t - lo] = vp + block_at + t * slot_values;
        }
      }
      // The tile's query heads of this KV head, row by row, kQueriesAtOnce at a time, each
      // block over the keys of a segment any of its queries needs.
      const int64_t queries = (r1 - r0) * group;
      for (int64_t b0 = 0; b0 < queries; b0 += kQueriesAtOnce) {
        // One segment's rows (64 KB of float16 keys and values) stay in cache from the first
        // block of a split tile to the next: only the first asks for them ahead (a 17-row
        // draft's attention 4 % faster). A whole prompt's may not, so each block asks.
        const bool fetch = b0 == 0 || item.segment < 0;
        const int in_block = static_cast<int>(std::min<int64_t>(kQueriesAtOnce, queries - b0));
        const float* qs[kQueriesAtOnce];
        float* outs[kQueriesAtOnce];
        float* block_sums[kQueriesAtOnce];
        float* rows_scores[kQueriesAtOnce];
        int64_t first[kQueriesAtOnce], last[kQueriesAtOnce];
        int64_t from[kQueriesAtOnce], count[kQueriesAtOnce];
        float tops[kQueriesAtOnce], totals[kQueriesAtOnce];
        Running running[kQueriesAtOnce];
        for (int i = 0; i < in_block; ++i) {
          const int64_t r = r0 + (b0 + i) / group, h = item.kv_head * group + (b0 + i) % group;
          qs[i] = qp + (r * heads + h) * dim;
          outs[i] = op + (r * heads + h) * dim;
          first[i] = std::max(first_key(r), lo);
          last[i] = std::min(lp[r], hi);
          if (item.segment >= 0) {
            float* slot = partial.data() + (item.partial + b0 + i) * partial_floats;
            block_sums[i] = slot;
          } else {
            block_sums[i] = sums.data() + i * dim;
          }
        }
        int64_t s_first = lo / kSegment;
        for (int64_t s = s_first; s * kSegment < hi; ++s) {
          const int64_t seg_lo = std::max(lo, s * kSegment), seg_hi = std::min(hi, (s + 1) * kSegment);
          int64_t block_lo = seg_hi, block_hi = seg_lo;
          for (int i = 0; i < in_block; ++i) {
            from[i] = std::max(first[i], seg_lo);
            count[i] = std::max<int64_t>(0, std::min(last[i], seg_hi) - from[i]);
            if (count[i] > 0) {
              block_lo = std::min(block_lo, from[i]);
              block_hi = std::max(block_hi, from[i] + count[i]);
            }
          }
          if (block_hi <= block_lo) continue;  // no query of the block has keys here
          const int64_t span = block_hi - block_lo;
          for (int i = 0; i < in_block; ++i) {
            from[i] = count[i] > 0 ? from[i] - block_lo : 0;
            rows_scores[i] = scores.data() + i * span;
          }
          attend_any<T>(in_block, qs, keys.data() + block_lo - lo, values.data() + block_lo - lo,
                        span, dim, scale, rows_scores, block_sums, from, count, tops, totals,
                        value_scales.data(), fetch);
          for (int i = 0; i < in_block; ++i) {
            if (item.segment >= 0) {
              block_sums[i][dim] = tops[i];
              block_sums[i][dim + 1] = totals[i];
            } else {
              fold_segment(running[i], outs[i], tops[i], totals[i], block_sums[i], dim);
            }
          }
        }
        if (item.segment < 0) {
          for (int i = 0; i < in_block; ++i) finish_row(running[i], outs[i], dim);
        }
      }
    }
  };
  if (torch_threads) {
    at::parallel_for(0, count_items, 1, body);
  } else {
    inhouse::parallel_for(0, count_items, 1, body);
  }
  // A split tile's segments, folded in position order as an unsplit tile folds them (a
  // segment without the query's keys has total 0 and folds as nothing, there as here).
  for (const SplitTile& split : split_tiles) {
    const int64_t r0 = tile_starts[split.tile], r1 = tile_starts[split.tile + 1];
    const int64_t queries = (r1 - r0) * group;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t i = (r - r0) * group + h % group;
        Running running;
        float* acc = op + (r * heads + h) * dim;
        for (int64_t s = split.s0; s < split.s1; ++s) {
          const int64_t at = split.first + ((s - split.s0) * kv_heads + h / group) * queries + i;
          const float* slot = partial.data() + at * partial_floats;
          fold_segment(running, acc, slot[dim], slot[dim + 1], slot, dim);
        }
        finish_row(running, acc, dim);
      }
    }
  }
}

}  // namespace

namespace {

// The rows `index` of a step (all of them when index is null) by the float32 loops.
template <typename T>
void attend_loops(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                  const torch::Tensor& tables, const torch::Tensor& seqs, const torch::Tensor& lens,
                  const torch::Tensor& index, int64_t block_size, float scale, int64_t window,
                  bool torch_threads, torch::Tensor& out) {
  if (!index.defined()) {
    attention_rows_impl<T>(q, k_cache, v_cache, tables,
                           seqs.defined() ? seqs.data_ptr<int64_t>() : nullptr,
                           lens.data_ptr<int64_t>(), block_size, scale, window, torch_threads, out);
    return;
  }
  const auto own_seqs = seqs.defined() ? seqs.index_select(0, index) : index;
  const auto own_lens = lens.index_select(0, index);
  auto own_out = torch::empty({index.numel(), out.size(1)}, out.options());
  attention_rows_impl<T>(q.index_select(0, index), k_cache, v_cache, tables,
                         own_seqs.data_ptr<int64_t>(), own_lens.data_ptr<int64_t>(), block_size,
                         scale, window, torch_threads, own_out);
  out.index_copy_(0, index, own_out);
}

// Every row: `prompt`'s on the tiles where this process has them (the rest, or all without
// them, by the float32 loops).
template <typename T>
void attend_rows(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                 const torch::Tensor& tables, const torch::Tensor& seqs, const torch::Tensor& lens,
                 const torch::Tensor& prompt, int64_t block_size, float scale, int64_t window,
                 bool torch_threads, torch::Tensor& out) {
  const int64_t rows = q.size(0), dim = q.size(2);
  if (!prompt.defined() || !tile_attention::ready(dim)) {
    attend_loops<T>(q, k_cache, v_cache, tables, seqs, lens, torch::Tensor(), block_size, scale,
                    window, torch_threads, out);
    return;
  }
  const bool* marked = prompt.data_ptr<bool>();
  std::vector<int64_t> identity, rest;
  if (!seqs.defined()) {
    identity.resize(rows);
    for (int64_t i = 0; i < rows; ++i) identity[i] = i;
  }
  tile_attention::PromptRows tiles{q.data_ptr<float>(), out.data_ptr<float>(), {},
                                   seqs.defined() ? seqs.data_ptr<int64_t>() : identity.data(),
                                   lens.data_ptr<int64_t>(), tables.data_ptr<int64_t>(),
                                   tables.size(1), block_size, q.size(1), k_cache.size(1), dim,
                                   window, scale, torch_threads};
  for (int64_t i = 0; i < rows; ++i) (marked[i] ? tiles.index : rest).push_back(i);
  if (!tiles.index.empty()) {
    tile_attention::attend<T>(tiles, k_cache.data_ptr<T>(), v_cache.data_ptr<T>());
  }
  if (!rest.empty()) {
    const auto index = torch::tensor(rest, torch::dtype(torch::kInt64));
    attend_loops<T>(q, k_cache, v_cache, tables, seqs, lens, index, block_size, scale, window,
                    torch_threads, out);
  }
}

}  // namespace

// Attention of query rows straight from the paged cache, for decodes and prefills alike.
// q [R, H, D] float32; caches [slots, KVH, D] float32, float16 or bfloat16, or [slots, KVH,
// D + 4] int8 (codes and scale, see kQ8Scale); block_tables
// int64 [S, W]; row_seq int64 [R], the sequence (row of block_tables) of each query row,
// or None when row i is sequence i (a step of decodes); context_lens int64 [R], the keys
// each row attends to, itself included: its positions max(0, len - window) .. len - 1
// (window 0 = all). Every row and head sums its keys in position order on its own, so a
// row's bits are the same alone, batched, in a whole prompt or in a chunk of it. Rows that
// prompt_rows (bool [R]) marks, a prompt's own positions, run on bf16 products where the
// process has them (attention_tiles.cpp: AMX tiles, else vdpbf16ps), each on its own there too. Between torch ops
// (`torch_threads`) it runs on torch's threads: two pools polling for work on a 2-core host
// take each other's cores (a float16-weight decode step took 20-30% longer); inside
// decode_layers, where every op is ours, on the pool.
torch::Tensor paged_attention_rows(const torch::Tensor& q, const torch::Tensor& k_cache,
                                   const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                                   const c10::optional<torch::Tensor>& row_seq,
                                   const torch::Tensor& context_lens, int64_t block_size,
                                   double scale, int64_t window, bool torch_threads,
                                   const c10::optional<torch::Tensor>& prompt_rows) {
  const auto cache_type = k_cache.scalar_type();
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && v_cache.scalar_type() == cache_type &&
                  (cache_type == torch::kFloat32 || cache_type == torch::kHalf ||
                   cache_type == torch::kBFloat16 || cache_type == torch::kChar),
              "float32 queries; a float32, float16, bfloat16 or int8 cache");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && q.is_contiguous());
  const int64_t dim = q.size(2);
  TORCH_CHECK(k_cache.size(2) == (cache_type == torch::kChar ? dim + kQ8Scale : dim) &&
                  v_cache.sizes() == k_cache.sizes(),
              "cache rows of the queries' head dim (int8: and a scale)");
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  torch::Tensor seqs = row_seq.has_value() ? row_seq->contiguous() : torch::Tensor();
  torch::Tensor prompt = prompt_rows.has_value() ? prompt_rows->contiguous() : torch::Tensor();
  const int64_t rows = q.size(0);
  TORCH_CHECK(lens.numel() == rows && (!seqs.defined() || seqs.numel() == rows),
              "one context length (and sequence) per query row");
  TORCH_CHECK(!prompt.defined() || (prompt.scalar_type() == torch::kBool && prompt.numel() == rows),
              "prompt_rows: one bool per query row");
  const int64_t* lp = lens.data_ptr<int64_t>();
  const int64_t* sp = seqs.defined() ? seqs.data_ptr<int64_t>() : nullptr;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t s = sp == nullptr ? i : sp[i];
    TORCH_CHECK(s >= 0 && s < tables.size(0), "row's sequence outside the block tables");
    TORCH_CHECK(lp[i] >= 1 && lp[i] <= tables.size(1) * block_size,
                "context empty or longer than the block table");
  }
  auto out = torch::empty({rows, q.size(1) * q.size(2)}, q.options());
  const float scale_f = static_cast<float>(scale);
  if (cache_type == torch::kChar) {
    attend_rows<int8_t>(q, k_cache, v_cache, tables, seqs, lens, prompt, block_size, scale_f,
                        window, torch_threads, out);
  } else if (cache_type == torch::kHalf) {
    attend_rows<c10::Half>(q, k_cache, v_cache, tables, seqs, lens, prompt, block_size, scale_f,
                           window, torch_threads, out);
  } else if (cache_type == torch::kBFloat16) {
    attend_rows<c10::BFloat16>(q, k_cache, v_cache, tables, seqs, lens, prompt, block_size,
                               scale_f, window, torch_threads, out);
  } else {
    attend_rows<float>(q, k_cache, v_cache, tables, seqs, lens, prompt, block_size, scale_f,
                       window, torch_threads, out);
  }
  return out;
}

}  // namespace inhouse
