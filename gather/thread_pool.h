// The gather engine's threads: a pool whose threads each own a ReaderContext and run posted tasks
// in order of arrival, and ParallelFor, which shares the chunks of one batch between its calling
// thread and as many pool threads as the batch's work pays for.
//
// Idle threads spin for `spin_ns` before they park on a condition variable: a batch that arrives
// within the spell costs no wake-up (a futex wake costs ~5-10 µs on bare metal, ~57 µs in a VM).
// Only parked threads are notified, one per task posted.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "gather/gather_reader.h"

namespace engram {

using Task = absl::AnyInvocable<void(ReaderContext&)>;

class ThreadPool {
 public:
  using MakeContext = std::function<std::unique_ptr<ReaderContext>()>;
  // `spin_ns`: how long an idle thread polls for work before it parks.
  ThreadPool(uint32_t threads, uint64_t spin_ns, const MakeContext& make);
  // Runs every task already posted, then joins.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Post(Task task);
  // Whether tasks wait for a thread (another batch would like help).
  bool HasQueued() const { return queued_.load(std::memory_order_acquire) != 0; }
  size_t size() const { return threads_.size(); }
  // Parked threads, a hint (the spinning ones cost no wake-up).
  uint32_t parked() const { return parked_.load(std::memory_order_relaxed); }

 private:
  void Loop(ReaderContext& ctx);

  const uint64_t spin_ns_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  std::atomic<uint32_t> queued_{0};
  std::atomic<uint32_t> parked_{0};
  std::vector<std::thread> threads_;
};

// Runs fn(i) for every i in [0, n) on the calling thread (with `caller`) and up to `helpers`
// threads of `pool`; each index is claimed once, and the call returns when all have run. The
// caller wakes two helpers and each helper that starts wakes two more while indexes remain (a
// tree: the threads double every wake-up latency), so the caller pays for two wake-ups and a
// batch done early never wakes the rest. A helper
// that finishes an index while other batches' tasks wait for a thread re-queues itself behind them
// instead of claiming the next index, so concurrent batches share the pool chunk by chunk; the
// caller keeps claiming until none is left, so a batch never waits for a thread to start. While
// `step_aside` (if given; called from any thread, also after ParallelFor returned) answers true,
// helpers leave after their current index and the caller posts no new ones; once it answers
// false, the caller brings the helpers back.
void ParallelFor(ThreadPool* pool, size_t n, size_t helpers, ReaderContext& caller,
                 const std::function<void(size_t, ReaderContext&)>& fn,
                 const std::function<bool()>& step_aside = {});

}  // namespace engram
