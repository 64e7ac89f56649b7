// Page-cache residency of a file range (see residency.h).
#include "daemon/ops/residency.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "base/page_size.h"

// Debian 12's headers predate cachestat; the number is the same on every architecture.
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif

namespace engram {
namespace {

struct CachestatRange {
  uint64_t off;
  uint64_t len;
};
struct Cachestat {
  uint64_t nr_cache;
  uint64_t nr_dirty;
  uint64_t nr_writeback;
  uint64_t nr_evicted;
  uint64_t nr_recently_evicted;
};

std::atomic<bool> g_cachestat_works{true};

// mincore and cachestat count the kernel's own pages.
uint64_t PageSize() { return KernelPageBytes(); }

}  // namespace

absl::StatusOr<Residency> ResidencyByCachestat(int fd, const std::string& path, uint64_t offset,
                                               uint64_t bytes) {
  if (bytes == 0) return Residency{};
  const uint64_t page = PageSize();
  const uint64_t first = offset / page * page;
  CachestatRange range{first, offset + bytes - first};
  Cachestat cs{};
  if (syscall(__NR_cachestat, fd, &range, &cs, 0) != 0) {
    const int err = errno;
    if (err == ENOSYS) {
      return absl::UnimplementedError("cachestat(2) is not available (Linux 6.5 or later has it)");
    }
    return absl::ErrnoToStatus(err, absl::StrFormat("cachestat on %s", path));
  }
  // One page (unlike a large folio) never counts twice, so the end pages bound the error.
  return Residency{.resident_bytes = std::min(cs.nr_cache * page, bytes),
                   .recently_evicted_bytes = std::min(cs.nr_recently_evicted * page, bytes)};
}

absl::StatusOr<Residency> ResidencyByMincore(int fd, const std::string& path, uint64_t offset,
                                             uint64_t bytes) {
  const uint64_t page = PageSize();
  const uint64_t first = offset / page * page, last = offset + bytes;
  Residency out{.method = "mincore"};
  std::vector<unsigned char> vec;
  // 1 GiB at a time, so a 100 GB table never needs one huge mapping or a 25 MB vector.
  for (uint64_t at = first; at < last;) {
    const uint64_t len = std::min<uint64_t>(last - at, uint64_t{1} << 30);
    void* map = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(at));
    if (map == MAP_FAILED) {
      return absl::ErrnoToStatus(
          errno, absl::StrFormat("mmap of %s at %u to read its residency", path, at));
    }
    vec.assign((len + page - 1) / page, 0);
    const int rc = mincore(map, len, vec.data());
    const int err = errno;
    munmap(map, len);
    if (rc < 0) return absl::ErrnoToStatus(err, absl::StrFormat("mincore on %s", path));
    for (size_t i = 0; i < vec.size(); ++i) {
      if ((vec[i] & 1) == 0) continue;
      const uint64_t lo = std::max(at + i * page, offset);
      const uint64_t hi = std::min(at + (i + 1) * page, last);
      if (hi > lo) out.resident_bytes += hi - lo;
    }
    at += len;
  }
  return out;
}

absl::StatusOr<Residency> ResidencyOf(int fd, const std::string& path, uint64_t offset,
                                      uint64_t bytes) {
  if (g_cachestat_works.load(std::memory_order_relaxed)) {
    absl::StatusOr<Residency> r = ResidencyByCachestat(fd, path, offset, bytes);
    if (r.ok()) return r;
    if (absl::IsUnimplemented(r.status())) {
      g_cachestat_works.store(false, std::memory_order_relaxed);
    }
  }
  return ResidencyByMincore(fd, path, offset, bytes);
}

}  // namespace engram
