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

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/table.h"

namespace engram {

enum class ReadMode : uint8_t {
  kBuffered,  // page cache: NOWAIT fast path, then io_uring / pool for the residue
  kDirect,    // O_DIRECT page runs into an aligned bounce area (tables much larger than RAM)
};

struct TableGatherOptions {
  ReadMode mode = ReadMode::kBuffered;
};

struct GatherEngineOptions {
  // Gather workers, each owning one io_uring ring; 0 = number of online CPUs.
  uint32_t workers = 0;
  // io_uring queue depth per worker.
  uint32_t ring_entries = 256;
  // Use io_uring for the residue when the kernel allows it; false forces the blocking pool.
  bool use_io_uring = true;
};

// One batch: rows[i] of `table` goes to dest + dest_offsets[i] (or dest + i * row_bytes when
// dest_offsets is empty). Every destination must have room for 264 bytes. The spans must stay
// valid until the batch completes.
struct GatherBatch {
  const Table* table = nullptr;
  std::span<const uint64_t> rows;
  uint8_t* dest = nullptr;
  std::span<const uint64_t> dest_offsets;
};

// Counters of one table since the engine started. Every field only grows, except the policy.
struct TableGatherStats {
  uint32_t layer_id = 0;
  uint64_t batches = 0;
  uint64_t rows_requested = 0;
  uint64_t rows_unique = 0;      // after de-duplication
  uint64_t read_calls = 0;       // preadv2 / io_uring reads issued, after merging
  uint64_t nowait_hits = 0;      // rows served by the NOWAIT pass
  uint64_t nowait_eagain = 0;    // rows handed on as residue
  uint64_t partial_reads = 0;
  uint64_t uring_reads = 0;
  uint64_t pool_reads = 0;
  uint64_t direct_reads = 0;
  uint64_t bytes_read = 0;
  uint64_t errors = 0;
  bool nowait_supported = true;  // false once the filesystem refused RWF_NOWAIT
  bool nowait_enabled = true;    // the adaptive policy's current choice
  double recent_hit_rate = 1.0;  // the policy's input
  // Batch latency histogram: bucket i counts batches with latency in [2^i, 2^(i+1)) ns.
  std::vector<uint64_t> latency_buckets;
  uint64_t LatencyPercentileNs(double q) const;
};

class GatherEngine {
 public:
  static absl::StatusOr<std::unique_ptr<GatherEngine>> Create(const GatherEngineOptions& options);
  virtual ~GatherEngine() = default;

  // Registers a table before it is gathered from. The table must outlive the engine.
  virtual absl::Status AddTable(const Table* table, const TableGatherOptions& options) = 0;

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
