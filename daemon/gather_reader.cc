// The gather engine's readers: RWF_NOWAIT passes, buffered io_uring, blocking preadv2 and
// O_DIRECT page runs, each resuming short reads where they stopped.
#include "daemon/gather_reader.h"

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
#include "daemon/clock.h"

namespace engram {
namespace {

constexpr uint64_t kDirectAlign = 4096;
constexpr uint64_t kMaxDirectRun = 256 * 1024;
// A blocking read that keeps answering EAGAIN (only a ReadFn can make it) is an error after this
// many tries instead of a spin.
constexpr int kMaxBlockingRetries = 1000;
// The user_data of a queued SQE that a ring failure turned into a no-op.
constexpr uint64_t kAbandonedUserData = UINT64_MAX;
// After more than this many ring failures without a successful enter in between, a failed ring
// is not replaced: the context goes on without io_uring.
constexpr uint32_t kMaxRingFailuresInARow = 4;
// After a ring failure: how long reads in flight may take before a notice says the wait goes on,
// how often the completion queue is polled, and how long the kernel may take to cancel.
constexpr uint64_t kSlowDrainNs = 5'000'000'000;
constexpr long kDrainPollNs = 50'000;
constexpr long kCancelTimeoutNs = 100'000'000;

// Set once preadv2 answered ENOSYS (qemu-user 7.2 does not implement it): blocking reads use
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
  ring_failures += o.ring_failures;
  ring_resets += o.ring_resets;
  fixed_reads += o.fixed_reads;
}

void ReaderShared::NoticeOnce(std::atomic<bool>& once, const std::string& text) {
  if (!once.exchange(true) && notice) notice(text);
}

ReaderContext::~ReaderContext() {
  // The ring goes first: it holds the bounce area's pages while it is registered.
  if (has_ring_) io_uring_queue_exit(&ring_);
  std::free(bounce_);
}

absl::Status ReaderContext::InitRing(uint32_t entries, uint32_t max_fixed_files) {
  ring_entries_ = entries;
  max_fixed_files_ = max_fixed_files;
  if (absl::Status s = SetUpRing(); !s.ok()) return s;
  slots.resize(entries);
  free_slots.clear();
  for (uint32_t i = entries; i > 0; --i) free_slots.push_back(i - 1);
  return absl::OkStatus();
}

absl::Status ReaderContext::SetUpRing() {
  io_uring_params params{};
  // COOP_TASKRUN: completions run when this thread enters the kernel anyway, not by IPI.
  params.flags = IORING_SETUP_COOP_TASKRUN;
  int r = io_uring_queue_init_params(ring_entries_, &ring_, &params);
  if (r == -EINVAL) {
    params = {};
    r = io_uring_queue_init_params(ring_entries_, &ring_, &params);
  }
  if (r < 0) return absl::ErrnoToStatus(-r, "io_uring_queue_init");
  has_ring_ = true;
  fixed_files_ = false;
  bounce_registered_ = false;
  if (max_fixed_files_ > 0 && io_uring_register_files_sparse(&ring_, max_fixed_files_) == 0) {
    fixed_files_ = true;
    // A ring that replaces a failed one takes over the files its predecessor held, so the
    // fixed indexes of the batch in progress stay valid.
    const unsigned n = registered_fds_.size();
    if (n > 0 && io_uring_register_files_update(&ring_, 0, registered_fds_.data(), n) !=
                     static_cast<int>(n)) {
      fixed_files_ = false;
    }
  }
  return absl::OkStatus();
}

int ReaderContext::SubmitAndWait(unsigned wait_nr) {
  if (shared_ != nullptr && shared_->enter_fault) {
    if (const UringEnterFault f = shared_->enter_fault(); f.error != 0) {
      if (f.after_submit) io_uring_submit(&ring_);
      return -std::abs(f.error);
    }
  }
  const int r = io_uring_submit_and_wait(&ring_, wait_nr);
  if (r >= 0) failures_in_a_row_ = 0;
  return r;
}

void ReaderContext::RecoverRing(int err, uint32_t& inflight, const std::string& what,
                                absl::FunctionRef<void(uint64_t user_data)> abandon,
                                absl::FunctionRef<void(const io_uring_cqe& cqe)> reap,
                                ReadCounters& c) {
  c.ring_failures++;
  ++failures_in_a_row_;
  if (shared_ != nullptr) {
    shared_->NoticeOnce(
        shared_->ring_failure_noticed,
        absl::StrCat("io_uring_enter failed (", std::strerror(err), ") while reading ", what,
                     ": the gather ring was retired once the reads it had started completed and "
                     "replaced by a new one, the batch's other reads went on without it (further "
                     "failures only show in the ring_failures statistic)"));
  }

  // 1. Without SQPOLL the kernel takes SQEs only inside io_uring_enter, which this thread alone
  // calls: those past the kernel's head never started and never will once they are no-ops.
  io_uring_sq& sq = ring_.sq;
  for (unsigned i = io_uring_smp_load_acquire(sq.khead); i != sq.sqe_tail; ++i) {
    io_uring_sqe* sqe = &sq.sqes[i & sq.ring_mask];
    const uint64_t data = sqe->user_data;
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, kAbandonedUserData);
    abandon(data);
    --inflight;
  }

  // 2. Reads the kernel took may still write into their buffers: wait for every completion.
  // Cancelling interrupts reads parked on worker threads; a read waiting for its page cannot be
  // cancelled and completes when the page arrives.
  if (inflight > 0) {
    io_uring_sync_cancel_reg reg{};
    reg.fd = -1;
    reg.flags = IORING_ASYNC_CANCEL_ANY;
    reg.timeout.tv_sec = 0;
    reg.timeout.tv_nsec = kCancelTimeoutNs;
    io_uring_register_sync_cancel(&ring_, &reg);  // best effort; the wait below is what counts
    c.syscalls++;
  }
  const uint64_t start = NowNs();
  while (true) {
    unsigned head, seen = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      if (cqe->user_data == kAbandonedUserData) continue;
      reap(*cqe);
      --inflight;
    }
    io_uring_cq_advance(&ring_, seen);
    if (inflight == 0) break;
    // Completion work the kernel queued for this thread (COOP_TASKRUN) runs when any system call
    // returns, so a short sleep lets it post completions without entering the failed ring. At
    // most ring_entries reads are in flight and the completion queue holds twice that: none can
    // be lost to an overflow that only an enter would flush.
    const timespec pause{0, kDrainPollNs};
    nanosleep(&pause, nullptr);
    c.syscalls++;
    if (NowNs() - start > kSlowDrainNs && shared_ != nullptr) {
      shared_->NoticeOnce(shared_->slow_drain_noticed,
                          absl::StrCat(inflight, " reads of ", what, " were still in flight ",
                                       kSlowDrainNs / 1'000'000'000,
                                       " s after their io_uring ring failed; the "
                                       "gather thread waits for the device to finish them"));
    }
  }

  // 3. A fresh ring, unless rings keep failing here.
  io_uring_queue_exit(&ring_);
  ring_ = {};
  has_ring_ = false;
  fixed_files_ = false;
  bounce_registered_ = false;
  absl::Status s =
      absl::ResourceExhaustedError(absl::StrCat(failures_in_a_row_, " ring failures in a row"));
  if (failures_in_a_row_ <= kMaxRingFailuresInARow) s = SetUpRing();
  if (s.ok()) {
    c.ring_resets++;
  } else if (shared_ != nullptr) {
    shared_->rings_given_up.fetch_add(1, std::memory_order_relaxed);
    shared_->NoticeOnce(shared_->ring_given_up_noticed,
                        absl::StrCat("a gather thread could not replace its failed io_uring ring (",
                                     s.message(), "): it reads with blocking preadv2 from now on"));
  }
}

void ReaderContext::SyncFixedFiles(const std::vector<int>& fds,
                                   const std::vector<uint64_t>& versions, uint64_t generation) {
  // Update only the slots that changed (tables added or removed since the last sync); -1 clears
  // a slot so the ring drops its reference to a closed table's file.
  if (fixed_files_) {
    registered_versions_.resize(fds.size(), 0);
    registered_fds_.resize(fds.size(), -1);
    for (size_t i = 0; i < fds.size() && fixed_files_; ++i) {
      if (registered_versions_[i] == versions[i]) continue;
      size_t j = i;
      while (j < fds.size() && registered_versions_[j] != versions[j]) ++j;
      if (io_uring_register_files_update(&ring_, i, const_cast<int*>(fds.data() + i), j - i) < 0) {
        fixed_files_ = false;  // plain fds from now on
        break;
      }
      std::copy(versions.begin() + i, versions.begin() + j, registered_versions_.begin() + i);
      std::copy(fds.begin() + i, fds.begin() + j, registered_fds_.begin() + i);
      i = j;
    }
  }
  fixed_generation_ = generation;
}

uint8_t* ReaderContext::Bounce(size_t bytes) {
  if (bounce_bytes_ < bytes) {
    UnregisterBounce();  // the ring must let go of the pages before they are freed
    std::free(bounce_);
    bounce_ = static_cast<uint8_t*>(std::aligned_alloc(kDirectAlign, bytes));
    bounce_bytes_ = bounce_ != nullptr ? bytes : 0;
  }
  return bounce_;
}

void ReaderContext::UnregisterBounce() {
  if (bounce_registered_ && has_ring_) io_uring_unregister_buffers(&ring_);
  bounce_registered_ = false;
}

bool ReaderContext::FixedBounce() {
  if (!has_ring_ || !want_fixed_buffers || fixed_buffers_refused_ || bounce_ == nullptr) {
    return false;
  }
  if (bounce_registered_) return true;
  const iovec area{bounce_, bounce_bytes_};
  const int r = io_uring_register_buffers(&ring_, &area, 1);
  if (r == 0) {
    bounce_registered_ = true;
    return true;
  }
  fixed_buffers_refused_ = true;  // a memory limit does not go away between batches
  if (shared_ != nullptr) {
    rlimit lim{};
    std::string memlock = "unknown";
    if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
      memlock = lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited")
                                              : absl::StrCat(lim.rlim_cur >> 10, " KiB");
    }
    shared_->NoticeOnce(
        shared_->fixed_buffers_noticed,
        absl::StrCat("io_uring refused to register a gather thread's ", bounce_bytes_ >> 10,
                     " KiB O_DIRECT bounce area as a fixed buffer (", std::strerror(-r),
                     "; RLIMIT_MEMLOCK ", memlock,
                     "): O_DIRECT reads use unregistered buffers, which costs a page pinning per "
                     "read; raise LimitMEMLOCK or lower direct_bounce_bytes"));
  }
  return false;
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
  io_uring* ring = ctx.ring();  // the context's ring stays at this address when it is replaced
  std::vector<PendingRead>& queue = ctx.queue;  // reads to (re)submit before the next input
  queue.clear();
  size_t next = 0;
  uint32_t inflight = 0;
  int ring_failures = 0;
  bool finish_without_ring = false;
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
  // One completion: frees its slot and routes the read on.
  auto complete = [&](const io_uring_cqe& cqe) {
    const uint32_t s = static_cast<uint32_t>(cqe.user_data);
    const int res = cqe.res;
    PendingRead p = ctx.slots[s].p;
    ctx.free_slots.push_back(s);
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
    } else if (res == -EINTR || res == -ECANCELED) {  // ECANCELED: cancelled by RecoverRing
      c.eintr_retries += res == -EINTR;
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
    const int r = ctx.SubmitAndWait(1);
    c.syscalls++;
    if (ReaderContext::FatalEnterError(r)) {
      // Reads that never started go back to the queue; those the kernel took are reaped before
      // anything else happens, so no read can land in a destination after this pass returns.
      ctx.RecoverRing(
          -r, inflight, absl::StrCat("table ", plan.table->Describe()),
          [&](uint64_t s) {
            queue.push_back(ctx.slots[s].p);
            ctx.free_slots.push_back(static_cast<uint32_t>(s));
          },
          complete, c);
      // The fresh ring takes the rest; after a second failure in one pass, the blocking path.
      if (ctx.has_ring() && ++ring_failures == 1) continue;
      finish_without_ring = true;
      break;
    }
    unsigned head;
    unsigned seen = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(ring, head, cqe) {
      ++seen;
      inflight--;
      complete(*cqe);
    }
    io_uring_cq_advance(ring, seen);
  }
  if (finish_without_ring) {
    // Nothing is in flight any more: the NOWAIT pass hands what is left to the residue pass that
    // follows it; the residue pass reads it with blocking reads.
    PendingRead p;
    while (take(p)) {
      if (nowait) {
        residue->push_back(p);
      } else if (first_error.ok()) {
        if (absl::Status s = BlockingRead(t, p, c); !s.ok()) fail(std::move(s));
      }
    }
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
      // Registered once per ring and bounce area; the kernel then skips pinning the bounce pages
      // on every read.
      const bool fixed_buffer = ctx.FixedBounce();
      size_t submitted = 0, completed = 0;
      std::vector<uint8_t> retry(runs.size(), 0);
      auto complete = [&](const io_uring_cqe& cqe) {
        ++completed;
        const size_t i = cqe.user_data;
        Run& run = runs[i];
        const int res = cqe.res;
        if (res >= 0) {
          c.bytes_read += res;
          c.direct_reads++;
          c.fixed_reads += fixed_buffer;
          run.valid = res;
          // A short read that stopped on an aligned boundary before the end is finished below
          // with blocking reads; an unaligned one reached the end of the file.
          if (res < static_cast<int64_t>(run.length) && res % kDirectAlign == 0 && res > 0) {
            retry[i] = 1;
          }
        } else {
          retry[i] = 1;  // EINTR, EAGAIN, ECANCELED or a real error: read it plainly
        }
      };
      while (completed < runs.size()) {
        while (submitted < runs.size() && submitted - completed < ctx.slots.size()) {
          io_uring_sqe* sqe = io_uring_get_sqe(ring);
          if (sqe == nullptr) break;
          Run& run = runs[submitted];
          const GatherFile& f = *(*t.files)[run.file];
          const bool fixed = ctx.fixed_files() && f.direct_fixed_index >= 0;
          const int fd = fixed ? f.direct_fixed_index : f.direct_fd;
          if (fixed_buffer) {
            io_uring_prep_read_fixed(sqe, fd, bounce + run.bounce_offset, run.length, run.start,
                                     /*buf_index=*/0);
          } else {
            io_uring_prep_read(sqe, fd, bounce + run.bounce_offset, run.length, run.start);
          }
          if (fixed) sqe->flags |= IOSQE_FIXED_FILE;
          io_uring_sqe_set_data64(sqe, submitted);
          ++submitted;
          c.read_calls++;
        }
        const int r = ctx.SubmitAndWait(1);
        c.syscalls++;
        if (ReaderContext::FatalEnterError(r)) {
          // The runs in flight land in the bounce area, which the next flush reuses: reap them
          // all, then read what did not complete (or never started) with blocking reads.
          uint32_t inflight = static_cast<uint32_t>(submitted - completed);
          ctx.RecoverRing(
              -r, inflight, absl::StrCat("table ", plan.table->Describe(), " (O_DIRECT)"),
              [&](uint64_t i) {
                retry[i] = 1;
                ++completed;
              },
              complete, c);
          for (; submitted < runs.size(); ++submitted, ++completed) retry[submitted] = 1;
          break;
        }
        unsigned head, seen = 0;
        io_uring_cqe* cqe;
        io_uring_for_each_cqe(ring, head, cqe) {
          ++seen;
          complete(*cqe);
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
