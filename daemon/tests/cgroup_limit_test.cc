// engramd inside a memory cgroup smaller than its tables, as the DGX Spark profile runs it: the
// test creates the cgroup (v2 with the memory controller, else the legacy v1 controller), starts
// engramd in it with the limits of the drop-in `engramd --memory-dropin` prints for the budget,
// reads every row of both tables from disk through it with every byte checked, and then checks
// that the cgroup never went above its limit, nothing was OOM-killed, the daemon still serves,
// and `engramctl status` reports the cgroup, its limit and the throttling it saw.
// Skips (77) without root, without a writable memory cgroup, or under an emulator.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "daemon/ops/cgroup_memory.h"
#include "daemon/tests/cgroup_test_util.h"
#include "engram/engram.h"
#include "testkit/daemon_test_util.h"

namespace engram::testing {
namespace {

constexpr uint64_t kLimit = 96ull << 20;
// Two tables of this many rows: 2 x 400,000 x 264 B = 211 MB, over twice the limit.
constexpr uint64_t kBigRows = 400'000;
constexpr uint64_t kBatchRows = 8192;

// Drops the file's pages from the page cache, so engramd's reads are charged to its cgroup.
void EvictFiles(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const int fd = open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

struct ReadTotals {
  uint64_t highest = 0;  // the cgroup's charge, sampled after each batch
  uint64_t bad_batches = 0;
  uint64_t rows_read = 0;
};

// Reads every row of both tables through `daemon` in batches of kBatchRows, checking every byte.
ReadTotals ReadEveryRow(const Daemon& daemon, TestCgroup& cg) {
  // A data region for one batch and its ids: the arenas get a quarter of the budget.
  engram_connect_options opts = daemon.Options(3ull << 20, 4);
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&opts, &s) == 0);
  uint64_t* rows = nullptr;
  uint8_t* out = nullptr;
  REQUIRE(engram_alloc(s, kBatchRows * sizeof(uint64_t), reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, kBatchRows * kRowBytes, reinterpret_cast<void**>(&out)) == 0);
  ReadTotals t;
  for (uint32_t layer : {1u, 14u}) {
    for (uint64_t first = 0; first < kBigRows; first += kBatchRows) {
      const uint64_t n = std::min(kBatchRows, kBigRows - first);
      for (uint64_t i = 0; i < n; ++i) rows[i] = first + i;
      engram_gather_request req{
          .size = sizeof req, .layer = layer, .rows = rows, .num_rows = n, .dest = out};
      INFO("layer " << layer << " rows from " << first << ": " << engram_last_error());
      REQUIRE(engram_gather(s, &req, 30'000'000'000) == 0);
      t.bad_batches += FirstBadRow(layer, rows, n, out) >= 0;
      t.rows_read += n;
      t.highest = std::max(t.highest, cg.Current());
    }
  }
  engram_session_close(s);
  return t;
}

TEST_CASE("engramd serves tables larger than its memory cgroup, within the limit") {
  SkipWithoutCgroups();
  // Requests of at most kBatchRows rows: a budget this small cannot hold the bookkeeping of
  // 131,072-row requests on every request thread (engramd refuses to start, saying so).
  const std::vector<std::string> flags = {"--memory-budget", std::to_string(kLimit),
                                          "--max-rows-per-request", std::to_string(kBatchRows)};
  std::vector<std::string> dropin_flags = flags;
  dropin_flags.insert(dropin_flags.end(), {"--workers", "2"});
  const auto [high, max] = DropInLimits(dropin_flags);
  REQUIRE(max == kLimit);
  TestCgroup cg("engram-limit-test-" + std::to_string(getpid()), high, max);
  if (cg.version == 0) {
    Skip(
        "no writable memory cgroup (cgroup v2 with the memory controller at /sys/fs/cgroup, "
        "or the v1 memory controller at /sys/fs/cgroup/memory)");
  }
  std::fprintf(stderr, "memory cgroup v%d at %s, limit %lu bytes\n", cg.version, cg.dir.c_str(),
               static_cast<unsigned long>(kLimit));

  const std::string model = TestDir() + "/big-model";
  SynthOptions o{.out_dir = model, .rows = kBigRows, .seed = kSeed};
  REQUIRE(WriteSyntheticCheckpoint(o).ok());
  EvictFiles(model);

  // engramd joins the cgroup before it starts: a wrapper writes its own pid, then execs it.
  const std::string wrapper = cg.Wrapper(TestDir() + "/engramd-in-cgroup");
  const std::string real_engramd = EngramdPath();
  setenv("ENGRAMD", wrapper.c_str(), 1);
  Daemon daemon(flags, "cgroup", model);
  setenv("ENGRAMD", real_engramd.c_str(), 1);
  REQUIRE(daemon.alive());
  REQUIRE(ReadText(cg.dir + "/cgroup.procs").find(std::to_string(daemon.pid())) !=
          std::string::npos);

  const ReadTotals t = ReadEveryRow(daemon, cg);
  const uint64_t highest = t.highest, bad_batches = t.bad_batches, rows_read = t.rows_read;
  const uint64_t table_bytes = 2 * kBigRows * kRowBytes;
  std::fprintf(stderr,
               "read %lu rows (%lu bytes of table data) through a %lu-byte cgroup; charged at "
               "most %lu bytes (sampled), peak %lu\n",
               static_cast<unsigned long>(rows_read), static_cast<unsigned long>(table_bytes),
               static_cast<unsigned long>(kLimit), static_cast<unsigned long>(highest),
               static_cast<unsigned long>(cg.Peak()));
  CHECK(bad_batches == 0);
  CHECK(table_bytes > 2 * kLimit);
  CHECK(highest <= kLimit);
  CHECK(cg.Peak() <= kLimit);
  CHECK(cg.OomKills() == 0);
  CHECK(daemon.alive());
  CHECK(SocketAnswers(daemon.socket()));

  // engramctl status reports the cgroup and the limit the daemon was held to.
  const nlohmann::json m = Ctl(daemon, "status")["memory"];
  INFO(m.dump());
  CHECK(m["cgroup_version"] == cg.version);
  CHECK(m["cgroup"] == cg.dir);
  CHECK(m["max_bytes"] == kLimit);
  CHECK(m["budget_bytes"] == kLimit);
  // Reading more than the limit made the kernel reclaim at the limit (v2: at memory.high first).
  CHECK(m["high_events"].get<uint64_t>() + m["max_events"].get<uint64_t>() > 0);
  CHECK(m["oom_kills"] == 0);
}

}  // namespace
}  // namespace engram::testing
