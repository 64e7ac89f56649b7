// Converting an Engram table (checkpoint or packed) into the packed layout, streaming in
// bounded memory: the library behind engram-pack.
//
//   engram::PackOptions opts{.input = "/models/V4.1", .layer = 14, .out = "/nvme/l14.etbl"};
//   opts.rows = engram::RowRange{96000564, 192001740};   // one TP rank, compacted
//   absl::Status s = engram::PackTable(opts);
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tables/table.h"

namespace engram {

struct PackOptions {
  std::string input;  // checkpoint directory or packed file
  uint32_t layer = 0;
  std::string out;  // written as out.tmp-XXXXXX, fsynced, then renamed over `out`
  // Rows to keep (a per-rank copy); unset: every row the input covers.
  std::optional<RowRange> rows;
  // Keep rows at their original offsets (a sparse file) instead of compacting them.
  bool sparse = false;
  // Write format version 2: 15 rows to each 4 KiB page, none straddling one, so that an
  // O_DIRECT read of a row is one page (the cache tier's misses).
  bool paged = false;
  // Bytes of row data moved per step; memory use is about twice this.
  uint64_t buffer_bytes = 4ull << 20;
  // Check the input for holes in the rows it is asked for (OpenOptions::check_holes).
  bool check_input_holes = true;
  // Called after every step with bytes of row data written so far and the total.
  std::function<void(uint64_t done_bytes, uint64_t total_bytes)> progress;
};

// What a pack wrote and how long it took (engram-pack reports it).
struct PackStats {
  uint64_t rows = 0;        // rows written
  uint64_t row_bytes = 0;   // rows x 264
  uint64_t file_bytes = 0;  // the output's size (header page, rows, page padding)
  uint64_t disk_bytes = 0;  // what it takes on disk (st_blocks; less for a sparse copy)
  double seconds = 0;       // from opening the input to the checked, renamed output
};

// Writes layer `options.layer` of `options.input` to `options.out` in the packed layout and
// checks the result opens; fills `ret_stats` when given. On failure nothing is left at `out`
// (an existing file there is kept).
absl::Status PackTable(const PackOptions& options, PackStats* ret_stats = nullptr);

}  // namespace engram
