// Tests of packed tables: checkpoint -> packed round trips (whole, compacted and sparse
// per-rank copies), OpenPacked() addressing, and refusals of damaged packed files.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <vector>

#include "tables/packed_format.h"
#include "tables/table.h"
#include "tests/common/skip.h"
#include "testkit/table_test_util.h"
#include "tables/pack.h"
#include "testkit/synthetic.h"

namespace engram {
namespace {

using Catch::Matchers::Contains;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

constexpr uint64_t kRows = 5003;
constexpr uint64_t kSeed = 99;

void WriteSynth(const std::string& dir) {
  SynthOptions options;
  options.out_dir = dir;
  options.rows = kRows;
  options.seed = kSeed;
  REQUIRE(WriteSyntheticCheckpoint(options).ok());
}

absl::Status Pack(const std::string& in, uint32_t layer, const std::string& out,
                  std::optional<RowRange> rows = std::nullopt, bool sparse = false,
                  uint64_t buffer_bytes = 64 << 10, bool paged = false) {
  PackOptions o;
  o.paged = paged;
  o.input = in;
  o.layer = layer;
  o.out = out;
  o.rows = rows;
  o.sparse = sparse;
  o.buffer_bytes = buffer_bytes;  // small, so packing takes many steps
  return PackTable(o);
}

void CheckRowsMatch(const Table& t, uint64_t begin, uint64_t end) {
  uint8_t got[kRowBytes], want[kRowBytes];
  for (uint64_t r = begin; r < end; ++r) {
    REQUIRE(ReadRowBlocking(t, r, got).ok());
    SyntheticRow(kSeed, t.layer_id(), r, want);
    INFO("layer " << t.layer_id() << " row " << r);
    REQUIRE(std::memcmp(got, want, kRowBytes) == 0);
  }
}

TEST_CASE("checkpoint -> packed round trip keeps every byte", "[packed]") {
  TempDir dir;
  WriteSynth(dir / "model");
  for (uint32_t layer : {1u, 14u}) {
    const std::string out = dir / ("layer" + std::to_string(layer) + ".etbl");
    REQUIRE(Pack(dir / "model", layer, out).ok());
    auto t = OpenPacked(out, {});
    REQUIRE(t.ok());
    CHECK((*t)->layer_id() == layer);
    CHECK((*t)->layout() == TableLayout::kPacked);
    CHECK((*t)->num_rows() == kRows);
    CHECK((*t)->covered() == RowRange{0, kRows});
    CHECK((*t)->source() == out);
    REQUIRE((*t)->parts().size() == 1);
    CHECK((*t)->parts()[0].bytes == kRowBytes);
    CHECK((*t)->parts()[0].base == 4096);
    CHECK(std::filesystem::file_size(out) == 4096 + kRows * kRowBytes);
    CheckRowsMatch(**t, 0, kRows);
    // The packed bytes are exactly the checkpoint's rows, in order.
    const std::string bytes = ReadFile(out);
    uint8_t want[kRowBytes];
    SyntheticRow(kSeed, layer, kRows - 1, want);
    CHECK(std::memcmp(bytes.data() + 4096 + (kRows - 1) * kRowBytes, want, kRowBytes) == 0);
  }
  // Nothing temporary is left behind.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    files += e.is_regular_file();
  }
  CHECK(files == 2);
}

TEST_CASE("OpenTables opens a packed file and filters its layer", "[packed]") {
  TempDir dir;
  WriteSynth(dir / "model");
  REQUIRE(Pack(dir / "model", 14, dir / "t.etbl").ok());
  auto tables = OpenTables(dir / "t.etbl", {});
  REQUIRE(tables.ok());
  REQUIRE(tables->size() == 1);
  CHECK((*tables)[0]->layer_id() == 14);
  auto other = OpenTables(dir / "t.etbl", {.layers = {1}});
  CHECK(other.status().code() == absl::StatusCode::kNotFound);
  CHECK(OpenTables(dir / "missing.etbl", {}).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("per-rank compacted copies hold only their rows", "[packed]") {
  TempDir dir;
  WriteSynth(dir / "model");
  const RowRange rank{1250, 2501};
  REQUIRE(Pack(dir / "model", 1, dir / "r1.etbl", rank).ok());
  CHECK(std::filesystem::file_size(dir / "r1.etbl") == 4096 + rank.size() * kRowBytes);
  auto t = OpenPacked(dir / "r1.etbl", {});
  REQUIRE(t.ok());
  CHECK((*t)->covered() == rank);
  CHECK((*t)->num_rows() == kRows);
  CHECK((*t)->parts()[0].base_row == rank.begin);
  CHECK((*t)->parts()[0].FileOffset(rank.begin) == 4096);
  CheckRowsMatch(**t, rank.begin, rank.end);
  absl::Status s = (*t)->CheckRow(rank.end);
  CHECK(s.code() == absl::StatusCode::kOutOfRange);
  CHECK_THAT(std::string(s.message()), Contains("row 2501"));
  CHECK_THAT(std::string(s.message()), Contains("[1250, 2501)"));
  CHECK_THAT(std::string(s.message()), Contains("r1.etbl"));
  uint8_t row[kRowBytes];
  CHECK(ReadRowBlocking(**t, 0, row).code() == absl::StatusCode::kOutOfRange);

  // A narrower declared range is honoured; a wider one is refused.
  auto narrow = OpenPacked(dir / "r1.etbl", {.rows = RowRange{1300, 1400}});
  REQUIRE(narrow.ok());
  CHECK((*narrow)->covered() == RowRange{1300, 1400});
  CheckRowsMatch(**narrow, 1300, 1400);
  CHECK((*narrow)->CheckRow(1299).code() == absl::StatusCode::kOutOfRange);
  auto wide = OpenPacked(dir / "r1.etbl", {.rows = RowRange{1000, 1400}});
  CHECK(wide.status().code() == absl::StatusCode::kOutOfRange);

  // Repacking a per-rank copy from a packed input works too.
  REQUIRE(Pack(dir / "r1.etbl", 1, dir / "r1b.etbl", RowRange{1300, 1400}).ok());
  auto again = OpenPacked(dir / "r1b.etbl", {});
  REQUIRE(again.ok());
  CheckRowsMatch(**again, 1300, 1400);
}

TEST_CASE("per-rank sparse copies keep original offsets and refuse holes", "[packed]") {
  TempDir dir;
  WriteSynth(dir / "model");
  const RowRange rank{2000, 4000};
  REQUIRE(Pack(dir / "model", 14, dir / "s.etbl", rank, /*sparse=*/true).ok());
  CHECK(std::filesystem::file_size(dir / "s.etbl") == 4096 + rank.end * kRowBytes);
  auto t = OpenPacked(dir / "s.etbl", {});
  REQUIRE(t.ok());
  CHECK((*t)->covered() == rank);
  CHECK((*t)->parts()[0].FileOffset(2000) == 4096 + 2000 * kRowBytes);
  CheckRowsMatch(**t, rank.begin, rank.end);
  CHECK((*t)->CheckRow(1999).code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("sparse copies hold holes, and a header claiming a hole is refused", "[packed][holes]") {
  TempDir dir;
  if (!testing::SupportsHoles(dir.path())) {
    ENGRAM_SKIP("the filesystem under " + dir.path() + " reports no holes");
  }
  WriteSynth(dir / "model");
  const RowRange rank{2000, 4000};
  REQUIRE(Pack(dir / "model", 14, dir / "s.etbl", rank, /*sparse=*/true).ok());
  struct stat st;
  REQUIRE(::stat((dir / "s.etbl").c_str(), &st) == 0);
  CHECK(static_cast<uint64_t>(st.st_blocks) * 512 < 4096 + 2100 * kRowBytes);  // really sparse

  // A header that claims rows the file does not hold (they are a hole) is refused at open.
  PackedHeader h;
  {
    const std::string bytes = ReadFile(dir / "s.etbl");
    std::memcpy(&h, bytes.data(), sizeof(h));
  }
  h.covered_begin = 0;
  SealPackedHeader(&h);
  int fd = ::open((dir / "s.etbl").c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::pwrite(fd, &h, sizeof(h), 0) == sizeof(h));
  ::close(fd);
  auto lying = OpenPacked(dir / "s.etbl", {});
  REQUIRE_FALSE(lying.ok());
  CHECK(lying.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(lying.status().message()), Contains("s.etbl"));
  CHECK_THAT(std::string(lying.status().message()), Contains("hole at offset 4096"));
  // The rows it does hold are still servable when declared.
  auto declared = OpenPacked(dir / "s.etbl", {.rows = rank});
  REQUIRE(declared.ok());
  CheckRowsMatch(**declared, rank.begin, rank.begin + 10);
}

TEST_CASE("paged copies put 15 rows in each page and keep every byte", "[packed]") {
  TempDir dir;
  WriteSynth(dir / "model");
  // Whole, compacted and sparse per-rank copies whose ranges start and end mid-page, packed in
  // steps of 20 rows (not a page's 15), from the checkpoint and again from a paged copy.
  struct Case {
    std::optional<RowRange> rows;
    bool sparse;
  };
  for (const Case& c : {Case{std::nullopt, false}, Case{RowRange{1007, 3998}, false},
                        Case{RowRange{1007, 3998}, true}}) {
    for (const std::string& input : std::vector<std::string>{"model", "full.etbl"}) {
      if (input == "full.etbl") {
        REQUIRE(
            Pack(dir / "model", 1, dir / "full.etbl", std::nullopt, false, 64 << 10, true).ok());
      }
      const std::string out = dir / "p.etbl";
      INFO("from " << input << (c.sparse ? " sparse" : "") << (c.rows ? " per rank" : ""));
      REQUIRE(Pack(dir / input, 1, out, c.rows, c.sparse, 20 * kRowBytes, true).ok());
      auto t = OpenPacked(out, {});
      REQUIRE(t.ok());
      const RowRange covered = c.rows.value_or(RowRange{0, kRows});
      CHECK((*t)->covered() == covered);
      REQUIRE((*t)->parts().size() == 1);
      const RowPart& p = (*t)->parts()[0];
      CHECK(p.paged());
      CHECK(p.rows_per_page == 15);
      CHECK((*t)->max_pages_per_row() == 1);
      const uint64_t first_slot = c.sparse ? 0 : covered.begin;
      const uint64_t pages = (covered.end - first_slot + 14) / 15;
      CHECK(std::filesystem::file_size(out) == 4096 + pages * 4096);
      for (uint64_t r = covered.begin; r < covered.end; ++r) {
        const uint64_t off = p.FileOffset(r);
        REQUIRE(off / 4096 == (off + kRowBytes - 1) / 4096);
      }
      CheckRowsMatch(**t, covered.begin, covered.end);
      // The padding after each page's 15 rows is zero.
      const std::string bytes = ReadFile(out);
      for (uint64_t page = 1 + first_slot / 15 + 1; page < 1 + pages; page += 37) {
        for (uint64_t b = page * 4096 + 15 * kRowBytes; b < (page + 1) * 4096; ++b) {
          REQUIRE(bytes[b] == 0);
        }
      }
    }
  }
}

TEST_CASE("tables that are not paged say what a miss costs and how to pack them", "[packed]") {
  TempDir dir;
  WriteSynth(dir / "model");
  OpenOptions one;
  one.layers = {1};
  auto ckpt = OpenCheckpoint(dir / "model", one);
  REQUIRE(ckpt.ok());
  CHECK((*ckpt)[0]->max_pages_per_row() >= 2);
  const std::string a = PagedLayoutAdvice(*(*ckpt)[0]);
  CHECK_THAT(a, Contains("checkpoint layout: each missed row is two device reads"));
  CHECK_THAT(a, Contains("`engram-pack " + (dir / "model") + " --layer 1 --paged --out FILE`"));

  REQUIRE(Pack(dir / "model", 1, dir / "v1.etbl", RowRange{10, 4000}).ok());
  auto v1 = OpenPacked(dir / "v1.etbl", {});
  REQUIRE(v1.ok());
  CHECK((*v1)->max_pages_per_row() == 2);
  const std::string b = PagedLayoutAdvice(**v1);
  CHECK_THAT(b, Contains("format version 1"));
  CHECK_THAT(b, Contains("--layer 1 --rows 10:4000 --paged --out FILE"));

  REQUIRE(Pack(dir / "v1.etbl", 1, dir / "v2.etbl", std::nullopt, false, 64 << 10, true).ok());
  auto v2 = OpenPacked(dir / "v2.etbl", {});
  REQUIRE(v2.ok());
  CHECK((*v2)->max_pages_per_row() == 1);
  CHECK(PagedLayoutAdvice(**v2).empty());
}

TEST_CASE("damaged paged files are refused at open naming the field", "[packed]") {
  TempDir dir;
  WriteSynth(dir / "model");
  const std::string path = dir / "p.etbl";
  REQUIRE(Pack(dir / "model", 14, path, std::nullopt, false, 64 << 10, true).ok());
  std::string bytes = ReadFile(path);
  PackedHeader h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  auto refused = [&](const std::string& text) {
    auto t = OpenPacked(path, {});
    REQUIRE_FALSE(t.ok());
    INFO(t.status().ToString());
    CHECK(t.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(t.status().message()), Contains(path));
    CHECK_THAT(std::string(t.status().message()), Contains(text));
  };
  SECTION("rows per page") {
    h.rows_per_page = 14;
    SealPackedHeader(&h);
    std::memcpy(bytes.data(), &h, sizeof(h));
    WriteFile(path, bytes);
    refused("rows_per_page 14");
  }
  SECTION("checksum") {
    bytes[84] = 16;  // rows_per_page, not resealed
    WriteFile(path, bytes);
    refused("checksum mismatch");
  }
  SECTION("last page cut short") {
    std::filesystem::resize_file(path, bytes.size() - 100);
    refused("truncated");
  }
}

TEST_CASE("damaged packed files are refused at open", "[packed]") {
  TempDir dir;
  WriteSynth(dir / "model");
  const std::string path = dir / "t.etbl";
  REQUIRE(Pack(dir / "model", 14, path).ok());
  std::string bytes = ReadFile(path);
  auto refused = [&](absl::StatusCode code, const std::string& text) {
    auto t = OpenPacked(path, {});
    REQUIRE_FALSE(t.ok());
    INFO(t.status().ToString());
    CHECK(t.status().code() == code);
    CHECK_THAT(std::string(t.status().message()), Contains(path));
    CHECK_THAT(std::string(t.status().message()), Contains(text));
  };
  SECTION("bad magic") {
    bytes[0] = 'X';
    WriteFile(path, bytes);
    refused(absl::StatusCode::kInvalidArgument, "bad magic");
  }
  SECTION("checksum mismatch") {
    bytes[24] ^= 1;  // num_rows
    WriteFile(path, bytes);
    refused(absl::StatusCode::kDataLoss, "checksum mismatch");
  }
  SECTION("unknown major version") {
    PackedHeader h;
    std::memcpy(&h, bytes.data(), sizeof(h));
    h.version_major = 9;
    SealPackedHeader(&h);
    std::memcpy(bytes.data(), &h, sizeof(h));
    WriteFile(path, bytes);
    refused(absl::StatusCode::kFailedPrecondition, "version 9");
  }
  SECTION("inconsistent geometry") {
    PackedHeader h;
    std::memcpy(&h, bytes.data(), sizeof(h));
    h.covered_end = kRows + 1;
    SealPackedHeader(&h);
    std::memcpy(bytes.data(), &h, sizeof(h));
    WriteFile(path, bytes);
    refused(absl::StatusCode::kDataLoss, "inconsistent packed header");
  }
  SECTION("file shorter than the header says") {
    std::filesystem::resize_file(path, bytes.size() - 1);
    refused(absl::StatusCode::kDataLoss, "truncated");
  }
  SECTION("file shorter than a header") {
    std::filesystem::resize_file(path, 100);
    refused(absl::StatusCode::kDataLoss, "too short");
  }
}

TEST_CASE("engram-pack refuses bad input and leaves no output", "[packed]") {
  TempDir dir;
  WriteSynth(dir / "model");
  std::filesystem::resize_file(dir / "model/model-00003-of-00003.safetensors", 4000);
  absl::Status s = Pack(dir / "model", 14, dir / "t.etbl");
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK_FALSE(std::filesystem::exists(dir / "t.etbl"));
  CHECK(Pack(dir / "model", 2, dir / "t.etbl").code() == absl::StatusCode::kNotFound);
  CHECK(Pack(dir / "model", 1, dir / "t.etbl", RowRange{10, kRows + 1}).code() ==
        absl::StatusCode::kOutOfRange);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    files += e.is_regular_file();
  }
  CHECK(files == 0);
}

TEST_CASE("row ranges parse as BEGIN:END", "[packed]") {
  auto r = ParseRowRange("96_000_564:192001740");
  REQUIRE(r.ok());
  CHECK(*r == RowRange{96000564, 192001740});
  CHECK(ParseRowRange("5:5").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseRowRange("7:3").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseRowRange("12").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseRowRange("a:b").status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace engram
