// RowStore's part of engramctl's replies and of the Prometheus metrics: tier, store bytes,
// budget, hit rate and all-hit fraction per table, cache occupancy and evictions.
#include "base/escape.h"
#include "base/metric_sink.h"
#include "store/row_store.h"

namespace engram {
namespace {

using json = nlohmann::json;

double Ratio(uint64_t part, uint64_t whole) { return whole == 0 ? 0.0 : double(part) / whole; }

#define ENGRAM_STORE_GROWS_COUNTER true
#define ENGRAM_STORE_GROWS_GAUGE false
#define ENGRAM_STORE_RESIDENT_ONLY_MEMORY false
#define ENGRAM_STORE_RESIDENT_ONLY_RESIDENT true

struct StoreCounterInfo {
  const char* json_key;
  const char* metric;
  const char* help;
  bool grows;          // COUNTER, else GAUGE
  bool resident_only;  // tiers RESIDENT, else MEMORY
};

// Calls fn(info, value) for each entry of ENGRAM_STORE_TABLE_COUNTERS that the table's tier
// reports (a table of the storage tier reports none).
template <typename Fn>
void ForEachStoreTableCounter(const TableStoreStats& s, Fn&& fn) {
  if (s.tier == Tier::kStorage) return;
#define ENGRAM_STORE_TABLE_EACH_(field, json_key, tiers, type, metric, help) \
  if (!ENGRAM_STORE_RESIDENT_ONLY_##tiers || s.tier == Tier::kResident) {    \
    fn(StoreCounterInfo{json_key, metric, help, ENGRAM_STORE_GROWS_##type,   \
                        ENGRAM_STORE_RESIDENT_ONLY_##tiers},                 \
       s.field);                                                             \
  }
  ENGRAM_STORE_TABLE_COUNTERS(ENGRAM_STORE_TABLE_EACH_)
#undef ENGRAM_STORE_TABLE_EACH_
}

// `value` is the counter's own (nanoseconds for a key ending in _ns); the metric is in base units.
void AddSample(const StoreCounterInfo& c, const MetricLabels& labels, double value, MetricSink* e) {
  value *= StoreMetricScale(c.json_key);
  if (c.grows) {
    e->Counter(c.metric, c.help, labels, value);
  } else {
    e->Gauge(c.metric, c.help, labels, value);
  }
}

// A class's piece wait at quantile q, in µs (the upper edge of its log2 bucket).
double WaitQuantileUs(const MissClassStats& s, double q) {
  const uint64_t ns = Log2QuantileNs(s.wait_buckets, q);
  return ns == UINT64_MAX ? -1.0 : double(ns) / 1e3;
}

// The miss queue in status: its depth, the device's measured read rate, the demand on it and
// its backlog, and each class.
json MissQueueJson(const MissQueueStats& q) {
  json classes = json::object();
  for (int c = 0; c < kMissClasses; ++c) {
    const MissClassStats& s = q.classes[c];
    json one;
#define ENGRAM_MISS_JSON_(field, json_key, type, metric, help) one[json_key] = s.field;
    ENGRAM_MISS_CLASS_COUNTERS(ENGRAM_MISS_JSON_)
#undef ENGRAM_MISS_JSON_
    one["wait_p50_us"] = WaitQuantileUs(s, 0.5);
    one["wait_p99_us"] = WaitQuantileUs(s, 0.99);
    classes[MissClassName(static_cast<MissClass>(c))] = one;
  }
  return {{"depth", q.depth},
          {"completed_reads", q.completed_reads},
          {"read_rate_per_s", q.read_rate_per_s},
          {"demand_per_s", q.demand_per_s},
          {"backlog_s", q.backlog_s},
          {"load", q.load},
          {"classes", classes}};
}

}  // namespace

json* ControlTableEntry(json* tables, uint32_t layer) {
  if (tables == nullptr || !tables->is_array()) return nullptr;
  for (json& t : *tables) {
    if (t.contains("layer") && t["layer"] == layer) return &t;
  }
  return nullptr;
}

void RowStore::AddControlFields(const std::string& command, json* out) const {
  const std::vector<TableStoreStats> stats = Stats();
  if (command == "status") {
    uint64_t resident = 0, requests = 0, all_hit = 0, rows = 0, hits = 0;
    for (const TableStoreStats& s : stats) {
      resident += s.resident_bytes;
      requests += s.requests;
      all_hit += s.all_hit_requests;
      rows += s.rows;
      hits += s.hit_rows;
    }
    json store = {{"budget_bytes", budget_.budget()},
                  {"store_bytes", budget_.used()},
                  {"resident_bytes", resident},
                  {"loading", Loading()},
                  {"requests", requests},
                  {"all_hit_fraction", Ratio(all_hit, requests)},
                  {"hit_rate", Ratio(hits, rows)}};
    if (cache_ != nullptr) {
      const RowCacheStats c = cache_->Stats();
      json cache = {{"configured_rows", cache_target_slots_},
                    {"hit_rate", Ratio(c.hits, c.hits + c.misses)}};
#define ENGRAM_ROW_CACHE_JSON_(field, json_key, type, metric, help) cache[json_key] = c.field;
      ENGRAM_ROW_CACHE_COUNTERS(ENGRAM_ROW_CACHE_JSON_)
#undef ENGRAM_ROW_CACHE_JSON_
      store["cache"] = cache;
    }
    if (misses_ != nullptr) store["misses"] = MissQueueJson(misses_->Stats());
    if (admissions_ != nullptr) {
      const AdmissionStats a = admissions_->Stats();
      json admissions;
#define ENGRAM_ADMISSION_JSON_(field, json_key, type, metric, help) admissions[json_key] = a.field;
      ENGRAM_ADMISSION_COUNTERS(ENGRAM_ADMISSION_JSON_)
#undef ENGRAM_ADMISSION_JSON_
      store["admissions"] = admissions;
    }
    (*out)["store"] = store;
    // "rows_served" and "batches" count what clients asked for. For tables of the store's tiers
    // the engine sees only the misses, so their engine counts give way to the store's.
    if (out->contains("rows_served") && out->contains("batches")) {
      uint64_t served = (*out)["rows_served"], batches = (*out)["batches"];
      for (const TableGatherStats& e : engine_->Stats()) {
        for (const TableStoreStats& st : stats) {
          if (st.layer_id != e.layer_id || st.tier == Tier::kStorage) continue;
          served += st.rows - e.rows_requested;
          batches += st.requests - e.batches;
        }
      }
      (*out)["rows_served"] = served;
      (*out)["batches"] = batches;
    }
    return;
  }
  if (command != "tables" && command != "stats") return;
  json* tables = out->contains("tables") ? &(*out)["tables"] : nullptr;
  for (const TableStoreStats& s : stats) {
    json* t = ControlTableEntry(tables, s.layer_id);
    if (t == nullptr) continue;
    (*t)["tier"] = TierName(s.tier);
    if (s.tier == Tier::kResident) {
      const ResidentTable* r = resident(s.layer_id);
      (*t)["resident_loaded"] = r->loaded();
      if (absl::StatusOr<ResidentLoadStatus> l = LoadStatus(s.layer_id); l.ok()) {
        (*t)["resident_load_state"] = LoadStateName(l->state);
        if (!l->error.empty()) (*t)["resident_load_error"] = Utf8Text(l->error);
      }
      (*t)["resident_huge_pages"] = r->huge_pages();
      (*t)["resident_page_bytes"] = r->page_bytes();
    }
    if (s.tier == Tier::kStorage) continue;
    // The counters: in stats all of the table's tiers, in tables the resident table's.
    ForEachStoreTableCounter(s, [&](const StoreCounterInfo& c, uint64_t v) {
      if (command == "stats" || c.resident_only) (*t)[c.json_key] = v;
    });
    if (command == "stats") {
      (*t)["store_all_hit_fraction"] = Ratio(s.all_hit_requests, s.requests);
      (*t)["store_hit_rate"] = Ratio(s.hit_rows, s.rows);
    }
  }
}

void RowStore::AddMetrics(MetricSink* e) const {
  // The row store's share of the budget is engram_memory_budget_split_bytes{piece="store"}.
  e->Gauge("engram_store_bytes", "Bytes the row store holds (resident tables and cache)", {},
           double(budget_.used()));
  for (const TableStoreStats& s : Stats()) {
    const MetricLabels l = {{"table", std::to_string(s.layer_id)}, {"tier", TierName(s.tier)}};
    e->Gauge("engram_store_table_info", "The tier each table is served from", l, 1);
    if (s.tier == Tier::kStorage) continue;
    const MetricLabels t = {{"table", std::to_string(s.layer_id)}};
    ForEachStoreTableCounter(
        s, [&](const StoreCounterInfo& c, uint64_t v) { AddSample(c, t, double(v), e); });
  }
  if (misses_ != nullptr) {
    const MissQueueStats q = misses_->Stats();
    e->Gauge("engram_miss_queue_depth", "Device reads of cache-tier misses in flight at most", {},
             double(q.depth));
    e->Gauge("engram_miss_queue_read_rate",
             "Missed rows read per second while reads were in flight (the device's rate)", {},
             q.read_rate_per_s);
    e->Gauge("engram_miss_queue_demand_rate",
             "Missed rows asked of the device per second, over the last second", {},
             q.demand_per_s);
    e->Gauge("engram_miss_queue_backlog_seconds",
             "Missed rows waiting and in flight, in seconds at the device's read rate", {},
             q.backlog_s);
    for (int c = 0; c < kMissClasses; ++c) {
      const MissClassStats& s = q.classes[c];
      const MetricLabels l = {{"class", MissClassName(static_cast<MissClass>(c))}};
#define ENGRAM_MISS_METRIC_(field, json_key, type, metric, help) \
  AddSample({json_key, metric, help, ENGRAM_STORE_GROWS_##type, false}, l, double(s.field), e);
      ENGRAM_MISS_CLASS_COUNTERS(ENGRAM_MISS_METRIC_)
#undef ENGRAM_MISS_METRIC_
      e->Log2Histogram("engram_miss_queue_piece_wait_seconds",
                       "How long pieces of misses waited in the queue for the device", l,
                       s.wait_buckets.data(), s.wait_buckets.size(), s.wait_ns);
    }
  }
  if (cache_ == nullptr) return;
  const RowCacheStats c = cache_->Stats();
  e->Gauge("engram_cache_configured_rows", "Rows the row cache holds without memory pressure", {},
           double(cache_target_slots_));
#define ENGRAM_ROW_CACHE_METRIC_(field, json_key, type, metric, help) \
  AddSample({json_key, metric, help, ENGRAM_STORE_GROWS_##type, false}, {}, double(c.field), e);
  ENGRAM_ROW_CACHE_COUNTERS(ENGRAM_ROW_CACHE_METRIC_)
#undef ENGRAM_ROW_CACHE_METRIC_
  const AdmissionStats a = admissions_->Stats();
#define ENGRAM_ADMISSION_METRIC_(field, json_key, type, metric, help) \
  AddSample({json_key, metric, help, ENGRAM_STORE_GROWS_##type, false}, {}, double(a.field), e);
  ENGRAM_ADMISSION_COUNTERS(ENGRAM_ADMISSION_METRIC_)
#undef ENGRAM_ADMISSION_METRIC_
}

}  // namespace engram
