// What the row store is told to do: each table's tier, its share of the memory budget, the cache
// size and whether memory pressure shrinks the cache. Filled from the [tables] and [memory]
// sections of the configuration file and from engramd's flags; docs/row-store.md explains each
// choice.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace engram {

// Where a table's rows are served from.
enum class Tier : uint8_t {
  kStorage,   // the files, through the page cache or O_DIRECT (the gather engine alone)
  kResident,  // the whole table (or covered range) in a sealed memfd, loaded at start-up or
              // by `engramctl load`
  kCache,     // the files read with O_DIRECT, hot rows kept in the shared row cache
};

inline const char* TierName(Tier tier) {
  switch (tier) {
    case Tier::kStorage:
      return "storage";
    case Tier::kResident:
      return "resident";
    case Tier::kCache:
      return "cache";
  }
  return "?";
}

inline std::optional<Tier> ParseTier(const std::string& text) {
  for (Tier t : {Tier::kStorage, Tier::kResident, Tier::kCache}) {
    if (text == TierName(t)) return t;
  }
  return std::nullopt;
}

struct StoreConfig {
  Tier default_tier = Tier::kStorage;  // [tables] tier
  std::map<uint32_t, Tier> tiers;      // [tables] tiers, by layer id
  uint64_t budget_bytes = 0;  // [memory] budget: all engramd holds (MemoryPlan); 0 = unbounded
  // Of budget_bytes, what the rest of engramd holds (the process, its buffers, the arenas' and
  // the page cache's shares: MemoryPlan); the row store gets the remainder. Set by engramd
  // from the plan, not by a setting.
  uint64_t others_bytes = 0;
  uint64_t cache_bytes = 0;              // [memory] cache: 0 = what the store's share leaves
  bool pressure = true;                  // [memory] pressure: shrink the cache under PSI pressure
  std::string pressure_file;             // [memory] pressure_file: "" = FindMemoryPressureFile()
  uint32_t pressure_interval_ms = 1000;  // [memory] pressure_interval_ms: between two samples
  bool huge_pages = true;                // [memory] huge_pages: resident tables on hugetlb pages
  bool load_at_start = true;             // [memory] load_at_start: else `engramctl load` starts it
  uint64_t load_rate_bytes_per_s = 0;    // [memory] load_rate: bytes/s a load reads; 0 = no limit
  // [memory] miss_depth: device reads of cache-tier misses in flight past which prefill and
  // prefetch misses wait (the miss queue, gather/miss_queue.h); about the queue depth at which
  // the device reaches its read rate.
  uint32_t miss_depth = 64;
  // [memory] miss_shed_ms: how far behind the device may be (the reads ahead of a piece, in ms
  // at its measured rate) before prefetch and admission reads are shed (0: never).
  uint32_t miss_shed_ms = 1000;
  // [memory] admit_rows, admit_session_rows, admit_ttl_ms: rows admission prefetches may pin in
  // the row cache in all (0: a quarter of its capacity; never more than half) and per session,
  // and the longest an admission stays pinned unreleased (store/admissions.h).
  uint64_t admit_rows = 0;
  uint64_t admit_session_rows = 262144;
  uint32_t admit_ttl_ms = 30000;

  // The row store's cap: resident tables + cache (0 = unbounded).
  uint64_t store_budget_bytes() const {
    return budget_bytes == 0 ? 0 : budget_bytes - std::min(budget_bytes, others_bytes);
  }

  Tier TierOf(uint32_t layer) const {
    auto it = tiers.find(layer);
    return it == tiers.end() ? default_tier : it->second;
  }
};

}  // namespace engram
