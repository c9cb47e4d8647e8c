// A quantized linear's prompt rows on AMX bf16 tiles (Sapphire Rapids and later).
//
// quant_linear.cpp's loops, and amx_linear.cpp's int8 tiles that give their bits, fold each
// group of 32 products into float32 with the group's two scales: exact to the VNNI loops,
// but on a long prompt the folds, not the products, set the pace (~0.45 TOP/s of the
// tiles' ~9). A prompt's own rows (those the caller marks; a generated token's never) take
// this path instead: per panel of 32 outputs the weights are dequantized once (q8: d q,
// q4: fma(d, q, m)) and rounded to bf16 in the tiles' B layout, and the rows, rounded to
// bf16, pass through bf16_tiles.h's products, the panel feeding every row tile. A row's
// bits are its own whatever the chunking or the rows beside it; they are not the int8
// path's, which is why only a prompt's rows, always and only they, come here.

#include "prompt_linear.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "bf16_dot.h"
#include "bf16_tiles.h"
#include "quant_layout.h"
#include "work_pool.h"

namespace inhouse::prompt_linear {
namespace {

#ifdef INHOUSE_AMX_BF16
using bf16_tiles::kBlock;
using bf16_tiles::kDepth;

// One quad j of a weight tile's group (k = 4j .. 4j + 3 of its 8 outputs; in q4, pair j / 2's
// low nibbles for even j, high ones for odd) as 32 floats in byte order: lanes 4r + i are
// output r's code at k = 4j + i, times d (q4: fma(d, code, m)), in two registers.
template <bool kQ4>
inline void quad_values(const uint8_t* group, int j, __m512 d, __m512 m, __m512* out) {
  __m256i bytes;
  if constexpr (kQ4) {
    const __m256i pair = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32 * (j / 2)));
    bytes = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(pair, 4) : pair, _mm256_set1_epi8(0x0F));
  } else {
    bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32 * j));
  }
  for (int h = 0; h < 2; ++h) {
    const __m128i half = h ? _mm256_extracti128_si256(bytes, 1) : _mm256_castsi256_si128(bytes);
    const __m512 codes = _mm512_cvtepi32_ps(kQ4 ? _mm512_cvtepu8_epi32(half) : _mm512_cvtepi8_epi32(half));
    const __m512i rows = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i at = _mm512_add_epi32(rows, _mm512_set1_epi32(4 * h));
    const __m512 scale = _mm512_permutexvar_ps(at, d);
    out[h] = kQ4 ? _mm512_fmadd_ps(scale, codes, _mm512_permutexvar_ps(at, m))
                 : _mm512_mul_ps(scale, codes);
  }
}

// Outputs [first, first + 16 blocks) dequantized and rounded to bf16 (nearest even) into
// `panel` in pack_bf16's layout: group g's B tile holds, as dword 16 p + o, output o's
// pair of inputs k = 2p, 2p + 1.
template <bool kQ4>
void dequantize(const Rows& w, int64_t first, int64_t blocks, uint16_t* panel) {
  const int64_t groups = w.k / kGroup;
  const int64_t group_bytes = kQ4 ? kQ4TileGroupBytes : kQ8TileGroupBytes;
  // dwords of a quad's 32 bf16 (output r's pairs at 2r, 2r + 1) as [pair 0 of r = 0..7,
  // pair 1 of r = 0..7]
  const __m512i by_pair = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t t = first / kTile; t < (first + blocks * kBlock) / kTile; ++t) {
    const int64_t b = (t * kTile - first) / kBlock, o = (t * kTile - first) % kBlock;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* group = w.wq + (t * groups + g) * group_bytes;
      const int64_t at = (t * groups + g) * kTile;
      const __m512 d = _mm512_castps256_ps512(_mm256_loadu_ps(w.wd + at));
      const __m512 m = kQ4 ? _mm512_castps256_ps512(_mm256_loadu_ps(w.wm + at)) : d;
      uint32_t* tile = reinterpret_cast<uint32_t*>(panel + (b * groups + g) * kDepth * kBlock);
      for (int j = 0; j < kGroup / 4; ++j) {
        __m512 values[2];
        quad_values<kQ4>(group, j, d, m, values);
        const __m512i pairs = _mm512_permutexvar_epi32(
            by_pair, (__m512i)_mm512_cvtne2ps_pbh(values[1], values[0]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + 16 * (2 * j) + o),
                            _mm512_castsi512_si256(pairs));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + 16 * (2 * j + 1) + o),
                            _mm512_extracti64x4_epi64(pairs, 1));
      }
    }
  }
}

template <bool kQ4>
void run(const Rows& w) {
  const int64_t rows = static_cast<int64_t>(w.index.size()), k = w.k, n = w.tiles * kTile;
  const int64_t groups = k / kGroup, blocks = n / kBlock;
  std::vector<uint16_t> x(rows * k);  // the rows, rounded to bf16 (nearest even)
  inhouse::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      bf16_dot::to_bf16(w.x + w.index[j] * k, k, x.data() + j * k);
    }
  });
  const std::vector<uint16_t> tail = bf16_tiles::tail_tile(x.data(), rows, k);
  inhouse::parallel_for(0, (blocks + 1) / 2, 1, [&](int64_t begin, int64_t end) {
    bf16_tiles::configure();
    std::vector<uint16_t> panel(2 * groups * kDepth * kBlock);
    const bf16_tiles::Pass pass{x.data(), k, panel.data()};
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t first = 2 * pair * kBlock, count = std::min<int64_t>(2, blocks - 2 * pair);
      dequantize<kQ4>(w, first, count, panel.data());
      auto store = [&](int64_t row, int64_t column, __m512 sums) {
        if (w.bias) sums = _mm512_add_ps(sums, _mm512_loadu_ps(w.bias + first + column));
        _mm512_storeu_ps(w.out + w.index[row] * n + first + column, sums);
      };
      if (count == 2) {
        bf16_tiles::column_pass<2>(pass, rows, 0, tail.data(), store);
      } else {
        bf16_tiles::column_pass<1>(pass, rows, 0, tail.data(), store);
      }
    }
    _tile_release();
  });
}
#endif

}  // namespace

bool ready(int64_t tiles) { return bf16_tiles::ready() && tiles % 2 == 0; }

void linear(const Rows& rows) {
#ifdef INHOUSE_AMX_BF16
  if (rows.wm) {
    run<true>(rows);
  } else {
    run<false>(rows);
  }
#else
  (void)rows;
#endif
}

}  // namespace inhouse::prompt_linear
