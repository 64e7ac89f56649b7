// The row cache's hot set on disk, for starts without the cache handed over (a cold boot, a
// stop with the file-descriptor store emptied): the keys of the rows the cache holds, written
// periodically and at stop (atomically: a temporary file renamed over the last one), and read
// back after a start by a warmer that queues the rows for the prefetcher, which reads them
// through the normal miss path at idle priority after the gathers in flight
// (docs/row-store.md, "Across restarts").
//
//   HotSetKeeper keeper(path, interval_ns, max_rows, cache);  // keeper.Start(); ~ writes once more
//   HotSetWarmer warmer(*ReadHotSet(path, max_rows));          // warmer.Start(prefetcher, ...)
//
// File: "EGRMHOT1", u32 version (1), u32 0, u64 count, count u64 keys ((layer + 1) << 40 | row,
// as in the row cache), u64 FNV-1a of the keys; little-endian. A count above kMaxHotSetRows is
// not a hot set. engramd replaces only a hot set (a file starting with "EGRMHOT", the magic of
// every layout) or nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/server/prefetcher.h"
#include "store/row_cache.h"
#include "store/row_store.h"

namespace engram {

inline constexpr char kHotSetSetting[] = "memory.hot_set_path";
// The most keys a hot set holds (memory.hot_set_rows' upper bound): a file is at most 8 GiB and
// 32 bytes, and one whose header says more is refused before its keys are read.
inline constexpr uint64_t kMaxHotSetRows = uint64_t{1} << 30;

// Whether WriteHotSet may write `path`: it is absent or a hot set (starting with "EGRMHOT"), and
// its temporary neighbour `path.tmp` is absent or one WriteHotSet left (empty or a hot set). Opens
// both without blocking or following a symbolic link and reads 8 bytes at most. FailedPrecondition
// naming memory.hot_set_path, the file and what it is otherwise (a FIFO, a device, a symbolic
// link, another file); Unavailable when it cannot be looked at.
absl::Status CheckHotSetPath(const std::string& path);
// Writes `keys` to `path` through `path.tmp`, created exclusively (O_EXCL, O_NOFOLLOW; one
// WriteHotSet left is removed first), fsynced, then renamed over `path` only if it still holds
// what was looked at (RENAME_NOREPLACE, or RENAME_EXCHANGE and a look at what came out); refused
// as CheckHotSetPath refuses, leaving every file as it was. Internal naming the file and the step
// that failed.
absl::Status WriteHotSet(const std::string& path, std::span<const uint64_t> keys);
// Reads a file WriteHotSet wrote, at most `max_keys` of its keys (the memory it takes), checking
// the sum of all of them a chunk at a time. Opens it as CheckHotSetPath does. NotFound when there
// is none; FailedPrecondition when it is no regular file; InvalidArgument naming the file and what
// is wrong (magic, version, size, a count above kMaxHotSetRows, checksum).
absl::StatusOr<std::vector<uint64_t>> ReadHotSet(const std::string& path, uint64_t max_keys);

// Writes the cache's hot set every `interval_ns` (0: only at stop) and when destroyed.
class HotSetKeeper {
 public:
  HotSetKeeper(std::string path, uint64_t interval_ns, uint64_t max_rows, const RowCache* cache);
  ~HotSetKeeper();  // stops the thread and writes the hot set a last time
  HotSetKeeper(const HotSetKeeper&) = delete;
  HotSetKeeper& operator=(const HotSetKeeper&) = delete;
  void Start();
  // Writes now; the rows written, or the error (also logged by the thread).
  absl::StatusOr<uint64_t> WriteNow();

 private:
  void Run();
  const std::string path_;
  const uint64_t interval_ns_;
  const uint64_t max_rows_;
  const RowCache* const cache_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// Queues the rows of a hot set for the prefetcher, a chunk at a time while its queue has room
// (so that clients' own prefetch hints are never pushed out), keeping the rows of tables served
// from the cache tier within their rows; the others are skipped.
class HotSetWarmer {
 public:
  explicit HotSetWarmer(std::vector<uint64_t> keys) : keys_(std::move(keys)) {}
  ~HotSetWarmer();  // stops the thread; rows not queued yet are forgotten
  HotSetWarmer(const HotSetWarmer&) = delete;
  HotSetWarmer& operator=(const HotSetWarmer&) = delete;
  // `prefetcher`, `tables` and `store` must outlive the warmer.
  void Start(Prefetcher* prefetcher, std::span<const std::unique_ptr<Table>> tables,
             RowStore* store);
  uint64_t queued() const { return queued_.load(std::memory_order_relaxed); }
  uint64_t skipped() const { return skipped_.load(std::memory_order_relaxed); }
  bool done() const { return done_.load(std::memory_order_acquire); }

 private:
  void Run(Prefetcher* prefetcher, std::span<const std::unique_ptr<Table>> tables, RowStore* store);
  std::vector<uint64_t> keys_;
  std::atomic<uint64_t> queued_{0};
  std::atomic<uint64_t> skipped_{0};
  std::atomic<bool> done_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace engram
