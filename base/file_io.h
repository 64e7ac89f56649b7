// File I/O shared by the libraries: full positional writes and durable directory entries (the
// packer, tables/pack.h, and the synthetic checkpoints, testkit/), and the opening and bounded
// reading of a file a setting names (the PSI file, the hot set), with errors that name the file.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/unique_fd.h"

namespace engram {

// Unavailable naming `what`, `path` and errno, e.g. "cannot fsync /x/l14.engram: No space left".
absl::Status ErrnoStatus(const std::string& what, const std::string& path);

// Writes all `len` bytes at `offset`, retrying short writes and EINTR.
absl::Status WriteAllAt(int fd, const std::string& path, const void* buf, uint64_t len,
                        uint64_t offset);

// Creates (or truncates) `path` (mode 0644), writes `bytes` and fsyncs it.
absl::Status WriteWholeFile(const std::string& path, std::string_view bytes);

// fsyncs directory `dir` so that entries just created or renamed in it survive a crash.
absl::Status FsyncDirectory(const std::string& dir);

// What `mode` (st_mode) is, in words: "a regular file", "a FIFO", "a character device", ...
const char* FileKindName(mode_t mode);

// Whether the last component of a path a setting names may be a symbolic link.
enum class Symlink { kFollow, kRefuse };

// Opens `path`, which the setting `setting` ("memory.hot_set_path"; may be empty) names, for
// reading without ever blocking. What is there is looked at first (lstat with Symlink::kRefuse,
// else stat), so that a device is never opened; then it is opened O_NONBLOCK (a FIFO put there
// meanwhile opens at once instead of waiting for a writer), O_NOCTTY, O_CLOEXEC and O_NOFOLLOW
// with Symlink::kRefuse, and looked at again through the fd: anything but a regular file (a
// FIFO, a device, a directory, a socket, a refused link) is refused before a byte is read.
// NotFound when nothing is there; FailedPrecondition naming the setting, the path and what it
// is ("memory.hot_set_path /x is a FIFO, not a regular file"); Unavailable with errno otherwise.
// *ret_stat, when given, receives the file's fstat on success.
absl::StatusOr<UniqueFd> OpenRegularFile(const std::string& setting, const std::string& path,
                                         Symlink symlink, struct stat* ret_stat = nullptr);

// Reads `fd` (just opened) to its end, for files whose size fstat does not tell (/proc,
// cgroupfs). InvalidArgument naming `path` when it holds more than `max_bytes`: the caller's
// bound on what a valid file of its kind can be.
absl::StatusOr<std::string> ReadAtMost(int fd, const std::string& path, size_t max_bytes);

}  // namespace engram
