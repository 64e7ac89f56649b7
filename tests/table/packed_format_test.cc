// Tests of the packed header: layout, checksum and every refusal of ValidatePackedHeader.
#include "tables/packed_format.h"

#include <catch2/catch.hpp>
#include <cstring>

namespace engram {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("a sealed header validates and addresses rows", "[packed_format]") {
  PackedHeader full = MakePackedHeader(14, 1000, {0, 1000}, false);
  SealPackedHeader(&full);
  CHECK(ValidatePackedHeader(full, "f").ok());
  CHECK(full.data_offset == 4096);
  CHECK(full.data_end == 4096 + 1000 * 264);
  CHECK(PackedRowOffset(full, 0) == 4096);
  CHECK(PackedRowOffset(full, 999) == 4096 + 999 * 264);

  PackedHeader compact = MakePackedHeader(1, 1000, {250, 500}, false);
  SealPackedHeader(&compact);
  CHECK(ValidatePackedHeader(compact, "f").ok());
  CHECK(PackedRowOffset(compact, 250) == 4096);
  CHECK(compact.data_end == 4096 + 250 * 264);

  PackedHeader sparse = MakePackedHeader(1, 1000, {250, 500}, true);
  SealPackedHeader(&sparse);
  CHECK(ValidatePackedHeader(sparse, "f").ok());
  CHECK(PackedRowOffset(sparse, 250) == 4096 + 250 * 264);
  CHECK(sparse.data_end == 4096 + 500 * 264);
}

TEST_CASE("the header bytes are little-endian at fixed offsets", "[packed_format]") {
  PackedHeader h = MakePackedHeader(14, 0x0102030405, {0, 0x0102030405}, false);
  SealPackedHeader(&h);
  uint8_t bytes[sizeof(PackedHeader)];
  std::memcpy(bytes, &h, sizeof(h));
  CHECK(std::memcmp(bytes, "ENGRAMTB", 8) == 0);
  CHECK(bytes[8] == 1);      // version_major
  CHECK(bytes[12] == 128);   // header_bytes
  CHECK(bytes[16] == 14);    // layer_id
  CHECK(bytes[20] == 0x08);  // row_bytes = 264 = 0x108
  CHECK(bytes[21] == 0x01);
  CHECK(bytes[24] == 0x05);  // num_rows, least significant byte first
  CHECK(bytes[28] == 0x01);
  CHECK(bytes[49] == 0x10);  // data_offset = 4096 = 0x1000
}

TEST_CASE("damaged or foreign headers are refused", "[packed_format]") {
  PackedHeader h = MakePackedHeader(14, 1000, {100, 900}, false);
  SealPackedHeader(&h);
  auto expect = [](PackedHeader bad, absl::StatusCode code, const char* text, bool reseal) {
    if (reseal) SealPackedHeader(&bad);
    absl::Status s = ValidatePackedHeader(bad, "/t/x.etbl");
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == code);
    CHECK_THAT(std::string(s.message()), Contains("/t/x.etbl"));
    CHECK_THAT(std::string(s.message()), Contains(text));
  };
  SECTION("bad magic") {
    PackedHeader b = h;
    b.magic[0] = 'X';
    expect(b, absl::StatusCode::kInvalidArgument, "bad magic", true);
  }
  SECTION("unknown major version") {
    PackedHeader b = h;
    b.version_major = 3;
    expect(b, absl::StatusCode::kFailedPrecondition, "version 3.0", true);
  }
  SECTION("a newer minor version is accepted") {
    PackedHeader b = h;
    b.version_minor = 7;
    SealPackedHeader(&b);
    CHECK(ValidatePackedHeader(b, "f").ok());
  }
  SECTION("checksum mismatch") {
    PackedHeader b = h;
    b.num_rows = 1001;  // not resealed
    expect(b, absl::StatusCode::kDataLoss, "checksum mismatch", false);
  }
  SECTION("wrong header size") {
    PackedHeader b = h;
    b.header_bytes = 256;
    expect(b, absl::StatusCode::kDataLoss, "header says it is 256 bytes", true);
  }
  SECTION("wrong row bytes") {
    PackedHeader b = h;
    b.row_bytes = 256;
    expect(b, absl::StatusCode::kDataLoss, "row of 256 bytes", true);
  }
  SECTION("wrong element layout") {
    PackedHeader b = h;
    b.scale_block = 128;
    expect(b, absl::StatusCode::kDataLoss, "scale_block=128", true);
  }
  SECTION("unknown flags") {
    PackedHeader b = h;
    b.flags |= 0x80;
    expect(b, absl::StatusCode::kDataLoss, "unknown flags", true);
  }
  SECTION("covered range outside the table") {
    PackedHeader b = h;
    b.covered_end = 1001;
    expect(b, absl::StatusCode::kDataLoss, "outside the table", true);
  }
  SECTION("empty covered range") {
    PackedHeader b = h;
    b.covered_begin = b.covered_end = 500;
    expect(b, absl::StatusCode::kDataLoss, "empty", true);
  }
  SECTION("unaligned data offset") {
    PackedHeader b = h;
    b.data_offset = 1000;
    b.data_end = 1000 + 800 * 264;
    expect(b, absl::StatusCode::kDataLoss, "not a multiple of 4096", true);
  }
  SECTION("data end disagreeing with the rows") {
    PackedHeader b = h;
    b.data_end -= 264;
    expect(b, absl::StatusCode::kDataLoss, "data end", true);
  }
  SECTION("sparse flag flipped without moving the data end") {
    PackedHeader b = h;
    b.flags = kPackedFlagSparse;
    expect(b, absl::StatusCode::kDataLoss, "sparse rows [100, 900)", true);
  }
  SECTION("reserved bytes set") {
    PackedHeader b = h;
    b.reserved[3] = 1;
    expect(b, absl::StatusCode::kDataLoss, "reserved byte 91", true);
  }
  SECTION("page fields in a version 1 header") {
    PackedHeader b = h;
    b.rows_per_page = 15;
    expect(b, absl::StatusCode::kDataLoss, "rows_per_page 15 in a version 1 file", true);
  }
}

TEST_CASE("a paged header puts 15 rows in each 4 KiB page", "[packed_format]") {
  PackedHeader full = MakePackedHeader(14, 1000, {0, 1000}, false, /*paged=*/true);
  SealPackedHeader(&full);
  REQUIRE(ValidatePackedHeader(full, "f").ok());
  CHECK(PackedPaged(full));
  CHECK(full.version_major == 2);
  CHECK(full.page_bytes == 4096);
  CHECK(full.rows_per_page == 15);
  // 1000 rows: 66 full pages and one holding 10 rows.
  CHECK(full.data_end == 4096 + 67 * 4096);
  CHECK(PackedRowOffset(full, 0) == 4096);
  CHECK(PackedRowOffset(full, 14) == 4096 + 14 * 264);
  CHECK(PackedRowOffset(full, 15) == 2 * 4096);
  CHECK(PackedRowOffset(full, 999) == 4096 + 66 * 4096 + 9 * 264);
  // No row straddles a page.
  for (uint64_t r = 0; r < 1000; ++r) {
    const uint64_t off = PackedRowOffset(full, r);
    CHECK(off / 4096 == (off + 263) / 4096);
  }
  uint8_t bytes[sizeof(PackedHeader)];
  std::memcpy(bytes, &full, sizeof(full));
  CHECK(bytes[8] == 2);      // version_major
  CHECK(bytes[81] == 0x10);  // page_bytes = 4096
  CHECK(bytes[84] == 15);    // rows_per_page

  PackedHeader compact = MakePackedHeader(1, 1000, {250, 500}, false, true);
  SealPackedHeader(&compact);
  CHECK(ValidatePackedHeader(compact, "f").ok());
  CHECK(PackedRowOffset(compact, 250) == 4096);
  CHECK(PackedRowOffset(compact, 265) == 2 * 4096);
  CHECK(compact.data_end == 4096 + 17 * 4096);  // 250 rows: 16 full pages and one of 10

  PackedHeader sparse = MakePackedHeader(1, 1000, {250, 500}, true, true);
  SealPackedHeader(&sparse);
  CHECK(ValidatePackedHeader(sparse, "f").ok());
  CHECK(PackedRowOffset(sparse, 250) == 4096 + 16 * 4096 + 10 * 264);
  CHECK(sparse.data_end == 4096 + 34 * 4096);  // slots [0, 500): 33 full pages and one of 5
}

TEST_CASE("damaged paged headers are refused naming the field", "[packed_format]") {
  PackedHeader h = MakePackedHeader(14, 1000, {100, 900}, false, true);
  SealPackedHeader(&h);
  auto refused = [](PackedHeader bad, const char* text) {
    SealPackedHeader(&bad);
    absl::Status s = ValidatePackedHeader(bad, "/t/p.etbl");
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(s.message()), Contains("/t/p.etbl"));
    CHECK_THAT(std::string(s.message()), Contains(text));
  };
  SECTION("rows per page") {
    PackedHeader b = h;
    b.rows_per_page = 16;
    refused(b, "rows_per_page 16 of a version 2 (paged) file");
  }
  SECTION("page size") {
    PackedHeader b = h;
    b.page_bytes = 8192;
    refused(b, "page_bytes 8192");
  }
  SECTION("data end of the unpaged layout") {
    PackedHeader b = h;
    b.data_end = 4096 + 800 * 264;
    refused(b, "compacted paged rows [100, 900)");
  }
  SECTION("a version 1 header read as paged") {
    PackedHeader b = h;
    b.version_major = 1;
    refused(b, "in a version 1 file");
  }
}

}  // namespace
}  // namespace engram
