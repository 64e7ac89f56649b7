// The gather engine's thread pool and ParallelFor (see thread_pool.h).
#include "gather/thread_pool.h"

#include "base/clock.h"

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
  std::function<bool()> step_aside;  // a copy: a late helper may ask after the caller returned
  size_t wanted = 0;                 // helpers the caller asked for
  std::atomic<size_t> live{0};       // helper tasks posted or running
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  std::mutex mu;
  std::condition_variable cv;
};

bool StepAside(const ParallelJob& j) { return j.step_aside && j.step_aside(); }

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

void Help(const std::weak_ptr<ParallelJob>& weak, ReaderContext& ctx);

void PostHelper(ParallelJob& j, const std::weak_ptr<ParallelJob>& weak) {
  j.pool->Post([weak](ReaderContext& c) { Help(weak, c); });
}

// Wakes up to kWakeFanout more helpers while the job wants more and has indexes left for them.
constexpr size_t kWakeFanout = 2;
void WakeMore(ParallelJob& j, const std::weak_ptr<ParallelJob>& weak) {
  for (size_t k = 0; k < kWakeFanout; ++k) {
    size_t live = j.live.load(std::memory_order_relaxed);
    if (live >= j.wanted || j.next.load(std::memory_order_relaxed) + live + 1 >= j.n ||
        StepAside(j)) {
      return;
    }
    if (!j.live.compare_exchange_strong(live, live + 1, std::memory_order_relaxed)) return;
    PostHelper(j, weak);
  }
}

// A helper's turn: claims indexes until none is left, until the job asks its helpers to step
// aside, or until other batches' tasks wait for a thread (then it goes to the back of the queue).
// It holds the job only while it works on it: once the caller returned (every index done), the
// job is gone and a late helper does nothing.
void Help(const std::weak_ptr<ParallelJob>& weak, ReaderContext& ctx) {
  std::shared_ptr<ParallelJob> j = weak.lock();
  if (j == nullptr) return;
  // Wake-ups spread as a tree: a helper that starts while indexes remain wakes two more, so the
  // caller pays for two wake-ups, not one per helper, the number of threads doubles every
  // wake-up latency, and a batch done before the tree reaches the last helpers never wakes them.
  WakeMore(*j, weak);
  while (!StepAside(*j) && RunOne(*j, ctx)) {
    if (j->pool->HasQueued() && j->next.load(std::memory_order_relaxed) < j->n) {
      PostHelper(*j, weak);  // still counted live
      return;
    }
  }
  j->live.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace

void ParallelFor(ThreadPool* pool, size_t n, size_t helpers, ReaderContext& caller,
                 const std::function<void(size_t, ReaderContext&)>& fn,
                 const std::function<bool()>& step_aside) {
  if (pool == nullptr || helpers == 0 || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i, caller);
    return;
  }
  auto job = std::make_shared<ParallelJob>();
  job->fn = &fn;
  job->n = n;
  job->pool = pool;
  job->step_aside = step_aside;
  job->wanted = std::min(helpers, n - 1);
  const std::weak_ptr<ParallelJob> weak = job;
  // The first helpers; each helper that starts wakes more (WakeMore).
  auto top_up = [&] { WakeMore(*job, weak); };
  if (!StepAside(*job)) top_up();
  while (RunOne(*job, caller)) {
    // Helpers that stepped aside come back once the reason is gone.
    if (job->live.load(std::memory_order_relaxed) < job->wanted &&
        job->next.load(std::memory_order_relaxed) + 1 < n && !StepAside(*job)) {
      top_up();
    }
  }
  {
    std::unique_lock<std::mutex> l(job->mu);
    job->cv.wait(l, [&] { return job->done.load(std::memory_order_acquire) == job->n; });
  }
}

}  // namespace engram
