// CPU kernels for the decode path: weight-only quantized linears and paged decode attention.
//
// Built on the machine that runs them (-march=native, see build.py), so the same source
// becomes AVX2 or AVX-512 code; the explicit intrinsics below are AVX2/FMA (a subset of
// AVX-512), with a plain loop for CPUs without them.
//
// Weight formats, 32 weights a group along the input dimension K (activations are
// quantized the same way on the fly, see quantize_activations):
//   q8: int8 q [N, K], scales d [N, K/32]; w = d * q.
//   q4: uint8 q [N, K/2] (group g of row n: byte j holds weight j in its low nibble and
//       weight j+16 in its high nibble, as GGUF's Q4_1), scales d and mins m [N, K/32];
//       w = d * q + m.
// Activations and outputs are float32. Rows of the output are split over torch's threads.

#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "work_pool.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define INHOUSE_AVX2 1
#endif
#if defined(INHOUSE_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define INHOUSE_AVX512 1
#endif

namespace {

constexpr int64_t kGroup = 32;

// Activations are quantized per group of 32 to int8 (as llama.cpp's Q8 activations):
// xd = max|x| / 127, xq = round(x / xd), xs = xd * sum(xq) (for q4's min term). The
// products then run as int8 dot products, one float multiply-add per group.
struct QuantizedActivations {
  std::vector<int8_t> q;
  std::vector<float> d, s;
};

QuantizedActivations quantize_activations(const float* x, int64_t rows, int64_t k) {
  const int64_t groups = k / kGroup;
  QuantizedActivations a{std::vector<int8_t>(rows * k), std::vector<float>(rows * groups),
                         std::vector<float>(rows * groups)};
  for (int64_t i = 0; i < rows * groups; ++i) {
    const float* xg = x + i * kGroup;
    int8_t* qg = a.q.data() + i * kGroup;
    float amax = 0.f;
    for (int j = 0; j < kGroup; ++j) amax = std::max(amax, std::fabs(xg[j]));
    const float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
    int sum = 0;
    for (int j = 0; j < kGroup; ++j) {
      qg[j] = static_cast<int8_t>(std::nearbyint(xg[j] * inv));
      sum += qg[j];
    }
    a.d[i] = d;
    a.s[i] = d * static_cast<float>(sum);
  }
  return a;
}

#ifdef INHOUSE_AVX2
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Eight int32 partial sums of 32 products of unsigned u8 `u` and signed s8 `s`.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

#endif

// A q4 weight row's codes as one byte each (0..15), in order, so every activation
// row reuses the unpacking.
void unpack_q4_row(const uint8_t* q, int64_t groups, uint8_t* out) {
  for (int64_t g = 0; g < groups; ++g, q += kGroup / 2, out += kGroup) {
#ifdef INHOUSE_AVX2
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i mask = _mm_set1_epi8(0x0F);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_and_si128(raw, mask));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16),
                     _mm_and_si128(_mm_srli_epi16(raw, 4), mask));
#else
    for (int j = 0; j < 16; ++j) {
      out[j] = q[j] & 0x0F;
      out[j + 16] = q[j] >> 4;
    }
#endif
  }
}

#if defined(INHOUSE_AVX2) && !defined(INHOUSE_AVX512)
// AVX2 reads q4 rows as stored and unpacks each group's codes in registers.
constexpr bool kQ4InRegisters = true;
#else
// AVX-512 and the plain loops read each q4 row unpacked first (one byte a code).
constexpr bool kQ4InRegisters = false;
#endif

#ifdef INHOUSE_AVX2
// A q4 group's 32 codes (16 bytes as stored) as 32 bytes in order: low nibbles are codes
// 0..15, high nibbles 16..31.
inline __m256i unpack_q4_group(const uint8_t* q) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// One group's contribution for R activation rows, added to acc[r]: q8 signed bytes, q4
// unsigned codes (packed when kQ4InRegisters, else one byte each).
template <bool kQ4, int R>
inline void group_step(const uint8_t* wq, float wd, const QuantizedActivations& a, int64_t row0,
                       int64_t groups, int64_t g, __m256* acc) {
  const int64_t k = groups * kGroup;
  const __m256i w = kQ4 && kQ4InRegisters
                        ? unpack_q4_group(wq + g * kGroup / 2)
                        : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + g * kGroup));
  const __m256i wabs = kQ4 ? w : _mm256_sign_epi8(w, w);
  for (int r = 0; r < R; ++r) {
    __m256i x = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(a.q.data() + (row0 + r) * k + g * kGroup));
    if constexpr (!kQ4) x = _mm256_sign_epi8(x, w);
    const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(wabs, x));
    acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(wd * a.d[(row0 + r) * groups + g]), acc[r]);
  }
}
#endif

#ifdef INHOUSE_AVX512
// AVX-512: two groups per 512-bit register, for R rows against one weight row of an even
// number of groups. Signs move onto the activations by a masked negation (no vpsignb);
// with VNNI one vpdpbusd replaces maddubs + madd.
template <bool kQ4, int R>
void dot_row_512(const uint8_t* wq, const float* wd, const QuantizedActivations& a,
                 int64_t row0, int64_t groups, float* out) {
  const int64_t k = groups * kGroup;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g += 2) {
    const __m512i w = _mm512_loadu_si512(wq + g * kGroup);
    const __m512i wabs = kQ4 ? w : _mm512_abs_epi8(w);
    const __mmask64 negative = kQ4 ? 0 : _mm512_movepi8_mask(w);
    const __m512 wscale = _mm512_insertf32x8(_mm512_set1_ps(wd[g]), _mm256_set1_ps(wd[g + 1]), 1);
    for (int r = 0; r < R; ++r) {
      const int64_t row = row0 + r;
      __m512i x = _mm512_loadu_si512(a.q.data() + row * k + g * kGroup);
      if constexpr (!kQ4) x = _mm512_mask_sub_epi8(x, negative, _mm512_setzero_si512(), x);
#if defined(__AVX512VNNI__)
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wabs, x);
#else
      const __m512i dot = _mm512_madd_epi16(_mm512_maddubs_epi16(wabs, x), _mm512_set1_epi16(1));
#endif
      const float* xd = a.d.data() + row * groups + g;
      const __m512 xscale = _mm512_insertf32x8(_mm512_set1_ps(xd[0]), _mm256_set1_ps(xd[1]), 1);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(wscale, xscale), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = _mm512_reduce_add_ps(acc[r]);
}
#endif

// q4's per-group mins against the activations' group sums: sum over g of wm[g] * s[g].
inline float min_term(const float* wm, const float* s, int64_t groups) {
  int64_t g = 0;
  float tail = 0.f;
#ifdef INHOUSE_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; g + 8 <= groups; g += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(wm + g), _mm256_loadu_ps(s + g), acc);
  }
  tail = hsum(acc);
#endif
  for (; g < groups; ++g) tail += wm[g] * s[g];
  return tail;
}

// out[r] for R (1..4) activation rows against one weight row of `groups` groups: q8 signed
// bytes; q4 unsigned codes (see kQ4InRegisters) with a per-group min `wm`.
template <bool kQ4, int R>
void dot_row(const uint8_t* wq, const float* wd, const float* wm, const QuantizedActivations& a,
             int64_t row0, int64_t groups, float* out) {
  const int64_t k = groups * kGroup;
#ifdef INHOUSE_AVX512
  if (groups % 2 == 0) {
    dot_row_512<kQ4, R>(wq, wd, a, row0, groups, out);
  } else
#endif
  {
#ifdef INHOUSE_AVX2
  __m256 even[R], odd[R];
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 1 < groups; g += 2) {
    group_step<kQ4, R>(wq, wd[g], a, row0, groups, g, even);
    group_step<kQ4, R>(wq, wd[g + 1], a, row0, groups, g + 1, odd);
  }
  if (g < groups) group_step<kQ4, R>(wq, wd[g], a, row0, groups, g, even);
  for (int r = 0; r < R; ++r) out[r] = hsum(_mm256_add_ps(even[r], odd[r]));
#else
  for (int r = 0; r < R; ++r) {
    float total = 0.f;
    for (int64_t g = 0; g < groups; ++g) {
      const int8_t* x = a.q.data() + (row0 + r) * k + g * kGroup;
      int dot = 0;
      for (int j = 0; j < kGroup; ++j) {
        const int wj = kQ4 ? wq[g * kGroup + j] : static_cast<int8_t>(wq[g * kGroup + j]);
        dot += wj * x[j];
      }
      total += wd[g] * a.d[(row0 + r) * groups + g] * static_cast<float>(dot);
    }
    out[r] = total;
  }
#endif
  }
  if constexpr (kQ4) {
    for (int r = 0; r < R; ++r) out[r] += min_term(wm, a.s.data() + (row0 + r) * groups, groups);
  }
}

template <bool kQ4>
void dot_rows(const uint8_t* wq, const float* wd, const float* wm, const QuantizedActivations& a,
              int64_t row0, int rows, int64_t groups, float* out) {
  switch (rows) {
    case 1: return dot_row<kQ4, 1>(wq, wd, wm, a, row0, groups, out);
    case 2: return dot_row<kQ4, 2>(wq, wd, wm, a, row0, groups, out);
    case 3: return dot_row<kQ4, 3>(wq, wd, wm, a, row0, groups, out);
    default: return dot_row<kQ4, 4>(wq, wd, wm, a, row0, groups, out);
  }
}

template <bool kQ4>
torch::Tensor linear_impl(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                          const torch::Tensor* mins, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "activations must be float32");
  TORCH_CHECK(q.is_contiguous() && d.is_contiguous() && d.scalar_type() == torch::kFloat32);
  const int64_t n_out = q.size(0), k = kQ4 ? q.size(1) * 2 : q.size(1), groups = k / kGroup;
  TORCH_CHECK(k % kGroup == 0 && x.size(-1) == k, "input features must match, a multiple of 32");
  auto x2 = x.reshape({-1, k}).contiguous();
  const int64_t m = x2.size(0);
  auto out = torch::empty({m, n_out}, x.options());
  const QuantizedActivations a = quantize_activations(x2.data_ptr<float>(), m, k);
  const auto* qp = static_cast<const uint8_t*>(q.data_ptr());
  const float* dp = d.data_ptr<float>();
  const float* mp = mins ? mins->data_ptr<float>() : nullptr;
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const int64_t row_bytes = kQ4 ? k / 2 : k;
  float* op = out.data_ptr<float>();
  inhouse::parallel_for(0, n_out, 16, [&](int64_t begin, int64_t end) {
    float sums[4];
    std::vector<uint8_t> codes(kQ4 && !kQ4InRegisters ? k : 0);
    for (int64_t n = begin; n < end; ++n) {
      const float b = bp ? bp[n] : 0.f;
      const uint8_t* row = qp + n * row_bytes;
      if constexpr (kQ4 && !kQ4InRegisters) {
        unpack_q4_row(row, groups, codes.data());
        row = codes.data();
      }
      for (int64_t r = 0; r < m; r += 4) {
        const int rows = static_cast<int>(std::min<int64_t>(4, m - r));
        dot_rows<kQ4>(row, dp + n * groups, mp ? mp + n * groups : nullptr, a, r,
                     rows, groups, sums);
        for (int i = 0; i < rows; ++i) op[(r + i) * n_out + n] = sums[i] + b;
      }
    }
  });
  auto shape = x.sizes().vec();
  shape.back() = n_out;
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

// Decode attention straight from the paged cache: one query token per sequence.
// q [B, H, D]; caches [slots, KVH, D]; block_tables int64 [B, W]; context_lens int64 [B].
// Sequence b attends to its positions max(0, len - window) .. len - 1 (window 0 = all).
torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                     const torch::Tensor& v_cache,
                                     const torch::Tensor& block_tables,
                                     const torch::Tensor& context_lens, int64_t block_size,
                                     double scale, int64_t window) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k_cache.scalar_type() == torch::kFloat32);
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && q.is_contiguous());
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(1), group = heads / kv_heads;
  const int64_t width = block_tables.size(1);
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  auto out = torch::empty({batch, heads * dim}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t row = kv_heads * dim;  // floats per cache slot
  inhouse::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / kv_heads, kvh = item % kv_heads;
      const int64_t len = lp[b];
      const int64_t start = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      TORCH_CHECK(len <= width * block_size, "context longer than the block table");
      scores.resize(len - start);
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const float* qh = qp + (b * heads + h) * dim;
        float top = -INFINITY;
        for (int64_t t = start; t < len; ++t) {
          const int64_t slot = tp[b * width + t / block_size] * block_size + t % block_size;
          const float* kt = kp + slot * row + kvh * dim;
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t i = 0; i < dim; ++i) s += qh[i] * kt[i];
          s *= static_cast<float>(scale);
          scores[t - start] = s;
          top = std::max(top, s);
        }
        float total = 0.f;
        for (auto& s : scores) total += (s = std::exp(s - top));
        float* oh = op + b * heads * dim + h * dim;
        std::fill(oh, oh + dim, 0.f);
        for (int64_t t = start; t < len; ++t) {
          const int64_t slot = tp[b * width + t / block_size] * block_size + t % block_size;
          const float* vt = vp + slot * row + kvh * dim;
          const float p = scores[t - start] / total;
#pragma omp simd
          for (int64_t i = 0; i < dim; ++i) oh[i] += p * vt[i];
        }
      }
    }
  });
  return out;
}

// Rotary embedding (HF's rotate-half) of q and k, and K/V stored at their cache slots, in
// one pass. qkv [T, H + 2 KVH, D] as the fused projection gives it; cos/sin [T, D];
// caches [slots, KVH, D]. Returns the rotated queries [T, H, D].
torch::Tensor rope_write_kv(const torch::Tensor& qkv, const torch::Tensor& cos,
                            const torch::Tensor& sin, torch::Tensor k_cache, torch::Tensor v_cache,
                            const torch::Tensor& slots, int64_t heads) {
  TORCH_CHECK(qkv.is_contiguous() && cos.is_contiguous() && sin.is_contiguous() &&
              k_cache.is_contiguous() && v_cache.is_contiguous());
  const int64_t tokens = qkv.size(0), dim = qkv.size(2), kv_heads = k_cache.size(1);
  const int64_t half = dim / 2, width = heads + 2 * kv_heads;
  auto q = torch::empty({tokens, heads, dim}, qkv.options());
  auto slot_list = slots.contiguous();
  const float* src = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t* slot = slot_list.data_ptr<int64_t>();
  float* qp = q.data_ptr<float>();
  float* kp = k_cache.data_ptr<float>();
  float* vp = v_cache.data_ptr<float>();
  inhouse::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cp + t * dim;
      const float* s = sp + t * dim;
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        const float* x = src + (t * width + h) * dim;
        float* out = h < heads ? qp + (t * heads + h) * dim
                               : kp + (slot[t] * kv_heads + h - heads) * dim;
        for (int64_t i = 0; i < half; ++i) {
          out[i] = x[i] * c[i] - x[i + half] * s[i];
          out[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
        }
      }
      const float* v = src + (t * width + heads + kv_heads) * dim;
      std::copy(v, v + kv_heads * dim, vp + slot[t] * kv_heads * dim);
    }
  });
  return q;
}

// silu(gate) * up for gate_up [T, 2I] (gate first), one pass.
torch::Tensor silu_mul(const torch::Tensor& gate_up) {
  TORCH_CHECK(gate_up.is_contiguous() && gate_up.scalar_type() == torch::kFloat32);
  const int64_t tokens = gate_up.size(0), inter = gate_up.size(1) / 2;
  auto out = torch::empty({tokens, inter}, gate_up.options());
  const float* g = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    const float* gt = g + t * 2 * inter;
    for (int64_t i = 0; i < inter; ++i) {
      const float x = gt[i];
      o[t * inter + i] = x / (1.f + std::exp(-x)) * gt[inter + i];
    }
  }
  return out;
}

// Weights [N, K] (float32, K a multiple of 32) to q8 blocks: d = max|w| / 127,
// q = round(w / d) (as w * (1 / d), ties to even), one pass, rows split over threads.
std::tuple<torch::Tensor, torch::Tensor> quantize_q8(const torch::Tensor& weight) {
  auto w = weight.to(torch::kFloat32).contiguous();
  const int64_t n = w.size(0), k = w.size(1), groups = k / kGroup;
  TORCH_CHECK(w.dim() == 2 && k % kGroup == 0, "a [out, in] weight, in a multiple of 32");
  auto q = torch::empty({n, k}, torch::kInt8);
  auto d = torch::empty({n, groups}, torch::kFloat32);
  const float* wp = w.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  float* dp = d.data_ptr<float>();
  at::parallel_for(0, n * groups, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* wg = wp + i * kGroup;
      float amax = 0.f;
      for (int j = 0; j < kGroup; ++j) amax = std::max(amax, std::fabs(wg[j]));
      const float scale = amax / 127.f, inv = scale > 0.f ? 1.f / scale : 0.f;
      for (int j = 0; j < kGroup; ++j) {
        const float code = std::nearbyint(wg[j] * inv);
        qp[i * kGroup + j] = static_cast<int8_t>(std::clamp(code, -127.f, 127.f));
      }
      dp[i] = scale;
    }
  });
  return {q, d};
}

// Weights [N, K] to q4 blocks: d = (max - min) / 15, m = min, code = round((w - m) / d)
// (as (w - m) * (1 / d), ties to even); byte j of a group holds codes j and j + 16.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> quantize_q4(const torch::Tensor& weight) {
  auto w = weight.to(torch::kFloat32).contiguous();
  const int64_t n = w.size(0), k = w.size(1), groups = k / kGroup;
  TORCH_CHECK(w.dim() == 2 && k % kGroup == 0, "a [out, in] weight, in a multiple of 32");
  auto q = torch::empty({n, k / 2}, torch::kUInt8);
  auto d = torch::empty({n, groups}, torch::kFloat32);
  auto m = torch::empty({n, groups}, torch::kFloat32);
  const float* wp = w.data_ptr<float>();
  uint8_t* qp = q.data_ptr<uint8_t>();
  float* dp = d.data_ptr<float>();
  float* mp = m.data_ptr<float>();
  at::parallel_for(0, n * groups, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* wg = wp + i * kGroup;
      float low = wg[0], high = wg[0];
      for (int j = 1; j < kGroup; ++j) {
        low = std::min(low, wg[j]);
        high = std::max(high, wg[j]);
      }
      const float scale = (high - low) / 15.f, inv = scale > 0.f ? 1.f / scale : 0.f;
      uint8_t codes[kGroup];
      for (int j = 0; j < kGroup; ++j) {
        const float diff = wg[j] - low;
        codes[j] = static_cast<uint8_t>(std::clamp(std::nearbyint(diff * inv), 0.f, 15.f));
      }
      for (int j = 0; j < kGroup / 2; ++j) qp[i * kGroup / 2 + j] = codes[j] | (codes[j + 16] << 4);
      dp[i] = scale;
      mp[i] = low;
    }
  });
  return {q, d, m};
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
      float squares = 0.f;
#pragma omp simd reduction(+ : squares)
      for (int64_t i = 0; i < dim; ++i) squares += r[i] * r[i];
      const float inv = 1.f / std::sqrt(squares / static_cast<float>(dim) + epsilon);
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

// A decode step (one new token for each of T sequences) through every decoder layer, calling
// the kernels above in the order the model's fused Python path calls them, so each row gets
// the same bits; what it saves is Python's dispatch of ~10 ops a layer. `weights` holds
// kLayerWeights entries a layer: input norm; qkv (q, d, mins?, bias?); o (the same four);
// post-attention norm; gate_up; down. Adds the previous MLP output `delta` into `residual`
// (in place) and returns the last layer's MLP output.
torch::Tensor decode_layers(torch::Tensor residual, const c10::optional<torch::Tensor>& delta,
                            const torch::Tensor& cos, const torch::Tensor& sin,
                            torch::Tensor kv_caches, const torch::Tensor& slots,
                            const torch::Tensor& block_tables, const torch::Tensor& context_lens,
                            int64_t block_size, int64_t heads, double scale,
                            at::IntArrayRef windows, double eps,
                            const c10::List<c10::optional<torch::Tensor>>& weights) {
  const int64_t layers = kv_caches.size(0), tokens = residual.size(0);
  const int64_t kv_heads = kv_caches.size(3), dim = kv_caches.size(4);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * static_cast<int64_t>(kLayerWeights) &&
                  static_cast<int64_t>(windows.size()) == layers,
              "one set of weights and one window per layer");
  c10::optional<torch::Tensor> added = delta;
  for (int64_t l = 0; l < layers; ++l) {
    const size_t at = static_cast<size_t>(l) * kLayerWeights;
    torch::Tensor k_cache = kv_caches[l][0], v_cache = kv_caches[l][1];
    const torch::Tensor x = add_rms_norm(residual, added, *weights.get(at), eps);
    const torch::Tensor qkv = linear_any(x, weights, at + 1).view({tokens, heads + 2 * kv_heads, dim});
    const torch::Tensor q = rope_write_kv(qkv, cos, sin, k_cache, v_cache, slots, heads);
    const torch::Tensor attended = paged_decode_attention(
        q, k_cache, v_cache, block_tables, context_lens, block_size, scale, windows[l]);
    const torch::Tensor o = linear_any(attended, weights, at + 5);
    const torch::Tensor h = add_rms_norm(residual, o, *weights.get(at + 9), eps);
    added = linear_any(silu_mul(linear_any(h, weights, at + 10)), weights, at + 14);
  }
  return *added;
}

}  // namespace

TORCH_LIBRARY(inhouse_cpu, m) {
  m.def("linear_q8(Tensor x, Tensor q, Tensor d, Tensor? bias) -> Tensor");
  m.def("linear_q4(Tensor x, Tensor q, Tensor d, Tensor mins, Tensor? bias) -> Tensor");
  m.def(
      "paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor context_lens, int block_size, float scale, int window) -> Tensor");
  m.def(
      "rope_write_kv(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor slots, int heads) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("add_rms_norm(Tensor(a!) residual, Tensor? delta, Tensor weight, float eps) -> Tensor");
  m.def(
      "decode_layers(Tensor(a!) residual, Tensor? delta, Tensor cos, Tensor sin, "
      "Tensor(b!) kv_caches, Tensor slots, Tensor block_tables, Tensor context_lens, "
      "int block_size, int heads, float scale, int[] windows, float eps, Tensor?[] weights) "
      "-> Tensor");
  m.def("quantize_q8(Tensor weight) -> (Tensor, Tensor)");
  m.def("quantize_q4(Tensor weight) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(inhouse_cpu, CPU, m) {
  m.impl("linear_q8", &linear_q8);
  m.impl("linear_q4", &linear_q4);
  m.impl("paged_decode_attention", &paged_decode_attention);
  m.impl("rope_write_kv", &rope_write_kv);
  m.impl("silu_mul", &silu_mul);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("decode_layers", &decode_layers);
  m.impl("quantize_q8", &quantize_q8);
  m.impl("quantize_q4", &quantize_q4);
}
