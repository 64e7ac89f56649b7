// SocketClaim: the lock next to the client socket and the removal of the path (socket_claim.h).
#include "daemon/server/socket_claim.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "base/clock.h"
#include "base/log.h"

namespace engram {
namespace {

// How often a waiting start looks again whether the lock was let go.
constexpr uint64_t kRetryNs = 20'000'000;
// How long the holder's socket must go on answering for the holder to be taken as serving.
constexpr uint64_t kServingNs = 2'000'000'000;

// The pid the holder wrote into the lock file, or "unknown".
std::string HolderOf(int fd) {
  char buf[32] = {};
  const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  uint32_t pid = 0;
  const absl::string_view text(buf, n > 0 ? static_cast<size_t>(n) : 0);
  if (absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &pid)) {
    return absl::StrFormat("pid %u", pid);
  }
  return "unknown pid";
}

std::string LockPathOf(const std::string& socket_path) { return socket_path + ".lock"; }

absl::Status CannotOpenLock(const std::string& lock_path, int err) {
  return absl::FailedPreconditionError(
      absl::StrFormat("cannot open the socket's lock file '%s': %s", lock_path, strerror(err)));
}

// Whether the holder of the lock on `fd` serves on `socket_path`: its socket has answered every
// look since *answered_since (0: it did not answer the last look) for kServingNs. A holder that
// answers may have been told to stop a moment ago (a restart sends SIGTERM and starts the next
// daemon at once): it is taken as serving only once it went on answering that long.
absl::Status HolderServing(int fd, const std::string& socket_path, uint64_t now,
                           uint64_t* answered_since) {
  *answered_since =
      SocketClaim::Answers(socket_path) ? (*answered_since != 0 ? *answered_since : now) : 0;
  if (*answered_since == 0 || now - *answered_since < kServingNs) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrFormat(
      "another engramd (%s) is serving on '%s'; stop it first", HolderOf(fd), socket_path));
}

}  // namespace

absl::Status SocketClaim::Check(const std::string& socket_path) {
  const std::string lock_path = LockPathOf(socket_path);
  UniqueFd fd(open(lock_path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) {
    if (errno != ENOENT) return CannotOpenLock(lock_path, errno);
    // Take would create it: the directory must let it (a missing one is made first).
    const size_t slash = lock_path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : lock_path.substr(0, slash + 1);
    if (faccessat(AT_FDCWD, dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0 && errno != ENOENT) {
      return CannotOpenLock(lock_path, errno);
    }
    return absl::OkStatus();
  }
  const uint64_t start = NowNs();
  uint64_t answered_since = 0;
  while (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrFormat("cannot lock '%s': %s", lock_path, strerror(errno)));
    }
    const uint64_t now = NowNs();
    if (absl::Status s = HolderServing(fd.get(), socket_path, now, &answered_since); !s.ok()) {
      return s;
    }
    // Not answering: the holder is stopping, and Take would wait for it.
    if (answered_since == 0 || now - start > 2 * kServingNs) return absl::OkStatus();
    usleep(kRetryNs / 1000);
  }
  return absl::OkStatus();  // free; the lock goes with the descriptor
}

bool SocketClaim::Answers(const std::string& socket_path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) return false;
  memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  UniqueFd probe(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  return probe.valid() &&
         connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
}

absl::StatusOr<std::unique_ptr<SocketClaim>> SocketClaim::Take(const std::string& socket_path,
                                                               uint64_t wait_ns) {
  std::unique_ptr<SocketClaim> claim(new SocketClaim());
  claim->socket_path_ = socket_path;
  claim->lock_path_ = LockPathOf(socket_path);
  const std::string& lock_path = claim->lock_path_;
  claim->lock_fd_.Reset(open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!claim->lock_fd_.valid()) return CannotOpenLock(lock_path, errno);
  const int fd = claim->lock_fd_.get();
  const uint64_t start = NowNs();
  uint64_t answered_since = 0;  // the holder's socket answered every look since then
  bool told = false;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrFormat("cannot lock '%s': %s", lock_path, strerror(errno)));
    }
    const std::string holder = HolderOf(fd);
    const uint64_t now = NowNs();
    if (absl::Status s = HolderServing(fd, socket_path, now, &answered_since); !s.ok()) return s;
    if (now - start >= wait_ns) {
      return absl::UnavailableError(absl::StrFormat(
          "engramd (%s) still holds '%s' after %u s: it is stopping, or hangs; stop it first",
          holder, lock_path, wait_ns / 1'000'000'000));
    }
    if (!told && answered_since == 0) {
      log::Notice("engramd ({}) is still stopping on '{}'; waiting up to {} s for it", holder,
                  socket_path, wait_ns / 1'000'000'000);
      told = true;
    }
    usleep(kRetryNs / 1000);
  }
  const std::string pid = absl::StrFormat("%d\n", getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    log::Warning("cannot write engramd's pid into '{}': {}", lock_path, strerror(errno));
  }
  return claim;
}

absl::Status SocketClaim::Bound(int socket_fd) {
  struct stat st;
  if (lstat(socket_path_.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot read back the socket bound at '%s': %s", socket_path_, strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("'%s' is no socket right after engramd bound it", socket_path_));
  }
  socket_.Reset(fcntl(socket_fd, F_DUPFD_CLOEXEC, 0));
  if (!socket_.valid()) {
    return absl::InternalError(
        absl::StrFormat("cannot keep the socket bound at '%s': %s", socket_path_, strerror(errno)));
  }
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  return absl::OkStatus();
}

SocketClaim::~SocketClaim() {
  // Still locked: no other engramd can have replaced the path since the check, so the path
  // removed is the socket this daemon bound. A file someone else put there (an engramd that
  // does not take the lock, an operator) stays: the socket still open holds this one's inode,
  // so the other's has another number, even on a file system that reuses a freed inode at once
  // and stamps both within one clock tick. The socket closes only after the comparison.
  struct stat st;
  if (socket_.valid() && lstat(socket_path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
      st.st_dev == dev_ && st.st_ino == ino_) {
    unlink(socket_path_.c_str());
  }
  socket_.Reset();
  // The lock goes with its descriptor.
}

}  // namespace engram
