// CacheTouchPage: one session's touch page (struct engram_cache_touch_page in
// include/engram/protocol.h; docs/protocol.md, "Reading the row cache in place"). A client that
// reads the row cache or a resident table in place reports there what it read: per table
// counters, which the daemon adds to its statistics as if it had served those rows, and (row
// cache) a bounded ring of the slots it hit, which the daemon folds into the slots' use counts
// before it evicts. The page has a fixed size
// and is sealed against resizing; the daemon trusts nothing in it (entries are checked by the
// cache, counters that go backwards are ignored, at most one ring's worth is read per fold).
//
//   auto page = CacheTouchPage::Create(tables.size());
//   SendWithRowCache(page->fd());
//   page->Fold([&](uint64_t key, uint32_t slot) { cache.Touch(slot, key); },
//              [&](size_t table, uint64_t requests, uint64_t rows) {
//                /* count */ return CacheTouchPage::Counted::kCache;
//              });
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "base/unique_mapping.h"
#include "engram/protocol.h"

namespace engram {

class CacheTouchPage {
 public:
  // Which of the session's counters a table's rows read in place add to (CountFn's answer):
  // none (a table that cannot be read in place: the client's invention), the row cache's or the
  // resident tables'.
  enum class Counted { kNot, kCache, kResident };
  using TouchFn = std::function<void(uint64_t key, uint32_t slot)>;
  using CountFn = std::function<Counted(size_t table, uint64_t requests, uint64_t rows)>;

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
  // base and adds nothing), adding the rows to the session counter its answer names. Publishes
  // the tail. Thread-safe; returns the entries folded.
  uint64_t Fold(const TouchFn& touch, const CountFn& count);
  // Entries the client reported it left out because the ring was full.
  uint64_t dropped() const;
  // Where Fold adds the rows the client read in place from the row cache and from resident
  // tables (its session's counters), or null.
  void AttachCounters(std::atomic<uint64_t>* cache_rows, std::atomic<uint64_t>* resident_rows) {
    std::lock_guard<std::mutex> lock(mu_);
    cache_rows_ = cache_rows;
    resident_rows_ = resident_rows;
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
  std::atomic<uint64_t>* cache_rows_ = nullptr;
  std::atomic<uint64_t>* resident_rows_ = nullptr;
  uint64_t tail_ = 0;  // entries folded (the daemon's own copy; the page's is for the client)
  std::vector<engram_cache_touch_counters> seen_;  // the counters as of the last fold
};

}  // namespace engram
