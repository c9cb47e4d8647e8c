// bf16 tile products on AVX-512 BF16's vdpbf16ps, for CPUs with that and no AMX (AMD Zen 4;
// also an AMX CPU whose tiles Linux did not grant): the operands of bf16_tiles.h's products
// in the same layouts (A 16 rows of 32 bf16, B 16 rows of 16 bf16 pairs, C 16 rows of 16
// float32), so a caller written for the tiles runs here unchanged. Each C row sums its 16
// pairs in order, one vdpbf16ps a pair (two products, then the sum): not the tiles' order
// (their bits differ), but a row's own, whatever the rows beside it.
#pragma once

#include <cstdint>

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

// Two blocks of outputs from zero: c0 and c1 [16 rows, stride c_stride floats] = a [16 rows
// of 32 groups bf16, stride a_stride] by B tiles b0[g] and b1[g] (g < groups), each output
// one chain over the groups' pairs in order. Eight rows by two blocks are 16 chains at
// once, enough to cover vdpbf16ps's latency at two a cycle (one block of eight rows left
// Zen 4 at ~60 % of its rate).
inline void products(float* c0, float* c1, int64_t c_stride, const uint16_t* a,
                     int64_t a_stride, const uint16_t* const* b0, const uint16_t* const* b1,
                     int groups) {
  for (int r0 = 0; r0 < kRows; r0 += kChains) {
    __m512 acc0[kChains], acc1[kChains];
    for (int r = 0; r < kChains; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; ++g) {
#pragma GCC unroll 16
      for (int p = 0; p < kPairs; ++p) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(b0[g] + 32 * p);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(b1[g] + 32 * p);
#pragma GCC unroll 8
        for (int r = 0; r < kChains; ++r) {
          const uint16_t* x = a + (r0 + r) * a_stride + 32 * g + 2 * p;
          acc0[r] = dot_pair(acc0[r], w0, x);
          acc1[r] = dot_pair(acc1[r], w1, x);
        }
      }
    }
    for (int r = 0; r < kChains; ++r) {
      _mm512_storeu_ps(c0 + (r0 + r) * c_stride, acc0[r]);
      _mm512_storeu_ps(c1 + (r0 + r) * c_stride, acc1[r]);
    }
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
