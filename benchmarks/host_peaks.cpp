// The host's own limits, measured rather than taken from a data sheet (host_peaks.py builds
// and runs this): float32 FMA rate, the AVX2 int8 multiply-add rate (vpmaddubsw + vpmaddwd,
// as the q4/q8 linears use without VNNI), the AMX tiles' int8 and bf16 rates where the CPU
// has them (null elsewhere) and the rate of reading memory, each on the OpenMP threads given
// by OMP_NUM_THREADS. Prints one JSON object.
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

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

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Tile products back to back into 4 accumulators (tiles 0-3) from A (tile 4: 16 rows of
// `depth` bytes) and B (tile 5: depth / 4 rows of 64 bytes): 16 x 16 outputs an instruction,
// each `depth` int8 multiply-adds (or depth / 2 bf16 ones). The q8/q4 linears take depth 32
// (one group of 32 codes a product); 64 is the tiles' full depth. kind: 0 int8, 1 bf16.
double amx_gops(int64_t rounds, int depth, int kind) {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) return -1.0;
  const auto start = std::chrono::steady_clock::now();
#pragma omp parallel
  {
    alignas(64) int8_t a[16 * 64] = {}, b[16 * 64] = {};
    TileConfig config;
    for (int t = 0; t < 4; ++t) config.rows[t] = 16, config.bytes_per_row[t] = 64;
    config.rows[4] = 16, config.bytes_per_row[4] = depth;
    config.rows[5] = depth / 4, config.bytes_per_row[5] = 64;
    __asm__ volatile("" : : "r"(&config) : "memory");  // GCC 12 drops the stores otherwise
    _tile_loadconfig(&config);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, b, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t n = 0; n < rounds; ++n) {
      if (kind == 0) {
        _tile_dpbssd(0, 4, 5);
        _tile_dpbssd(1, 4, 5);
        _tile_dpbssd(2, 4, 5);
        _tile_dpbssd(3, 4, 5);
      } else {
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 5);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 5);
      }
    }
    _tile_release();
  }
  const double per_product = 2.0 * 16 * 16 * (kind == 0 ? depth : depth / 2);
  return per_product * 4 * rounds * omp_get_max_threads() / seconds_since(start) / 1e9;
}
#else
double amx_gops(int64_t, int, int) { return -1.0; }
#endif

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
  const double amx_int8 = amx_gops(2'000'000, 64, 0), amx_int8_group = amx_gops(2'000'000, 32, 0);
  const double amx_bf16 = amx_gops(2'000'000, 64, 1);
  const double read = read_gbs(int64_t{1} << 30, 5);
  std::printf(
      "{\"threads\": %d, \"fp32_fma_gflops\": %.1f, \"int8_madd_gops\": %.1f, \"amx_int8_gops\": %.1f, "
      "\"amx_int8_group_gops\": %.1f, \"amx_bf16_gflops\": %.1f, \"read_gbs\": %.2f}\n",
      omp_get_max_threads(), fma, int8, amx_int8, amx_int8_group, amx_bf16, read);
}
