// Loops split into chunks that threads claim one at a time, for the decode-step kernels.
//
// OpenMP (at::parallel_for) gives each thread a fixed share and waits for every share. On a
// machine with few cores, the server's event loop, the HTTP client or any other process
// takes a core now and then; the thread that loses it holds its share until the OS gives
// the core back (milliseconds), and the whole step waits. Here the calling thread works
// through the chunks itself from the start and waits only for chunks another thread has
// already claimed: a helper that is not running costs nothing, and one preempted in the
// middle of a chunk costs at most that chunk. Each output element is still computed by
// exactly one thread in one order, so results do not depend on who ran what.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define INHOUSE_PAUSE() _mm_pause()
#else
#define INHOUSE_PAUSE() std::this_thread::yield()
#endif

// Where a helper may lose its core between two of its steps; empty in a build. The stress
// test (tests/engine/test_work_pool.py) defines it as a random pause, to widen those windows.
#ifndef INHOUSE_POOL_WINDOW
#define INHOUSE_POOL_WINDOW()
#endif

namespace inhouse {

class WorkPool {
 public:
  using Body = std::function<void(int64_t, int64_t)>;

  // The process's pool; its threads live as long as the process.
  static WorkPool& instance() {
    static WorkPool* pool = new WorkPool();
    return *pool;
  }

  // Threads the calling thread's loops use, itself included; 0 (the default): its
  // at::get_num_threads(). A q8/q4 step sets it and runs torch's own ops on one thread, so
  // no OpenMP team spins on the cores the pool's helpers need (see threads.py).
  static int& caller_threads() {
    thread_local int threads = 0;
    return threads;
  }

  // body(begin, end) over [0, n) in chunks of at least `grain`, with up to the caller's
  // threads - 1 helpers. A second caller while a loop runs works alone.
  void run(int64_t n, int64_t grain, const Body& body) {
    const int threads = caller_threads();
    const int helpers = (threads > 0 ? threads : at::get_num_threads()) - 1;
    if (n <= 0) return;
    std::unique_lock<std::mutex> owner(run_mutex_, std::try_to_lock);
    if (n <= grain || helpers < 1 || !owner.owns_lock()) {
      body(0, n);
      return;
    }
    start_helpers(helpers);
    const int64_t per_chunk = std::max<int64_t>(grain, (n + kChunksEach * (helpers + 1) - 1) / (kChunksEach * (helpers + 1)));
    // The new generation first, still closed to claims: a helper that read the last job's
    // state just before it ended cannot then claim a chunk of it with this job's fields.
    generation_ = generation_ % kMaxGeneration + 1;
    state_.store(generation_ << kIndexBits | kPublishing, std::memory_order_seq_cst);
    size_.store(n, std::memory_order_release);
    chunk_.store(per_chunk, std::memory_order_release);
    body_.store(&body, std::memory_order_relaxed);
    wanted_.store(helpers, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    state_.store(generation_ << kIndexBits, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      wake_.notify_all();
    }
    claim_chunks(generation_);
    // Only chunks a helper claimed are left; if that helper lost its core, give ours up.
    for (int spin = 0; done_.load(std::memory_order_acquire) < n; ++spin) {
      if (spin < kSpins) {
        INHOUSE_PAUSE();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  static constexpr int kIndexBits = 40;
  static constexpr uint64_t kIndexMask = (uint64_t{1} << kIndexBits) - 1;
  static constexpr uint64_t kMaxGeneration = (uint64_t{1} << (64 - kIndexBits)) - 1;
  // The index of a job whose caller is still writing its fields: nothing to claim yet.
  static constexpr uint64_t kPublishing = kIndexMask;
  static constexpr int kSpins = 20000;  // ~0.1 ms of polling before a helper sleeps
  static constexpr int64_t kChunksEach = 3;  // chunks a thread, for balance: few, long streams

  WorkPool() = default;

  static uint64_t generation_of(uint64_t state) { return state >> kIndexBits; }

  void start_helpers(int count) {
    while (static_cast<int>(helpers_.size()) < count) {
      const int index = static_cast<int>(helpers_.size());
      helpers_.emplace_back([this, index] { help(index); });
      helpers_.back().detach();
    }
  }

  // Claim and run chunks of job `generation` until none is left (or a newer job started).
  void claim_chunks(uint64_t generation) {
    for (;;) {
      uint64_t state = state_.load(std::memory_order_acquire);
      if (generation_of(state) != generation) return;
      if ((state & kIndexMask) == kPublishing) {
        INHOUSE_PAUSE();
        continue;
      }
      const int64_t begin = static_cast<int64_t>(state & kIndexMask);
      INHOUSE_POOL_WINDOW();
      // A size or chunk of a newer job (read after its caller closed this one: acquire
      // pairs with that store) makes the claim below fail, as the state has moved on.
      const int64_t n = size_.load(std::memory_order_acquire);
      const int64_t chunk = chunk_.load(std::memory_order_acquire);
      INHOUSE_POOL_WINDOW();
      if (begin >= n) return;
      if (!state_.compare_exchange_weak(state, state + static_cast<uint64_t>(chunk),
                                        std::memory_order_acq_rel)) {
        continue;
      }
      // The job cannot finish (nor its fields change) before this chunk is counted done.
      INHOUSE_POOL_WINDOW();
      const int64_t end = std::min(begin + chunk, n);
      (*body_.load(std::memory_order_relaxed))(begin, end);
      done_.fetch_add(end - begin, std::memory_order_release);
    }
  }

  void help(int index) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t generation = generation_of(state_.load(std::memory_order_acquire));
      for (int spin = 0; generation == seen && spin < kSpins; ++spin) {
        INHOUSE_PAUSE();
        generation = generation_of(state_.load(std::memory_order_acquire));
      }
      if (generation == seen) {
        std::unique_lock<std::mutex> lock(sleep_mutex_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(lock, [&] {
          return generation_of(state_.load(std::memory_order_seq_cst)) != seen;
        });
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        continue;
      }
      INHOUSE_POOL_WINDOW();
      seen = generation;
      if (index < wanted_.load(std::memory_order_relaxed)) claim_chunks(generation);
    }
  }

  std::mutex run_mutex_;
  uint64_t generation_ = 0;  // the caller's latest job (written under run_mutex_)
  std::atomic<uint64_t> state_{0};  // generation << kIndexBits | next unclaimed index
  std::atomic<int64_t> size_{0}, chunk_{1}, done_{0};
  std::atomic<int> wanted_{0};
  std::atomic<const Body*> body_{nullptr};
  std::vector<std::thread> helpers_;
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
};

// at::parallel_for's signature over the pool.
// Which of `count` items, listed cheap to dear (a prompt's later tiles read more keys),
// goes j-th so that the ends alternate: a static split over threads gets even shares.
inline int64_t dear_and_cheap(int64_t j, int64_t count) {
  return j % 2 == 0 ? j / 2 : count - 1 - j / 2;
}

template <class F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  WorkPool::instance().run(end - begin, grain,
                           [&](int64_t b, int64_t e) { f(begin + b, begin + e); });
}

}  // namespace inhouse
