// GatherPlanner: turns a batch of (row, slot) requests into the fewest file reads: rows are
// de-duplicated, ordered by file offset, and reads that are adjacent or share a page are merged.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gather/gather_engine.h"
#include "tables/table.h"

namespace engram {

// Marks an iovec whose bytes are not part of any row (the gap between two merged reads).
inline constexpr uint32_t kGapIov = UINT32_MAX;

// One read of `length` bytes at `offset` of table file `file`, scattered over
// iovs[iov_begin, iov_begin + iov_count) of its plan.
struct PlannedRead {
  uint64_t offset = 0;
  uint32_t length = 0;
  uint32_t file = 0;  // index into Table::files()
  uint32_t iov_begin = 0;
  uint32_t iov_count = 0;
};

// A row that was asked for more than once: after the batch, `slot` receives a copy of the
// row from the slot of unique row `unique`.
struct SlotCopy {
  uint32_t unique = 0;
  uint8_t* slot = nullptr;
};

struct GatherPlan {
  const Table* table = nullptr;
  uint64_t rows_requested = 0;
  std::vector<uint64_t> unique_rows;  // ascending
  std::vector<uint8_t*> unique_dest;  // the slot each unique row is read into
  std::vector<SlotCopy> copies;
  std::vector<PlannedRead> reads;  // per part, ascending offsets
  std::vector<iovec> iovs;
  std::vector<uint32_t> iov_unique;  // unique-row index of each iovec, or kGapIov
  // Sink for the bytes between merged reads that share a page; never read.
  std::vector<uint8_t> gap_sink;

  void Clear();
};

struct PlannerOptions {
  // Merge two reads of one part when they are adjacent in the file or the next one starts on
  // the page where the current one ends (no extra page is touched), up to these bounds.
  bool merge = true;
  uint32_t max_merged_bytes = 64 * 1024;
  uint32_t max_merged_iovs = 64;
  uint32_t max_batch_rows = 1u << 22;
  // The page merges are decided by: 0 means PageBytes() (the kernel's, the page cache's unit);
  // O_DIRECT tables use kDirectIoAlignBytes (the device's block). The gap between two merged
  // reads is less than one such page, read into the plan's sink.
  uint64_t page_bytes = 0;
};

class GatherPlanner {
 public:
  explicit GatherPlanner(const PlannerOptions& options) : options_(options) {}

  // Validates every row of `batch` against its table (nothing is read when one is refused:
  // the status names the table, the row and its index in the batch) and fills `ret_plan`.
  absl::Status Plan(const GatherBatch& batch, GatherPlan* ret_plan) const;

 private:
  PlannerOptions options_;
};

// Sorts `keys` ascending in place with an LSD radix sort over the low `bits` bits (the other
// bits must be zero). `tmp` is scratch space, resized as needed.
void RadixSortU64(std::vector<uint64_t>& keys, int bits, std::vector<uint64_t>& tmp);

}  // namespace engram
