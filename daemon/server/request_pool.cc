// engramd's request threads (see request_pool.h).
#include "daemon/server/request_pool.h"

#include <algorithm>

#include "protocol/clock.h"

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

void RequestPool::Post(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    queued_.fetch_add(1, std::memory_order_release);
  }
  // A thread that is about to sleep re-checks the queue under the lock, so only threads
  // already asleep need the notification.
  if (sleeping_.load(std::memory_order_acquire) != 0) cv_.notify_one();
}

void RequestPool::Loop() {
  while (true) {
    const uint64_t until = NowNs() + spin_ns_;
    while (queued_.load(std::memory_order_acquire) == 0 && NowNs() < until) CpuRelax();
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      sleeping_.fetch_add(1, std::memory_order_acq_rel);
      cv_.wait(lock, [this] { return !queue_.empty() || stop_; });
      sleeping_.fetch_sub(1, std::memory_order_acq_rel);
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_release);
    }
    std::move(task)();
  }
}

}  // namespace engram
