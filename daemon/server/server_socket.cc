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

// Makes the socket's directory if it is missing.
absl::Status PrepareSocketDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return absl::OkStatus();
  const std::string dir = path.substr(0, slash);
  struct stat st;
  if (stat(dir.c_str(), &st) < 0 && (errno != ENOENT || mkdir(dir.c_str(), 0755) < 0)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "socket directory '%s' does not exist and cannot be created: %s", dir, strerror(errno)));
  }
  return absl::OkStatus();
}

// Clears a stale socket a dead daemon left at `path`; refuses a path that is not a socket or
// where something answers (an engramd that took no claim, or systemd's socket). Runs under the
// path's SocketClaim: no other engramd changes the path between this check and the bind.
absl::Status ClearStaleSocket(const std::string& path) {
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
  unlink(path.c_str());  // a stale socket of a daemon that died
  return absl::OkStatus();
}

// socket.mode and socket.group on the bound socket.
absl::Status SetSocketAccess(const std::string& path, mode_t mode, const std::string& group_name) {
  if (chmod(path.c_str(), mode) < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot set mode %04o on '%s': %s", mode, path, strerror(errno)));
  }
  if (group_name.empty()) return absl::OkStatus();
  group* g = getgrnam(group_name.c_str());
  if (g == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("socket group '%s' does not exist", group_name));
  }
  if (chown(path.c_str(), static_cast<uid_t>(-1), g->gr_gid) < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot give '%s' to group '%s': %s", path, group_name, strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BoundSocket> BindClientSocket(const ServerConfig& config) {
  const std::string& path = config.socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "socket path '%s' is empty or longer than %d bytes", path, sizeof(addr.sun_path) - 1));
  }
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
  if (absl::Status s = out.claim->Bound(); !s.ok()) return s;
  if (absl::Status s = SetSocketAccess(path, config.socket_mode, config.socket_group); !s.ok()) {
    return s;
  }
  if (absl::Status s = out.claim->Bound(); !s.ok()) return s;  // its mode changed its ctime
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
