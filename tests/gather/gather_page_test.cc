// The gather path at the kernel's page size and at the 16 and 64 KiB granules of arm64 kernels
// built for them: buffered reads merge rows that share a page of the granule (the gap read into
// a sink at least that large), and O_DIRECT reads stay one 4 KiB device block a row, never a
// whole kernel page.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "base/page_size.h"
#include "gather/gather_engine.h"
#include "gather/gather_planner.h"
#include "tests/gather/gather_catch_util.h"

namespace engram {
namespace {

using testing::FirstMismatch;
using testing::GatherInto;
using testing::RequireEngine;
using testing::RequireTable;
using testing::StatsOf;
using testing::TempDir;

constexpr uint64_t kSeed = 9;
constexpr uint64_t kRows = 20000;
constexpr uint32_t kLayer = 14;

struct Files {
  TempDir dir;
  std::string packed, paged;
  Files() {
    REQUIRE(dir.ok());
    packed = dir.path() + "/layer14.engram";
    paged = dir.path() + "/layer14-paged.engram";
    REQUIRE(testing::WriteSyntheticPacked(packed, kLayer, kRows, kSeed).ok());
    REQUIRE(testing::WriteSyntheticPacked(paged, kLayer, kRows, kSeed, /*paged=*/true).ok());
  }
};

const Files& TheFiles() {
  static Files f;
  return f;
}

// The kernel's page and the larger granules of 16 and 64 KiB kernels, each a Catch2 section.
uint64_t GranuleSection() {
  const uint64_t kernel = KernelPageBytes();
  std::vector<uint64_t> granules = {kernel};
  for (uint64_t g : {uint64_t{16} << 10, uint64_t{64} << 10}) {
    if (g > kernel) granules.push_back(g);
  }
  // Every section must be met on every run (Catch2 finds the ones still to run that way), and
  // one is entered per run.
  uint64_t chosen = 0;
  for (uint64_t g : granules) {
    DYNAMIC_SECTION("page granule " << (g >> 10) << " KiB") { chosen = g; }
  }
  return chosen;
}

TEST_CASE("buffered reads merge rows that share a page of the granule", "[gather][page]") {
  const uint64_t g = GranuleSection();
  if (g == 0) return;
  TestPageGranule granule(g);
  auto table = RequireTable(TheFiles().packed, kLayer);
  // Rows 40 apart: 10,560 bytes, so two of them share a page only when pages exceed 4 KiB.
  std::vector<uint64_t> rows;
  for (uint64_t r = 0; r < 4000; r += 40) rows.push_back(r);
  std::vector<uint8_t> out(rows.size() * kRowBytes);
  GatherPlan plan;
  GatherPlanner planner({});
  REQUIRE(planner.Plan({.table = table.get(), .rows = rows, .dest = out.data()}, &plan).ok());
  CHECK(plan.gap_sink.size() >= std::min<uint64_t>(g, 64 << 10) - 1);
  // A read joins the next row exactly when that row starts on the page its last byte is on and
  // the read stays within 64 KiB (100 rows 10.5 KB apart never reach 64 iovecs).
  const RowPart& part = table->parts()[0];
  size_t want_reads = 0;
  uint64_t read_bytes = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const uint64_t off = part.FileOffset(rows[i]);
    const uint64_t prev_end = i > 0 ? part.FileOffset(rows[i - 1]) + kRowBytes : 0;
    const bool joins = i > 0 && (prev_end - 1) / g == off / g &&
                       read_bytes + (off - prev_end) + kRowBytes <= (64 << 10);
    read_bytes = joins ? read_bytes + (off - prev_end) + kRowBytes : kRowBytes;
    want_reads += joins ? 0 : 1;
  }
  CHECK(plan.reads.size() == want_reads);
  if (g == 4096) CHECK(plan.reads.size() == rows.size());
  if (g >= (16 << 10)) CHECK(plan.reads.size() < rows.size());
  for (size_t i = 0; i < plan.iovs.size(); ++i) {
    if (plan.iov_unique[i] == kGapIov) CHECK(plan.iovs[i].iov_len < g);
  }

  // Through the engine: the merged reads, gaps and all, give the rows byte-exact.
  auto engine = RequireEngine({.workers = 1, .use_io_uring = false});
  REQUIRE(engine->AddTable(table.get(), {.mode = ReadMode::kBuffered}).ok());
  std::vector<uint8_t> got;
  REQUIRE(GatherInto(*engine, *table, rows, got).ok());
  CHECK(FirstMismatch(kSeed, *table, rows, got.data()) == -1);
}

TEST_CASE("O_DIRECT reads fetch one 4 KiB block a row whatever the page granule",
          "[gather][page]") {
  const uint64_t g = GranuleSection();
  if (g == 0) return;
  TestPageGranule granule(g);
  auto table = RequireTable(TheFiles().paged, kLayer);
  REQUIRE(table->parts()[0].paged());
  // One row on every third 4 KiB format page: 12 KiB apart, so pages of 16 or 64 KiB hold
  // several of them, and still one block each is read.
  std::vector<uint64_t> rows;
  for (uint64_t page = 0; page < 300; page += 3) rows.push_back(page * 15 + page % 15);
  for (bool uring : {true, false}) {
    auto engine = RequireEngine({.workers = 1, .use_io_uring = uring});
    REQUIRE(engine->AddTable(table.get(), {.mode = ReadMode::kDirect}).ok());
    std::vector<uint8_t> out;
    REQUIRE(GatherInto(*engine, *table, rows, out).ok());
    CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
    const auto s = StatsOf(*engine);
    CHECK(s.direct_reads == rows.size());
    CHECK(s.bytes_read == rows.size() * kDirectIoAlignBytes);
  }
}

}  // namespace
}  // namespace engram
