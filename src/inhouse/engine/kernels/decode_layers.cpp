// A decode step through every decoder layer in one call, over the other families' kernels.

#include <torch/library.h>
#include <torch/types.h>

#include <cstdint>

#include "kernels.h"
#include "kv_rows.h"

namespace inhouse {
namespace {

constexpr size_t kLayerWeights = 18;
constexpr size_t kAdapterStacks = 16;  // a_t, b_t, scale, layout for qkv, o, gate_up, down

// `y` with each row's adapter product added (lora.cpp), when the step has adapter rows:
// projection `at / 4`'s stacks at `layer`.
torch::Tensor adapted(torch::Tensor y, const torch::Tensor& x,
                      const c10::optional<torch::Tensor>& lora_rows,
                      at::TensorList lora, size_t at, int64_t layer) {
  if (lora_rows.has_value())
    lora_add_layer(y, x, *lora_rows, lora[at], lora[at + 1], lora[at + 2], lora[at + 3], layer);
  return y;
}

// A decode step (one new token for each of T sequences, or a few: a speculative draft's rows,
// each row's sequence in `row_seq`) through every decoder layer, calling the other families'
// kernels in the order the model's fused Python path calls them, so each row gets the same
// bits; what it saves is Python's dispatch of ~10 ops a layer. `weights` holds
// kLayerWeights entries a layer: input norm; qkv (q, d, mins?, bias?); o (the same four);
// post-attention norm; gate_up; down. Adds the previous MLP output `delta` into `residual`
// (in place) and returns the last layer's MLP output. A nonzero `stop[0]` (an int32 another
// thread may set while this runs) ends the call before the next layer, returning an empty
// tensor: the step was abandoned (its K/V writes so far are recomputed, the same bits, later).
// With `lora_rows` (each row's adapter slot, -1: none) every projection adds its rows' adapter
// products, `lora` holding kAdapterStacks stacks, each with every layer's, as the Python path
// adds them.
torch::Tensor decode_layers(torch::Tensor residual, const c10::optional<torch::Tensor>& delta,
                            const torch::Tensor& cos, const torch::Tensor& sin,
                            torch::Tensor kv_caches, const torch::Tensor& slots,
                            const torch::Tensor& block_tables,
                            const c10::optional<torch::Tensor>& row_seq,
                            const torch::Tensor& context_lens, int64_t block_size, int64_t heads,
                            double scale,
                            at::IntArrayRef windows, double eps,
                            const c10::List<c10::optional<torch::Tensor>>& weights,
                            const c10::optional<torch::Tensor>& lora_rows,
                            at::TensorList lora, const c10::optional<torch::Tensor>& stop) {
  const int64_t layers = kv_caches.size(0), tokens = residual.size(0);
  TORCH_CHECK(!stop.has_value() || (stop->scalar_type() == torch::kInt32 && stop->numel() == 1),
              "stop is one int32");
  const volatile int32_t* stop_flag = stop.has_value() ? stop->data_ptr<int32_t>() : nullptr;
  const int64_t kv_heads = kv_caches.size(3);
  const int64_t dim = kv_caches.size(4) - (kv_caches.scalar_type() == torch::kChar ? kQ8Scale : 0);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * static_cast<int64_t>(kLayerWeights) &&
                  static_cast<int64_t>(windows.size()) == layers,
              "one set of weights and one window per layer");
  TORCH_CHECK(!lora_rows.has_value() || lora.size() == kAdapterStacks,
              "four adapter stacks for each of qkv, o, gate_up and down");
  c10::optional<torch::Tensor> added = delta;
  for (int64_t l = 0; l < layers; ++l) {
    if (stop_flag != nullptr && *stop_flag != 0) return torch::empty({0}, residual.options());
    const size_t at = static_cast<size_t>(l) * kLayerWeights;
    torch::Tensor k_cache = kv_caches[l][0], v_cache = kv_caches[l][1];
    const torch::Tensor x = add_rms_norm(residual, added, *weights.get(at), eps);
    const torch::Tensor qkv = adapted(linear_any(x, weights, at + 1), x, lora_rows, lora, 0, l)
                                  .view({tokens, heads + 2 * kv_heads, dim});
    const torch::Tensor q = rope_write_kv(qkv, cos, sin, k_cache, v_cache, slots, heads);
    const torch::Tensor attended = paged_attention_rows(q, k_cache, v_cache, block_tables,
                                                        row_seq, context_lens, block_size, scale,
                                                        windows[l], false, c10::nullopt);
    const torch::Tensor o =
        adapted(linear_any(attended, weights, at + 5), attended, lora_rows, lora, 4, l);
    const torch::Tensor h = add_rms_norm(residual, o, *weights.get(at + 9), eps);
    const torch::Tensor gate_up = adapted(linear_any(h, weights, at + 10), h, lora_rows, lora, 8, l);
    const torch::Tensor act = silu_mul(gate_up);
    added = adapted(linear_any(act, weights, at + 14), act, lora_rows, lora, 12, l);
  }
  return *added;
}

}  // namespace
}  // namespace inhouse

TORCH_LIBRARY_FRAGMENT(inhouse_cpu, m) {
  m.def(
      "decode_layers(Tensor(a!) residual, Tensor? delta, Tensor cos, Tensor sin, "
      "Tensor(b!) kv_caches, Tensor slots, Tensor block_tables, Tensor? row_seq, "
      "Tensor context_lens, int block_size, int heads, float scale, int[] windows, float eps, "
      "Tensor?[] weights, Tensor? lora_rows, Tensor[] lora, Tensor? stop=None) -> Tensor",
      &inhouse::decode_layers);
}
