// A gather thread's reading state: its io_uring ring (set up, replaced after a failure, kept in
// step with the engine's fixed files), its O_DIRECT bounce area, and the per-thread counters.
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

}  // namespace

void ReadCounters::Add(const ReadCounters& o) {
#define ENGRAM_READ_COUNTER_ADD(field, json_key, metric, help) field += o.field;
  ENGRAM_GATHER_READER_COUNTERS(ENGRAM_READ_COUNTER_ADD)
#undef ENGRAM_READ_COUNTER_ADD
}

void ReaderShared::NoticeOnce(std::atomic<bool>& once, const std::string& text) {
  if (!once.exchange(true) && notice) notice(text);
}

uint64_t ReaderShared::EmulatedDue(uint64_t issue_ns, uint64_t bytes) {
  uint64_t due = issue_ns + emulated.latency_ns;
  if (emulated.iops != 0) {
    // The emulated device's IOPS are of its 4 KiB blocks, whatever the host's pages.
    const uint64_t pages =
        std::max<uint64_t>(1, RoundUpTo(bytes, kDirectIoAlignBytes) / kDirectIoAlignBytes);
    const uint64_t cost = pages * 1'000'000'000 / emulated.iops;
    uint64_t free = emulated_free_ns.load(std::memory_order_relaxed);
    uint64_t end;
    do {
      end = std::max(free, issue_ns) + cost;
    } while (!emulated_free_ns.compare_exchange_weak(free, end, std::memory_order_relaxed));
    due = std::max(due, end);
  }
  return due;
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

  AbandonUnstartedReads(inflight, abandon);
  DrainStartedReads(inflight, what, reap, c);
  ReplaceRing(c);
}

void ReaderContext::AbandonUnstartedReads(uint32_t& inflight,
                                          absl::FunctionRef<void(uint64_t user_data)> abandon) {
  // Without SQPOLL the kernel takes SQEs only inside io_uring_enter, which this thread alone
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
}

void ReaderContext::DrainStartedReads(uint32_t& inflight, const std::string& what,
                                      absl::FunctionRef<void(const io_uring_cqe& cqe)> reap,
                                      ReadCounters& c) {
  // Reads the kernel took may still write into their buffers: wait for every completion.
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
}

void ReaderContext::ReplaceRing(ReadCounters& c) {
  // A fresh ring, unless rings keep failing here.
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
    bounce_ = static_cast<uint8_t*>(std::aligned_alloc(kDirectIoAlignBytes, bytes));
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

}  // namespace engram
