// The readers behind the gather engine: the RWF_NOWAIT fast pass (serial preadv2 or batched
// io_uring), buffered io_uring reads, blocking preadv2 reads and O_DIRECT page-run reads. Each
// works on a range of a GatherPlan's reads and reports progress so a short read resumes where it
// stopped. reader_context.cc: a thread's ring and bounce area; sync_reader.cc: serial NOWAIT and
// blocking reads; uring_reader.cc: the io_uring pass; direct_reader.cc: the O_DIRECT pass.
#pragma once

#include <liburing.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "gather/gather_counters.h"
#include "gather/gather_engine.h"
#include "gather/gather_planner.h"
#include "tables/table.h"

namespace engram {

// Engine-wide per-file state, shared by every thread.
struct GatherFile {
  const TableFile* file = nullptr;
  int fd = -1;           // the table's buffered fd (owned by the Table)
  int direct_fd = -1;    // O_DIRECT fd (owned by the engine), kDirect tables only
  int fixed_index = -1;  // slot in every ring's fixed-file table, -1 when unregistered
  int direct_fixed_index = -1;
  std::atomic<bool> nowait_ok{true};  // false once RWF_NOWAIT was refused (tmpfs, memfd, NFS)
  std::atomic<bool> uring_ok{true};   // false once io_uring refused a buffered read
  std::atomic<bool> notice_sent{false};
};

// Counters one thread gathers while working on part of a batch, added to the table's totals
// once per batch (the reader counters of gather_counters.h).
struct ReadCounters {
#define ENGRAM_READ_COUNTER_FIELD(field, json_key, metric, help) uint64_t field = 0;
  ENGRAM_GATHER_READER_COUNTERS(ENGRAM_READ_COUNTER_FIELD)
#undef ENGRAM_READ_COUNTER_FIELD
  void Add(const ReadCounters& o);
};

// What every ReaderContext of one engine shares: the enter fault seam and the one-time notices.
struct ReaderShared {
  UringEnterFaultFn enter_fault;
  NoticeFn notice;
  std::atomic<bool> ring_failure_noticed{false};
  std::atomic<bool> ring_given_up_noticed{false};
  std::atomic<bool> slow_drain_noticed{false};
  std::atomic<bool> fixed_buffers_noticed{false};
  // Threads whose rings kept failing and that read with blocking calls from then on.
  std::atomic<uint32_t> rings_given_up{0};
  // GatherEngineOptions::emulated_device, and when the emulated device is next free (NowNs()).
  GatherEngineOptions::EmulatedDevice emulated;
  std::atomic<uint64_t> emulated_free_ns{0};
  // The emulated completion of an O_DIRECT read of `bytes` issued at `issue_ns`: the issue time
  // + the latency, or the end of its turn at the device's rate, whichever is later. Reserves the
  // turn. Thread-safe.
  uint64_t EmulatedDue(uint64_t issue_ns, uint64_t bytes);
  // Sends `text` through `notice` unless `once` was already set.
  void NoticeOnce(std::atomic<bool>& once, const std::string& text);
};

// A planned read that has not finished: `done` bytes of it are already in place.
struct PendingRead {
  uint32_t read = 0;
  uint32_t done = 0;
};

// What the readers need to know about the table being read.
struct ReadTarget {
  const GatherPlan* plan = nullptr;
  std::vector<std::unique_ptr<GatherFile>>* files = nullptr;  // indexed like Table::files()
  const ReadFn* read_fn = nullptr;
  const NoticeFn* notice = nullptr;
};

// One thread's reading state: its io_uring ring (when the kernel gives one) and scratch space.
// Used by one thread at a time.
class ReaderContext {
 public:
  // `shared` (may be null: no seam, no notices) must outlive the context.
  explicit ReaderContext(ReaderShared* shared = nullptr) : shared_(shared) {}
  ReaderContext(const ReaderContext&) = delete;
  ReaderContext& operator=(const ReaderContext&) = delete;
  ~ReaderContext();

  // Sets up the ring; on failure the context works without one (pool / serial reads).
  absl::Status InitRing(uint32_t entries, uint32_t max_fixed_files);
  bool has_ring() const { return has_ring_; }
  // The engine's emulated device (GatherEngineOptions::emulated_device), or null when off.
  ReaderShared* emulation() const {
    return shared_ != nullptr && shared_->emulated.on() ? shared_ : nullptr;
  }
  io_uring* ring() { return &ring_; }

  // io_uring_submit_and_wait through the engine's fault seam: what was queued is submitted and
  // the call returns once `wait_nr` completions are ready, or -errno.
  int SubmitAndWait(unsigned wait_nr);
  // True for an io_uring_enter result after which the ring cannot be trusted to take or report
  // work (anything but success, EINTR, EAGAIN and EBUSY).
  static bool FatalEnterError(int r) { return r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY; }

  // Recovers from a fatal io_uring_enter error (`err`, positive) while `inflight` reads were
  // queued or submitted on the ring, so that no read can land in memory after it returns:
  //  1. every queued SQE the kernel has not taken is made a no-op and handed to
  //     `abandon(user_data)`: that read never started;
  //  2. the ring's requests are cancelled and its completion queue is polled, without entering
  //     the ring, until every read the kernel took has completed; each completion goes to
  //     `reap`. Reads normally finish within the device's latency; past kSlowDrainNs a notice
  //     says so and the wait goes on (a read the device never finishes holds this thread, as it
  //     would hold a blocking pread: returning would let the kernel write into reused memory);
  //  3. the ring is retired and a fresh one with the same fixed files is set up; when that fails,
  //     or rings keep failing, the context goes on without one (one notice).
  // `inflight` is 0 on return; `what` names the table for the notice.
  void RecoverRing(int err, uint32_t& inflight, const std::string& what,
                   absl::FunctionRef<void(uint64_t user_data)> abandon,
                   absl::FunctionRef<void(const io_uring_cqe& cqe)> reap, ReadCounters& c);

  // Brings the ring's fixed-file table up to date with `fds` (index = fixed index, -1 = empty);
  // `versions` change whenever a slot is assigned or freed, so a reused fd number is noticed.
  void SyncFixedFiles(const std::vector<int>& fds, const std::vector<uint64_t>& versions,
                      uint64_t generation);
  uint64_t fixed_generation() const { return fixed_generation_; }
  bool fixed_files() const { return fixed_files_; }

  // Scratch owned by this context.
  std::vector<PendingRead> queue;
  uint8_t* Bounce(size_t bytes);
  size_t bounce_bytes() const { return bounce_bytes_; }
  // Size of the O_DIRECT bounce area, allocated on the first O_DIRECT read.
  size_t direct_bounce_target = 4u << 20;
  // Whether to register the bounce area with the ring (GatherEngineOptions).
  bool want_fixed_buffers = true;
  // Registers the bounce area as the ring's fixed buffer 0 if it is not yet (again after it grew
  // or the ring was replaced); true when reads may use io_uring_prep_read_fixed with index 0.
  // A refusal is remembered (no retry per batch) and noticed once per engine.
  bool FixedBounce();

  // io_uring in-flight slots: the iovecs of a resumed read must live until it completes.
  struct Slot {
    PendingRead p;
    std::vector<iovec> iovs;
  };
  std::vector<Slot> slots;
  std::vector<uint32_t> free_slots;

 private:
  absl::Status SetUpRing();
  void UnregisterBounce();
  // RecoverRing's three steps (see there).
  void AbandonUnstartedReads(uint32_t& inflight,
                             absl::FunctionRef<void(uint64_t user_data)> abandon);
  void DrainStartedReads(uint32_t& inflight, const std::string& what,
                         absl::FunctionRef<void(const io_uring_cqe& cqe)> reap, ReadCounters& c);
  void ReplaceRing(ReadCounters& c);

  ReaderShared* shared_ = nullptr;
  io_uring ring_{};
  bool has_ring_ = false;
  uint32_t ring_entries_ = 0;
  uint32_t max_fixed_files_ = 0;
  bool fixed_files_ = false;
  std::vector<uint64_t> registered_versions_;  // slot versions this ring's table holds
  std::vector<int> registered_fds_;            // the fds it holds, to refill a fresh ring
  uint64_t fixed_generation_ = 0;
  uint32_t failures_in_a_row_ = 0;  // fatal enter errors since the last successful enter
  uint8_t* bounce_ = nullptr;
  size_t bounce_bytes_ = 0;
  bool bounce_registered_ = false;  // with the current ring
  bool fixed_buffers_refused_ = false;
};

// Builds the iovecs of `read` that remain after `done` bytes into `out`.
void RemainingIovs(const GatherPlan& plan, const PlannedRead& read, uint32_t done,
                   std::vector<iovec>& out);

// The fast pass: tries every read of `reads` with RWF_NOWAIT, serially through the ReadFn, and
// appends those that would block (EAGAIN, 0, short, unsupported) to `residue`.
absl::Status NowaitPassSerial(const ReadTarget& t, const std::vector<PendingRead>& reads,
                              std::vector<PendingRead>& residue, ReadCounters& c);

// Runs `reads` through the context's ring. With `nowait`, reads that would block go to
// `residue`; without, every read completes (short reads resume, EINTR/EAGAIN retry) or the first
// hard error is returned after every submitted read has completed. Reads the ring refuses with
// EOPNOTSUPP are finished with blocking reads.
absl::Status UringPass(ReaderContext& ctx, const ReadTarget& t,
                       const std::vector<PendingRead>& reads, bool nowait,
                       std::vector<PendingRead>* residue, ReadCounters& c);

// Finishes one read with blocking reads through the ReadFn.
absl::Status BlockingRead(const ReadTarget& t, PendingRead p, ReadCounters& c);

// O_DIRECT: reads the page runs covering `reads` into the context's bounce area (through the
// ring when it has one, else with blocking preads) and copies the rows out.
absl::Status DirectPass(ReaderContext& ctx, const ReadTarget& t,
                        const std::vector<PendingRead>& reads, ReadCounters& c);

// The error for a read that failed with `err` (positive) after `done` bytes: names the row, table,
// file and offset.
absl::Status ReadError(const ReadTarget& t, const PlannedRead& read, uint32_t done, int err);

// Turns the RWF_NOWAIT pass off for `f` after the filesystem refused it with `err`; the first
// time, sends a notice naming the file.
void DisableNowait(const ReadTarget& t, GatherFile& f, int err);

// The error for a file that ended before a row's bytes: names table, row, file and offset.
absl::Status EndOfFileError(const ReadTarget& t, const PlannedRead& read, uint32_t done);

}  // namespace engram
