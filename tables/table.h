// Engram tables as engramd serves them: opening, validating and addressing the rows of a
// DeepSeek-V4.1 Engram table stored as a safetensors checkpoint or as a packed file.
//
// A Table that opened is safe to serve: every row it covers lies inside its files, and a row it
// does not cover is refused by CheckRow() instead of being read from a hole.
//
//   auto tables = engram::OpenCheckpoint("/models/DeepSeek-V4.1-Flash", {});
//   if (!tables.ok()) { /* the status names the file, tensor and problem */ }
//   for (const auto& t : *tables) {
//     const RowPart& p = t->parts()[0];
//     uint64_t off = p.FileOffset(row);  // bytes [off, off + p.bytes) of t->files()[p.file]
//   }
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engram/row.h"

namespace engram {

// DeepSeek-V4.1 row geometry (include/engram/row.h): 256 FP8 E4M3 values followed by 8 E8M0
// scales (one per 32 values).
inline constexpr uint32_t kValueBytes = ENGRAM_ROW_VALUES;
inline constexpr uint32_t kScaleBytes = ENGRAM_ROW_SCALES;
inline constexpr uint32_t kRowBytes = ENGRAM_ROW_BYTES;
inline constexpr uint32_t kScaleBlock = ENGRAM_ROW_SCALE_BLOCK;

// enum engram_table_layout (include/engram/row.h) as a scoped enum with the same values:
// safetensors shards (values and scales in two tensors, one row = two reads), or one packed
// file of 264-byte rows after a header (docs/table_format.md).
enum class TableLayout : uint8_t {
  kCheckpoint = ENGRAM_LAYOUT_CHECKPOINT,
  kPacked = ENGRAM_LAYOUT_PACKED,
};
const char* TableLayoutName(TableLayout layout);

// Half-open row interval [begin, end).
struct RowRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
  bool contains(uint64_t row) const { return row >= begin && row < end; }
  bool operator==(const RowRange&) const = default;
};

// Parses "BEGIN:END" (half-open, decimal, `_` allowed as a digit separator) into a RowRange;
// InvalidArgument naming the text when it is malformed or empty.
absl::StatusOr<RowRange> ParseRowRange(const std::string& text);

// One open file backing a table. The fd is O_RDONLY | O_CLOEXEC, owned by the Table, and has had
// posix_fadvise(POSIX_FADV_RANDOM) applied.
struct TableFile {
  std::string path;
  int fd = -1;
  uint64_t size = 0;
};

// Where one part of every row lives. Row r's part occupies bytes
// [FileOffset(r), FileOffset(r) + bytes) of files()[file] and lands at dest_offset in the
// 264-byte row. Packed tables have one part; checkpoint tables have two (values, then scales).
// Parts are back to back (rows_per_page 0), or `rows_per_page` to a page of `page_bytes` with
// the rest of each page padding (a paged packed file: no row straddles a page). Either way
// offsets grow with the row.
struct RowPart {
  uint32_t file = 0;           // index into Table::files()
  uint32_t dest_offset = 0;    // where the bytes go inside the 264-byte row
  uint32_t bytes = 0;          // 264 (packed) or 256 / 8 (checkpoint)
  uint64_t base = 0;           // file offset of row `base_row`
  uint64_t base_row = 0;       // row whose part starts at `base` (0, or the first row of a
                               // compacted per-rank copy)
  uint32_t rows_per_page = 0;  // 0: back to back; else rows in each page of page_bytes
  uint32_t page_bytes = 0;
  uint64_t FileOffset(uint64_t row) const {
    const uint64_t slot = row - base_row;
    if (rows_per_page == 0) return base + slot * uint64_t{bytes};
    return base + slot / rows_per_page * uint64_t{page_bytes} +
           slot % rows_per_page * uint64_t{bytes};
  }
  // Bytes from the start of row `first`'s part to the end of row `first + count - 1`'s.
  uint64_t SpanBytes(uint64_t first, uint64_t count) const {
    return FileOffset(first + count - 1) + bytes - FileOffset(first);
  }
  // The most SpanBytes() can be for `count` rows, wherever they start.
  uint64_t MaxSpanBytes(uint64_t count) const {
    if (rows_per_page == 0) return count * uint64_t{bytes};
    return (count / rows_per_page + 1) * uint64_t{page_bytes} + bytes;
  }
  bool paged() const { return rows_per_page != 0; }
};

// How a table may be opened.
struct OpenOptions {
  // Restrict a table to a declared row range (a per-rank copy that was written sparse at the
  // original offsets of a checkpoint). Rows outside are refused. For packed files the range in
  // the header is used, and this, when set, must lie inside it.
  std::optional<RowRange> rows;
  // Check with SEEK_DATA/SEEK_HOLE that no covered row lies in a hole of a sparse file. A copy
  // that claims rows it does not hold is refused at open instead of serving zeros.
  bool check_holes = true;
  // Only open these layers (empty: every Engram layer found).
  std::vector<uint32_t> layers;
};

// An open, validated Engram table. Immutable after open; safe to use from any thread.
class Table {
 public:
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  ~Table();

  uint32_t layer_id() const { return layer_id_; }
  // Rows of the whole logical table (engram_num_embeddings for this layer).
  uint64_t num_rows() const { return num_rows_; }
  // The rows this copy really holds; equals [0, num_rows) for a full table.
  RowRange covered() const { return covered_; }
  uint32_t row_bytes() const { return kRowBytes; }
  TableLayout layout() const { return layout_; }
  // What the table was opened from: the model directory or the packed file.
  const std::string& source() const { return source_; }
  std::span<const TableFile> files() const { return files_; }
  std::span<const RowPart> parts() const { return parts_; }
  // Bytes of row data this table holds (covered rows × 264).
  uint64_t data_bytes() const { return covered_.size() * uint64_t{kRowBytes}; }
  // Device page reads (4 KiB O_DIRECT blocks, whatever the kernel's page size) an O_DIRECT read
  // of one row takes: 1 for a paged packed file (no row
  // straddles a page), up to 2 for an unpaged packed file (14 of 15 rows sit in one page), 2 for
  // a checkpoint (values and scales in distant regions; more when a part straddles a page).
  uint32_t max_pages_per_row() const;

  // OK if `row` can be served; OutOfRange naming the table, the row and the covered range if not.
  absl::Status CheckRow(uint64_t row) const;
  // "layer 14 (/models/x/model-00163-of-00163.safetensors)": for error messages.
  std::string Describe() const;

 private:
  friend class TableBuilder;
  Table() = default;

  uint32_t layer_id_ = 0;
  uint64_t num_rows_ = 0;
  RowRange covered_;
  TableLayout layout_ = TableLayout::kPacked;
  std::string source_;
  std::vector<TableFile> files_;
  std::vector<RowPart> parts_;
};

// Opens every Engram table of a Hugging Face checkpoint directory (config.json,
// model.safetensors.index.json or a single model.safetensors, shards). Validates the headers,
// dtypes, shapes against config.json, offsets and file sizes; other tensors are ignored.
absl::StatusOr<std::vector<std::unique_ptr<Table>>> OpenCheckpoint(const std::string& dir,
                                                                   const OpenOptions& options);

// Opens one packed table file (docs/table_format.md), validating its header and size.
absl::StatusOr<std::unique_ptr<Table>> OpenPacked(const std::string& path,
                                                  const OpenOptions& options);

// Opens `path` as a checkpoint directory or a packed file, whichever it is.
absl::StatusOr<std::vector<std::unique_ptr<Table>>> OpenTables(const std::string& path,
                                                               const OpenOptions& options);

// For a table whose O_DIRECT misses take more than one page read a row (a checkpoint, or a
// packed file of version 1): what a miss costs and the engram-pack command that writes a paged
// copy (one page read a row). Empty for a paged packed file. engramd logs it at start for
// cache-tier tables.
std::string PagedLayoutAdvice(const Table& table);

// Reads row `row` of `table` with plain blocking preads into `ret_row` (264 bytes). For tools
// and tests; the daemon uses the gather engine.
absl::Status ReadRowBlocking(const Table& table, uint64_t row, uint8_t* ret_row);

}  // namespace engram
