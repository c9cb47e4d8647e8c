// bf16 tile products on AVX-512 BF16's vdpbf16ps, for CPUs with that and no AMX (AMD Zen 4;
// also an AMX CPU whose tiles Linux did not grant): the operands of bf16_tiles.h's products
// in the same layouts (A 16 rows of 32 bf16, B 16 rows of 16 bf16 pairs, C 16 rows of 16
// float32), so a caller written for the tiles runs here unchanged. Each C row sums its 16
// pairs in order, one vdpbf16ps a pair (two products, then the sum): not the tiles' order
// (their bits differ), but a row's own, whatever the rows beside it.
#pragma once

#include <cstdint>

#include "simd.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define INHOUSE_BF16_DOT 1
#endif

namespace inhouse::bf16_dot {

#ifdef INHOUSE_BF16_DOT
constexpr int kRows = 16;   // rows of A and C
constexpr int kPairs = 16;  // rows of B: pairs of inputs a product sums
constexpr int kChains = 8;  // rows summed together, two blocks each: 16 chains in flight

// sum + w times the bf16 pair at x broadcast to every lane. The broadcast is an instruction
// of its own: vdpbf16ps's {1to16} memory operand ran at a fifth of the rate on Zen 4.
inline __m512 dot_pair(__m512 sum, __m512bh w, const uint16_t* x) {
  int32_t pair;
  __builtin_memcpy(&pair, x, sizeof pair);
  return _mm512_dpbf16_ps(sum, w, (__m512bh)_mm512_set1_epi32(pair));
}

// R rows of a (stride a_stride; `groups` groups of 32 bf16) by kBlocks (1-2) blocks of 16
// outputs, block j's group g the B tile at b + j * block_stride + g * group_stride. Each
// output is one float32 chain from zero over the groups' pairs in order: store(r, j, its 16
// sums). R rows by two blocks keep up to 16 chains in flight, enough to cover vdpbf16ps's
// latency at two a cycle (eight left Zen 4 at ~60 % of its rate). ahead: elements of B to
// ask for ahead of each group (weights streaming from memory), 0 for none.
template <int R, int kBlocks, typename Store>
inline void chains(const uint16_t* a, int64_t a_stride, const uint16_t* b, int64_t block_stride,
                   int64_t group_stride, int64_t groups, int64_t ahead, Store&& store) {
  __m512 acc[kBlocks][R];
  for (int j = 0; j < kBlocks; ++j) {
    for (int r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    const uint16_t* bg = b + g * group_stride;
    if (ahead) {
      for (int j = 0; j < kBlocks; ++j) prefetch(bg + j * block_stride + ahead, 1024);
    }
#pragma GCC unroll 16
    for (int p = 0; p < kPairs; ++p) {
      __m512bh pairs[kBlocks];
#pragma GCC unroll 2
      for (int j = 0; j < kBlocks; ++j) {
        pairs[j] = (__m512bh)_mm512_loadu_si512(bg + j * block_stride + 32 * p);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint16_t* x = a + r * a_stride + 32 * g + 2 * p;
#pragma GCC unroll 2
        for (int j = 0; j < kBlocks; ++j) acc[j][r] = dot_pair(acc[j][r], pairs[j], x);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < kBlocks; ++j) store(r, j, acc[j][r]);
  }
}

// Two blocks of outputs from zero for 16 rows: block j of row r at c + r * c_stride +
// j * c_block (see chains).
inline void products(float* c, int64_t c_stride, int64_t c_block, const uint16_t* a,
                     int64_t a_stride, const uint16_t* b, int64_t block_stride,
                     int64_t group_stride, int64_t groups) {
  for (int r0 = 0; r0 < kRows; r0 += kChains) {
    chains<kChains, 2>(a + r0 * a_stride, a_stride, b, block_stride, group_stride, groups, 0,
                       [&](int r, int j, __m512 sums) {
                         _mm512_storeu_ps(c + (r0 + r) * c_stride + j * c_block, sums);
                       });
  }
}

// `values` floats (a multiple of 32) as bf16, nearest even (below float's normal range, 0).
inline void to_bf16(const float* x, int64_t values, uint16_t* out) {
  for (int64_t f = 0; f < values; f += 32) {
    _mm512_storeu_si512(out + f, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + f + 16),
                                                             _mm512_loadu_ps(x + f)));
  }
}

#endif

}  // namespace inhouse::bf16_dot
