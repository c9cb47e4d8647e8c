// The host's own limits, measured rather than taken from a data sheet (host_peaks.py builds
// and runs this): float32 FMA rate, the AVX2 int8 multiply-add rate (vpmaddubsw + vpmaddwd,
// as the q4/q8 linears use without VNNI) and the rate of reading memory, each on the
// OpenMP threads given by OMP_NUM_THREADS. Prints one JSON object.
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Independent accumulator chains, enough to cover the instruction latency on every thread.
double fma_gflops(int64_t rounds) {
  const auto start = std::chrono::steady_clock::now();
  float sink = 0.f;
#pragma omp parallel reduction(+ : sink)
  {
    const __m256 x = _mm256_set1_ps(1.0001f), y = _mm256_set1_ps(0.9999f);
    __m256 acc[12];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t n = 0; n < rounds; ++n) {
#pragma GCC unroll 12
      for (auto& a : acc) a = _mm256_fmadd_ps(x, y, a);
    }
    for (auto& a : acc) sink += _mm256_cvtss_f32(a);
  }
  const double flops = 2.0 * 8 * 12 * rounds * omp_get_max_threads();
  return sink == -1.f ? 0.0 : flops / seconds_since(start) / 1e9;
}

double int8_gops(int64_t rounds) {
  const auto start = std::chrono::steady_clock::now();
  int32_t sink = 0;
#pragma omp parallel reduction(+ : sink)
  {
    __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[8];
    for (auto& c : acc) c = _mm256_setzero_si256();
    for (int64_t n = 0; n < rounds; ++n) {
#pragma GCC unroll 8
      for (auto& c : acc) c = _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
      __asm__ volatile("" : "+x"(a), "+x"(b));  // not hoisted out of the loop
    }
    for (auto& c : acc) sink += _mm256_extract_epi32(c, 0);
  }
  const double ops = 2.0 * 32 * 8 * rounds * omp_get_max_threads();
  return sink == -1 ? 0.0 : ops / seconds_since(start) / 1e9;
}

// Each thread sums its share of a buffer far larger than the caches, best of `repeats`.
double read_gbs(int64_t bytes, int repeats) {
  std::vector<float> buffer(bytes / sizeof(float), 1.f);
  const int64_t count = static_cast<int64_t>(buffer.size());
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    float total = 0.f;
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (int64_t block = 0; block < count / 64; ++block) {
      const float* p = buffer.data() + block * 64;
      __m256 s = _mm256_loadu_ps(p);
      for (int i = 8; i < 64; i += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(p + i));
      total += _mm256_cvtss_f32(s);
    }
    const double rate = bytes / seconds_since(start) / 1e9;
    if (total != -1.f && rate > best) best = rate;
  }
  return best;
}

}  // namespace

int main() {
  const double fma = fma_gflops(100'000'000), int8 = int8_gops(100'000'000);
  const double read = read_gbs(int64_t{1} << 30, 5);
  std::printf("{\"threads\": %d, \"fp32_fma_gflops\": %.1f, \"int8_madd_gops\": %.1f, \"read_gbs\": %.2f}\n",
              omp_get_max_threads(), fma, int8, read);
}
