// The gather engine's readers: RWF_NOWAIT passes, buffered io_uring, blocking preadv2 and
// O_DIRECT page runs, each resuming short reads where they stopped.
#include "daemon/gather_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace engram {
namespace {

constexpr uint64_t kDirectAlign = 4096;
constexpr uint64_t kMaxDirectRun = 256 * 1024;
// A blocking read that keeps answering EAGAIN (only a ReadFn can make it) is an error after this
// many tries instead of a spin.
constexpr int kMaxBlockingRetries = 1000;

ssize_t DoRead(const ReadTarget& t, int fd, const iovec* iov, int cnt, off_t off, int flags) {
  if (t.read_fn != nullptr && *t.read_fn) return (*t.read_fn)(fd, iov, cnt, off, flags);
  const ssize_t n = preadv2(fd, iov, cnt, off, flags);
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

}  // namespace

void ReadCounters::Add(const ReadCounters& o) {
  read_calls += o.read_calls;
  nowait_reads_hit += o.nowait_reads_hit;
  partial_reads += o.partial_reads;
  uring_reads += o.uring_reads;
  pool_reads += o.pool_reads;
  direct_reads += o.direct_reads;
  bytes_read += o.bytes_read;
  nowait_zero += o.nowait_zero;
  eintr_retries += o.eintr_retries;
  syscalls += o.syscalls;
}

ReaderContext::~ReaderContext() {
  if (has_ring_) io_uring_queue_exit(&ring_);
  std::free(bounce_);
}

absl::Status ReaderContext::InitRing(uint32_t entries, uint32_t max_fixed_files) {
  io_uring_params params{};
  // COOP_TASKRUN: completions run when this thread enters the kernel anyway, not by IPI.
  params.flags = IORING_SETUP_COOP_TASKRUN;
  int r = io_uring_queue_init_params(entries, &ring_, &params);
  if (r == -EINVAL) {
    params = {};
    r = io_uring_queue_init_params(entries, &ring_, &params);
  }
  if (r < 0) return absl::ErrnoToStatus(-r, "io_uring_queue_init");
  has_ring_ = true;
  if (max_fixed_files > 0 && io_uring_register_files_sparse(&ring_, max_fixed_files) == 0) {
    fixed_files_ = true;
  }
  slots.resize(entries);
  free_slots.clear();
  for (uint32_t i = entries; i > 0; --i) free_slots.push_back(i - 1);
  return absl::OkStatus();
}

void ReaderContext::SyncFixedFiles(const std::vector<int>& fds,
                                   const std::vector<uint64_t>& versions, uint64_t generation) {
  // Update only the slots that changed (tables added or removed since the last sync); -1 clears
  // a slot so the ring drops its reference to a closed table's file.
  if (fixed_files_) {
    registered_versions_.resize(fds.size(), 0);
    for (size_t i = 0; i < fds.size() && fixed_files_; ++i) {
      if (registered_versions_[i] == versions[i]) continue;
      size_t j = i;
      while (j < fds.size() && registered_versions_[j] != versions[j]) ++j;
      if (io_uring_register_files_update(&ring_, i, const_cast<int*>(fds.data() + i), j - i) < 0) {
        fixed_files_ = false;  // plain fds from now on
        break;
      }
      std::copy(versions.begin() + i, versions.begin() + j, registered_versions_.begin() + i);
      i = j;
    }
  }
  fixed_generation_ = generation;
}

uint8_t* ReaderContext::Bounce(size_t bytes) {
  if (bounce_bytes_ < bytes) {
    std::free(bounce_);
    bounce_ = static_cast<uint8_t*>(std::aligned_alloc(kDirectAlign, bytes));
    bounce_bytes_ = bounce_ != nullptr ? bytes : 0;
  }
  return bounce_;
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
      const iovec* iov = &plan.iovs[rd.iov_begin];
      int cnt = static_cast<int>(rd.iov_count);
      if (p.done > 0) {
        RemainingIovs(plan, rd, p.done, rest);
        iov = rest.data();
        cnt = static_cast<int>(rest.size());
      }
      const uint32_t remaining = rd.length - p.done;
      const ssize_t n = DoRead(t, f.fd, iov, cnt, rd.offset + p.done, RWF_NOWAIT);
      c.read_calls++;
      c.syscalls++;
      if (n == remaining) {
        c.bytes_read += n;
        c.nowait_reads_hit++;
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
      if (n == -EOPNOTSUPP || n == -EINVAL) {
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
    const iovec* iov = &plan.iovs[rd.iov_begin];
    int cnt = static_cast<int>(rd.iov_count);
    if (p.done > 0) {
      RemainingIovs(plan, rd, p.done, rest);
      iov = rest.data();
      cnt = static_cast<int>(rest.size());
    }
    const uint32_t remaining = rd.length - p.done;
    const ssize_t n = DoRead(t, f.fd, iov, cnt, rd.offset + p.done, 0);
    c.read_calls++;
    c.syscalls++;
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

absl::Status UringPass(ReaderContext& ctx, const ReadTarget& t,
                       const std::vector<PendingRead>& reads, bool nowait,
                       std::vector<PendingRead>* residue, ReadCounters& c) {
  const GatherPlan& plan = *t.plan;
  io_uring* ring = ctx.ring();
  std::vector<PendingRead>& queue = ctx.queue;  // reads to (re)submit before the next input
  queue.clear();
  size_t next = 0;
  uint32_t inflight = 0;
  absl::Status first_error;
  auto fail = [&](absl::Status s) {
    if (first_error.ok()) first_error = std::move(s);
  };
  auto take = [&](PendingRead& out) {
    if (!queue.empty()) {
      out = queue.back();
      queue.pop_back();
      return true;
    }
    if (next < reads.size()) {
      out = reads[next++];
      return true;
    }
    return false;
  };
  while (true) {
    while (first_error.ok() && !ctx.free_slots.empty()) {
      PendingRead p;
      if (!take(p)) break;
      const PlannedRead& rd = plan.reads[p.read];
      GatherFile& f = *(*t.files)[rd.file];
      if (nowait && !f.nowait_ok.load(std::memory_order_relaxed)) {
        residue->push_back(p);
        continue;
      }
      if (!nowait && !f.uring_ok.load(std::memory_order_relaxed)) {
        if (absl::Status s = BlockingRead(t, p, c); !s.ok()) fail(std::move(s));
        continue;
      }
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (sqe == nullptr) {
        queue.push_back(p);
        break;
      }
      const uint32_t s = ctx.free_slots.back();
      ctx.free_slots.pop_back();
      ReaderContext::Slot& slot = ctx.slots[s];
      slot.p = p;
      const iovec* iov = &plan.iovs[rd.iov_begin];
      unsigned cnt = rd.iov_count;
      if (p.done > 0) {
        RemainingIovs(plan, rd, p.done, slot.iovs);
        iov = slot.iovs.data();
        cnt = slot.iovs.size();
      }
      const bool fixed = ctx.fixed_files() && f.fixed_index >= 0;
      const int fd = fixed ? f.fixed_index : f.fd;
      if (cnt == 1) {
        io_uring_prep_read(sqe, fd, iov[0].iov_base, iov[0].iov_len, rd.offset + p.done);
      } else {
        io_uring_prep_readv(sqe, fd, iov, cnt, rd.offset + p.done);
      }
      if (fixed) sqe->flags |= IOSQE_FIXED_FILE;
      sqe->rw_flags = nowait ? RWF_NOWAIT : 0;
      io_uring_sqe_set_data64(sqe, s);
      inflight++;
      c.read_calls++;
    }
    if (inflight == 0) break;
    const int r = io_uring_submit_and_wait(ring, 1);
    c.syscalls++;
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      // The ring cannot take or report work any more; what was submitted may still land in the
      // slots, so this is fatal for the batch.
      return absl::ErrnoToStatus(
          -r, absl::StrCat("io_uring_enter while reading table ", plan.table->Describe()));
    }
    unsigned head;
    unsigned seen = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(ring, head, cqe) {
      ++seen;
      const uint32_t s = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      PendingRead p = ctx.slots[s].p;
      ctx.free_slots.push_back(s);
      inflight--;
      const PlannedRead& rd = plan.reads[p.read];
      GatherFile& f = *(*t.files)[rd.file];
      const uint32_t remaining = rd.length - p.done;
      if (res == static_cast<int>(remaining)) {
        c.bytes_read += res;
        if (nowait) {
          c.nowait_reads_hit++;
        } else {
          c.uring_reads++;
        }
      } else if (res > 0 && res < static_cast<int>(remaining)) {
        c.partial_reads++;
        c.bytes_read += res;
        p.done += res;
        queue.push_back(p);
      } else if (res == 0) {
        if (nowait) {
          c.nowait_zero++;
          residue->push_back(p);
        } else {
          fail(EndOfFileError(t, rd, p.done));
        }
      } else if (res == -EINTR) {
        c.eintr_retries++;
        queue.push_back(p);
      } else if (res == -EAGAIN) {
        if (nowait) {
          residue->push_back(p);
        } else if (absl::Status st = BlockingRead(t, p, c); !st.ok()) {
          fail(std::move(st));
        }
      } else if (nowait && (res == -EOPNOTSUPP || res == -EINVAL)) {
        DisableNowait(t, f, -res);
        residue->push_back(p);
      } else if (!nowait && res == -EOPNOTSUPP) {
        f.uring_ok.store(false, std::memory_order_relaxed);
        if (absl::Status st = BlockingRead(t, p, c); !st.ok()) fail(std::move(st));
      } else if (res > 0) {
        fail(absl::InternalError("io_uring read returned more bytes than asked for"));
      } else {
        fail(ReadError(t, rd, p.done, -res));
      }
    }
    io_uring_cq_advance(ring, seen);
  }
  return first_error;
}

absl::Status DirectPass(ReaderContext& ctx, const ReadTarget& t,
                        const std::vector<PendingRead>& reads, ReadCounters& c) {
  const GatherPlan& plan = *t.plan;
  struct Run {
    uint32_t file;
    uint64_t start;
    uint64_t length;
    size_t bounce_offset;
    size_t first;  // index into `reads`
    size_t count;
    uint64_t valid;  // bytes the read returned
  };
  const size_t bounce_bytes =
      std::max<size_t>(std::max(ctx.bounce_bytes(), ctx.direct_bounce_target), kMaxDirectRun);
  uint8_t* bounce = ctx.Bounce(bounce_bytes);
  if (bounce == nullptr)
    return absl::ResourceExhaustedError("no memory for the O_DIRECT bounce area");
  std::vector<Run> runs;
  size_t used = 0;

  auto read_run_blocking = [&](Run& run) -> absl::Status {
    const GatherFile& f = *(*t.files)[run.file];
    run.valid = 0;
    while (run.valid < run.length) {
      const ssize_t n = pread(f.direct_fd, bounce + run.bounce_offset + run.valid,
                              run.length - run.valid, run.start + run.valid);
      c.read_calls++;
      c.syscalls++;
      if (n < 0 && errno == EINTR) {
        c.eintr_retries++;
        continue;
      }
      if (n < 0) {
        return absl::ErrnoToStatus(
            errno, absl::StrCat("O_DIRECT read of ", f.file->path, " at offset ",
                                run.start + run.valid, " for table ", plan.table->Describe()));
      }
      if (n == 0) break;
      c.bytes_read += n;
      run.valid += n;
      if (run.valid % kDirectAlign != 0) break;  // the end of the file
    }
    c.direct_reads++;
    return absl::OkStatus();
  };

  auto flush = [&]() -> absl::Status {
    absl::Status first_error;
    if (ctx.has_ring()) {
      io_uring* ring = ctx.ring();
      size_t submitted = 0, completed = 0;
      std::vector<uint8_t> retry(runs.size(), 0);
      while (completed < runs.size()) {
        while (submitted < runs.size() && submitted - completed < ctx.slots.size()) {
          io_uring_sqe* sqe = io_uring_get_sqe(ring);
          if (sqe == nullptr) break;
          Run& run = runs[submitted];
          const GatherFile& f = *(*t.files)[run.file];
          const bool fixed = ctx.fixed_files() && f.direct_fixed_index >= 0;
          io_uring_prep_read(sqe, fixed ? f.direct_fixed_index : f.direct_fd,
                             bounce + run.bounce_offset, run.length, run.start);
          if (fixed) sqe->flags |= IOSQE_FIXED_FILE;
          io_uring_sqe_set_data64(sqe, submitted);
          ++submitted;
          c.read_calls++;
        }
        const int r = io_uring_submit_and_wait(ring, 1);
        c.syscalls++;
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
          return absl::ErrnoToStatus(-r, "io_uring_enter for O_DIRECT reads");
        }
        unsigned head, seen = 0;
        io_uring_cqe* cqe;
        io_uring_for_each_cqe(ring, head, cqe) {
          ++seen;
          ++completed;
          Run& run = runs[io_uring_cqe_get_data64(cqe)];
          const int res = cqe->res;
          if (res >= 0) {
            c.bytes_read += res;
            c.direct_reads++;
            run.valid = res;
            // A short read that stopped on an aligned boundary before the end is finished below
            // with blocking reads; an unaligned one reached the end of the file.
            if (res < static_cast<int64_t>(run.length) && res % kDirectAlign == 0 && res > 0) {
              retry[&run - runs.data()] = 1;
            }
          } else {
            retry[&run - runs.data()] = 1;  // EINTR, EAGAIN or a real error: read it plainly
          }
        }
        io_uring_cq_advance(ring, seen);
      }
      for (size_t i = 0; i < runs.size(); ++i) {
        if (retry[i] && first_error.ok()) first_error = read_run_blocking(runs[i]);
      }
    } else {
      for (Run& run : runs) {
        if (absl::Status s = read_run_blocking(run); !s.ok()) return s;
      }
    }
    if (!first_error.ok()) return first_error;
    for (const Run& run : runs) {
      for (size_t i = run.first; i < run.first + run.count; ++i) {
        const PlannedRead& rd = plan.reads[reads[i].read];
        const uint64_t begin = rd.offset - run.start;
        if (begin + rd.length > run.valid) {
          return EndOfFileError(t, rd, run.valid > begin ? run.valid - begin : 0);
        }
        const uint8_t* src = bounce + run.bounce_offset + begin;
        for (uint32_t k = 0; k < rd.iov_count; ++k) {
          const iovec& v = plan.iovs[rd.iov_begin + k];
          if (plan.iov_unique[rd.iov_begin + k] != kGapIov) std::memcpy(v.iov_base, src, v.iov_len);
          src += v.iov_len;
        }
      }
    }
    runs.clear();
    used = 0;
    return absl::OkStatus();
  };

  for (size_t i = 0; i < reads.size(); ++i) {
    const PlannedRead& rd = plan.reads[reads[i].read];
    const uint64_t a = rd.offset / kDirectAlign * kDirectAlign;
    const uint64_t b = (rd.offset + rd.length + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    if (!runs.empty()) {
      Run& run = runs.back();
      const uint64_t end = run.start + run.length;
      if (run.file == rd.file && a >= run.start && a <= end &&
          std::max(b, end) - run.start <= kMaxDirectRun &&
          run.bounce_offset + (std::max(b, end) - run.start) <= bounce_bytes) {
        if (b > end) {
          used += b - end;
          run.length = b - run.start;
        }
        run.count++;
        continue;
      }
    }
    if (used + (b - a) > bounce_bytes) {
      if (absl::Status s = flush(); !s.ok()) return s;
    }
    runs.push_back({rd.file, a, b - a, used, i, 1, 0});
    used += b - a;
  }
  if (!runs.empty()) return flush();
  return absl::OkStatus();
}

}  // namespace engram
