// File I/O shared by the libraries (see file_io.h).
#include "base/file_io.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace engram {

absl::Status ErrnoStatus(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAllAt(int fd, const std::string& path, const void* buf, uint64_t len,
                        uint64_t offset) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (len > 0) {
    ssize_t n = ::pwrite(fd, p, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(absl::StrCat("cannot write ", len, " bytes at offset ", offset, " of"),
                         path);
    }
    p += n;
    len -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteWholeFile(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create", path);
  absl::Status s = WriteAllAt(fd, path, bytes.data(), bytes.size(), 0);
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoStatus("cannot fsync", path);
  const int saved = errno;
  if (::close(fd) != 0 && s.ok()) return ErrnoStatus("cannot close", path);
  errno = saved;
  return s;
}

absl::Status FsyncDirectory(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoStatus("cannot open directory", dir);
  const int rc = ::fsync(dfd);
  const int saved = errno;
  ::close(dfd);
  errno = saved;
  if (rc != 0) return ErrnoStatus("cannot fsync directory", dir);
  return absl::OkStatus();
}

const char* FileKindName(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a directory";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFIFO:
      return "a FIFO";
    case S_IFSOCK:
      return "a socket";
    case S_IFLNK:
      return "a symbolic link";
    default:
      return "a file of an unknown kind";
  }
}

namespace {

// "memory.hot_set_path /x" or, without a setting, "/x".
std::string Named(const std::string& setting, const std::string& path) {
  return setting.empty() ? path : absl::StrCat(setting, " ", path);
}

// FailedPrecondition for `st`, which is not a regular file: what it is, and where a link leads.
absl::Status NotRegular(const std::string& setting, const std::string& path,
                        const struct stat& st) {
  std::string to;
  if (S_ISLNK(st.st_mode)) {
    char target[PATH_MAX];
    const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
    if (n > 0) to = absl::StrCat(" (to ", std::string(target, static_cast<size_t>(n)), ")");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      Named(setting, path), " is ", FileKindName(st.st_mode), to, ", not a regular file"));
}

}  // namespace

absl::StatusOr<UniqueFd> OpenRegularFile(const std::string& setting, const std::string& path,
                                         Symlink symlink, struct stat* ret_stat) {
  // Looked at before it is opened: opening a device can act on it (a watchdog arms, a tape
  // rewinds), and a FIFO or a device is refused anyway.
  struct stat st {};
  const int looked =
      symlink == Symlink::kRefuse ? ::lstat(path.c_str(), &st) : ::stat(path.c_str(), &st);
  if (looked == 0 && !S_ISREG(st.st_mode)) return NotRegular(setting, path, st);
  // Then opened so that nothing blocks, and looked at again through the fd: the name may have
  // been given to another file in between.
  const int flags =
      O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (symlink == Symlink::kRefuse ? O_NOFOLLOW : 0);
  UniqueFd fd(::open(path.c_str(), flags));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ELOOP && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return NotRegular(setting, path, st);
    }
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(Named(setting, path), ": no such file"));
    }
    return absl::UnavailableError(
        absl::StrCat("cannot open ", Named(setting, path), ": ", std::strerror(err)));
  }
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("cannot fstat", path);
  if (!S_ISREG(st.st_mode)) return NotRegular(setting, path, st);
  if (ret_stat != nullptr) *ret_stat = st;
  return fd;
}

absl::StatusOr<std::string> ReadAtMost(int fd, const std::string& path, size_t max_bytes) {
  std::string text(max_bytes + 1, '\0');  // one byte more tells a file that is too long
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("cannot read", path);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds more than ", max_bytes, " bytes"));
  }
  text.resize(got);
  return text;
}

}  // namespace engram
