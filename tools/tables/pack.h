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
  // Bytes of row data moved per step; memory use is about twice this.
  uint64_t buffer_bytes = 4ull << 20;
  // Check the input for holes in the rows it is asked for (OpenOptions::check_holes).
  bool check_input_holes = true;
  // Called after every step with bytes of row data written so far and the total.
  std::function<void(uint64_t done_bytes, uint64_t total_bytes)> progress;
};

// Writes layer `options.layer` of `options.input` to `options.out` in the packed layout and
// checks the result opens. On failure nothing is left at `out` (an existing file there is kept).
absl::Status PackTable(const PackOptions& options);


}  // namespace engram
