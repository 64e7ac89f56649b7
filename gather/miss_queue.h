// MissQueue: the order in which missed rows of cache-tier tables go to the device. Every miss
// is an O_DIRECT read; a request thread asks the queue before it reads a piece of its misses and
// tells it when the piece is in. Pieces are granted by class: decode steps first, then
// prefills, then prefetches (hints: the next chunk, cache warming), then admissions (a queued
// request's prompt); within a class by when the rows are due: the request's arrival plus a
// millisecond per model layer, so the current step goes before the next and layer 1 before
// layer 14 of the same step, and a request's later pieces keep its place. A decode step's
// misses go to the device at once, as one piece (up to kMaxDecodePiece rows). The other classes'
// pieces start only while fewer than `depth` reads are in flight, hold at most three quarters of
// `depth` together (the rest is left to decode steps), and none starts while a higher class
// waits or reads. So a decode step shares the device with at most those reads already there
// (one device read's time: they were submitted together, at a depth the device serves in
// parallel), however large the prefill. When the device falls behind (the reads in flight and
// those the higher classes' requests under way still need, ahead of a new prefetch or admission
// piece, would take longer than `shed_backlog_ns` at its measured rate, or such a piece has
// waited longer than that), those pieces are shed, counted, and the queue reports how far demand
// exceeds the device. docs/row-store.md ("Misses").
//
//   MissQueue q({.depth = 64});
//   const uint64_t due = q.Due(table->layer_id());
//   const uint32_t n = std::min<uint32_t>(rows_left, q.PieceReads(MissClass::kPrefill));
//   if (q.Acquire(MissClass::kPrefill, n, due)) {
//     read the n rows; q.Release(MissClass::kPrefill, n);
//   }
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "base/clock.h"
#include "gather/gather_engine.h"

namespace engram {

// Priority order: a lower value goes first.
enum class MissClass : uint8_t { kDecode = 0, kPrefill = 1, kPrefetch = 2, kAdmission = 3 };
inline constexpr int kMissClasses = 4;
const char* MissClassName(MissClass c);
// Prefetches and admissions: read ahead of need, shed first when the device falls behind.
inline bool MissClassSheddable(MissClass c) { return c >= MissClass::kPrefetch; }

struct MissQueueOptions {
  // Device reads (missed rows) in flight at which the pieces of every class but decode wait
  // ([memory] miss_depth); decode steps' pieces do not.
  uint32_t depth = 64;
  // Reads that may wait at most; a prefetch or admission piece that would pass it is dropped
  // (Acquire returns false). Gathers always wait: request threads bound them.
  uint64_t max_queued_reads = 1u << 16;
  // The device's backlog ahead of a new prefetch or admission piece (reads in flight and those
  // the higher classes' requests under way still need, at the measured read rate) past which it
  // is shed ([memory] miss_shed_ms); 0: never.
  uint64_t shed_backlog_ns = 1'000'000'000;
  // How much later a row of layer L+1 is due than one of layer L asked at the same time.
  uint64_t layer_spacing_ns = 1'000'000;
  // The queue's clock (tests drive their own).
  uint64_t (*clock)() = NowNs;
};

// One class's counters (protocol/store_counters.h: ENGRAM_MISS_CLASS_COUNTERS).
struct MissClassStats {
  uint64_t pending_reads = 0;    // gauge: reads of requests under way, not yet done
  uint64_t waiting_reads = 0;    // gauge: reads queued, not yet granted
  uint64_t in_flight_reads = 0;  // gauge: reads granted, not yet released
  uint64_t pieces = 0;           // grants
  uint64_t reads = 0;            // reads granted
  uint64_t dropped_reads = 0;    // prefetch/admission reads dropped at the queue bound
  uint64_t shed_reads = 0;       // prefetch/admission reads shed: the device was behind
  uint64_t wait_ns = 0;          // time granted pieces waited, added up
  uint64_t max_wait_ns = 0;      // the longest one piece waited
  // The most reads that completed while one piece of this class waited (a decode step waits
  // only behind another decode step that is between two of its pieces).
  uint64_t max_reads_waited = 0;
  // Granted pieces by how long they waited: bucket i counts [2^i, 2^(i+1)) ns.
  std::array<uint64_t, 64> wait_buckets{};
};

struct MissQueueStats {
  uint32_t depth = 0;
  std::array<MissClassStats, kMissClasses> classes{};
  uint64_t completed_reads = 0;
  // Gathers' reads completed per second of the time gathers' reads were in flight, over the
  // last full second of such time (before one: since start): the rate the device sustained.
  // Prefetches' and admissions' reads are not counted: their threads run at idle priority and
  // may tell of a read long after the device finished it.
  double read_rate_per_s = 0;
  // Reads announced per second of wall time (every miss of a request when it starts, read,
  // dropped or shed alike), over the last full second: what the clients want of the device.
  double demand_per_s = 0;
  // The reads the requests under way still need, in seconds at read_rate_per_s (0 before a rate
  // is measured).
  double backlog_s = 0;
  // demand_per_s / read_rate_per_s: above 1 the device is the bottleneck, by this factor.
  double load = 0;
};

class MissQueue {
 public:
  explicit MissQueue(const MissQueueOptions& options);
  MissQueue(const MissQueue&) = delete;
  MissQueue& operator=(const MissQueue&) = delete;

  // The largest decode piece: a request thread's miss buffer (RowStore::kMissChunkRows).
  static constexpr uint32_t kMaxDecodePiece = 4096;

  uint32_t depth() const { return depth_; }
  // The largest piece a class is granted at once: decode steps kMaxDecodePiece, the other
  // classes the three quarters of `depth` they may hold together, so that one request thread
  // alone keeps the device at that depth (it has one piece in flight at a time), and several
  // take turns piece by piece.
  uint32_t PieceReads(MissClass c) const;
  // A request's misses, announced when it starts (ReadMisses does): the backlog and the demand
  // count all of them, not only the piece that waits. Release and Retire take them off.
  void Announce(MissClass c, uint64_t reads);
  // Announced reads that will not be asked: a dropped or shed piece, the rest after an error.
  void Retire(MissClass c, uint64_t reads);
  // When rows of `layer` asked now are due: now plus layer_spacing_ns a layer. A request computes
  // it once and passes it with each of its pieces, so its later pieces keep its place.
  uint64_t Due(uint32_t layer) const { return clock_() + uint64_t{layer} * layer_spacing_ns_; }
  // Waits until `reads` (1..PieceReads(c)) may go to the device; among waiting pieces of one
  // class the earliest `due` goes first (0: due now), then the earliest asked. False only for a
  // prefetch or admission piece that was dropped or shed, at once or after waiting longer than
  // shed_backlog_ns (nothing was granted).
  bool Acquire(MissClass c, uint32_t reads, uint64_t due = 0);
  // The `reads` a grant of class `c` allowed are done. With `more`, the caller asks again at once
  // (the next piece of the same request): until it does, lower classes are held back as if it
  // were waiting, so that a decode step of several pieces lets no prefill piece in between.
  void Release(MissClass c, uint32_t reads, bool more = false);

  MissQueueStats Stats() const;

 private:
  struct Waiter {
    uint32_t reads = 0;
    uint64_t due = 0;
    uint64_t seq = 0;  // arrival order, among equal dues
    uint64_t enqueued_ns = 0;
    uint64_t completed_at_enqueue = 0;
    bool granted = false;  // or shed, when `shed`
    bool shed = false;
    std::condition_variable cv;
  };
  struct ByDue {
    bool operator()(const Waiter* a, const Waiter* b) const {
      return a->due != b->due ? a->due < b->due : a->seq < b->seq;
    }
  };
  bool Fits(int c, uint32_t reads) const;
  // Whether a new piece of sheddable class `c` finds the device too far behind.
  bool BehindLocked(int c, uint32_t reads) const;
  // Sheds the prefetch and admission pieces that have waited longer than shed_backlog_ns.
  void ShedStaleLocked(uint64_t now);
  void GrantLocked(uint64_t now);
  void UpdateRateLocked(uint64_t now);
  double RateLocked() const;

  const uint32_t depth_;
  const uint32_t reserve_;  // reads only decode steps may take
  const uint64_t max_queued_;
  const uint64_t shed_backlog_ns_;
  const uint64_t layer_spacing_ns_;
  uint64_t (*const clock_)();
  mutable std::mutex mu_;
  // Each class's waiting pieces, sorted by ByDue.
  std::array<std::vector<Waiter*>, kMissClasses> waiting_;
  uint64_t next_seq_ = 0;
  std::array<MissClassStats, kMissClasses> stats_{};
  std::array<uint32_t, kMissClasses> promised_{};  // Release(more) not yet followed by Acquire
  uint64_t in_flight_ = 0;
  uint64_t queued_ = 0;
  uint64_t completed_ = 0;
  // Read rate, of gathers' reads: busy time (a gather's reads in flight) and their completions
  // in the current window.
  uint64_t gather_in_flight_ = 0;
  uint64_t gather_completed_ = 0;
  uint64_t busy_since_ns_ = 0;
  uint64_t window_busy_ns_ = 0;
  uint64_t window_completed_ = 0;
  uint64_t total_busy_ns_ = 0;
  double rate_ = 0;
  bool rate_measured_ = false;
  // Demand: reads asked in the current wall-clock window, and the last full window's rate.
  uint64_t ask_window_start_ns_ = 0;
  uint64_t ask_window_reads_ = 0;
  double demand_ = 0;
};

// The class of a gather's misses: a gather of at most decode_max_rows rows (the engine's and the
// request pools' threshold, GatherEngineOptions) is a decode step, a larger one a prefill.
MissClass MissClassOfGather(size_t rows);

// Reads `rows` of `table` through `engine` in pieces the queue grants (class `c`, all due when
// the table's layer is: MissQueue::Due), into `bounce`, and calls done(i, row) with each row's
// 264 bytes (i indexes `rows`). Rows are read in row order, so that misses on one page are in one
// piece and the planner makes them one read. A prefetch or admission piece the queue drops or
// sheds is skipped (its rows get no call). Stops at the first error, which is the engine's.
absl::Status ReadMisses(GatherEngine* engine, MissQueue* queue, MissClass c, const Table* table,
                        std::span<const uint64_t> rows, std::vector<uint8_t>& bounce,
                        absl::FunctionRef<void(size_t i, const uint8_t* row)> done);

}  // namespace engram
