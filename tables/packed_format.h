// The packed table layout: one file per Engram table, a 128-byte versioned header, then
// 264-byte rows (256 FP8 E4M3 values, 8 E8M0 scales) starting at a 4 KiB-aligned offset:
// back to back (version 1), or 15 to a 4 KiB page with the rest of the page padding, so that no
// row straddles a page and an O_DIRECT miss is one page read (version 2, "paged").
// docs/table_format.md describes it in prose; this header is the authority for the bytes.
//
//   PackedHeader h = MakePackedHeader(/*layer_id=*/14, num_rows, {0, num_rows}, false);
//   SealPackedHeader(&h);                            // fills the checksum
//   absl::Status s = ValidatePackedHeader(h, path);  // what a reader does
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "base/page_size.h"
#include "tables/table.h"

namespace engram {

static_assert(std::endian::native == std::endian::little,
              "the packed header is little-endian and read by copying it into the struct");

inline constexpr char kPackedMagic[8] = {'E', 'N', 'G', 'R', 'A', 'M', 'T', 'B'};
// Version 1: rows back to back. Version 2: rows in pages (page_bytes, rows_per_page). A reader
// refuses any other major version and accepts any minor version.
inline constexpr uint16_t kPackedVersionMajor = 1;
inline constexpr uint16_t kPackedVersionPaged = 2;
inline constexpr uint16_t kPackedVersionMinor = 0;
// The paged layout's page: the O_DIRECT read unit (a device block, kDirectIoAlignBytes), and how
// many whole rows fit in it. A format constant, not the kernel's page size: a file is the same
// bytes on 4, 16 and 64 KiB-page kernels, and a missed row is still one 4 KiB block read there
// (never a whole kernel page, docs/table_format.md).
inline constexpr uint32_t kPackedPageBytes = 4096;
inline constexpr uint32_t kPackedRowsPerPage = kPackedPageBytes / kRowBytes;  // 15
// Rows start here so that O_DIRECT block runs of the data are block-aligned (a format constant).
inline constexpr uint64_t kPackedDataOffset = 4096;
static_assert(kPackedPageBytes == kDirectIoAlignBytes && kPackedDataOffset % kPackedPageBytes == 0);

inline constexpr uint8_t kDtypeF8E4M3 = 1;  // element_layout.value_dtype
inline constexpr uint8_t kDtypeF8E8M0 = 2;  // element_layout.scale_dtype

// flags
inline constexpr uint32_t kPackedFlagSparse = 1u << 0;  // rows at their original offsets
inline constexpr uint32_t kPackedKnownFlags = kPackedFlagSparse;

// On-disk header, little-endian, at file offset 0. Every field is naturally aligned; reserved
// bytes are written as zero and covered by the checksum.
struct PackedHeader {
  char magic[8];           // "ENGRAMTB"
  uint16_t version_major;  // kPackedVersionMajor
  uint16_t version_minor;  // kPackedVersionMinor
  uint32_t header_bytes;   // sizeof(PackedHeader) for this version
  uint32_t layer_id;       // Engram layer (1 or 14 in DeepSeek-V4.1)
  uint32_t row_bytes;      // 264
  uint64_t num_rows;       // rows of the whole logical table (engram_num_embeddings)
  uint64_t covered_begin;  // rows this file holds: [covered_begin, covered_end)
  uint64_t covered_end;
  uint64_t data_offset;      // file offset of the first stored row (4096)
  uint32_t flags;            // kPackedFlag*
  uint32_t value_bytes;      // 256: values come first in a row
  uint32_t scale_bytes;      // 8: scales follow the values
  uint8_t value_dtype;       // kDtypeF8E4M3
  uint8_t scale_dtype;       // kDtypeF8E8M0
  uint16_t scale_block;      // 32 values per scale
  uint64_t data_end;         // version 1: just past the last covered row; version 2: just past
                             // the page holding it
  uint32_t page_bytes;       // version 2: 4096; version 1: 0
  uint32_t rows_per_page;    // version 2: 15; version 1: 0
  uint8_t reserved[32];      // zero
  uint64_t header_checksum;  // XXH64 (seed 0) of the 120 bytes before this field
};
static_assert(sizeof(PackedHeader) == 128);
static_assert(offsetof(PackedHeader, version_major) == 8);
static_assert(offsetof(PackedHeader, header_bytes) == 12);
static_assert(offsetof(PackedHeader, layer_id) == 16);
static_assert(offsetof(PackedHeader, row_bytes) == 20);
static_assert(offsetof(PackedHeader, num_rows) == 24);
static_assert(offsetof(PackedHeader, covered_begin) == 32);
static_assert(offsetof(PackedHeader, covered_end) == 40);
static_assert(offsetof(PackedHeader, data_offset) == 48);
static_assert(offsetof(PackedHeader, flags) == 56);
static_assert(offsetof(PackedHeader, value_bytes) == 60);
static_assert(offsetof(PackedHeader, scale_bytes) == 64);
static_assert(offsetof(PackedHeader, value_dtype) == 68);
static_assert(offsetof(PackedHeader, scale_dtype) == 69);
static_assert(offsetof(PackedHeader, scale_block) == 70);
static_assert(offsetof(PackedHeader, data_end) == 72);
static_assert(offsetof(PackedHeader, page_bytes) == 80);
static_assert(offsetof(PackedHeader, rows_per_page) == 84);
static_assert(offsetof(PackedHeader, reserved) == 88);
static_assert(offsetof(PackedHeader, header_checksum) == 120);

// A header for `covered` rows of a `num_rows`-row table of `layer_id`, compacted (row `begin`
// in slot 0) or sparse (row r in slot r); slot s is at data_offset + s * 264 (version 1) or, with
// `paged`, at data_offset + (s / 15) * 4096 + (s % 15) * 264 (version 2). The checksum is not
// yet set.
PackedHeader MakePackedHeader(uint32_t layer_id, uint64_t num_rows, RowRange covered, bool sparse,
                              bool paged = false);

// True for a version 2 header: rows in pages, none straddling one.
inline bool PackedPaged(const PackedHeader& header) {
  return header.version_major == kPackedVersionPaged;
}

uint64_t PackedHeaderChecksum(const PackedHeader& header);
void SealPackedHeader(PackedHeader* header);

// File offset of row `row` (inside the covered range) in a file with this header.
uint64_t PackedRowOffset(const PackedHeader& header, uint64_t row);

// File offset just past the rows of slots [0, slots) (version 1), or past the page holding the
// last of them (version 2).
uint64_t PackedDataEnd(const PackedHeader& header, uint64_t slots);

// Validates a header read from `path`: magic (InvalidArgument: not a packed table), major
// version (FailedPrecondition), header size, checksum (DataLoss), then the geometry: row and
// element layout, page size and rows per page (version 2; zero in version 1), covered range
// inside the table, data offset and data end consistent with the rows (DataLoss). Every error
// names `path` and the field.
absl::Status ValidatePackedHeader(const PackedHeader& header, const std::string& path);

}  // namespace engram
