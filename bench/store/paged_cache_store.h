// A paged packed table (one 4 KiB page a row) written into a directory on the device to measure
// and served from the cache tier of a RowStore: what the miss benchmarks read through.
//
//   PagedCacheStore b;
//   StoreConfig config;  // the tier and a small cache are set by Open
//   config.cache_bytes = 64ull << 20;
//   if (absl::Status s = b.Open("/var/tmp", "engram-miss-x", 400'000, 0, config); !s.ok()) ...
//   b.store->Gather({.table = b.table(), .rows = rows, .dest = out});
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gather/gather_engine.h"
#include "store/row_store.h"
#include "tables/table.h"

namespace engram::bench {

struct PagedCacheStore {
  std::string work;  // removed with the object
  std::vector<std::unique_ptr<Table>> tables;
  std::unique_ptr<GatherEngine> engine;
  std::unique_ptr<RowStore> store;

  PagedCacheStore() = default;
  PagedCacheStore(const PagedCacheStore&) = delete;
  PagedCacheStore& operator=(const PagedCacheStore&) = delete;
  ~PagedCacheStore();

  // Writes a synthetic table of `rows` rows (layer 14) packed paged into a new directory
  // `dir`/`prefix`-XXXXXX, and serves it from the cache tier (O_DIRECT misses) through an engine
  // of `workers` workers (0: online CPUs) and a store of `config` (tier, pressure off set here).
  absl::Status Open(const std::string& dir, const std::string& prefix, uint64_t rows,
                    uint32_t workers, StoreConfig config);
  const Table* table() const { return tables[0].get(); }
};

}  // namespace engram::bench
