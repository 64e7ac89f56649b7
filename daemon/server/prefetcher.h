// Prefetcher: rows a client will probably gather soon (speculative decoding's draft tokens, the
// next prefill chunk), brought into memory in the background. PREFETCH submissions are checked
// on the polling thread and their rows put on one bounded queue (when it is full its oldest rows
// are dropped and counted: hints go stale); one low-priority thread works the queue in small
// batches, newest first, after
// the gathers in flight: a cached table's missing rows are read with O_DIRECT and admitted to the
// row cache marked as prefetched, a resident table's rows are held already, a table served from
// storage has the pages of its rows' missing parts read ahead into the page cache
// (posix_fadvise WILLNEED). docs/row-store.md, "Prefetch".
//
//   Prefetcher p(options, tables, store, [&] { return gathers_running(); }, healthy);
//   p.Start();
//   uint64_t queued = p.Enqueue(table_index, rows);  // returns at once; the rest were dropped
#pragma once

#include <atomic>
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
#include "daemon/ops/metrics.h"
#include "daemon/server/row_store.h"
#include "nlohmann/json.hpp"
#include "tables/table.h"

namespace engram {

struct PrefetcherOptions {
  // Rows queued at most, every table together (16 bytes each); a full queue drops its oldest
  // rows for new ones. 0 turns prefetch off (every row is dropped and counted).
  uint64_t queue_rows = 262144;
  // Rows taken off the queue at a time: small, so that a batch's reads run on the prefetch
  // thread alone (the engine wakes no helper for them) and a gather waits behind at most one.
  uint32_t batch_rows = 128;
  // While gathers are in flight a batch waits for them, up to this long; then it runs anyway,
  // so that a daemon that is never idle still prefetches (one batch per wait).
  uint64_t max_defer_ns = 2'000'000;
  // Run the thread as SCHED_IDLE with the idle I/O class (false: normal priority, for tests
  // that measure it).
  bool idle_priority = true;
  // Tables served from storage through the page cache get their pages read ahead; false when
  // they are read with O_DIRECT (engine.read_mode = direct), which no page cache helps: their
  // rows are then dropped.
  bool storage_readahead = true;
};

// Per-table counters; every one only grows.
struct TablePrefetchStats {
  uint32_t layer_id = 0;
  uint64_t requested = 0;  // rows queued
  uint64_t dropped = 0;    // rows dropped: the queue was full (its oldest), or no cache to fill
  uint64_t fetched = 0;    // rows read into the row cache or the page cache
  uint64_t held = 0;       // rows already in memory (cached, resident, page cache)
  uint64_t failed = 0;     // rows whose read failed (the table changed, an I/O error)
};

class Prefetcher {
 public:
  // True while gathers are in flight (the thread defers to them).
  using BusyFn = std::function<bool()>;
  // OK while table `index` may be read (its files have not changed since they were validated).
  using HealthFn = std::function<absl::Status(size_t index)>;

  // `tables` and `store` (null: every table from storage) must outlive the prefetcher.
  Prefetcher(const PrefetcherOptions& options, std::span<const std::unique_ptr<Table>> tables,
             RowStore* store, BusyFn busy, HealthFn health);
  ~Prefetcher();  // stops the thread; rows still queued are forgotten
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  void Start();
  // Queues rows of tables[table_index] (checked by the caller against the table's coverage),
  // dropping the oldest queued rows (counted) to make room, and returns how many were queued:
  // all of them unless they alone exceed the bound (then their last queue_rows). Never waits
  // for I/O. Thread-safe.
  uint64_t Enqueue(size_t table_index, std::span<const uint64_t> rows);
  // Rows on the queue or being worked on now.
  uint64_t pending_rows() const { return pending_.load(std::memory_order_relaxed); }
  // Waits until nothing is pending or `timeout_ns` passed; true when nothing is (tests, tools).
  bool WaitIdle(uint64_t timeout_ns);

  std::vector<TablePrefetchStats> Stats() const;
  const PrefetcherOptions& options() const { return options_; }
  // "status" gets "prefetch" (totals); "stats" gets prefetch_* fields in its "tables" entries.
  void AddControlFields(const std::string& command, nlohmann::json* out) const;
  void AddMetrics(metrics::Exposition* e) const;

 private:
  struct Entry {
    uint32_t table;
    uint64_t row;
  };
  struct Counters {
    std::atomic<uint64_t> requested{0};
    std::atomic<uint64_t> dropped{0};
    std::atomic<uint64_t> fetched{0};
    std::atomic<uint64_t> held{0};
    std::atomic<uint64_t> failed{0};
  };

  void Run();
  // Takes the next batch (rows of one table) off the queue; false when stopping.
  bool Take(uint32_t* ret_table, std::vector<uint64_t>* ret_rows);
  void Defer();
  void Process(uint32_t table, std::span<const uint64_t> rows);
  // Storage tier: reads ahead the page ranges of the rows' parts that are not in the page cache.
  void ReadAhead(const Table& table, std::span<const uint64_t> rows, uint64_t* ret_fetched,
                 uint64_t* ret_held);

  const PrefetcherOptions options_;
  std::span<const std::unique_ptr<Table>> tables_;
  RowStore* const store_;
  BusyFn busy_;
  HealthFn health_;
  std::unique_ptr<Counters[]> counters_;  // one per table

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<Entry> queue_;  // bounded by options_.queue_rows; newest at the back
  bool stop_ = false;
  std::atomic<uint64_t> pending_{0};
  std::thread thread_;
};

}  // namespace engram
