// RowStore: the row cache adopted from a region an earlier engramd handed over through
// systemd's file-descriptor store, or created empty (cache_handoff.h, docs/row-store.md).
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "store/row_store.h"

namespace engram {
namespace {

// Rows of an adopted region compared with the table files before it is trusted: enough to
// catch a region whose rows are not those of the files (the files rewritten in place within
// one mtime tick, memory scribbled on) with near certainty when many rows are wrong, at the
// cost of this many blocking reads at start.
constexpr size_t kAdoptSamples = 64;

}  // namespace

absl::StatusOr<std::unique_ptr<RowCache>> RowStore::MakeCache(uint64_t bytes,
                                                              CacheHandoff* handoff) {
  const RowCacheOptions options{
      .max_bytes = bytes, .tables_identity = handoff != nullptr ? handoff->tables_identity : 0};
  if (handoff == nullptr || !handoff->fd.valid()) return RowCache::Create(options, &budget_);
  // Rows are kept for the layers served from the cache tier now, within the rows they cover.
  // A reservoir of kept keys (fixed seed: a start is reproducible) is checked against storage.
  std::vector<uint64_t> sample;
  uint64_t seen = 0;
  std::mt19937_64 rng(0x5eed);
  auto keep = [&](uint32_t layer, uint64_t row) {
    for (const auto& ts : states_) {
      if (ts->table->layer_id() != layer) continue;
      if (ts->tier != Tier::kCache || !ts->table->covered().contains(row)) return false;
      const uint64_t key = RowCacheKey(layer, row);
      if (sample.size() < kAdoptSamples) {
        sample.push_back(key);
      } else if (const uint64_t j = rng() % (seen + 1); j < kAdoptSamples) {
        sample[j] = key;
      }
      ++seen;
      return true;
    }
    return false;
  };
  RowCacheAdoption a;
  auto adopted = RowCache::Adopt(std::move(handoff->fd), options, &budget_, keep, &a);
  std::string reason;
  if (!adopted.ok()) {
    reason = std::string(adopted.status().message());
  } else if (reason = CheckAdoptedRows(**adopted, sample); !reason.empty()) {
    adopted->reset();  // its budget goes back before the fresh cache takes it
  }
  if (!reason.empty()) {
    handoff->outcome = absl::StrCat(
        "row cache: discarded the region handed over by the previous engramd, starting empty: ",
        reason);
    notice_(handoff->outcome);
    return RowCache::Create(options, &budget_);
  }
  handoff->adopted = true;
  const RowCacheStats st = (*adopted)->Stats();
  handoff->outcome = absl::StrFormat(
      "row cache: adopted the region handed over by the previous engramd: %u rows kept of %u "
      "slots (%u torn, %u of layers or rows not cached now, %u duplicates dropped; %u evicted "
      "to fit the budget; %u rows checked against the table files)",
      st.used_slots, (*adopted)->max_slots(), a.torn, a.not_served, a.duplicates, a.evicted_to_fit,
      std::min<uint64_t>(sample.size(), a.kept));
  notice_(handoff->outcome);
  return std::move(*adopted);
}

Tier RowStore::TierOf(const Table* table) const {
  for (const auto& ts : states_) {
    if (ts->table == table) return ts->tier;
  }
  return Tier::kStorage;
}

std::string RowStore::CheckAdoptedRows(RowCache& cache, std::span<const uint64_t> keys) {
  uint8_t cached[kRowBytes];
  uint8_t stored[kRowBytes];
  for (const uint64_t key : keys) {
    const auto layer = static_cast<uint32_t>((key >> kRowCacheRowBits) - 1);
    const uint64_t row = key & ((uint64_t{1} << kRowCacheRowBits) - 1);
    // Not held (a duplicate dropped, or evicted to fit the budget): nothing to compare.
    if (!cache.reader().Lookup(layer, row, cached)) continue;
    const Table* table = nullptr;
    for (const auto& ts : states_) {
      if (ts->table->layer_id() == layer) table = ts->table;
    }
    if (table == nullptr) return absl::StrFormat("layer %u is not served", layer);
    if (absl::Status s = ReadRowBlocking(*table, row, stored); !s.ok()) {
      return absl::StrCat("reading row ", row, " of ", table->Describe(),
                          " to check it: ", s.message());
    }
    if (std::memcmp(cached, stored, kRowBytes) != 0) {
      return absl::StrFormat("row %u of %s in the region differs from the table file", row,
                             table->Describe());
    }
  }
  return "";
}

}  // namespace engram
