// The row cache's memfd and systemd: the descriptors passed at start (the listening socket of
// socket activation and the row cache's memfd from the file-descriptor store, told apart by
// name), and handing the memfd to the file-descriptor store once the cache exists
// (docs/operations.md, "Restarts and upgrades"). The row store's part is
// store/cache_handoff.h.
#pragma once

#include <string>
#include <vector>

#include "base/unique_fd.h"

namespace engram {

// The name the row cache's memfd is stored under (FDNAME=) and passed back with
// ($LISTEN_FDNAMES).
inline constexpr char kRowCacheFdName[] = "row-cache";

// What systemd passed at start ($LISTEN_FDS / $LISTEN_FDNAMES).
struct PassedFds {
  int socket_fd = -1;  // the first fd not named kRowCacheFdName (socket activation), or -1
  UniqueFd row_cache;  // the fd named kRowCacheFdName (the first one; later ones are closed)
  std::vector<std::string> notes;  // one line per fd closed unused, for the log
};
PassedFds TakePassedFds();

// Asks systemd to keep the row cache's memfd across restarts (FDSTORE=1, FDNAME=row-cache).
// Unless the fd is the one it passed (`adopted`), the store's earlier fd of that name is removed
// first (FDSTOREREMOVE=1), so that a discarded region's memory is freed. False when there is no
// $NOTIFY_SOCKET or systemd did not take it.
bool StoreRowCacheFd(int fd, bool adopted);

}  // namespace engram
