// File writing shared by the table tools (see file_io.h).
#include "base/file_io.h"

#include <fcntl.h>
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

}  // namespace engram
