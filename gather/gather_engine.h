// The gather engine: fills destination slots with Engram rows, reading page-cache-resident rows
// with serial RWF_NOWAIT reads on the calling thread and handing only the rows that would block
// to io_uring workers or a blocking pool.
//
//   auto engine = engram::GatherEngine::Create({.workers = 4});
//   engine->AddTable(table.get(), {});
//   engram::GatherBatch batch{.table = table.get(), .rows = rows, .dest = buf};
//   absl::Status s = (*engine)->Gather(batch);        // synchronous
//   (*engine)->Submit(batch, [](absl::Status s) {});  // asynchronous, on a worker
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gather/gather_counters.h"
#include "tables/table.h"

namespace engram {

enum class ReadMode : uint8_t {
  kBuffered,  // page cache: NOWAIT fast path, then io_uring / pool for the residue
  kDirect,    // O_DIRECT page runs into an aligned bounce area (tables much larger than RAM)
};

struct TableGatherOptions {
  ReadMode mode = ReadMode::kBuffered;
};

// How the fast path issues its RWF_NOWAIT reads.
enum class NowaitPass : uint8_t {
  kAuto,    // batched io_uring reads with RWF_NOWAIT when the thread has a ring, else kSerial
  kSerial,  // one preadv2(RWF_NOWAIT) per planned read on the calling thread
  kUring,   // batched io_uring reads with RWF_NOWAIT (falls back to kSerial without a ring)
  kOff,     // never: every read goes straight to io_uring / the blocking pool
};

// A preadv2-compatible read: returns the bytes read or -errno (never -1 with errno). The engine
// calls it for every RWF_NOWAIT read of the serial fast path and every blocking-pool read, so a
// test or a tracing build can wrap the real call. Must be thread-safe.
using ReadFn =
    std::function<ssize_t(int fd, const struct iovec* iov, int iovcnt, off_t offset, int flags)>;

// Receives one-time notices (a file that refused RWF_NOWAIT, io_uring unavailable). Library code
// never logs: the daemon logs these once. Called from any gather thread; must be thread-safe.
using NoticeFn = std::function<void(const std::string& notice)>;

// A fault seam for the gather rings: called before every io_uring_enter a gather ring makes to
// submit and wait for reads. A nonzero `error` makes that call fail with it as if the kernel had
// refused it: with `after_submit`, the reads queued so far reach the kernel first and the wait
// fails (reads are in flight when the ring breaks); without, nothing is submitted. Tests use it to
// break a ring in the middle of a batch. Must be thread-safe.
struct UringEnterFault {
  int error = 0;  // a positive errno; 0: no fault
  bool after_submit = false;
};
using UringEnterFaultFn = std::function<UringEnterFault()>;

struct GatherEngineOptions {
  // Gather workers, each owning one io_uring ring; 0 = number of online CPUs.
  uint32_t workers = 0;
  // io_uring queue depth per worker.
  uint32_t ring_entries = 256;
  // Use io_uring for the residue when the kernel allows it; false forces the blocking pool.
  bool use_io_uring = true;

  // --- Extensions (all optional) ---
  // Threads of the blocking pool, started only when a residue must go there (no io_uring, or a
  // file whose filesystem refuses async buffered reads).
  uint32_t blocking_threads = 16;
  NowaitPass nowait_pass = NowaitPass::kAuto;
  // Adaptive policy: a table's NOWAIT pass runs while its recent hit rate is at least this;
  // below it, batches go straight to the residue path and every `probe_interval`-th batch
  // tries `probe_reads` NOWAIT reads to notice when the rows became resident again.
  double nowait_min_hit_rate = 0.5;
  uint32_t probe_interval = 8;
  uint32_t probe_reads = 32;
  // Batches with more planned reads than this are split into chunks of split_reads / 2 reads,
  // claimed by the calling thread and the workers together (a decode step's 1,152 rows fan out
  // over a few threads; fewer, bigger chunks save CPU on small machines).
  uint32_t split_reads = 256;
  // Bound on rows per batch (a client cannot push past it: ResourceExhausted).
  uint32_t max_batch_rows = 1u << 22;
  // Merge reads that are adjacent or share a page (false: one read per row part).
  bool merge_reads = true;
  // Table files the engine can register with its rings (fixed files); more are read unfixed.
  uint32_t max_fixed_files = 1024;
  // Bounce area per thread for O_DIRECT tables.
  uint32_t direct_bounce_bytes = 4u << 20;
  ReadFn read_fn;   // empty: preadv2
  NoticeFn notice;  // empty: notices only show in Stats()
  // Register each thread's O_DIRECT bounce area with its ring (io_uring fixed buffers: the kernel
  // skips pinning the pages on every read). It pins direct_bounce_bytes per ring; when the kernel
  // refuses (RLIMIT_MEMLOCK, ENOMEM) the reads go unregistered and one notice says why.
  bool register_direct_buffers = true;
  UringEnterFaultFn uring_enter_fault;  // empty: never (the production setting)
  // For benchmarks only: a slower (or slower-looking) storage device. Every O_DIRECT read (the
  // row cache's misses, tables read with ReadMode::kDirect) completes no earlier than its issue
  // time + latency_ns, and the reads of all threads together no faster than iops reads of 4 KiB
  // per second (a longer read counts as one per 4 KiB it spans). A read the real device answered
  // sooner is held until then; reads issued meanwhile are not held back, so the emulated device
  // serves many reads at once. Both 0: off (the production setting).
  struct EmulatedDevice {
    uint64_t latency_ns = 0;
    uint64_t iops = 0;
    bool on() const { return latency_ns != 0 || iops != 0; }
  };
  EmulatedDevice emulated_device;

  // --- Scheduling ---
  // A batch is shared with workers only when its estimated work (planned reads x the table's
  // measured thread time per read) gives each thread at least this much: a helper that is woken
  // for less costs more than it saves. While several batches run, each gets its share of the
  // workers (workers / batches running) instead of all of them.
  uint64_t helper_min_work_ns = 40'000;
  // Helpers an O_DIRECT batch (a row cache's misses, ReadMode::kDirect) may have at most. Its
  // reads wait for the device, not for a CPU: one ring keeps the device's queue full, and each
  // helper's ring only adds submissions, completions and wake-ups. On the 16-core GPU host a miss
  // batch of 768 rows came back as fast with one helper as with 15, at 2.5 against 5.6 µs of CPU
  // per row (docs/performance.md). Raise it for a device one thread cannot keep busy.
  uint32_t direct_max_helpers = 1;
  // Batches of at most this many rows are decode steps: while one runs, the helpers of larger
  // batches (prefill) step aside after their current chunk and come back when none runs, so a
  // prefill cannot take the cores a decode step needs.
  uint32_t decode_max_rows = 16384;
  // Idle workers spin this long before they park (a batch arriving meanwhile costs no wake-up);
  // kAutoSpin: DefaultWorkerSpinNs(online CPUs).
  static constexpr uint64_t kAutoSpin = UINT64_MAX;
  uint64_t worker_spin_ns = kAutoSpin;
};

// The workers' spin before parking for a machine of `cpus` CPUs: none below 8 CPUs, where a
// spinning worker takes a core from the threads doing the work; 10 µs from 8 CPUs up (about two
// bare-metal futex wake-ups: a spell that catches the next chunk of a batch, not the next step).
uint64_t DefaultWorkerSpinNs(uint32_t cpus);

// One batch: rows[i] of `table` goes to dest + dest_offsets[i] (or dest + i * row_bytes when
// dest_offsets is empty). Every destination must have room for 264 bytes. The spans must stay
// valid until the batch completes.
struct GatherBatch {
  const Table* table = nullptr;
  std::span<const uint64_t> rows;
  uint8_t* dest = nullptr;
  std::span<const uint64_t> dest_offsets;
};

// Counters of one table since the engine started (gather/gather_counters.h lists them).
// Every counter only grows; the policy fields below them may change.
struct TableGatherStats {
  uint32_t layer_id = 0;
#define ENGRAM_GATHER_STATS_FIELD(field, json_key, metric, help) uint64_t field = 0;
  ENGRAM_GATHER_COUNTERS(ENGRAM_GATHER_STATS_FIELD)
#undef ENGRAM_GATHER_STATS_FIELD
  bool nowait_supported = true;  // false once the filesystem refused RWF_NOWAIT
  bool nowait_enabled = true;    // the adaptive policy's current choice
  double recent_hit_rate = 1.0;  // the policy's input
  ReadMode mode = ReadMode::kBuffered;
  std::string residue_path;  // "io_uring", "blocking pool" or "O_DIRECT io_uring" / "O_DIRECT pool"
  // Batch latency histogram: bucket i counts batches with latency in [2^i, 2^(i+1)) ns.
  std::vector<uint64_t> latency_buckets;
  uint64_t latency_sum_ns = 0;  // every batch's latency added up (the histogram's exact sum)
  // The upper edge of the bucket holding the q-quantile (q in [0, 1]); 0 with no batches.
  uint64_t LatencyPercentileNs(double q) const;
};

// Calls visit(info, value) for every counter of `stats`, in the order of gather_counters.h. The
// JSON statistics and the Prometheus metrics are written from it.
template <typename Visitor>
void ForEachGatherCounter(const TableGatherStats& stats, Visitor&& visit) {
#define ENGRAM_GATHER_VISIT(field, json_key, metric, help) \
  visit(GatherCounterInfo{#field, json_key, metric, help}, stats.field);
  ENGRAM_GATHER_COUNTERS(ENGRAM_GATHER_VISIT)
#undef ENGRAM_GATHER_VISIT
}

class GatherEngine {
 public:
  static absl::StatusOr<std::unique_ptr<GatherEngine>> Create(const GatherEngineOptions& options);
  virtual ~GatherEngine() = default;

  // Registers a table before it is gathered from. The table must outlive the engine, or be
  // removed with RemoveTable() before it is closed.
  virtual absl::Status AddTable(const Table* table, const TableGatherOptions& options) = 0;

  // Forgets a table (extension): its files leave every ring's fixed-file set and its statistics
  // are dropped. No batch of the table may be running or submitted. NotFound if it was not added.
  virtual absl::Status RemoveTable(const Table* table) = 0;

  // Fills every slot of the batch, or returns the first error (a row outside the table, a file
  // that ended early): the status names the table, row, file and offset. Rows are validated
  // before anything is read. Thread-safe; concurrent batches run in parallel.
  virtual absl::Status Gather(const GatherBatch& batch) = 0;

  // Runs the batch on a gather worker and calls `done` there with its outcome.
  using Done = absl::AnyInvocable<void(absl::Status) &&>;
  virtual void Submit(const GatherBatch& batch, Done done) = 0;

  virtual std::vector<TableGatherStats> Stats() const = 0;
};

}  // namespace engram
