// The gather engine's O_DIRECT pass: 4 KiB-aligned page runs read into the thread's bounce area
// (registered with its ring when the kernel allows) and the rows copied out.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/page_size.h"
#include "gather/gather_reader.h"

namespace engram {
namespace {

constexpr uint64_t kMaxDirectRun = 256 * 1024;

// The emulated device (GatherEngineOptions::emulated_device): waits until `due_ns` (NowNs()).
void WaitUntilEmulated(uint64_t due_ns) {
  const timespec ts{.tv_sec = time_t(due_ns / 1'000'000'000),
                    .tv_nsec = long(due_ns % 1'000'000'000)};
  while (NowNs() < due_ns) clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
}

// One aligned page run of a file, read into the bounce area, covering reads [first, first+count).
struct PageRun {
  uint32_t file;
  uint64_t start;
  uint64_t length;
  size_t bounce_offset;
  size_t first;  // index into the pass's reads
  size_t count;
  uint64_t valid;  // bytes the read returned
};

// One run of the O_DIRECT pass: reads are gathered into page runs until the bounce area is full,
// then the runs are read (through the ring, or with blocking preads) and the rows copied out.
class DirectRun {
 public:
  DirectRun(ReaderContext& ctx, const ReadTarget& t, const std::vector<PendingRead>& reads,
            ReadCounters& c)
      : ctx_(ctx), t_(t), plan_(*t.plan), reads_(reads), c_(c) {}

  absl::Status Run() {
    bounce_bytes_ =
        std::max<size_t>(std::max(ctx_.bounce_bytes(), ctx_.direct_bounce_target), kMaxDirectRun);
    bounce_ = ctx_.Bounce(bounce_bytes_);
    if (bounce_ == nullptr) {
      return absl::ResourceExhaustedError("no memory for the O_DIRECT bounce area");
    }
    for (size_t i = 0; i < reads_.size(); ++i) {
      const PlannedRead& rd = plan_.reads[reads_[i].read];
      const uint64_t a = rd.offset / kDirectIoAlignBytes * kDirectIoAlignBytes;
      const uint64_t b = (rd.offset + rd.length + kDirectIoAlignBytes - 1) / kDirectIoAlignBytes *
                         kDirectIoAlignBytes;
      if (Extend(rd, a, b)) continue;
      if (used_ + (b - a) > bounce_bytes_) {
        if (absl::Status s = Flush(); !s.ok()) return s;
      }
      runs_.push_back({rd.file, a, b - a, used_, i, 1, 0});
      used_ += b - a;
    }
    return runs_.empty() ? absl::OkStatus() : Flush();
  }

 private:
  // Adds the read's pages [a, b) to the last run when they touch it and the run stays in bounds.
  bool Extend(const PlannedRead& rd, uint64_t a, uint64_t b) {
    if (runs_.empty()) return false;
    PageRun& run = runs_.back();
    const uint64_t end = run.start + run.length;
    const uint64_t new_length = std::max(b, end) - run.start;
    if (run.file != rd.file || a < run.start || a > end || new_length > kMaxDirectRun ||
        run.bounce_offset + new_length > bounce_bytes_) {
      return false;
    }
    if (b > end) {
      used_ += b - end;
      run.length = b - run.start;
    }
    run.count++;
    return true;
  }

  absl::Status ReadRunBlocking(PageRun& run) {
    const GatherFile& f = *(*t_.files)[run.file];
    const uint64_t due = emu_ != nullptr ? emu_->EmulatedDue(NowNs(), run.length) : 0;
    run.valid = 0;
    while (run.valid < run.length) {
      const ssize_t n = pread(f.direct_fd, bounce_ + run.bounce_offset + run.valid,
                              run.length - run.valid, run.start + run.valid);
      c_.read_calls++;
      c_.syscalls++;
      if (n < 0 && errno == EINTR) {
        c_.eintr_retries++;
        continue;
      }
      if (n < 0) {
        return absl::ErrnoToStatus(
            errno, absl::StrCat("O_DIRECT read of ", f.file->path, " at offset ",
                                run.start + run.valid, " for table ", plan_.table->Describe()));
      }
      if (n == 0) break;
      c_.bytes_read += n;
      run.valid += n;
      if (run.valid % kDirectIoAlignBytes != 0) break;  // the end of the file
    }
    c_.direct_reads++;
    if (emu_ != nullptr) {
      c_.emulated_reads++;
      if (NowNs() < due) c_.emulated_holds++;
      WaitUntilEmulated(due);
    }
    return absl::OkStatus();
  }

  // Reads every run, then copies the rows out of the bounce area.
  absl::Status Flush() {
    absl::Status s;
    if (ctx_.has_ring()) {
      s = ReadRunsOnRing();
    } else {
      for (PageRun& run : runs_) {
        if (s = ReadRunBlocking(run); !s.ok()) break;
      }
    }
    if (s.ok()) s = CopyOut();
    runs_.clear();
    used_ = 0;
    return s;
  }

  absl::Status CopyOut() {
    for (const PageRun& run : runs_) {
      for (size_t i = run.first; i < run.first + run.count; ++i) {
        const PlannedRead& rd = plan_.reads[reads_[i].read];
        const uint64_t begin = rd.offset - run.start;
        if (begin + rd.length > run.valid) {
          return EndOfFileError(t_, rd, run.valid > begin ? run.valid - begin : 0);
        }
        const uint8_t* src = bounce_ + run.bounce_offset + begin;
        for (uint32_t k = 0; k < rd.iov_count; ++k) {
          const iovec& v = plan_.iovs[rd.iov_begin + k];
          if (plan_.iov_unique[rd.iov_begin + k] != kGapIov)
            std::memcpy(v.iov_base, src, v.iov_len);
          src += v.iov_len;
        }
      }
    }
    return absl::OkStatus();
  }

  void CompleteRun(const io_uring_cqe& cqe) {
    ++completed_;
    const size_t i = cqe.user_data;
    PageRun& run = runs_[i];
    const int res = cqe.res;
    if (res < 0) {
      retry_[i] = 1;  // EINTR, EAGAIN, ECANCELED or a real error: read it plainly
      return;
    }
    c_.bytes_read += res;
    c_.direct_reads++;
    c_.fixed_reads += fixed_buffer_;
    if (emu_ != nullptr) {
      // Held: the flush waits for the latest due of its reads (ReadRunsOnRing).
      c_.emulated_reads++;
      if (NowNs() < due_[i]) c_.emulated_holds++;
    }
    run.valid = res;
    // A short read that stopped on an aligned boundary before the end is finished with blocking
    // reads; an unaligned one reached the end of the file.
    if (res < static_cast<int64_t>(run.length) && res % kDirectIoAlignBytes == 0 && res > 0) {
      retry_[i] = 1;
    }
  }

  void SubmitRuns() {
    while (submitted_ < runs_.size() && submitted_ - completed_ < ctx_.slots.size()) {
      io_uring_sqe* sqe = io_uring_get_sqe(ctx_.ring());
      if (sqe == nullptr) break;
      PageRun& run = runs_[submitted_];
      const GatherFile& f = *(*t_.files)[run.file];
      const bool fixed = ctx_.fixed_files() && f.direct_fixed_index >= 0;
      const int fd = fixed ? f.direct_fixed_index : f.direct_fd;
      if (fixed_buffer_) {
        io_uring_prep_read_fixed(sqe, fd, bounce_ + run.bounce_offset, run.length, run.start,
                                 /*buf_index=*/0);
      } else {
        io_uring_prep_read(sqe, fd, bounce_ + run.bounce_offset, run.length, run.start);
      }
      if (fixed) sqe->flags |= IOSQE_FIXED_FILE;
      if (emu_ != nullptr) due_[submitted_] = emu_->EmulatedDue(NowNs(), run.length);
      io_uring_sqe_set_data64(sqe, submitted_);
      ++submitted_;
      c_.read_calls++;
    }
  }

  absl::Status ReadRunsOnRing() {
    // Registered once per ring and bounce area; the kernel then skips pinning the bounce pages
    // on every read.
    fixed_buffer_ = ctx_.FixedBounce();
    submitted_ = completed_ = 0;
    retry_.assign(runs_.size(), 0);
    due_.assign(runs_.size(), 0);
    while (completed_ < runs_.size()) {
      SubmitRuns();
      const int r = ctx_.SubmitAndWait(1);
      c_.syscalls++;
      if (ReaderContext::FatalEnterError(r)) {
        RecoverFromRing(-r);
        break;
      }
      unsigned head, seen = 0;
      io_uring_cqe* cqe;
      io_uring_for_each_cqe(ctx_.ring(), head, cqe) {
        ++seen;
        CompleteRun(*cqe);
      }
      io_uring_cq_advance(ctx_.ring(), seen);
    }
    // The emulated device: reads were submitted without waiting for it, so they overlap as on a
    // device with a deep queue; the flush (whose rows are copied out together) ends with the last.
    if (emu_ != nullptr && !due_.empty()) {
      WaitUntilEmulated(*std::max_element(due_.begin(), due_.end()));
    }
    for (size_t i = 0; i < runs_.size(); ++i) {
      if (!retry_[i]) continue;
      if (absl::Status s = ReadRunBlocking(runs_[i]); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // The runs in flight land in the bounce area, which the next flush reuses: reap them all, then
  // read what did not complete (or never started) with blocking reads.
  void RecoverFromRing(int err) {
    uint32_t inflight = static_cast<uint32_t>(submitted_ - completed_);
    ctx_.RecoverRing(
        err, inflight, absl::StrCat("table ", plan_.table->Describe(), " (O_DIRECT)"),
        [&](uint64_t i) {
          retry_[i] = 1;
          ++completed_;
        },
        [&](const io_uring_cqe& cqe) { CompleteRun(cqe); }, c_);
    for (; submitted_ < runs_.size(); ++submitted_, ++completed_) retry_[submitted_] = 1;
  }

  ReaderContext& ctx_;
  ReaderShared* const emu_ = ctx_.emulation();  // null: no emulated device
  const ReadTarget& t_;
  const GatherPlan& plan_;
  const std::vector<PendingRead>& reads_;
  ReadCounters& c_;
  uint8_t* bounce_ = nullptr;
  size_t bounce_bytes_ = 0;
  std::vector<PageRun> runs_;
  size_t used_ = 0;
  // Ring state of one flush.
  bool fixed_buffer_ = false;
  size_t submitted_ = 0, completed_ = 0;
  std::vector<uint8_t> retry_;
  std::vector<uint64_t> due_;  // the emulated device's completion of each run (NowNs())
};

}  // namespace

absl::Status DirectPass(ReaderContext& ctx, const ReadTarget& t,
                        const std::vector<PendingRead>& reads, ReadCounters& c) {
  return DirectRun(ctx, t, reads, c).Run();
}

}  // namespace engram
