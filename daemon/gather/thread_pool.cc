// The gather engine's thread pool and ParallelFor (see thread_pool.h).
#include "daemon/gather/thread_pool.h"

#include "protocol/clock.h"

namespace engram {

ThreadPool::ThreadPool(uint32_t threads, uint64_t spin_ns, const MakeContext& make)
    : spin_ns_(spin_ns) {
  for (uint32_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this, ctx = make()]() mutable { Loop(*ctx); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::Post(Task task) {
  {
    std::lock_guard<std::mutex> l(mu_);
    tasks_.push_back(std::move(task));
    queued_.fetch_add(1, std::memory_order_release);
  }
  // A thread about to park re-checks the queue under the lock, so only parked threads need a
  // notification, one per task.
  if (parked_.load(std::memory_order_acquire) != 0) cv_.notify_one();
}

void ThreadPool::Loop(ReaderContext& ctx) {
  while (true) {
    if (spin_ns_ > 0) {
      const uint64_t until = NowNs() + spin_ns_;
      while (queued_.load(std::memory_order_acquire) == 0 && NowNs() < until) CpuRelax();
    }
    Task task;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (tasks_.empty() && !stop_) {
        parked_.fetch_add(1, std::memory_order_acq_rel);
        cv_.wait(l, [&] { return stop_ || !tasks_.empty(); });
        parked_.fetch_sub(1, std::memory_order_acq_rel);
      }
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
      queued_.fetch_sub(1, std::memory_order_release);
    }
    if (task) std::move(task)(ctx);
  }
}

namespace {

struct ParallelJob {
  const std::function<void(size_t, ReaderContext&)>* fn = nullptr;
  size_t n = 0;
  ThreadPool* pool = nullptr;
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  std::mutex mu;
  std::condition_variable cv;
};

// Runs one claimed index; the last one to finish wakes the caller.
bool RunOne(ParallelJob& j, ReaderContext& ctx) {
  const size_t i = j.next.fetch_add(1, std::memory_order_relaxed);
  if (i >= j.n) return false;
  (*j.fn)(i, ctx);
  if (j.done.fetch_add(1, std::memory_order_acq_rel) + 1 == j.n) {
    std::lock_guard<std::mutex> l(j.mu);
    j.cv.notify_all();
  }
  return true;
}

// A helper's turn: claims indexes until none is left, or until other batches' tasks wait for a
// thread; then it goes to the back of the queue. It holds the job only while it works on it: once
// the caller returned (every index done), the job is gone and a late helper does nothing.
void Help(const std::weak_ptr<ParallelJob>& weak, ReaderContext& ctx) {
  std::shared_ptr<ParallelJob> j = weak.lock();
  if (j == nullptr) return;
  while (RunOne(*j, ctx)) {
    if (j->pool->HasQueued() && j->next.load(std::memory_order_relaxed) < j->n) {
      j->pool->Post([weak](ReaderContext& c) { Help(weak, c); });
      return;
    }
  }
}

}  // namespace

void ParallelFor(ThreadPool* pool, size_t n, size_t helpers, ReaderContext& caller,
                 const std::function<void(size_t, ReaderContext&)>& fn) {
  if (pool == nullptr || helpers == 0 || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i, caller);
    return;
  }
  auto job = std::make_shared<ParallelJob>();
  job->fn = &fn;
  job->n = n;
  job->pool = pool;
  for (size_t i = 0; i < std::min(helpers, n - 1); ++i) {
    pool->Post([weak = std::weak_ptr<ParallelJob>(job)](ReaderContext& ctx) { Help(weak, ctx); });
  }
  while (RunOne(*job, caller)) {
  }
  {
    std::unique_lock<std::mutex> l(job->mu);
    job->cv.wait(l, [&] { return job->done.load(std::memory_order_acquire) == job->n; });
  }
}

}  // namespace engram
