// MissQueue: the order in which missed rows of cache-tier tables go to the device. Every miss
// is an O_DIRECT read; a request thread asks the queue before it reads a piece of its misses and
// tells it when the piece is in. Pieces are granted by class: decode steps first, then
// prefills, then prefetches (cache warming), FIFO within a class. A decode step's misses go to
// the device at once, as one piece (up to kMaxDecodePiece rows). Prefill and prefetch pieces
// are small, start only while fewer than `depth` reads are in flight, hold at most three
// quarters of `depth` together (the rest is left to decode steps), and none starts while a
// higher class waits or reads. So a decode step shares the device with at most those prefill
// reads already there (one device read's time: they were submitted together, at a depth the
// device serves in parallel), however large the prefill. docs/row-store.md ("Misses").
//
//   MissQueue q({.depth = 64});
//   const uint32_t n = std::min<uint32_t>(rows_left, q.PieceReads(MissClass::kPrefill));
//   if (q.Acquire(MissClass::kPrefill, n)) { read the n rows; q.Release(MissClass::kPrefill, n); }
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "gather/gather_engine.h"

namespace engram {

// Priority order: a lower value goes first.
enum class MissClass : uint8_t { kDecode = 0, kPrefill = 1, kPrefetch = 2 };
inline constexpr int kMissClasses = 3;
const char* MissClassName(MissClass c);

struct MissQueueOptions {
  // Device reads (missed rows) in flight at which prefill and prefetch pieces wait ([memory]
  // miss_depth); decode steps' pieces do not.
  uint32_t depth = 64;
  // Reads that may wait at most; a prefetch that would pass it is dropped (Acquire returns
  // false). Gathers always wait: request threads bound them.
  uint64_t max_queued_reads = 1u << 16;
};

// One class's counters (protocol/store_counters.h: ENGRAM_MISS_CLASS_COUNTERS).
struct MissClassStats {
  uint64_t waiting_reads = 0;    // gauge: reads queued, not yet granted
  uint64_t in_flight_reads = 0;  // gauge: reads granted, not yet released
  uint64_t pieces = 0;           // grants
  uint64_t reads = 0;            // reads granted
  uint64_t dropped_reads = 0;    // prefetch reads dropped at the queue bound
  uint64_t wait_ns = 0;          // time granted pieces waited, added up
  uint64_t max_wait_ns = 0;      // the longest one piece waited
  // The most reads that completed while one piece of this class waited (a decode step waits
  // only behind another decode step that is between two of its pieces).
  uint64_t max_reads_waited = 0;
};

struct MissQueueStats {
  uint32_t depth = 0;
  std::array<MissClassStats, kMissClasses> classes{};
  uint64_t completed_reads = 0;
  // Reads completed per second of the time reads were in flight, over the last full second of
  // such time (before one: since start): the rate the device sustained.
  double read_rate_per_s = 0;
};

class MissQueue {
 public:
  explicit MissQueue(const MissQueueOptions& options);
  MissQueue(const MissQueue&) = delete;
  MissQueue& operator=(const MissQueue&) = delete;

  // The largest decode piece: a request thread's miss buffer (RowStore::kMissChunkRows).
  static constexpr uint32_t kMaxDecodePiece = 4096;

  uint32_t depth() const { return depth_; }
  // The largest piece a class is granted at once: decode steps kMaxDecodePiece, prefill and
  // prefetch a third of the three quarters of `depth` they may hold together, so that they take
  // turns in small steps.
  uint32_t PieceReads(MissClass c) const;
  // Waits until `reads` (1..PieceReads(c)) may go to the device. False only for a prefetch that
  // would pass max_queued_reads (nothing was granted).
  bool Acquire(MissClass c, uint32_t reads);
  // The `reads` a grant of class `c` allowed are done. With `more`, the caller asks again at once
  // (the next piece of the same request): until it does, lower classes are held back as if it
  // were waiting, so that a decode step of several pieces lets no prefill piece in between.
  void Release(MissClass c, uint32_t reads, bool more = false);

  MissQueueStats Stats() const;

 private:
  struct Waiter {
    uint32_t reads = 0;
    uint64_t enqueued_ns = 0;
    uint64_t completed_at_enqueue = 0;
    bool granted = false;
    std::condition_variable cv;
  };
  bool Fits(int c, uint32_t reads) const;
  void GrantLocked(uint64_t now);
  void UpdateRateLocked(uint64_t now);

  const uint32_t depth_;
  const uint32_t reserve_;  // reads only decode steps may take
  const uint64_t max_queued_;
  mutable std::mutex mu_;
  std::array<std::deque<Waiter*>, kMissClasses> waiting_;
  std::array<MissClassStats, kMissClasses> stats_{};
  std::array<uint32_t, kMissClasses> promised_{};  // Release(more) not yet followed by Acquire
  uint64_t in_flight_ = 0;
  uint64_t queued_ = 0;
  uint64_t completed_ = 0;
  // Read rate: busy time (reads in flight) and completions in the current window.
  uint64_t busy_since_ns_ = 0;
  uint64_t window_busy_ns_ = 0;
  uint64_t window_completed_ = 0;
  uint64_t total_busy_ns_ = 0;
  double rate_ = 0;
  bool rate_measured_ = false;
};

// The class of a gather's misses: a gather of at most decode_max_rows rows (the engine's and the
// request pools' threshold, GatherEngineOptions) is a decode step, a larger one a prefill.
MissClass MissClassOfGather(size_t rows);

// Reads `rows` of `table` through `engine` in pieces the queue grants (class `c`), into
// `bounce`, and calls done(i, row) with each row's 264 bytes (i indexes `rows`). Rows are read
// in row order, so that misses on one page are in one piece and the planner makes them one
// read. A prefetch piece the queue drops is skipped (its rows get no call). Stops at the first
// error, which is the engine's.
absl::Status ReadMisses(GatherEngine* engine, MissQueue* queue, MissClass c, const Table* table,
                        std::span<const uint64_t> rows, std::vector<uint8_t>& bounce,
                        absl::FunctionRef<void(size_t i, const uint8_t* row)> done);

}  // namespace engram
