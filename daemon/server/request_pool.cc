// engramd's request threads (see request_pool.h).
#include "daemon/server/request_pool.h"

#include <algorithm>

#include "base/clock.h"

namespace engram {

uint32_t DefaultRequestThreads(uint32_t cpus) { return std::clamp<uint32_t>(cpus / 2, 2, 32); }

RequestPool::RequestPool(uint32_t threads, uint64_t spin_ns) : spin_ns_(spin_ns) {
  for (uint32_t i = 0; i < (threads == 0 ? 1 : threads); ++i) {
    threads_.emplace_back([this] { Loop(); });
  }
}

RequestPool::~RequestPool() {
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

void RequestPool::Loop() {
  while (true) {
    // Spin spin_ns_, or to the end of a prewake window (which the poller ends early when the
    // burst it was opened for has come).
    const uint64_t until = NowNs() + spin_ns_;
    for (uint64_t now = NowNs(); queued_.load(std::memory_order_acquire) == 0 &&
                                 (now < until || now < spin_until_.load(std::memory_order_relaxed));
         now = NowNs()) {
      CpuRelax();
    }
    Task task;
    uint64_t owner = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      sleeping_.fetch_add(1, std::memory_order_acq_rel);
      cv_.wait(lock, [this] { return !turns_.empty() || stop_ || prewake_tokens_ > 0; });
      sleeping_.fetch_sub(1, std::memory_order_acq_rel);
      if (turns_.empty()) {
        if (stop_) return;  // stopping, nothing left
        --prewake_tokens_;  // woken ahead of expected work: spin until the window ends
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
