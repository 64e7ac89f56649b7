// sd_notify and sd_listen_fds, implemented on the documented environment protocol (notify.h).
#include "daemon/ops/notify.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"

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
  const char* pid = getenv("LISTEN_PID");
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
      fds.push_back(fd);
    }
  }
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  return fds;
}

}  // namespace engram::notify
