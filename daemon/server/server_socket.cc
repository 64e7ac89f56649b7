// The client socket: binding it (or checking the one systemd passed) and listening on it.
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <optional>

#include "absl/strings/str_format.h"
#include "daemon/server/server.h"
#include "daemon/server/server_internal.h"
#include "daemon/server/socket_claim.h"

namespace engram {
namespace {

// Socket activation: systemd bound and listens; check it is the kind of socket we serve.
absl::Status CheckActivatedSocket(int fd) {
  int type = 0;
  socklen_t len = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_SEQPACKET) {
    return absl::FailedPreconditionError(
        "the socket passed by systemd is not a SOCK_SEQPACKET Unix socket "
        "(engramd.socket needs ListenSequentialPacket=)");
  }
  return absl::OkStatus();
}

// How much longer than its drain timeout a start waits for a stopping engramd's claim: the
// stop's own steps after the drain (the last metrics, the hot set).
constexpr uint64_t kClaimWaitSlackNs = 30'000'000'000;

// The socket's directory: "" for a path without one.
std::string SocketDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? std::string() : path.substr(0, slash);
}

absl::Status CannotCreateDirectory(const std::string& dir, int err) {
  return absl::FailedPreconditionError(absl::StrFormat(
      "socket directory '%s' does not exist and cannot be created: %s", dir, strerror(err)));
}

// Whether the socket's directory exists, or can be made (its parent a directory this process may
// write): what PrepareSocketDirectory needs, looked at without making anything.
absl::Status CheckSocketDirectory(const std::string& path) {
  const std::string dir = SocketDirectory(path);
  if (dir.empty()) return absl::OkStatus();
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrFormat("socket directory '%s' is not a directory", dir));
  }
  if (errno != ENOENT) return CannotCreateDirectory(dir, errno);
  const size_t slash = dir.rfind('/');
  const std::string parent = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : dir.substr(0, slash);
  if (stat(parent.c_str(), &st) != 0) return CannotCreateDirectory(dir, errno);
  if (!S_ISDIR(st.st_mode)) return CannotCreateDirectory(dir, ENOTDIR);
  if (faccessat(AT_FDCWD, parent.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    return CannotCreateDirectory(dir, errno);
  }
  return absl::OkStatus();
}

// Makes the socket's directory if it is missing (CheckSocketDirectory said it can).
absl::Status PrepareSocketDirectory(const std::string& path) {
  const std::string dir = SocketDirectory(path);
  if (dir.empty()) return absl::OkStatus();
  if (mkdir(dir.c_str(), 0755) < 0 && errno != EEXIST) return CannotCreateDirectory(dir, errno);
  return absl::OkStatus();
}

// Refuses a path that is not a socket or where something answers (an engramd that took no claim,
// or systemd's socket); a socket nobody answers on is stale (a daemon that died).
absl::Status CheckStaleSocket(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("'%s' exists and is not a socket; refusing to replace it", path));
  }
  if (SocketClaim::Answers(path)) {
    return absl::AlreadyExistsError(
        absl::StrFormat("another engramd is serving on '%s'; stop it first", path));
  }
  return absl::OkStatus();
}

// Clears a stale socket a dead daemon left at `path`, as CheckStaleSocket allows. Runs under the
// path's SocketClaim: no other engramd changes the path between this check and the bind.
absl::Status ClearStaleSocket(const std::string& path) {
  if (absl::Status s = CheckStaleSocket(path); !s.ok()) return s;
  unlink(path.c_str());  // a stale socket of a daemon that died, or nothing
  return absl::OkStatus();
}

// socket.group as a gid; nullopt for none (the daemon's group).
absl::StatusOr<std::optional<gid_t>> SocketGroup(const std::string& group_name) {
  if (group_name.empty()) return std::optional<gid_t>();
  group* g = getgrnam(group_name.c_str());
  if (g == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("socket group '%s' does not exist", group_name));
  }
  return std::optional<gid_t>(g->gr_gid);
}

// socket.mode and socket.group (`gid`, resolved by SocketGroup) on the bound socket.
absl::Status SetSocketAccess(const std::string& path, mode_t mode, const std::string& group_name,
                             std::optional<gid_t> gid) {
  if (chmod(path.c_str(), mode) < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot set mode %04o on '%s': %s", mode, path, strerror(errno)));
  }
  if (!gid) return absl::OkStatus();
  if (chown(path.c_str(), static_cast<uid_t>(-1), *gid) < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot give '%s' to group '%s': %s", path, group_name, strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckClientSocket(const ServerConfig& config) {
  const std::string& path = config.socket_path;
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("socket path '%s' is empty or longer than %d bytes", path,
                        sizeof(sockaddr_un::sun_path) - 1));
  }
  if (absl::Status s = SocketGroup(config.socket_group).status(); !s.ok()) return s;
  if (absl::Status s = CheckSocketDirectory(path); !s.ok()) return s;
  if (absl::Status s = SocketClaim::Check(path); !s.ok()) return s;
  return CheckStaleSocket(path);
}

absl::StatusOr<BoundSocket> BindClientSocket(const ServerConfig& config) {
  // Everything --check-config looks at, in its words, before anything is made.
  if (absl::Status s = CheckClientSocket(config); !s.ok()) return s;
  const std::string& path = config.socket_path;
  absl::StatusOr<std::optional<gid_t>> gid = SocketGroup(config.socket_group);
  if (!gid.ok()) return gid.status();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (absl::Status s = PrepareSocketDirectory(path); !s.ok()) return s;
  // A daemon still stopping on the path holds the claim until it has removed its socket: wait
  // for it (as long as it may take to drain), so that a restart neither fails nor loses the
  // socket it binds.
  absl::StatusOr<std::unique_ptr<SocketClaim>> claim =
      SocketClaim::Take(path, config.drain_timeout_ns + kClaimWaitSlackNs);
  if (!claim.ok()) return claim.status();
  if (absl::Status s = ClearStaleSocket(path); !s.ok()) return s;
  BoundSocket out{.fd = UniqueFd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)),
                  .claim = std::move(*claim)};
  if (!out.fd.valid()) {
    return absl::InternalError(absl::StrFormat("socket(AF_UNIX): %s", strerror(errno)));
  }
  if (bind(out.fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot bind '%s': %s", path, strerror(errno)));
  }
  if (absl::Status s = out.claim->Bound(out.fd.get()); !s.ok()) return s;
  if (absl::Status s = SetSocketAccess(path, config.socket_mode, config.socket_group, *gid);
      !s.ok()) {
    return s;
  }
  if (listen(out.fd.get(), 128) < 0) {
    return absl::InternalError(absl::StrFormat("listen on '%s': %s", path, strerror(errno)));
  }
  return out;
}

absl::Status Server::Bind() {
  if (config_.listen_fd >= 0) {
    if (absl::Status s = CheckActivatedSocket(config_.listen_fd); !s.ok()) return s;
    listen_fd_.Reset(config_.listen_fd);
    fcntl(listen_fd_.get(), F_SETFL, fcntl(listen_fd_.get(), F_GETFL) | O_NONBLOCK);
  } else {
    absl::StatusOr<BoundSocket> bound = BindClientSocket(config_);
    if (!bound.ok()) return bound.status();
    listen_fd_ = std::move(bound->fd);
    socket_claim_ = std::move(bound->claim);
  }
  epoll_event ev{.events = EPOLLIN, .data = {.u64 = kTagListen}};
  epoll_ctl(control_epoll_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev);
  return absl::OkStatus();
}

}  // namespace engram
