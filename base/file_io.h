// File writing shared by the packer (tables/pack.h) and the synthetic checkpoints (testkit/):
// full positional writes and durable directory entries, with errors that name the file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

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

}  // namespace engram
