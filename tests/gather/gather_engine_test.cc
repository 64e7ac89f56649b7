// Tests of the gather engine against synthetic tables whose row contents are known: byte-exact
// gathers in both layouts and cache states, the seven forced read paths through real seams
// (evicted pages, tmpfs, truncated files, an injected read function), O_DIRECT, the adaptive
// policy, bad input, Submit and concurrent callers.
#include "gather/gather_engine.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "base/clock.h"
#include "base/page_size.h"
#include "gather/gather_planner.h"
#include "tests/common/skip.h"
#include "tests/gather/gather_catch_util.h"

namespace engram {
namespace {

using testing::Evict;
using testing::FirstMismatch;
using testing::GatherInto;
using testing::Notices;
using testing::RealRead;
using testing::RequireEngine;
using testing::RequireTable;
using testing::StatsOf;
using testing::TempDir;
using testing::Warm;

constexpr uint64_t kSeed = 7;
constexpr uint64_t kRows = 30000;
constexpr uint32_t kLayer = 14;

struct Fixture {
  TempDir dir;
  std::string ckpt, packed, paged;
  Fixture() {
    REQUIRE(dir.ok());
    ckpt = dir.path() + "/ckpt";
    packed = dir.path() + "/layer14.engram";
    REQUIRE(WriteSyntheticCheckpoint(
                {.out_dir = ckpt, .rows = kRows, .seed = kSeed, .layers = {kLayer}})
                .ok());
    REQUIRE(testing::WriteSyntheticPacked(packed, kLayer, kRows, kSeed).ok());
    paged = dir.path() + "/layer14-paged.engram";
    REQUIRE(testing::WriteSyntheticPacked(paged, kLayer, kRows, kSeed, /*paged=*/true).ok());
  }
};

Fixture& Files() {
  static Fixture f;
  return f;
}

std::unique_ptr<Table> Open(const std::string& path) { return RequireTable(path, kLayer); }

// Rows `step` apart: by default 97 (25,608 bytes), so that no two share a page of up to 16 KiB or
// get merged.
std::vector<uint64_t> SpreadRows(size_t n, uint64_t first = 3, uint64_t step = 97) {
  std::vector<uint64_t> rows;
  for (size_t i = 0; i < n; ++i) rows.push_back((first + i * step) % kRows);
  return rows;
}

std::vector<uint64_t> RandomRows(size_t n, uint64_t seed, uint64_t limit = kRows) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> rows(n);
  for (auto& r : rows) r = rng() % limit;
  for (size_t i = 0; i + 7 < n; i += 7) rows[i + 3] = rows[i];  // duplicates
  return rows;
}

// A read seam that counts NOWAIT reads and answers them EAGAIN while `refuse` is set, as rows
// that are not resident would be.
struct RefusableNowait {
  std::atomic<bool> refuse;
  std::atomic<uint64_t> calls{0};
  explicit RefusableNowait(bool refusing) : refuse(refusing) {}
  ReadFn Fn() {
    return [this](int fd, const iovec* iov, int cnt, off_t off, int flags) -> ssize_t {
      if (flags & RWF_NOWAIT) {
        calls++;
        if (refuse) return -EAGAIN;
      }
      return RealRead(fd, iov, cnt, off, flags);
    };
  }
};

// Warms the table and runs `attempt` (a fresh engine, its gathers and the checks of the bytes),
// which returns the engine's statistics; while they show more NOWAIT misses than the test
// caused (`caused`), warms and runs it again, up to four times in all. Hosts with a proactive
// reclaimer (a DAMON pageout scheme) take cold page-cache pages back at any moment, also
// between the warm and the gather. The statistics of the last attempt are returned for the
// test's exact checks, so a reader that misses on truly resident rows still fails them.
TableGatherStats OnWarmTable(const Table& table, uint64_t caused,
                             const std::function<TableGatherStats()>& attempt) {
  TableGatherStats s;
  for (int i = 0; i < 4; ++i) {
    Warm(table);
    s = attempt();
    if (s.nowait_eagain + s.nowait_zero <= caused) break;
    UNSCOPED_INFO("attempt " << i << ": " << s.nowait_eagain << " NOWAIT misses, warming again");
  }
  return s;
}

// False where the system call answered ENOSYS (an emulator such as qemu-user lacks it).
bool KernelHas(long result) { return !(result < 0 && errno == ENOSYS); }

// False where RWF_NOWAIT reads of the table's first file are refused (qemu-user refuses them).
bool KernelHasNowait(const Table& table) {
  char byte;
  iovec v{&byte, 1};
  const ssize_t r = preadv2(table.files()[0].fd, &v, 1, 0, RWF_NOWAIT);
  return !(r < 0 && (errno == ENOSYS || errno == EOPNOTSUPP));
}

TEST_CASE("gathers are byte-exact in both layouts, warm and cold, on every residue path",
          "[gather]") {
  for (const std::string& path : {Files().ckpt, Files().packed}) {
    auto table = Open(path);
    for (bool uring : {true, false}) {
      for (bool cold : {false, true}) {
        DYNAMIC_SECTION(TableLayoutName(table->layout())
                        << (uring ? " io_uring" : " pool") << (cold ? " cold" : " warm")) {
          const auto rows = RandomRows(3000, 11);
          // Slots in reverse order with a gap between them.
          std::vector<uint64_t> offsets(rows.size());
          for (size_t i = 0; i < rows.size(); ++i) offsets[i] = (rows.size() - 1 - i) * 300;
          auto attempt = [&] {
            auto engine = RequireEngine({.workers = 2, .use_io_uring = uring});
            REQUIRE(engine->AddTable(table.get(), {}).ok());
            std::vector<uint8_t> out(rows.size() * 300, 0xEE);
            if (cold) Evict(*table);
            REQUIRE(engine
                        ->Gather({.table = table.get(),
                                  .rows = rows,
                                  .dest = out.data(),
                                  .dest_offsets = offsets})
                        .ok());
            CHECK(FirstMismatch(kSeed, *table, rows, out.data(), offsets) == -1);
            return StatsOf(*engine);
          };
          const auto s = cold ? attempt() : OnWarmTable(*table, 0, attempt);
          CHECK(s.rows_requested == rows.size());
          CHECK(s.rows_unique < rows.size());
          CHECK(s.dedup_copies == s.rows_requested - s.rows_unique);
          CHECK(s.errors == 0);
          CHECK(s.bytes_read >= s.rows_unique * kRowBytes);
          // Without preadv2 (qemu-user) warm rows take the residue path too; without
          // io_uring_setup the residue goes to the pool.
          const bool nowait = KernelHasNowait(*table);
          const bool pool = !uring || !KernelHas(syscall(__NR_io_uring_setup, 0, nullptr));
          if (!cold && nowait) CHECK(s.nowait_hits == s.rows_unique);
          if (cold || !nowait) CHECK((pool ? s.pool_reads : s.uring_reads) > 0);
        }
      }
    }
  }
}

TEST_CASE("forced path: hit, every row from the NOWAIT pass", "[gather][paths][nowait]") {
  auto table = Open(Files().packed);
  for (NowaitPass pass : {NowaitPass::kSerial, NowaitPass::kUring}) {
    const auto rows = SpreadRows(200);
    const auto s = OnWarmTable(*table, 0, [&] {
      auto engine = RequireEngine({.workers = 1, .nowait_pass = pass});
      REQUIRE(engine->AddTable(table.get(), {}).ok());
      std::vector<uint8_t> out;
      REQUIRE(GatherInto(*engine, *table, rows, out).ok());
      CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
      return StatsOf(*engine);
    });
    CHECK(s.nowait_hits == rows.size());
    CHECK(s.nowait_eagain == 0);
    CHECK(s.uring_reads == 0);
    CHECK(s.pool_reads == 0);
    CHECK(s.read_calls == rows.size());
  }
}

TEST_CASE("forced path: one EAGAIN goes to the residue and nothing else does",
          "[gather][paths][nowait]") {
  auto table = Open(Files().packed);
  Warm(*table);
  SECTION("injected: the first NOWAIT read answers EAGAIN") {
    const auto rows = SpreadRows(100);
    const auto s = OnWarmTable(*table, 1, [&] {
      std::atomic<int> eagains{0};
      GatherEngineOptions o{.workers = 1, .use_io_uring = false};
      o.read_fn = [&](int fd, const iovec* iov, int cnt, off_t off, int flags) -> ssize_t {
        if ((flags & RWF_NOWAIT) && eagains.fetch_add(1) == 0) return -EAGAIN;
        return RealRead(fd, iov, cnt, off, flags);
      };
      auto engine = RequireEngine(o);
      REQUIRE(engine->AddTable(table.get(), {}).ok());
      std::vector<uint8_t> out;
      REQUIRE(GatherInto(*engine, *table, rows, out).ok());
      CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
      return StatsOf(*engine);
    });
    CHECK(s.nowait_eagain == 1);
    CHECK(s.nowait_hits == rows.size() - 1);
    CHECK(s.pool_reads == 1);
  }
}

// The real page cache: the kernel may keep the pages in a large folio that cannot be split,
// and then the case skips ([pagecache] runs as its own test).
TEST_CASE("forced path: one row's page evicted goes to the residue, nothing else does",
          "[gather][paths][nowait][pagecache]") {
  auto table = Open(Files().packed);
  Warm(*table);
  // Rows more than two kernel pages apart, so that evicting one row's pages evicts no other's.
  const uint64_t page = KernelPageBytes();
  const uint64_t step = std::max<uint64_t>(97, 2 * page / kRowBytes + 1);
  const auto rows = SpreadRows(std::min<uint64_t>(100, kRows / step), 3, step);
  bool evicted = false;
  const auto s = OnWarmTable(*table, 1, [&] {
    auto engine = RequireEngine({.workers = 1, .nowait_pass = NowaitPass::kSerial});
    REQUIRE(engine->AddTable(table.get(), {}).ok());
    // Evict the kernel pages holding row 50 of the batch (and nothing else of the batch).
    const RowPart& p = table->parts()[0];
    const uint64_t off = p.FileOffset(rows[50]);
    const uint64_t first = off / page * page, end = (off + kRowBytes + page - 1) / page * page;
    const TableFile& file = table->files()[0];
    posix_fadvise(file.fd, first, end - first, POSIX_FADV_DONTNEED);
    // DONTNEED cannot split a large folio that also holds other rows: check what it evicted.
    void* map = mmap(nullptr, file.size, PROT_READ, MAP_SHARED, file.fd, 0);
    REQUIRE(map != MAP_FAILED);
    unsigned char vec[2] = {1, 1};
    REQUIRE(mincore(static_cast<uint8_t*>(map) + first, end - first, vec) == 0);
    munmap(map, file.size);
    evicted = !(vec[0] & 1) || (end - first > page && !(vec[1] & 1));
    std::vector<uint8_t> out;
    REQUIRE(GatherInto(*engine, *table, rows, out).ok());
    CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
    return StatsOf(*engine);
  });
  if (!evicted) {
    ENGRAM_SKIP(
        "the row's pages stayed resident (a large folio DONTNEED cannot split): the bytes were "
        "right, the miss path was not reached");
  }
  CHECK(s.nowait_eagain == 1);
  CHECK(s.uring_reads + s.partial_reads >= 1);
  CHECK(s.nowait_hits == rows.size() - 1);
}

TEST_CASE("forced path: persistent EAGAIN, and the adaptive policy turning NOWAIT off and on",
          "[gather][paths][nowait]") {
  auto table = Open(Files().packed);
  Warm(*table);
  RefusableNowait seam(true);
  GatherEngineOptions o{.workers = 1, .use_io_uring = false};
  o.probe_interval = 4;
  o.probe_reads = 16;
  o.read_fn = seam.Fn();
  auto engine = RequireEngine(o);
  REQUIRE(engine->AddTable(table.get(), {}).ok());
  const auto rows = SpreadRows(64);
  std::vector<uint8_t> out;
  REQUIRE(GatherInto(*engine, *table, rows, out).ok());
  CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
  auto s = StatsOf(*engine);
  CHECK(s.nowait_eagain == 16);  // the first wave (probe_reads) misses: the rest skip the pass
  CHECK(s.nowait_hits == 0);
  CHECK(s.pool_reads == rows.size());
  CHECK_FALSE(s.nowait_enabled);  // one all-miss wave drops the rate below 0.5
  CHECK(s.recent_hit_rate < 0.5);

  // While off, only every 4th batch probes 16 reads.
  seam.calls = 0;
  for (int i = 0; i < 8; ++i) REQUIRE(GatherInto(*engine, *table, rows, out).ok());
  CHECK(seam.calls == 2 * 16);
  s = StatsOf(*engine);
  CHECK(s.probes == 2);
  CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);

  // The rows become resident: probes see hits and the policy switches the pass back on.
  seam.refuse = false;
  for (int i = 0; i < 40 && !StatsOf(*engine).nowait_enabled; ++i) {
    REQUIRE(GatherInto(*engine, *table, rows, out).ok());
  }
  s = StatsOf(*engine);
  CHECK(s.nowait_enabled);
  CHECK(s.recent_hit_rate >= 0.5);
}

TEST_CASE("forced path: a partial read continues where it stopped", "[gather][paths][nowait]") {
  auto table = Open(Files().packed);
  Warm(*table);
  SECTION("injected: NOWAIT reads return half of what was asked") {
    GatherEngineOptions o{.workers = 1};
    o.read_fn = [](int fd, const iovec* iov, int cnt, off_t off, int flags) -> ssize_t {
      size_t total = 0;
      for (int i = 0; i < cnt; ++i) total += iov[i].iov_len;
      if ((flags & RWF_NOWAIT) && total > 1) {
        std::vector<iovec> half(iov, iov + cnt);
        size_t left = total / 2;
        size_t k = 0;
        for (; k < half.size() && left > 0; ++k) {
          half[k].iov_len = std::min(half[k].iov_len, left);
          left -= half[k].iov_len;
        }
        half.resize(k);
        return RealRead(fd, half.data(), static_cast<int>(half.size()), off, flags);
      }
      return RealRead(fd, iov, cnt, off, flags);
    };
    const auto rows = SpreadRows(50);
    const auto s = OnWarmTable(*table, 0, [&] {
      auto engine = RequireEngine(o);
      REQUIRE(engine->AddTable(table.get(), {}).ok());
      std::vector<uint8_t> out;
      REQUIRE(GatherInto(*engine, *table, rows, out).ok());
      CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
      return StatsOf(*engine);
    });
    CHECK(s.partial_reads >= rows.size());
    CHECK(s.nowait_hits == rows.size());
    CHECK(s.nowait_eagain == 0);
  }
}

TEST_CASE("forced path: a row straddling a resident page and an evicted one reads both",
          "[gather][paths][nowait][pagecache]") {
  auto table = Open(Files().packed);
  Warm(*table);
  auto engine = RequireEngine({.workers = 1, .nowait_pass = NowaitPass::kSerial});
  REQUIRE(engine->AddTable(table.get(), {}).ok());
  const RowPart& p = table->parts()[0];
  const TableFile& file = table->files()[0];
  // Find a row that straddles two pages and get the first page resident, the second not.
  // mincore() checks the state without reading; the page cache may hold both pages in one
  // large folio that DONTNEED cannot split, so several rows are tried.
  void* map = mmap(nullptr, file.size, PROT_READ, MAP_SHARED, file.fd, 0);
  REQUIRE(map != MAP_FAILED);
  const uint64_t page = KernelPageBytes();
  uint64_t row = 100;
  bool staged = false;
  for (int tries = 0; tries < 200 && !staged; ++tries) {
    if (tries > 0) row += 61;
    while ((p.FileOffset(row) % page) + kRowBytes <= page) ++row;
    const uint64_t first_page = p.FileOffset(row) / page * page;
    uint8_t buf[kRowBytes];
    REQUIRE(pread(file.fd, buf, kRowBytes, p.FileOffset(row)) == kRowBytes);
    posix_fadvise(file.fd, first_page + page, page, POSIX_FADV_DONTNEED);
    unsigned char vec[2] = {0, 0};
    REQUIRE(mincore(static_cast<uint8_t*>(map) + first_page, 2 * page, vec) == 0);
    staged = (vec[0] & 1) && !(vec[1] & 1);
  }
  munmap(map, file.size);
  const std::vector<uint64_t> rows = {row};
  std::vector<uint8_t> out;
  REQUIRE(GatherInto(*engine, *table, rows, out).ok());
  CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
  if (!staged) {
    ENGRAM_SKIP(
        "no row could be left with only its first page resident (large folios): the bytes were "
        "right, the partial read was not reached");
  }
  CHECK(StatsOf(*engine).partial_reads >= 1);
}

TEST_CASE("forced path: a filesystem without RWF_NOWAIT (tmpfs) disables the fast path once",
          "[gather][paths][nowait]") {
  TempDir shm("/dev/shm");
  REQUIRE(shm.ok());
  const std::string ckpt = shm.path() + "/ckpt";
  REQUIRE(
      WriteSyntheticCheckpoint({.out_dir = ckpt, .rows = 4000, .seed = kSeed, .layers = {kLayer}})
          .ok());
  auto table = Open(ckpt);
  for (NowaitPass pass : {NowaitPass::kSerial, NowaitPass::kUring}) {
    Notices collected;
    GatherEngineOptions o{.workers = 1, .nowait_pass = pass};
    o.notice = collected.Fn();
    auto engine = RequireEngine(o);
    REQUIRE(engine->AddTable(table.get(), {}).ok());
    const auto rows = RandomRows(500, 3, 4000);
    std::vector<uint8_t> out;
    for (int i = 0; i < 3; ++i) {
      REQUIRE(GatherInto(*engine, *table, rows, out).ok());
      CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
    }
    const auto s = StatsOf(*engine);
    CHECK_FALSE(s.nowait_supported);
    CHECK_FALSE(s.nowait_enabled);
    CHECK(s.nowait_hits == 0);
    // One notice per file that was tried, never two for one file (both tensors of the layer
    // are in one shard, which the table opens once).
    std::vector<std::string> notices = collected.All();
    REQUIRE(notices.size() >= 1);
    CHECK(notices.size() <= table->files().size());
    CHECK(notices[0].find(table->files()[0].path) != std::string::npos);
    CHECK(notices[0].find("RWF_NOWAIT") != std::string::npos);
    for (int i = 0; i < 20; ++i) REQUIRE(GatherInto(*engine, *table, rows, out).ok());
    notices = collected.All();
    CHECK(notices.size() <= table->files().size());
    CHECK(std::set<std::string>(notices.begin(), notices.end()).size() == notices.size());
  }
}

TEST_CASE("forced path: a NOWAIT read returning 0 is a miss, not the end of the file",
          "[gather][paths][nowait]") {
  auto table = Open(Files().ckpt);
  Warm(*table);
  for (bool uring : {true, false}) {
    GatherEngineOptions o{.workers = 1, .use_io_uring = uring};
    o.read_fn = [](int fd, const iovec* iov, int cnt, off_t off, int flags) -> ssize_t {
      if (flags & RWF_NOWAIT) return 0;
      return RealRead(fd, iov, cnt, off, flags);
    };
    auto engine = RequireEngine(o);
    REQUIRE(engine->AddTable(table.get(), {}).ok());
    const auto rows = SpreadRows(40);
    std::vector<uint8_t> out;
    REQUIRE(GatherInto(*engine, *table, rows, out).ok());
    CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
    const auto s = StatsOf(*engine);
    CHECK(s.nowait_zero == s.read_calls - (uring ? s.uring_reads : s.pool_reads));
    CHECK(s.nowait_zero > 0);
    CHECK(s.nowait_eagain == rows.size());
    CHECK(s.errors == 0);
  }
}

TEST_CASE("forced path: a file that ends inside a row is a data error naming file and offset",
          "[gather][paths]") {
  TempDir dir;
  const std::string path = dir.path() + "/short.engram";
  REQUIRE(testing::WriteSyntheticPacked(path, kLayer, 1000, kSeed).ok());
  auto table = Open(path);
  const uint64_t last = 999;
  const uint64_t cut = table->parts()[0].FileOffset(last) + 100;
  // Truncate after the table was opened and validated: the row now ends early on disk.
  REQUIRE(truncate(path.c_str(), cut) == 0);
  struct Case {
    const char* name;
    GatherEngineOptions options;
    TableGatherOptions table;
    bool warm;
  };
  std::vector<Case> cases = {
      {"NOWAIT then io_uring", {.workers = 1}, {}, true},
      {"serial NOWAIT then pool",
       {.workers = 1, .use_io_uring = false, .nowait_pass = NowaitPass::kSerial},
       {},
       true},
      {"cold io_uring", {.workers = 1}, {}, false},
      {"cold pool", {.workers = 1, .use_io_uring = false}, {}, false},
      {"O_DIRECT", {.workers = 1}, {.mode = ReadMode::kDirect}, false},
  };
  for (auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      auto engine = RequireEngine(c.options);
      REQUIRE(engine->AddTable(table.get(), c.table).ok());
      if (c.warm) {
        Warm(*table);
      } else {
        Evict(*table);
      }
      const std::vector<uint64_t> rows = {5, last, 7};
      std::vector<uint8_t> out;
      const absl::Status s = GatherInto(*engine, *table, rows, out);
      INFO(s.ToString());
      REQUIRE(s.code() == absl::StatusCode::kDataLoss);
      CHECK(s.message().find(path) != std::string::npos);
      CHECK(s.message().find("row 999") != std::string::npos);
      CHECK(s.message().find(absl::StrCat("ended at byte ", cut)) != std::string::npos);
      CHECK(StatsOf(*engine).errors == 1);
    }
  }
}

TEST_CASE("EINTR is retried on the NOWAIT pass and in the pool", "[gather][paths]") {
  auto table = Open(Files().packed);
  Evict(*table);
  std::atomic<uint64_t> calls{0};
  GatherEngineOptions o{.workers = 1, .use_io_uring = false};
  o.read_fn = [&](int fd, const iovec* iov, int cnt, off_t off, int flags) -> ssize_t {
    if (calls.fetch_add(1) % 2 == 0) return -EINTR;
    return RealRead(fd, iov, cnt, off, flags);
  };
  auto engine = RequireEngine(o);
  REQUIRE(engine->AddTable(table.get(), {}).ok());
  const auto rows = SpreadRows(30);
  std::vector<uint8_t> out;
  REQUIRE(GatherInto(*engine, *table, rows, out).ok());
  CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
  CHECK(StatsOf(*engine).eintr_retries >= rows.size());
}

TEST_CASE("O_DIRECT tables read aligned page runs, byte-exact in both layouts", "[gather]") {
  for (const std::string& path : {Files().ckpt, Files().packed}) {
    auto table = Open(path);
    for (bool uring : {true, false}) {
      auto engine = RequireEngine({.workers = 2, .use_io_uring = uring, .split_reads = 256});
      REQUIRE(engine->AddTable(table.get(), {.mode = ReadMode::kDirect}).ok());
      auto rows = RandomRows(2000, 5);
      rows.push_back(kRows - 1);  // the last row, at the end of the file
      rows.push_back(0);
      std::vector<uint8_t> out;
      REQUIRE(GatherInto(*engine, *table, rows, out).ok());
      CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
      const auto s = StatsOf(*engine);
      CHECK(s.direct_reads > 0);
      CHECK(s.nowait_hits == 0);
      CHECK(s.mode == ReadMode::kDirect);
    }
  }
}

// The emulated device (GatherEngineOptions::emulated_device, benchmarking only). Every bound
// is a lower one: a loaded machine makes a gather slower, never faster than the emulated device
// allows, so the checks cannot fail from load; a device that ignored the emulation would finish
// these reads in well under a millisecond each and fail them.
TEST_CASE("An emulated device holds O_DIRECT reads to its latency and rate, bytes unchanged",
          "[gather]") {
  auto table = Open(Files().paged);
  REQUIRE(table->parts()[0].paged());
  // Rows on pages three apart: one 4 KiB read each, no page run joins two.
  auto pages_apart = [](uint64_t n) {
    std::vector<uint64_t> rows;
    for (uint64_t page = 0; page < 3 * n; page += 3) rows.push_back(page * 15 + page % 15);
    return rows;
  };
  struct Case {
    const char* name;
    bool uring;
    GatherEngineOptions::EmulatedDevice device;
    uint64_t reads;
    uint64_t at_least_ns;  // what the emulated device needs for `reads` reads
  };
  const std::vector<Case> cases = {
      // Reads on the ring overlap: the latency is paid once per flush, not per read.
      {"io_uring, latency", true, {.latency_ns = 50'000'000}, 100, 50'000'000},
      // The rate is one schedule: 100 reads at 2,000/s take 50 ms however deep the queue.
      {"io_uring, rate", true, {.iops = 2000}, 100, 100 * 500'000},
      // Blocking reads, one after the other: each waits out the latency.
      {"pool, latency", false, {.latency_ns = 20'000'000}, 5, 5 * 20'000'000},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      GatherEngineOptions o{.workers = 1, .use_io_uring = c.uring};
      o.emulated_device = c.device;
      auto engine = RequireEngine(o);
      REQUIRE(engine->AddTable(table.get(), {.mode = ReadMode::kDirect}).ok());
      const std::vector<uint64_t> rows = pages_apart(c.reads);
      std::vector<uint8_t> out;
      const uint64_t start = NowNs();
      REQUIRE(GatherInto(*engine, *table, rows, out).ok());
      const uint64_t took = NowNs() - start;
      CHECK(took >= c.at_least_ns);
      CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
      const auto s = StatsOf(*engine);
      CHECK(s.direct_reads == c.reads);
      CHECK(s.emulated_reads == c.reads);
      // The real reads answered before their emulated time (a read of a 4 KiB page takes far
      // less than 20 ms or than its turn at 2,000/s) and were held: at least one was.
      CHECK(s.emulated_holds >= 1);
    }
  }
  SECTION("off: no read is paced") {
    auto engine = RequireEngine({.workers = 1});
    REQUIRE(engine->AddTable(table.get(), {.mode = ReadMode::kDirect}).ok());
    const std::vector<uint64_t> rows = pages_apart(100);
    std::vector<uint8_t> out;
    REQUIRE(GatherInto(*engine, *table, rows, out).ok());
    CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
    CHECK(StatsOf(*engine).direct_reads == 100);
    CHECK(StatsOf(*engine).emulated_reads == 0);
  }
}

TEST_CASE("O_DIRECT reads of a paged table are one page a row, same-page rows one read",
          "[gather]") {
  auto table = Open(Files().paged);
  REQUIRE(table->parts()[0].paged());
  auto unpaged = Open(Files().packed);
  auto ckpt = Open(Files().ckpt);
  for (bool uring : {true, false}) {
    DYNAMIC_SECTION((uring ? "io_uring" : "pool")) {
      // Rows on pages at least two apart (so no page run joins them), plus second and third
      // rows of some of those pages: one 4 KiB read for each page, whatever row of it.
      std::vector<uint64_t> rows;
      for (uint64_t page = 0; page < 400; page += 3) rows.push_back(page * 15 + page % 15);
      const size_t pages = rows.size();
      for (uint64_t page = 0; page < 400; page += 9) {
        rows.push_back(page * 15 + 14);
        rows.push_back(page * 15 + 7);
      }
      rows.push_back(kRows - 1);  // the last page, partly filled
      auto engine = RequireEngine({.workers = 1, .use_io_uring = uring});
      REQUIRE(engine->AddTable(table.get(), {.mode = ReadMode::kDirect}).ok());
      std::vector<uint8_t> out;
      REQUIRE(GatherInto(*engine, *table, rows, out).ok());
      CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
      const auto s = StatsOf(*engine);
      CHECK(s.direct_reads == pages + 1);
      CHECK(s.bytes_read == (pages + 1) * 4096);

      // The same rows of the unpaged layout: a row straddling two pages reads both; the
      // checkpoint reads values and scales apart, two reads a row.
      for (const Table* other : {unpaged.get(), ckpt.get()}) {
        auto e2 = RequireEngine({.workers = 1, .use_io_uring = uring});
        REQUIRE(e2->AddTable(other, {.mode = ReadMode::kDirect}).ok());
        std::vector<uint64_t> spread;
        for (uint64_t i = 0; i < 100; ++i) spread.push_back(i * 150 + 15);  // 39 KB apart
        REQUIRE(GatherInto(*e2, *other, spread, out).ok());
        CHECK(FirstMismatch(kSeed, *other, spread, out.data()) == -1);
        const auto o = StatsOf(*e2);
        if (other->layout() == TableLayout::kCheckpoint) {
          CHECK(o.direct_reads > spread.size());  // values apart from their scales
        } else {
          CHECK(o.bytes_read > spread.size() * 4096);  // some rows straddle a page
        }
      }
    }
  }
}

TEST_CASE("bad batches are refused before anything is read", "[gather]") {
  auto table = Open(Files().packed);
  auto other = Open(Files().ckpt);
  auto engine = RequireEngine({.workers = 1, .max_batch_rows = 100});
  REQUIRE(engine->AddTable(table.get(), {}).ok());
  CHECK(engine->AddTable(table.get(), {}).code() == absl::StatusCode::kAlreadyExists);
  std::vector<uint8_t> out(200 * kRowBytes);

  std::vector<uint64_t> rows = {1, 2, kRows + 5};
  absl::Status s = engine->Gather({.table = table.get(), .rows = rows, .dest = out.data()});
  CHECK(s.code() == absl::StatusCode::kOutOfRange);
  CHECK(s.message().find(absl::StrCat("row ", kRows + 5)) != std::string::npos);
  CHECK(s.message().find("batch index 2") != std::string::npos);
  CHECK(StatsOf(*engine).read_calls == 0);

  rows = {1, 2};
  s = engine->Gather({.table = other.get(), .rows = rows, .dest = out.data()});
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(s.message().find("not added") != std::string::npos);

  std::vector<uint64_t> many(101, 1);
  s = engine->Gather({.table = table.get(), .rows = many, .dest = out.data()});
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);

  std::vector<uint64_t> offsets = {0};
  s = engine->Gather(
      {.table = table.get(), .rows = rows, .dest = out.data(), .dest_offsets = offsets});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  s = engine->Gather({.table = table.get(), .rows = rows, .dest = nullptr});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);

  CHECK(GatherEngine::Create({.ring_entries = 0}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the planner de-duplicates and merges adjacent and same-page reads", "[gather]") {
  auto ckpt = Open(Files().ckpt);
  auto packed = Open(Files().packed);
  const std::vector<uint64_t> rows = {5, 6, 7, 5, 20000, 7};
  std::vector<uint8_t> out(rows.size() * kRowBytes);
  GatherPlan plan;
  GatherPlanner merging({});
  REQUIRE(merging.Plan({.table = packed.get(), .rows = rows, .dest = out.data()}, &plan).ok());
  CHECK(plan.unique_rows == std::vector<uint64_t>{5, 6, 7, 20000});
  CHECK(plan.copies.size() == 2);
  CHECK(plan.reads.size() == 2);  // rows 5-7 are adjacent in the packed file
  CHECK(plan.reads[0].length == 3 * kRowBytes);
  CHECK(plan.reads[0].iov_count == 3);

  // Checkpoint: values of 5-7 adjacent (1 read), their scales too; row 20000's scales are
  // 160 KB away, so 4 reads in all.
  REQUIRE(merging.Plan({.table = ckpt.get(), .rows = rows, .dest = out.data()}, &plan).ok());
  CHECK(plan.reads.size() == 4);
  // Rows 5 and 10: each part is one read when both rows' bytes start on one page (the gap
  // goes to the sink), two reads when a page boundary falls between them.
  const std::vector<uint64_t> near = {5, 10};
  REQUIRE(merging.Plan({.table = ckpt.get(), .rows = near, .dest = out.data()}, &plan).ok());
  size_t want = 0;
  for (const RowPart& p : ckpt->parts()) {
    const uint64_t end5 = p.FileOffset(5) + p.bytes, start10 = p.FileOffset(10);
    want += (end5 - 1) / PageBytes() == start10 / PageBytes() ? 1 : 2;
  }
  CHECK(plan.reads.size() == want);
  const PlannedRead& scales = plan.reads.back();
  if (scales.iov_count == 3) CHECK(plan.iov_unique[scales.iov_begin + 1] == kGapIov);

  GatherPlanner plain({.merge = false});
  REQUIRE(plain.Plan({.table = ckpt.get(), .rows = rows, .dest = out.data()}, &plan).ok());
  CHECK(plan.reads.size() == 8);
}

TEST_CASE("radix sort orders keys like std::sort", "[gather]") {
  std::mt19937_64 rng(1);
  for (size_t n : {0, 1, 255, 256, 5000}) {
    for (int bits : {1, 11, 23, 46, 64}) {
      std::vector<uint64_t> keys(n), tmp;
      const uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
      for (auto& k : keys) k = rng() & mask;
      auto want = keys;
      std::sort(want.begin(), want.end());
      RadixSortU64(keys, bits, tmp);
      CHECK(keys == want);
    }
  }
}

TEST_CASE("latency percentiles come from the histogram", "[gather]") {
  TableGatherStats s;
  CHECK(s.LatencyPercentileNs(0.5) == 0);
  s.latency_buckets.assign(64, 0);
  s.latency_buckets[10] = 98;  // [1024, 2048) ns
  s.latency_buckets[20] = 1;
  s.latency_buckets[30] = 1;
  CHECK(s.LatencyPercentileNs(0.5) == 2048);
  CHECK(s.LatencyPercentileNs(0.99) == (2u << 20));
  CHECK(s.LatencyPercentileNs(0.999) == (2u << 30));
  auto engine = RequireEngine({.workers = 1});
  auto table = Open(Files().packed);
  REQUIRE(engine->AddTable(table.get(), {}).ok());
  std::vector<uint8_t> out;
  for (int i = 0; i < 5; ++i) REQUIRE(GatherInto(*engine, *table, SpreadRows(10), out).ok());
  const auto st = StatsOf(*engine);
  uint64_t n = 0;
  for (auto b : st.latency_buckets) n += b;
  CHECK(n == 5);
  CHECK(st.LatencyPercentileNs(0.5) > 0);
}

TEST_CASE("Submit runs batches on the workers and reports each outcome once", "[gather]") {
  auto table = Open(Files().ckpt);
  auto engine = RequireEngine({.workers = 2});
  REQUIRE(engine->AddTable(table.get(), {}).ok());
  constexpr int kBatches = 8;
  std::vector<std::vector<uint64_t>> rows(kBatches);
  std::vector<std::vector<uint8_t>> out(kBatches);
  std::mutex mu;
  std::condition_variable cv;
  int done = 0, failed = 0;
  for (int i = 0; i < kBatches; ++i) {
    rows[i] = RandomRows(700, 100 + i);
    out[i].resize(rows[i].size() * kRowBytes);
    engine->Submit({.table = table.get(), .rows = rows[i], .dest = out[i].data()},
                   [&](absl::Status s) {
                     std::lock_guard<std::mutex> l(mu);
                     ++done;
                     if (!s.ok()) ++failed;
                     cv.notify_all();
                   });
  }
  std::vector<uint64_t> bad = {kRows};
  std::vector<uint8_t> bad_out(kRowBytes);
  absl::Status bad_status;
  engine->Submit({.table = table.get(), .rows = bad, .dest = bad_out.data()}, [&](absl::Status s) {
    std::lock_guard<std::mutex> l(mu);
    bad_status = s;
    ++done;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return done == kBatches + 1; });
  CHECK(failed == 0);
  CHECK(bad_status.code() == absl::StatusCode::kOutOfRange);
  for (int i = 0; i < kBatches; ++i)
    CHECK(FirstMismatch(kSeed, *table, rows[i], out[i].data()) == -1);
}

TEST_CASE("several threads gather at once, large batches split over the workers", "[gather]") {
  auto ckpt = Open(Files().ckpt);
  auto packed = Open(Files().packed);
  auto engine = RequireEngine({.workers = 3, .split_reads = 256});
  REQUIRE(engine->AddTable(ckpt.get(), {}).ok());
  REQUIRE(engine->AddTable(packed.get(), {}).ok());
  Evict(*ckpt);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const Table& table = t % 2 ? *ckpt : *packed;
      for (int b = 0; b < 6; ++b) {
        const auto rows = RandomRows(b % 2 ? 3000 : 300, t * 100 + b);
        std::vector<uint8_t> out;
        if (!GatherInto(*engine, table, rows, out).ok()) bad++;
        if (FirstMismatch(kSeed, table, rows, out.data()) != -1) bad++;
        if (t == 3 && b == 2) Evict(table);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
  uint64_t requested = 0;
  for (const auto& s : engine->Stats()) requested += s.rows_requested;
  CHECK(requested == 4 * 3 * (3000 + 300));
}

TEST_CASE("a removed table's files leave the rings; a table opened in its place reads right",
          "[gather]") {
  auto engine = RequireEngine({.workers = 1});
  for (int round = 0; round < 3; ++round) {
    // Alternate layouts: the new table often reuses the old one's address and fd numbers.
    auto table = Open(round % 2 ? Files().packed : Files().ckpt);
    REQUIRE(engine->AddTable(table.get(), {}).ok());
    const auto rows = RandomRows(500, round);
    std::vector<uint8_t> out;
    REQUIRE(GatherInto(*engine, *table, rows, out).ok());
    CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
    REQUIRE(engine->RemoveTable(table.get()).ok());
    CHECK(engine->RemoveTable(table.get()).code() == absl::StatusCode::kNotFound);
    CHECK(engine->Stats().empty());
  }
}

TEST_CASE("a batch that finds the cache gone cold stops its NOWAIT pass after one wave",
          "[gather][paths][nowait]") {
  auto table = Open(Files().packed);
  Warm(*table);
  RefusableNowait seam(false);
  GatherEngineOptions o{.workers = 1, .use_io_uring = false};
  o.probe_reads = 32;
  o.split_reads = 1024;  // one chunk: every chunk of a split batch runs its own first wave
  o.read_fn = seam.Fn();
  auto engine = RequireEngine(o);
  REQUIRE(engine->AddTable(table.get(), {}).ok());
  const auto rows = SpreadRows(300);
  std::vector<uint8_t> out;
  REQUIRE(GatherInto(*engine, *table, rows, out).ok());
  CHECK(seam.calls == rows.size());  // all resident: the whole pass runs
  REQUIRE(StatsOf(*engine).nowait_enabled);
  seam.refuse = true;
  seam.calls = 0;
  REQUIRE(GatherInto(*engine, *table, rows, out).ok());
  CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
  CHECK(seam.calls == 32);  // one wave, then straight to the residue path
  const auto s = StatsOf(*engine);
  CHECK(s.nowait_eagain == 32);
  CHECK_FALSE(s.nowait_enabled);
}

}  // namespace
}  // namespace engram
