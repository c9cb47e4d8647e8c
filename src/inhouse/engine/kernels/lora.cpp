// LoRA adapters' low-rank products, added to a projection's output row by row.

#include <torch/types.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "kernels.h"
#include "simd.h"
#include "work_pool.h"

namespace inhouse {
namespace {

inline float as_float(float v) { return v; }
inline float as_float(c10::BFloat16 v) { return static_cast<float>(v); }
inline float as_float(int8_t v) { return static_cast<float>(v); }

// The adapters' halves are float32 beside a float32 model, bfloat16 beside a bfloat16 one,
// and int8 beside int8/int4 weights (a quarter of float32's bytes a step streams: four
// adapters of rank 16 on every projection of a 135M model are 116 MB of float32, more than
// its q4 weights). int8 halves carry their scales in `scale` (lora/stack.py folds them in).

constexpr int64_t kInputWays = 4;  // partial sums of the first pass, inputs i % 4 apart
static_assert(kInputWays == 4, "the first pass adds its partial sums as (0 + 1) + (2 + 3)");

#ifdef INHOUSE_AVX2
// low[k0 : k0 + 8 * kChunks] = x @ a_t's columns there, kInputWays sums a lane in registers
// (one sum a lane waited on each multiply-add's latency: a one-row call is that chain).
template <int kChunks, typename T, typename W>
void low_rank_chunks(const T* x, const W* a_t, int64_t in, int64_t rank, float* low) {
  __m256 acc[kInputWays][kChunks];
  for (auto& way : acc)
    for (auto& lane : way) lane = _mm256_setzero_ps();
  const auto add_input = [&](int64_t i, __m256* way) {
    const __m256 xi = _mm256_set1_ps(as_float(x[i]));
    const W* a = a_t + i * rank;
    for (int j = 0; j < kChunks; ++j) way[j] = _mm256_fmadd_ps(xi, load8(a + 8 * j), way[j]);
  };
  int64_t i = 0;
  for (; i + kInputWays <= in; i += kInputWays)
    for (int w = 0; w < kInputWays; ++w) add_input(i + w, acc[w]);  // unrolled: registers
  for (; i < in; ++i) add_input(i, acc[i % kInputWays]);
  for (int j = 0; j < kChunks; ++j)
    _mm256_storeu_ps(low + 8 * j, _mm256_add_ps(_mm256_add_ps(acc[0][j], acc[1][j]),
                                                _mm256_add_ps(acc[2][j], acc[3][j])));
}
#endif

// low[k0 : k0 + lanes] = x[0:in] @ a_t[:, k0 : k0 + lanes] (a_t's rows `rank` apart, `lanes`
// a multiple of 8, at most kRankChunk): each lane sums the inputs i = w mod kInputWays in
// order with fused multiply-adds, for each w, then adds those sums as (0 + 1) + (2 + 3).
template <typename T, typename W>
void low_rank(const T* x, const W* a_t, int64_t in, int64_t rank, int64_t k0, int64_t lanes,
              float* low) {
#ifdef INHOUSE_AVX2
  switch (lanes / 8) {
    case 1: low_rank_chunks<1>(x, a_t + k0, in, rank, low + k0); break;
    case 2: low_rank_chunks<2>(x, a_t + k0, in, rank, low + k0); break;
    case 3: low_rank_chunks<3>(x, a_t + k0, in, rank, low + k0); break;
    default: low_rank_chunks<4>(x, a_t + k0, in, rank, low + k0); break;
  }
#else
  float acc[kInputWays][32] = {};
  for (int64_t i = 0; i < in; ++i) {
    const float xi = as_float(x[i]);
    float* way = acc[i % kInputWays];
    for (int64_t k = 0; k < lanes; ++k)
      way[k] = std::fma(xi, as_float(a_t[i * rank + k0 + k]), way[k]);
  }
  for (int64_t k = 0; k < lanes; ++k) low[k0 + k] = (acc[0][k] + acc[1][k]) + (acc[2][k] + acc[3][k]);
#endif
}

constexpr int64_t kAdapterRows = 4;  // rows of one adapter sharing each load of B
constexpr int64_t kRankChunk = 32;  // rank columns one task of the first pass sums
constexpr int64_t kColumnGroup = 64;  // output columns one task of the second pass adds
constexpr int kWaitSpins = 20000;  // polls of a task waiting for the rank chunks, then yields
constexpr int64_t kOutBlock = 16;  // B is stored [width / 16][cap][16]: a block's k rows adjoin


#ifdef INHOUSE_AVX2
// p[0:8] = round(p[0:8] + delta), rounded to p's type as a scalar store rounds it. The empty
// asm hands delta over as a finished value: the compiler may not fuse the product that made
// it into this sum (a fused multiply-add would round once, not twice, and only where it chose).
template <typename T>
inline __m256 added(const T* p, __m256 delta) {
  asm("" : "+x"(delta));
  return _mm256_add_ps(load8(p), delta);
}
inline void add_into8(float* p, __m256 delta) { store8(p, added(p, delta)); }
inline void add_into8(c10::BFloat16* p, __m256 delta) { store8(p, round_bf16(added(p, delta))); }

// outs[r][o : o + 16 * kBlocks] for kRows rows: each load of B shared by every row,
// kRows * kBlocks * 2 independent sums in registers (enough to hide the FMA's latency), each
// block's B read front to back (`block`: kBlocks blocks of `cap` rows of 16 columns, summed
// over their first `used` rows against `lows`, each row's `stride` apart).
template <int kRows, int kBlocks, typename T, typename W>
void add_blocks(T* const* outs, const float* lows, int64_t stride, int64_t cap, const W* block,
                const float* scale, int64_t used, int64_t width, int64_t o) {
  __m256 acc[kRows][kBlocks][2];
  for (int r = 0; r < kRows; ++r)
    for (int j = 0; j < kBlocks; ++j) acc[r][j][0] = acc[r][j][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < used; ++k) {
    __m256 b[kBlocks][2];
    for (int j = 0; j < kBlocks; ++j) {
      b[j][0] = load8(block + (j * cap + k) * kOutBlock);
      b[j][1] = load8(block + (j * cap + k) * kOutBlock + 8);
    }
    for (int r = 0; r < kRows; ++r) {
      const __m256 l = _mm256_set1_ps(lows[r * stride + k]);
      for (int j = 0; j < kBlocks; ++j) {
        acc[r][j][0] = _mm256_fmadd_ps(l, b[j][0], acc[r][j][0]);
        acc[r][j][1] = _mm256_fmadd_ps(l, b[j][1], acc[r][j][1]);
      }
    }
  }
  for (int j = 0; j < kBlocks; ++j) {
    const int64_t at = o + j * kOutBlock, lanes = std::min<int64_t>(kOutBlock, width - at);
    for (int r = 0; r < kRows; ++r) {
      const __m256 low = _mm256_mul_ps(acc[r][j][0], _mm256_loadu_ps(scale + at));
      const __m256 high = _mm256_mul_ps(acc[r][j][1], _mm256_loadu_ps(scale + at + 8));
      if (lanes == kOutBlock) {
        add_into8(outs[r] + at, low);
        add_into8(outs[r] + at + 8, high);
        continue;
      }
      alignas(32) float delta[16];
      _mm256_store_ps(delta, low);
      _mm256_store_ps(delta + 8, high);
      for (int64_t l = 0; l < lanes; ++l)
        outs[r][at + l] = static_cast<T>(as_float(outs[r][at + l]) + delta[l]);
    }
  }
}
#endif

// One slot's B as the kernel reads it: `blocks` of `cap` rank rows of 16 output columns,
// the first `used` rows in use; block j sums the low-rank columns from `first[j]` on (-1:
// no part of the adapter writes there).
template <typename W>
struct SlotB {
  const W* blocks;
  const float* scale;
  const int64_t* first;
  int64_t cap, used;
};

// out_r[o] = round(out_r[o] + (low_r[first : first + used] @ B[:, o]) * scale[o]) for the
// 16-column blocks from o_begin to o_end (block boundaries) and `count` rows of one adapter
// (lows `stride` apart): each lane sums over the rank in order with fused multiply-adds, then
// is scaled, then added, as PEFT orders it. Runs of blocks on one part share each load of B
// across the rows, kBlocks at a time; a row's sums are the same whatever block, run or range.
template <int kRows, int kBlocks, typename T, typename W>
void add_runs(T* const* outs, const float* lows, int64_t stride, const SlotB<W>& b,
              int64_t width, int64_t o_begin, int64_t o_end) {
  const int64_t blocks = (o_end + kOutBlock - 1) / kOutBlock;
  for (int64_t j = o_begin / kOutBlock; j < blocks;) {
    const int64_t first = b.first[j];
    int64_t run = 1;
    while (j + run < blocks && b.first[j + run] == first) ++run;
    if (first >= 0) {
      const float* low = lows + first;
      int64_t at = j;
#ifdef INHOUSE_AVX2
      for (; at + kBlocks <= j + run; at += kBlocks)
        add_blocks<kRows, kBlocks>(outs, low, stride, b.cap, b.blocks + at * b.cap * kOutBlock,
                                   b.scale, b.used, width, at * kOutBlock);
      for (; at < j + run; ++at)
        add_blocks<kRows, 1>(outs, low, stride, b.cap, b.blocks + at * b.cap * kOutBlock,
                             b.scale, b.used, width, at * kOutBlock);
#else
      for (int64_t o = at * kOutBlock; o < std::min(width, (j + run) * kOutBlock); ++o) {
        const W* column = b.blocks + (o / kOutBlock) * b.cap * kOutBlock + o % kOutBlock;
        for (int r = 0; r < kRows; ++r) {
          float acc = 0.f;
          for (int64_t k = 0; k < b.used; ++k)
            acc = std::fma(low[r * stride + k], as_float(column[k * kOutBlock]), acc);
          outs[r][o] = static_cast<T>(as_float(outs[r][o]) + acc * b.scale[o]);
        }
      }
#endif
    }
    j += run;
  }
}

template <typename T, typename W>
void add_products(T* const* outs, const float* lows, int64_t count, int64_t stride,
                  const SlotB<W>& b, int64_t width, int64_t o_begin, int64_t o_end) {
  switch (count) {
    case 1: add_runs<1, 4>(outs, lows, stride, b, width, o_begin, o_end); break;
    case 2: add_runs<2, 2>(outs, lows, stride, b, width, o_begin, o_end); break;
    case 3: add_runs<3, 1>(outs, lows, stride, b, width, o_begin, o_end); break;
    default: add_runs<4, 1>(outs, lows, stride, b, width, o_begin, o_end); break;
  }
}

// One layer's stacks of one projection: where each tensor starts and how far apart its slots
// are, from [S, ...] tensors or [layers, S, ...] ones at `layer`.
struct LayerStack {
  const void* a;
  const void* b;
  const float* scale;
  const int64_t* layout;
  int64_t a_slot, b_slot, scale_slot, layout_slot, rank, cap;

  LayerStack(const torch::Tensor& a_t, const torch::Tensor& b_t, const torch::Tensor& scale_t,
             const torch::Tensor& layout_t, int64_t layer) {
    const int64_t lead = layer < 0 ? 0 : 1;  // a leading layer dimension
    const int64_t at = lead * layer;  // 0 without one
    a = static_cast<const char*>(a_t.data_ptr()) + at * a_t.stride(0) * a_t.element_size();
    b = static_cast<const char*>(b_t.data_ptr()) + at * b_t.stride(0) * b_t.element_size();
    scale = scale_t.data_ptr<float>() + at * scale_t.stride(0);
    layout = layout_t.data_ptr<int64_t>() + at * layout_t.stride(0);
    a_slot = a_t.stride(lead);
    b_slot = b_t.stride(lead);
    scale_slot = scale_t.stride(lead);
    layout_slot = layout_t.stride(lead);
    rank = a_t.size(lead + 2);
    cap = b_t.size(lead + 2);
  }
};

template <typename T, typename W>
void add_rows(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& row_slots,
              const LayerStack& stack) {
  const int64_t rows = x.size(0), in = x.numel() / rows, rank = stack.rank, width = out.size(1);
  const int64_t* slot_of = row_slots.data_ptr<int64_t>();
  const int64_t* layout_of = stack.layout;
  const int64_t layout_stride = stack.layout_slot;
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
  const W *a = static_cast<const W*>(stack.a), *b = static_cast<const W*>(stack.b);
  const float* s = stack.scale;
  // Two phases in one dispatch, each split finely enough that one row keeps both cores busy
  // (a row alone reads its adapter's every byte): each row's rank columns, kRankChunk at a
  // time, then each block of rows' output columns, kColumnGroup at a time, once every rank
  // chunk is in. Tasks are claimed in order, so a waiting task waits only for chunks already
  // running. The split moves no sum.
  std::vector<float> lows(adapted.size() * rank);
  std::vector<std::pair<int64_t, int64_t>> chunks;  // (row in `adapted`, first rank column)
  for (size_t i = 0; i < adapted.size(); ++i)
    for (int64_t k0 = 0; k0 < layout_of[slot_of[adapted[i]] * layout_stride]; k0 += kRankChunk)
      chunks.emplace_back(i, k0);
  const int64_t low_tasks = static_cast<int64_t>(chunks.size());
  const int64_t groups = (width + kColumnGroup - 1) / kColumnGroup;
  std::atomic<int64_t> lows_done{0};
  inhouse::parallel_for(0, low_tasks + static_cast<int64_t>(blocks.size()) * groups, 1, [&](int64_t begin, int64_t end) {
    T* outs[kAdapterRows];
    for (int64_t task = begin; task < end; ++task) {
      if (task < low_tasks) {
        const auto [i, k0] = chunks[task];
        const int64_t r = adapted[i], slot = slot_of[r];
        const int64_t lanes = std::min<int64_t>(kRankChunk, layout_of[slot * layout_stride] - k0);
        low_rank(xs + r * in, a + slot * stack.a_slot, in, rank, k0, lanes, lows.data() + i * rank);
        lows_done.fetch_add(1, std::memory_order_release);
        continue;
      }
      for (int spin = 0; lows_done.load(std::memory_order_acquire) < low_tasks; ++spin) {
        if (spin < kWaitSpins) INHOUSE_PAUSE();
        else std::this_thread::yield();
      }
      const auto [first, last] = blocks[(task - low_tasks) / groups];
      const int64_t slot = slot_of[adapted[first]];
      const int64_t o_begin = ((task - low_tasks) % groups) * kColumnGroup;
      for (int64_t i = first; i < last; ++i) outs[i - first] = o + adapted[i] * width;
      const int64_t* slot_layout = layout_of + slot * layout_stride;
      const SlotB<W> slot_b{b + slot * stack.b_slot, s + slot * stack.scale_slot, slot_layout + 2,
                            stack.cap, slot_layout[1]};
      add_products(outs, lows.data() + first * rank, last - first, rank, slot_b, width, o_begin,
                   std::min(width, o_begin + kColumnGroup));
    }
  });
}

}  // namespace

// Adds each row's adapter product to ``out [T, width]`` from ``x [T, in]`` (or ``[T, ...]``
// holding ``in`` a row: no view to make; both float32, or both bfloat16): ``row_slots [T]``
// is each row's adapter slot (-1: the base, untouched); per slot, ``a_t [S, in, rank]`` (its
// parts side by side in the rank columns), ``b_t [S, width / 16, cap, 16]`` (B's 16-column
// blocks, each read front to back; float32 or bfloat16, summed in float32 as PEFT computes
// an adapter), ``scale [S, width rounded up to 16]`` (float32) and ``layout [S, 2 + width /
// 16]``: the rank columns in use, the rows of each block in use (both multiples of 8), and
// each block's first rank column (-1: none). A row's bits depend on nothing but its own
// inputs and slot. With `layer` (not -1) the four hold every layer's stacks ([layers, S,
// ...]) and that layer's are used: one tensor each for a whole model's projection, so a
// decode step hands over 16 tensors, not 16 a layer.
void lora_add_layer(torch::Tensor out, const torch::Tensor& x, const torch::Tensor& row_slots,
                    const torch::Tensor& a_t, const torch::Tensor& b_t, const torch::Tensor& scale,
                    const torch::Tensor& layout, int64_t layer) {
  const int64_t lead = layer < 0 ? 0 : 1;
  TORCH_CHECK(out.is_contiguous() && x.is_contiguous() && a_t.is_contiguous() &&
              b_t.is_contiguous() && scale.is_contiguous() && row_slots.is_contiguous() &&
              layout.is_contiguous());
  TORCH_CHECK(out.scalar_type() == x.scalar_type() && row_slots.scalar_type() == torch::kInt64 &&
              layout.scalar_type() == torch::kInt64);
  TORCH_CHECK(a_t.scalar_type() == b_t.scalar_type() &&
              (a_t.scalar_type() == torch::kFloat32 || a_t.scalar_type() == torch::kBFloat16 ||
               a_t.scalar_type() == torch::kChar) &&
              scale.scalar_type() == torch::kFloat32);
  TORCH_CHECK(a_t.dim() == 3 + lead && b_t.dim() == 4 + lead && scale.dim() == 2 + lead &&
              layout.dim() == 2 + lead && (lead == 0 || (layer < a_t.size(0) &&
              b_t.size(0) == a_t.size(0) && scale.size(0) == a_t.size(0) &&
              layout.size(0) == a_t.size(0))));
  TORCH_CHECK(out.dim() == 2 && x.dim() >= 2 && x.size(0) == out.size(0) &&
              row_slots.size(0) == x.size(0) && a_t.size(lead + 1) * x.size(0) == x.numel() &&
              b_t.size(lead + 1) == (out.size(1) + kOutBlock - 1) / kOutBlock &&
              b_t.size(lead + 2) <= a_t.size(lead + 2) && b_t.size(lead + 3) == kOutBlock &&
              scale.size(lead + 1) >= b_t.size(lead + 1) * kOutBlock &&
              a_t.size(lead + 2) % 8 == 0 && b_t.size(lead + 2) % 8 == 0 &&
              layout.size(lead) == a_t.size(lead) && layout.size(lead + 1) == 2 + b_t.size(lead + 1));
  TORCH_CHECK(out.scalar_type() == torch::kFloat32 || out.scalar_type() == torch::kBFloat16,
              "lora_add: float32 or bfloat16 rows");
  if (x.size(0) == 0) return;
  const LayerStack stack(a_t, b_t, scale, layout, layer);
  const bool float_rows = out.scalar_type() == torch::kFloat32;
  if (a_t.scalar_type() == torch::kFloat32) {
    if (float_rows) add_rows<float, float>(out, x, row_slots, stack);
    else add_rows<c10::BFloat16, float>(out, x, row_slots, stack);
  } else if (a_t.scalar_type() == torch::kChar) {
    if (float_rows) add_rows<float, int8_t>(out, x, row_slots, stack);
    else add_rows<c10::BFloat16, int8_t>(out, x, row_slots, stack);
  } else {
    if (float_rows) add_rows<float, c10::BFloat16>(out, x, row_slots, stack);
    else add_rows<c10::BFloat16, c10::BFloat16>(out, x, row_slots, stack);
  }
}

void lora_add(torch::Tensor out, const torch::Tensor& x, const torch::Tensor& row_slots,
              const torch::Tensor& a_t, const torch::Tensor& b_t, const torch::Tensor& scale,
              const torch::Tensor& layout) {
  lora_add_layer(out, x, row_slots, a_t, b_t, scale, layout, -1);
}

}  // namespace inhouse
