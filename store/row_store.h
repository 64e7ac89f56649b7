// RowStore: engramd's row store in front of the gather engine. Resident tables are copied from
// their memfd, cached tables from the shared row cache, on the request thread with no syscall;
// only the rows it does not hold go to the engine (cached tables' misses read with O_DIRECT
// into a private buffer, then admitted to the cache). Bytes, completion and errors are the
// engine's: a batch the store cannot fully answer is finished by the engine.
//
//   auto store = engram::RowStore::Create(store_config, tables, engine.get(), notice);
//   store->StartLoading(/*load_now=*/true); // resident tables stream in; storage serves meanwhile
//   store->Load(14);  store->CancelLoad(14);  // what engramctl load asks for
//   absl::Status s = store->Gather(batch);  // instead of engine->Gather(batch)
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "base/metric_sink.h"
#include "base/unique_fd.h"
#include "gather/gather_engine.h"
#include "gather/miss_queue.h"
#include "nlohmann/json.hpp"
#include "protocol/store_counters.h"
#include "store/admissions.h"
#include "store/cache_handoff.h"
#include "store/cache_touch.h"
#include "store/load_status.h"
#include "store/memory_budget.h"
#include "store/pressure_monitor.h"
#include "store/resident_table.h"
#include "store/row_cache.h"
#include "store/store_config.h"
#include "tables/table.h"

namespace engram {

// One table's counters: one field per entry of ENGRAM_STORE_TABLE_COUNTERS
// (protocol/store_counters.h): requests, all_hit_requests, rows, hit_rows, prefetch_used_rows,
// resident_rows_loaded, resident_bytes.
struct TableStoreStats {
  uint32_t layer_id = 0;
  Tier tier = Tier::kStorage;
#define ENGRAM_STORE_TABLE_FIELD_(field, json_key, tiers, type, metric, help) uint64_t field = 0;
  ENGRAM_STORE_TABLE_COUNTERS(ENGRAM_STORE_TABLE_FIELD_)
#undef ENGRAM_STORE_TABLE_FIELD_
};

// What a prefetch of some rows of one table did (RowStore::Prefetch).
struct PrefetchOutcome {
  uint64_t fetched = 0;  // rows read and admitted to the cache
  uint64_t held = 0;     // rows the store held already (cached, or a resident table)
  uint64_t dropped = 0;  // rows the miss queue dropped or shed (gather/miss_queue.h)
};

// The entry of `layer` in the "tables" array of a control reply, or null.
nlohmann::json* ControlTableEntry(nlohmann::json* tables, uint32_t layer);

class RowStore {
 public:
  using Notice = std::function<void(const std::string& line)>;

  // Misses of a cached table (and rows a prefetch reads) go through a private buffer of each
  // request thread, at most this many rows at a time: the buffer is bounded whatever the
  // request's size.
  static constexpr size_t kMissChunkRows = 4096;
  static constexpr uint64_t kMissBufferBytes = kMissChunkRows * kRowBytes;

  // The engine's read mode for a table of this tier: cached tables' misses are read with
  // O_DIRECT, so the page cache keeps no second copy of them.
  static ReadMode ReadModeFor(Tier tier, ReadMode configured) {
    return tier == Tier::kCache ? ReadMode::kDirect : configured;
  }

  // The checks Create makes before it allocates anything (tiers naming layers that are not
  // served, a cache without a size, resident tables larger than the budget), for
  // engramd --check-config. InvalidArgument / ResourceExhausted naming the table or key.
  static absl::Status Validate(const StoreConfig& config,
                               const std::vector<std::unique_ptr<Table>>& tables);

  // The row cache Create would make for these settings: RowCache::Size of [memory] cache, or of
  // what the store's share of the budget leaves after the resident tables (the smaller when
  // both bound it); nullopt when no table is of the cache tier or Validate refuses. For
  // engramd --check-config; Create logs the same line of the cache it makes (DescribeCache).
  static std::optional<RowCacheSizing> PlanCache(const StoreConfig& config,
                                                 const std::vector<std::unique_ptr<Table>>& tables);
  // For people: how many rows `sizing` holds, of which cache-tier tables (`cached`, with the
  // share of their rows that fits), and why that is less than asked: each slot's header, the
  // index, the daemon's bookkeeping, what the budget left. "row cache: 12.00 GiB ([memory]
  // cache) holds 29840000 rows of 264 bytes (7.34 GiB of rows), 14.9 % of layer 14's ...".
  static std::string DescribeCache(const RowCacheSizing& sizing, const StoreConfig& config,
                                   const std::vector<const Table*>& cached);

  // Reserves the resident tables' memory and the cache from the budget (ResourceExhausted
  // naming the table when it does not fit) and creates them empty. `tables` and `engine` must
  // outlive the store. `notice` receives operator messages (huge pages, loading, pressure).
  // With `handoff` (cache_handoff.h) the row cache records handoff->tables_identity, and a
  // region handed over (handoff->fd) is adopted instead of creating an empty cache when it is
  // valid, holds rows of these tables and a sample of its rows matches the table files; else it
  // is discarded, with the reason in handoff->outcome and a notice.
  static absl::StatusOr<std::unique_ptr<RowStore>> Create(
      const StoreConfig& config, const std::vector<std::unique_ptr<Table>>& tables,
      GatherEngine* engine, Notice notice, CacheHandoff* handoff = nullptr);
  ~RowStore();  // cancels a load in progress and stops the pressure monitor

  // Starts the loader thread and the pressure monitor; with `load_now` every resident table is
  // queued for loading (one after another, with progress notices), otherwise they wait for
  // Load() ([memory] load_at_start = false) and are served from storage until then.
  void StartLoading(bool load_now = true);
  // Waits until no resident table is queued or loading (tests, tools).
  void WaitLoaded();
  // Cancels every load and ends the loader thread (engramd stopping): returns at once; the load
  // in progress ends within ResidentTable::Load's bound and the destructor joins the thread.
  void StopLoading();

  // Queues the resident table of `layer` for loading, or resumes a load that was cancelled or
  // failed; a table already loaded, queued or loading is left as it is, except that a load
  // still running after CancelLoad goes on (the cancel is withdrawn: the later request wins).
  // A table refused because its file changed stays failed. Returns its state.
  // NotFound for a layer not served, FailedPrecondition for a table of another tier.
  absl::StatusOr<ResidentLoadStatus> Load(uint32_t layer);
  // Stops the load of `layer` after the chunk in progress (a queued one never starts); the rows
  // loaded stay served from memory and a later Load() resumes. The state it left.
  absl::StatusOr<ResidentLoadStatus> CancelLoad(uint32_t layer);
  absl::StatusOr<ResidentLoadStatus> LoadStatus(uint32_t layer) const;
  // True while a resident table is queued or loading.
  bool Loading() const {
    std::lock_guard lock(load_mu_);
    return !load_queue_.empty() || loading_ != nullptr;
  }

  // Fills the batch exactly as GatherEngine::Gather does. Thread-safe.
  absl::Status Gather(const GatherBatch& batch);

  // The store's part of a prefetch (engramd's prefetcher): for a cached table, reads the
  // rows it does not hold (O_DIRECT, as misses are) and admits them marked as prefetched; a
  // resident table holds every row already. False for a table of the storage tier (the caller
  // warms the page cache instead). Rows must be covered by the table. With `pin_for` (an
  // admission's rows), every row of a cached table that ends up held, read now or present
  // before, is pinned for it (rows a miss queue drop or a shrink left out are not). Thread-safe.
  bool Handles(const Table* table);
  absl::Status Prefetch(const Table* table, std::span<const uint64_t> rows,
                        PrefetchOutcome* ret_outcome, Admission* pin_for = nullptr);
  // The admissions pinning rows of the row cache; null without a cache.
  Admissions* admissions() { return admissions_.get(); }

  // The tier `table` is served from (storage for a table the store does not know).
  Tier TierOf(const Table* table) const;

  std::vector<TableStoreStats> Stats() const;
  // Adds the store's fields to a control reply: "status" gets "store", "tables" and "stats" get
  // per-table fields in their "tables" entries (matched by "layer").
  void AddControlFields(const std::string& command, nlohmann::json* out) const;
  void AddMetrics(MetricSink* e) const;

  // Reading the row cache in place (docs/row-store.md). A read-only descriptor of the cache's
  // memfd, made once (reopened O_RDONLY through /proc/self/fd after the memfd's mode was made
  // owner-read-only, so that a client can neither map it writable nor reopen it for writing),
  // to send with TABLE_MAPPED; FailedPrecondition without a cache, Internal when the kernel
  // refuses. Thread-safe.
  absl::StatusOr<int> CacheReadOnlyFd();
  uint64_t cache_region_bytes() const { return cache_ != nullptr ? cache_->region_bytes() : 0; }
  // Whether `table` is served from the row cache.
  bool Cached(const Table* table) {
    const TableState* ts = StateOf(table);
    return ts != nullptr && ts->tier == Tier::kCache;
  }
  // A session's touch page: its counters and touches are folded in from now on, and one last
  // time once only the store holds it (the session ended).
  void AddTouchPage(std::shared_ptr<CacheTouchPage> page);
  // Folds every touch page: the rows clients read in place (from the row cache or a resident
  // table) count in the tables' statistics and the cache's hits, and their cache hits count as
  // uses of the rows before anything is evicted. Runs
  // before misses are admitted and before statistics are read. `wait`: false skips it when
  // another thread is folding already (that one's fold is as good).
  void FoldTouches(bool wait = true) const;

  const MemoryBudget& budget() const { return budget_; }
  const RowCache* cache() const { return cache_.get(); }
  // The queue cache-tier misses are read through (null without a cached table).
  const MissQueue* miss_queue() const { return misses_.get(); }
  // Resident table of `layer`, or null.
  const ResidentTable* resident(uint32_t layer) const;

 private:
  struct TableState {
    const Table* table = nullptr;
    Tier tier = Tier::kStorage;
    std::unique_ptr<ResidentTable> resident;
    // The COUNTER entries of ENGRAM_STORE_TABLE_COUNTERS (the gauges are the resident table's).
#define ENGRAM_STORE_TABLE_ATOMIC_(field, json_key, tiers, type, metric, help) \
  ENGRAM_STORE_IF_COUNTER_##type(std::atomic<uint64_t> field{0};)
    ENGRAM_STORE_TABLE_COUNTERS(ENGRAM_STORE_TABLE_ATOMIC_)
#undef ENGRAM_STORE_TABLE_ATOMIC_
    // Resident tier: the load's state (guarded by load_mu_) and its cancel flag.
    LoadState load_state = LoadState::kWaiting;
    std::string load_error;
    std::atomic<bool> cancel{false};
    // Load() came after CancelLoad() while the loader was still in the chunk: if the loader saw
    // the cancel anyway, it queues the table again instead of leaving it cancelled.
    bool restart = false;
  };
  RowStore(const StoreConfig& config, GatherEngine* engine, Notice notice)
      : config_(config),
        engine_(engine),
        notice_(std::move(notice)),
        budget_(config.store_budget_bytes()) {}
  TableState* StateOf(const Table* table);
  // The row cache of `bytes`: adopted from handoff->fd where it can be, else created empty
  // (row_store_handoff.cc).
  absl::StatusOr<std::unique_ptr<RowCache>> MakeCache(uint64_t bytes, CacheHandoff* handoff);
  // Reserves each resident table's largest size (rounded up to a 2 MiB page) from `budget`, as
  // Validate and PlanCache count them; ResourceExhausted naming the table that does not fit.
  static absl::Status ReserveResident(const StoreConfig& config,
                                      const std::vector<std::unique_ptr<Table>>& tables,
                                      MemoryBudget* budget);
  // Reads every row of an adopted cache from its table file and drops each that differs
  // (row_store_handoff.cc). An error (a read failed) leaves rows unproven: the caller discards.
  absl::Status ProveAdoptedRows(RowCache& cache, RowCacheProof* ret_proof);
  // One notice per layer of `by_layer`: its rows in the region handed over that `why`, dropped.
  void NoticeDropped(const std::map<uint32_t, uint64_t>& by_layer, std::string_view why);
  const TableState* StateOfLayer(uint32_t layer) const;
  absl::Status GatherMisses(TableState& ts, const GatherBatch& batch,
                            const std::vector<uint64_t>& rows,
                            const std::vector<uint64_t>& offsets);
  void LoaderLoop();
  void LoadOne(TableState& ts);
  absl::StatusOr<TableState*> ResidentStateOf(uint32_t layer) const;
  ResidentLoadStatus StatusOfLocked(const TableState& ts) const;

  const StoreConfig config_;
  GatherEngine* const engine_;
  Notice notice_;
  MemoryBudget budget_;
  std::vector<std::unique_ptr<TableState>> states_;
  std::unique_ptr<RowCache> cache_;
  std::unique_ptr<Admissions> admissions_;  // with cache_; destroyed first (it unpins)
  std::unique_ptr<MissQueue> misses_;       // cache-tier misses, by class (gather/miss_queue.h)
  std::mutex cache_fd_mu_;
  UniqueFd cache_read_only_fd_;
  mutable std::mutex touch_mu_;
  mutable std::vector<std::shared_ptr<CacheTouchPage>> touch_pages_;
  mutable int64_t last_release_ns_ = 0;  // ReleaseAboveCapacity's last run (touch_mu_)
  uint64_t cache_target_slots_ = 0;
  std::unique_ptr<PressureMonitor> pressure_;
  // The loader: one thread, a queue of resident tables to load.
  mutable std::mutex load_mu_;
  std::condition_variable load_cv_;
  std::deque<TableState*> load_queue_;
  TableState* loading_ = nullptr;  // the table being loaded, or null
  bool load_stop_ = false;
  std::thread loader_;
};

}  // namespace engram
