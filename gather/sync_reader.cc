// The gather engine's synchronous reads: the serial RWF_NOWAIT pass and blocking reads (the
// pool's and the fallback of every other pass), and the errors that name a failed read's row.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "gather/gather_reader.h"

namespace engram {
namespace {

// A blocking read that keeps answering EAGAIN (only a ReadFn can make it) is an error after this
// many tries instead of a spin.
constexpr int kMaxBlockingRetries = 1000;

// Set once preadv2 answered ENOSYS (an emulator may not implement it): blocking reads use
// preadv from then on, and RWF_NOWAIT reads answer ENOSYS so their file leaves the fast path.
std::atomic<bool> g_preadv2_missing{false};

ssize_t DoRead(const ReadTarget& t, int fd, const iovec* iov, int cnt, off_t off, int flags) {
  if (t.read_fn != nullptr && *t.read_fn) return (*t.read_fn)(fd, iov, cnt, off, flags);
  if (!g_preadv2_missing.load(std::memory_order_relaxed)) {
    const ssize_t n = preadv2(fd, iov, cnt, off, flags);
    if (n >= 0) return n;
    if (errno != ENOSYS) return -errno;
    g_preadv2_missing.store(true, std::memory_order_relaxed);
  }
  if (flags != 0) return -ENOSYS;
  const ssize_t n = preadv(fd, iov, cnt, off);
  return n < 0 ? -errno : n;
}

// The row a read was serving at byte `done` (the first row byte at or after it).
uint64_t RowAt(const GatherPlan& plan, const PlannedRead& read, uint32_t done) {
  uint64_t pos = 0;
  uint32_t last = kGapIov;
  for (uint32_t i = 0; i < read.iov_count; ++i) {
    const uint32_t u = plan.iov_unique[read.iov_begin + i];
    if (u != kGapIov) last = u;
    pos += plan.iovs[read.iov_begin + i].iov_len;
    if (pos > done && u != kGapIov) return plan.unique_rows[u];
  }
  return last == kGapIov ? 0 : plan.unique_rows[last];
}

}  // namespace

absl::Status ReadError(const ReadTarget& t, const PlannedRead& read, uint32_t done, int err) {
  const GatherPlan& plan = *t.plan;
  const TableFile& f = plan.table->files()[read.file];
  return absl::ErrnoToStatus(err, absl::StrCat("reading row ", RowAt(plan, read, done),
                                               " of table ", plan.table->Describe(), " from ",
                                               f.path, " at offset ", read.offset + done));
}

void DisableNowait(const ReadTarget& t, GatherFile& f, int err) {
  f.nowait_ok.store(false, std::memory_order_relaxed);
  if (!f.notice_sent.exchange(true) && t.notice != nullptr && *t.notice) {
    (*t.notice)(absl::StrCat("RWF_NOWAIT is not supported for ", f.file->path, " (",
                             std::strerror(err),
                             "): its rows skip the page-cache fast path from now on"));
  }
}

void RemainingIovs(const GatherPlan& plan, const PlannedRead& read, uint32_t done,
                   std::vector<iovec>& out) {
  out.clear();
  uint64_t skip = done;
  for (uint32_t i = 0; i < read.iov_count; ++i) {
    iovec v = plan.iovs[read.iov_begin + i];
    if (skip >= v.iov_len) {
      skip -= v.iov_len;
      continue;
    }
    v.iov_base = static_cast<uint8_t*>(v.iov_base) + skip;
    v.iov_len -= skip;
    skip = 0;
    out.push_back(v);
  }
}

// Reads what is left of `rd` from byte `done` on (the iovecs past it built in `rest`), with
// `flags`, and counts the call.
ssize_t ReadRest(const ReadTarget& t, const PlannedRead& rd, int fd, uint32_t done, int flags,
                 std::vector<iovec>& rest, ReadCounters& c) {
  const GatherPlan& plan = *t.plan;
  const iovec* iov = &plan.iovs[rd.iov_begin];
  int cnt = static_cast<int>(rd.iov_count);
  if (done > 0) {
    RemainingIovs(plan, rd, done, rest);
    iov = rest.data();
    cnt = static_cast<int>(rest.size());
  }
  c.read_calls++;
  c.syscalls++;
  return DoRead(t, fd, iov, cnt, rd.offset + done, flags);
}

absl::Status EndOfFileError(const ReadTarget& t, const PlannedRead& read, uint32_t done) {
  const GatherPlan& plan = *t.plan;
  const TableFile& f = plan.table->files()[read.file];
  struct stat st {};
  const uint64_t size = fstat(f.fd, &st) == 0 ? st.st_size : f.size;
  return absl::DataLossError(
      absl::StrCat("row ", RowAt(plan, read, done), " of table ", plan.table->Describe(), ": file ",
                   f.path, " ended at byte ", read.offset + done, " (size ", size,
                   ") while reading bytes [", read.offset, ", ", read.offset + read.length, ")"));
}

absl::Status NowaitPassSerial(const ReadTarget& t, const std::vector<PendingRead>& reads,
                              std::vector<PendingRead>& residue, ReadCounters& c) {
  const GatherPlan& plan = *t.plan;
  thread_local std::vector<iovec> rest;
  for (PendingRead p : reads) {
    const PlannedRead& rd = plan.reads[p.read];
    GatherFile& f = *(*t.files)[rd.file];
    while (true) {
      if (!f.nowait_ok.load(std::memory_order_relaxed)) {
        residue.push_back(p);
        break;
      }
      const uint32_t remaining = rd.length - p.done;
      const ssize_t n = ReadRest(t, rd, f.fd, p.done, RWF_NOWAIT, rest, c);
      if (n == remaining) {
        c.bytes_read += n;
        break;
      }
      if (n > 0 && n < remaining) {  // a page of the range is not resident: go on from there
        c.partial_reads++;
        c.bytes_read += n;
        p.done += static_cast<uint32_t>(n);
        continue;
      }
      if (n == 0) {  // Linux 5.9/5.10 may answer 0 before EOF: a miss, not the end
        c.nowait_zero++;
        residue.push_back(p);
        break;
      }
      if (n == -EINTR) {
        c.eintr_retries++;
        continue;
      }
      if (n == -EAGAIN) {
        residue.push_back(p);
        break;
      }
      if (n == -EOPNOTSUPP || n == -EINVAL || n == -ENOSYS) {
        DisableNowait(t, f, static_cast<int>(-n));
        residue.push_back(p);
        break;
      }
      if (n > 0) return absl::InternalError("read returned more bytes than asked for");
      return ReadError(t, rd, p.done, static_cast<int>(-n));
    }
  }
  return absl::OkStatus();
}

absl::Status BlockingRead(const ReadTarget& t, PendingRead p, ReadCounters& c) {
  const GatherPlan& plan = *t.plan;
  const PlannedRead& rd = plan.reads[p.read];
  const GatherFile& f = *(*t.files)[rd.file];
  std::vector<iovec> rest;
  int again = 0;
  while (true) {
    const uint32_t remaining = rd.length - p.done;
    const ssize_t n = ReadRest(t, rd, f.fd, p.done, 0, rest, c);
    if (n == remaining) {
      c.bytes_read += n;
      c.pool_reads++;
      return absl::OkStatus();
    }
    if (n > 0 && n < remaining) {
      c.partial_reads++;
      c.bytes_read += n;
      p.done += static_cast<uint32_t>(n);
      continue;
    }
    if (n == 0) return EndOfFileError(t, rd, p.done);
    if (n == -EINTR) {
      c.eintr_retries++;
      continue;
    }
    if (n == -EAGAIN && ++again < kMaxBlockingRetries) continue;
    if (n > 0) return absl::InternalError("read returned more bytes than asked for");
    return ReadError(t, rd, p.done, static_cast<int>(-n));
  }
}

}  // namespace engram
