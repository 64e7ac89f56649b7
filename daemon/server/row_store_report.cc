// RowStore's part of engramctl's replies and of the Prometheus metrics: tier, store bytes,
// budget, hit rate and all-hit fraction per table, cache occupancy and evictions.
#include "daemon/server/row_store.h"
#include "daemon/ops/escape.h"

namespace engram {
namespace {

using json = nlohmann::json;

double Ratio(uint64_t part, uint64_t whole) { return whole == 0 ? 0.0 : double(part) / whole; }

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
      store["cache"] = {{"bytes", c.bytes},
                        {"resident_bytes", c.resident_bytes},
                        {"capacity_rows", c.capacity_slots},
                        {"configured_rows", cache_target_slots_},
                        {"used_rows", c.used_slots},
                        {"hits", c.hits},
                        {"misses", c.misses},
                        {"inserts", c.inserts},
                        {"evictions", c.evictions},
                        {"hit_rate", Ratio(c.hits, c.hits + c.misses)}};
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
      (*t)["resident_rows_loaded"] = s.resident_rows_loaded;
      (*t)["resident_memory_bytes"] = s.resident_bytes;
      (*t)["resident_loaded"] = r->loaded();
      if (absl::StatusOr<ResidentLoadStatus> l = LoadStatus(s.layer_id); l.ok()) {
        (*t)["resident_load_state"] = LoadStateName(l->state);
        if (!l->error.empty()) (*t)["resident_load_error"] = EscapeBytes(l->error);
      }
      (*t)["resident_huge_pages"] = r->huge_pages();
    }
    if (command == "stats" && s.tier != Tier::kStorage) {
      (*t)["store_requests"] = s.requests;
      (*t)["store_all_hit_requests"] = s.all_hit_requests;
      (*t)["store_all_hit_fraction"] = Ratio(s.all_hit_requests, s.requests);
      (*t)["store_rows"] = s.rows;
      (*t)["store_hit_rows"] = s.hit_rows;
      (*t)["store_hit_rate"] = Ratio(s.hit_rows, s.rows);
    }
  }
}

void RowStore::AddMetrics(metrics::Exposition* e) const {
  e->Gauge("engram_store_budget_bytes", "The row store's memory budget (0: unbounded)", {},
           double(budget_.budget()));
  e->Gauge("engram_store_bytes", "Bytes the row store holds (resident tables and cache)", {},
           double(budget_.used()));
  for (const TableStoreStats& s : Stats()) {
    const metrics::Labels l = {{"table", std::to_string(s.layer_id)}, {"tier", TierName(s.tier)}};
    e->Gauge("engram_store_table_info", "The tier each table is served from", l, 1);
    if (s.tier == Tier::kStorage) continue;
    const metrics::Labels t = {{"table", std::to_string(s.layer_id)}};
    e->Counter("engram_store_requests_total", "Gathers through the row store", t,
               double(s.requests));
    e->Counter("engram_store_all_hit_requests_total",
               "Gathers answered wholly from memory (no engine, no I/O)", t,
               double(s.all_hit_requests));
    e->Counter("engram_store_rows_total", "Rows asked of the row store", t, double(s.rows));
    e->Counter("engram_store_hit_rows_total", "Rows copied from memory", t, double(s.hit_rows));
    if (s.tier == Tier::kResident) {
      e->Gauge("engram_store_resident_rows", "Rows of a resident table in memory", t,
               double(s.resident_rows_loaded));
      e->Gauge("engram_store_resident_bytes", "Memory of a resident table", t,
               double(s.resident_bytes));
    }
  }
  if (cache_ == nullptr) return;
  const RowCacheStats c = cache_->Stats();
  e->Gauge("engram_cache_bytes", "Bytes the row cache accounts for (slots and index)", {},
           double(c.bytes));
  e->Gauge("engram_cache_resident_bytes", "Bytes of the row cache holding pages", {},
           double(c.resident_bytes));
  e->Gauge("engram_cache_capacity_rows", "Rows the row cache may hold now", {},
           double(c.capacity_slots));
  e->Gauge("engram_cache_configured_rows", "Rows the row cache holds without memory pressure", {},
           double(cache_target_slots_));
  e->Gauge("engram_cache_rows", "Rows in the row cache", {}, double(c.used_slots));
  e->Counter("engram_cache_hits_total", "Row cache lookups that hit", {}, double(c.hits));
  e->Counter("engram_cache_misses_total", "Row cache lookups that missed", {}, double(c.misses));
  e->Counter("engram_cache_evictions_total", "Rows evicted from the row cache", {},
             double(c.evictions));
}

}  // namespace engram
