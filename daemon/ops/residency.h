// How much of a file range is in the page cache: cachestat(2) where the kernel has it (Linux
// 6.5), mincore over a read-only mapping otherwise. engramctl tables shows it per table.
//
//   absl::StatusOr<Residency> r = ResidencyOf(fd, path, offset, bytes);
//   double fraction = double(r->resident_bytes) / double(bytes);
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace engram {

struct Residency {
  uint64_t resident_bytes = 0;
  // Bytes of the range evicted recently enough that reading them again counts as a refault
  // (the table does not fit the memory it gets); cachestat only, 0 with mincore.
  uint64_t recently_evicted_bytes = 0;
  const char* method = "cachestat";  // or "mincore"
};

// Pages at the two ends of the range count whole (up to `bytes`). Errors name `path`.
absl::StatusOr<Residency> ResidencyOf(int fd, const std::string& path, uint64_t offset,
                                      uint64_t bytes);

// The two methods on their own. ResidencyByCachestat answers Unimplemented where the kernel
// lacks the call (ResidencyOf then stops trying it).
absl::StatusOr<Residency> ResidencyByCachestat(int fd, const std::string& path, uint64_t offset,
                                               uint64_t bytes);
absl::StatusOr<Residency> ResidencyByMincore(int fd, const std::string& path, uint64_t offset,
                                             uint64_t bytes);

}  // namespace engram
