// sd_notify and sd_listen_fds, implemented on the documented environment protocol (notify.h).
#include "daemon/ops/notify.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace engram::notify {

bool Send(const std::string& state) {
  const char* path = getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t len = strlen(path);
  if ((path[0] != '/' && path[0] != '@') || len >= sizeof(addr.sun_path)) return false;
  memcpy(addr.sun_path, path, len);
  if (path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const socklen_t addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  ssize_t n;
  do {
    n = sendto(fd, state.data(), state.size(), MSG_NOSIGNAL | MSG_DONTWAIT,
               reinterpret_cast<const sockaddr*>(&addr), addr_len);
  } while (n < 0 && errno == EINTR);
  close(fd);
  return n == static_cast<ssize_t>(state.size());
}

bool SendWithFd(const std::string& state, int fd) {
  const char* path = getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t len = strlen(path);
  if ((path[0] != '/' && path[0] != '@') || len >= sizeof(addr.sun_path)) return false;
  memcpy(addr.sun_path, path, len);
  if (path[0] == '@') addr.sun_path[0] = '\0';
  const int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return false;
  iovec iov{.iov_base = const_cast<char*>(state.data()), .iov_len = state.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_name = &addr;
  msg.msg_namelen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  close(sock);
  return n == static_cast<ssize_t>(state.size());
}

uint64_t WatchdogUsec() {
  const char* usec = getenv("WATCHDOG_USEC");
  uint64_t value = 0;
  if (usec == nullptr || !absl::SimpleAtoi(usec, &value)) return 0;
  if (const char* pid = getenv("WATCHDOG_PID"); pid != nullptr) {
    int64_t p = 0;
    if (!absl::SimpleAtoi(pid, &p) || p != getpid()) return 0;
  }
  return value;
}

std::vector<int> ListenFds() {
  std::vector<int> fds;
  for (const NamedFd& f : ListenFdsWithNames()) fds.push_back(f.fd);
  return fds;
}

std::vector<NamedFd> ListenFdsWithNames() {
  std::vector<NamedFd> fds;
  const char* pid = getenv("LISTEN_PID");
  const char* names = getenv("LISTEN_FDNAMES");
  std::vector<std::string> split;
  if (names != nullptr) split = absl::StrSplit(names, ':');
  const char* count = getenv("LISTEN_FDS");
  int64_t p = 0;
  uint32_t n = 0;
  if (pid != nullptr && count != nullptr && absl::SimpleAtoi(pid, &p) && p == getpid() &&
      absl::SimpleAtoi(count, &n)) {
    constexpr int kFirst = 3;  // SD_LISTEN_FDS_START
    for (uint32_t i = 0; i < n; ++i) {
      const int fd = kFirst + static_cast<int>(i);
      const int flags = fcntl(fd, F_GETFD);
      if (flags < 0) continue;
      fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
      fds.push_back({.fd = fd, .name = i < split.size() ? split[i] : std::string()});
    }
  }
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  return fds;
}

}  // namespace engram::notify
