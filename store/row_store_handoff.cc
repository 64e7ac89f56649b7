// RowStore: the row cache adopted from a region an earlier engramd handed over through
// systemd's file-descriptor store, or created empty (cache_handoff.h, docs/row-store.md).
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "store/row_store.h"

namespace engram {
namespace {

// How long a start may spend comparing a kept cache's rows with the table files: well within
// the 300 s of start-up time engramd asks systemd for before the row store's step. Rows not
// compared by then are dropped (read again at their next miss), never served unproven.
constexpr uint64_t kProveBudgetNs = 200'000'000'000;

}  // namespace

absl::StatusOr<std::unique_ptr<RowCache>> RowStore::MakeCache(uint64_t bytes,
                                                              CacheHandoff* handoff) {
  const RowCacheOptions options{
      .max_bytes = bytes, .tables_identity = handoff != nullptr ? handoff->tables_identity : 0};
  if (handoff == nullptr || !handoff->fd.valid()) return RowCache::Create(options, &budget_);
  // Rows are kept for the layers served from the cache tier now, within the rows they cover.
  auto keep = [&](uint32_t layer, uint64_t row) {
    const TableState* ts = StateOfLayer(layer);
    return ts != nullptr && ts->tier == Tier::kCache && ts->table->covered().contains(row);
  };
  RowCacheAdoption a;
  auto adopted = RowCache::Adopt(std::move(handoff->fd), options, &budget_, keep, &a);
  std::string reason;
  RowCacheProof proof;
  const uint64_t prove_start_ns = NowNs();
  if (!adopted.ok()) {
    reason = std::string(adopted.status().message());
  } else {
    NoticeDropped(a.bad_check_by_layer,
                  "fail their check word (row bytes or keys changed after they were written)");
    if (absl::Status s = ProveAdoptedRows(**adopted, &proof); !s.ok()) {
      reason = std::string(s.message());
      adopted->reset();  // its budget goes back before the fresh cache takes it
    }
  }
  if (!reason.empty()) {
    handoff->outcome = absl::StrCat(
        "row cache: discarded the region handed over by the previous engramd, starting empty: ",
        reason);
    notice_(handoff->outcome);
    return RowCache::Create(options, &budget_);
  }
  NoticeDropped(proof.stale_by_layer,
                "differ from the table file now (the file was rewritten in place after they were "
                "cached)");
  handoff->adopted = true;
  const RowCacheStats st = (*adopted)->Stats();
  handoff->outcome = absl::StrFormat(
      "row cache: adopted the region handed over by the previous engramd: %u rows kept of %u "
      "slots (%u torn, %u of layers or rows not cached now, %u duplicates, %u failing their "
      "check word dropped; %u evicted to fit the budget; %u rows compared with the table files "
      "in %.3f s, %u differed and were dropped, %u not compared in time dropped)",
      st.used_slots, (*adopted)->max_slots(), a.torn, a.not_served, a.duplicates, a.bad_check,
      a.evicted_to_fit, proof.compared, static_cast<double>(NowNs() - prove_start_ns) / 1e9,
      proof.stale, proof.unproven);
  notice_(handoff->outcome);
  return std::move(*adopted);
}

Tier RowStore::TierOf(const Table* table) const {
  for (const auto& ts : states_) {
    if (ts->table == table) return ts->tier;
  }
  return Tier::kStorage;
}

const RowStore::TableState* RowStore::StateOfLayer(uint32_t layer) const {
  for (const auto& ts : states_) {
    if (ts->table->layer_id() == layer) return ts.get();
  }
  return nullptr;
}

// Every row held is read from its table file and compared: the rows adopted are the ones a cold
// start would read to warm the cache, so this costs one read of them (through the gather
// engine, a piece of sorted rows at a time) and proves what neither the tables' identity (the
// files' metadata) nor the check words (the slots' integrity) can: that each row is its file's
// now.
absl::Status RowStore::ProveAdoptedRows(RowCache& cache, RowCacheProof* ret_proof) {
  auto read = [&](uint32_t layer, std::span<const uint64_t> rows, uint8_t* dest) -> absl::Status {
    const TableState* ts = StateOfLayer(layer);
    if (ts == nullptr) return absl::InternalError(absl::StrFormat("layer %u is not served", layer));
    absl::Status s;
    if (engine_ != nullptr) {
      s = engine_->Gather({.table = ts->table, .rows = rows, .dest = dest});
    } else {
      for (size_t k = 0; k < rows.size() && s.ok(); ++k) {
        s = ReadRowBlocking(*ts->table, rows[k], dest + k * kRowBytes);
      }
    }
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("reading rows of ", ts->table->Describe(),
                                               " to compare them with the region: ", s.message()));
  };
  return cache.ProveRows(read, NowNs() + kProveBudgetNs, ret_proof);
}

void RowStore::NoticeDropped(const std::map<uint32_t, uint64_t>& by_layer, std::string_view why) {
  for (const auto& [layer, rows] : by_layer) {
    const TableState* ts = StateOfLayer(layer);
    notice_(absl::StrFormat(
        "row cache: %u rows of %s in the region handed over %s: dropped (read from the file at "
        "their next miss)",
        rows, ts != nullptr ? ts->table->Describe() : absl::StrCat("layer ", layer), why));
  }
}

}  // namespace engram
