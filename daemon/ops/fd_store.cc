// The passed descriptors and the file-descriptor store (fd_store.h).
#include "daemon/ops/fd_store.h"

#include <unistd.h>

#include "absl/strings/str_format.h"
#include "daemon/ops/notify.h"

namespace engram {

PassedFds TakePassedFds() {
  PassedFds out;
  for (notify::NamedFd& f : notify::ListenFdsWithNames()) {
    if (f.name == kRowCacheFdName) {
      if (!out.row_cache.valid()) {
        out.row_cache.Reset(f.fd);
        continue;
      }
      out.notes.push_back(absl::StrFormat("closed fd %d: a second descriptor named %s was passed",
                                          f.fd, kRowCacheFdName));
      close(f.fd);
      continue;
    }
    if (out.socket_fd < 0) {
      out.socket_fd = f.fd;
      continue;
    }
    out.notes.push_back(
        absl::StrFormat("closed fd %d (named '%s'): engramd serves one socket", f.fd, f.name));
    close(f.fd);
  }
  return out;
}

bool StoreRowCacheFd(int fd, bool adopted) {
  if (!adopted) {
    notify::Send(absl::StrFormat("FDSTOREREMOVE=1\nFDNAME=%s", kRowCacheFdName));
  }
  return notify::SendWithFd(absl::StrFormat("FDSTORE=1\nFDNAME=%s", kRowCacheFdName), fd);
}

}  // namespace engram
