// CPU kernels: weight-only quantized linears and paged attention for decodes and prefills.
//
// Built on the machine that runs them (-march=native, see build.py), so the same source
// becomes AVX2 or AVX-512 code; the explicit intrinsics below are AVX2/FMA/F16C, with
// AVX-512 VNNI's 64-byte int8 dot products for the quantized linears' integer sums and
// AVX-512's wider attention blocks where the CPU has them (the same bits either way), and
// a plain loop for CPUs without any.
//
// Weight formats, 32 weights a group along the input dimension K (activations are
// quantized the same way on the fly, see quantize_activations):
//   q8: codes q in [-127, 127], one scale d a group; w = d * q.
//   q4: codes q in 0..15 (as GGUF's Q4_1), a scale d and a min m a group; w = d * q + m.
// quantize_q8/quantize_q4 write them in the tiles of 8 rows the linears read (see kTile).
// Activations and outputs are float32. Output tiles are split over the work pool's threads.

#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "amx_linear.h"
#include "quant_layout.h"
#include "work_pool.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define INHOUSE_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define INHOUSE_VNNI 1  // 64-byte int8 dot products (vpdpbusd) in the quantized linears
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define INHOUSE_AVX512 1  // 16-lane attention blocks
#endif
#endif

namespace {

#define INHOUSE_UNROLL _Pragma("GCC unroll 8")

using inhouse::kGroup;

// Activations are quantized per group of 32 to int8 (as llama.cpp's Q8 activations):
// xd = max|x| / 127, xq = round(x / xd), sum = sum(xq), xs = xd * sum (for q4's min term).
// The products then run as int8 dot products, one float multiply-add per group.
struct QuantizedActivations {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int32_t> sum;
};

// One group's codes, its sum, d and d * sum, in the formulas' order; vectorized where the CPU
// has AVX2 (the same IEEE products and round-to-nearest-even as std::nearbyint, so the
// same bits as the scalar loop).
inline void quantize_group(const float* xg, int8_t* qg, float* d_out, float* s_out, int32_t* sum_out) {
#ifdef INHOUSE_AVX2
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 x[4], top = _mm256_setzero_ps();
  for (int c = 0; c < 4; ++c) {
    x[c] = _mm256_loadu_ps(xg + 8 * c);
    top = _mm256_max_ps(top, _mm256_andnot_ps(sign, x[c]));
  }
  __m128 half = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  half = _mm_max_ps(half, _mm_movehl_ps(half, half));
  const float amax = _mm_cvtss_f32(_mm_max_ss(half, _mm_movehdup_ps(half)));
  const float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
  const __m256 inv8 = _mm256_set1_ps(inv);
  __m256i codes[4], total = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    codes[c] = _mm256_cvtps_epi32(_mm256_mul_ps(x[c], inv8));  // nearest even, as nearbyint
    total = _mm256_add_epi32(total, codes[c]);
  }
  const __m256i words = _mm256_permute4x64_epi64(
      _mm256_packs_epi32(codes[0], codes[1]), _MM_SHUFFLE(3, 1, 2, 0));
  const __m256i words2 = _mm256_permute4x64_epi64(
      _mm256_packs_epi32(codes[2], codes[3]), _MM_SHUFFLE(3, 1, 2, 0));
  const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packs_epi16(words, words2),
                                                 _MM_SHUFFLE(3, 1, 2, 0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qg), bytes);
  __m128i sum4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  sum4 = _mm_add_epi32(sum4, _mm_shuffle_epi32(sum4, _MM_SHUFFLE(1, 0, 3, 2)));
  const int sum = _mm_cvtsi128_si32(_mm_add_epi32(sum4, _mm_shuffle_epi32(sum4, _MM_SHUFFLE(2, 3, 0, 1))));
#else
  float amax = 0.f;
  for (int j = 0; j < kGroup; ++j) amax = std::max(amax, std::fabs(xg[j]));
  const float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
  int sum = 0;
  for (int j = 0; j < kGroup; ++j) {
    qg[j] = static_cast<int8_t>(std::nearbyint(xg[j] * inv));
    sum += qg[j];
  }
#endif
  *d_out = d;
  *sum_out = sum;
  *s_out = d * static_cast<float>(sum);
}

QuantizedActivations quantize_activations(const float* x, int64_t rows, int64_t k) {
  const int64_t groups = k / kGroup;
  QuantizedActivations a{std::vector<int8_t>(rows * k), std::vector<float>(rows * groups),
                         std::vector<float>(rows * groups), std::vector<int32_t>(rows * groups)};
  inhouse::parallel_for(0, rows * groups, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      quantize_group(x + i * kGroup, a.q.data() + i * kGroup, &a.d[i], &a.s[i], &a.sum[i]);
    }
  });
  return a;
}

// Weights live in tiles of kTile output rows so that one register holds four consecutive
// codes of each of the tile's 8 rows: a broadcast of 4 activation bytes multiplies all 8
// rows at once, and a group's integer sums become floats 8 rows at a time (one convert and
// one multiply-add per group for 8 rows instead of per row). Per tile and group:
//   q8: 8 quads j of 32 bytes; byte 4r + i is row r's code at k = 4j + i.
//   q4: 4 pairs p of 32 bytes; byte 16h + 4s + i holds row r = 4h + s's codes at
//       k = 8p + i (low nibble) and k = 8p + 4 + i (high nibble).
//   scales d (and q4's mins m): [tiles, groups, 8].
using inhouse::kQ4TileGroupBytes;
using inhouse::kQ8TileGroupBytes;
using inhouse::kTile;
// Activation rows multiplied per pass over a tile (register tile), and per pass over all
// tiles (so a long prompt's rows stay in cache while every tile streams past them). Eight,
// not four: a speculative step's 5-9 rows then unpack each weight tile once, not twice
// (AVX2 host: 5 rows' forward 1.89x one row's, now 1.72x; AVX2 spills a few registers).
constexpr int kRowsAtOnce = 8;
constexpr int64_t kRowBlock = 64;

// The byte of a tile group that holds row r's code at k (0..31); in q4 its low nibble
// when k % 8 < 4, else its high one.
template <bool kQ4>
constexpr int64_t tile_byte(int64_t r, int64_t k) {
  return (kQ4 ? (k / 8) * 32 : (k / 4) * 32) + r * 4 + k % 4;
}

// Row r's code at k (0..31) in one tile group.
template <bool kQ4>
inline int tile_code(const uint8_t* tile_group, int r, int k) {
  if constexpr (kQ4) {
    const uint8_t byte = tile_group[tile_byte<true>(r, k)];
    return (k % 8) < 4 ? byte & 0x0F : byte >> 4;
  } else {
    return static_cast<int8_t>(tile_group[tile_byte<false>(r, k)]);
  }
}

#ifdef INHOUSE_AVX2
// Asks for `bytes` from p that a loop reads soon: the next tile pair's weights while this
// one computes, a paged cache's rows ahead of the attention (timing only; no result changes).
inline void prefetch(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(c + at, _MM_HINT_T0);
}

#ifdef INHOUSE_VNNI
// Lanes 0-7 all dword i of a, lanes 8-15 all dword j.
inline __m512i dword_pair(__m512i a, int i, int j) {
  return _mm512_permutexvar_epi32(
      _mm512_inserti64x4(_mm512_set1_epi32(i), _mm256_set1_epi32(j), 1), a);
}

// The two 8-lane halves of a added: one int32 per tile row.
inline __m256i fold(__m512i a) {
  return _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
}

// Each of R rows' exact int32 sums of one tile group (8 lanes, one per tile row) with 64-byte
// vpdpbusd: a register holds two of the group's 32-byte pieces (q4 pairs, q8 quads) and the
// activation dwords they meet. q8's signed codes go in as u8 (w + 128) and the excess
// 128 * sum(x) comes off at the end.
template <bool kQ4, int R>
inline void group_sums(const uint8_t* group, const int8_t* const* x, const int32_t* x_sums,
                       __m256i* ints) {
  __m512i sum[R], xs[R];
  for (int r = 0; r < R; ++r) {
    sum[r] = _mm512_setzero_si512();
    xs[r] = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r])));
  }
  if constexpr (kQ4) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int p = 0; p < 4; p += 2) {  // pairs p, p + 1: k = 8p.. and 8(p + 1)..
      const __m512i raw = _mm512_loadu_si512(group + p * 32);
      const __m512i first = _mm512_and_si512(raw, low4);
      const __m512i second = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      for (int r = 0; r < R; ++r) {
        sum[r] = _mm512_dpbusd_epi32(sum[r], first, dword_pair(xs[r], 2 * p, 2 * p + 2));
        sum[r] = _mm512_dpbusd_epi32(sum[r], second, dword_pair(xs[r], 2 * p + 1, 2 * p + 3));
      }
    }
    for (int r = 0; r < R; ++r) ints[r] = fold(sum[r]);
  } else {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int j = 0; j < 8; j += 2) {  // quads j, j + 1: k = 4j.. and 4(j + 1)..
      const __m512i w = _mm512_xor_si512(_mm512_loadu_si512(group + j * 32), flip);
      for (int r = 0; r < R; ++r) sum[r] = _mm512_dpbusd_epi32(sum[r], w, dword_pair(xs[r], j, j + 1));
    }
    for (int r = 0; r < R; ++r) {
      ints[r] = _mm256_sub_epi32(fold(sum[r]), _mm256_set1_epi32(128 * x_sums[r]));
    }
  }
}
#else
inline __m256i broadcast4(const int8_t* x) {
  int32_t four;
  std::memcpy(&four, x, sizeof four);
  return _mm256_set1_epi32(four);
}

// Eight int32 partial sums of 32 products of unsigned u8 `u` and signed s8 `s`.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// Each of R rows' exact int32 sums of one tile group (8 lanes, one per tile row): a
// broadcast of 4 activation bytes meets 4 codes of all 8 rows (maddubs).
template <bool kQ4, int R>
inline void group_sums(const uint8_t* group, const int8_t* const* x, const int32_t*,
                       __m256i* ints) {
  __m256i sum[R];  // q4: 16-bit sums (at most 8 * 2 * 15 * 127); q8: 32-bit
  for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
  if constexpr (kQ4) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int p = 0; p < 4; ++p) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + p * 32));
      const __m256i first = _mm256_and_si256(raw, low4);
      const __m256i second = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      for (int r = 0; r < R; ++r) {
        const __m256i both = _mm256_add_epi16(
            _mm256_maddubs_epi16(first, broadcast4(x[r] + 8 * p)),
            _mm256_maddubs_epi16(second, broadcast4(x[r] + 8 * p + 4)));
        sum[r] = _mm256_add_epi16(sum[r], both);
      }
      // Each pair's products join the sums before the next pair's are taken: unrolled,
      // GCC took all 8 pairs' products first and spilled them to the stack (a 5-row
      // pass 20 % slower). An empty asm keeps the order; the integer sums are the same.
      for (int r = 0; r < R; ++r) __asm__("" : "+x"(sum[r]));
    }
    for (int r = 0; r < R; ++r) ints[r] = _mm256_madd_epi16(sum[r], _mm256_set1_epi16(1));
  } else {
    for (int j = 0; j < 8; ++j) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + j * 32));
      const __m256i wabs = _mm256_sign_epi8(w, w);
      for (int r = 0; r < R; ++r) {
        const __m256i xs = _mm256_sign_epi8(broadcast4(x[r] + 4 * j), w);
        sum[r] = _mm256_add_epi32(sum[r], dot_u8s8(wabs, xs));
      }
      if constexpr (R > 4) {  // as q4's; fewer rows keep their registers unforced
        for (int r = 0; r < R; ++r) __asm__("" : "+x"(sum[r]));
      }
    }
    for (int r = 0; r < R; ++r) ints[r] = sum[r];
  }
}
#endif

// One tile's 8 outputs for R activation rows from row0, each row's float sums in the same
// order whatever R is (a batch gives each row's bits alone), and whichever integer kernel
// found the exact group sums.
template <bool kQ4, int R>
void tile_rows(const uint8_t* wq, const float* wd, const float* wm, const QuantizedActivations& a,
               int64_t row0, int64_t groups, __m256* out) {
  const int64_t k = groups * kGroup;
  const int64_t group_bytes = kQ4 ? kQ4TileGroupBytes : kQ8TileGroupBytes;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int8_t* x[R];
    int32_t x_sums[R];
    __m256i ints[R];
    for (int r = 0; r < R; ++r) {
      x[r] = a.q.data() + (row0 + r) * k + g * kGroup;
      x_sums[r] = a.sum[(row0 + r) * groups + g];
    }
    group_sums<kQ4, R>(wq + g * group_bytes, x, x_sums, ints);
    const __m256 d = _mm256_loadu_ps(wd + g * kTile);
    for (int r = 0; r < R; ++r) {
      const int64_t at = (row0 + r) * groups + g;
      const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(a.d[at]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ints[r]), scale, acc[r]);
      if constexpr (kQ4) {
        acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(wm + g * kTile), _mm256_set1_ps(a.s[at]), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}
#endif

#ifdef INHOUSE_VNNI
// Two neighbouring tiles at once, for several activation rows: a register holds one 32-byte
// piece (q8 quad, q4 nibbles of a pair) of tile t in lanes 0-7 and of tile t + 1 in lanes
// 8-15, one output row a lane, so vpdpbusd meets all 16 with one broadcast activation dword
// ({1to16}): no per-row permutes or folds, and the 8 pieces are loaded once for all rows.
// Each lane's integer sum is exact and its float steps are tile_rows' own, so the bits are.
constexpr int kPairRows = 8;
constexpr int64_t kPairFrom = 2;

inline __m512i two_tiles(const uint8_t* a, const uint8_t* b) {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

inline __m512 two_tiles(const float* a, const float* b) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(a))),
                                             _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}

inline __m512i dword_of(const int8_t* x) {
  int32_t four;
  std::memcpy(&four, x, sizeof four);
  return _mm512_set1_epi32(four);
}

// The 16 outputs of tiles t (w0, ...) and t + 1 (w1, ...) for R activation rows from row0.
template <bool kQ4, int R>
void tile_pair_rows(const uint8_t* w0, const uint8_t* w1, const float* d0, const float* d1,
                    const float* m0, const float* m1, const QuantizedActivations& a, int64_t row0,
                    int64_t groups, __m512* out) {
  const int64_t k = groups * kGroup;
  const int64_t group_bytes = kQ4 ? kQ4TileGroupBytes : kQ8TileGroupBytes;
  __m512 acc[R];
  INHOUSE_UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* g0 = w0 + g * group_bytes;
    const uint8_t* g1 = w1 + g * group_bytes;
    __m512i w[8];  // w[j] meets activation dword j (k = 4j .. 4j + 3)
    if constexpr (kQ4) {
      const __m512i low4 = _mm512_set1_epi8(0x0F);
      INHOUSE_UNROLL for (int p = 0; p < 4; ++p) {
        const __m512i raw = two_tiles(g0 + p * 32, g1 + p * 32);
        w[2 * p] = _mm512_and_si512(raw, low4);
        w[2 * p + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      }
    } else {
      const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
      INHOUSE_UNROLL for (int j = 0; j < 8; ++j) w[j] = _mm512_xor_si512(two_tiles(g0 + j * 32, g1 + j * 32), flip);
    }
    const __m512 d = two_tiles(d0 + g * kTile, d1 + g * kTile);
    INHOUSE_UNROLL for (int r = 0; r < R; ++r) {
      const int64_t at = (row0 + r) * groups + g;
      const int8_t* x = a.q.data() + (row0 + r) * k + g * kGroup;
      __m512i sum = _mm512_setzero_si512();
      INHOUSE_UNROLL for (int j = 0; j < 8; ++j) sum = _mm512_dpbusd_epi32(sum, w[j], dword_of(x + 4 * j));
      if constexpr (!kQ4) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(128 * a.sum[at]));
      const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(a.d[at]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[r]);
      if constexpr (kQ4) {
        acc[r] = _mm512_fmadd_ps(two_tiles(m0 + g * kTile, m1 + g * kTile), _mm512_set1_ps(a.s[at]), acc[r]);
      }
    }
  }
  INHOUSE_UNROLL for (int r = 0; r < R; ++r) out[r] = acc[r];
}

// tile_dot for tiles t and t + 1 (weights w, scales wd, mins wm and bias from tile t's).
template <bool kQ4>
void tile_pair_dot(const uint8_t* wq, const float* wd, const float* wm, const float* bias,
                   const QuantizedActivations& a, int64_t row0, int rows, int64_t groups, float* out,
                   int64_t stride) {
  const int64_t bytes = groups * (kQ4 ? kQ4TileGroupBytes : kQ8TileGroupBytes), scales = groups * kTile;
  const float* m1 = wm ? wm + scales : nullptr;
  __m512 sums[kPairRows];
  switch (rows) {
#define INHOUSE_PAIR(R)                                                                          \
  case R:                                                                                        \
    tile_pair_rows<kQ4, R>(wq, wq + bytes, wd, wd + scales, wm, m1, a, row0, groups, sums); \
    break;
    INHOUSE_PAIR(1)
    INHOUSE_PAIR(2)
    INHOUSE_PAIR(3)
    INHOUSE_PAIR(4)
    INHOUSE_PAIR(5)
    INHOUSE_PAIR(6)
    INHOUSE_PAIR(7)
    default:
      tile_pair_rows<kQ4, kPairRows>(wq, wq + bytes, wd, wd + scales, wm, m1, a, row0, groups, sums);
#undef INHOUSE_PAIR
  }
  const __m512 b = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int r = 0; r < rows; ++r) _mm512_storeu_ps(out + r * stride, _mm512_add_ps(sums[r], b));
}
#endif

// out[r * stride + i] = row0 + r's product with the tile's row i (+ bias[i]), r < rows.
template <bool kQ4>
void tile_dot(const uint8_t* wq, const float* wd, const float* wm, const float* bias,
              const QuantizedActivations& a, int64_t row0, int rows, int64_t groups, float* out,
              int64_t stride) {
#ifdef INHOUSE_AVX2
  __m256 sums[kRowsAtOnce];
  switch (rows) {
    case 1: tile_rows<kQ4, 1>(wq, wd, wm, a, row0, groups, sums); break;
    case 2: tile_rows<kQ4, 2>(wq, wd, wm, a, row0, groups, sums); break;
    case 3: tile_rows<kQ4, 3>(wq, wd, wm, a, row0, groups, sums); break;
    case 4: tile_rows<kQ4, 4>(wq, wd, wm, a, row0, groups, sums); break;
    case 5: tile_rows<kQ4, 5>(wq, wd, wm, a, row0, groups, sums); break;
    case 6: tile_rows<kQ4, 6>(wq, wd, wm, a, row0, groups, sums); break;
    case 7: tile_rows<kQ4, 7>(wq, wd, wm, a, row0, groups, sums); break;
    default: tile_rows<kQ4, 8>(wq, wd, wm, a, row0, groups, sums); break;
  }
  const __m256 b = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
  for (int r = 0; r < rows; ++r) _mm256_storeu_ps(out + r * stride, _mm256_add_ps(sums[r], b));
#else
  const int64_t k = groups * kGroup;
  const int64_t group_bytes = kQ4 ? kQ4TileGroupBytes : kQ8TileGroupBytes;
  for (int r = 0; r < rows; ++r) {
    float total[kTile] = {};
    for (int64_t g = 0; g < groups; ++g) {
      const int8_t* x = a.q.data() + (row0 + r) * k + g * kGroup;
      const int64_t at = (row0 + r) * groups + g;
      for (int i = 0; i < kTile; ++i) {
        int dot = 0;
        for (int j = 0; j < kGroup; ++j) dot += tile_code<kQ4>(wq + g * group_bytes, i, j) * x[j];
        total[i] += wd[g * kTile + i] * a.d[at] * static_cast<float>(dot);
        if constexpr (kQ4) total[i] += wm[g * kTile + i] * a.s[at];
      }
    }
    for (int i = 0; i < kTile; ++i) out[r * stride + i] = total[i] + (bias ? bias[i] : 0.f);
  }
#endif
}

template <bool kQ4>
torch::Tensor linear_impl(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                          const torch::Tensor* mins, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "activations must be float32");
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && d.is_contiguous() &&
                  d.scalar_type() == torch::kFloat32,
              "weights in tiles of 8 rows");
  const int64_t tiles = q.size(0), groups = q.size(1), n_out = tiles * kTile, k = groups * kGroup;
  const int64_t group_bytes = kQ4 ? kQ4TileGroupBytes : kQ8TileGroupBytes;
  TORCH_CHECK(q.size(2) == group_bytes && x.size(-1) == k, "input features must match");
  auto x2 = x.reshape({-1, k}).contiguous();
  const int64_t m = x2.size(0);
  auto out = torch::empty({m, n_out}, x.options());
  const QuantizedActivations a = quantize_activations(x2.data_ptr<float>(), m, k);
  const auto* qp = static_cast<const uint8_t*>(q.data_ptr());
  const float* dp = d.data_ptr<float>();
  const float* mp = mins ? mins->data_ptr<float>() : nullptr;
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  auto shape = x.sizes().vec();
  shape.back() = n_out;
  if (m >= inhouse::amx::kFromRows && tiles % 2 == 0 && inhouse::amx::enabled()) {
    inhouse::amx::linear({a.q.data(), a.d.data(), a.s.data(), m, groups, tiles, qp, dp, mp, bp, op});
    return out.view(shape);
  }
  for (int64_t block = 0; block < m; block += kRowBlock) {
    const int64_t block_end = std::min(m, block + kRowBlock);
    // Passes of even size (9 rows: 5 + 4, not 8 + 1): a pass's cost per row grows with its
    // rows (registers spill), so two half passes beat a full and a lone one.
    const int64_t passes = (block_end - block + kRowsAtOnce - 1) / kRowsAtOnce;
    const int64_t per_pass = (block_end - block + passes - 1) / passes;
    inhouse::parallel_for(0, tiles, 2, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end;) {
        const int64_t scale_at = t * groups * kTile;
        const uint8_t* wq = qp + t * groups * group_bytes;
        const float* wm = mp ? mp + scale_at : nullptr;
        const float* tile_bias = bp ? bp + t * kTile : nullptr;
#ifdef INHOUSE_VNNI
        if (t + 1 < end && block_end - block >= kPairFrom) {
          if (t + 3 < end) {
            const int64_t next = (t + 2) * groups;
            prefetch(qp + next * group_bytes, 2 * groups * group_bytes);
            prefetch(dp + next * kTile, 2 * groups * kTile * sizeof(float));
            if (mp) prefetch(mp + next * kTile, 2 * groups * kTile * sizeof(float));
          }
          for (int64_t r = block; r < block_end; r += kPairRows) {
            const int rows = static_cast<int>(std::min<int64_t>(kPairRows, block_end - r));
            tile_pair_dot<kQ4>(wq, dp + scale_at, wm, tile_bias, a, r, rows, groups,
                               op + r * n_out + t * kTile, n_out);
          }
          t += 2;
          continue;
        }
#endif
        for (int64_t r = block; r < block_end; r += per_pass) {
          const int rows = static_cast<int>(std::min<int64_t>(per_pass, block_end - r));
          tile_dot<kQ4>(wq, dp + scale_at, wm, tile_bias, a, r, rows, groups,
                        op + r * n_out + t * kTile, n_out);
        }
        ++t;
      }
    });
  }
  return out.view(shape);
}

torch::Tensor linear_q8(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                        const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(q.scalar_type() == torch::kInt8, "q8 weights are int8");
  return linear_impl<false>(x, q, d, nullptr, bias);
}

torch::Tensor linear_q4(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                        const torch::Tensor& mins, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(q.scalar_type() == torch::kUInt8 && mins.is_contiguous(), "q4 weights are uint8");
  return linear_impl<true>(x, q, d, &mins, bias);
}

// KV cache rows are float32, float16, bfloat16 or int8 (LoadedModel.kv_dtype); the
// arithmetic is float32 either way. An int8 row (one token's K or V of one KV head) is its
// dim codes q in [-127, 127], then its float scale d (4 bytes, unaligned): x = d * q, as
// vLLM's int8_per_token_head. Attention multiplies a key's score by its d, and a value's
// weight by its d, after summing the codes' products, so each row's bits stay its own.
constexpr int64_t kQ8Scale = sizeof(float);

template <typename T>
constexpr bool kQ8Cache = std::is_same_v<T, int8_t>;

// Elements of T one KV head's cache row takes.
template <typename T>
constexpr int64_t row_width(int64_t dim) {
  return kQ8Cache<T> ? dim + kQ8Scale : dim;
}

// An int8 row's scale, after its codes.
inline float row_scale(const int8_t* row, int64_t dim) {
  float d;
  std::memcpy(&d, row + dim, sizeof d);
  return d;
}

// x (dim floats) as an int8 row: d = max|x| / 127, q = round(x / d) (0 for an all-zero x).
inline void store_q8_row(const float* x, int64_t dim, int8_t* out) {
  float top = 0.f;
  for (int64_t f = 0; f < dim; ++f) top = std::max(top, std::fabs(x[f]));
  const float d = top / 127.f;
  for (int64_t f = 0; f < dim; ++f) {
    const float code = d > 0.f ? std::nearbyint(x[f] / d) : 0.f;
    out[f] = static_cast<int8_t>(std::clamp(code, -127.f, 127.f));
  }
  std::memcpy(out + dim, &d, sizeof d);
}

#ifdef INHOUSE_AVX2
inline __m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(const c10::BFloat16* p) {  // bf16 is a float's upper half
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
#ifdef INHOUSE_AVX512
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const c10::BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline __m512 load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Eight values at a in lanes 0-7 and eight at b in lanes 8-15.
inline __m512 load8x2(const float* a, const float* b) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(load8(a))),
                                             _mm256_castps_pd(load8(b)), 1));
}
template <typename T>
inline __m256i halves(const T* a, const T* b) {
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
}
inline __m512 load8x2(const c10::Half* a, const c10::Half* b) { return _mm512_cvtph_ps(halves(a, b)); }
inline __m512 load8x2(const c10::BFloat16* a, const c10::BFloat16* b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves(a, b)), 16));
}
inline __m512 load8x2(const int8_t* a, const int8_t* b) {
  const __m128i both = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(both));
}
#endif
#endif

#ifdef INHOUSE_AVX2
// e^x for 8 lanes of x <= 0 (softmax, the max subtracted): x = k ln2 + r, e^x = 2^k e^r,
// e^r by Cephes' expf polynomial (within 2 ulp of std::exp). Below -87.3 (e^x under
// float's smallest normal) it returns ~1e-38, not 0; a softmax never notices.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 poly = _mm256_set1_ps(1.9875691500e-4f);
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.3981999507e-3f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(8.3334519073e-3f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(4.1665795894e-2f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.6666665459e-1f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(5.0000001201e-1f));
  poly = _mm256_fmadd_ps(poly, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i two_k = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(poly, _mm256_castsi256_ps(two_k));
}
#endif

// scores[t] = e^(scores[t] - top) for t < n; returns their sum. Eight at a time where the
// CPU has AVX2, the last n % 8 one by one: a function of n alone, as the row's keys are.
inline float exp_and_sum(float* scores, int64_t n, float top) {
  int64_t t = 0;
  float total = 0.f;
#ifdef INHOUSE_AVX2
  __m256 sums = _mm256_setzero_ps();
  const __m256 top8 = _mm256_set1_ps(top);
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + t), top8));
    _mm256_storeu_ps(scores + t, e);
    sums = _mm256_add_ps(sums, e);
  }
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1));
  half = _mm_add_ps(half, _mm_movehl_ps(half, half));
  total = _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
#endif
  for (; t < n; ++t) total += (scores[t] = std::exp(scores[t] - top));
  return total;
}

// Attention's register blocks. Each query's score for a key is one fixed computation, with
// dim a multiple of 16: eight float lanes, lane l the FMA chain e_l over features 16c + l
// plus the chain o_l over 16c + 8 + l (c = 0, 1, ...); then b_l = e_l + o_l,
// c_l = b_l + b_(l+4), score = ((c0 + c2) + (c1 + c3)) * scale. Each output feature is one
// FMA chain over the keys in position order. Neither depends on which other queries or
// keys share a block, nor on the vector width (AVX-512 holds two keys' eight lanes in one
// register, and 16 features of a value), so blocking changes speed, never bits. A block is
// the query heads of a GQA group (and, in a prefill, neighbouring rows) meeting
// kKeysAtOnce keys, or kChunksAtOnce chunks of each value, loaded and converted once.
// AVX-512's 32 vector registers hold twice the queries of AVX2's 16.
#ifdef INHOUSE_AVX2
#ifdef INHOUSE_AVX512
constexpr int kQueriesAtOnce = 6;
constexpr int kKeysAtOnce = 4;
// Keys 2j and 2j + 1 share register j: their eight lanes in its two halves.
using KeyLanes = __m512;
constexpr int kKeyRegisters = kKeysAtOnce / 2;

// vhaddps within each 128-bit lane, as AVX's 256-bit hadd does in each of its two.
inline __m512 hadd16(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

// c_l = b_l + b_(l+4) of two keys, the first's in 128-bit lane 0 and the second's in lane 2.
inline __m512 fold_halves(__m512 even, __m512 odd) {
  const __m512 b = _mm512_add_ps(even, odd);
  return _mm512_add_ps(b, _mm512_shuffle_f32x4(b, b, _MM_SHUFFLE(2, 3, 0, 1)));
}

// Four keys' scores (before the scale) from their chains, keys 2j, 2j + 1 in even[j], odd[j].
inline __m128 key_scores(const __m512* even, const __m512* odd) {
  const __m512 c01 = fold_halves(even[0], odd[0]), c23 = fold_halves(even[1], odd[1]);
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(c01, c23, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(c01, c23, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 r = hadd16(s, s);  // lane 0: keys 0, 2; lane 2: keys 1, 3
  const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(order, r));
}
#else
constexpr int kQueriesAtOnce = 3;
constexpr int kKeysAtOnce = 2;
using KeyLanes = __m256;
constexpr int kKeyRegisters = kKeysAtOnce;

// Two keys' scores (before the scale), in lanes 0 and 4.
inline __m256 key_scores(const __m256* even, const __m256* odd) {
  const __m256 b0 = _mm256_add_ps(even[0], odd[0]), b1 = _mm256_add_ps(even[1], odd[1]);
  const __m256 c = _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20),
                                 _mm256_permute2f128_ps(b0, b1, 0x31));
  const __m256 s = _mm256_add_ps(c, _mm256_permute_ps(c, _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_add_ps(s, _mm256_movehdup_ps(s));
}
#endif
constexpr int kChunksAtOnce = 4;

// Eight features of key j (AVX2) or of keys 2j and 2j + 1 (AVX-512) from feature f.
template <typename T>
inline KeyLanes key_chunk(const T* const* k, int j, int64_t f) {
#ifdef INHOUSE_AVX512
  return load8x2(k[2 * j] + f, k[2 * j + 1] + f);
#else
  return load8(k[j] + f);
#endif
}

// Eight query features from f, for every key of a register.
inline KeyLanes query_chunk(const float* q, int64_t f) {
#ifdef INHOUSE_AVX512
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q + f))));
#else
  return _mm256_loadu_ps(q + f);
#endif
}

inline KeyLanes fma_lanes(KeyLanes a, KeyLanes b, KeyLanes c) {
#ifdef INHOUSE_AVX512
  return _mm512_fmadd_ps(a, b, c);
#else
  return _mm256_fmadd_ps(a, b, c);
#endif
}

// Cache rows asked for this many positions ahead of the one being read: a paged cache's
// rows sit in blocks at scattered addresses that the hardware's prefetchers cannot guess, and
// a decode row's keys come from memory, not cache (timing only; no result changes).
constexpr int64_t kRowsAhead = 16;

// scores[i][t] = (q[i] . keys[t]) * scale for Q queries and n keys, dim a multiple of 16;
// the keys' and values' rows are fetched kRowsAhead ahead (the values for weigh_values) when
// `fetch` (the first query block over these keys; the next ones find them in cache). An
// int8 cache's scores are then times their key's scale, and value_scales[t] is values[t]'s
// (read as the keys' are: after a fetch asked for kRowsAhead keys before).
template <typename T, int Q>
void score_block(const float* const* q, const T* const* keys, const T* const* values, int64_t n,
                 int64_t dim, float scale, float* const* scores, float* value_scales, bool fetch) {
  const int64_t row_bytes = row_width<T>(dim) * static_cast<int64_t>(sizeof(T));
  for (int64_t j = 0; fetch && j < std::min(n, kRowsAhead); ++j) {
    prefetch(keys[j], row_bytes);
    prefetch(values[j], row_bytes);
  }
  for (int64_t t = 0; t < n; t += kKeysAtOnce) {
    if (fetch) {
      for (int64_t j = t + kRowsAhead; j < std::min(n, t + kRowsAhead + kKeysAtOnce); ++j) {
        prefetch(keys[j], row_bytes);
        prefetch(values[j], row_bytes);
      }
    }
    const T* k[kKeysAtOnce];  // the last block repeats its last key; only n are stored
    INHOUSE_UNROLL for (int j = 0; j < kKeysAtOnce; ++j) k[j] = keys[std::min<int64_t>(t + j, n - 1)];
    KeyLanes even[Q][kKeyRegisters], odd[Q][kKeyRegisters];
    INHOUSE_UNROLL for (int i = 0; i < Q; ++i) {
      INHOUSE_UNROLL for (int j = 0; j < kKeyRegisters; ++j) even[i][j] = odd[i][j] = KeyLanes{};
    }
    for (int64_t f = 0; f < dim; f += 16) {
      KeyLanes ke[kKeyRegisters], ko[kKeyRegisters];
      INHOUSE_UNROLL for (int j = 0; j < kKeyRegisters; ++j) {
        ke[j] = key_chunk(k, j, f);
        ko[j] = key_chunk(k, j, f + 8);
      }
      INHOUSE_UNROLL for (int i = 0; i < Q; ++i) {
        const KeyLanes qe = query_chunk(q[i], f), qo = query_chunk(q[i], f + 8);
        INHOUSE_UNROLL for (int j = 0; j < kKeyRegisters; ++j) {
          even[i][j] = fma_lanes(qe, ke[j], even[i][j]);
          odd[i][j] = fma_lanes(qo, ko[j], odd[i][j]);
        }
      }
    }
    const int64_t stored = std::min<int64_t>(kKeysAtOnce, n - t);
    // An int8 cache's key scales, read now that the rows are fetched: the score times d.
    float d[kKeysAtOnce];
    if constexpr (kQ8Cache<T>) {
      INHOUSE_UNROLL for (int j = 0; j < kKeysAtOnce; ++j) d[j] = row_scale(k[j], dim);
      for (int64_t j = 0; j < stored; ++j) value_scales[t + j] = row_scale(values[t + j], dim);
    }
    INHOUSE_UNROLL for (int i = 0; i < Q; ++i) {
      float* out = scores[i] + t;
#ifdef INHOUSE_AVX512
      __m128 s = _mm_mul_ps(key_scores(even[i], odd[i]), _mm_set1_ps(scale));
      if constexpr (kQ8Cache<T>) s = _mm_mul_ps(s, _mm_loadu_ps(d));
      _mm_mask_storeu_ps(out, static_cast<__mmask8>((1u << stored) - 1), s);
#else
      __m256 s = _mm256_mul_ps(key_scores(even[i], odd[i]), _mm256_set1_ps(scale));
      if constexpr (kQ8Cache<T>) s = _mm256_mul_ps(s, _mm256_setr_ps(d[0], 0, 0, 0, d[1], 0, 0, 0));
      out[0] = _mm256_cvtss_f32(s);
      if (stored > 1) out[1] = _mm_cvtss_f32(_mm256_extractf128_ps(s, 1));
#endif
    }
  }
}

// out[i][from + f] = sum over t of p[i][t] * values[t][from + f], f < C chunks of the
// vector width: Q queries' sums in registers while the n values stream past once.
template <typename T, int Q, int C, typename Vec, Vec (*load)(const T*), Vec (*fma)(Vec, Vec, Vec)>
void weigh_block(const T* const* values, const float* const* p, int64_t n, int64_t from,
                 float* const* out) {
  constexpr int lanes = sizeof(Vec) / sizeof(float);
  Vec acc[Q][C];
  INHOUSE_UNROLL for (int i = 0; i < Q; ++i) {
    INHOUSE_UNROLL for (int c = 0; c < C; ++c) acc[i][c] = Vec{};
  }
  for (int64_t t = 0; t < n; ++t) {
    Vec w[Q];
    INHOUSE_UNROLL for (int i = 0; i < Q; ++i) {
      if constexpr (lanes == 8) {
        w[i] = _mm256_broadcast_ss(p[i] + t);
      } else {
        w[i] = _mm512_set1_ps(p[i][t]);
      }
    }
    INHOUSE_UNROLL for (int c = 0; c < C; ++c) {
      const Vec v = load(values[t] + from + lanes * c);
      INHOUSE_UNROLL for (int i = 0; i < Q; ++i) acc[i][c] = fma(w[i], v, acc[i][c]);
    }
  }
  INHOUSE_UNROLL for (int i = 0; i < Q; ++i) {
    INHOUSE_UNROLL for (int c = 0; c < C; ++c) {
      std::memcpy(out[i] + from + lanes * c, &acc[i][c], sizeof(Vec));
    }
  }
}

inline __m256 fma8(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
#ifdef INHOUSE_AVX512
inline __m512 fma16(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
#endif

template <typename T, int Q>
void weigh_values(const T* const* values, const float* const* p, int64_t n, int64_t dim,
                  float* const* out) {
  int64_t from = 0;
#ifdef INHOUSE_AVX512
  for (; from + 16 * kChunksAtOnce <= dim; from += 16 * kChunksAtOnce) {
    weigh_block<T, Q, kChunksAtOnce, __m512, load16, fma16>(values, p, n, from, out);
  }
#endif
  for (; from + 8 * kChunksAtOnce <= dim; from += 8 * kChunksAtOnce) {
    weigh_block<T, Q, kChunksAtOnce, __m256, load8, fma8>(values, p, n, from, out);
  }
  for (; from < dim; from += 8) weigh_block<T, Q, 1, __m256, load8, fma8>(values, p, n, from, out);
}
#else
constexpr int kQueriesAtOnce = 1;
#endif

// Each query row's keys fall into segments of kSegment positions, aligned to absolute
// positions (0, 256, 512, ...), so where a segment starts depends on the position alone, never
// on the batch, the chunking or the threads. A segment gives each query its own (top, total,
// unnormalized weighted sum); the row's output folds its segments in position order
// (fold_segment) and divides once by the total. Segments of one decode row run on different
// threads (flash-decoding's split) and are folded after; a prefill tile folds them as it goes:
// the same operations in the same order either way.
constexpr int64_t kSegment = 256;

// e^(s - top) for the query's own scores s[from .. from + count - 1], top their max; returns
// {top, their sum}. Every other score of the block becomes 0, which adds nothing to the
// weighted sum's chains: a query's bits are its own keys' alone. No keys: {-inf, 0}.
inline std::pair<float, float> exp_segment(float* s, int64_t n, int64_t from, int64_t count) {
  float* own = s + from;
  float top = -INFINITY;
  int64_t t = 0;
#ifdef INHOUSE_AVX2
  __m256 tops = _mm256_set1_ps(-INFINITY);  // a max is the same in any order
  for (; t + 8 <= count; t += 8) tops = _mm256_max_ps(tops, _mm256_loadu_ps(own + t));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, tops);
  for (const float lane : lanes) top = std::max(top, lane);
#endif
  for (; t < count; ++t) top = std::max(top, own[t]);
  const float total = count > 0 ? exp_and_sum(own, count, top) : 0.f;
  std::fill(s, own, 0.f);
  std::fill(own + count, s + n, 0.f);
  return {top, total};
}

// One query's running output over the segments seen so far.
struct Running {
  float top = -INFINITY, total = 0.f;
  bool started = false;
};

// Folds a segment's (top, total, sums o) into the running (state, acc): both rescaled to the
// larger top. The first segment is copied. Explicit fmas: no contraction the compiler might
// choose differently at another call site.
inline void fold_segment(Running& state, float* acc, float top, float total, const float* o,
                         int64_t dim) {
  if (total == 0.f) return;  // the query has no key in this segment
  if (!state.started) {
    state = {top, total, true};
    std::memcpy(acc, o, dim * sizeof(float));
    return;
  }
  const float high = std::max(state.top, top);
  const float a = std::exp(state.top - high), b = std::exp(top - high);
  for (int64_t f = 0; f < dim; ++f) acc[f] = std::fma(o[f], b, acc[f] * a);
  state.total = std::fma(total, b, state.total * a);
  state.top = high;
}

inline void finish_row(const Running& state, float* acc, int64_t dim) {
  const float inv = 1.f / state.total;
  for (int64_t f = 0; f < dim; ++f) acc[f] *= inv;
}

// scores[i][t] *= the scale of rows[t] for Q queries and n keys, the plain loop's way: an
// int8 cache's key scales on the scores, or its value scales on the weights (nothing for a
// float cache).
template <typename T, int Q>
inline void scale_rows(float* const* scores, const T* const* rows, int64_t n, int64_t dim) {
  if constexpr (kQ8Cache<T>) {
    for (int64_t t = 0; t < n; ++t) {
      const float d = row_scale(rows[t], dim);
      for (int i = 0; i < Q; ++i) scores[i][t] *= d;
    }
  }
}

// Q queries over their share of n keys of one segment (query i: keys from[i] .. from[i] +
// count[i] - 1): scores, e^(s - top) and the weighted sums of the values into o[i] (dim
// each); tops and totals per query. An int8 cache's row scales go on the scores and on the
// weights after e^, the totals taken before (value_scales: n floats of scratch). Without
// AVX2 (or with dim not a multiple of 16) the same sums one at a time, in their own order.
template <typename T, int Q>
void attend(const float* const* q, const T* const* keys, const T* const* values, int64_t n,
            int64_t dim, float scale, float* const* scores, float* const* o,
            const int64_t* from, const int64_t* count, float* tops, float* totals,
            float* value_scales, bool fetch) {
#ifdef INHOUSE_AVX2
  if (dim % 16 == 0) {
    score_block<T, Q>(q, keys, values, n, dim, scale, scores, value_scales, fetch);
    for (int i = 0; i < Q; ++i) {
      std::tie(tops[i], totals[i]) = exp_segment(scores[i], n, from[i], count[i]);
      if constexpr (kQ8Cache<T>) {
        for (int64_t t = from[i]; t < from[i] + count[i]; ++t) scores[i][t] *= value_scales[t];
      }
    }
    weigh_values<T, Q>(values, scores, n, dim, o);
    return;
  }
#endif
  for (int i = 0; i < Q; ++i) {
    for (int64_t t = 0; t < n; ++t) {
      float s = 0.f;
      for (int64_t f = 0; f < dim; ++f) s = std::fma(q[i][f], static_cast<float>(keys[t][f]), s);
      scores[i][t] = s * scale;
    }
  }
  scale_rows<T, Q>(scores, keys, n, dim);
  for (int i = 0; i < Q; ++i) std::tie(tops[i], totals[i]) = exp_segment(scores[i], n, from[i], count[i]);
  scale_rows<T, Q>(scores, values, n, dim);
  for (int i = 0; i < Q; ++i) {
    for (int64_t f = 0; f < dim; ++f) {
      float total = 0.f;
      for (int64_t t = 0; t < n; ++t) total = std::fma(scores[i][t], static_cast<float>(values[t][f]), total);
      o[i][f] = total;
    }
  }
}

// attend for a block of 1 .. kQueriesAtOnce queries.
template <typename T>
void attend_any(int queries, const float* const* q, const T* const* keys, const T* const* values,
                int64_t n, int64_t dim, float scale, float* const* scores, float* const* o,
                const int64_t* from, const int64_t* count, float* tops, float* totals,
                float* value_scales, bool fetch) {
  switch (queries) {
#define INHOUSE_ATTEND(Q)                                                                   \
  case Q:                                                                                   \
    if constexpr (Q <= kQueriesAtOnce) {                                                    \
      return attend<T, Q>(q, keys, values, n, dim, scale, scores, o, from, count, tops,     \
                          totals, value_scales, fetch);                                     \
    }                                                                                       \
    break;
    INHOUSE_ATTEND(1)
    INHOUSE_ATTEND(2)
    INHOUSE_ATTEND(3)
    INHOUSE_ATTEND(4)
    INHOUSE_ATTEND(5)
    INHOUSE_ATTEND(6)
#undef INHOUSE_ATTEND
  }
  TORCH_CHECK(false, "a block of at most kQueriesAtOnce queries");
}

// Consecutive rows of one sequence (a prefill) that share one gathering of their cache rows.
constexpr int64_t kTileRows = 16;
// A step of at most this many rows (decodes, a speculative draft's rows, a short prompt)
// runs every tile's segments apart, so its few tiles still make work for every thread.
constexpr int64_t kSplitRows = 64;

// A unit of work: a tile's queries of one KV head, over one segment (a split tile: its
// segments run apart, folded after) or over all of them (segment -1).
struct AttentionItem {
  int64_t tile, kv_head, segment, partial;  // partial: the first of its queries' slots
};

template <typename T>
void attention_rows_impl(const torch::Tensor& q, const torch::Tensor& k_cache,
                         const torch::Tensor& v_cache, const torch::Tensor& tables,
                         const int64_t* seq, const int64_t* lp, int64_t block_size, float scale,
                         int64_t window, bool torch_threads, torch::Tensor& out) {
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(1), group = heads / kv_heads;
  const int64_t width = tables.size(1);
  const float* qp = q.data_ptr<float>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t row = row_width<T>(dim), slot_values = kv_heads * row, partial_floats = dim + 2;
  const auto seq_of = [&](int64_t i) { return seq == nullptr ? i : seq[i]; };
  const auto first_key = [&](int64_t i) {
    return window > 0 ? std::max<int64_t>(0, lp[i] - window) : int64_t{0};
  };
  std::vector<int64_t> tile_starts;
  for (int64_t i = 0; i < rows; ++i) {
    if (i == 0 || seq_of(i) != seq_of(i - 1) || i - tile_starts.back() == kTileRows) {
      tile_starts.push_back(i);
    }
  }
  tile_starts.push_back(rows);
  const int64_t tiles = static_cast<int64_t>(tile_starts.size()) - 1;
  // Items in an order that alternates cheap and dear ones (a prompt's tiles cost more the
  // later they come), so a static split over threads gets even shares.
  // A split tile's query i (row r0 + i / group, head i % group of the KV head) keeps one
  // partial slot per segment s0 <= s < s1 and KV head, at first + ((s - s0) * KVH + h) * Q + i.
  struct SplitTile {
    int64_t tile, s0, s1, first;
  };
  std::vector<AttentionItem> listed;
  std::vector<SplitTile> split_tiles;
  int64_t partials = 0;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t r0 = tile_starts[tile], r1 = tile_starts[tile + 1];
    if (r1 - r0 > 1 && rows > kSplitRows) {
      for (int64_t h = 0; h < kv_heads; ++h) listed.push_back({tile, h, -1, 0});
      continue;
    }
    int64_t first = first_key(r0), last = lp[r0];
    for (int64_t r = r0 + 1; r < r1; ++r) {
      first = std::min(first, first_key(r));
      last = std::max(last, lp[r]);
    }
    const int64_t s0 = first / kSegment, s1 = (last - 1) / kSegment + 1;
    const int64_t queries = (r1 - r0) * group;
    split_tiles.push_back({tile, s0, s1, partials});
    for (int64_t s = s0; s < s1; ++s) {
      for (int64_t h = 0; h < kv_heads; ++h) {
        listed.push_back({tile, h, s, partials + ((s - s0) * kv_heads + h) * queries});
      }
    }
    partials += (s1 - s0) * kv_heads * queries;
  }
  const int64_t count_items = static_cast<int64_t>(listed.size());
  std::vector<AttentionItem> items(count_items);
  for (int64_t j = 0; j < count_items; ++j) {
    items[j] = listed[j % 2 == 0 ? j / 2 : count_items - 1 - j / 2];
  }
  std::vector<float> partial(partials * partial_floats);
  const auto body = [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kQueriesAtOnce * kSegment), sums(kQueriesAtOnce * dim);
    std::vector<float> value_scales(kQ8Cache<T> ? kSegment : 0);  // an int8 cache's
    std::vector<const T*> keys, values;
    for (int64_t index = begin; index < end; ++index) {
      const AttentionItem& item = items[index];
      const int64_t r0 = tile_starts[item.tile], r1 = tile_starts[item.tile + 1];
      const int64_t* table = tp + seq_of(r0) * width;
      int64_t lo = first_key(r0), hi = lp[r0];
      for (int64_t r = r0 + 1; r < r1; ++r) {
        lo = std::min(lo, first_key(r));
        hi = std::max(hi, lp[r]);
      }
      if (item.segment >= 0) {
        lo = std::max(lo, item.segment * kSegment);
        hi = std::min(hi, (item.segment + 1) * kSegment);
      }
      keys.resize(hi - lo);
      values.resize(hi - lo);
      // Block by block: a division per key cost a tenth of a long decode row's attention.
      const int64_t head_at = item.kv_head * row;
      for (int64_t b = lo / block_size, t = lo; t < hi; ++b) {
        const int64_t end = std::min(hi, (b + 1) * block_size);
        const int64_t block_at = (table[b] * block_size - b * block_size) * slot_values + head_at;
        for (; t < end; ++t) {
          keys[t - lo] = kp + block_at + t * slot_values;
          values[t - lo] = vp + block_at + t * slot_values;
        }
      }
      // The tile's query heads of this KV head, row by row, kQueriesAtOnce at a time, each
      // block over the keys of a segment any of its queries needs.
      const int64_t queries = (r1 - r0) * group;
      for (int64_t b0 = 0; b0 < queries; b0 += kQueriesAtOnce) {
        // One segment's rows (64 KB of float16 keys and values) stay in cache from the first
        // block of a split tile to the next: only the first asks for them ahead (a 17-row
        // draft's attention 4 % faster). A whole prompt's may not, so each block asks.
        const bool fetch = b0 == 0 || item.segment < 0;
        const int in_block = static_cast<int>(std::min<int64_t>(kQueriesAtOnce, queries - b0));
        const float* qs[kQueriesAtOnce];
        float* outs[kQueriesAtOnce];
        float* block_sums[kQueriesAtOnce];
        float* rows_scores[kQueriesAtOnce];
        int64_t first[kQueriesAtOnce], last[kQueriesAtOnce];
        int64_t from[kQueriesAtOnce], count[kQueriesAtOnce];
        float tops[kQueriesAtOnce], totals[kQueriesAtOnce];
        Running running[kQueriesAtOnce];
        for (int i = 0; i < in_block; ++i) {
          const int64_t r = r0 + (b0 + i) / group, h = item.kv_head * group + (b0 + i) % group;
          qs[i] = qp + (r * heads + h) * dim;
          outs[i] = op + (r * heads + h) * dim;
          first[i] = std::max(first_key(r), lo);
          last[i] = std::min(lp[r], hi);
          if (item.segment >= 0) {
            float* slot = partial.data() + (item.partial + b0 + i) * partial_floats;
            block_sums[i] = slot;
          } else {
            block_sums[i] = sums.data() + i * dim;
          }
        }
        int64_t s_first = lo / kSegment;
        for (int64_t s = s_first; s * kSegment < hi; ++s) {
          const int64_t seg_lo = std::max(lo, s * kSegment), seg_hi = std::min(hi, (s + 1) * kSegment);
          int64_t block_lo = seg_hi, block_hi = seg_lo;
          for (int i = 0; i < in_block; ++i) {
            from[i] = std::max(first[i], seg_lo);
            count[i] = std::max<int64_t>(0, std::min(last[i], seg_hi) - from[i]);
            if (count[i] > 0) {
              block_lo = std::min(block_lo, from[i]);
              block_hi = std::max(block_hi, from[i] + count[i]);
            }
          }
          if (block_hi <= block_lo) continue;  // no query of the block has keys here
          const int64_t span = block_hi - block_lo;
          for (int i = 0; i < in_block; ++i) {
            from[i] = count[i] > 0 ? from[i] - block_lo : 0;
            rows_scores[i] = scores.data() + i * span;
          }
          attend_any<T>(in_block, qs, keys.data() + block_lo - lo, values.data() + block_lo - lo,
                        span, dim, scale, rows_scores, block_sums, from, count, tops, totals,
                        value_scales.data(), fetch);
          for (int i = 0; i < in_block; ++i) {
            if (item.segment >= 0) {
              block_sums[i][dim] = tops[i];
              block_sums[i][dim + 1] = totals[i];
            } else {
              fold_segment(running[i], outs[i], tops[i], totals[i], block_sums[i], dim);
            }
          }
        }
        if (item.segment < 0) {
          for (int i = 0; i < in_block; ++i) finish_row(running[i], outs[i], dim);
        }
      }
    }
  };
  if (torch_threads) {
    at::parallel_for(0, count_items, 1, body);
  } else {
    inhouse::parallel_for(0, count_items, 1, body);
  }
  // A split tile's segments, folded in position order as an unsplit tile folds them (a
  // segment without the query's keys has total 0 and folds as nothing, there as here).
  for (const SplitTile& split : split_tiles) {
    const int64_t r0 = tile_starts[split.tile], r1 = tile_starts[split.tile + 1];
    const int64_t queries = (r1 - r0) * group;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t i = (r - r0) * group + h % group;
        Running running;
        float* acc = op + (r * heads + h) * dim;
        for (int64_t s = split.s0; s < split.s1; ++s) {
          const int64_t at = split.first + ((s - split.s0) * kv_heads + h / group) * queries + i;
          const float* slot = partial.data() + at * partial_floats;
          fold_segment(running, acc, slot[dim], slot[dim + 1], slot, dim);
        }
        finish_row(running, acc, dim);
      }
    }
  }
}

// Attention of query rows straight from the paged cache, for decodes and prefills alike.
// q [R, H, D] float32; caches [slots, KVH, D] float32, float16 or bfloat16, or [slots, KVH,
// D + 4] int8 (codes and scale, see kQ8Scale); block_tables
// int64 [S, W]; row_seq int64 [R], the sequence (row of block_tables) of each query row,
// or None when row i is sequence i (a step of decodes); context_lens int64 [R], the keys
// each row attends to, itself included: its positions max(0, len - window) .. len - 1
// (window 0 = all). Every row and head sums its keys in position order on its own, so a
// row's bits are the same alone, batched, in a whole prompt or in a chunk of it. Between
// torch ops (`torch_threads`) it runs on torch's threads: two pools polling for work on a
// 2-core host take each other's cores (a float16-weight decode step took 20-30% longer);
// inside decode_layers, where every op is ours, on the pool.
torch::Tensor paged_attention_rows(const torch::Tensor& q, const torch::Tensor& k_cache,
                                   const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                                   const c10::optional<torch::Tensor>& row_seq,
                                   const torch::Tensor& context_lens, int64_t block_size,
                                   double scale, int64_t window, bool torch_threads) {
  const auto cache_type = k_cache.scalar_type();
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && v_cache.scalar_type() == cache_type &&
                  (cache_type == torch::kFloat32 || cache_type == torch::kHalf ||
                   cache_type == torch::kBFloat16 || cache_type == torch::kChar),
              "float32 queries; a float32, float16, bfloat16 or int8 cache");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && q.is_contiguous());
  const int64_t dim = q.size(2);
  TORCH_CHECK(k_cache.size(2) == (cache_type == torch::kChar ? dim + kQ8Scale : dim) &&
                  v_cache.sizes() == k_cache.sizes(),
              "cache rows of the queries' head dim (int8: and a scale)");
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  torch::Tensor seqs = row_seq.has_value() ? row_seq->contiguous() : torch::Tensor();
  const int64_t rows = q.size(0);
  TORCH_CHECK(lens.numel() == rows && (!seqs.defined() || seqs.numel() == rows),
              "one context length (and sequence) per query row");
  const int64_t* lp = lens.data_ptr<int64_t>();
  const int64_t* sp = seqs.defined() ? seqs.data_ptr<int64_t>() : nullptr;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t s = sp == nullptr ? i : sp[i];
    TORCH_CHECK(s >= 0 && s < tables.size(0), "row's sequence outside the block tables");
    TORCH_CHECK(lp[i] >= 1 && lp[i] <= tables.size(1) * block_size,
                "context empty or longer than the block table");
  }
  auto out = torch::empty({rows, q.size(1) * q.size(2)}, q.options());
  const float scale_f = static_cast<float>(scale);
  if (cache_type == torch::kChar) {
    attention_rows_impl<int8_t>(q, k_cache, v_cache, tables, sp, lp, block_size, scale_f, window,
                                torch_threads, out);
  } else if (cache_type == torch::kHalf) {
    attention_rows_impl<c10::Half>(q, k_cache, v_cache, tables, sp, lp, block_size, scale_f,
                                   window, torch_threads, out);
  } else if (cache_type == torch::kBFloat16) {
    attention_rows_impl<c10::BFloat16>(q, k_cache, v_cache, tables, sp, lp, block_size, scale_f,
                                       window, torch_threads, out);
  } else {
    attention_rows_impl<float>(q, k_cache, v_cache, tables, sp, lp, block_size, scale_f, window,
                               torch_threads, out);
  }
  return out;
}

// x rotated (HF's rotate-half) by cos c and sin s into out, dim values.
template <typename T>
inline void rotate_half(const float* x, const float* c, const float* s, int64_t dim, T* out) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    out[i] = static_cast<T>(x[i] * c[i] - x[i + half] * s[i]);
    out[i + half] = static_cast<T>(x[i + half] * c[i + half] + x[i] * s[i + half]);
  }
}

template <typename T>
void rope_write_kv_impl(const float* src, const float* cp, const float* sp, const int64_t* slot,
                        int64_t tokens, int64_t heads, int64_t kv_heads, int64_t dim, float* qp,
                        T* kp, T* vp) {
  const int64_t width = heads + 2 * kv_heads, row = row_width<T>(dim);
  inhouse::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> rotated(kQ8Cache<T> ? dim : 0);
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cp + t * dim;
      const float* s = sp + t * dim;
      const float* x = src + t * width * dim;
      for (int64_t h = 0; h < heads; ++h) {
        rotate_half(x + h * dim, c, s, dim, qp + (t * heads + h) * dim);
      }
      T* k = kp + slot[t] * kv_heads * row;
      T* v_out = vp + slot[t] * kv_heads * row;
      const float* v = x + (heads + kv_heads) * dim;
      for (int64_t h = 0; h < kv_heads; ++h) {
        if constexpr (kQ8Cache<T>) {
          rotate_half(x + (heads + h) * dim, c, s, dim, rotated.data());
          store_q8_row(rotated.data(), dim, k + h * row);
          store_q8_row(v + h * dim, dim, v_out + h * row);
        } else {
          rotate_half(x + (heads + h) * dim, c, s, dim, k + h * dim);
          for (int64_t i = 0; i < dim; ++i) v_out[h * dim + i] = static_cast<T>(v[h * dim + i]);
        }
      }
    }
  });
}

// Rotary embedding (HF's rotate-half) of q and k, and K/V stored at their cache slots, in
// one pass. qkv [T, H + 2 KVH, D] as the fused projection gives it; cos/sin [T, D];
// caches [slots, KVH, D], float32 or float16 (rounded to nearest, as torch's cast), or
// [slots, KVH, D + 4] int8 rows (store_q8_row). Returns the rotated queries [T, H, D].
torch::Tensor rope_write_kv(const torch::Tensor& qkv, const torch::Tensor& cos,
                            const torch::Tensor& sin, torch::Tensor k_cache, torch::Tensor v_cache,
                            const torch::Tensor& slots, int64_t heads) {
  TORCH_CHECK(qkv.is_contiguous() && cos.is_contiguous() && sin.is_contiguous() &&
              k_cache.is_contiguous() && v_cache.is_contiguous());
  const auto cache_type = k_cache.scalar_type();
  TORCH_CHECK(v_cache.scalar_type() == cache_type &&
                  (cache_type == torch::kFloat32 || cache_type == torch::kHalf ||
                   cache_type == torch::kChar),
              "a float32, float16 or int8 cache");
  const int64_t tokens = qkv.size(0), dim = qkv.size(2), kv_heads = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == (cache_type == torch::kChar ? dim + kQ8Scale : dim) &&
                  v_cache.sizes() == k_cache.sizes(),
              "cache rows of the head dim (int8: and a scale)");
  auto q = torch::empty({tokens, heads, dim}, qkv.options());
  auto slot_list = slots.contiguous();
  const float* src = qkv.data_ptr<float>();
  const int64_t* slot = slot_list.data_ptr<int64_t>();
  if (cache_type == torch::kChar) {
    rope_write_kv_impl(src, cos.data_ptr<float>(), sin.data_ptr<float>(), slot, tokens, heads,
                       kv_heads, dim, q.data_ptr<float>(), k_cache.data_ptr<int8_t>(),
                       v_cache.data_ptr<int8_t>());
  } else if (cache_type == torch::kHalf) {
    rope_write_kv_impl(src, cos.data_ptr<float>(), sin.data_ptr<float>(), slot, tokens, heads,
                       kv_heads, dim, q.data_ptr<float>(), k_cache.data_ptr<c10::Half>(),
                       v_cache.data_ptr<c10::Half>());
  } else {
    rope_write_kv_impl(src, cos.data_ptr<float>(), sin.data_ptr<float>(), slot, tokens, heads,
                       kv_heads, dim, q.data_ptr<float>(), k_cache.data_ptr<float>(),
                       v_cache.data_ptr<float>());
  }
  return q;
}

#ifdef INHOUSE_AVX2
// 2^(i/32) for i < 32 as doubles' bits, less i << 47 (glibc's __exp2f_data.tab).
constexpr uint64_t kExp2Table[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

// e^x of four floats, |x| < 88, as glibc's expf computes it (ARM's optimized-routines
// algorithm in doubles, its FMA build: x * 32 / ln2 = k + r, e^x = 2^(k/32) * p(r)), so the
// same bits as std::exp on an AVX2 host (checked against it over every such float once;
// test_cpu_kernels.py checks 200,000).
inline __m128 libm_exp4(__m128 x) {
  const __m256d z = _mm256_mul_pd(_mm256_set1_pd(0x1.71547652b82fep+0 * 32), _mm256_cvtps_pd(x));
  const __m256d shifted = _mm256_add_pd(z, _mm256_set1_pd(0x1.8p+52));
  const __m256i k = _mm256_castpd_si256(shifted);
  const __m256d r = _mm256_sub_pd(z, _mm256_sub_pd(shifted, _mm256_set1_pd(0x1.8p+52)));
  const __m256i bits = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(kExp2Table),
                                              _mm256_and_si256(k, _mm256_set1_epi64x(31)), 8);
  const __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(bits, _mm256_slli_epi64(k, 47)));
  const __m256d cubic = _mm256_fmadd_pd(_mm256_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), r,
                                        _mm256_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32));
  __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(0x1.62e42ff0c52d6p-1 / 32), r, _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(cubic, _mm256_mul_pd(r, r), y);
  return _mm256_cvtpd_ps(_mm256_mul_pd(y, s));
}
#endif

// silu(gate) * up for gate_up [T, 2I] (gate first), one pass, each as x / (1 + e^-x) * up in
// floats. Eight at a time where the CPU has AVX2 (e^-x by libm_exp4, the same bits as
// std::exp; lanes with |x| >= 88 or NaN by std::exp): std::exp one float at a time held a
// 17-row draft's swiglu at 92 us a layer (now 35).
torch::Tensor silu_mul(const torch::Tensor& gate_up) {
  TORCH_CHECK(gate_up.is_contiguous() && gate_up.scalar_type() == torch::kFloat32);
  const int64_t tokens = gate_up.size(0), inter = gate_up.size(1) / 2;
  auto out = torch::empty({tokens, inter}, gate_up.options());
  const float* g = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  inhouse::parallel_for(0, tokens, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* gt = g + t * 2 * inter;
      float* ot = o + t * inter;
      int64_t i = 0;
#ifdef INHOUSE_AVX2
      for (; i + 8 <= inter; i += 8) {
        const __m256 x = _mm256_loadu_ps(gt + i), minus = _mm256_sub_ps(_mm256_setzero_ps(), x);
        __m256 e = _mm256_set_m128(libm_exp4(_mm256_extractf128_ps(minus, 1)),
                                   libm_exp4(_mm256_castps256_ps128(minus)));
        const __m256 far = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), x),
                                         _mm256_set1_ps(88.f), _CMP_NLT_UQ);
        if (_mm256_movemask_ps(far) != 0) {
          alignas(32) float lanes[8];
          for (int l = 0; l < 8; ++l) lanes[l] = std::exp(-gt[i + l]);
          e = _mm256_load_ps(lanes);
        }
        const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.f), e));
        _mm256_storeu_ps(ot + i, _mm256_mul_ps(silu, _mm256_loadu_ps(gt + inter + i)));
      }
#endif
      for (; i < inter; ++i) {
        const float x = gt[i];
        ot[i] = x / (1.f + std::exp(-x)) * gt[inter + i];
      }
    }
  });
  return out;
}

// Where quantize_q8/quantize_q4 put row r's values of group g: both write the linears'
// tiles directly (codes [N/8, K/32, bytes], scales and mins [N/8, K/32, 8]).
struct TileSlot {
  int64_t block;  // (tile, group) index
  int64_t row;    // row within the tile
};
inline TileSlot tile_slot(int64_t row, int64_t group, int64_t groups) {
  return {(row / kTile) * groups + group, row % kTile};
}

// Weights [N, K] (float32, N a multiple of 8, K of 32) to q8 blocks: d = max|w| / 127,
// q = round(w / d) (as w * (1 / d), ties to even), one pass, rows split over threads.
std::tuple<torch::Tensor, torch::Tensor> quantize_q8(const torch::Tensor& weight) {
  auto w = weight.to(torch::kFloat32).contiguous();
  const int64_t n = w.size(0), k = w.size(1), groups = k / kGroup;
  TORCH_CHECK(w.dim() == 2 && k % kGroup == 0 && n % kTile == 0,
              "a [out, in] weight, out a multiple of 8 and in of 32");
  auto q = torch::empty({n / kTile, groups, kQ8TileGroupBytes}, torch::kInt8);
  auto d = torch::empty({n / kTile, groups, kTile}, torch::kFloat32);
  const float* wp = w.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  float* dp = d.data_ptr<float>();
  at::parallel_for(0, n * groups, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* wg = wp + i * kGroup;
      const TileSlot slot = tile_slot(i / groups, i % groups, groups);
      float amax = 0.f;
      for (int j = 0; j < kGroup; ++j) amax = std::max(amax, std::fabs(wg[j]));
      const float scale = amax / 127.f, inv = scale > 0.f ? 1.f / scale : 0.f;
      int8_t* block = qp + slot.block * kQ8TileGroupBytes;
      for (int j = 0; j < kGroup; ++j) {
        const float code = std::nearbyint(wg[j] * inv);
        block[tile_byte<false>(slot.row, j)] = static_cast<int8_t>(std::clamp(code, -127.f, 127.f));
      }
      dp[slot.block * kTile + slot.row] = scale;
    }
  });
  return {q, d};
}

// Weights [N, K] to q4 blocks: d = (max - min) / 15, m = min, code = round((w - m) / d)
// (as (w - m) * (1 / d), ties to even).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> quantize_q4(const torch::Tensor& weight) {
  auto w = weight.to(torch::kFloat32).contiguous();
  const int64_t n = w.size(0), k = w.size(1), groups = k / kGroup;
  TORCH_CHECK(w.dim() == 2 && k % kGroup == 0 && n % kTile == 0,
              "a [out, in] weight, out a multiple of 8 and in of 32");
  auto q = torch::zeros({n / kTile, groups, kQ4TileGroupBytes}, torch::kUInt8);
  auto d = torch::empty({n / kTile, groups, kTile}, torch::kFloat32);
  auto m = torch::empty({n / kTile, groups, kTile}, torch::kFloat32);
  const float* wp = w.data_ptr<float>();
  uint8_t* qp = q.data_ptr<uint8_t>();
  float* dp = d.data_ptr<float>();
  float* mp = m.data_ptr<float>();
  at::parallel_for(0, n * groups, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* wg = wp + i * kGroup;
      const TileSlot slot = tile_slot(i / groups, i % groups, groups);
      float low = wg[0], high = wg[0];
      for (int j = 1; j < kGroup; ++j) {
        low = std::min(low, wg[j]);
        high = std::max(high, wg[j]);
      }
      const float scale = (high - low) / 15.f, inv = scale > 0.f ? 1.f / scale : 0.f;
      uint8_t* block = qp + slot.block * kQ4TileGroupBytes;
      for (int j = 0; j < kGroup; ++j) {
        const float diff = wg[j] - low;
        const auto code = static_cast<uint8_t>(std::clamp(std::nearbyint(diff * inv), 0.f, 15.f));
        block[tile_byte<true>(slot.row, j)] |= code << (4 * ((j % 8) / 4));
      }
      dp[slot.block * kTile + slot.row] = scale;
      mp[slot.block * kTile + slot.row] = low;
    }
  });
  return {q, d, m};
}

// x[0]^2 + ... + x[dim - 1]^2 as eight FMA chains (feature i on chain i % 8) folded in a
// fixed order: the same bits from AVX2 and AVX-512 code (an omp simd reduction's order is
// the vector width's, and the two builds' norms differed in the last bit).
inline float sum_of_squares(const float* x, int64_t dim) {
  float c[8] = {};
  int64_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    INHOUSE_UNROLL for (int l = 0; l < 8; ++l) c[l] = std::fma(x[i + l], x[i + l], c[l]);
  }
  for (; i < dim; ++i) c[i % 8] = std::fma(x[i], x[i], c[i % 8]);
  return ((c[0] + c[4]) + (c[2] + c[6])) + ((c[1] + c[5]) + (c[3] + c[7]));
}

// The residual stream's update and the next RMSNorm in one pass over each token:
// residual += delta (in place; no delta for the first layer), then
// out = residual / sqrt(mean(residual^2) + eps) * weight, in HF's order of operations.
torch::Tensor add_rms_norm(torch::Tensor residual, const c10::optional<torch::Tensor>& delta,
                           const torch::Tensor& weight, double eps) {
  TORCH_CHECK(residual.is_contiguous() && weight.is_contiguous() &&
              residual.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32);
  const int64_t dim = residual.size(-1), tokens = residual.numel() / dim;
  TORCH_CHECK(weight.numel() == dim, "one weight per feature");
  torch::Tensor added;
  if (delta.has_value()) {
    added = delta->contiguous();
    TORCH_CHECK(added.sizes() == residual.sizes() && added.scalar_type() == torch::kFloat32);
  }
  auto out = torch::empty_like(residual);
  float* rp = residual.data_ptr<float>();
  const float* dp = added.defined() ? added.data_ptr<float>() : nullptr;
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float epsilon = static_cast<float>(eps);
  inhouse::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* r = rp + t * dim;
      if (dp) {
        const float* d = dp + t * dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i) r[i] += d[i];
      }
      const float inv = 1.f / std::sqrt(sum_of_squares(r, dim) / static_cast<float>(dim) + epsilon);
      float* o = op + t * dim;
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) o[i] = wp[i] * (r[i] * inv);
    }
  });
  return out;
}

// A weight-only linear of the decode step, by its format: q4 when it has mins.
torch::Tensor linear_any(const torch::Tensor& x, const c10::List<c10::optional<torch::Tensor>>& w,
                         size_t at) {
  const torch::Tensor q = *w.get(at), d = *w.get(at + 1);
  const c10::optional<torch::Tensor> mins = w.get(at + 2), bias = w.get(at + 3);
  if (mins.has_value()) return linear_impl<true>(x, q, d, &*mins, bias);
  return linear_impl<false>(x, q, d, nullptr, bias);
}

constexpr size_t kLayerWeights = 18;

// A decode step (one new token for each of T sequences, or a few: a speculative draft's rows,
// each row's sequence in `row_seq`) through every decoder layer, calling the kernels above in
// the order the model's fused Python path calls them, so each row gets the same bits; what it
// saves is Python's dispatch of ~10 ops a layer. `weights` holds
// kLayerWeights entries a layer: input norm; qkv (q, d, mins?, bias?); o (the same four);
// post-attention norm; gate_up; down. Adds the previous MLP output `delta` into `residual`
// (in place) and returns the last layer's MLP output. A nonzero `stop[0]` (an int32 another
// thread may set while this runs) ends the call before the next layer, returning an empty
// tensor: the step was abandoned (its K/V writes so far are recomputed, the same bits, later).
torch::Tensor decode_layers(torch::Tensor residual, const c10::optional<torch::Tensor>& delta,
                            const torch::Tensor& cos, const torch::Tensor& sin,
                            torch::Tensor kv_caches, const torch::Tensor& slots,
                            const torch::Tensor& block_tables,
                            const c10::optional<torch::Tensor>& row_seq,
                            const torch::Tensor& context_lens, int64_t block_size, int64_t heads,
                            double scale,
                            at::IntArrayRef windows, double eps,
                            const c10::List<c10::optional<torch::Tensor>>& weights,
                            const c10::optional<torch::Tensor>& stop) {
  const int64_t layers = kv_caches.size(0), tokens = residual.size(0);
  TORCH_CHECK(!stop.has_value() || (stop->scalar_type() == torch::kInt32 && stop->numel() == 1),
              "stop is one int32");
  const volatile int32_t* stop_flag = stop.has_value() ? stop->data_ptr<int32_t>() : nullptr;
  const int64_t kv_heads = kv_caches.size(3);
  const int64_t dim = kv_caches.size(4) - (kv_caches.scalar_type() == torch::kChar ? kQ8Scale : 0);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * static_cast<int64_t>(kLayerWeights) &&
                  static_cast<int64_t>(windows.size()) == layers,
              "one set of weights and one window per layer");
  c10::optional<torch::Tensor> added = delta;
  for (int64_t l = 0; l < layers; ++l) {
    if (stop_flag != nullptr && *stop_flag != 0) return torch::empty({0}, residual.options());
    const size_t at = static_cast<size_t>(l) * kLayerWeights;
    torch::Tensor k_cache = kv_caches[l][0], v_cache = kv_caches[l][1];
    const torch::Tensor x = add_rms_norm(residual, added, *weights.get(at), eps);
    const torch::Tensor qkv = linear_any(x, weights, at + 1).view({tokens, heads + 2 * kv_heads, dim});
    const torch::Tensor q = rope_write_kv(qkv, cos, sin, k_cache, v_cache, slots, heads);
    const torch::Tensor attended = paged_attention_rows(q, k_cache, v_cache, block_tables,
                                                        row_seq, context_lens, block_size, scale,
                                                        windows[l], false);
    const torch::Tensor o = linear_any(attended, weights, at + 5);
    const torch::Tensor h = add_rms_norm(residual, o, *weights.get(at + 9), eps);
    added = linear_any(silu_mul(linear_any(h, weights, at + 10)), weights, at + 14);
  }
  return *added;
}

// The calling thread's share of the work pool (threads, itself included; 0: its torch
// setting), apart from torch's own threads.
void set_pool_threads(int64_t threads) {
  TORCH_CHECK(threads >= 0, "threads must be >= 0");
  inhouse::WorkPool::caller_threads() = static_cast<int>(threads);
}

}  // namespace

TORCH_LIBRARY(inhouse_cpu, m) {
  m.def("linear_q8(Tensor x, Tensor q, Tensor d, Tensor? bias) -> Tensor");
  m.def("linear_q4(Tensor x, Tensor q, Tensor d, Tensor mins, Tensor? bias) -> Tensor");
  m.def(
      "paged_attention_rows(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor? row_seq, Tensor context_lens, int block_size, float scale, int window, "
      "bool torch_threads=True) -> Tensor");
  m.def(
      "rope_write_kv(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor slots, int heads) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("add_rms_norm(Tensor(a!) residual, Tensor? delta, Tensor weight, float eps) -> Tensor");
  m.def(
      "decode_layers(Tensor(a!) residual, Tensor? delta, Tensor cos, Tensor sin, "
      "Tensor(b!) kv_caches, Tensor slots, Tensor block_tables, Tensor? row_seq, "
      "Tensor context_lens, "
      "int block_size, int heads, float scale, int[] windows, float eps, Tensor?[] weights, "
      "Tensor? stop=None) -> Tensor");
  m.def("quantize_q8(Tensor weight) -> (Tensor, Tensor)");
  m.def("quantize_q4(Tensor weight) -> (Tensor, Tensor, Tensor)");
  m.def("set_pool_threads(int threads) -> ()", &set_pool_threads);
}

TORCH_LIBRARY_IMPL(inhouse_cpu, CPU, m) {
  m.impl("linear_q8", &linear_q8);
  m.impl("linear_q4", &linear_q4);
  m.impl("paged_attention_rows", &paged_attention_rows);
  m.impl("rope_write_kv", &rope_write_kv);
  m.impl("silu_mul", &silu_mul);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("decode_layers", &decode_layers);
  m.impl("quantize_q8", &quantize_q8);
  m.impl("quantize_q4", &quantize_q4);
}
