// The packed table header: construction, checksum and validation (see packed_format.h).
#include "tables/packed_format.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "xxhash.h"

namespace engram {

PackedHeader MakePackedHeader(uint32_t layer_id, uint64_t num_rows, RowRange covered, bool sparse,
                              bool paged) {
  PackedHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kPackedMagic, sizeof(h.magic));
  h.version_major = paged ? kPackedVersionPaged : kPackedVersionMajor;
  h.version_minor = kPackedVersionMinor;
  h.header_bytes = sizeof(PackedHeader);
  h.layer_id = layer_id;
  h.row_bytes = kRowBytes;
  h.num_rows = num_rows;
  h.covered_begin = covered.begin;
  h.covered_end = covered.end;
  h.data_offset = kPackedDataOffset;
  h.flags = sparse ? kPackedFlagSparse : 0;
  h.value_bytes = kValueBytes;
  h.scale_bytes = kScaleBytes;
  h.value_dtype = kDtypeF8E4M3;
  h.scale_dtype = kDtypeF8E8M0;
  h.scale_block = kScaleBlock;
  if (paged) {
    h.page_bytes = kPackedPageBytes;
    h.rows_per_page = kPackedRowsPerPage;
  }
  const uint64_t first_slot = sparse ? 0 : covered.begin;
  h.data_end = PackedDataEnd(h, covered.end - first_slot);
  return h;
}

uint64_t PackedDataEnd(const PackedHeader& header, uint64_t slots) {
  if (!PackedPaged(header)) return header.data_offset + slots * uint64_t{header.row_bytes};
  const uint64_t pages = (slots + header.rows_per_page - 1) / header.rows_per_page;
  return header.data_offset + pages * uint64_t{header.page_bytes};
}

uint64_t PackedHeaderChecksum(const PackedHeader& header) {
  return XXH64(&header, offsetof(PackedHeader, header_checksum), 0);
}

void SealPackedHeader(PackedHeader* header) {
  header->header_checksum = PackedHeaderChecksum(*header);
}

uint64_t PackedRowOffset(const PackedHeader& header, uint64_t row) {
  const uint64_t first_slot = (header.flags & kPackedFlagSparse) ? 0 : header.covered_begin;
  const uint64_t slot = row - first_slot;
  if (!PackedPaged(header)) return header.data_offset + slot * uint64_t{header.row_bytes};
  return header.data_offset + slot / header.rows_per_page * uint64_t{header.page_bytes} +
         slot % header.rows_per_page * uint64_t{header.row_bytes};
}

absl::Status ValidatePackedHeader(const PackedHeader& h, const std::string& path) {
  if (std::memcmp(h.magic, kPackedMagic, sizeof(h.magic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a packed Engram table (bad magic; expected \"ENGRAMTB\")"));
  }
  if (h.version_major != kPackedVersionMajor && h.version_major != kPackedVersionPaged) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": packed table format version ", h.version_major, ".", h.version_minor,
                     " is not supported (this build reads major versions ", kPackedVersionMajor,
                     " and ", kPackedVersionPaged, ")"));
  }
  if (h.header_bytes != sizeof(PackedHeader)) {
    return absl::DataLossError(absl::StrCat(path, ": packed header says it is ", h.header_bytes,
                                            " bytes; version ", h.version_major, " headers are ",
                                            sizeof(PackedHeader)));
  }
  const uint64_t checksum = PackedHeaderChecksum(h);
  if (checksum != h.header_checksum) {
    return absl::DataLossError(absl::StrCat(path, ": packed header checksum mismatch (stored 0x",
                                            absl::Hex(h.header_checksum), ", computed 0x",
                                            absl::Hex(checksum), ")"));
  }
  auto geometry = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": inconsistent packed header: ", what));
  };
  if (h.row_bytes != kRowBytes || h.value_bytes != kValueBytes || h.scale_bytes != kScaleBytes ||
      h.value_bytes + h.scale_bytes != h.row_bytes) {
    return geometry(absl::StrCat("row of ", h.row_bytes, " bytes (", h.value_bytes, " values + ",
                                 h.scale_bytes, " scales), expected ", kRowBytes, " (", kValueBytes,
                                 " + ", kScaleBytes, ")"));
  }
  if (h.value_dtype != kDtypeF8E4M3 || h.scale_dtype != kDtypeF8E8M0 ||
      h.scale_block != kScaleBlock) {
    return geometry(absl::StrCat(
        "element layout value_dtype=", int{h.value_dtype}, " scale_dtype=", int{h.scale_dtype},
        " scale_block=", h.scale_block, ", expected F8_E4M3 (1), F8_E8M0 (2), 32"));
  }
  if ((h.flags & ~kPackedKnownFlags) != 0) {
    return geometry(absl::StrCat("unknown flags 0x", absl::Hex(h.flags & ~kPackedKnownFlags)));
  }
  if (PackedPaged(h)) {
    if (h.page_bytes != kPackedPageBytes || h.rows_per_page != kPackedRowsPerPage) {
      return geometry(absl::StrCat("page_bytes ", h.page_bytes, " and rows_per_page ",
                                   h.rows_per_page, " of a version 2 (paged) file, expected ",
                                   kPackedPageBytes, " and ", kPackedRowsPerPage));
    }
  } else if (h.page_bytes != 0 || h.rows_per_page != 0) {
    return geometry(absl::StrCat("page_bytes ", h.page_bytes, " and rows_per_page ",
                                 h.rows_per_page, " in a version 1 file, where both are 0"));
  }
  if (h.num_rows == 0) return geometry("table of 0 rows");
  if (h.covered_begin >= h.covered_end || h.covered_end > h.num_rows) {
    return geometry(absl::StrCat("covered rows [", h.covered_begin, ", ", h.covered_end,
                                 ") are empty or outside the table's ", h.num_rows, " rows"));
  }
  if (h.data_offset < sizeof(PackedHeader) || h.data_offset % kPackedPageBytes != 0) {
    return geometry(
        absl::StrCat("data offset ", h.data_offset, " is not a multiple of 4096 past the header"));
  }
  for (size_t i = 0; i < sizeof(h.reserved); ++i) {
    if (h.reserved[i] != 0) {
      return geometry(
          absl::StrCat("reserved byte ", offsetof(PackedHeader, reserved) + i, " is not zero"));
    }
  }
  const uint64_t first_slot = (h.flags & kPackedFlagSparse) ? 0 : h.covered_begin;
  // num_rows * 264 < 2^64 for any table that fits on a disk; refuse headers that would overflow.
  if (h.covered_end > (UINT64_MAX - h.data_offset) / kRowBytes) {
    return geometry(absl::StrCat("covered end ", h.covered_end, " overflows a file offset"));
  }
  const uint64_t data_end = PackedDataEnd(h, h.covered_end - first_slot);
  if (h.data_end != data_end) {
    return geometry(absl::StrCat("data end ", h.data_end, " does not match ",
                                 (h.flags & kPackedFlagSparse) ? "sparse" : "compacted",
                                 PackedPaged(h) ? " paged" : "", " rows [", h.covered_begin, ", ",
                                 h.covered_end, ") at data offset ", h.data_offset, " (expected ",
                                 data_end, ")"));
  }
  return absl::OkStatus();
}

}  // namespace engram
