// Stress of the kernels' work pool (work_pool.h): many short jobs on more threads than
// cores, each helper pausing at random where it could lose its core. Every job must run
// each of its indices exactly once, all of them before run() returns. Prints "ok" or the
// first job that broke that, and exits 1 then. Usage: work_pool_stress JOBS THREADS
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>

namespace {
thread_local std::mt19937 window_rng(std::random_device{}());

// One window in 64 a pause of up to ~4,000 spins: rare and long enough that a job can end
// and the next one begin while a helper sits in it.
void window() {
  if (window_rng() % 64 != 0) return;
  for (int spin = static_cast<int>(window_rng() % 4000); spin > 0; --spin) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
}
}  // namespace

#define INHOUSE_POOL_WINDOW() window()
#include "work_pool.h"

int main(int argc, char** argv) {
  const long jobs = argc > 1 ? std::atol(argv[1]) : 100000;
  inhouse::WorkPool::caller_threads() = argc > 2 ? std::atoi(argv[2]) : 3;
  std::mt19937 rng(1);
  for (long job = 0; job < jobs; ++job) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 64);
    const int work = static_cast<int>(rng() % 50);
    auto runs = std::make_unique<std::atomic<int>[]>(n);
    inhouse::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        runs[i].fetch_add(1);
        for (int spin = work; spin > 0; --spin) std::atomic_signal_fence(std::memory_order_seq_cst);
      }
    });
    for (int64_t i = 0; i < n; ++i) {
      const int count = runs[i].load();
      if (count != 1) {
        std::printf("job %ld: index %ld of %ld ran %d times by the time run() returned\n", job,
                    static_cast<long>(i), static_cast<long>(n), count);
        std::fflush(stdout);
        std::_Exit(1);  // a helper may still be running this job's body
      }
    }
  }
  std::printf("ok: %ld jobs\n", jobs);
  return 0;
}
