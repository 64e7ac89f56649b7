// The hot-set file, its keeper and its warmer (hot_set.h).
#include "daemon/server/hot_set.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "base/unique_fd.h"

namespace engram {
namespace {

constexpr char kMagic[8] = {'E', 'G', 'R', 'M', 'H', 'O', 'T', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 24;  // magic, version, 0, count

uint64_t Fnv(std::span<const uint64_t> keys) {
  uint64_t h = 0xcbf29ce484222325ull;
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

}  // namespace

absl::Status WriteHotSet(const std::string& path, std::span<const uint64_t> keys) {
  const std::string tmp = path + ".tmp";
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat(tmp, ": cannot create: ", strerror(errno)));
  }
  uint8_t header[kHeaderBytes] = {};
  std::memcpy(header, kMagic, 8);
  std::memcpy(header + 8, &kVersion, 4);
  const uint64_t count = keys.size();
  std::memcpy(header + 16, &count, 8);
  const uint64_t sum = Fnv(keys);
  absl::Status s = WriteAll(fd.get(), header, sizeof(header), tmp);
  if (s.ok()) s = WriteAll(fd.get(), keys.data(), keys.size_bytes(), tmp);
  if (s.ok()) s = WriteAll(fd.get(), &sum, sizeof(sum), tmp);
  if (s.ok() && fdatasync(fd.get()) != 0) {
    s = absl::InternalError(absl::StrCat(tmp, ": fdatasync: ", strerror(errno)));
  }
  fd.Reset();
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    s = absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", strerror(errno)));
  }
  if (!s.ok()) unlink(tmp.c_str());
  return s;
}

absl::StatusOr<std::vector<uint64_t>> ReadHotSet(const std::string& path, uint64_t max_keys) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no hot set written yet"));
    }
    return absl::InternalError(absl::StrCat(path, ": cannot open: ", strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) {
    return absl::InternalError(absl::StrCat(path, ": fstat: ", strerror(errno)));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint8_t header[kHeaderBytes];
  if (size < kHeaderBytes + 8 || pread(fd.get(), header, kHeaderBytes, 0) != kHeaderBytes) {
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
  if (count > (size - kHeaderBytes - 8) / 8 || kHeaderBytes + count * 8 + 8 != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": says ", count, " rows but has ", size, " bytes"));
  }
  std::vector<uint64_t> keys(count);
  uint64_t sum = 0;
  const ssize_t want = static_cast<ssize_t>(count * 8);
  if (pread(fd.get(), keys.data(), count * 8, kHeaderBytes) != want ||
      pread(fd.get(), &sum, 8, static_cast<off_t>(kHeaderBytes + count * 8)) != 8) {
    return absl::InternalError(absl::StrCat(path, ": short read"));
  }
  if (Fnv(keys) != sum) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": checksum mismatch (a torn or damaged file)"));
  }
  if (keys.size() > max_keys) keys.resize(max_keys);
  return keys;
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
