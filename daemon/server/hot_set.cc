// The hot-set file, its keeper and its warmer (hot_set.h).
#include "daemon/server/hot_set.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_io.h"
#include "base/log.h"
#include "base/unique_fd.h"

namespace engram {
namespace {

constexpr char kMagic[8] = {'E', 'G', 'R', 'M', 'H', 'O', 'T', '1'};
// A file starting with these is a hot set of some layout (the magic's last byte and the version
// number it), which WriteHotSet may replace: an older engramd replaces a newer one's.
constexpr size_t kFamilyBytes = 7;
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 24;  // magic, version, 0, count
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;
// Keys read and summed at a time: what a read takes past the keys it keeps.
constexpr uint64_t kChunkKeys = 8192;
constexpr char kTemporary[] = "memory.hot_set_path's temporary file";
constexpr char kOnlyOverAHotSet[] =
    "; engramd writes its hot set only where there is no file or over a hot set: name another "
    "path in memory.hot_set_path, or remove that file";

uint64_t Fnv(std::span<const uint64_t> keys, uint64_t h = kFnvBasis) {
  for (uint64_t k : keys) {
    for (int i = 0; i < 8; ++i) {
      h ^= (k >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

absl::Status WriteAll(int fd, const void* p, size_t n, const std::string& path) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return absl::InternalError(absl::StrCat(path, ": write: ", strerror(errno)));
    b += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// Reads `n` bytes at `offset`; Internal at an error or an early end.
absl::Status ReadAllAt(int fd, void* p, size_t n, uint64_t offset, const std::string& path) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = pread(fd, b, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return absl::InternalError(
          absl::StrCat(path, ": short read", r < 0 ? absl::StrCat(": ", strerror(errno)) : ""));
    }
    b += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

enum class Existing { kNone, kHotSet };

// What is at `path` (`what` names it in messages), before WriteHotSet puts a file there: nothing,
// or a hot set (with `empty_is_one`, an empty file too: a write that stopped before its header);
// FailedPrecondition for anything else. Opened without blocking or following a link.
absl::StatusOr<Existing> Inspect(const std::string& what, const std::string& path,
                                 bool empty_is_one) {
  struct stat st {};
  absl::StatusOr<UniqueFd> fd = OpenRegularFile(what, path, Symlink::kRefuse, &st);
  if (absl::IsNotFound(fd.status())) return Existing::kNone;
  if (absl::IsFailedPrecondition(fd.status())) {
    return absl::FailedPreconditionError(absl::StrCat(fd.status().message(), kOnlyOverAHotSet));
  }
  if (!fd.ok()) return fd.status();
  if (st.st_size == 0 && empty_is_one) return Existing::kHotSet;
  char head[kFamilyBytes] = {};
  if (pread(fd->get(), head, kFamilyBytes, 0) == static_cast<ssize_t>(kFamilyBytes) &&
      std::memcmp(head, kMagic, kFamilyBytes) == 0) {
    return Existing::kHotSet;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what, " ", path, " is a regular file of ", st.st_size,
      " bytes that is not a hot set (it does not start with EGRMHOT)", kOnlyOverAHotSet));
}

// The header, keys and sum of a hot set, written to `fd` (`tmp`) and fsynced.
absl::Status WriteBody(int fd, const std::string& tmp, std::span<const uint64_t> keys) {
  uint8_t header[kHeaderBytes] = {};
  std::memcpy(header, kMagic, 8);
  std::memcpy(header + 8, &kVersion, 4);
  const uint64_t count = keys.size();
  std::memcpy(header + 16, &count, 8);
  const uint64_t sum = Fnv(keys);
  absl::Status s = WriteAll(fd, header, sizeof(header), tmp);
  if (s.ok()) s = WriteAll(fd, keys.data(), keys.size_bytes(), tmp);
  if (s.ok()) s = WriteAll(fd, &sum, sizeof(sum), tmp);
  if (s.ok() && fdatasync(fd) != 0) {
    s = absl::InternalError(absl::StrCat(tmp, ": fdatasync: ", strerror(errno)));
  }
  return s;
}

// Reads the `count` keys after the header a chunk at a time, keeping the first `max_keys`, and
// checks the sum of them all: the memory taken follows `max_keys`, not the file.
absl::StatusOr<std::vector<uint64_t>> ReadKeys(int fd, const std::string& path, uint64_t count,
                                               uint64_t max_keys) {
  std::vector<uint64_t> keys;
  keys.reserve(std::min(count, max_keys));
  std::vector<uint64_t> chunk(std::min(count, kChunkKeys));
  uint64_t h = kFnvBasis;
  for (uint64_t at = 0; at < count;) {
    const uint64_t n = std::min(kChunkKeys, count - at);
    if (absl::Status s = ReadAllAt(fd, chunk.data(), n * 8, kHeaderBytes + at * 8, path); !s.ok()) {
      return s;
    }
    h = Fnv(std::span<const uint64_t>(chunk.data(), n), h);
    const uint64_t keep = std::min(n, max_keys - std::min<uint64_t>(max_keys, keys.size()));
    keys.insert(keys.end(), chunk.begin(), chunk.begin() + static_cast<ptrdiff_t>(keep));
    at += n;
  }
  uint64_t sum = 0;
  if (absl::Status s = ReadAllAt(fd, &sum, 8, kHeaderBytes + count * 8, path); !s.ok()) return s;
  if (h != sum) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": checksum mismatch (a torn or damaged file)"));
  }
  return keys;
}

// Renames `tmp` (a hot set just written) over `path` only if `path` still holds what Inspect saw:
// nothing (RENAME_NOREPLACE), or a hot set (RENAME_EXCHANGE, then what came out is looked at and
// put back if it is no hot set), so that a file swapped in meanwhile is never replaced. Where the
// file system has neither flag, a plain rename. `tmp` is gone afterwards unless it was put back.
absl::Status PutInPlace(const std::string& tmp, const std::string& path, Existing was) {
  const unsigned flags = was == Existing::kNone ? RENAME_NOREPLACE : RENAME_EXCHANGE;
  if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), flags) != 0) {
    const int err = errno;
    if (err == EINVAL && rename(tmp.c_str(), path.c_str()) == 0) return absl::OkStatus();
    unlink(tmp.c_str());
    if (err == EEXIST) {
      absl::StatusOr<Existing> now = Inspect(kHotSetSetting, path, false);
      if (!now.ok()) return now.status();
    }
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", strerror(err)));
  }
  if (was == Existing::kNone) return absl::OkStatus();
  // `tmp` names what was at `path` a moment ago.
  absl::StatusOr<Existing> out = Inspect(kHotSetSetting, tmp, false);
  if (out.ok()) {
    unlink(tmp.c_str());
    return absl::OkStatus();
  }
  if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) != 0) {
    return absl::InternalError(absl::StrCat("cannot put ", tmp, " back at ", path, ": ",
                                            strerror(errno), " (it was not a hot set)"));
  }
  unlink(tmp.c_str());
  return absl::FailedPreconditionError(
      absl::StrCat(kHotSetSetting, " ", path, " was given to another file while the hot set was ",
                   "written: ", out.status().message()));
}

}  // namespace

absl::Status CheckHotSetPath(const std::string& path) {
  if (absl::StatusOr<Existing> e = Inspect(kHotSetSetting, path, false); !e.ok()) {
    return e.status();
  }
  return Inspect(kTemporary, path + ".tmp", true).status();
}

absl::Status WriteHotSet(const std::string& path, std::span<const uint64_t> keys) {
  absl::StatusOr<Existing> was = Inspect(kHotSetSetting, path, false);
  if (!was.ok()) return was.status();
  const std::string tmp = path + ".tmp";
  absl::StatusOr<Existing> left = Inspect(kTemporary, tmp, true);
  if (!left.ok()) return left.status();
  if (*left == Existing::kHotSet && unlink(tmp.c_str()) != 0 && errno != ENOENT) {
    return absl::InternalError(absl::StrCat(tmp, ": cannot remove: ", strerror(errno)));
  }
  // O_EXCL: never through a link or into a FIFO or device put there since it was looked at.
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat(tmp, ": cannot create: ", strerror(errno)));
  }
  absl::Status s = WriteBody(fd.get(), tmp, keys);
  fd.Reset();
  if (!s.ok()) {
    unlink(tmp.c_str());
    return s;
  }
  return PutInPlace(tmp, path, *was);
}

absl::StatusOr<std::vector<uint64_t>> ReadHotSet(const std::string& path, uint64_t max_keys) {
  struct stat st {};
  absl::StatusOr<UniqueFd> fd = OpenRegularFile(kHotSetSetting, path, Symlink::kRefuse, &st);
  if (absl::IsNotFound(fd.status())) {
    return absl::NotFoundError(absl::StrCat(path, ": no hot set written yet"));
  }
  if (!fd.ok()) return fd.status();
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint8_t header[kHeaderBytes];
  if (size < kHeaderBytes + 8 || !ReadAllAt(fd->get(), header, kHeaderBytes, 0, path).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes is too short for a hot set"));
  }
  uint32_t version;
  uint64_t count;
  std::memcpy(&version, header + 8, 4);
  std::memcpy(&count, header + 16, 8);
  if (std::memcmp(header, kMagic, 8) != 0 || version != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a hot set of this version (magic or version)"));
  }
  if (count > kMaxHotSetRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": says ", count, " rows, more than a hot set holds (", kMaxHotSetRows, ")"));
  }
  if (kHeaderBytes + count * 8 + 8 != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": says ", count, " rows but has ", size, " bytes"));
  }
  return ReadKeys(fd->get(), path, count, max_keys);
}

HotSetKeeper::HotSetKeeper(std::string path, uint64_t interval_ns, uint64_t max_rows,
                           const RowCache* cache)
    : path_(std::move(path)), interval_ns_(interval_ns), max_rows_(max_rows), cache_(cache) {}

HotSetKeeper::~HotSetKeeper() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  absl::StatusOr<uint64_t> n = WriteNow();
  if (n.ok()) {
    log::Info("hot set of the row cache written at stop: {} rows to {}", *n, path_);
  } else {
    log::Warning("hot set of the row cache not written at stop: {}",
                 std::string(n.status().message()));
  }
}

void HotSetKeeper::Start() {
  if (interval_ns_ == 0) return;
  thread_ = std::thread([this] { Run(); });
}

absl::StatusOr<uint64_t> HotSetKeeper::WriteNow() {
  const std::vector<uint64_t> keys = cache_->HotKeys(max_rows_);
  if (absl::Status s = WriteHotSet(path_, keys); !s.ok()) return s;
  return keys.size();
}

void HotSetKeeper::Run() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (wake_.wait_for(lock, std::chrono::nanoseconds(interval_ns_), [this] { return stop_; })) {
      return;
    }
    lock.unlock();
    absl::StatusOr<uint64_t> n = WriteNow();
    if (!n.ok()) {
      log::Warning("hot set of the row cache not written: {}", std::string(n.status().message()));
    }
    lock.lock();
  }
}

HotSetWarmer::~HotSetWarmer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void HotSetWarmer::Start(Prefetcher* prefetcher, std::span<const std::unique_ptr<Table>> tables,
                         RowStore* store) {
  thread_ = std::thread([=, this] { Run(prefetcher, tables, store); });
}

void HotSetWarmer::Run(Prefetcher* prefetcher, std::span<const std::unique_ptr<Table>> tables,
                       RowStore* store) {
  // Chunks small enough that the queue always has room for clients' hints beside them.
  const uint64_t chunk = std::max<uint64_t>(1, prefetcher->options().queue_rows / 4);
  // Rows of one table together (the cache lists them in slot order), hot ones first within it.
  std::stable_sort(keys_.begin(), keys_.end(), [](uint64_t a, uint64_t b) {
    return a >> kRowCacheRowBits < b >> kRowCacheRowBits;
  });
  std::vector<uint64_t> rows;
  size_t at = 0;
  while (at < keys_.size() && !stop_.load()) {
    if (prefetcher->pending_rows() >= chunk) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    // One chunk of consecutive keys of one table.
    const uint64_t layer = (keys_[at] >> kRowCacheRowBits) - 1;
    size_t index = tables.size();
    for (size_t i = 0; i < tables.size(); ++i) {
      if (tables[i]->layer_id() == layer && store->TierOf(tables[i].get()) == Tier::kCache) {
        index = i;
      }
    }
    rows.clear();
    for (; at < keys_.size() && rows.size() < chunk && (keys_[at] >> kRowCacheRowBits) - 1 == layer;
         ++at) {
      const uint64_t row = keys_[at] & ((uint64_t{1} << kRowCacheRowBits) - 1);
      if (index < tables.size() && tables[index]->covered().contains(row)) {
        rows.push_back(row);
      } else {
        skipped_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (!rows.empty()) queued_.fetch_add(prefetcher->Enqueue(index, rows));
  }
  if (!stop_.load()) {
    log::Info(
        "row cache: the hot set is queued for warming: {} rows ({} of tables not cached now "
        "or outside their rows skipped)",
        queued_.load(), skipped_.load());
  }
  done_.store(true, std::memory_order_release);
}

}  // namespace engram
