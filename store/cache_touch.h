// CacheTouchPage: one session's touch page (struct engram_cache_touch_page in
// include/engram/protocol.h; docs/protocol.md, "Reading the row cache in place"). A client that
// reads the row cache in place reports there what it read: per table counters, which the daemon
// adds to its statistics as if it had served those rows, and a bounded ring of the slots it hit,
// which the daemon folds into the slots' use counts before it evicts. The page has a fixed size
// and is sealed against resizing; the daemon trusts nothing in it (entries are checked by the
// cache, counters that go backwards are ignored, at most one ring's worth is read per fold).
//
//   auto page = CacheTouchPage::Create(tables.size());
//   SendWithRowCache(page->fd());
//   page->Fold([&](uint64_t key, uint32_t slot) { cache.Touch(slot, key); },
//              [&](size_t table, uint64_t requests, uint64_t rows) { /* count */ });
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "engram/protocol.h"
#include "base/unique_fd.h"
#include "base/unique_mapping.h"

namespace engram {

class CacheTouchPage {
 public:
  using TouchFn = std::function<void(uint64_t key, uint32_t slot)>;
  using CountFn = std::function<void(size_t table, uint64_t requests, uint64_t rows)>;

  // A page with counters for `tables` tables and ENGRAM_CACHE_TOUCH_ENTRIES ring entries,
  // sealed against shrinking and growing. Internal naming the step the kernel refused.
  static absl::StatusOr<std::shared_ptr<CacheTouchPage>> Create(size_t tables);
  CacheTouchPage(const CacheTouchPage&) = delete;
  CacheTouchPage& operator=(const CacheTouchPage&) = delete;

  int fd() const { return fd_.get(); }
  uint64_t bytes() const { return map_.size(); }

  // Calls `touch` for each ring entry written since the last fold (at most a ring's worth: a
  // head that ran further ahead skips to the newest entries) and `count` with each table's
  // counters' growth since the last fold (a counter that went backwards is taken as the new
  // base and adds nothing). Publishes the tail. Thread-safe; returns the entries folded.
  uint64_t Fold(const TouchFn& touch, const CountFn& count);
  // Entries the client reported it left out because the ring was full.
  uint64_t dropped() const;
  // Where Fold adds the rows the client read in place (its session's counter), or null.
  void AttachCounter(std::atomic<uint64_t>* rows) {
    std::lock_guard<std::mutex> lock(mu_);
    rows_counter_ = rows;
  }

 private:
  CacheTouchPage() = default;
  engram_cache_touch_page* header() const {
    return static_cast<engram_cache_touch_page*>(map_.get());
  }

  UniqueFd fd_;
  UniqueMapping map_;
  size_t tables_ = 0;
  std::mutex mu_;
  std::atomic<uint64_t>* rows_counter_ = nullptr;
  uint64_t tail_ = 0;  // entries folded (the daemon's own copy; the page's is for the client)
  std::vector<engram_cache_touch_counters> seen_;  // the counters as of the last fold
};

}  // namespace engram
