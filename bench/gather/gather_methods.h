// The gather methods engram-bench and the Google Benchmark suite compare: mmap + memcpy, the
// recipe's blocking preadv pool, serial RWF_NOWAIT with the misses to that pool, io_uring only,
// and the gather engine. Each fills row i of a batch at dest + i * 264.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gather/gather_engine.h"
#include "tables/table.h"

namespace engram::bench {

class GatherMethod {
 public:
  virtual ~GatherMethod() = default;
  virtual std::string name() const = 0;
  // Prepares for `table` (maps files, registers the table).
  virtual absl::Status Attach(const Table& table) = 0;
  virtual absl::Status Gather(const Table& table, std::span<const uint64_t> rows,
                              uint8_t* dest) = 0;
  // Drops what the method holds that would keep pages resident or mapped (mmap).
  virtual void Detach() {}
  // System calls made so far (reads and io_uring_enter; page faults are not counted).
  virtual uint64_t syscalls() const = 0;
};

// A fixed set of threads running closures; Run() blocks until every closure has finished.
class BlockingPool {
 public:
  explicit BlockingPool(int threads);
  ~BlockingPool();
  void Run(std::vector<std::function<void()>>& tasks);

 private:
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>*> queue_;
  size_t outstanding_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

std::unique_ptr<GatherMethod> MakeMmapMethod();
// The recipe reader: `threads` threads, tasks of `chunk` rows, one preadv per row part.
std::unique_ptr<GatherMethod> MakeRecipePoolMethod(int threads = 32, int chunk = 16);
// The field experiment: serial preadv2(RWF_NOWAIT) per row part, EAGAIN / short rows to the
// recipe pool.
std::unique_ptr<GatherMethod> MakeNowaitPoolMethod(int threads = 32, int chunk = 16);
// One io_uring on the calling thread, one buffered READ per row part, in batch order.
std::unique_ptr<GatherMethod> MakeUringOnlyMethod(uint32_t depth = 256);
// The gather engine; `table_options` is what every table is added with (kDirect: O_DIRECT).
std::unique_ptr<GatherMethod> MakeEngineMethod(const std::string& name,
                                               const GatherEngineOptions& options,
                                               const TableGatherOptions& table_options = {});

}  // namespace engram::bench
