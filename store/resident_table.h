// ResidentTable: an Engram table (or the row range this copy covers) held in a daemon-owned
// memfd, streamed from its checkpoint shards or packed file with O_DIRECT, then sealed so that
// clients can map it read-only. Loading is incremental: rows below rows_loaded() are readable
// while the rest streams in; a cancelled load resumes where it stopped.
//
// Only the files the table validated at open are read: through the table's own fds, or an
// O_DIRECT descriptor reopened from them (/proc/self/fd), never by path. Each chunk first checks
// that no file changed since Create() (fstat: size, mtime, ctime; stat of the path: same inode);
// after the last chunk a sample of rows is compared with buffered reads through the validated
// fds. A table whose file changed is refused for good (refusal()): its rows stop being served
// from memory and it is never sealed, so it cannot be mapped.
//
//   auto rt = engram::ResidentTable::Create(table, &budget, {});
//   std::atomic<bool> cancel{false};
//   absl::Status s = (*rt)->Load(&cancel, [](uint64_t done, uint64_t total) { ... });
//   uint8_t row[engram::kRowBytes];
//   if ((*rt)->CopyRow(42, row)) { /* a hit: one memcpy */ }
#pragma once

#include <sys/types.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/prefetch.h"
#include "store/memory_budget.h"
#include "store/shared_region.h"
#include "tables/table.h"

namespace engram {

struct ResidentOptions {
  // Use hugetlb pages (the kernel's default huge page size) where they are reserved (a notice
  // says when they are not).
  bool huge_pages = true;
  // Read the files with O_DIRECT (aligned page runs), so the page cache holds no second copy.
  // Falls back to buffered reads, with a notice, where the filesystem refuses it (tmpfs).
  bool direct_io = true;
  // Rows read per step; progress, cancellation and the readable watermark move by this much.
  uint64_t chunk_rows = 16384;
  // Bytes per second the load may read at most (0: as fast as the storage goes), so that a load
  // beside serving does not take the disk from the misses of the other tables.
  uint64_t rate_bytes_per_s = 0;
};

class ResidentTable {
 public:
  using Progress = std::function<void(uint64_t rows_done, uint64_t rows_total)>;

  // Reserves the table's bytes from `budget` (may be null: unaccounted) and creates the memfd;
  // nothing is read yet. ResourceExhausted naming the table when the budget or the kernel
  // refuses the memory. `table` must outlive the ResidentTable.
  static absl::StatusOr<std::unique_ptr<ResidentTable>> Create(const Table& table,
                                                               MemoryBudget* budget,
                                                               const ResidentOptions& options);
  ~ResidentTable();

  // Reads the rows not yet loaded, chunk by chunk, calling `progress` after each. Returns
  // Cancelled (naming the table and the rows loaded) when *cancel becomes true: it is looked at
  // before each chunk and every 50 ms of a rate limit's wait, so a cancelled load returns within
  // one chunk's read plus 50 ms. A later Load() resumes from there, under the same rate limit
  // (the rate's budget is kept across loads). Verifies and seals the memfd once every row is
  // in. A read error names the file and offset; a changed file is DataLoss naming it, and
  // refuses the table for good. One Load() at a time (FailedPrecondition otherwise).
  absl::Status Load(const std::atomic<bool>* cancel, const Progress& progress);
  // OK, or the DataLoss that refused the table (a file changed under it). Thread-safe.
  absl::Status refusal() const;

  const Table& table() const { return table_; }
  RowRange covered() const { return table_.covered(); }
  // Rows [covered().begin, covered().begin + rows_loaded()) are readable.
  uint64_t rows_loaded() const { return rows_loaded_.load(std::memory_order_acquire); }
  // Every row is in and the memfd is sealed: only now may fd() be handed to a client, which
  // refuses an unsealed one. (The last rows are readable here a little earlier, before the
  // seal.)
  bool loaded() const { return sealed_.load(std::memory_order_acquire); }
  // Bytes of memory held (the region, rounded to its pages); what was reserved from the budget.
  uint64_t bytes() const { return region_.size(); }
  bool huge_pages() const { return region_.huge_pages(); }
  uint64_t page_bytes() const { return region_.page_bytes(); }
  bool direct_io() const { return direct_io_used_; }
  // The sealed memfd (valid once loaded(); before that it is still being written).
  int fd() const { return region_.fd(); }
  // Notices for the operator (no huge pages, no O_DIRECT), each naming the table or file.
  std::vector<std::string> notices() const;

  // Copies row `row` (an absolute row id) into `dst` (264 bytes) if it is loaded; false if it is
  // outside the covered range or not loaded yet. No syscalls; safe from any thread.
  bool CopyRow(uint64_t row, uint8_t* dst) const {
    uint64_t index = row - table_.covered().begin;
    if (row < table_.covered().begin || index >= rows_loaded()) return false;
    __builtin_memcpy(dst, region_.data() + index * kRowBytes, kRowBytes);
    return true;
  }
  // Asks the CPU for row `row`'s cache lines ahead of its CopyRow: rows are copied at random,
  // and a gather that prefetches a few rows ahead overlaps their cache misses instead of
  // waiting for each in turn. No-op for a row CopyRow would refuse.
  void PrefetchRow(uint64_t row) const {
    if (const uint8_t* p = Row(row); p != nullptr) PrefetchLines(p, kRowBytes);
  }
  // The row in place (valid while this object lives), or null as for CopyRow.
  const uint8_t* Row(uint64_t row) const {
    uint64_t index = row - table_.covered().begin;
    if (row < table_.covered().begin || index >= rows_loaded()) return nullptr;
    return region_.data() + index * kRowBytes;
  }

 private:
  // What a file was when the table was created: a later difference means it changed.
  struct FileIdentity {
    dev_t dev = 0;
    ino_t ino = 0;
    uint64_t size = 0;
    timespec mtime{};
    timespec ctime{};
  };
  ResidentTable(const Table& table, MemoryBudget* budget, const ResidentOptions& options)
      : table_(table), budget_(budget), options_(options) {}
  absl::Status RecordFiles();
  // DataLoss naming the file when one is no longer what RecordFiles() saw; `when` says where
  // in the load ("before chunk at row 32768").
  absl::Status CheckFiles(const std::string& when) const;
  // Compares a sample of the loaded rows with buffered reads through the validated fds.
  absl::Status VerifySample() const;
  absl::Status Refuse(absl::Status why);
  absl::Status OpenReaders();
  absl::Status LoadChunk(uint64_t first, uint64_t count);
  absl::Status ReadRange(uint32_t file, uint64_t begin, uint64_t end, uint8_t** ret_data);
  // Waits until the rate limit allows the next chunk; false when cancelled meanwhile.
  bool WaitForRate(const std::atomic<bool>* cancel) const;
  absl::Status Finish();

  const Table& table_;
  MemoryBudget* budget_;
  const ResidentOptions options_;
  SharedRegion region_;
  uint64_t reserved_ = 0;
  std::atomic<uint64_t> rows_loaded_{0};
  std::atomic<bool> sealed_{false};  // set once Load() sealed the region after the last row
  std::atomic<bool> loading_{false};
  bool direct_io_used_ = false;
  std::vector<FileIdentity> identities_;  // per file of the table, from Create()
  // The rate limit's bucket (ns, steady clock): the next chunk may start once this has passed.
  // Kept across Load() calls, so that cancelling and resuming cannot read faster than the rate.
  uint64_t rate_due_ns_ = 0;
  absl::Status refusal_;  // guarded by notices_mu_
  // Per file: an O_DIRECT fd when the filesystem takes it, else -1 (buffered through the table's).
  std::vector<UniqueFd> direct_fds_;
  bool readers_open_ = false;
  // Aligned bounce buffer for one part of one chunk.
  uint8_t* buffer_ = nullptr;
  uint64_t buffer_bytes_ = 0;
  mutable std::mutex notices_mu_;
  std::vector<std::string> notices_;
};

}  // namespace engram
