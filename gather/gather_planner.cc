// GatherPlanner: validation, de-duplication, offset ordering and read merging for one batch.
#include "gather/gather_planner.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/page_size.h"

namespace engram {
namespace {

int BitsFor(uint64_t max_value) { return max_value == 0 ? 1 : std::bit_width(max_value); }

}  // namespace

void GatherPlan::Clear() {
  table = nullptr;
  rows_requested = 0;
  unique_rows.clear();
  unique_dest.clear();
  copies.clear();
  reads.clear();
  iovs.clear();
  iov_unique.clear();
}

void RadixSortU64(std::vector<uint64_t>& keys, int bits, std::vector<uint64_t>& tmp) {
  const size_t n = keys.size();
  if (n < 256) {
    std::sort(keys.begin(), keys.end());
    return;
  }
  constexpr int kDigitBits = 11;
  constexpr size_t kBuckets = size_t{1} << kDigitBits;
  tmp.resize(n);
  std::vector<uint32_t> counts(kBuckets);
  uint64_t* src = keys.data();
  uint64_t* dst = tmp.data();
  int passes = 0;
  for (int shift = 0; shift < bits; shift += kDigitBits, ++passes) {
    std::fill(counts.begin(), counts.end(), 0);
    for (size_t i = 0; i < n; ++i) counts[(src[i] >> shift) & (kBuckets - 1)]++;
    uint32_t sum = 0;
    for (auto& c : counts) {
      const uint32_t c0 = c;
      c = sum;
      sum += c0;
    }
    for (size_t i = 0; i < n; ++i) dst[counts[(src[i] >> shift) & (kBuckets - 1)]++] = src[i];
    std::swap(src, dst);
  }
  if (passes % 2 == 1) std::memcpy(keys.data(), tmp.data(), n * sizeof(uint64_t));
}

namespace {

// The batch's shape against the planner's limits: size, destination, offsets.
absl::Status CheckBatch(const GatherBatch& batch, const PlannerOptions& options) {
  const Table* table = batch.table;
  if (table == nullptr) return absl::InvalidArgumentError("gather batch names no table");
  const size_t n = batch.rows.size();
  if (n > options.max_batch_rows) {
    return absl::ResourceExhaustedError(absl::StrCat("gather batch of ", n, " rows for table ",
                                                     table->Describe(), " exceeds the limit of ",
                                                     options.max_batch_rows, " rows"));
  }
  if (n > 0 && batch.dest == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather batch for table ", table->Describe(), " has no destination"));
  }
  if (!batch.dest_offsets.empty() && batch.dest_offsets.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather batch for table ", table->Describe(), " has ", n, " rows but ",
                     batch.dest_offsets.size(), " destination offsets"));
  }
  return absl::OkStatus();
}

// Every row against the rows the table covers; the error names the row and its batch index.
absl::Status CheckRows(const GatherBatch& batch) {
  const Table* table = batch.table;
  const RowRange covered = table->covered();
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    if (!covered.contains(batch.rows[i])) [[unlikely]] {
      absl::Status s = table->CheckRow(batch.rows[i]);
      if (s.ok()) {
        s = absl::OutOfRangeError(absl::StrCat("row ", batch.rows[i], " of table ",
                                               table->Describe(), " is not covered"));
      }
      return absl::Status(s.code(), absl::StrCat(s.message(), " (batch index ", i, ")"));
    }
  }
  return absl::OkStatus();
}

// De-duplicates and orders by row (hence by file offset in every part) with one sort of packed
// (row, slot) keys; rows are stored relative to the covered range to keep the keys short.
void SortUnique(const GatherBatch& batch, GatherPlan& plan) {
  const size_t n = batch.rows.size();
  const RowRange covered = batch.table->covered();
  const int slot_bits = BitsFor(n - 1);
  const int row_bits = BitsFor(covered.size() - 1);
  const uint64_t slot_mask = (uint64_t{1} << slot_bits) - 1;
  auto add = [&](uint64_t row, uint64_t slot) {
    uint8_t* dest =
        batch.dest + (batch.dest_offsets.empty() ? slot * kRowBytes : batch.dest_offsets[slot]);
    if (!plan.unique_rows.empty() && plan.unique_rows.back() == row) {
      plan.copies.push_back({static_cast<uint32_t>(plan.unique_rows.size() - 1), dest});
    } else {
      plan.unique_rows.push_back(row);
      plan.unique_dest.push_back(dest);
    }
  };
  plan.unique_rows.reserve(n);
  plan.unique_dest.reserve(n);
  if (slot_bits + row_bits <= 64) {
    thread_local std::vector<uint64_t> keys, tmp;
    keys.resize(n);
    for (size_t i = 0; i < n; ++i) keys[i] = ((batch.rows[i] - covered.begin) << slot_bits) | i;
    RadixSortU64(keys, slot_bits + row_bits, tmp);
    for (uint64_t k : keys) add((k >> slot_bits) + covered.begin, k & slot_mask);
  } else {
    std::vector<std::pair<uint64_t, uint64_t>> pairs(n);
    for (size_t i = 0; i < n; ++i) pairs[i] = {batch.rows[i], i};
    std::sort(pairs.begin(), pairs.end());
    for (const auto& [row, slot] : pairs) add(row, slot);
  }
}

// One run of reads for `part`; its offsets grow with the row, so the run is ordered. Reads that
// are adjacent or share a page merge (gaps go to the sink) within the planner's bounds.
void PlanPartReads(const RowPart& part, const PlannerOptions& options, uint64_t page,
                   GatherPlan& plan) {
  const size_t u = plan.unique_rows.size();
  plan.reads.reserve(plan.reads.size() + u);
  plan.iovs.reserve(plan.iovs.size() + u);
  PlannedRead* cur = nullptr;
  uint64_t cur_end = 0;
  for (size_t i = 0; i < u; ++i) {
    const uint64_t off = part.FileOffset(plan.unique_rows[i]);
    uint8_t* dest = plan.unique_dest[i] + part.dest_offset;
    if (cur != nullptr && options.merge) {
      const uint64_t gap = off - cur_end;
      const bool same_page = (cur_end - 1) / page == off / page;
      if ((gap == 0 || same_page) && cur->length + gap + part.bytes <= options.max_merged_bytes &&
          cur->iov_count + 2 <= options.max_merged_iovs) {
        if (gap > 0) {
          plan.iovs.push_back({plan.gap_sink.data(), gap});
          plan.iov_unique.push_back(kGapIov);
          cur->iov_count++;
        }
        plan.iovs.push_back({dest, part.bytes});
        plan.iov_unique.push_back(static_cast<uint32_t>(i));
        cur->iov_count++;
        cur->length += static_cast<uint32_t>(gap + part.bytes);
        cur_end = off + part.bytes;
        continue;
      }
    }
    plan.reads.push_back({.offset = off,
                          .length = part.bytes,
                          .file = part.file,
                          .iov_begin = static_cast<uint32_t>(plan.iovs.size()),
                          .iov_count = 1});
    plan.iovs.push_back({dest, part.bytes});
    plan.iov_unique.push_back(static_cast<uint32_t>(i));
    cur = &plan.reads.back();
    cur_end = off + part.bytes;
  }
}

}  // namespace

absl::Status GatherPlanner::Plan(const GatherBatch& batch, GatherPlan* ret_plan) const {
  GatherPlan& plan = *ret_plan;
  plan.Clear();
  if (absl::Status s = CheckBatch(batch, options_); !s.ok()) return s;
  plan.table = batch.table;
  plan.rows_requested = batch.rows.size();
  if (batch.rows.empty()) return absl::OkStatus();
  if (absl::Status s = CheckRows(batch); !s.ok()) return s;
  SortUnique(batch, plan);
  // A gap lies inside one page, so the sink never needs more than a page.
  const uint64_t page = options_.page_bytes != 0 ? options_.page_bytes : PageBytes();
  plan.gap_sink.resize(std::min<uint64_t>(page, options_.max_merged_bytes));
  for (const RowPart& part : batch.table->parts()) PlanPartReads(part, options_, page, plan);
  return absl::OkStatus();
}

}  // namespace engram
