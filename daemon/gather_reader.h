// The readers behind the gather engine: the RWF_NOWAIT fast pass (serial preadv2 or batched
// io_uring), buffered io_uring reads, blocking preadv2 reads and O_DIRECT page-run reads. Each
// works on a range of a GatherPlan's reads and reports progress so a short read resumes where it
// stopped.
#pragma once

#include <liburing.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/gather_engine.h"
#include "daemon/gather_planner.h"
#include "daemon/table.h"

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
// once per batch.
struct ReadCounters {
  uint64_t read_calls = 0;
  uint64_t nowait_reads_hit = 0;
  uint64_t partial_reads = 0;
  uint64_t uring_reads = 0;
  uint64_t pool_reads = 0;
  uint64_t direct_reads = 0;
  uint64_t bytes_read = 0;
  uint64_t nowait_zero = 0;
  uint64_t eintr_retries = 0;
  uint64_t syscalls = 0;  // preadv2 / pread / io_uring_enter calls
  void Add(const ReadCounters& o);
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
  ReaderContext() = default;
  ReaderContext(const ReaderContext&) = delete;
  ReaderContext& operator=(const ReaderContext&) = delete;
  ~ReaderContext();

  // Sets up the ring; on failure the context works without one (pool / serial reads).
  absl::Status InitRing(uint32_t entries, uint32_t max_fixed_files);
  bool has_ring() const { return has_ring_; }
  io_uring* ring() { return &ring_; }

  // Brings the ring's fixed-file table up to date with `fds` (index = fixed index, -1 = empty);
  // `versions` change whenever a slot is assigned or freed, so a reused fd number is noticed.
  void SyncFixedFiles(const std::vector<int>& fds, const std::vector<uint64_t>& versions,
                      uint64_t generation);
  uint64_t fixed_generation() const { return fixed_generation_; }
  bool fixed_files() const { return fixed_files_; }

  // Scratch owned by this context.
  std::vector<PendingRead> residue;
  std::vector<PendingRead> queue;
  std::vector<uint8_t*> marks;
  uint8_t* Bounce(size_t bytes);
  size_t bounce_bytes() const { return bounce_bytes_; }
  // Size of the O_DIRECT bounce area, allocated on the first O_DIRECT read.
  size_t direct_bounce_target = 4u << 20;

  // io_uring in-flight slots: the iovecs of a resumed read must live until it completes.
  struct Slot {
    PendingRead p;
    std::vector<iovec> iovs;
  };
  std::vector<Slot> slots;
  std::vector<uint32_t> free_slots;

 private:
  io_uring ring_{};
  bool has_ring_ = false;
  bool fixed_files_ = false;
  std::vector<uint64_t> registered_versions_;  // slot versions this ring's table holds
  uint64_t fixed_generation_ = 0;
  uint8_t* bounce_ = nullptr;
  size_t bounce_bytes_ = 0;
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

// The error for a file that ended before a row's bytes: names table, row, file and offset.
absl::Status EndOfFileError(const ReadTarget& t, const PlannedRead& read, uint32_t done);

}  // namespace engram
