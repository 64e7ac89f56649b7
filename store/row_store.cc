// RowStore: splitting gathers into store hits and engine misses, loading resident tables, and
// reporting the store to engramctl and the metrics.
#include "store/row_store.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/clock.h"
#include "base/page_size.h"
#include "base/prefetch.h"

namespace engram {
namespace {

std::string Gib(uint64_t bytes) {
  if (bytes < (1ull << 30)) return absl::StrFormat("%.1f MiB", double(bytes) / (1 << 20));
  return absl::StrFormat("%.2f GiB", double(bytes) / (1 << 30));
}

// Per request thread: the rows a batch missed and where they go, and the private buffer cached
// tables' misses are read into (rows are admitted to the cache from here, never from a client's
// arena, which the client can write).
struct MissScratch {
  std::vector<uint64_t> rows;
  std::vector<uint64_t> offsets;
  std::vector<uint8_t> bounce;
};
thread_local MissScratch t_scratch;

}  // namespace

absl::Status RowStore::Validate(const StoreConfig& config,
                                const std::vector<std::unique_ptr<Table>>& tables) {
  for (const auto& [layer, tier] : config.tiers) {
    bool found = false;
    for (const auto& t : tables) found |= t->layer_id() == layer;
    if (!found) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a tier is set for layer %u ([tables] tiers or --tier), but no table of that layer is "
          "served",
          layer));
    }
  }
  MemoryBudget budget(config.store_budget_bytes());
  if (absl::Status s = ReserveResident(config, tables, &budget); !s.ok()) return s;
  bool any_cache = false;
  for (const auto& t : tables) any_cache |= config.TierOf(t->layer_id()) == Tier::kCache;
  if (any_cache && config.cache_bytes == 0 && !budget.bounded()) {
    return absl::InvalidArgumentError(
        "a table uses the cache tier but neither [memory] cache nor [memory] budget is set: the "
        "cache needs a size");
  }
  if (any_cache && config.cache_bytes == 0 && budget.available() < (1u << 20)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the resident tables leave %u bytes of the row store's %u-byte share of [memory] budget "
        "to the row cache",
        budget.available(), budget.budget()));
  }
  return absl::OkStatus();
}

absl::Status RowStore::ReserveResident(const StoreConfig& config,
                                       const std::vector<std::unique_ptr<Table>>& tables,
                                       MemoryBudget* budget) {
  for (const auto& t : tables) {
    if (config.TierOf(t->layer_id()) != Tier::kResident) continue;
    // The largest size the resident copy can take (rounded up to a huge page).
    const uint64_t bytes =
        SharedRegion::LargestSize(t->data_bytes(), {.huge_pages = config.huge_pages});
    if (absl::Status s = budget->Reserve(bytes, "resident copy of " + t->Describe()); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RowStore>> RowStore::Create(
    const StoreConfig& config, const std::vector<std::unique_ptr<Table>>& tables,
    GatherEngine* engine, Notice notice, CacheHandoff* handoff) {
  if (absl::Status s = Validate(config, tables); !s.ok()) return s;
  std::unique_ptr<RowStore> store(new RowStore(config, engine, std::move(notice)));
  bool any_cache = false;
  for (const auto& t : tables) {
    auto ts = std::make_unique<TableState>();
    ts->table = t.get();
    ts->tier = config.TierOf(t->layer_id());
    if (ts->tier == Tier::kResident) {
      auto rt = ResidentTable::Create(
          *t, &store->budget_,
          {.huge_pages = config.huge_pages, .rate_bytes_per_s = config.load_rate_bytes_per_s});
      if (!rt.ok()) return rt.status();
      for (const std::string& n : (*rt)->notices()) store->notice_(n);
      ts->resident = std::move(*rt);
    }
    any_cache |= ts->tier == Tier::kCache;
    if (ts->tier == Tier::kCache) {
      // Misses are device reads: say when the layout makes each one more than one page.
      if (std::string advice = PagedLayoutAdvice(*t); !advice.empty()) store->notice_(advice);
    }
    store->states_.push_back(std::move(ts));
  }
  if (any_cache) {
    uint64_t bytes = config.cache_bytes != 0 ? config.cache_bytes : store->budget_.available();
    // What RowCache::Create sizes itself to: said before it allocates.
    const RowCacheSizing sizing = RowCache::Size(
        store->budget_.bounded() ? std::min(bytes, store->budget_.available()) : bytes);
    std::vector<const Table*> cached;
    for (const auto& ts : store->states_) {
      if (ts->tier == Tier::kCache) cached.push_back(ts->table);
    }
    store->notice_(DescribeCache(sizing, config, cached));
    auto cache = store->MakeCache(bytes, handoff);
    if (!cache.ok()) return cache.status();
    store->cache_ = std::move(*cache);
    store->admissions_ = std::make_unique<Admissions>(
        AdmissionLimits{.max_rows = config.admit_rows,
                        .max_owner_rows = config.admit_session_rows,
                        .max_ttl_ns = uint64_t{config.admit_ttl_ms} * 1'000'000},
        store->cache_.get());
    store->misses_ = std::make_unique<MissQueue>(MissQueueOptions{
        .depth = config.miss_depth, .shed_backlog_ns = uint64_t{config.miss_shed_ms} * 1'000'000});
    store->cache_target_slots_ = store->cache_->capacity_slots();
    if (store->cache_->capacity_slots() < store->cache_->max_slots()) {
      store->notice_(absl::StrCat("row cache: the memory budget allows ",
                                  Gib(RowCache::BytesForSlots(store->cache_->capacity_slots())),
                                  " of the ", Gib(bytes), " asked for"));
    }
  }
  return store;
}

RowStore::~RowStore() {
  StopLoading();
  if (loader_.joinable()) loader_.join();
  pressure_.reset();
}

const ResidentTable* RowStore::resident(uint32_t layer) const {
  for (const auto& ts : states_) {
    if (ts->table->layer_id() == layer) return ts->resident.get();
  }
  return nullptr;
}

RowStore::TableState* RowStore::StateOf(const Table* table) {
  for (const auto& ts : states_) {
    if (ts->table == table) return ts.get();
  }
  return nullptr;
}

void RowStore::StartLoading(bool load_now) {
  if (cache_ != nullptr && config_.pressure) {
    pressure_ = std::make_unique<PressureMonitor>(
        cache_.get(), cache_target_slots_,
        PressureOptions{.path = config_.pressure_file,
                        .interval_ns = uint64_t{config_.pressure_interval_ms} * 1'000'000},
        notice_);
    if (absl::Status s = pressure_->Start(); !s.ok()) {
      notice_(absl::StrCat("row cache keeps its size under memory pressure: ", s.message()));
      pressure_.reset();
    } else {
      notice_(absl::StrCat("row cache follows memory pressure from ", pressure_->path()));
    }
  }
  bool any = false;
  {
    std::lock_guard lock(load_mu_);
    for (const auto& ts : states_) {
      if (ts->resident == nullptr) continue;
      any = true;
      if (!load_now) continue;
      ts->load_state = LoadState::kQueued;
      load_queue_.push_back(ts.get());
    }
  }
  if (any) loader_ = std::thread([this] { LoaderLoop(); });
}

void RowStore::StopLoading() {
  {
    std::lock_guard lock(load_mu_);
    load_stop_ = true;
    for (const auto& ts : states_) ts->cancel.store(true);
  }
  load_cv_.notify_all();
}

void RowStore::WaitLoaded() {
  std::unique_lock lock(load_mu_);
  load_cv_.wait(lock, [&] { return load_stop_ || (load_queue_.empty() && loading_ == nullptr); });
}

absl::StatusOr<RowStore::TableState*> RowStore::ResidentStateOf(uint32_t layer) const {
  std::vector<uint32_t> layers;
  for (const auto& ts : states_) {
    layers.push_back(ts->table->layer_id());
    if (ts->table->layer_id() != layer) continue;
    if (ts->resident == nullptr) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s is served from the %s tier; only tables of the resident tier load into memory "
          "([tables] tiers, --tier %u=resident)",
          ts->table->Describe(), TierName(ts->tier), layer));
    }
    return ts.get();
  }
  return absl::NotFoundError(absl::StrFormat("engramd serves no table for layer %u (it serves %s)",
                                             layer, absl::StrJoin(layers, ", ")));
}

ResidentLoadStatus RowStore::StatusOfLocked(const TableState& ts) const {
  ResidentLoadStatus s;
  s.layer = ts.table->layer_id();
  s.state = ts.load_state;
  s.rows_loaded = ts.resident->rows_loaded();
  s.rows = ts.table->covered().size();
  s.bytes = ts.resident->bytes();
  s.error = ts.load_error;
  return s;
}

absl::StatusOr<ResidentLoadStatus> RowStore::Load(uint32_t layer) {
  absl::StatusOr<TableState*> ts = ResidentStateOf(layer);
  if (!ts.ok()) return ts.status();
  std::lock_guard lock(load_mu_);
  TableState& t = **ts;
  switch (t.load_state) {
    case LoadState::kWaiting:
    case LoadState::kCancelled:
    case LoadState::kFailed:
      if (load_stop_ || !loader_.joinable()) {
        return absl::UnavailableError("engramd's row store is not running its loader");
      }
      t.cancel.store(false);
      t.load_state = LoadState::kQueued;
      t.load_error.clear();
      load_queue_.push_back(&t);
      load_cv_.notify_all();
      break;
    case LoadState::kLoading:
      // A cancel still pending is taken back; one the loader saw already ends in a requeue.
      if (t.cancel.exchange(false)) t.restart = true;
      break;
    case LoadState::kQueued:
    case LoadState::kLoaded:
      break;
  }
  return StatusOfLocked(t);
}

absl::StatusOr<ResidentLoadStatus> RowStore::CancelLoad(uint32_t layer) {
  absl::StatusOr<TableState*> ts = ResidentStateOf(layer);
  if (!ts.ok()) return ts.status();
  std::lock_guard lock(load_mu_);
  TableState& t = **ts;
  if (t.load_state == LoadState::kQueued) {
    std::erase(load_queue_, &t);
    t.load_state = LoadState::kCancelled;
    load_cv_.notify_all();
  } else if (t.load_state == LoadState::kLoading) {
    t.cancel.store(true);  // the loader sets kCancelled when the chunk in progress is done
    t.restart = false;
  }
  return StatusOfLocked(t);
}

absl::StatusOr<ResidentLoadStatus> RowStore::LoadStatus(uint32_t layer) const {
  absl::StatusOr<TableState*> ts = ResidentStateOf(layer);
  if (!ts.ok()) return ts.status();
  std::lock_guard lock(load_mu_);
  return StatusOfLocked(**ts);
}

void RowStore::LoaderLoop() {
  std::unique_lock lock(load_mu_);
  while (true) {
    load_cv_.wait(lock, [&] { return load_stop_ || !load_queue_.empty(); });
    if (load_stop_) break;
    TableState* ts = load_queue_.front();
    load_queue_.pop_front();
    ts->load_state = LoadState::kLoading;
    loading_ = ts;
    lock.unlock();
    LoadOne(*ts);
    lock.lock();
    loading_ = nullptr;
    load_cv_.notify_all();
  }
  loading_ = nullptr;
  load_cv_.notify_all();
}

void RowStore::LoadOne(TableState& ts) {
  const Table& t = *ts.table;
  const uint64_t start = NowNs();
  const uint64_t rows_before = ts.resident->rows_loaded();
  const size_t notices_before = ts.resident->notices().size();  // already reported
  uint64_t next_report = 0;
  absl::Status s = ts.resident->Load(&ts.cancel, [&](uint64_t done, uint64_t total) {
    if (done * 10 < next_report * total && done != total) return;
    next_report = done * 10 / total + 1;
    notice_(absl::StrFormat("resident %s: %u of %u rows loaded (%.0f%%)", t.Describe(), done, total,
                            100.0 * double(done) / double(total)));
  });
  const std::vector<std::string> notices = ts.resident->notices();
  for (size_t i = notices_before; i < notices.size(); ++i) notice_(notices[i]);
  {
    std::lock_guard lock(load_mu_);
    ts.load_state = s.ok()                                     ? LoadState::kLoaded
                    : s.code() == absl::StatusCode::kCancelled ? LoadState::kCancelled
                                                               : LoadState::kFailed;
    ts.load_error = s.ok() || s.code() == absl::StatusCode::kCancelled ? "" : s.ToString();
    const bool restart = std::exchange(ts.restart, false);
    if (restart && s.code() == absl::StatusCode::kCancelled && !load_stop_) {
      // Load() after CancelLoad(): the start wins. Queued first, as it was running.
      ts.cancel.store(false);
      ts.load_state = LoadState::kQueued;
      load_queue_.push_front(&ts);
      return;
    }
  }
  if (!s.ok()) {
    notice_(absl::StrCat("resident ", t.Describe(), ": ", s.ToString(),
                         "; its rows not yet loaded are served from storage",
                         s.code() == absl::StatusCode::kCancelled
                             ? " until `engramctl load` resumes the load"
                             : ""));
    return;
  }
  const double seconds = double(NowNs() - start) / 1e9;
  const uint64_t bytes_read = (ts.resident->rows_loaded() - rows_before) * kRowBytes;
  notice_(absl::StrFormat(
      "resident %s: %s in memory (%s %spages, %s), loaded in %.1f s "
      "(%.0f MB/s)",
      t.Describe(), Gib(ts.resident->bytes()), PageSizeName(ts.resident->page_bytes()),
      ts.resident->huge_pages() ? "huge " : "",
      ts.resident->direct_io() ? "read with O_DIRECT" : "buffered reads", seconds,
      double(bytes_read) / 1e6 / std::max(seconds, 1e-9)));
}

absl::Status RowStore::Gather(const GatherBatch& batch) {
  TableState* ts = StateOf(batch.table);
  if (ts == nullptr || ts->tier == Tier::kStorage) return engine_->Gather(batch);
  const RowRange covered = batch.table->covered();
  for (uint64_t row : batch.rows) {
    // The engine names a bad row exactly as before; let it refuse the batch.
    if (!covered.contains(row)) return engine_->Gather(batch);
  }
  MissScratch& miss = t_scratch;
  miss.rows.clear();
  miss.offsets.clear();
  const uint32_t layer = batch.table->layer_id();
  uint64_t prefetch_used = 0;
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    const uint64_t offset = batch.dest_offsets.empty() ? i * kRowBytes : batch.dest_offsets[i];
    uint8_t* dest = batch.dest + offset;
    bool hit;
    if (ts->tier == Tier::kResident) {
      if (i + kPrefetchRowsAhead < batch.rows.size()) {
        ts->resident->PrefetchRow(batch.rows[i + kPrefetchRowsAhead]);
      }
      hit = ts->resident->CopyRow(batch.rows[i], dest);
    } else {
      // Two stages ahead (base/prefetch.h): the bucket line first, then, half as far ahead
      // (once it has arrived), the slot it names.
      if (i + kPrefetchRowsAhead < batch.rows.size()) {
        cache_->reader().PrefetchBucket(layer, batch.rows[i + kPrefetchRowsAhead]);
      }
      if (i + kPrefetchRowsAhead / 2 < batch.rows.size()) {
        cache_->reader().PrefetchSlot(layer, batch.rows[i + kPrefetchRowsAhead / 2]);
      }
      bool used = false;
      hit = cache_->Lookup(layer, batch.rows[i], dest, &used);
      prefetch_used += used;
    }
    if (!hit) {
      miss.rows.push_back(batch.rows[i]);
      miss.offsets.push_back(offset);
    }
  }
  if (ts->tier == Tier::kCache) {
    cache_->CountLookups(batch.rows.size() - miss.rows.size(), miss.rows.size());
    if (prefetch_used != 0) {
      ts->prefetch_used_rows.fetch_add(prefetch_used, std::memory_order_relaxed);
    }
  }
  ts->requests.fetch_add(1, std::memory_order_relaxed);
  ts->rows.fetch_add(batch.rows.size(), std::memory_order_relaxed);
  ts->hit_rows.fetch_add(batch.rows.size() - miss.rows.size(), std::memory_order_relaxed);
  if (miss.rows.empty()) {
    ts->all_hit_requests.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  return GatherMisses(*ts, batch, miss.rows, miss.offsets);
}

absl::Status RowStore::GatherMisses(TableState& ts, const GatherBatch& batch,
                                    const std::vector<uint64_t>& rows,
                                    const std::vector<uint64_t>& offsets) {
  if (ts.tier == Tier::kResident) {  // still loading: straight into the client's slots
    return engine_->Gather(
        {.table = batch.table, .rows = rows, .dest = batch.dest, .dest_offsets = offsets});
  }
  // Hits read in place count as uses before these rows are admitted (and others evicted).
  FoldTouches(/*wait=*/false);
  // In pieces the miss queue grants (decode steps before prefills, at most miss_depth reads in
  // flight): the buffer a request thread keeps stays small, whatever the request's size
  // (MemoryPlan counts it per thread).
  const uint32_t layer = batch.table->layer_id();
  auto admit = [&](size_t i, const uint8_t* row) {
    std::memcpy(batch.dest + offsets[i], row, kRowBytes);
    // Rows and layers were validated above; an insert cannot fail.
    (void)cache_->Insert(layer, rows[i], row);
  };
  return ReadMisses(engine_, misses_.get(), MissClassOfGather(batch.rows.size()), batch.table, rows,
                    t_scratch.bounce, admit);
}

bool RowStore::Handles(const Table* table) {
  const TableState* ts = StateOf(table);
  return ts != nullptr && ts->tier != Tier::kStorage;
}

absl::Status RowStore::Prefetch(const Table* table, std::span<const uint64_t> rows,
                                PrefetchOutcome* ret_outcome, Admission* pin_for) {
  *ret_outcome = {};
  TableState* ts = StateOf(table);
  if (ts == nullptr || ts->tier == Tier::kStorage) {
    return absl::FailedPreconditionError(
        absl::StrCat("table ", table->Describe(), " is not served from the row store"));
  }
  // A resident table's rows are in memory, or being loaded there in order: nothing to fetch.
  if (ts->tier == Tier::kResident) {
    ret_outcome->held = rows.size();
    return absl::OkStatus();
  }
  const uint32_t layer = table->layer_id();
  MissScratch& miss = t_scratch;
  miss.rows.clear();
  for (uint64_t row : rows) {
    // Pinned here when held: it cannot be evicted before the admission records it.
    if (pin_for != nullptr ? cache_->Pin(layer, row) : cache_->Contains(layer, row)) {
      if (pin_for != nullptr) pin_for->Pinned(layer, row);
      ++ret_outcome->held;
    } else {
      miss.rows.push_back(row);
    }
  }
  if (miss.rows.empty()) return absl::OkStatus();
  FoldTouches(/*wait=*/false);  // as before a gather's misses are admitted
  // Behind every gather's misses in the miss queue; pieces past its bound are dropped.
  const uint64_t held_before = ret_outcome->held;
  auto admit = [&](size_t i, const uint8_t* row) {
    bool inserted = false;
    // Rows were checked against the table when the prefetch was queued.
    if (pin_for != nullptr) {
      bool pinned = false;
      (void)cache_->InsertPinned(layer, miss.rows[i], row, &inserted, &pinned);
      if (pinned) pin_for->Pinned(layer, miss.rows[i]);
    } else {
      (void)cache_->InsertPrefetched(layer, miss.rows[i], row, &inserted);
    }
    // A row a gather admitted meanwhile (or a duplicate in `rows`) was held, not fetched.
    if (inserted) {
      ++ret_outcome->fetched;
    } else {
      ++ret_outcome->held;
    }
  };
  // An admission's rows go behind every hint's: its prefill is further off than a next chunk.
  const MissClass c = pin_for != nullptr ? MissClass::kAdmission : MissClass::kPrefetch;
  absl::Status s = ReadMisses(engine_, misses_.get(), c, table, miss.rows, miss.bounce, admit);
  if (s.ok()) {
    ret_outcome->dropped =
        miss.rows.size() - ret_outcome->fetched - (ret_outcome->held - held_before);
  }
  return s;
}

absl::StatusOr<int> RowStore::CacheReadOnlyFd() {
  if (cache_ == nullptr) {
    return absl::FailedPreconditionError("engramd has no row cache (no table of the cache tier)");
  }
  std::lock_guard<std::mutex> lock(cache_fd_mu_);
  if (cache_read_only_fd_.valid()) return cache_read_only_fd_.get();
  // A memfd's mode starts as 0777, and any holder of a descriptor can open it again through
  // /proc/<pid>/fd with the access its mode allows: owner-read-only leaves a client (without
  // CAP_DAC_OVERRIDE) only reads. The daemon's own descriptor and mapping stay writable.
  const int fd = cache_->fd();
  if (fchmod(fd, S_IRUSR) != 0) {
    return absl::InternalError(
        absl::StrCat("row cache: cannot make its memfd read-only for others: ", strerror(errno)));
  }
  UniqueFd ro(open(absl::StrCat("/proc/self/fd/", fd).c_str(), O_RDONLY | O_CLOEXEC));
  if (!ro.valid()) {
    return absl::InternalError(absl::StrCat(
        "row cache: cannot open its memfd read-only through /proc/self/fd: ", strerror(errno)));
  }
  cache_read_only_fd_ = std::move(ro);
  return cache_read_only_fd_.get();
}

void RowStore::AddTouchPage(std::shared_ptr<CacheTouchPage> page) {
  std::lock_guard<std::mutex> lock(touch_mu_);
  touch_pages_.push_back(std::move(page));
}

void RowStore::FoldTouches(bool wait) const {
  std::unique_lock<std::mutex> lock(touch_mu_, std::defer_lock);
  if (wait) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return;
  }
  if (touch_pages_.empty()) return;
  const auto touch = [&](uint64_t key, uint32_t slot) {
    if (cache_ != nullptr) cache_->Touch(slot, key);
  };
  const auto count = [&](size_t table, uint64_t requests, uint64_t rows) {
    using Counted = CacheTouchPage::Counted;
    // Counters of a table that cannot be read in place (the storage tier, or no such table) are
    // a client's invention: ignored. A resident table's rows read in place are all hits, and
    // its gathers all-hit ones, as the daemon counts its own gathers of a loaded table.
    if (table >= states_.size()) return Counted::kNot;
    TableState& ts = *states_[table];
    if (ts.tier == Tier::kStorage || (ts.tier == Tier::kCache && cache_ == nullptr)) {
      return Counted::kNot;
    }
    ts.requests.fetch_add(requests, std::memory_order_relaxed);
    ts.all_hit_requests.fetch_add(requests, std::memory_order_relaxed);
    ts.rows.fetch_add(rows, std::memory_order_relaxed);
    ts.hit_rows.fetch_add(rows, std::memory_order_relaxed);
    if (ts.tier == Tier::kResident) return Counted::kResident;
    cache_->CountLookups(rows, 0);
    return Counted::kCache;
  };
  // Pages a client's read faulted back in above the capacity go back, at most once a second.
  const int64_t now = NowNs();
  if (cache_ != nullptr && cache_->capacity_slots() < cache_->max_slots() &&
      now - last_release_ns_ > 1'000'000'000) {
    last_release_ns_ = now;
    cache_->ReleaseAboveCapacity();
  }
  // A client's counters past what it could have read are clamped; the first time a page's
  // are, the operator hears of it, naming the session.
  const auto report = [&](const std::string& line) {
    if (notice_) notice_(line);
  };
  for (size_t i = 0; i < touch_pages_.size();) {
    touch_pages_[i]->Fold(touch, count, report);
    if (touch_pages_[i].use_count() == 1) {  // its session ended: this was the last fold
      touch_pages_[i] = std::move(touch_pages_.back());
      touch_pages_.pop_back();
    } else {
      ++i;
    }
  }
}

std::vector<TableStoreStats> RowStore::Stats() const {
  FoldTouches();
  std::vector<TableStoreStats> out;
  for (const auto& ts : states_) {
    TableStoreStats s;
    s.layer_id = ts->table->layer_id();
    s.tier = ts->tier;
#define ENGRAM_STORE_TABLE_LOAD_(field, json_key, tiers, type, metric, help) \
  ENGRAM_STORE_IF_COUNTER_##type(s.field = ts->field.load(std::memory_order_relaxed);)
    ENGRAM_STORE_TABLE_COUNTERS(ENGRAM_STORE_TABLE_LOAD_)
#undef ENGRAM_STORE_TABLE_LOAD_
    if (ts->resident != nullptr) {
      s.resident_rows_loaded = ts->resident->rows_loaded();
      s.resident_bytes = ts->resident->bytes();
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace engram
