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
constexpr int kChains = 8;  // C rows summed together: vdpbf16ps's latency hidden

// c [16 rows, stride c_stride floats] += a [16 rows of 32 bf16, stride a_stride] x b.
inline void product(float* c, int64_t c_stride, const uint16_t* a, int64_t a_stride,
                    const uint16_t* b) {
  __m512bh w[kPairs];
  for (int p = 0; p < kPairs; ++p) w[p] = (__m512bh)_mm512_loadu_si512(b + 32 * p);
  for (int r0 = 0; r0 < kRows; r0 += kChains) {
    __m512 acc[kChains];
    for (int r = 0; r < kChains; ++r) acc[r] = _mm512_loadu_ps(c + (r0 + r) * c_stride);
    for (int p = 0; p < kPairs; ++p) {
      for (int r = 0; r < kChains; ++r) {
        int32_t pair;
        __builtin_memcpy(&pair, a + (r0 + r) * a_stride + 2 * p, sizeof pair);
        acc[r] = _mm512_dpbf16_ps(acc[r], w[p], (__m512bh)_mm512_set1_epi32(pair));
      }
    }
    for (int r = 0; r < kChains; ++r) _mm512_storeu_ps(c + (r0 + r) * c_stride, acc[r]);
  }
}

// `values` floats (a multiple of 32) as bf16, nearest even (below float's normal range, 0).
inline void to_bf16(const float* x, int64_t values, uint16_t* out) {
  for (int64_t f = 0; f < values; f += 32) {
    _mm512_storeu_si512(out + f, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + f + 16),
                                                             _mm512_loadu_ps(x + f)));
  }
}

// c [16 rows, stride c_stride] = 0.
inline void zero(float* c, int64_t c_stride) {
  for (int r = 0; r < kRows; ++r) _mm512_storeu_ps(c + r * c_stride, _mm512_setzero_ps());
}
#endif

}  // namespace inhouse::bf16_dot
