// SocketClaim: engramd's hold on the path of the client socket it binds, from before the path is
// checked until after it is removed: an exclusive lock on "<socket>.lock" (flock), the identity
// (st_dev, st_ino) of the socket file it bound and a descriptor of the bound socket, which keeps
// that file's inode allocated (a bound socket holds its path's inode), so that no other file can
// have its number until the claim is released. A stopping engramd removes the path only while it
// still names that socket, and another engramd cannot clear or bind the path while the lock is
// held, so a restart (the old daemon stopping while the new one starts) never loses the new
// daemon's socket. Not taken for a socket systemd passed: engramd never removes that path.
//
//   auto claim = engram::SocketClaim::Take(path, wait_ns);  // waits for a stopping engramd
//   ... clear a stale socket, bind(path) ...
//   (*claim)->Bound(fd);
//   claim->reset();  // removes `path` if it is still the socket bound, then unlocks
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"

namespace engram {

class SocketClaim {
 public:
  // Locks "<socket_path>.lock" (made 0644 if missing; never removed, so that two daemons never
  // lock two different files of that name) and writes engramd's pid into it. While another
  // process holds the lock: AlreadyExists if `socket_path` goes on answering connections for
  // 2 s (that engramd serves; one told to stop a moment ago stops answering sooner), else
  // waits up to `wait_ns` for it to finish stopping, then Unavailable naming its pid.
  // FailedPrecondition when the lock file cannot be opened.
  static absl::StatusOr<std::unique_ptr<SocketClaim>> Take(const std::string& socket_path,
                                                           uint64_t wait_ns);
  // What Take would say of `socket_path` now, creating nothing and keeping no lock:
  // AlreadyExists, in Take's words, while another engramd holds the lock and its socket goes on
  // answering for 2 s; FailedPrecondition, in Take's words, when the lock file could not be
  // opened (or, where it is missing, created: its directory is not writable). OK when the lock
  // is free, when its holder is stopping (Take would wait for it) and when the directory is
  // missing (a start makes it first). For --check-config and for the start's own check.
  static absl::Status Check(const std::string& socket_path);
  SocketClaim(const SocketClaim&) = delete;
  SocketClaim& operator=(const SocketClaim&) = delete;
  // Removes the socket path if it still names the socket Bound() recorded, then unlocks.
  ~SocketClaim();

  // Records the identity (device, inode) of the socket file `socket_fd` was just bound at, and
  // keeps a duplicate of `socket_fd` until the claim goes: while a socket bound to the file is
  // open, a freed inode number cannot be reused for a file put at the path since.
  // FailedPrecondition when the path cannot be read back or is no socket.
  absl::Status Bound(int socket_fd);
  const std::string& lock_path() const { return lock_path_; }

  // Whether a Unix socket at `socket_path` accepts a connection (an engramd serves there).
  static bool Answers(const std::string& socket_path);

 private:
  SocketClaim() = default;

  std::string socket_path_;
  std::string lock_path_;
  UniqueFd lock_fd_;
  UniqueFd socket_;  // the bound socket, keeping the file's inode allocated
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace engram
