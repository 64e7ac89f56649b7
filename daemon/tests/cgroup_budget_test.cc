// The DGX Spark configuration (docs/operations.md, "DGX Spark"; docs/row-store.md, "What to
// configure") in small: both tables of the cache tier, a small `[memory] budget` (96 MiB and
// 320 MiB), and engramd in a memory cgroup with the limits of the drop-in `engramd
// --memory-dropin` prints for that budget. Clients gather from several sessions at once through
// tables larger than the budget until the row cache is full and evicting, with every byte
// checked; the daemon must not be OOM-killed, the cgroup must stay under its limit, and `engramctl
// status` must show how the budget is split. A client asking for more arena than the budget's
// share gets an error that names the budget.
// Skips (77) without root, without a writable memory cgroup, under an emulator, or in a sanitizer
// build.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/config.h"
#include "daemon/tests/cgroup_test_util.h"
#include "engram/engram.h"
#include "testkit/daemon_test_util.h"

namespace engram::testing {
namespace {

// Two tables of this many rows: 2 x 700,000 x 264 B = 370 MB, more than either budget.
constexpr uint64_t kTableRows = 700'000;
constexpr uint32_t kClients = 4;
constexpr uint64_t kClientDataBytes = 1ull << 20;  // a 2,048-row batch and its ids
constexpr uint64_t kBatchRows = 2048;

// The synthetic checkpoint of kTableRows rows, written once, its pages dropped from the page
// cache so that what engramd reads is charged to its cgroup.
const std::string& BigModel() {
  static const std::string dir = [] {
    const std::string d = TestDir() + "/spark-model";
    SynthOptions o{.out_dir = d, .rows = kTableRows, .seed = kSeed};
    if (absl::Status s = WriteSyntheticCheckpoint(o); !s.ok()) {
      std::fprintf(stderr, "writing %s: %s\n", d.c_str(), s.ToString().c_str());
      std::abort();
    }
    for (const auto& e : std::filesystem::directory_iterator(d)) {
      const int fd = open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      fdatasync(fd);
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      close(fd);
    }
    return d;
  }();
  return dir;
}

// engramd's flags for the Spark's cache tier under `budget`. The test's machine is small: two
// gather workers (as the daemon harness gives it) and two request threads; and a budget this
// small cannot hold the bookkeeping of 131,072-row requests on every request thread (engramd
// refuses to start, saying so), so requests are bounded to 8,192 rows.
std::vector<std::string> SparkFlags(uint64_t budget) {
  return {"--memory-budget",        std::to_string(budget),
          "--default-tier",         "cache",
          "--request-threads",      "2",
          "--max-rows-per-request", "8192"};
}

// What one client did: batches gathered, batches with a wrong byte, and the first failure.
struct ClientResult {
  uint64_t batches = 0;
  uint64_t bad_batches = 0;
  std::string error;
};

// One client: sweeps its quarter of both tables in order (which fills the cache and makes it
// evict), and every third batch re-reads rows at random from the whole table.
void RunClient(const Daemon& daemon, uint32_t index, ClientResult* ret) {
  engram_connect_options opts = daemon.Options(kClientDataBytes, 4);
  engram_session* s = nullptr;
  if (engram_session_open(&opts, &s) != 0) {
    ret->error = std::string("connect: ") + engram_last_error();
    return;
  }
  uint64_t* rows = nullptr;
  uint8_t* out = nullptr;
  if (engram_alloc(s, kBatchRows * sizeof(uint64_t), reinterpret_cast<void**>(&rows)) != 0 ||
      engram_alloc(s, kBatchRows * kRowBytes, reinterpret_cast<void**>(&out)) != 0) {
    ret->error = std::string("alloc: ") + engram_last_error();
    engram_session_close(s);
    return;
  }
  const uint64_t quarter = kTableRows / kClients;
  for (uint64_t first = index * quarter, n = 0; first < (index + 1) * quarter; ++n) {
    const uint32_t layer = n % 2 == 0 ? 1 : 14;
    const uint64_t count = std::min(kBatchRows, (index + 1) * quarter - first);
    if (n % 3 == 2) {
      FillRows(rows, count, kTableRows, n * kClients + index);
    } else {
      for (uint64_t i = 0; i < count; ++i) rows[i] = first + i;
      if (layer == 14) first += count;
    }
    engram_gather_request req{
        .size = sizeof req, .layer = layer, .rows = rows, .num_rows = count, .dest = out};
    if (engram_gather(s, &req, 30'000'000'000) != 0) {
      ret->error = "gather: " + std::string(engram_last_error());
      break;
    }
    ++ret->batches;
    ret->bad_batches += FirstBadRow(layer, rows, count, out) >= 0;
  }
  engram_session_close(s);
}

// Runs the clients while sampling the cgroup's charge; returns the highest sample.
uint64_t GatherFromClients(const Daemon& daemon, const TestCgroup& cg,
                           std::vector<ClientResult>* ret_results) {
  ret_results->assign(kClients, {});
  std::atomic<uint32_t> running{kClients};
  std::vector<std::thread> clients;
  for (uint32_t i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      RunClient(daemon, i, &(*ret_results)[i]);
      running.fetch_sub(1);
    });
  }
  uint64_t highest = 0;
  while (running.load() != 0) {
    highest = std::max(highest, cg.Current());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (std::thread& t : clients) t.join();
  return std::max(highest, cg.Current());
}

void CheckSplit(const nlohmann::json& status, uint64_t budget) {
  const nlohmann::json& m = status["memory"];
  INFO(m.dump());
  REQUIRE(m.contains("split"));
  const nlohmann::json& split = m["split"];
  uint64_t sum = 0;
  for (const char* piece :
       {"process_bytes", "buffers_bytes", "arenas_bytes", "page_cache_bytes", "store_bytes"}) {
    REQUIRE(split.contains(piece));
    sum += split[piece].get<uint64_t>();
  }
  CHECK(sum == budget);
  CHECK(m["budget_bytes"] == budget);
  // The row store holds no more than its share, and the cache took what it left.
  const nlohmann::json& store = status["store"];
  CHECK(store["budget_bytes"] == split["store_bytes"]);
  CHECK(store["store_bytes"].get<uint64_t>() <= split["store_bytes"].get<uint64_t>());
}

void RunSparkBudget(uint64_t budget) {
  std::vector<std::string> dropin_flags = SparkFlags(budget);
  dropin_flags.insert(dropin_flags.end(), {"--workers", "2"});
  const auto [high, max] = DropInLimits(dropin_flags);
  TestCgroup cg("engram-budget-test-" + std::to_string(getpid()) + "-" + std::to_string(budget),
                high, max);
  if (cg.version == 0) {
    Skip(
        "no writable memory cgroup (cgroup v2 with the memory controller at /sys/fs/cgroup, "
        "or the v1 memory controller at /sys/fs/cgroup/memory)");
  }
  std::fprintf(stderr, "budget %lu: cgroup v%d at %s, MemoryHigh %lu, MemoryMax %lu\n",
               static_cast<unsigned long>(budget), cg.version, cg.dir.c_str(),
               static_cast<unsigned long>(high), static_cast<unsigned long>(max));
  const std::string real_engramd = EngramdPath();
  setenv("ENGRAMD", cg.Wrapper(TestDir() + "/engramd-in-" + std::to_string(budget)).c_str(), 1);
  Daemon daemon(SparkFlags(budget), "spark-" + std::to_string(budget), BigModel());
  setenv("ENGRAMD", real_engramd.c_str(), 1);
  REQUIRE(daemon.alive());

  const auto start = std::chrono::steady_clock::now();
  std::vector<ClientResult> results;
  const uint64_t highest = GatherFromClients(daemon, cg, &results);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t batches = 0;
  for (const ClientResult& r : results) {
    INFO("client: " << r.error);
    CHECK(r.error.empty());
    CHECK(r.bad_batches == 0);
    batches += r.batches;
  }
  std::fprintf(stderr,
               "budget %lu: %lu batches of %lu rows in %.1f s; charged at most %lu (sampled), "
               "peak %lu, limit %lu, OOM kills %lu\n",
               static_cast<unsigned long>(budget), static_cast<unsigned long>(batches),
               static_cast<unsigned long>(kBatchRows), seconds, static_cast<unsigned long>(highest),
               static_cast<unsigned long>(cg.Peak()), static_cast<unsigned long>(max),
               static_cast<unsigned long>(cg.OomKills()));
  CHECK(cg.OomKills() == 0);
  REQUIRE(SocketAnswers(daemon.socket()));
  CHECK(highest <= max);
  CHECK(cg.Peak() <= max);

  const nlohmann::json status = Ctl(daemon, "status");
  INFO(status.dump());
  CheckSplit(status, budget);
  // The cache is full and evicting: the sweep read more rows than it holds.
  const nlohmann::json& cache = status["store"]["cache"];
  CHECK(cache["used_rows"] == cache["capacity_rows"]);
  CHECK(cache["evictions"].get<uint64_t>() > 0);

  // An arena larger than what the budget's arena share has left is refused, and the client is
  // told why.
  engram_connect_options opts = daemon.Options(budget, 4);
  engram_session* s = nullptr;
  const int rc = engram_session_open(&opts, &s);
  INFO(engram_last_error());
  CHECK(rc == -ENOSPC);
  CHECK(std::string(engram_last_error()).find("memory.budget") != std::string::npos);
  if (rc == 0) engram_session_close(s);
}

// The budget's process allowance is a plain build's: a sanitizer's runtime (shadow memory,
// ASan's quarantine) adds memory no budget can foresee, and the cgroup rightly kills it.
void SkipUnderSanitizers() {
#if defined(ABSL_HAVE_ADDRESS_SANITIZER) || defined(ABSL_HAVE_THREAD_SANITIZER)
  Skip("a sanitizer build's engramd holds its runtime's shadow memory on top of the budget");
#endif
}

TEST_CASE("the DGX Spark setup stays within a 96 MiB budget's cgroup") {
  SkipWithoutCgroups();
  SkipUnderSanitizers();
  RunSparkBudget(96ull << 20);
}

TEST_CASE("the DGX Spark setup stays within a 320 MiB budget's cgroup") {
  SkipWithoutCgroups();
  SkipUnderSanitizers();
  RunSparkBudget(320ull << 20);
}

}  // namespace
}  // namespace engram::testing
