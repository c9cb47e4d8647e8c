// Weight-only quantized linears (q8, q4) and the weights' quantization into their tiles.
//

// Weight formats, 32 weights a group along the input dimension K (activations are
// quantized the same way on the fly, see quantize_activations):
//   q8: codes q in [-127, 127], one scale d a group; w = d * q.
//   q4: codes q in 0..15 (as GGUF's Q4_1), a scale d and a min m a group; w = d * q + m.
// quantize_q8/quantize_q4 write them in the tiles of 8 rows the linears read (see kTile).
// Activations and outputs are float32. Output tiles are split over the work pool's threads;
// a pass of many rows goes to the AMX tiles where the CPU has them (amx_linear.cpp).

#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "amx_linear.h"
#include "kernels.h"
#include "prompt_linear.h"
#include "quant_layout.h"
#include "simd.h"
#include "work_pool.h"

namespace inhouse {
namespace {

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

#ifdef INHOUSE_AVX2

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

// sum + vpdpbusd(w, the four bytes at x in every lane), the four bytes read as the
// instruction's own broadcast operand ({1to16}); GCC 12 emits a vpbroadcastd for each instead,
// and a 950-row layer ran 1.1x slower on Zen 4.
inline __m512i dot_broadcast(__m512i sum, __m512i w, const int8_t* x) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0"
          : "+v"(sum)
          : "v"(w), "m"(*reinterpret_cast<const int32_t(*)[1]>(x)));
  return sum;
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
    // The rows' sums side by side, quad by quad: R independent chains of vpdpbusd in flight,
    // not one row's eight in a row. q8's excess starts its sum.
    __m512i sum[R];
    INHOUSE_UNROLL for (int r = 0; r < R; ++r) {
      sum[r] = kQ4 ? _mm512_setzero_si512() : _mm512_set1_epi32(-128 * a.sum[(row0 + r) * groups + g]);
    }
    INHOUSE_UNROLL for (int j = 0; j < 8; ++j) {
      INHOUSE_UNROLL for (int r = 0; r < R; ++r) {
        sum[r] = dot_broadcast(sum[r], w[j], a.q.data() + (row0 + r) * k + g * kGroup + 4 * j);
      }
    }
    INHOUSE_UNROLL for (int r = 0; r < R; ++r) {
      const int64_t at = (row0 + r) * groups + g;
      const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(a.d[at]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), scale, acc[r]);
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
                          const torch::Tensor* mins, const c10::optional<torch::Tensor>& bias,
                          const c10::optional<torch::Tensor>& prompt_rows = c10::nullopt) {
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
  const auto* qp = static_cast<const uint8_t*>(q.data_ptr());
  const float* dp = d.data_ptr<float>();
  const float* mp = mins ? mins->data_ptr<float>() : nullptr;
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  auto shape = x.sizes().vec();
  shape.back() = n_out;
  if (prompt_rows.has_value() && inhouse::prompt_linear::ready(tiles)) {
    // A prompt's own rows on the bf16 tiles (prompt_linear.cpp), the others below.
    const auto marked = prompt_rows->contiguous();
    TORCH_CHECK(marked.scalar_type() == torch::kBool && marked.numel() == m,
                "prompt_rows: one bool per row");
    inhouse::prompt_linear::Rows rows{x2.data_ptr<float>(), {}, k, tiles, qp, dp, mp, bp, op};
    std::vector<int64_t> rest;
    const bool* is_prompt = marked.data_ptr<bool>();
    for (int64_t i = 0; i < m; ++i) (is_prompt[i] ? rows.index : rest).push_back(i);
    if (!rows.index.empty()) inhouse::prompt_linear::linear(rows);
    if (!rest.empty()) {
      const auto index = torch::tensor(rest, torch::dtype(torch::kInt64));
      out.index_copy_(0, index, linear_impl<kQ4>(x2.index_select(0, index), q, d, mins, bias));
    }
    return out.view(shape);
  }
  const QuantizedActivations a = quantize_activations(x2.data_ptr<float>(), m, k);
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

}  // namespace

torch::Tensor linear_q8(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                        const c10::optional<torch::Tensor>& bias,
                        const c10::optional<torch::Tensor>& prompt_rows) {
  TORCH_CHECK(q.scalar_type() == torch::kInt8, "q8 weights are int8");
  return linear_impl<false>(x, q, d, nullptr, bias, prompt_rows);
}

torch::Tensor linear_q4(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                        const torch::Tensor& mins, const c10::optional<torch::Tensor>& bias,
                        const c10::optional<torch::Tensor>& prompt_rows) {
  TORCH_CHECK(q.scalar_type() == torch::kUInt8 && mins.is_contiguous(), "q4 weights are uint8");
  return linear_impl<true>(x, q, d, &mins, bias, prompt_rows);
}

// A weight-only linear of the decode step, by its format: q4 when it has mins.
torch::Tensor linear_any(const torch::Tensor& x, const c10::List<c10::optional<torch::Tensor>>& w,
                         size_t at) {
  const torch::Tensor q = *w.get(at), d = *w.get(at + 1);
  const c10::optional<torch::Tensor> mins = w.get(at + 2), bias = w.get(at + 3);
  if (mins.has_value()) return linear_impl<true>(x, q, d, &*mins, bias);
  return linear_impl<false>(x, q, d, nullptr, bias);
}

namespace {

// Where quantize_q8/quantize_q4 put row r's values of group g: both write the linears'
// tiles directly (codes [N/8, K/32, bytes], scales and mins [N/8, K/32, 8]).
struct TileSlot {
  int64_t block;  // (tile, group) index
  int64_t row;    // row within the tile
};
inline TileSlot tile_slot(int64_t row, int64_t group, int64_t groups) {
  return {(row / kTile) * groups + group, row % kTile};
}

// A [N, K] weight as float32, checked to split into tiles of 8 rows and groups of 32.
torch::Tensor grouped_weight(const torch::Tensor& weight) {
  auto w = weight.to(torch::kFloat32).contiguous();
  TORCH_CHECK(w.dim() == 2 && w.size(1) % kGroup == 0 && w.size(0) % kTile == 0,
              "a [out, in] weight, out a multiple of 8 and in of 32");
  return w;
}

// `visit(the group's 32 weights, its tile slot)` for every group of a grouped weight, rows
// split over threads.
template <typename Visit>
void for_each_group(const torch::Tensor& w, Visit visit) {
  const int64_t n = w.size(0), groups = w.size(1) / kGroup;
  const float* wp = w.data_ptr<float>();
  at::parallel_for(0, n * groups, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      visit(wp + i * kGroup, tile_slot(i / groups, i % groups, groups));
    }
  });
}

}  // namespace

// Weights [N, K] (float32, N a multiple of 8, K of 32) to q8 blocks: d = max|w| / 127,
// q = round(w / d) (as w * (1 / d), ties to even), one pass, rows split over threads.
std::tuple<torch::Tensor, torch::Tensor> quantize_q8(const torch::Tensor& weight) {
  auto w = grouped_weight(weight);
  const int64_t tiles = w.size(0) / kTile, groups = w.size(1) / kGroup;
  auto q = torch::empty({tiles, groups, kQ8TileGroupBytes}, torch::kInt8);
  auto d = torch::empty({tiles, groups, kTile}, torch::kFloat32);
  int8_t* qp = q.data_ptr<int8_t>();
  float* dp = d.data_ptr<float>();
  for_each_group(w, [&](const float* wg, TileSlot slot) {
    float amax = 0.f;
    for (int j = 0; j < kGroup; ++j) amax = std::max(amax, std::fabs(wg[j]));
    const float scale = amax / 127.f, inv = scale > 0.f ? 1.f / scale : 0.f;
    int8_t* block = qp + slot.block * kQ8TileGroupBytes;
    for (int j = 0; j < kGroup; ++j) {
      const float code = std::nearbyint(wg[j] * inv);
      block[tile_byte<false>(slot.row, j)] = static_cast<int8_t>(std::clamp(code, -127.f, 127.f));
    }
    dp[slot.block * kTile + slot.row] = scale;
  });
  return {q, d};
}

// Weights [N, K] to q4 blocks: d = (max - min) / 15, m = min, code = round((w - m) / d)
// (as (w - m) * (1 / d), ties to even).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> quantize_q4(const torch::Tensor& weight) {
  auto w = grouped_weight(weight);
  const int64_t tiles = w.size(0) / kTile, groups = w.size(1) / kGroup;
  auto q = torch::zeros({tiles, groups, kQ4TileGroupBytes}, torch::kUInt8);
  auto d = torch::empty({tiles, groups, kTile}, torch::kFloat32);
  auto m = torch::empty({tiles, groups, kTile}, torch::kFloat32);
  uint8_t* qp = q.data_ptr<uint8_t>();
  float* dp = d.data_ptr<float>();
  float* mp = m.data_ptr<float>();
  for_each_group(w, [&](const float* wg, TileSlot slot) {
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
  });
  return {q, d, m};
}

}  // namespace inhouse
