// A prompt's attention rows on bf16 products (AMX tiles or vdpbf16ps); see attention_tiles.cpp.
#pragma once

#include <cstdint>
#include <vector>

namespace inhouse::tile_attention {

// The rows to attend (index: rows of q in order, consecutive ones of a sequence together)
// and what attention.cpp's paged_attention_rows was given about them.
struct PromptRows {
  const float* q;  // [R, heads, dim]
  float* out;      // [R, heads * dim]
  std::vector<int64_t> index;
  const int64_t* seq;   // each row's sequence (row of tables)
  const int64_t* lens;  // each row's keys, itself included
  const int64_t* tables;
  int64_t table_width, block_size, heads, kv_heads, dim, window;
  float scale;
  bool torch_threads;
};

// Whether this process can attend rows of head dim `dim` on bf16 products (compiled for
// AVX-512 BF16, dim a multiple of 32): AMX tiles where Linux grants them, else vdpbf16ps.
bool ready(int64_t dim);

// Attends rows.index's rows from a cache of T rows (kv_rows.h); needs ready(rows.dim).
template <typename T>
void attend(const PromptRows& rows, const T* k_cache, const T* v_cache);

}  // namespace inhouse::tile_attention
