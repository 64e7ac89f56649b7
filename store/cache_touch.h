// CacheTouchPage: one session's touch page (struct engram_cache_touch_page in
// include/engram/protocol.h; docs/protocol.md, "Reading the row cache in place"). A client that
// reads the row cache or a resident table in place reports there what it read: per table
// counters, which the daemon adds to its statistics as if it had served those rows, and (row
// cache) a bounded ring of the slots it hit, which the daemon folds into the slots' use counts
// before it evicts. The page has a fixed size
// and is sealed against resizing; the daemon trusts nothing in it (entries are checked by the
// cache, counters that go backwards are ignored, at most one ring's worth is read per fold, and
// the counters' growth is bounded by what one session could have read in place since the last
// fold: a value past the bound is clamped, counted and reported once, naming the session).
//
//   auto page = CacheTouchPage::Create(tables.size());
//   SendWithRowCache(page->fd());
//   page->Fold([&](uint64_t key, uint32_t slot) { cache.Touch(slot, key); },
//              [&](size_t table, uint64_t requests, uint64_t rows) {
//                /* count */ return CacheTouchPage::Counted::kCache;
//              },
//              [&](const std::string& line) { log(line); });  // a clamp, once per page
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
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
  using ReportFn = std::function<void(const std::string& line)>;

  // What one session may report, all its tables together: the rows (and gathers) it could
  // have read in place, at most kInPlaceBytesPerSecond of rows copied. A token bucket: the
  // allowance grows at that rate while the page exists, up to kInPlaceBurstNs' worth (so that
  // rows read between two folds far apart still count), starts at kInPlaceStartRows, and every
  // fold takes what it counts from it. Far above what a client can copy; what it stops is a
  // forged count (2^63 rows) putting the node's hits and hit rate where the client wants them,
  // or two forged counts wrapping the node's totals.
  static constexpr uint64_t kInPlaceBytesPerSecond = uint64_t{256} << 30;
  static constexpr uint64_t kInPlaceBurstNs = 60'000'000'000;
  static constexpr uint64_t kInPlaceStartRows = uint64_t{1} << 24;

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
  // base and adds nothing), adding the rows to the session counter its answer names. Growth past
  // the bound (kInPlaceBytesPerSecond) is clamped to what is left of it, counted in the
  // session's clamp counter, and the first clamp of the page is told to `report` (naming the
  // owner). Publishes the tail. Thread-safe; returns the entries folded.
  uint64_t Fold(const TouchFn& touch, const CountFn& count, const ReportFn& report = nullptr);
  // Entries the client reported it left out because the ring was full.
  uint64_t dropped() const;
  // The session the page belongs to: where Fold adds the rows its client read in place from the
  // row cache and from resident tables and counts the counters it clamped (its session's
  // counters; null: none), and how a report names it ("session 7 (pid 123, uid 1000, 'vllm')").
  struct Owner {
    std::atomic<uint64_t>* cache_rows = nullptr;
    std::atomic<uint64_t>* resident_rows = nullptr;
    std::atomic<uint64_t>* clamped = nullptr;
    std::string name;
  };
  void Attach(Owner owner) {
    std::lock_guard<std::mutex> lock(mu_);
    owner_ = std::move(owner);
  }

 private:
  CacheTouchPage() = default;
  engram_cache_touch_page* header() const {
    return static_cast<engram_cache_touch_page*>(map_.get());
  }

  UniqueFd fd_;
  UniqueMapping map_;
  size_t tables_ = 0;
  // What the owner may still report (the token bucket above), in requests and rows.
  struct Allowance {
    uint64_t requests;
    uint64_t rows;
  };
  // Adds what the time since the last fold allows; under mu_.
  void Refill();
  void ReportClamp(size_t table, uint64_t requests, uint64_t rows, const ReportFn& report);

  std::mutex mu_;
  Owner owner_;
  uint64_t last_fold_ns_ = 0;  // the last fold, or the page's making
  Allowance allowance_ = {kInPlaceStartRows, kInPlaceStartRows};
  bool clamp_reported_ = false;
  uint64_t tail_ = 0;  // entries folded (the daemon's own copy; the page's is for the client)
  std::vector<engram_cache_touch_counters> seen_;  // the counters as of the last fold
};

}  // namespace engram
