// Tests of OpenCheckpoint(): row addressing against the synthetic generator, per-rank sparse
// copies, fd hygiene, and every refusal with the broken files crafted here.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "tables/table.h"
#include "tests/common/skip.h"
#include "testkit/table_test_util.h"
#include "testkit/synthetic.h"

namespace engram {
namespace {

using Catch::Matchers::Contains;
using testing::EditJsonFile;
using testing::EditShardHeader;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

constexpr uint64_t kRows = 3001;
constexpr uint64_t kSeed = 11;

std::string WriteSynth(const std::string& dir, std::vector<uint32_t> layers = {1, 14}) {
  SynthOptions options;
  options.out_dir = dir;
  options.rows = kRows;
  options.seed = kSeed;
  options.layers = std::move(layers);
  REQUIRE(WriteSyntheticCheckpoint(options).ok());
  return dir;
}

std::string Shard14(const std::string& dir) { return dir + "/model-00003-of-00003.safetensors"; }

int CountOpenFds() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++n;
  }
  return n;
}

void CheckRowsMatch(const Table& t, uint64_t begin, uint64_t end, uint64_t step = 1) {
  uint8_t got[kRowBytes], want[kRowBytes];
  for (uint64_t r = begin; r < end; r += step) {
    REQUIRE(ReadRowBlocking(t, r, got).ok());
    SyntheticRow(kSeed, t.layer_id(), r, want);
    INFO("layer " << t.layer_id() << " row " << r);
    REQUIRE(std::memcmp(got, want, kRowBytes) == 0);
  }
}

TEST_CASE("a synthetic checkpoint opens with both tables, rows byte-exact", "[checkpoint]") {
  TempDir dir;
  WriteSynth(dir.path());
  auto tables = OpenCheckpoint(dir.path(), {});
  REQUIRE(tables.ok());
  REQUIRE(tables->size() == 2);
  const uint32_t layers[2] = {1, 14};
  for (int i = 0; i < 2; ++i) {
    const Table& t = *(*tables)[i];
    CHECK(t.layer_id() == layers[i]);
    CHECK(t.layout() == TableLayout::kCheckpoint);
    CHECK(std::string(TableLayoutName(t.layout())) == "checkpoint");
    CHECK(t.num_rows() == kRows);
    CHECK(t.covered() == RowRange{0, kRows});
    CHECK(t.data_bytes() == kRows * kRowBytes);
    CHECK(t.row_bytes() == kRowBytes);
    CHECK(t.source() == dir.path());
    REQUIRE(t.parts().size() == 2);
    const RowPart& values = t.parts()[0];
    const RowPart& scales = t.parts()[1];
    CHECK(values.dest_offset == 0);
    CHECK(values.bytes == 256);
    CHECK(scales.dest_offset == 256);
    CHECK(scales.bytes == 8);
    // As in the released shards, table data does not start page- (or even word-) aligned.
    CHECK(values.base % 4096 != 0);
    CHECK(values.base % 2 == 1);
    CHECK(scales.FileOffset(10) - scales.FileOffset(9) == 8);
    CHECK(t.files()[values.file].path ==
          SyntheticShardName(SynthOptions{}, layers[i]).insert(0, dir.path() + "/"));
    CHECK_THAT(t.Describe(), Contains("layer " + std::to_string(layers[i])));
    CheckRowsMatch(t, 0, kRows);
  }
}

TEST_CASE("rows outside a table are refused, never read", "[checkpoint]") {
  TempDir dir;
  WriteSynth(dir.path());
  auto tables = OpenCheckpoint(dir.path(), {.layers = {14}});
  REQUIRE(tables.ok());
  REQUIRE(tables->size() == 1);
  const Table& t = *(*tables)[0];
  CHECK(t.layer_id() == 14);
  CHECK(t.CheckRow(kRows - 1).ok());
  absl::Status s = t.CheckRow(kRows);
  CHECK(s.code() == absl::StatusCode::kOutOfRange);
  CHECK_THAT(std::string(s.message()), Contains("row 3001"));
  CHECK_THAT(std::string(s.message()), Contains("layer 14"));
  uint8_t row[kRowBytes];
  CHECK(ReadRowBlocking(t, uint64_t{1} << 40, row).code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("table files are O_CLOEXEC and closed with the table", "[checkpoint]") {
  TempDir dir;
  WriteSynth(dir.path());
  const int before = CountOpenFds();
  {
    auto tables = OpenTables(dir.path(), {});
    REQUIRE(tables.ok());
    // One fd per shard a table reads: each synthetic layer keeps both tensors in one shard.
    CHECK(CountOpenFds() == before + 2);
    for (const auto& t : *tables) {
      CHECK(t->files().size() == 1);
      CHECK(t->parts().size() == 2);
      CHECK(t->parts()[0].file == t->parts()[1].file);
      for (const TableFile& f : t->files()) {
        CHECK(f.fd >= 0);
        CHECK((::fcntl(f.fd, F_GETFD) & FD_CLOEXEC) != 0);
        CHECK(f.size > 0);
      }
    }
  }
  CHECK(CountOpenFds() == before);
  // A failed open leaks nothing either.
  std::filesystem::remove(Shard14(dir.path()));
  CHECK_FALSE(OpenTables(dir.path(), {}).ok());
  CHECK(CountOpenFds() == before);
}

TEST_CASE("checkpoint variants engramd accepts", "[checkpoint]") {
  TempDir dir;
  SECTION("engram keys at the top level of config.json") {
    WriteSynth(dir.path());
    EditJsonFile(dir / "config.json", [](nlohmann::json& c) {
      for (auto& [k, v] : c["text_config"].items()) c[k] = v;
      c.erase("text_config");
    });
    auto tables = OpenCheckpoint(dir.path(), {});
    REQUIRE(tables.ok());
    CHECK(tables->size() == 2);
  }
  SECTION("a single model.safetensors without an index") {
    WriteSynth(dir.path(), {14});
    std::filesystem::remove(dir / "model.safetensors.index.json");
    std::filesystem::remove(dir / "model-00001-of-00002.safetensors");
    std::filesystem::rename(dir / "model-00002-of-00002.safetensors", dir / "model.safetensors");
    auto tables = OpenCheckpoint(dir.path(), {});
    REQUIRE(tables.ok());
    REQUIRE(tables->size() == 1);
    CheckRowsMatch(*(*tables)[0], 0, kRows, 97);
  }
  SECTION("tensor names with a model. prefix") {
    WriteSynth(dir.path());
    auto rename = [](nlohmann::json& j) {
      nlohmann::json out = nlohmann::json::object();
      for (auto& [k, v] : j.items()) out[k.rfind("layers.", 0) == 0 ? "model." + k : k] = v;
      j = out;
    };
    EditJsonFile(dir / "model.safetensors.index.json",
                 [&](nlohmann::json& j) { rename(j["weight_map"]); });
    EditShardHeader(Shard14(dir.path()), rename);
    EditShardHeader(dir / "model-00002-of-00003.safetensors", rename);
    auto tables = OpenCheckpoint(dir.path(), {});
    REQUIRE(tables.ok());
    CheckRowsMatch(*(*tables)[1], 0, kRows, 101);
  }
  SECTION("a scalar engram_num_embeddings") {
    WriteSynth(dir.path());
    EditJsonFile(dir / "config.json",
                 [](nlohmann::json& c) { c["text_config"]["engram_num_embeddings"] = kRows; });
    CHECK(OpenCheckpoint(dir.path(), {}).ok());
  }
}

struct Refusal {
  absl::StatusCode code;
  std::vector<std::string> mentions;
};

void ExpectRefused(const std::string& dir, const Refusal& want, const OpenOptions& options = {}) {
  auto tables = OpenCheckpoint(dir, options);
  REQUIRE_FALSE(tables.ok());
  INFO(tables.status().ToString());
  CHECK(tables.status().code() == want.code);
  for (const std::string& m : want.mentions) {
    CHECK_THAT(std::string(tables.status().message()), Contains(m));
  }
}

TEST_CASE("broken checkpoints are refused with errors naming file, tensor and problem",
          "[checkpoint]") {
  TempDir tmp;
  const std::string dir = WriteSynth(tmp.path());
  const std::string shard = Shard14(dir);
  const std::string weight = "layers.14.engram.embed.weight";
  const std::string scale = "layers.14.engram.embed.scale";

  SECTION("no config.json") {
    std::filesystem::remove(dir + "/config.json");
    ExpectRefused(dir, {absl::StatusCode::kNotFound, {dir + "/config.json"}});
  }
  SECTION("malformed config.json") {
    WriteFile(dir + "/config.json", "{\"text_config\": {");
    ExpectRefused(dir, {absl::StatusCode::kInvalidArgument, {"config.json", "not valid JSON"}});
  }
  SECTION("config.json without Engram keys") {
    WriteFile(dir + "/config.json", R"({"text_config": {"hidden_size": 7168}})");
    ExpectRefused(dir, {absl::StatusCode::kInvalidArgument, {"no engram_layer_ids"}});
  }
  SECTION("engram_num_embeddings of the wrong length") {
    EditJsonFile(dir + "/config.json",
                 [](nlohmann::json& c) { c["text_config"]["engram_num_embeddings"] = {kRows}; });
    ExpectRefused(dir, {absl::StatusCode::kInvalidArgument, {"engram_num_embeddings"}});
  }
  SECTION("a head dim engramd does not serve") {
    EditJsonFile(dir + "/config.json",
                 [](nlohmann::json& c) { c["text_config"]["engram_head_dim"] = 128; });
    ExpectRefused(dir, {absl::StatusCode::kInvalidArgument, {"engram_head_dim is 128"}});
  }
  SECTION("a requested layer that is not an Engram layer") {
    ExpectRefused(dir, {absl::StatusCode::kNotFound, {"layer 7"}}, {.layers = {7}});
  }
  SECTION("neither index nor model.safetensors") {
    std::filesystem::remove(dir + "/model.safetensors.index.json");
    ExpectRefused(dir, {absl::StatusCode::kNotFound, {"model.safetensors.index.json"}});
  }
  SECTION("malformed index") {
    WriteFile(dir + "/model.safetensors.index.json", "{\"weight_map\": ");
    ExpectRefused(dir, {absl::StatusCode::kInvalidArgument, {"index.json", "not valid JSON"}});
  }
  SECTION("tensor missing from the index") {
    EditJsonFile(dir + "/model.safetensors.index.json",
                 [&](nlohmann::json& j) { j["weight_map"].erase(scale); });
    ExpectRefused(dir, {absl::StatusCode::kNotFound, {scale, "model.safetensors.index.json"}});
  }
  SECTION("shard outside the checkpoint directory") {
    EditJsonFile(dir + "/model.safetensors.index.json",
                 [&](nlohmann::json& j) { j["weight_map"][weight] = "../elsewhere.safetensors"; });
    ExpectRefused(dir, {absl::StatusCode::kInvalidArgument, {"../elsewhere.safetensors"}});
  }
  SECTION("missing shard") {
    std::filesystem::remove(shard);
    ExpectRefused(dir, {absl::StatusCode::kNotFound, {shard, weight, "missing"}});
  }
  SECTION("tensor missing from its shard") {
    EditShardHeader(shard, [&](nlohmann::json& h) {
      h["layers.14.engram.embed.renamed"] = h[weight];
      h.erase(weight);
    });
    ExpectRefused(dir, {absl::StatusCode::kNotFound, {shard, weight, "has no tensor"}});
  }
  SECTION("wrong dtype of the values") {
    EditShardHeader(shard, [&](nlohmann::json& h) { h[weight]["dtype"] = "I8"; });
    ExpectRefused(
        dir, {absl::StatusCode::kInvalidArgument, {shard, weight, "dtype I8, expected F8_E4M3"}});
  }
  SECTION("wrong dtype of the scales") {
    EditShardHeader(shard, [&](nlohmann::json& h) { h[scale]["dtype"] = "U8"; });
    ExpectRefused(
        dir, {absl::StatusCode::kInvalidArgument, {shard, scale, "dtype U8, expected F8_E8M0"}});
  }
  SECTION("shape not matching config.json") {
    EditShardHeader(shard, [&](nlohmann::json& h) { h[weight]["shape"] = {kRows * 2, 128}; });
    ExpectRefused(dir, {absl::StatusCode::kInvalidArgument,
                        {shard, weight, "shape [6002, 128]", "implies [3001, 256]"}});
  }
  SECTION("row count not matching engram_num_embeddings") {
    EditJsonFile(dir + "/config.json", [](nlohmann::json& c) {
      c["text_config"]["engram_num_embeddings"] = {kRows, kRows + 1};
    });
    ExpectRefused(dir, {absl::StatusCode::kInvalidArgument,
                        {weight, "has 3001 rows", "engram_num_embeddings says 3002"}});
  }
  SECTION("overlapping tensors") {
    EditShardHeader(shard, [&](nlohmann::json& h) {
      uint64_t b = h[weight]["data_offsets"][1].get<uint64_t>() - 16;
      h[scale]["data_offsets"] = {b, b + kRows * 8};
    });
    ExpectRefused(dir, {absl::StatusCode::kDataLoss, {shard, "overlap"}});
  }
  SECTION("data offsets past the end of the file") {
    EditShardHeader(shard, [&](nlohmann::json& h) {
      uint64_t b = h[scale]["data_offsets"][0].get<uint64_t>() + (1 << 20);
      h[scale]["data_offsets"] = {b, b + kRows * 8};
    });
    ExpectRefused(dir, {absl::StatusCode::kDataLoss, {shard, scale, "outside the file"}});
  }
  SECTION("file shorter than the header says") {
    std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 5000);
    ExpectRefused(dir, {absl::StatusCode::kDataLoss, {shard, "outside the file"}});
  }
  SECTION("absurd header length") {
    std::string bytes = ReadFile(shard);
    bytes.replace(0, 8, testing::LengthPrefix(uint64_t{1} << 50));
    WriteFile(shard, bytes);
    ExpectRefused(dir, {absl::StatusCode::kDataLoss, {shard, "header length"}});
  }
  SECTION("header length past the end of a truncated shard") {
    std::filesystem::resize_file(shard, 300);
    ExpectRefused(dir, {absl::StatusCode::kDataLoss, {shard, "runs past the end"}});
  }
  SECTION("malformed shard header JSON") {
    std::string bytes = ReadFile(shard);
    bytes[8] = 'x';
    WriteFile(shard, bytes);
    ExpectRefused(dir, {absl::StatusCode::kDataLoss, {shard, "not valid JSON"}});
  }
}

// Writes a per-rank copy of `src` into `dst`: the same headers, and only rows [begin, end) of
// each Engram tensor written at their original offsets; the rest of each shard is a hole.
// `full_size`: extend each shard to its original size (else it ends after the last row).
void WriteSparseCopy(const std::string& src, const std::string& dst, RowRange rows,
                     bool full_size) {
  for (const char* f :
       {"config.json", "model.safetensors.index.json", "model-00001-of-00003.safetensors"}) {
    std::filesystem::copy_file(src + "/" + f, dst + "/" + f);
  }
  auto tables = OpenCheckpoint(src, {});
  REQUIRE(tables.ok());
  for (const auto& t : *tables) {
    const std::string& in_path = t->files()[0].path;
    const std::string out_path = dst + "/" + std::filesystem::path(in_path).filename().string();
    const std::string bytes = ReadFile(in_path);
    int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    uint64_t header_end = t->parts()[0].base - 512;  // the data start (a 512-byte decoy first)
    REQUIRE(::pwrite(fd, bytes.data(), header_end, 0) == static_cast<ssize_t>(header_end));
    uint64_t end = 0;
    for (const RowPart& p : t->parts()) {
      const uint64_t off = p.FileOffset(rows.begin);
      const uint64_t len = rows.size() * p.bytes;
      REQUIRE(::pwrite(fd, bytes.data() + off, len, off) == static_cast<ssize_t>(len));
      end = std::max(end, off + len);
    }
    if (full_size) REQUIRE(::ftruncate(fd, bytes.size()) == 0);
    ::close(fd);
  }
}

TEST_CASE("per-rank sparse checkpoint copies serve only their declared rows",
          "[checkpoint][holes]") {
  TempDir src, dst;
  WriteSynth(src.path());
  if (!testing::SupportsHoles(dst.path())) {
    ENGRAM_SKIP("the filesystem under " + dst.path() + " reports no holes");
  }
  const RowRange rank{1024, 2048};

  SECTION("full-size sparse files") {
    WriteSparseCopy(src.path(), dst.path(), rank, /*full_size=*/true);
    auto tables = OpenCheckpoint(dst.path(), {.rows = rank});
    REQUIRE(tables.ok());
    for (const auto& t : *tables) {
      CHECK(t->covered() == rank);
      CHECK(t->num_rows() == kRows);
      CHECK(t->data_bytes() == rank.size() * kRowBytes);
      CheckRowsMatch(*t, rank.begin, rank.end);
      absl::Status below = t->CheckRow(rank.begin - 1);
      CHECK(below.code() == absl::StatusCode::kOutOfRange);
      CHECK_THAT(std::string(below.message()), Contains("row 1023"));
      CHECK_THAT(std::string(below.message()), Contains("[1024, 2048)"));
      uint8_t row[kRowBytes];
      CHECK(ReadRowBlocking(*t, rank.end, row).code() == absl::StatusCode::kOutOfRange);
    }
    // Declaring rows the copy does not hold is refused at open, naming the file and the hole.
    auto wider = OpenCheckpoint(dst.path(), {.rows = RowRange{0, 2048}});
    REQUIRE_FALSE(wider.ok());
    CHECK(wider.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(wider.status().message()), Contains("model-00002-of-00003"));
    CHECK_THAT(std::string(wider.status().message()), Contains("hole at offset"));
    // So is opening it as a full table.
    auto full = OpenCheckpoint(dst.path(), {});
    REQUIRE_FALSE(full.ok());
    CHECK(full.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(full.status().message()), Contains("hole at offset"));
    // Without the hole check the full open succeeds: the check is what protects the reader.
    CHECK(OpenCheckpoint(dst.path(), {.check_holes = false}).ok());
  }
  SECTION("sparse files that end after the rank's last row") {
    WriteSparseCopy(src.path(), dst.path(), rank, /*full_size=*/false);
    auto tables = OpenCheckpoint(dst.path(), {.rows = rank});
    REQUIRE(tables.ok());
    CheckRowsMatch(*(*tables)[1], rank.begin, rank.end);
    auto full = OpenCheckpoint(dst.path(), {});
    REQUIRE_FALSE(full.ok());
    CHECK(full.status().code() == absl::StatusCode::kDataLoss);
    auto past = OpenCheckpoint(dst.path(), {.rows = RowRange{1024, 3001}, .check_holes = false});
    REQUIRE_FALSE(past.ok());
    CHECK(past.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(past.status().message()), Contains("truncated"));
  }
  SECTION("a declared range outside the table") {
    WriteSparseCopy(src.path(), dst.path(), rank, /*full_size=*/true);
    auto bad = OpenCheckpoint(dst.path(), {.rows = RowRange{2048, 4000}});
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == absl::StatusCode::kOutOfRange);
  }
}

}  // namespace
}  // namespace engram
