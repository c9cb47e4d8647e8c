// A prompt's attention on bf16 products, for the rows the caller marks as prompt rows (see
// paged_attention_rows): AMX bf16 tiles where the CPU has them and Linux grants them
// (Sapphire Rapids and later), else AVX-512 BF16's vdpbf16ps (bf16_dot.h: AMD Zen 4).
//
// A query row's scores against a block of 32 keys are one product per 32 features (the
// row's bf16 query by the keys' bf16 features, summed in float32 in the product's order),
// times the scale; its softmax runs over steps of 32 keys on the tiles, 64 on vdpbf16ps,
// aligned to absolute positions (0, 32 or 64, ...) in position order, flash-attention's way:
// the step's top, the running top, e^(s - top) rounded to bf16 (0 where a key is not the
// row's), then the step's weights by the values as a product (as deep as the step) and
// acc = acc * alpha + that. A step that holds none of the row's keys leaves its state alone.
// Every step is the row's own: which other rows share its tile, how the prompt is chunked
// and which thread runs it change nothing, so batch and chunking invariance hold among prompt rows. A generated
// token's row (a decode, a draft, a preempted sequence's recompute) keeps attention.cpp's
// float32 loops, so its bits do not depend on the step it runs in either.
//
// Each (sequence, KV head)'s keys and values the step reads are packed once into the tiles'
// B layouts (bf16, 8 KiB a block of 32 keys at 64 features), shared by every row tile.

#include "attention_tiles.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bf16_dot.h"
#include "bf16_tiles.h"
#include "kv_rows.h"
#include "simd.h"
#include "work_pool.h"

namespace inhouse::tile_attention {
namespace {

#if defined(INHOUSE_AMX_BF16) || defined(INHOUSE_BF16_DOT)
#define INHOUSE_PROMPT_ATTENTION 1
#endif

#ifdef INHOUSE_PROMPT_ATTENTION
// Query rows a tile, features a scores product sums, keys (scores) or features (values) a
// B tile gives: bf16_tiles.h's.
using bf16_tiles::kDepth;
using bf16_tiles::kRows;
constexpr int64_t kOutputs = bf16_tiles::kBlock;
constexpr int64_t kKeys = 32;        // keys a block: the weights-by-values product's depth
constexpr int64_t kTileElems = 512;  // 16 rows of 16 bf16 pairs

// One block of 32 keys packed: keys for the scores, [dim / 32 groups][2 halves of 16 keys]
// B tiles, element (j, n, i) = key[16 half + n][32 group + 2j + i]; then values, [dim / 16]
// B tiles, element (j, n, i) = value[2j + i][16 tile + n]. Keys past the context are 0.
struct Packed {
  int64_t dim, first_block;
  std::vector<uint16_t> data;
  int64_t block_elems() const { return 2 * kKeys * dim; }
  const uint16_t* keys(int64_t block, int64_t group, int64_t half) const {
    return data.data() + (block - first_block) * block_elems() + (2 * group + half) * kTileElems;
  }
  const uint16_t* values(int64_t block, int64_t tile) const {
    return data.data() + (block - first_block) * block_elems() + kKeys * dim + tile * kTileElems;
  }
};

// A cache row (one token, one KV head) as float32 features.
template <typename T>
inline void row_floats(const T* row, int64_t dim, float* out) {
  const float d = kQ8Cache<T> ? row_scale(reinterpret_cast<const int8_t*>(row), dim) : 1.f;
  for (int64_t f = 0; f < dim; f += 16) {
    __m512 x = load16(row + f);
    if constexpr (kQ8Cache<T>) x = _mm512_mul_ps(x, _mm512_set1_ps(d));
    _mm512_storeu_ps(out + f, x);
  }
}

template <typename T>
void pack(const T* k_cache, const T* v_cache, const int64_t* table, int64_t block_size,
          int64_t slot_values, int64_t head_at, int64_t keys_end, Packed& packed) {
  const int64_t dim = packed.dim, pairs = dim / 2;
  std::vector<float> keys(kKeys * dim), values(kKeys * dim);
  std::vector<uint32_t> key_pairs(kKeys * pairs);  // [key, pair of features]
  // a pair of keys' features interleaved: bf16 2n from the first key's n, 2n + 1 the second's
  alignas(64) uint16_t order[32];
  for (int n = 0; n < 16; ++n) order[2 * n] = n, order[2 * n + 1] = 16 + n;
  const __m512i interleave = _mm512_load_si512(order);
  const int64_t blocks = static_cast<int64_t>(packed.data.size()) / packed.block_elems();
  for (int64_t b = 0; b < blocks; ++b) {
    uint32_t* at = reinterpret_cast<uint32_t*>(packed.data.data() + b * packed.block_elems());
    uint32_t* v_at = at + kKeys * pairs;
    for (int64_t t = 0; t < kKeys; ++t) {
      const int64_t pos = (packed.first_block + b) * kKeys + t;
      if (pos < keys_end) {
        const int64_t slot = table[pos / block_size] * block_size + pos % block_size;
        row_floats(k_cache + slot * slot_values + head_at, dim, keys.data() + t * dim);
        row_floats(v_cache + slot * slot_values + head_at, dim, values.data() + t * dim);
      } else {
        std::fill_n(keys.data() + t * dim, dim, 0.f);
        std::fill_n(values.data() + t * dim, dim, 0.f);
      }
      bf16_dot::to_bf16(keys.data() + t * dim, dim,
                        reinterpret_cast<uint16_t*>(key_pairs.data() + t * pairs));
    }
    // keys: B tile (group g, half h) row p, dword n = key 16 h + n's feature pair 16 g + p
    for (int64_t g = 0; g < dim / kDepth; ++g) {
      for (int64_t half = 0; half < 2; ++half) {
        uint32_t* tile = at + (2 * g + half) * (kTileElems / 2);
        for (int64_t p = 0; p < kDepth / 2; ++p) {
          for (int64_t n = 0; n < kOutputs; ++n) {
            tile[p * kOutputs + n] = key_pairs[(kOutputs * half + n) * pairs + kDepth / 2 * g + p];
          }
        }
      }
    }
    // values: B tile j row r, dword n = (key 2r's feature 16 j + n, key 2r + 1's)
    for (int64_t r = 0; r < kKeys / 2; ++r) {
      for (int64_t j = 0; j < dim / kOutputs; ++j) {
        const float* first = values.data() + 2 * r * dim + j * kOutputs;
        const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(first + dim),
                                                          _mm512_loadu_ps(first));
        _mm512_storeu_si512(v_at + j * (kTileElems / 2) + r * kOutputs,
                            _mm512_permutexvar_epi16(interleave, both));
      }
    }
  }
}

// e^x for 16 lanes of x <= 0: x = k ln2 + r, e^r by its Taylor polynomial to r^4 (|r| <=
// ln2 / 2: within 4e-5, a tenth of what rounding the weights to bf16 loses), 2^k by vscalefps.
// e^0 is exactly 1; far below -87 it gives ~1e-38 (masked to 0 where that matters). Not
// simd.h's exp8 twice: its degree-6 polynomial made a 950-row layer 1.5x slower (6.0 ms, 4.1).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 24);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, k);
}

// One row tile (rows[0 .. count - 1], one query head) over its keys: out rows of dim floats.
struct RowTile {
  const uint16_t* q;  // [16, dim] bf16, rows past count zero
  const int64_t* lo;  // each row's first key
  const int64_t* hi;  // each row's keys end (its position + 1)
  int count;
};

#ifdef INHOUSE_AMX_BF16
// The products on the tiles, in bf16_tiles.h's configuration (every tile 16 rows of 64
// bytes) as C tiles 0-1, A tile 2 and B tiles 3-4.
struct TileProducts {
  static constexpr int64_t kStepBlocks = 1;  // blocks of 32 keys a softmax step
  static void begin() { bf16_tiles::configure(); }
  static void end() { _tile_release(); }
  // scores [16 rows, stride `stride`] of the rows q ([16, dim] bf16) by block b's 32 keys
  static void scores(const uint16_t* q, const Packed& kv, int64_t b, float* scores,
                     int64_t stride) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t g = 0; g < kv.dim / kDepth; ++g) {
      _tile_loadd(2, q + g * kDepth, kv.dim * 2);
      _tile_loadd(3, kv.keys(b, g, 0), 64);
      _tile_loadd(4, kv.keys(b, g, 1), 64);
      _tile_dpbf16ps(0, 2, 3);
      _tile_dpbf16ps(1, 2, 4);
    }
    _tile_stored(0, scores, stride * 4);
    _tile_stored(1, scores + kOutputs, stride * 4);
  }
  // o [16 rows, dim] = weights ([16, 32 keys] bf16) by the step's block b's values
  static void values(const uint16_t* weights, const Packed& kv, int64_t b, float* o) {
    _tile_loadd(2, weights, kKeys * 2);
    for (int64_t t = 0; t < kv.dim / kOutputs; t += 2) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_loadd(3, kv.values(b, t), 64);
      _tile_loadd(4, kv.values(b, t + 1), 64);
      _tile_dpbf16ps(0, 2, 3);
      _tile_dpbf16ps(1, 2, 4);
      _tile_stored(0, o + t * kOutputs, kv.dim * 4);
      _tile_stored(1, o + (t + 1) * kOutputs, kv.dim * 4);
    }
  }
};
#endif

#ifdef INHOUSE_BF16_DOT
// The same products on vdpbf16ps (bf16_dot.h), both blocks of 16 outputs at once, and a
// softmax step of 64 keys: the per-step reductions and rescaling (half of the attention's
// time at 32) come half as often, and the weights-by-values chains run 64 keys deep.
struct DotProducts {
  static constexpr int64_t kStepBlocks = 2;
  static void begin() {}
  static void end() {}
  // the two halves of block b's keys, a group of 32 features two tiles on
  static void scores(const uint16_t* q, const Packed& kv, int64_t b, float* scores,
                     int64_t stride) {
    bf16_dot::products(scores, stride, kOutputs, q, kv.dim, kv.keys(b, 0, 0), kTileElems,
                       2 * kTileElems, kv.dim / kDepth);
  }
  // o [16 rows, dim] = weights ([16, 64 keys] bf16) by blocks b and b + 1's values: tiles t
  // and t + 1 of features, a group of 32 keys a block on
  static void values(const uint16_t* weights, const Packed& kv, int64_t b, float* o) {
    for (int64_t t = 0; t < kv.dim / kOutputs; t += 2) {
      bf16_dot::products(o + t * kOutputs, kv.dim, kOutputs, weights, kStepBlocks * kKeys,
                         kv.values(b, t), kTileElems, kv.block_elems(), kStepBlocks);
    }
  }
};
#endif

template <typename Products>
void attend_tile(const RowTile& rt, const Packed& kv, float scale, float* const* out) {
  constexpr int64_t kStep = Products::kStepBlocks * kKeys;  // keys a softmax step: 32 or 64
  constexpr int kVectors = static_cast<int>(kStep / 16);     // a row's scores, 16 a vector
  const int64_t dim = kv.dim;
  int64_t lo = rt.lo[0], hi = rt.hi[0];
  for (int r = 1; r < rt.count; ++r) {
    lo = std::min(lo, rt.lo[r]);
    hi = std::max(hi, rt.hi[r]);
  }
  alignas(64) float scores[kRows * kStep];
  alignas(64) uint16_t weights[kRows * kStep];
  std::vector<float> o(kRows * dim), acc(kRows * dim, 0.f);
  alignas(64) float top[kRows], total[kRows], alpha[kRows];
  bool active[kRows];
  std::fill(top, top + kRows, -INFINITY);
  std::fill(total, total + kRows, 0.f);
  for (int64_t step = lo / kStep; step * kStep < hi; ++step) {
    const int64_t base = step * kStep, b = step * Products::kStepBlocks;
    for (int64_t k = 0; k < Products::kStepBlocks; ++k) {
      Products::scores(rt.q, kv, b + k, scores + k * kKeys, kStep);
    }
    std::memset(weights, 0, sizeof weights);
    // The scores of each row's own keys (the rest -inf), and each row's new top.
    alignas(64) float old_top[kRows], new_top[kRows];
    for (int r = 0; r < kRows; ++r) {
      const int64_t from = r < rt.count ? std::max(rt.lo[r], base) : 0;
      const int64_t to = r < rt.count ? std::min(rt.hi[r], base + kStep) : 0;
      active[r] = from < to;
      old_top[r] = new_top[r] = top[r];
      if (!active[r]) continue;  // none of the row's keys: its state stays as it is
      const uint64_t upto = to - base == 64 ? ~uint64_t{0} : (uint64_t{1} << (to - base)) - 1;
      const uint64_t own = upto & ~((uint64_t{1} << (from - base)) - 1);
      const __m512 scaled = _mm512_set1_ps(scale), none = _mm512_set1_ps(-INFINITY);
      float* row = scores + r * kStep;
      __m512 high = none;
      for (int v = 0; v < kVectors; v += 2) {
        const __m512 s0 = _mm512_mask_mul_ps(none, static_cast<__mmask16>(own >> (16 * v)),
                                             _mm512_load_ps(row + 16 * v), scaled);
        const __m512 s1 = _mm512_mask_mul_ps(none, static_cast<__mmask16>(own >> (16 * v + 16)),
                                             _mm512_load_ps(row + 16 * v + 16), scaled);
        _mm512_store_ps(row + 16 * v, s0);
        _mm512_store_ps(row + 16 * v + 16, s1);
        high = v == 0 ? _mm512_max_ps(s0, s1) : _mm512_max_ps(high, _mm512_max_ps(s0, s1));
      }
      new_top[r] = std::max(top[r], _mm512_reduce_max_ps(high));
    }
    _mm512_store_ps(alpha, exp16(_mm512_sub_ps(_mm512_load_ps(old_top), _mm512_load_ps(new_top))));
    for (int r = 0; r < rt.count; ++r) {
      if (!active[r]) continue;
      top[r] = new_top[r];
      const __m512 h = _mm512_set1_ps(top[r]), none = _mm512_set1_ps(-INFINITY);
      const float* row = scores + r * kStep;
      __m512 sum = _mm512_setzero_ps();
      for (int v = 0; v < kVectors; v += 2) {
        // a key not the row's: e^-inf would be ~1e-38 here, so it is set to 0
        const __m512 s0 = _mm512_load_ps(row + 16 * v), s1 = _mm512_load_ps(row + 16 * v + 16);
        const __m512 e0 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s0, none, _CMP_NEQ_OQ),
                                              exp16(_mm512_sub_ps(s0, h)));
        const __m512 e1 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s1, none, _CMP_NEQ_OQ),
                                              exp16(_mm512_sub_ps(s1, h)));
        const __m512i p = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);  // keys 0-15 low, 16-31 high
        _mm512_store_si512(weights + r * kStep + 16 * v, p);
        // The total of the weights as rounded, so they sum to the divisor exactly as used.
        const __m512 w0 = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(p)), 16));
        const __m512 w1 = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(p, 1)), 16));
        sum = v == 0 ? _mm512_add_ps(w0, w1) : _mm512_add_ps(sum, _mm512_add_ps(w0, w1));
      }
      total[r] = std::fma(total[r], alpha[r], _mm512_reduce_add_ps(sum));
    }
    Products::values(weights, kv, b, o.data());
    for (int r = 0; r < rt.count; ++r) {
      if (!active[r]) continue;
      const __m512 a = _mm512_set1_ps(alpha[r]);
      float* row = acc.data() + r * dim;
      for (int64_t f = 0; f < dim; f += 16) {
        _mm512_storeu_ps(row + f, _mm512_fmadd_ps(_mm512_loadu_ps(row + f), a,
                                                  _mm512_loadu_ps(o.data() + r * dim + f)));
      }
    }
  }
  for (int r = 0; r < rt.count; ++r) {
    const __m512 inv = _mm512_set1_ps(1.f / total[r]);
    for (int64_t f = 0; f < dim; f += 16) {
      _mm512_storeu_ps(out[r] + f, _mm512_mul_ps(_mm512_loadu_ps(acc.data() + r * dim + f), inv));
    }
  }
}
#endif

}  // namespace

bool ready(int64_t dim) {
#if defined(INHOUSE_BF16_DOT)
  return dim % kDepth == 0;  // the tiles where granted, else vdpbf16ps
#else
  (void)dim;
  return false;
#endif
}

template <typename T>
void attend(const PromptRows& rows, const T* k_cache, const T* v_cache) {
#ifdef INHOUSE_PROMPT_ATTENTION
  const int64_t dim = rows.dim, group = rows.heads / rows.kv_heads;
  const int64_t row = row_width<T>(dim), slot_values = rows.kv_heads * row;
  const auto first_key = [&](int64_t i) {
    return rows.window > 0 ? std::max<int64_t>(0, rows.lens[i] - rows.window) : int64_t{0};
  };
  // Tiles: up to 16 consecutive listed rows of one sequence.
  std::vector<int64_t> starts;
  const int64_t listed = static_cast<int64_t>(rows.index.size());
  for (int64_t j = 0; j < listed; ++j) {
    if (j == 0 || rows.seq[rows.index[j]] != rows.seq[rows.index[j - 1]] ||
        j - starts.back() == kRows) {
      starts.push_back(j);
    }
  }
  starts.push_back(listed);
  const int64_t tiles = static_cast<int64_t>(starts.size()) - 1;
  // Each sequence's keys, per KV head, packed once over the blocks its rows read.
  std::vector<int64_t> seqs;  // distinct sequences, in row order
  std::vector<int64_t> pack_of(tiles);
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t s = rows.seq[rows.index[starts[t]]];
    if (seqs.empty() || seqs.back() != s) seqs.push_back(s);
    pack_of[t] = static_cast<int64_t>(seqs.size()) - 1;
  }
  std::vector<int64_t> keys_lo(seqs.size(), INT64_MAX), keys_hi(seqs.size(), 0);
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t j = starts[t]; j < starts[t + 1]; ++j) {
      const int64_t i = rows.index[j];
      keys_lo[pack_of[t]] = std::min(keys_lo[pack_of[t]], first_key(i));
      keys_hi[pack_of[t]] = std::max(keys_hi[pack_of[t]], rows.lens[i]);
    }
  }
  const int64_t packs = static_cast<int64_t>(seqs.size()) * rows.kv_heads;
  std::vector<Packed> packed(packs);
  // The tiles' softmax steps one block of 32 keys at a time (TileProducts), vdpbf16ps's two.
  const bool on_tiles = bf16_tiles::ready();
  const int64_t step_blocks = on_tiles ? 1 : DotProducts::kStepBlocks;
  const auto pack_body = [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t s = p / rows.kv_heads, h = p % rows.kv_heads;
      Packed& one = packed[p];
      one.dim = dim;
      // whole softmax steps: the first and the last block of a step of step_blocks
      one.first_block = keys_lo[s] / kKeys / step_blocks * step_blocks;
      const int64_t step = step_blocks * kKeys;
      const int64_t blocks = (keys_hi[s] + step - 1) / step * step_blocks - one.first_block;
      one.data.assign(blocks * one.block_elems(), 0);
      pack(k_cache, v_cache, rows.tables + seqs[s] * rows.table_width, rows.block_size,
           slot_values, h * row, keys_hi[s], one);
    }
  };
  // Items (tile, KV head), dear and cheap ones alternating (a prompt's later tiles read more
  // keys), so a static split over threads gets even shares.
  const int64_t count = tiles * rows.kv_heads;
  std::vector<int64_t> order(count);
  for (int64_t j = 0; j < count; ++j) order[j] = dear_and_cheap(j, count);
  const auto items = [&](auto products) {
    using Products = decltype(products);
    const auto body = [&](int64_t begin, int64_t end) {
      Products::begin();
      std::vector<uint16_t> q(kRows * dim);
      int64_t lo[kRows], hi[kRows];
      float* outs[kRows];
      for (int64_t at = begin; at < end; ++at) {
        const int64_t item = order[at], t = item / rows.kv_heads, h = item % rows.kv_heads;
        const int n = static_cast<int>(starts[t + 1] - starts[t]);
        for (int64_t gi = 0; gi < group; ++gi) {
          const int64_t head = h * group + gi;
          std::fill(q.begin(), q.end(), 0);
          for (int r = 0; r < n; ++r) {
            const int64_t i = rows.index[starts[t] + r];
            const float* src = rows.q + (i * rows.heads + head) * dim;
            bf16_dot::to_bf16(src, dim, q.data() + r * dim);
            lo[r] = first_key(i);
            hi[r] = rows.lens[i];
            outs[r] = rows.out + (i * rows.heads + head) * dim;
          }
          attend_tile<Products>({q.data(), lo, hi, n}, packed[pack_of[t] * rows.kv_heads + h],
                                rows.scale, outs);
        }
      }
      Products::end();
    };
    if (rows.torch_threads) {
      at::parallel_for(0, count, 1, body);
    } else {
      inhouse::parallel_for(0, count, 1, body);
    }
  };
  if (rows.torch_threads) {
    at::parallel_for(0, packs, 1, pack_body);
  } else {
    inhouse::parallel_for(0, packs, 1, pack_body);
  }
#ifdef INHOUSE_AMX_BF16
  if (on_tiles) {
    items(TileProducts{});
    return;
  }
#endif
  items(DotProducts{});
#else
  (void)rows, (void)k_cache, (void)v_cache;
#endif
}

template void attend<float>(const PromptRows&, const float*, const float*);
template void attend<c10::Half>(const PromptRows&, const c10::Half*, const c10::Half*);
template void attend<c10::BFloat16>(const PromptRows&, const c10::BFloat16*, const c10::BFloat16*);
template void attend<int8_t>(const PromptRows&, const int8_t*, const int8_t*);

}  // namespace inhouse::tile_attention

TORCH_LIBRARY_FRAGMENT(inhouse_cpu, m) {
  m.def("prompt_attention_tiles(int head_dim) -> bool", &inhouse::tile_attention::ready);
}
