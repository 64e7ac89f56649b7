// engramd's request threads (see request_pool.h).
#include "daemon/server/request_pool.h"

#include <algorithm>

#include "base/clock.h"

namespace engram {

uint32_t DefaultRequestThreads(uint32_t cpus) { return std::clamp<uint32_t>(cpus / 2, 2, 32); }

RequestPool::RequestPool(uint32_t threads, uint64_t spin_ns) : spin_ns_(spin_ns) {
  for (uint32_t i = 0; i < (threads == 0 ? 1 : threads); ++i) {
    threads_.emplace_back([this, i] { Loop(i); });
  }
}

RequestPool::~RequestPool() {
  hold_until_.store(0, std::memory_order_relaxed);  // held threads stop spinning
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void RequestPool::Post(uint64_t owner, Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::deque<Task>& queue = by_owner_[owner];
    if (queue.empty()) turns_.push_back(owner);
    queue.push_back(std::move(task));
    queued_.fetch_add(1, std::memory_order_release);
  }
  // A thread that is about to sleep re-checks the queue under the lock, so only threads
  // already asleep need the notification.
  if (sleeping_.load(std::memory_order_acquire) != 0) cv_.notify_one();
}

void RequestPool::Prewake(uint32_t threads, uint64_t until_ns) {
  spin_until_.store(until_ns, std::memory_order_relaxed);
  if (threads == 0 || sleeping_.load(std::memory_order_acquire) == 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    prewake_tokens_ = threads;
  }
  cv_.notify_all();
}

void RequestPool::Hold(uint32_t threads, uint64_t until_ns) {
  const uint64_t now = NowNs();
  const bool starting = hold_until_.load(std::memory_order_relaxed) <= now ||
                        hold_threads_.load(std::memory_order_relaxed) != threads;
  hold_threads_.store(threads, std::memory_order_relaxed);
  hold_until_.store(until_ns, std::memory_order_relaxed);
  if (!starting || threads == 0 || sleeping_.load(std::memory_order_acquire) == 0) return;
  // Taking the lock orders the stores above before a sleeping thread's check of Held.
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

// Spin spin_ns_, to the end of a prewake window (which the poller ends early when the burst it
// was opened for has come), or while the thread is held.
// The time is counted as it passes (every kSpinCountNs), so that a thread held for long shows.
void RequestPool::Spin(uint32_t index) {
  constexpr uint64_t kSpinCountNs = 1'000'000;
  const uint64_t start = NowNs();
  const uint64_t until = start + spin_ns_;
  uint64_t counted = start;
  uint64_t now = start;
  while (queued_.load(std::memory_order_acquire) == 0 &&
         (now < until || now < spin_until_.load(std::memory_order_relaxed) || Held(index, now))) {
    CpuRelax();
    now = NowNs();
    if (now - counted >= kSpinCountNs) {
      spin_total_ns_.fetch_add(now - counted, std::memory_order_relaxed);
      counted = now;
    }
  }
  if (now > counted) spin_total_ns_.fetch_add(now - counted, std::memory_order_relaxed);
}

void RequestPool::Loop(uint32_t index) {
  while (true) {
    Spin(index);
    Task task;
    uint64_t owner = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      sleeping_.fetch_add(1, std::memory_order_acq_rel);
      cv_.wait(lock, [this, index] {
        return !turns_.empty() || stop_ || prewake_tokens_ > 0 || Held(index, NowNs());
      });
      sleeping_.fetch_sub(1, std::memory_order_acq_rel);
      if (turns_.empty()) {
        if (stop_) return;  // stopping, nothing left
        // Woken ahead of expected work (spin until the window ends) or held.
        if (prewake_tokens_ > 0) --prewake_tokens_;
        continue;
      }
      // The first owner in turn that has no task running, so that one owner's slow tasks
      // never hold every thread while another owner waits; if all have one running, the first.
      size_t pick = 0;
      while (pick < turns_.size() && running_.count(turns_[pick]) != 0) ++pick;
      if (pick == turns_.size()) pick = 0;
      owner = turns_[pick];
      turns_.erase(turns_.begin() + static_cast<std::ptrdiff_t>(pick));
      ++running_[owner];
      auto it = by_owner_.find(owner);
      task = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) {
        by_owner_.erase(it);
      } else {
        turns_.push_back(owner);  // its next task after every other owner's
      }
      queued_.fetch_sub(1, std::memory_order_release);
    }
    std::move(task)();
    std::lock_guard<std::mutex> lock(mu_);
    if (--running_[owner] == 0) running_.erase(owner);
  }
}

}  // namespace engram
