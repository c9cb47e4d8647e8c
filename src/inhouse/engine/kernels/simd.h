// SIMD helpers the kernel families share, and the instruction-set macros they test.
//
// The library is built on the machine that runs it (-march=native, see build.py), so the same
// source becomes AVX2 or AVX-512 code; the explicit intrinsics are AVX2/FMA/F16C, with
// AVX-512 VNNI's 64-byte int8 dot products for the quantized linears' integer sums and
// AVX-512's wider attention blocks where the CPU has them (the same bits either way), and a
// plain loop for CPUs without any.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

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

#define INHOUSE_UNROLL _Pragma("GCC unroll 8")

namespace inhouse {

#ifdef INHOUSE_AVX2
// Asks for `bytes` from p that a loop reads soon: the next tile pair's weights while this
// one computes, a paged cache's rows ahead of the attention (timing only; no result changes).
inline void prefetch(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(c + at, _MM_HINT_T0);
}

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

// x rounded to bfloat16 as c10::BFloat16 rounds it (nearest even; NaN: the quiet NaN),
// still a float: the value a bf16 tensor op stores.
inline __m256 round_bf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i up = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
  const __m256 rounded = _mm256_castsi256_ps(_mm256_and_si256(up, _mm256_set1_epi32(~0xffff)));
  const __m256 quiet_nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
  return _mm256_blendv_ps(rounded, quiet_nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// Stores 8 floats: float32 as they are, float16 rounded to nearest, bfloat16 already
// rounded by round_bf16 (its upper halves).
inline void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }
inline void store8(c10::Half* p, __m256 x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}
inline void store8(c10::BFloat16* p, __m256 rounded) {
  const __m256i high = _mm256_srli_epi32(_mm256_castps_si256(rounded), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(high), _mm256_extracti128_si256(high, 1)));
}

inline __m256 fma8(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
#ifdef INHOUSE_AVX512
inline __m512 fma16(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
#endif
#endif

}  // namespace inhouse
