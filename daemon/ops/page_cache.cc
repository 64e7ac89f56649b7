// warm and evict steps and their worker thread (page_cache.h).
#include "daemon/ops/page_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"

namespace engram {

std::vector<FileRange> RangesOf(const Table& table, uint64_t begin, uint64_t end) {
  std::vector<FileRange> out;
  for (const RowPart& p : table.parts()) {
    const TableFile& f = table.files()[p.file];
    const uint64_t a = p.FileOffset(begin), b = p.FileOffset(end);
    out.push_back({f.fd, &f.path, a, std::min(b, f.size) - std::min(a, f.size)});
  }
  return out;
}

RowRange StepOf(const Table& table, RowRange range) {
  const uint64_t step_rows = std::max<uint64_t>(1, kMaxPageCacheStepBytes / table.row_bytes());
  return RowRange{range.begin, std::min(range.end, range.begin + step_rows)};
}

absl::StatusOr<uint64_t> WarmRows(const Table& table, RowRange step) {
  std::vector<char> buffer(1u << 20);
  uint64_t bytes = 0;
  for (const FileRange& r : RangesOf(table, step.begin, step.end)) {
    posix_fadvise(r.fd, static_cast<off_t>(r.offset), static_cast<off_t>(r.bytes),
                  POSIX_FADV_WILLNEED);
    for (uint64_t at = r.offset; at < r.offset + r.bytes;) {
      const size_t want =
          static_cast<size_t>(std::min<uint64_t>(buffer.size(), r.offset + r.bytes - at));
      const ssize_t n = pread(r.fd, buffer.data(), want, static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return absl::DataLossError(absl::StrFormat("reading %s at %u to warm it: %s", *r.path, at,
                                                   n == 0 ? "end of file" : strerror(errno)));
      }
      at += static_cast<uint64_t>(n);
      bytes += static_cast<uint64_t>(n);
    }
  }
  return bytes;
}

absl::StatusOr<uint64_t> EvictRows(const Table& table, RowRange step) {
  uint64_t bytes = 0;
  for (const FileRange& r : RangesOf(table, step.begin, step.end)) {
    if (int rc = posix_fadvise(r.fd, static_cast<off_t>(r.offset), static_cast<off_t>(r.bytes),
                               POSIX_FADV_DONTNEED);
        rc != 0) {
      return absl::InternalError(
          absl::StrFormat("posix_fadvise(DONTNEED) on %s: %s", *r.path, strerror(rc)));
    }
    bytes += r.bytes;
  }
  return bytes;
}

PageCacheWorker::~PageCacheWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool PageCacheWorker::Post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (jobs_.size() >= max_queued_) return false;
    jobs_.push_back(std::move(job));
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  cv_.notify_one();
  return true;
}

void PageCacheWorker::Loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, nothing left
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

}  // namespace engram
