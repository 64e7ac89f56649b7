// RowStore: splitting gathers into store hits and engine misses, loading resident tables, and
// reporting the store to engramctl and the metrics.
#include "daemon/server/row_store.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "protocol/clock.h"

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
  MemoryBudget budget(config.budget_bytes);
  bool any_cache = false;
  for (const auto& t : tables) {
    const Tier tier = config.TierOf(t->layer_id());
    any_cache |= tier == Tier::kCache;
    if (tier != Tier::kResident) continue;
    // The largest size the resident copy can take (rounded up to a 2 MiB page).
    const uint64_t bytes = (t->data_bytes() + (2ull << 20) - 1) / (2ull << 20) * (2ull << 20);
    if (absl::Status s = budget.Reserve(bytes, "resident copy of " + t->Describe()); !s.ok()) {
      return s;
    }
  }
  if (any_cache && config.cache_bytes == 0 && !budget.bounded()) {
    return absl::InvalidArgumentError(
        "a table uses the cache tier but neither [memory] cache nor [memory] budget is set: the "
        "cache needs a size");
  }
  if (any_cache && config.cache_bytes == 0 && budget.available() < (1u << 20)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the resident tables leave %u bytes of the %u-byte [memory] budget to the row cache",
        budget.available(), budget.budget()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RowStore>> RowStore::Create(
    const StoreConfig& config, const std::vector<std::unique_ptr<Table>>& tables,
    GatherEngine* engine, Notice notice) {
  if (absl::Status s = Validate(config, tables); !s.ok()) return s;
  std::unique_ptr<RowStore> store(new RowStore(config, engine, std::move(notice)));
  bool any_cache = false;
  for (const auto& t : tables) {
    auto ts = std::make_unique<TableState>();
    ts->table = t.get();
    ts->tier = config.TierOf(t->layer_id());
    if (ts->tier == Tier::kResident) {
      auto rt = ResidentTable::Create(*t, &store->budget_, {.huge_pages = config.huge_pages});
      if (!rt.ok()) return rt.status();
      for (const std::string& n : (*rt)->notices()) store->notice_(n);
      ts->resident = std::move(*rt);
    }
    any_cache |= ts->tier == Tier::kCache;
    store->states_.push_back(std::move(ts));
  }
  if (any_cache) {
    uint64_t bytes = config.cache_bytes != 0 ? config.cache_bytes : store->budget_.available();
    auto cache = RowCache::Create({.max_bytes = bytes}, &store->budget_);
    if (!cache.ok()) return cache.status();
    store->cache_ = std::move(*cache);
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
  cancel_.store(true);
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

void RowStore::StartLoading() {
  if (cache_ != nullptr && config_.pressure) {
    pressure_ = std::make_unique<PressureMonitor>(cache_.get(), cache_target_slots_,
                                                  PressureOptions{}, notice_);
    if (absl::Status s = pressure_->Start(); !s.ok()) {
      notice_(absl::StrCat("row cache keeps its size under memory pressure: ", s.message()));
      pressure_.reset();
    } else {
      notice_(absl::StrCat("row cache follows memory pressure from ", pressure_->path()));
    }
  }
  bool any = false;
  for (const auto& ts : states_) any |= ts->resident != nullptr;
  if (!any) return;
  loading_done_.store(false);
  loader_ = std::thread([this] { LoadAll(); });
}

void RowStore::WaitLoaded() {
  if (loader_.joinable()) loader_.join();
}

void RowStore::LoadAll() {
  for (const auto& ts : states_) {
    if (ts->resident == nullptr) continue;
    const Table& t = *ts->table;
    const uint64_t start = NowNs();
    const size_t notices_before = ts->resident->notices().size();  // already reported
    uint64_t next_report = 0;
    absl::Status s = ts->resident->Load(&cancel_, [&](uint64_t done, uint64_t total) {
      if (done * 10 < next_report * total && done != total) return;
      next_report = done * 10 / total + 1;
      notice_(absl::StrFormat("resident %s: %u of %u rows loaded (%.0f%%)", t.Describe(), done,
                              total, 100.0 * double(done) / double(total)));
    });
    if (!s.ok()) {
      notice_(absl::StrCat("resident ", t.Describe(), ": ", s.ToString(),
                           "; its rows not yet loaded are served from storage"));
      if (s.code() == absl::StatusCode::kCancelled) break;
      continue;
    }
    const double seconds = double(NowNs() - start) / 1e9;
    notice_(absl::StrFormat("resident %s: %s in memory (%s, %s), loaded in %.1f s (%.0f MB/s)",
                            t.Describe(), Gib(ts->resident->bytes()),
                            ts->resident->huge_pages() ? "2 MiB pages" : "4 KiB pages",
                            ts->resident->direct_io() ? "read with O_DIRECT" : "buffered reads",
                            seconds, double(t.data_bytes()) / 1e6 / std::max(seconds, 1e-9)));
    const std::vector<std::string> notices = ts->resident->notices();
    for (size_t i = notices_before; i < notices.size(); ++i) notice_(notices[i]);
  }
  loading_done_.store(true);
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
      hit = ts->resident->CopyRow(batch.rows[i], dest);
    } else {
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
  std::vector<uint8_t>& bounce = t_scratch.bounce;
  if (bounce.size() < rows.size() * kRowBytes) bounce.resize(rows.size() * kRowBytes);
  absl::Status s = engine_->Gather({.table = batch.table, .rows = rows, .dest = bounce.data()});
  if (!s.ok()) return s;
  const uint32_t layer = batch.table->layer_id();
  for (size_t i = 0; i < rows.size(); ++i) {
    const uint8_t* row = bounce.data() + i * kRowBytes;
    std::memcpy(batch.dest + offsets[i], row, kRowBytes);
    // Rows and layers were validated above; an insert cannot fail.
    (void)cache_->Insert(layer, rows[i], row);
  }
  return absl::OkStatus();
}

bool RowStore::Handles(const Table* table) {
  const TableState* ts = StateOf(table);
  return ts != nullptr && ts->tier != Tier::kStorage;
}

absl::Status RowStore::Prefetch(const Table* table, std::span<const uint64_t> rows,
                                PrefetchOutcome* ret_outcome) {
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
    if (cache_->Contains(layer, row)) {
      ++ret_outcome->held;
    } else {
      miss.rows.push_back(row);
    }
  }
  if (miss.rows.empty()) return absl::OkStatus();
  std::vector<uint8_t>& bounce = miss.bounce;
  if (bounce.size() < miss.rows.size() * kRowBytes) bounce.resize(miss.rows.size() * kRowBytes);
  absl::Status s = engine_->Gather({.table = table, .rows = miss.rows, .dest = bounce.data()});
  if (!s.ok()) return s;
  for (size_t i = 0; i < miss.rows.size(); ++i) {
    bool inserted = false;
    // Rows were checked against the table when the prefetch was queued.
    (void)cache_->InsertPrefetched(layer, miss.rows[i], bounce.data() + i * kRowBytes, &inserted);
    // A row a gather admitted meanwhile (or a duplicate in `rows`) was held, not fetched.
    if (inserted) {
      ++ret_outcome->fetched;
    } else {
      ++ret_outcome->held;
    }
  }
  return absl::OkStatus();
}

std::vector<TableStoreStats> RowStore::Stats() const {
  std::vector<TableStoreStats> out;
  for (const auto& ts : states_) {
    TableStoreStats s;
    s.layer_id = ts->table->layer_id();
    s.tier = ts->tier;
    s.requests = ts->requests.load(std::memory_order_relaxed);
    s.all_hit_requests = ts->all_hit_requests.load(std::memory_order_relaxed);
    s.rows = ts->rows.load(std::memory_order_relaxed);
    s.hit_rows = ts->hit_rows.load(std::memory_order_relaxed);
    s.prefetch_used_rows = ts->prefetch_used_rows.load(std::memory_order_relaxed);
    if (ts->resident != nullptr) {
      s.resident_rows_loaded = ts->resident->rows_loaded();
      s.resident_bytes = ts->resident->bytes();
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace engram
