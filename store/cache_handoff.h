// Keeping the row cache across restarts, the store's part: the identity of the tables its rows
// were read from, and what RowStore::Create is handed (docs/row-store.md, "Across restarts").
// The descriptors come from systemd and go back to it through engramd (daemon/ops/fd_store.h).
//
//   PassedFds passed = TakePassedFds();                 // before anything else reads LISTEN_FDS
//   CacheHandoff handoff{.fd = std::move(passed.row_cache), .tables_identity = TablesIdentity(t)};
//   auto store = RowStore::Create(config, t, engine, notice, &handoff);  // adopts or discards
//   StoreRowCacheFd(store->cache()->fd(), handoff.adopted);  // FDSTORE=1, FDNAME=row-cache
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "tables/table.h"

namespace engram {

// A hash of what the served tables are: per table its layer, rows, covered range, layout and
// row parts, and per file its path, device, inode, size and modification time (ns). A file
// replaced, repacked, touched or moved, a layer added or dropped, or another row range changes
// it; restarting engramd on the same files does not. Never 0. It is metadata, a cheap first
// filter: a file rewritten in place with its modification time put back keeps it, so the rows
// of a region it admits are still each compared with their file (RowCache::ProveRows).
uint64_t TablesIdentity(const std::vector<std::unique_ptr<Table>>& tables);

// What RowStore::Create does with a row cache region handed over, and what it did.
struct CacheHandoff {
  UniqueFd fd;                   // the region handed over (invalid: none)
  uint64_t tables_identity = 0;  // recorded in the region; a region naming another is discarded
  bool adopted = false;          // out: the region was adopted
  std::string outcome;           // out: what happened, for the log (empty: no region)
};

}  // namespace engram
