// Keeping the row cache across restarts: the identity of the tables its rows were read from,
// the descriptors systemd passes at start (the listening socket of socket activation and the
// row cache's memfd from the file-descriptor store, told apart by name), and handing the memfd
// to systemd's file-descriptor store once the cache exists (docs/row-store.md, "Across
// restarts"; docs/operations.md, "Restarts and upgrades").
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

#include "protocol/unique_fd.h"
#include "tables/table.h"

namespace engram {

// The name the row cache's memfd is stored under (FDNAME=) and passed back with
// ($LISTEN_FDNAMES).
inline constexpr char kRowCacheFdName[] = "row-cache";

// A hash of what the served tables are: per table its layer, rows, covered range, layout and
// row parts, and per file its path, device, inode, size and modification time (ns). A file
// replaced, repacked, touched or moved, a layer added or dropped, or another row range changes
// it; restarting engramd on the same files does not. Never 0.
uint64_t TablesIdentity(const std::vector<std::unique_ptr<Table>>& tables);

// What systemd passed at start ($LISTEN_FDS / $LISTEN_FDNAMES).
struct PassedFds {
  int socket_fd = -1;  // the first fd not named kRowCacheFdName (socket activation), or -1
  UniqueFd row_cache;  // the fd named kRowCacheFdName (the first one; later ones are closed)
  std::vector<std::string> notes;  // one line per fd closed unused, for the log
};
PassedFds TakePassedFds();

// What RowStore::Create does with a row cache region handed over, and what it did.
struct CacheHandoff {
  UniqueFd fd;                   // the region handed over (invalid: none)
  uint64_t tables_identity = 0;  // recorded in the region; a region naming another is discarded
  bool adopted = false;          // out: the region was adopted
  std::string outcome;           // out: what happened, for the log (empty: no region)
};

// Asks systemd to keep the row cache's memfd across restarts (FDSTORE=1, FDNAME=row-cache).
// Unless the fd is the one it passed (`adopted`), the store's earlier fd of that name is removed
// first (FDSTOREREMOVE=1), so that a discarded region's memory is freed. False when there is no
// $NOTIFY_SOCKET or systemd did not take it.
bool StoreRowCacheFd(int fd, bool adopted);

}  // namespace engram
