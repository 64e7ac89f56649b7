// The row store through engramd: a resident table and a cached table (cache much smaller than
// the table) served byte-exact to client processes, scattered and duplicate rows included, hits
// answered without the engine, the tiers, hit rates and cache shown by engramctl, and warm refused
// for tables that do not read through the page cache.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "base/page_size.h"
#include "engram/engram.h"
#include "nlohmann/json.hpp"
#include "protocol/store_counters.h"
#include "testkit/daemon_test_util.h"
#include "tests/common/skip.h"

using engram::kRowBytes;
using nlohmann::json;
using namespace engram::testing;

namespace {

json TableEntry(const json& reply, uint32_t layer) {
  for (const json& t : reply["tables"]) {
    if (t["layer"] == layer) return t;
  }
  FAIL("no layer " << layer << " in " << reply.dump());
  return {};
}

// A gather of `rows` (in the data region) into `out` with dest_offsets `offsets`; the result and
// engram_last_error() (empty on success).
std::pair<int, std::string> Gather(engram_session* s, uint32_t layer, const uint64_t* rows,
                                   uint64_t n, uint8_t* out, const uint64_t* offsets,
                                   uint32_t flags) {
  engram_gather_request r{.size = sizeof(r),
                          .layer = layer,
                          .flags = flags,
                          .rows = rows,
                          .num_rows = n,
                          .dest = out,
                          .dest_offsets = offsets};
  const int rc = engram_gather(s, &r, 10'000'000'000);
  return {rc, rc == 0 ? "" : engram_last_error()};
}

// A client process: `batches` gathers of `n` rows from `layer`, drawn from the first `span` rows
// (a working set), scattered into the arena in reverse order, every byte checked. Exit code 0
// when every row matched. `flags`: the requests' (by default through engramd, whose row store
// these tests are about; ENGRAM_GATHER_IN_PLACE reads in place).
int GatherChecked(const Daemon& d, uint32_t layer, uint64_t n, uint64_t span, int batches,
                  uint64_t seed, uint32_t flags = ENGRAM_GATHER_VIA_DAEMON) {
  engram_connect_options o = d.Options(n * (kRowBytes + 16) + (1 << 20), 8);
  engram_session* s = nullptr;
  if (engram_session_open(&o, &s) != 0) return 10;
  uint64_t *rows, *offsets;
  uint8_t* out;
  if (engram_alloc(s, n * 8, reinterpret_cast<void**>(&rows)) != 0 ||
      engram_alloc(s, n * 8, reinterpret_cast<void**>(&offsets)) != 0 ||
      engram_alloc(s, n * kRowBytes, reinterpret_cast<void**>(&out)) != 0) {
    return 11;
  }
  for (uint64_t i = 0; i < n; ++i) offsets[i] = (n - 1 - i) * kRowBytes;
  for (int b = 0; b < batches; ++b) {
    FillRows(rows, n, span, seed * 1000 + b);
    rows[n - 1] = rows[0];  // a duplicate in every batch
    std::memset(out, 0xEE, n * kRowBytes);
    if (Gather(s, layer, rows, n, out, offsets, flags).first != 0) return 12;
    if (FirstBadRow(layer, rows, n, out, offsets) >= 0) return 13;
  }
  engram_session_close(s);
  return 0;
}

int InChild(const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A session of its own and its read-only map of a resident layer; unmapped and closed at the
// end of the scope.
struct MappedLayer {
  MappedLayer(const Daemon& d, uint32_t layer) {
    engram_connect_options o = d.Options(1 << 20, 4);
    REQUIRE(engram_session_open(&o, &session) == 0);
    REQUIRE(engram_table_map_open(session, layer, &map) == 0);
    REQUIRE(engram_get_table_map_info(map, &info) == 0);
  }
  ~MappedLayer() {
    engram_table_map_close(map);
    CloseSession();
  }
  void CloseSession() {
    engram_session_close(session);
    session = nullptr;
  }
  engram_session* session = nullptr;
  engram_table_map* map = nullptr;
  engram_table_map_info info{.size = sizeof(info)};
};

// Layer 14 resident, layer 1 cached in 1 MiB (~3,600 rows of its 20,000).
const Daemon& StoreDaemon() {
  static Daemon d({"--tier", "14=resident", "--tier", "1=cache", "--cache-bytes", "1M"}, "store");
  return d;
}

void WaitResident(const Daemon& d) {
  for (int i = 0; i < 500; ++i) {
    if (TableEntry(Ctl(d, "tables --no-residency"), 14)["resident_loaded"] == true) return;
    usleep(10000);
  }
  FAIL("layer 14 did not become resident");
}

TEST_CASE("a resident table serves every row byte-exact without the engine", "[store]") {
  const Daemon& d = StoreDaemon();
  REQUIRE(d.alive());
  WaitResident(d);
  const json before = TableEntry(Ctl(d, "stats"), 14);
  const json status_before = Ctl(d, "status");
  REQUIRE(InChild([&] { return GatherChecked(d, 14, 1152, kRows, 20, 1); }) == 0);
  REQUIRE(InChild([&] { return GatherChecked(d, 14, 20000, kRows, 2, 2); }) == 0);
  const json after = TableEntry(Ctl(d, "stats"), 14);
  // status counts the rows clients asked for, those answered from memory included.
  const json status_after = Ctl(d, "status");
  CHECK(status_after["rows_served"].get<uint64_t>() -
            status_before["rows_served"].get<uint64_t>() ==
        20 * 1152 + 2 * 20000);
  CHECK(status_after["batches"].get<uint64_t>() - status_before["batches"].get<uint64_t>() == 22);
  CHECK(after["tier"] == "resident");
  CHECK(after["store_requests"].get<uint64_t>() - before["store_requests"].get<uint64_t>() == 22);
  CHECK(after["store_all_hit_requests"].get<uint64_t>() -
            before["store_all_hit_requests"].get<uint64_t>() ==
        22);
  // Every row came from memory: the engine ran no batch for the table.
  CHECK(after["batches"] == before["batches"]);
  const json tables = TableEntry(Ctl(d, "tables --no-residency"), 14);
  CHECK(tables["resident_rows_loaded"] == kRows);
  CHECK(tables["resident_memory_bytes"].get<uint64_t>() >= kRows * kRowBytes);
}

TEST_CASE("a cached table smaller than its cache serves byte-exact hits and misses", "[store]") {
  const Daemon& d = StoreDaemon();
  REQUIRE(d.alive());
  // A working set of 1,500 rows fits the cache: after the first passes, batches hit.
  REQUIRE(InChild([&] { return GatherChecked(d, 1, 1152, 1500, 30, 3); }) == 0);
  // Rows from the whole table: mostly misses, read with O_DIRECT and admitted.
  REQUIRE(InChild([&] { return GatherChecked(d, 1, 1152, kRows, 10, 4); }) == 0);
  // Several processes at once over a working set larger than the cache: eviction under readers.
  std::vector<pid_t> kids;
  for (int c = 0; c < 3; ++c) {
    pid_t pid = fork();
    if (pid == 0) _exit(GatherChecked(d, 1, 1152, 6000, 20, 10 + c));
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
  }
  const json stats = TableEntry(Ctl(d, "stats"), 1);
  CHECK(stats["tier"] == "cache");
  CHECK(stats["read_mode"] == "direct");
  CHECK(stats["store_all_hit_requests"].get<uint64_t>() > 0);
  CHECK(stats["store_hit_rate"].get<double>() > 0.2);
  CHECK(stats["store_hit_rate"].get<double>() < 1.0);
  const json status = Ctl(d, "status");
  const json& store = status["store"];
  CHECK(store["cache"]["evictions"].get<uint64_t>() > 0);
  CHECK(store["cache"]["used_rows"].get<uint64_t>() <=
        store["cache"]["capacity_rows"].get<uint64_t>());
  CHECK(store["cache"]["bytes"].get<uint64_t>() <= uint64_t{1} << 20);
  CHECK(store["store_bytes"].get<uint64_t>() >= kRows * kRowBytes);
}

TEST_CASE("a gather of a row outside the table fails as it does from storage", "[store]") {
  const Daemon& d = StoreDaemon();
  for (uint32_t layer : {1u, 14u}) {
    const int rc = InChild([&] {
      engram_connect_options o = d.Options(1 << 20, 4);
      engram_session* s = nullptr;
      if (engram_session_open(&o, &s) != 0) return 10;
      uint64_t* rows;
      uint8_t* out;
      engram_alloc(s, 16, reinterpret_cast<void**>(&rows));
      engram_alloc(s, 2 * kRowBytes, reinterpret_cast<void**>(&out));
      rows[0] = 5;
      rows[1] = kRows;  // one past the end
      engram_gather_request r{
          .size = sizeof(r), .layer = layer, .rows = rows, .num_rows = 2, .dest = out};
      const int got = engram_gather(s, &r, 10'000'000'000);
      const std::string error = engram_last_error();
      engram_session_close(s);
      return got == -ERANGE || error.find(std::to_string(kRows)) != std::string::npos ? 0 : 20;
    });
    INFO("layer " << layer);
    CHECK(rc == 0);
  }
}

TEST_CASE("the metrics show tiers, store bytes, hits and evictions", "[store]") {
  const Daemon& d = StoreDaemon();
  const std::string text = Ctl(d, "metrics")["text"];
  for (const char* want :
       {"engram_memory_budget_bytes 0\n", "engram_store_bytes",
        "engram_store_table_info{table=\"1\",tier=\"cache\"}",
        "engram_store_table_info{table=\"14\",tier=\"resident\"}",
        "engram_store_hit_rows_total{table=\"1\"}", "engram_store_all_hit_requests_total",
        "engram_cache_evictions_total", "engram_cache_capacity_rows"}) {
    INFO(want);
    CHECK(text.find(want) != std::string::npos);
  }
}

// engramctl's label of a counter: its JSON key with spaces for underscores.
std::string Label(std::string key) {
  std::replace(key.begin(), key.end(), '_', ' ');
  return key + " ";
}

TEST_CASE("every row store counter of the lists shows in the JSON, metrics and engramctl",
          "[store]") {
  const Daemon& d = StoreDaemon();
  WaitResident(d);
  REQUIRE(InChild([&] { return GatherChecked(d, 1, 100, 1000, 2, 5); }) == 0);
  const json cache = Ctl(d, "status")["store"]["cache"];
  const json stats = Ctl(d, "stats"), tables = Ctl(d, "tables --no-residency");
  const std::string metrics = Ctl(d, "metrics")["text"];
  const std::string base = Engramctl() + " --socket " + d.socket() + " ";
  const std::string status_text = RunCommand(base + "status").second;
  const std::string stats_text = RunCommand(base + "stats").second;
  const std::string tables_text = RunCommand(base + "tables --no-residency").second;
#define ROW_CACHE_(field, json_key, type, metric, help)                         \
  {                                                                             \
    INFO(json_key);                                                             \
    CHECK(cache.contains(json_key));                                            \
    CHECK(metrics.find(std::string("\n") + metric + " ") != std::string::npos); \
    CHECK(status_text.find(Label(json_key)) != std::string::npos);              \
  }
  ENGRAM_ROW_CACHE_COUNTERS(ROW_CACHE_)
#undef ROW_CACHE_
  // Layer 14 is resident (every counter), layer 1 cached (those of both tiers).
  const json resident = TableEntry(stats, 14), cached = TableEntry(stats, 1);
#define STORE_TABLE_(field, json_key, tiers, type, metric, help)                               \
  {                                                                                            \
    INFO(json_key);                                                                            \
    const bool both = std::string_view(#tiers) == "MEMORY";                                    \
    CHECK(resident.contains(json_key));                                                        \
    CHECK(cached.contains(json_key) == both);                                                  \
    CHECK(TableEntry(tables, 14).contains(json_key) == !both);                                 \
    CHECK(metrics.find(std::string(metric) + "{table=\"14\"}") != std::string::npos);          \
    CHECK((metrics.find(std::string(metric) + "{table=\"1\"}") != std::string::npos) == both); \
    CHECK(stats_text.find(Label(json_key)) != std::string::npos);                              \
    if (!both) CHECK(tables_text.find(Label(json_key)) != std::string::npos);                  \
  }
  ENGRAM_STORE_TABLE_COUNTERS(STORE_TABLE_)
#undef STORE_TABLE_
  CHECK(cache["hits"].get<uint64_t>() + cache["misses"].get<uint64_t>() > 0);
  CHECK(cache["inserts"].get<uint64_t>() > 0);
}

// Runs engramd with `args` on the test checkpoint; returns (exit code, output).
std::pair<int, std::string> Engramd(const std::string& args) {
  return RunCommand(EngramdPath() + " --model " + Checkpoint() + " --socket " + TestDir() +
                    "/check.sock " + args + " 2>&1");
}

TEST_CASE("--check-config shows tiers and refuses store settings that cannot work", "[store]") {
  auto [code, out] = Engramd("--tier 14=resident --tier 1=cache --cache-bytes 1M --check-config");
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("layer 14") != std::string::npos);
  CHECK(out.find("tier resident") != std::string::npos);
  CHECK(out.find("tier cache") != std::string::npos);
  std::tie(code, out) = Engramd("--tier 9=resident --check-config");
  CHECK(code == 1);
  CHECK(out.find("layer 9") != std::string::npos);
  std::tie(code, out) = Engramd("--tier 1=cache --check-config");
  CHECK(code == 1);
  CHECK(out.find("the cache needs a size") != std::string::npos);
  std::tie(code, out) = Engramd("--tier 14=resident --memory-budget 1M --check-config");
  CHECK(code == 1);
  CHECK(out.find("[memory] budget") != std::string::npos);
}

TEST_CASE("a budget too small for a resident table stops engramd naming the table", "[store]") {
  // 72 MiB holds the process, buffers and shares of two workers and two request threads of
  // 8,192-row requests, and leaves the row store less than layer 14's 6 MiB.
  const auto [code, out] =
      RunCommand(EngramdPath() + " --model " + Checkpoint() + " --socket " + TestDir() +
                 "/budget.sock --tier 14=resident --workers 2 --request-threads 2 " +
                 "--max-rows-per-request 8192 --memory-budget 72M 2>&1");
  INFO(out);
  CHECK(code == 1);
  CHECK(out.find("layer 14") != std::string::npos);
  CHECK(out.find("[memory] budget") != std::string::npos);
}

TEST_CASE("a client maps a resident table read-only and gathers from it", "[store][map]") {
  const Daemon& d = StoreDaemon();
  WaitResident(d);
  MappedLayer m(d, 14);
  const engram_table_map_info& info = m.info;
  engram_table_map* map = m.map;
  CHECK(info.layer == 14);
  CHECK(info.row_bytes == kRowBytes);
  CHECK(info.covered_begin == 0);
  CHECK(info.covered_end == kRows);
  REQUIRE(info.map_bytes >= kRows * kRowBytes);
  // In place: every row of the table.
  const auto* base = static_cast<const uint8_t*>(info.base);
  std::vector<uint64_t> all(kRows);
  for (uint64_t r = 0; r < kRows; ++r) all[r] = r;
  CHECK(FirstBadRow(14, all.data(), kRows, base) == -1);
  // The CPU gather of random rows.
  std::vector<uint64_t> rows(1152);
  FillRows(rows.data(), rows.size(), kRows, 77);
  std::vector<uint8_t> out(rows.size() * kRowBytes);
  REQUIRE(engram_table_map_gather(map, rows.data(), rows.size(), out.data()) == 0);
  CHECK(FirstBadRow(14, rows.data(), rows.size(), out.data()) == -1);
  rows[5] = kRows;
  CHECK(engram_table_map_gather(map, rows.data(), rows.size(), out.data()) == -ERANGE);
  CHECK(std::string(engram_last_error()).find("index 5") != std::string::npos);
  // Read-only for good: the mapping cannot be made writable.
  CHECK(mprotect(const_cast<void*>(info.base), 4096, PROT_READ | PROT_WRITE) == -1);
  m.CloseSession();  // the mapping outlives the session
  CHECK(FirstBadRow(14, all.data(), 100, base) == -1);
}

TEST_CASE("a table mapped the moment its load ends comes sealed", "[store][map]") {
  // The last rows land, then the memfd is sealed: a client asking in between must hear "still
  // loading", never get the unsealed memfd (which it refuses). Each round races fresh loads.
  for (int round = 0; round < 10; ++round) {
    Daemon d({"--tier", "1=resident", "--tier", "14=resident"}, "map-race");
    REQUIRE(d.alive());
    engram_connect_options o = d.Options(1 << 20, 4);
    engram_session* s = nullptr;
    REQUIRE(engram_session_open(&o, &s) == 0);
    for (uint32_t layer : {1u, 14u}) {
      engram_table_map* map = nullptr;
      int rc = -EAGAIN;
      for (int tries = 0; rc == -EAGAIN && tries < 20000; ++tries) {
        rc = engram_table_map_open(s, layer, &map);
        if (rc == -EAGAIN) usleep(200);
      }
      const std::string why = rc == 0 ? "" : engram_last_error();
      INFO("round " << round << ", layer " << layer << ": " << rc << " " << why);
      REQUIRE(rc == 0);
      engram_table_map_close(map);
    }
    engram_session_close(s);
  }
}

TEST_CASE("mapping a table that is not resident is refused naming why", "[store][map]") {
  const Daemon& d = StoreDaemon();
  engram_connect_options o = d.Options(1 << 20, 4);
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  engram_table_map* map = nullptr;
  CHECK(engram_table_map_open(s, 1, &map) == -EOPNOTSUPP);
  const std::string why = engram_last_error();
  CHECK(why.find("layer 1") != std::string::npos);
  CHECK(why.find("not resident") != std::string::npos);
  CHECK(engram_table_map_open(s, 7, &map) == -ENOENT);
  CHECK(std::string(engram_last_error()).find("layer 7") != std::string::npos);
  CHECK(map == nullptr);
  // The session still serves gathers after the refusals.
  uint64_t* rows;
  uint8_t* out;
  REQUIRE(engram_alloc(s, 8, reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, kRowBytes, reinterpret_cast<void**>(&out)) == 0);
  rows[0] = 3;
  engram_gather_request r{.size = sizeof(r), .layer = 1, .rows = rows, .num_rows = 1, .dest = out};
  REQUIRE(engram_gather(s, &r, 10'000'000'000) == 0);
  CHECK(FirstBadRow(1, rows, 1, out) == -1);
  engram_session_close(s);
}

// Runs engramctl with `args` (no --json), returning its exit status and standard output.
std::pair<int, std::string> CtlText(const Daemon& d, const std::string& args) {
  return RunCommand(Engramctl() + " " + args + " --socket " + d.socket() + " 2>&1");
}

TEST_CASE("engramctl load starts, cancels and resumes a resident table's load", "[store][load]") {
  // Not loaded at start, and read at 1 MB/s: the first 16,384-row chunk (4.3 MB) takes ~4 s to
  // be due, so the load is still running when it is cancelled.
  Daemon d({"--tier", "14=resident", "--no-load-at-start", "--load-rate", "1M"}, "load");
  REQUIRE(d.alive());
  json t = TableEntry(Ctl(d, "tables --no-residency"), 14);
  CHECK(t["resident_load_state"] == "waiting");
  CHECK(t["resident_rows_loaded"] == 0);
  // Served from storage meanwhile, byte-exact, gathers that ask to read in place included.
  REQUIRE(InChild([&] { return GatherChecked(d, 14, 1152, kRows, 3, 7); }) == 0);
  const uint64_t requests = TableEntry(Ctl(d, "stats"), 14)["store_requests"];
  REQUIRE(InChild([&] {
            return GatherChecked(d, 14, 1152, kRows, 3, 7, ENGRAM_GATHER_IN_PLACE);
          }) == 0);
  CHECK(TableEntry(Ctl(d, "stats"), 14)["store_requests"] == requests + 3);

  // A table of another tier, or none, is refused naming it.
  auto [code, out] = CtlText(d, "load 1");
  CHECK(code == 1);
  CHECK(out.find("layer 1") != std::string::npos);
  CHECK(out.find("storage tier") != std::string::npos);
  std::tie(code, out) = CtlText(d, "load 9");
  CHECK(code == 1);
  CHECK(out.find("no table for layer 9") != std::string::npos);

  json s = Ctl(d, "load 14 --no-wait");
  CHECK((s["state"] == "queued" || s["state"] == "loading"));
  for (int i = 0; i < 500 && s["rows_loaded"] == 0; ++i) {
    usleep(10000);
    s = TableEntry(Ctl(d, "tables --no-residency"), 14);
    s["rows_loaded"] = s["resident_rows_loaded"];
  }
  REQUIRE(s["rows_loaded"] == 16384);
  s = Ctl(d, "load 14 --cancel");
  for (int i = 0; i < 500 && s["state"] != "cancelled"; ++i) {
    usleep(10000);
    s = Ctl(d, "load 14 --cancel");
  }
  REQUIRE(s["state"] == "cancelled");
  REQUIRE(s["rows_loaded"] == 16384);  // the rows loaded stay

  // Rows below the watermark come from memory, the others from storage: all byte-exact.
  const json before = TableEntry(Ctl(d, "stats"), 14);
  REQUIRE(InChild([&] { return GatherChecked(d, 14, 1152, kRows, 5, 8); }) == 0);
  const json after = TableEntry(Ctl(d, "stats"), 14);
  const uint64_t rows = after["store_rows"].get<uint64_t>() - before["store_rows"].get<uint64_t>();
  const uint64_t hits =
      after["store_hit_rows"].get<uint64_t>() - before["store_hit_rows"].get<uint64_t>();
  CHECK(rows == 5 * 1152);
  CHECK(hits > 0);
  CHECK(hits < rows);
  CHECK(after["batches"].get<uint64_t>() > before["batches"].get<uint64_t>());

  // Resumed: the load ends with every row and only the rows not loaded were read again (the
  // remaining 3,616 rows are under a second's worth at 1 MB/s).
  std::tie(code, out) = CtlText(d, "load 14");
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("loaded, 20000 of 20000 rows") != std::string::npos);
  t = TableEntry(Ctl(d, "tables --no-residency"), 14);
  CHECK(t["resident_load_state"] == "loaded");
  CHECK(t["resident_loaded"] == true);
  const json loaded = TableEntry(Ctl(d, "stats"), 14);
  REQUIRE(InChild([&] { return GatherChecked(d, 14, 1152, kRows, 3, 9); }) == 0);
  const json last = TableEntry(Ctl(d, "stats"), 14);
  CHECK(last["store_hit_rows"].get<uint64_t>() - loaded["store_hit_rows"].get<uint64_t>() ==
        3 * 1152);
  // Loading a loaded table again is a no-op that says so.
  CHECK(Ctl(d, "load 14")["state"] == "loaded");
  // Loaded: gathers that ask to read in place no longer reach the daemon, which counts them
  // from the session's touch page (nothing read from storage).
  REQUIRE(InChild([&] {
            return GatherChecked(d, 14, 1152, kRows, 3, 10, ENGRAM_GATHER_IN_PLACE);
          }) == 0);
  const json in_place = TableEntry(Ctl(d, "stats"), 14);
  CHECK(in_place["store_requests"].get<uint64_t>() == last["store_requests"].get<uint64_t>() + 3);
  CHECK(in_place["store_hit_rows"].get<uint64_t>() ==
        last["store_hit_rows"].get<uint64_t>() + 3 * 1152);
  CHECK(in_place["batches"] == last["batches"]);
}

// The default-size huge pages of /proc/meminfo and /proc/sys/vm (what MFD_HUGETLB takes): how many
// are in use, and how many more a process could have (free reserved pages, and surplus pages that
// vm.nr_overcommit_hugepages still allows).
struct HugePages {
  uint64_t in_use = 0, available = 0;
};

HugePages ReadHugePages() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  uint64_t total = 0, free = 0, surplus = 0, n = 0;
  while (std::getline(in, line)) {
    if (sscanf(line.c_str(), "HugePages_Total: %" SCNu64, &n) == 1) total = n;
    if (sscanf(line.c_str(), "HugePages_Free: %" SCNu64, &n) == 1) free = n;
    if (sscanf(line.c_str(), "HugePages_Surp: %" SCNu64, &n) == 1) surplus = n;
  }
  uint64_t overcommit = 0;
  std::ifstream("/proc/sys/vm/nr_overcommit_hugepages") >> overcommit;
  return {total - free, free + (overcommit > surplus ? overcommit - surplus : 0)};
}

// `engramctl warm` on a table whose gathers do not read the page cache: refused with exit 1,
// naming the table, its tier and what helps instead.
void CheckWarmRefused(const Daemon& d, uint32_t layer, const std::vector<std::string>& names) {
  auto [code, out] = CtlText(d, "warm " + std::to_string(layer));
  INFO(out);
  CHECK(code == 1);
  CHECK(out.find("not warming layer " + std::to_string(layer) + ": ") != std::string::npos);
  CHECK(out.find("would only fill the page cache") != std::string::npos);
  for (const std::string& n : names) CHECK(out.find(n) != std::string::npos);
}

TEST_CASE("warm refuses resident, cached and O_DIRECT tables, naming the tier", "[store][warm]") {
  const Daemon& d = StoreDaemon();
  CheckWarmRefused(d, 14, {"resident tier", "engramctl load 14"});
  CheckWarmRefused(d, 1, {"cache tier", "O_DIRECT", "[memory] cache or budget"});
  auto [code, out] = CtlText(d, "warm 1 --rows 0:10 --json");
  CHECK(code == 1);
  const json j = json::parse(out);
  CHECK(j["exit_code"] == 1);
  CHECK(j["error"].get<std::string>().find("cache tier") != std::string::npos);
  // Evicting stays allowed: it only gives memory back.
  CHECK(Ctl(d, "evict 1 --rows 0:10")["done_to"] == 10);

  // A storage table beside a resident one is warmed; one read with O_DIRECT is not.
  Daemon mixed({"--tier", "14=resident"}, "warm-mixed");
  REQUIRE(mixed.alive());
  CHECK(Ctl(mixed, "warm 1 --rows 0:100")["done_to"] == 100);
  CheckWarmRefused(mixed, 14, {"resident tier"});
  Daemon direct({"--read-mode", "direct"}, "warm-direct");
  REQUIRE(direct.alive());
  CheckWarmRefused(direct, 14, {"storage tier read with O_DIRECT", "tables.read_mode"});
}

TEST_CASE("where the kernel has huge pages to give, a resident table lives on them",
          "[store][hugetlb]") {
  const uint64_t kHugePage = engram::HugePageBytes();
  if (kHugePage == 0) ENGRAM_SKIP("the kernel has no hugetlb pages");
  const uint64_t needed = (kRows * kRowBytes + kHugePage - 1) / kHugePage;
  const HugePages before = ReadHugePages();
  if (before.available < needed) {
    ENGRAM_SKIP("fewer than " + std::to_string(needed) + " " + engram::PageSizeName(kHugePage) +
                " huge pages to have (allow surplus ones with sysctl "
                "vm.nr_overcommit_hugepages=64, as the package does, or reserve them with "
                "vm.nr_hugepages=32): the hugetlb path of resident tables cannot run here");
  }
  {
    Daemon d({"--tier", "14=resident"}, "hugetlb");
    REQUIRE(d.alive());
    WaitResident(d);
    const json t = TableEntry(Ctl(d, "tables --no-residency"), 14);
    CHECK(t["resident_huge_pages"] == true);
    CHECK(t["resident_memory_bytes"].get<uint64_t>() % kHugePage == 0);
    CHECK(ReadHugePages().in_use >= before.in_use + needed);
    REQUIRE(InChild([&] { return GatherChecked(d, 14, 1152, kRows, 5, 11); }) == 0);
    // Sealed like any resident table: clients map it read-only and read it in place.
    REQUIRE(InChild([&] {
              return GatherChecked(d, 14, 1152, kRows, 5, 12, ENGRAM_GATHER_IN_PLACE);
            }) == 0);
    MappedLayer m(d, 14);
    CHECK(m.info.map_bytes % kHugePage == 0);
    std::vector<uint64_t> all(kRows);
    for (uint64_t r = 0; r < kRows; ++r) all[r] = r;
    CHECK(FirstBadRow(14, all.data(), kRows, static_cast<const uint8_t*>(m.info.base)) == -1);
    CHECK(mprotect(const_cast<void*>(m.info.base), kHugePage, PROT_READ | PROT_WRITE) == -1);
  }
  // The daemon gone and the mapping with it, the pages are given back (surplus ones to the
  // kernel, reserved ones to the pool).
  for (int i = 0; i < 200 && ReadHugePages().in_use > before.in_use; ++i) usleep(10000);
  CHECK(ReadHugePages().in_use == before.in_use);
}

TEST_CASE("ENGRAM_GATHER_IN_PLACE reads a resident table in the client, others through engramd",
          "[store][map]") {
  const Daemon& d = StoreDaemon();
  WaitResident(d);
  const uint64_t n = 1152;
  engram_connect_options o = d.Options(n * (kRowBytes + 16) + (1 << 20), 4);
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  uint64_t *rows, *offsets;
  uint8_t* out;
  REQUIRE(engram_alloc(s, n * 8, reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, n * 8, reinterpret_cast<void**>(&offsets)) == 0);
  REQUIRE(engram_alloc(s, n * kRowBytes, reinterpret_cast<void**>(&out)) == 0);
  for (uint64_t i = 0; i < n; ++i) offsets[i] = (n - 1 - i) * kRowBytes;
  FillRows(rows, n, kRows, 31);
  rows[n - 1] = rows[0];

  // The resident table: byte-exact, scattered, and the daemon serves none of the requests (it
  // counts them from the session's touch page: see "rows read in place ... count" below).
  const json before = TableEntry(Ctl(d, "stats"), 14);
  for (int b = 0; b < 3; ++b) {
    std::memset(out, 0xEE, n * kRowBytes);
    REQUIRE(Gather(s, 14, rows, n, out, offsets, ENGRAM_GATHER_IN_PLACE).first == 0);
    CHECK(FirstBadRow(14, rows, n, out, offsets) == -1);
  }
  CHECK(TableEntry(Ctl(d, "stats"), 14)["batches"] == before["batches"]);
  engram_session_stats stats{.size = sizeof(stats)};
  REQUIRE(engram_get_session_stats(s, &stats) == 0);
  CHECK(stats.rows_in_place == 3 * n);
  CHECK(stats.rows == 0);

  // The cached table: the rows its cache holds are copied here, the others gathered by the
  // daemon (cache_in_place_test.cc tests this path).
  std::memset(out, 0xEE, n * kRowBytes);
  REQUIRE(Gather(s, 1, rows, n, out, offsets, ENGRAM_GATHER_IN_PLACE).first == 0);
  CHECK(FirstBadRow(1, rows, n, out, offsets) == -1);
  REQUIRE(engram_get_session_stats(s, &stats) == 0);
  CHECK(stats.rows + stats.rows_in_place == 4 * n);
  const uint64_t rows_through_daemon = stats.rows;

  // Bad requests fail as they fail through the daemon: same code, same message.
  const auto same_failure = [&](uint32_t layer, const std::string& expect) {
    const auto [in_place_rc, in_place_error] =
        Gather(s, layer, rows, n, out, offsets, ENGRAM_GATHER_IN_PLACE);
    const auto [daemon_rc, daemon_error] =
        Gather(s, layer, rows, n, out, offsets, ENGRAM_GATHER_VIA_DAEMON);
    INFO(in_place_error << " / " << daemon_error);
    CHECK(in_place_rc == daemon_rc);
    CHECK(in_place_error.find(expect) != std::string::npos);
    CHECK(in_place_error.find("read in place") != std::string::npos);
    const std::string tail = daemon_error.substr(daemon_error.find("engramd: ") + 9);
    CHECK(in_place_error.find(tail) != std::string::npos);
  };
  const uint64_t saved = rows[5];
  rows[5] = kRows;
  same_failure(14, "row 20000 (index 5) is past the end of layer 14");
  rows[5] = saved;
  offsets[7] = uint64_t{1} << 40;
  same_failure(14, "destination of row index 7");
  offsets[7] = (n - 1 - 7) * kRowBytes;
  REQUIRE(Gather(s, 14, rows, n, out, offsets, ENGRAM_GATHER_IN_PLACE).first == 0);
  CHECK(FirstBadRow(14, rows, n, out, offsets) == -1);

  // Unknown flags are refused; engram_submit leaves an in-place request to the daemon.
  engram_gather_request r{.size = sizeof(r),
                          .layer = 14,
                          .flags = 0x80,
                          .rows = rows,
                          .num_rows = n,
                          .dest = out,
                          .dest_offsets = offsets};
  uint64_t ticket;
  CHECK(engram_submit(s, &r, &ticket) == -EINVAL);
  CHECK(std::string(engram_last_error()).find("unknown request flags 0x80") != std::string::npos);
  r.flags = ENGRAM_GATHER_IN_PLACE;
  REQUIRE(engram_submit(s, &r, &ticket) == 0);
  REQUIRE(engram_wait(s, ticket, 10'000'000'000) == 0);
  CHECK(FirstBadRow(14, rows, n, out, offsets) == -1);
  REQUIRE(engram_get_session_stats(s, &stats) == 0);
  CHECK(stats.rows == rows_through_daemon + n);
  engram_session_close(s);
}

// A session's counters of rows read in place and through engramd.
std::pair<uint64_t, uint64_t> InPlaceAndDaemonRows(engram_session* s) {
  engram_session_stats stats{.size = sizeof(stats)};
  REQUIRE(engram_get_session_stats(s, &stats) == 0);
  return {stats.rows_in_place, stats.rows};
}

// The rows of `layer` at `rows` gathered into `out` with `flags`; how many more rows the session
// then counts (in place, through engramd). Every byte is checked.
std::pair<uint64_t, uint64_t> GatherCounted(engram_session* s, uint32_t layer, uint64_t* rows,
                                            uint64_t n, uint8_t* out, uint32_t flags) {
  const auto [in_place, daemon] = InPlaceAndDaemonRows(s);
  std::memset(out, 0xEE, n * kRowBytes);
  const auto [rc, error] = Gather(s, layer, rows, n, out, nullptr, flags);
  INFO(error);
  REQUIRE(rc == 0);
  CHECK(FirstBadRow(layer, rows, n, out) == -1);
  const auto [in_place_after, daemon_after] = InPlaceAndDaemonRows(s);
  return {in_place_after - in_place, daemon_after - daemon};
}

TEST_CASE(
    "a plain engram_gather reads resident and cached tables in place; the opt-outs reach "
    "engramd",
    "[store][map]") {
  const Daemon& d = StoreDaemon();
  WaitResident(d);
  const uint64_t n = 512;
  engram_connect_options o = d.Options(2 * n * (kRowBytes + 16) + (1 << 20), 4);
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  uint64_t* rows;
  uint8_t *out, *via_daemon;
  REQUIRE(engram_alloc(s, n * 8, reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, n * kRowBytes, reinterpret_cast<void**>(&out)) == 0);
  REQUIRE(engram_alloc(s, n * kRowBytes, reinterpret_cast<void**>(&via_daemon)) == 0);
  FillRows(rows, n, kRows, 77);
  using Rows = std::pair<uint64_t, uint64_t>;  // (in place, through engramd)

  // Resident: no flag is the in-place path; ENGRAM_GATHER_VIA_DAEMON asks engramd for the same
  // bytes; ENGRAM_GATHER_IN_PLACE is still accepted.
  const json before = TableEntry(Ctl(d, "stats"), 14);
  CHECK(GatherCounted(s, 14, rows, n, out, 0) == Rows{n, 0});
  CHECK(GatherCounted(s, 14, rows, n, out, ENGRAM_GATHER_IN_PLACE) == Rows{n, 0});
  // engramd counts the two gathers read in place (from the touch page) and the one it served.
  CHECK(GatherCounted(s, 14, rows, n, via_daemon, ENGRAM_GATHER_VIA_DAEMON) == Rows{0, n});
  CHECK(std::memcmp(out, via_daemon, n * kRowBytes) == 0);
  CHECK(TableEntry(Ctl(d, "stats"), 14)["store_requests"].get<uint64_t>() ==
        before["store_requests"].get<uint64_t>() + 3);

  // Cache tier: a working set the 1 MiB cache holds, so that once engramd has read the rows a
  // plain gather copies them here, with no request.
  FillRows(rows, n, 1000, 78);
  CHECK(GatherCounted(s, 1, rows, n, via_daemon, ENGRAM_GATHER_VIA_DAEMON) == Rows{0, n});
  CHECK(GatherCounted(s, 1, rows, n, via_daemon, ENGRAM_GATHER_VIA_DAEMON) == Rows{0, n});
  const auto [cached_in_place, cached_daemon] = GatherCounted(s, 1, rows, n, out, 0);
  CHECK(cached_in_place + cached_daemon == n);
  CHECK(cached_in_place > n / 2);
  CHECK(std::memcmp(out, via_daemon, n * kRowBytes) == 0);

  // Both path flags at once are refused before anything is read.
  const auto [both_rc, both_error] =
      Gather(s, 14, rows, n, out, nullptr, ENGRAM_GATHER_IN_PLACE | ENGRAM_GATHER_VIA_DAEMON);
  CHECK(both_rc == -EINVAL);
  CHECK(both_error.find("give one") != std::string::npos);
  engram_session_close(s);

  // A session opened with ENGRAM_CONNECT_GATHER_VIA_DAEMON: plain gathers go to engramd, a
  // request with ENGRAM_GATHER_IN_PLACE is still read here.
  o.flags = ENGRAM_CONNECT_GATHER_VIA_DAEMON;
  REQUIRE(engram_session_open(&o, &s) == 0);
  REQUIRE(engram_alloc(s, n * 8, reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, n * kRowBytes, reinterpret_cast<void**>(&out)) == 0);
  FillRows(rows, n, kRows, 79);
  CHECK(GatherCounted(s, 14, rows, n, out, 0) == Rows{0, n});
  CHECK(GatherCounted(s, 14, rows, n, out, ENGRAM_GATHER_IN_PLACE) == Rows{n, 0});
  engram_session_close(s);

  // ENGRAM_IN_PLACE=0 does the same for every session of the process; another value is refused.
  const int env_rc = InChild([&] {
    engram_connect_options plain = d.Options(n * (kRowBytes + 8) + (1 << 20), 4);
    engram_session* e = nullptr;
    setenv("ENGRAM_IN_PLACE", "yes", 1);
    if (engram_session_open(&plain, &e) != -EINVAL) return 20;
    if (std::string(engram_last_error()).find("ENGRAM_IN_PLACE") == std::string::npos) return 21;
    setenv("ENGRAM_IN_PLACE", "0", 1);
    if (engram_session_open(&plain, &e) != 0) return 22;
    uint64_t* ids;
    uint8_t* dest;
    if (engram_alloc(e, n * 8, reinterpret_cast<void**>(&ids)) != 0 ||
        engram_alloc(e, n * kRowBytes, reinterpret_cast<void**>(&dest)) != 0) {
      return 23;
    }
    FillRows(ids, n, kRows, 80);
    if (Gather(e, 14, ids, n, dest, nullptr, 0).first != 0) return 24;
    if (FirstBadRow(14, ids, n, dest) != -1) return 25;
    engram_session_stats stats{.size = sizeof(stats)};
    if (engram_get_session_stats(e, &stats) != 0) return 26;
    if (stats.rows != n || stats.rows_in_place != 0) return 27;
    engram_session_close(e);
    return 0;
  });
  CHECK(env_rc == 0);
}

// The rows, gathers and all-hit gathers of `layer` engramd counts, and its status's rows_served
// and batches.
struct ServedCounts {
  uint64_t store_requests, store_all_hit_requests, store_rows, store_hit_rows, batches;
  uint64_t rows_served, status_batches;
  bool operator==(const ServedCounts&) const = default;
};
ServedCounts Served(const Daemon& d, uint32_t layer) {
  const json t = TableEntry(Ctl(d, "stats"), layer);
  const json status = Ctl(d, "status");
  return {t["store_requests"], t["store_all_hit_requests"], t["store_rows"],  t["store_hit_rows"],
          t["batches"],        status["rows_served"],       status["batches"]};
}
std::ostream& operator<<(std::ostream& o, const ServedCounts& c) {
  return o << "{requests " << c.store_requests << ", all-hit " << c.store_all_hit_requests
           << ", rows " << c.store_rows << ", hit rows " << c.store_hit_rows << ", engine batches "
           << c.batches << ", rows served " << c.rows_served << ", batches " << c.status_batches
           << "}";
}
ServedCounts operator-(const ServedCounts& a, const ServedCounts& b) {
  return {a.store_requests - b.store_requests,
          a.store_all_hit_requests - b.store_all_hit_requests,
          a.store_rows - b.store_rows,
          a.store_hit_rows - b.store_hit_rows,
          a.batches - b.batches,
          a.rows_served - b.rows_served,
          a.status_batches - b.status_batches};
}

// `pid`'s sessions' resident_rows_in_place in engramctl stats.
uint64_t ResidentRowsInPlace(const Daemon& d, pid_t pid) {
  uint64_t rows = 0;
  const json stats = Ctl(d, "stats");
  for (const json& e : stats["clients"]) {
    if (e["pid"] == pid) rows += e["resident_rows_in_place"].get<uint64_t>();
  }
  return rows;
}

TEST_CASE("rows read in place from a resident table count in engramd's statistics",
          "[store][map]") {
  const Daemon& d = StoreDaemon();
  WaitResident(d);
  const uint64_t n = 1152;
  // A client process: plain gathers (read in place), every byte checked, then it closes.
  const ServedCounts before = Served(d, 14);
  REQUIRE(InChild([&] { return GatherChecked(d, 14, n, kRows, 5, 91, 0); }) == 0);
  const ServedCounts after_child = Served(d, 14);
  // As if engramd had served them from memory: 5 all-hit gathers of n rows; the engine read
  // nothing.
  CHECK(after_child - before == ServedCounts{5, 5, 5 * n, 5 * n, 0, 5 * n, 5});

  // A session of this process: its own counter in engramctl stats, while it is open.
  engram_connect_options o = d.Options(n * (kRowBytes + 16) + (1 << 20), 4);
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  uint64_t* rows;
  uint8_t* out;
  REQUIRE(engram_alloc(s, n * 8, reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, n * kRowBytes, reinterpret_cast<void**>(&out)) == 0);
  FillRows(rows, n, kRows, 92);
  for (int b = 0; b < 3; ++b) {
    REQUIRE(Gather(s, 14, rows, n, out, nullptr, 0).first == 0);
    CHECK(FirstBadRow(14, rows, n, out) == -1);
  }
  engram_session_stats stats{.size = sizeof(stats)};
  REQUIRE(engram_get_session_stats(s, &stats) == 0);
  CHECK(stats.rows_in_place == 3 * n);
  CHECK(stats.rows == 0);
  CHECK(ResidentRowsInPlace(d, getpid()) == 3 * n);
  CHECK(Served(d, 14) - after_child == ServedCounts{3, 3, 3 * n, 3 * n, 0, 3 * n, 3});
  // The metrics count them too.
  const std::string text = Ctl(d, "metrics")["text"];
  const std::string metric = "engram_store_rows_total{table=\"14\"} ";
  const size_t at = text.find(metric);
  REQUIRE(at != std::string::npos);
  CHECK(std::stoull(text.substr(at + metric.size())) == Served(d, 14).store_rows);
  CHECK(text.find("engram_client_resident_rows_in_place_total") != std::string::npos);
  engram_session_close(s);

  // A session that asks engramd for its gathers adds only what engramd served.
  const ServedCounts before_daemon = Served(d, 14);
  REQUIRE(InChild([&] {
            return GatherChecked(d, 14, n, kRows, 2, 93, ENGRAM_GATHER_VIA_DAEMON);
          }) == 0);
  CHECK(Served(d, 14) - before_daemon == ServedCounts{2, 2, 2 * n, 2 * n, 0, 2 * n, 2});
}

TEST_CASE("a plain engram_gather of a storage-tier table goes through engramd", "[store][map]") {
  Daemon d({"--tier", "14=resident"}, "storage-tier");
  REQUIRE(d.alive());
  WaitResident(d);
  const uint64_t n = 256;
  engram_connect_options o = d.Options(n * (kRowBytes + 8) + (1 << 20), 4);
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  uint64_t* rows;
  uint8_t *out, *via_daemon;
  REQUIRE(engram_alloc(s, n * 8, reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, n * kRowBytes, reinterpret_cast<void**>(&out)) == 0);
  REQUIRE(engram_alloc(s, n * kRowBytes, reinterpret_cast<void**>(&via_daemon)) == 0);
  FillRows(rows, n, kRows, 81);
  using Rows = std::pair<uint64_t, uint64_t>;
  // Layer 1 is of the storage tier: no mapping to read, every gather is engramd's.
  CHECK(TableEntry(Ctl(d, "stats"), 1)["tier"] == "storage");
  engram_internal_set_last_error("before the gather");
  CHECK(GatherCounted(s, 1, rows, n, out, 0) == Rows{0, n});
  // The mapping the library asked for and was refused is not the caller's error.
  CHECK(std::string(engram_last_error()) == "before the gather");
  CHECK(GatherCounted(s, 1, rows, n, via_daemon, ENGRAM_GATHER_VIA_DAEMON) == Rows{0, n});
  CHECK(std::memcmp(out, via_daemon, n * kRowBytes) == 0);
  // The resident layer of the same daemon is read in place.
  CHECK(GatherCounted(s, 14, rows, n, out, 0) == Rows{n, 0});
  engram_session_close(s);
}

}  // namespace
