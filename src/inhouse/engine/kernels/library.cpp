// The kernels as torch ops: torch.ops.inhouse_cpu (amx_linear.cpp adds use_amx, and
// decode_layers.cpp the decode step over the others).

#include <torch/library.h>

#include <cstdint>

#include "kernels.h"
#include "work_pool.h"

namespace {

// The calling thread's share of the work pool (threads, itself included; 0: its torch
// setting), apart from torch's own threads.
void set_pool_threads(int64_t threads) {
  TORCH_CHECK(threads >= 0, "threads must be >= 0");
  inhouse::WorkPool::caller_threads() = static_cast<int>(threads);
}

}  // namespace

TORCH_LIBRARY(inhouse_cpu, m) {
  m.def("linear_q8(Tensor x, Tensor q, Tensor d, Tensor? bias, Tensor? prompt_rows=None) -> Tensor");
  m.def(
      "linear_q4(Tensor x, Tensor q, Tensor d, Tensor mins, Tensor? bias, "
      "Tensor? prompt_rows=None) -> Tensor");
  m.def(
      "paged_attention_rows(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor? row_seq, Tensor context_lens, int block_size, float scale, int window, "
      "bool torch_threads=True, Tensor? prompt_rows=None) -> Tensor");
  m.def(
      "rope_write_kv(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor slots, int heads) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def(
      "lora_add(Tensor(a!) out, Tensor x, Tensor row_slots, Tensor a_t, Tensor b_t, "
      "Tensor scale, Tensor layout) -> ()");
  m.def("add_rms_norm(Tensor(a!) residual, Tensor? delta, Tensor weight, float eps) -> Tensor");
  m.def("quantize_q8(Tensor weight) -> (Tensor, Tensor)");
  m.def("quantize_q4(Tensor weight) -> (Tensor, Tensor, Tensor)");
  m.def("set_pool_threads(int threads) -> ()", &set_pool_threads);
}

TORCH_LIBRARY_IMPL(inhouse_cpu, CPU, m) {
  m.impl("linear_q8", &inhouse::linear_q8);
  m.impl("linear_q4", &inhouse::linear_q4);
  m.impl("paged_attention_rows", &inhouse::paged_attention_rows);
  m.impl("rope_write_kv", &inhouse::rope_write_kv);
  m.impl("silu_mul", &inhouse::silu_mul);
  m.impl("lora_add", &inhouse::lora_add);
  m.impl("add_rms_norm", &inhouse::add_rms_norm);
  m.impl("quantize_q8", &inhouse::quantize_q8);
  m.impl("quantize_q4", &inhouse::quantize_q4);
}
