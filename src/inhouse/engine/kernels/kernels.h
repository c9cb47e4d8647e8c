// The kernels' torch-facing functions, one family a file, registered as torch.ops.inhouse_cpu
// by library.cpp; each is described where it is defined.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <tuple>

namespace inhouse {

// quant_linear.cpp: weight-only quantized linears and the weights' quantization.
torch::Tensor linear_q8(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                        const c10::optional<torch::Tensor>& bias,
                        const c10::optional<torch::Tensor>& prompt_rows);
torch::Tensor linear_q4(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                        const torch::Tensor& mins, const c10::optional<torch::Tensor>& bias,
                        const c10::optional<torch::Tensor>& prompt_rows);
torch::Tensor linear_any(const torch::Tensor& x, const c10::List<c10::optional<torch::Tensor>>& w,
                         size_t at);
std::tuple<torch::Tensor, torch::Tensor> quantize_q8(const torch::Tensor& weight);
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> quantize_q4(const torch::Tensor& weight);

// attention.cpp: paged attention of query rows.
torch::Tensor paged_attention_rows(const torch::Tensor& q, const torch::Tensor& k_cache,
                                   const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                                   const c10::optional<torch::Tensor>& row_seq,
                                   const torch::Tensor& context_lens, int64_t block_size,
                                   double scale, int64_t window, bool torch_threads,
                                   const c10::optional<torch::Tensor>& prompt_rows);

// rotary.cpp: rotary embedding and the K/V cache writes.
torch::Tensor rope_write_kv(const torch::Tensor& qkv, const torch::Tensor& cos,
                            const torch::Tensor& sin, torch::Tensor k_cache, torch::Tensor v_cache,
                            const torch::Tensor& slots, int64_t heads);

// swiglu.cpp: silu(gate) * up.
torch::Tensor silu_mul(const torch::Tensor& gate_up);

// lora.cpp: LoRA adapters' products on their rows.
void lora_add(torch::Tensor out, const torch::Tensor& x, const torch::Tensor& row_slots,
              const torch::Tensor& a_t, const torch::Tensor& b_t, const torch::Tensor& scale,
              const torch::Tensor& layout);
void lora_add_layer(torch::Tensor out, const torch::Tensor& x, const torch::Tensor& row_slots,
                    const torch::Tensor& a_t, const torch::Tensor& b_t, const torch::Tensor& scale,
                    const torch::Tensor& layout, int64_t layer);

// norms.cpp: residual update and RMSNorm.
torch::Tensor add_rms_norm(torch::Tensor residual, const c10::optional<torch::Tensor>& delta,
                           const torch::Tensor& weight, double eps);

}  // namespace inhouse
