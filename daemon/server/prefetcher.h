// Prefetcher: rows a client will probably gather soon (speculative decoding's draft tokens, the
// next prefill chunk), brought into memory in the background. The poller only hands a PREFETCH
// submission over (Post, O(1)); an intake thread of lower priority checks it and puts its rows on
// one bounded queue (when it is full its oldest rows are dropped and counted: hints go stale), so
// that no client can make the poller do work in proportion to its requests. Each session's rows
// count against its own bound (PrefetchAccount) from submission until they leave the queue. One
// low-priority thread works the queue in small batches, newest first, after the gathers in
// flight: a cached table's missing rows are read with O_DIRECT and admitted to the row cache
// marked as prefetched, a resident table's rows are held already, a table served from storage has
// the pages of its rows' missing parts read ahead into the page cache (posix_fadvise WILLNEED).
// Admissions' rows (a request's prompt, to be pinned for its prefill) wait on a queue of their
// own, oldest request first, worked only while no hint waits: they are bounded by their pin
// reservations (store/admissions.h), never dropped, and left unread once their admission is
// released. The thread also expires admissions whose deadline passed.
// docs/row-store.md, "Prefetch" and "Admission".
//
//   Prefetcher p(options, tables, store, [&] { return gathers_running(); }, healthy);
//   p.Start();
//   p.Post([=] { /* check the entry, then */ p.Enqueue(table_index, rows, account); });
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

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "base/metric_sink.h"
#include "nlohmann/json.hpp"
#include "store/row_store.h"
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
  // Run the thread as SCHED_IDLE with the idle I/O class, and the intake thread at nice 10
  // (false: both at normal priority, for tests that measure them).
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

// The rows one session has waiting for prefetch: added by the poller when it hands a PREFETCH
// over, taken off when they leave the queue (worked on or dropped) or fail their check. Shared by
// the session and the prefetcher, which holds it while any of its rows are queued.
using PrefetchAccount = std::atomic<uint64_t>;

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
  // Runs `task` on the intake thread, in the order posted. O(1): the poller hands a submission
  // over this way; the caller bounds what it posts (each session's PrefetchAccount). Tasks still
  // waiting when the prefetcher stops are run first. Thread-safe.
  void Post(std::function<void()> task);
  // Runs the tasks posted so far and stops the intake thread; nothing may be posted afterwards.
  void StopIntake();
  // Queues rows of tables[table_index] (checked by the caller against the table's coverage),
  // dropping the oldest queued rows (counted) to make room, and returns how many were queued:
  // all of them unless they alone exceed the bound (then their last queue_rows). The rows
  // stay counted in `account` (may be null) until they leave the queue; the caller has added
  // them already, and those not queued are taken off here. Never waits for I/O. Thread-safe.
  uint64_t Enqueue(size_t table_index, std::span<const uint64_t> rows,
                   const std::shared_ptr<PrefetchAccount>& account = nullptr);
  // Queues rows of tables[table_index] for `admission` (its pins reserved already): read after
  // every hint, pinned for it as they are held. Never drops them. Thread-safe.
  void EnqueueAdmission(size_t table_index, std::span<const uint64_t> rows,
                        std::shared_ptr<Admission> admission);
  // Rows on the queue or being worked on now.
  uint64_t pending_rows() const { return pending_.load(std::memory_order_relaxed); }
  // Waits until nothing is pending or `timeout_ns` passed; true when nothing is (tests, tools).
  bool WaitIdle(uint64_t timeout_ns);

  std::vector<TablePrefetchStats> Stats() const;
  const PrefetcherOptions& options() const { return options_; }
  // "status" gets "prefetch" (totals); "stats" gets prefetch_* fields in its "tables" entries.
  void AddControlFields(const std::string& command, nlohmann::json* out) const;
  void AddMetrics(MetricSink* e) const;

 private:
  struct Entry {
    uint32_t table;
    uint32_t owner;  // index into owners_, or kNoOwner
    uint64_t row;
  };
  static constexpr uint32_t kNoOwner = UINT32_MAX;
  // One admission entry's rows still queued.
  struct AdmitBatch {
    uint32_t table;
    std::shared_ptr<Admission> admission;
    std::vector<uint64_t> rows;
    size_t next = 0;  // rows before it were taken
  };
  // A session's account while it has rows on the queue.
  struct Owner {
    std::shared_ptr<PrefetchAccount> account;
    uint64_t rows = 0;
  };
  struct Counters {
    std::atomic<uint64_t> requested{0};
    std::atomic<uint64_t> dropped{0};
    std::atomic<uint64_t> fetched{0};
    std::atomic<uint64_t> held{0};
    std::atomic<uint64_t> failed{0};
  };

  void Run();
  void RunIntake();
  // With mu_ held: the owner index of `account` (null: kNoOwner), and a row of it leaving.
  uint32_t OwnerOf(const std::shared_ptr<PrefetchAccount>& account);
  void Leave(uint32_t owner, uint64_t rows);
  // Takes the next batch (rows of one table, of *ret_admission when not null) off the queues;
  // false when stopping. Expires admissions while it waits.
  bool Take(uint32_t* ret_table, std::vector<uint64_t>* ret_rows,
            std::shared_ptr<Admission>* ret_admission);
  // With mu_ held: the next batch of the admission queue.
  void TakeAdmitted(uint32_t* ret_table, std::vector<uint64_t>* ret_rows,
                    std::shared_ptr<Admission>* ret_admission);
  void Defer();
  void Process(uint32_t table, std::span<const uint64_t> rows, Admission* admission);
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
  std::deque<Entry> queue_;             // bounded by options_.queue_rows; newest at the back
  std::deque<AdmitBatch> admit_queue_;  // bounded by the admissions' reservations; oldest first
  std::vector<Owner> owners_;           // accounts with rows on the queue, and free places
  std::vector<uint32_t> free_owners_;
  absl::flat_hash_map<const PrefetchAccount*, uint32_t> owner_index_;
  bool stop_ = false;
  std::atomic<uint64_t> pending_{0};
  std::thread thread_;

  std::mutex intake_mu_;
  std::condition_variable intake_wake_;
  std::deque<std::function<void()>> intake_;
  bool intake_stop_ = false;
  std::thread intake_thread_;
};

}  // namespace engram
