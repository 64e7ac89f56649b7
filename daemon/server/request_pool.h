// The threads that run requests for engramd: each takes a decoded request from the poller and
// runs it on the gather engine as its calling thread (so a request gets the caller's share of
// the work, exactly as an in-process Gather() does), spinning briefly between requests so that a
// hand-off while busy costs no wake-up; before a burst of requests the poller expects (pace.h)
// it can wake sleeping threads to spin through the burst's window. Requests are taken in turn
// per owner (session): one session with many requests queued waits its turn like any other, so
// a client that fills the queue with requests that are slow to validate delays another client
// by one request at most per thread, not by its whole queue; and while another owner waits, a
// thread takes an owner with nothing running first, so one owner cannot hold every thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/functional/any_invocable.h"

namespace engram {

// Request threads for a machine of `cpus` CPUs: half of them, at least 2 and at most 32. Each
// runs one request as the engine's calling thread; requests of different clients then gather
// side by side and the engine shares its workers between them.
uint32_t DefaultRequestThreads(uint32_t cpus);

class RequestPool {
 public:
  using Task = absl::AnyInvocable<void() &&>;
  // `spin_ns`: how long an idle thread polls for work before sleeping.
  RequestPool(uint32_t threads, uint64_t spin_ns);
  RequestPool(const RequestPool&) = delete;
  RequestPool& operator=(const RequestPool&) = delete;
  // Runs what was posted, then joins.
  ~RequestPool();

  // Queues `task` behind the other tasks of `owner`. Thread-safe.
  void Post(uint64_t owner, Task task);

  // Work is expected soon: up to `threads` sleeping threads wake and, like every idle thread,
  // spin until `until_ns` (NowNs()) before they sleep again. Thread-safe.
  void Prewake(uint32_t threads, uint64_t until_ns);
  // The expected work came: threads still spinning for Prewake stop at their own spell.
  void EndPrewake() { spin_until_.store(0, std::memory_order_relaxed); }

  // Polling mode (PollOptions::hold_cores): the first `threads` threads do not sleep between
  // tasks until `until_ns` (NowNs()); the poller moves `until_ns` on while clients are active.
  // Threads asleep when a hold starts are woken for it. Thread-safe.
  void Hold(uint32_t threads, uint64_t until_ns);
  // Time the threads spent spinning with nothing to run, all together (ns): the CPU a spin
  // spell, a pace window or a hold costs.
  uint64_t spin_ns() const { return spin_total_ns_.load(std::memory_order_relaxed); }

 private:
  void Loop(uint32_t index);
  // Spins until a task is queued or the thread's spell (its own, a pace window's, a hold's)
  // ends; counts the time.
  void Spin(uint32_t index);
  bool Held(uint32_t index, uint64_t now) const {
    return index < hold_threads_.load(std::memory_order_relaxed) &&
           now < hold_until_.load(std::memory_order_relaxed);
  }

  const uint64_t spin_ns_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, std::deque<Task>> by_owner_;
  std::deque<uint64_t> turns_;  // owners with queued tasks, in the order they are served
  std::unordered_map<uint64_t, uint32_t> running_;  // owner → its tasks running now
  bool stop_ = false;
  uint32_t prewake_tokens_ = 0;  // sleeping threads still to wake for Prewake
  std::atomic<uint64_t> spin_until_{0};
  std::atomic<uint32_t> hold_threads_{0};
  std::atomic<uint64_t> hold_until_{0};
  std::atomic<uint64_t> spin_total_ns_{0};
  std::atomic<uint32_t> queued_{0};
  std::atomic<uint32_t> sleeping_{0};
  std::vector<std::thread> threads_;
};

}  // namespace engram
