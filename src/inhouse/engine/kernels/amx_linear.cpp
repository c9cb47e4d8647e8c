// The q8/q4 linears' many-row pass on AMX int8 tiles (Sapphire Rapids and later).
//
// The VNNI loops of quant_linear.cpp find each (row, output, group)'s exact int32 dot product
// of 32 activation codes with 32 weight codes, then fold it into the row's float sum in a
// fixed order: acc = fma(float(dot), d_w * d_x, acc), and for q4 acc = fma(m_w, d_x * sum_x,
// acc), group after group, then + bias. A tile product (tdpbssd for q8's signed codes,
// tdpbsud for q4's unsigned ones) gives the same exact dot products for 16 rows by 16
// outputs at once, one group (K = 32) a product, and the float steps here are those same
// steps in the same order, so every output has the VNNI path's bits: batch and chunking
// invariance hold whichever path a pass takes.
//
// Per block of 16 outputs (two weight tiles) its codes are repacked once into the tiles' B
// layout (row j of a group: the 4 codes k = 4j..4j+3 of each output, q4's nibbles widened to
// bytes) in a buffer of the chunk's (groups * 512 bytes), so no packed copy of the weights is
// kept; then all rows pass in tiles of 16, two groups' products in flight while the vector
// units fold the previous ones. Blocks are split over the work pool's threads.
//
// Linux hands a process the tiles' 8 KiB of state only when asked (arch_prctl
// ARCH_REQ_XCOMP_PERM); without that grant, or built for a CPU without AMX, enabled() is
// false and the VNNI loops run every pass. `use_amx(False)` turns the tiles off, so tests
// can hold the two paths' outputs against each other in one process.

#include "amx_linear.h"

#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "quant_layout.h"
#include "work_pool.h"

#ifdef __AMX_TILE__
#include <immintrin.h>
#endif

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define INHOUSE_AMX 1
#endif

namespace inhouse::amx {
namespace {

// Unrolled before GCC places arrays: 16 sums indexed by a loop variable stay on the stack.
#define INHOUSE_ROWS_UNROLLED _Pragma("GCC unroll 16")

std::atomic<bool> wanted{true};

#ifdef INHOUSE_AMX
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;
constexpr int kRows = 16;                             // activation rows a tile product takes
constexpr int64_t kColumns = 2 * kTile;               // outputs a tile product gives a row
constexpr int64_t kPackedGroupBytes = kGroup * kColumns;  // one group's B tile: 8 rows of 64
constexpr int64_t kPrefetchGroups = 4;  // groups ahead: 2 a line (32 codes), so 2 lines ahead

// Tiles 0-1 are products C (16 rows of 16 int32), 2-3 activations A (16 rows of one group's
// 32 codes), 4-5 weights B (8 rows of 16 outputs' 4 codes).
void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 2; ++t) {
    config.rows[t] = kRows;
    config.bytes_per_row[t] = kColumns * sizeof(int32_t);
    config.rows[2 + t] = kRows;
    config.bytes_per_row[2 + t] = kGroup;
    config.rows[4 + t] = kGroup / 4;
    config.bytes_per_row[4 + t] = kColumns * 4;
  }
  load_tiles(config);
}

// 8 floats of tile t and 8 of tile t + 1 (a group's scales or mins) in one register.
inline __m512 two_tiles(const float* a, const float* b) {
  return _mm512_castpd_ps(_mm512_insertf64x4(
      _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(a))),
      _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}

// One block of 16 outputs (tiles t and t + 1) in the tiles' layouts: codes [groups, 8, 64]
// and scales (mins) [groups, 16]. Plain pointers into a chunk's own buffers: the loops
// below keep their 16 sums in registers only while they call nothing (a thread_local
// here cost a __tls_get_addr call a group, and every sum a spill).
struct PackedBlock {
  int8_t* codes;
  float* d;
  float* m;
};

template <bool kQ4>
void pack_block(const LinearArgs& w, int64_t t, const PackedBlock& out) {
  const int64_t groups = w.groups;
  const int64_t group_bytes = kQ4 ? kQ4TileGroupBytes : kQ8TileGroupBytes;
  const uint8_t* w0 = w.wq + t * groups * group_bytes;
  const uint8_t* w1 = w0 + groups * group_bytes;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* g0 = w0 + g * group_bytes;
    const uint8_t* g1 = w1 + g * group_bytes;
    int8_t* b = out.codes + g * kPackedGroupBytes;
    if constexpr (kQ4) {  // pair p's low nibbles are quad 2p, its high ones quad 2p + 1
      const __m512i low4 = _mm512_set1_epi8(0x0F);
      for (int p = 0; p < 4; ++p) {
        const __m512i raw = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g0 + 32 * p))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g1 + 32 * p)), 1);
        _mm512_storeu_si512(b + 128 * p, _mm512_and_si512(raw, low4));
        _mm512_storeu_si512(b + 128 * p + 64, _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4));
      }
    } else {  // quad j of both tiles side by side
      for (int j = 0; j < 8; ++j) {
        std::memcpy(b + 64 * j, g0 + 32 * j, 32);
        std::memcpy(b + 64 * j + 32, g1 + 32 * j, 32);
      }
    }
    const int64_t s0 = (t * groups + g) * kTile, s1 = s0 + groups * kTile;
    _mm512_storeu_ps(out.d + g * kColumns, two_tiles(w.wd + s0, w.wd + s1));
    if constexpr (kQ4) _mm512_storeu_ps(out.m + g * kColumns, two_tiles(w.wm + s0, w.wm + s1));
  }
}

// A tile of 16 activation rows: codes at x (row stride `stride` bytes), scales at xd and
// q4's d * sum at xs (row stride `groups`).
struct RowTile {
  const int8_t* x;
  int64_t stride;
  const float* xd;
  const float* xs;
};

// Folds one group's 16 x 16 products into the rows' sums: quant_linear.cpp's float steps.
template <bool kQ4>
inline void fold(const int32_t* products, const PackedBlock& b, const RowTile& a, int64_t g,
                 int64_t groups, __m512* acc) {
  const __m512 d = _mm512_loadu_ps(b.d + g * kColumns);
  INHOUSE_ROWS_UNROLLED for (int r = 0; r < kRows; ++r) {
    const __m512 dots = _mm512_cvtepi32_ps(_mm512_load_si512(products + r * kColumns));
    const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(a.xd[r * groups + g]));
    acc[r] = _mm512_fmadd_ps(dots, scale, acc[r]);
    if constexpr (kQ4) {
      acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(b.m + g * kColumns),
                               _mm512_set1_ps(a.xs[r * groups + g]), acc[r]);
    }
  }
}

// A row tile's codes of group `g`, asked into L1 ahead of their tile load: at K = 1536 a
// row tile's codes (24 KiB) and the block's packed weights (24 KiB) fill L1 together, and
// the 16 rows' streams are more than the hardware prefetcher follows.
inline void prefetch_rows(const RowTile& a, int64_t g) {
  const int8_t* at = a.x + g * kGroup;
  for (int r = 0; r < kRows; ++r) _mm_prefetch(reinterpret_cast<const char*>(at + r * a.stride), _MM_HINT_T0);
}

template <bool kQ4>
inline void product(int c, const RowTile& a, const PackedBlock& b, int64_t g) {
  // Tile numbers are immediates: c picks the set (C0, A2, B4) or (C1, A3, B5).
  const int8_t* codes = b.codes + g * kPackedGroupBytes;
  if (c == 0) {
    _tile_loadd(2, a.x + g * kGroup, a.stride);
    _tile_loadd(4, codes, kColumns * 4);
    _tile_zero(0);
    if constexpr (kQ4) _tile_dpbsud(0, 2, 4); else _tile_dpbssd(0, 2, 4);
  } else {
    _tile_loadd(3, a.x + g * kGroup, a.stride);
    _tile_loadd(5, codes, kColumns * 4);
    _tile_zero(1);
    if constexpr (kQ4) _tile_dpbsud(1, 3, 5); else _tile_dpbssd(1, 3, 5);
  }
}

// The block's 16 outputs for `rows` (<= 16) rows of the tile, into out (row stride n_out).
template <bool kQ4>
void row_tile(const RowTile& a, const PackedBlock& b, int64_t groups, const float* bias,
              int rows, float* out, int64_t n_out) {
  alignas(64) int32_t products[2][kRows * kColumns];
  __m512 acc[kRows];
  INHOUSE_ROWS_UNROLLED for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
  product<kQ4>(0, a, b, 0);
  for (int64_t g = 0; g < groups; g += 2) {  // group g in tile 0, g + 1 in tile 1
    if (g + 1 < groups) product<kQ4>(1, a, b, g + 1);
    if (g + kPrefetchGroups < groups) prefetch_rows(a, g + kPrefetchGroups);
    _tile_stored(0, products[0], kColumns * sizeof(int32_t));
    fold<kQ4>(products[0], b, a, g, groups, acc);
    if (g + 1 == groups) break;
    if (g + 2 < groups) product<kQ4>(0, a, b, g + 2);
    _tile_stored(1, products[1], kColumns * sizeof(int32_t));
    fold<kQ4>(products[1], b, a, g + 1, groups, acc);
  }
  const __m512 add = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  INHOUSE_ROWS_UNROLLED for (int r = 0; r < kRows; ++r) {
    if (r < rows) _mm512_storeu_ps(out + r * n_out, _mm512_add_ps(acc[r], add));
  }
}

template <bool kQ4>
void linear_on_tiles(const LinearArgs& w) {
  const int64_t groups = w.groups, k = groups * kGroup, n_out = w.tiles * kTile;
  const int64_t full = w.rows / kRows * kRows, rest = w.rows - full;
  // The last rows, fewer than 16, padded with zero rows (their outputs are not stored).
  std::vector<int8_t> tail_x(rest ? kRows * k : 0, 0);
  std::vector<float> tail_d(rest ? kRows * groups : 0, 0.f), tail_s(tail_d.size(), 0.f);
  if (rest) {
    std::memcpy(tail_x.data(), w.xq + full * k, rest * k);
    std::memcpy(tail_d.data(), w.xd + full * groups, rest * groups * sizeof(float));
    if (kQ4) std::memcpy(tail_s.data(), w.xs + full * groups, rest * groups * sizeof(float));
  }
  inhouse::parallel_for(0, w.tiles / 2, 1, [&](int64_t begin, int64_t end) {
    std::vector<int8_t> codes(groups * kPackedGroupBytes);
    std::vector<float> scales(2 * groups * kColumns);
    const PackedBlock packed{codes.data(), scales.data(), scales.data() + groups * kColumns};
    configure_tiles();
    for (int64_t block = begin; block < end; ++block) {
      const int64_t t = 2 * block;
      pack_block<kQ4>(w, t, packed);
      const float* bias = w.bias ? w.bias + t * kTile : nullptr;
      for (int64_t r = 0; r < full; r += kRows) {
        const RowTile a{w.xq + r * k, k, w.xd + r * groups, kQ4 ? w.xs + r * groups : nullptr};
        row_tile<kQ4>(a, packed, groups, bias, kRows, w.out + r * n_out + t * kTile, n_out);
      }
      if (rest) {
        const RowTile a{tail_x.data(), k, tail_d.data(), tail_s.data()};
        row_tile<kQ4>(a, packed, groups, bias, static_cast<int>(rest),
                      w.out + full * n_out + t * kTile, n_out);
      }
    }
    _tile_release();
  });
}
#endif

bool use_amx(bool enable) {
  wanted.store(enable);
  return enabled();
}

}  // namespace

#ifdef __AMX_TILE__
void load_tiles(const TileConfig& config) {
  // GCC 12 does not see ldtilecfg read the 64 bytes: without this it may drop their stores.
  __asm__ volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}
#endif

bool granted() {
#ifdef INHOUSE_AMX
  static const bool ok = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return ok;
#else
  return false;
#endif
}

bool enabled() {
#ifdef INHOUSE_AMX
  return wanted.load(std::memory_order_relaxed) && granted();
#else
  return false;
#endif
}

void linear(const LinearArgs& args) {
#ifdef INHOUSE_AMX
  if (args.wm) {
    linear_on_tiles<true>(args);
  } else {
    linear_on_tiles<false>(args);
  }
#else
  (void)args;
#endif
}

}  // namespace inhouse::amx

TORCH_LIBRARY_FRAGMENT(inhouse_cpu, m) {
  m.def("use_amx(bool enable) -> bool", &inhouse::amx::use_amx);
}
