// The threads that run requests for engramd: each takes a decoded request from the poller and
// runs it on the gather engine as its calling thread (so a request gets the caller's share of
// the work, exactly as an in-process Gather() does), spinning briefly between requests so that a
// hand-off while busy costs no wake-up.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
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

  // Thread-safe.
  void Post(Task task);

 private:
  void Loop();

  const uint64_t spin_ns_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::atomic<uint32_t> queued_{0};
  std::atomic<uint32_t> sleeping_{0};
  std::vector<std::thread> threads_;
};

}  // namespace engram
