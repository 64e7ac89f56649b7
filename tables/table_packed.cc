// OpenPacked(): opens one packed table file (tables/packed_format.h) as a Table.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tables/packed_format.h"
#include "tables/table.h"
#include "tables/table_internal.h"

namespace engram {

absl::StatusOr<std::unique_ptr<Table>> OpenPacked(const std::string& path,
                                                  const OpenOptions& options) {
  auto file = OpenTableFile(path);
  if (!file.ok()) return file.status();
  if (file->size < sizeof(PackedHeader)) {
    return absl::DataLossError(absl::StrCat(path, ": file is ", file->size,
                                            " bytes, too short for the ", sizeof(PackedHeader),
                                            "-byte packed table header"));
  }
  PackedHeader h;
  if (absl::Status s = PreadFull(file->fd.get(), path, &h, sizeof(h), 0); !s.ok()) return s;
  if (absl::Status s = ValidatePackedHeader(h, path); !s.ok()) return s;
  if (file->size < h.data_end) {
    return absl::DataLossError(absl::StrCat(
        path, ": file is ", file->size, " bytes but its header says rows [", h.covered_begin, ", ",
        h.covered_end, ") end at offset ", h.data_end, " (truncated?)"));
  }
  if (!options.layers.empty() &&
      std::find(options.layers.begin(), options.layers.end(), h.layer_id) == options.layers.end()) {
    return absl::NotFoundError(absl::StrCat(path, " holds layer ", h.layer_id,
                                            ", not one of the requested layers ",
                                            absl::StrJoin(options.layers, ", ")));
  }
  RowRange covered{h.covered_begin, h.covered_end};
  if (options.rows) {
    const RowRange& want = *options.rows;
    if (want.begin >= want.end || want.begin < covered.begin || want.end > covered.end) {
      return absl::OutOfRangeError(
          absl::StrCat(path, ": declared rows [", want.begin, ", ", want.end,
                       ") are empty or not inside the rows the file holds [", covered.begin, ", ",
                       covered.end, ")"));
    }
    covered = want;
  }
  TableBuilder builder(h.layer_id, h.num_rows, covered, TableLayout::kPacked, path);
  RowPart part;
  part.file = builder.AddFile(*std::move(file));
  part.dest_offset = 0;
  part.bytes = kRowBytes;
  // Sparse files address rows from 0 like the checkpoint they were cut from; compacted files
  // from their first row.
  part.base_row = (h.flags & kPackedFlagSparse) ? 0 : h.covered_begin;
  part.base = PackedRowOffset(h, part.base_row);
  if (PackedPaged(h)) {  // version 2: 15 rows to a 4 KiB page
    part.rows_per_page = h.rows_per_page;
    part.page_bytes = h.page_bytes;
  }
  builder.AddPart(part);
  return builder.Finish(options.check_holes);
}

}  // namespace engram
