// RowStore's plan of the row cache: what a size holds, of which tables, and where the rest goes,
// computed by RowCache::Size as the cache sizes itself (row_store.h).
#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "store/row_store.h"

namespace engram {
namespace {

std::string Bytes(uint64_t bytes) {
  if (bytes < (1ull << 30)) return absl::StrFormat("%.1f MiB", double(bytes) / (1 << 20));
  return absl::StrFormat("%.2f GiB", double(bytes) / (1 << 30));
}

double Percent(uint64_t part, uint64_t whole) { return whole == 0 ? 0 : 100.0 * part / whole; }

// "layer 14's 100000000 rows (29.8 %)" or "the 200000000 rows of layers 1 and 14 (14.9 %)".
std::string OfTables(uint64_t slots, const std::vector<const Table*>& cached) {
  uint64_t rows = 0;
  std::vector<std::string> layers;
  for (const Table* t : cached) {
    rows += t->covered().end - t->covered().begin;
    layers.push_back(std::to_string(t->layer_id()));
  }
  const double share = std::min(100.0, Percent(slots, rows));
  if (cached.size() == 1) {
    return absl::StrFormat("%.1f %% of layer %s's %u rows", share, layers[0], rows);
  }
  return absl::StrFormat("%.1f %% of the %u rows of layers %s, which share it", share, rows,
                         absl::StrJoin(layers, ", "));
}

}  // namespace

std::optional<RowCacheSizing> RowStore::PlanCache(
    const StoreConfig& config, const std::vector<std::unique_ptr<Table>>& tables) {
  if (std::none_of(tables.begin(), tables.end(),
                   [&](const auto& t) { return config.TierOf(t->layer_id()) == Tier::kCache; })) {
    return std::nullopt;
  }
  MemoryBudget budget(config.store_budget_bytes());
  if (!ReserveResident(config, tables, &budget).ok()) return std::nullopt;
  // As Create gives the cache its size and RowCache::Create bounds it by the budget.
  const uint64_t bytes = config.cache_bytes != 0 ? config.cache_bytes : budget.available();
  return RowCache::Size(budget.bounded() ? std::min(bytes, budget.available()) : bytes);
}

std::string RowStore::DescribeCache(const RowCacheSizing& sizing, const StoreConfig& config,
                                    const std::vector<const Table*>& cached) {
  std::string asked;
  if (config.cache_bytes == 0) {
    asked = absl::StrFormat(
        "%s (what the row store's share of [memory] budget leaves after the "
        "resident tables)",
        Bytes(sizing.max_bytes));
  } else if (sizing.max_bytes < config.cache_bytes) {
    asked = absl::StrFormat(
        "%s ([memory] cache %s, less what the row store's share of [memory] "
        "budget does not leave)",
        Bytes(sizing.max_bytes), Bytes(config.cache_bytes));
  } else {
    asked = absl::StrFormat("%s ([memory] cache)", Bytes(sizing.max_bytes));
  }
  const uint64_t per_slot = sizing.slots == 0 ? 0 : sizing.slot_header_bytes / sizing.slots;
  const uint64_t per_row_kept =
      sizing.slots == 0 ? 0 : (sizing.bookkeeping_bytes + sizing.slots - 1) / sizing.slots;
  return absl::StrFormat(
      "row cache: %s holds %u rows (%s of row data, %u bytes a row), %s; the rest: %s of slot "
      "headers (%u bytes a row: sequence, key, check), %s of index (%u buckets of %u bytes: a "
      "power of two, at least 2 a row), %s of the daemon's bookkeeping (about %u bytes a row: "
      "eviction policy and ghost list), %s unused",
      asked, sizing.slots, Bytes(sizing.row_bytes), kRowBytes, OfTables(sizing.slots, cached),
      Bytes(sizing.slot_header_bytes), per_slot, Bytes(sizing.index_bytes), sizing.buckets,
      sizeof(RowCacheBucket), Bytes(sizing.bookkeeping_bytes), per_row_kept,
      Bytes(sizing.unused_bytes));
}

}  // namespace engram
