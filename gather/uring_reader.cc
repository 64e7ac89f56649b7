// The gather engine's io_uring pass: buffered reads (with RWF_NOWAIT for the fast pass) through a
// thread's own ring, short reads resumed and a failing ring survived.
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
#include "gather/gather_reader.h"

namespace engram {

namespace {

// One run of the io_uring pass over `reads`: queues reads into free slots of the context's ring,
// reaps their completions and routes each (done, resumed, residue, blocking fallback, error).
class UringRun {
 public:
  UringRun(ReaderContext& ctx, const ReadTarget& t, const std::vector<PendingRead>& reads,
           bool nowait, std::vector<PendingRead>* residue, ReadCounters& c)
      : ctx_(ctx),
        t_(t),
        plan_(*t.plan),
        reads_(reads),
        nowait_(nowait),
        residue_(residue),
        c_(c),
        queue_(ctx.queue) {
    queue_.clear();
  }

  absl::Status Run() {
    int ring_failures = 0;
    while (true) {
      QueueReads();
      if (inflight_ == 0) break;
      const int r = ctx_.SubmitAndWait(1);
      c_.syscalls++;
      if (ReaderContext::FatalEnterError(r)) {
        Recover(-r);
        // The fresh ring takes the rest; after a second failure in one pass, the blocking path.
        if (ctx_.has_ring() && ++ring_failures == 1) continue;
        FinishWithoutRing();
        break;
      }
      Reap();
    }
    return first_error_;
  }

 private:
  void Fail(absl::Status s) {
    if (first_error_.ok()) first_error_ = std::move(s);
  }

  // The next read to submit: a resumed or retried one first, then the next input.
  bool Take(PendingRead& out) {
    if (!queue_.empty()) {
      out = queue_.back();
      queue_.pop_back();
      return true;
    }
    if (next_ < reads_.size()) {
      out = reads_[next_++];
      return true;
    }
    return false;
  }

  // A read this pass cannot put on the ring: the NOWAIT pass hands it on, the residue pass reads
  // it with blocking reads.
  void Bypass(const PendingRead& p) {
    if (nowait_) {
      residue_->push_back(p);
    } else if (first_error_.ok()) {
      if (absl::Status s = BlockingRead(t_, p, c_); !s.ok()) Fail(std::move(s));
    }
  }

  // Fills free slots with reads while the ring takes them.
  void QueueReads() {
    PendingRead p;
    while (first_error_.ok() && !ctx_.free_slots.empty() && Take(p)) {
      const PlannedRead& rd = plan_.reads[p.read];
      GatherFile& f = *(*t_.files)[rd.file];
      if ((nowait_ && !f.nowait_ok.load(std::memory_order_relaxed)) ||
          (!nowait_ && !f.uring_ok.load(std::memory_order_relaxed))) {
        Bypass(p);
        continue;
      }
      io_uring_sqe* sqe = io_uring_get_sqe(ctx_.ring());
      if (sqe == nullptr) {
        queue_.push_back(p);
        break;
      }
      Prepare(sqe, p, rd, f);
    }
  }

  void Prepare(io_uring_sqe* sqe, const PendingRead& p, const PlannedRead& rd,
               const GatherFile& f) {
    const uint32_t s = ctx_.free_slots.back();
    ctx_.free_slots.pop_back();
    ReaderContext::Slot& slot = ctx_.slots[s];
    slot.p = p;
    const iovec* iov = &plan_.iovs[rd.iov_begin];
    unsigned cnt = rd.iov_count;
    if (p.done > 0) {  // resumed: the iovecs must live in the slot until the read completes
      RemainingIovs(plan_, rd, p.done, slot.iovs);
      iov = slot.iovs.data();
      cnt = slot.iovs.size();
    }
    const bool fixed = ctx_.fixed_files() && f.fixed_index >= 0;
    const int fd = fixed ? f.fixed_index : f.fd;
    if (cnt == 1) {
      io_uring_prep_read(sqe, fd, iov[0].iov_base, iov[0].iov_len, rd.offset + p.done);
    } else {
      io_uring_prep_readv(sqe, fd, iov, cnt, rd.offset + p.done);
    }
    if (fixed) sqe->flags |= IOSQE_FIXED_FILE;
    sqe->rw_flags = nowait_ ? RWF_NOWAIT : 0;
    io_uring_sqe_set_data64(sqe, s);
    inflight_++;
    c_.read_calls++;
  }

  void Reap() {
    unsigned head;
    unsigned seen = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(ctx_.ring(), head, cqe) {
      ++seen;
      inflight_--;
      Complete(*cqe);
    }
    io_uring_cq_advance(ctx_.ring(), seen);
  }

  // One completion: frees its slot and routes the read on.
  void Complete(const io_uring_cqe& cqe) {
    const uint32_t s = static_cast<uint32_t>(cqe.user_data);
    const int res = cqe.res;
    PendingRead p = ctx_.slots[s].p;
    ctx_.free_slots.push_back(s);
    const PlannedRead& rd = plan_.reads[p.read];
    GatherFile& f = *(*t_.files)[rd.file];
    const uint32_t remaining = rd.length - p.done;
    if (res == static_cast<int>(remaining)) {
      c_.bytes_read += res;
      if (!nowait_) c_.uring_reads++;
    } else if (res > 0 && res < static_cast<int>(remaining)) {
      c_.partial_reads++;
      c_.bytes_read += res;
      p.done += res;
      queue_.push_back(p);
    } else if (res == 0) {
      if (nowait_) {
        c_.nowait_zero++;
        residue_->push_back(p);
      } else {
        Fail(EndOfFileError(t_, rd, p.done));
      }
    } else if (res == -EINTR || res == -ECANCELED) {  // ECANCELED: cancelled by RecoverRing
      c_.eintr_retries += res == -EINTR;
      queue_.push_back(p);
    } else {
      CompleteFailed(p, rd, f, res);
    }
  }

  void CompleteFailed(const PendingRead& p, const PlannedRead& rd, GatherFile& f, int res) {
    if (res == -EAGAIN) {
      if (nowait_) {
        residue_->push_back(p);
      } else if (absl::Status st = BlockingRead(t_, p, c_); !st.ok()) {
        Fail(std::move(st));
      }
    } else if (nowait_ && (res == -EOPNOTSUPP || res == -EINVAL)) {
      DisableNowait(t_, f, -res);
      residue_->push_back(p);
    } else if (!nowait_ && res == -EOPNOTSUPP) {
      f.uring_ok.store(false, std::memory_order_relaxed);
      if (absl::Status st = BlockingRead(t_, p, c_); !st.ok()) Fail(std::move(st));
    } else if (res > 0) {
      Fail(absl::InternalError("io_uring read returned more bytes than asked for"));
    } else {
      Fail(ReadError(t_, rd, p.done, -res));
    }
  }

  // Reads that never started go back to the queue; those the kernel took are reaped before
  // anything else happens, so no read can land in a destination after this pass returns.
  void Recover(int err) {
    ctx_.RecoverRing(
        err, inflight_, absl::StrCat("table ", plan_.table->Describe()),
        [&](uint64_t s) {
          queue_.push_back(ctx_.slots[s].p);
          ctx_.free_slots.push_back(static_cast<uint32_t>(s));
        },
        [&](const io_uring_cqe& cqe) { Complete(cqe); }, c_);
  }

  // Nothing is in flight any more: the NOWAIT pass hands what is left to the residue pass that
  // follows it; the residue pass reads it with blocking reads.
  void FinishWithoutRing() {
    PendingRead p;
    while (Take(p)) Bypass(p);
  }

  ReaderContext& ctx_;
  const ReadTarget& t_;
  const GatherPlan& plan_;
  const std::vector<PendingRead>& reads_;
  const bool nowait_;
  std::vector<PendingRead>* residue_;
  ReadCounters& c_;
  std::vector<PendingRead>& queue_;  // reads to (re)submit before the next input
  size_t next_ = 0;
  uint32_t inflight_ = 0;
  absl::Status first_error_;
};

}  // namespace

absl::Status UringPass(ReaderContext& ctx, const ReadTarget& t,
                       const std::vector<PendingRead>& reads, bool nowait,
                       std::vector<PendingRead>* residue, ReadCounters& c) {
  return UringRun(ctx, t, reads, nowait, residue, c).Run();
}

}  // namespace engram
