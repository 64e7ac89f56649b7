// `warm` and `evict`: moving table rows into and out of the page cache, one bounded step per
// request, and the worker thread that runs the warm reads so the control thread never blocks on
// the disk.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "tables/table.h"

namespace engram {

// Most bytes one warm or evict step touches: a step is short, and engramctl shows progress.
inline constexpr uint64_t kMaxPageCacheStepBytes = uint64_t{64} << 20;

// The byte ranges of the files of `table` that hold rows [begin, end).
struct FileRange {
  int fd;
  const std::string* path;
  uint64_t offset;
  uint64_t bytes;
};
std::vector<FileRange> RangesOf(const Table& table, uint64_t begin, uint64_t end);

// The rows one step covers: [range.begin, at most kMaxPageCacheStepBytes further).
RowRange StepOf(const Table& table, RowRange range);

// Reads `step`'s bytes through the page cache (blocking reads); returns the bytes read.
// DataLoss naming the file and offset when a read comes back short.
absl::StatusOr<uint64_t> WarmRows(const Table& table, RowRange step);
// Drops `step`'s pages from the page cache; returns the bytes covered.
absl::StatusOr<uint64_t> EvictRows(const Table& table, RowRange step);

// One thread running queued jobs in order; at most `max_queued` wait at once.
class PageCacheWorker {
 public:
  explicit PageCacheWorker(size_t max_queued) : max_queued_(max_queued) {}
  ~PageCacheWorker();
  // False when `max_queued` jobs already wait (the caller refuses the request).
  bool Post(std::function<void()> job);

 private:
  void Loop();
  const size_t max_queued_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;  // started by the first Post
};

}  // namespace engram
