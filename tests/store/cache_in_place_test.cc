// Row cache hits read in place by the client (ENGRAM_GATHER_IN_PLACE on a cache-tier table):
// byte-exact from several processes while a tiny cache evicts all the time, only the misses sent
// to engramd, statistics as through engramd, and a hostile client: it cannot write or remap its
// mapping writable, cannot reopen the memfd for writing, is not served from a mapping whose
// daemon is gone, and cannot grow anything by flooding its touch page.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engram/engram.h"
#include "engram/gpu.h"
#include "engram/protocol.h"
#include "nlohmann/json.hpp"
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

// Layer 1 cached in 1 MiB (~3,600 rows of its 20,000), layer 14 from storage.
const Daemon& CacheDaemon() {
  static Daemon d({"--tier", "1=cache", "--cache-bytes", "1M"}, "incache");
  return d;
}

struct Client {
  explicit Client(const Daemon& d, uint64_t n = 1152) : n(n) {
    engram_connect_options o = d.Options(n * (kRowBytes + 16) + (1 << 20), 8);
    REQUIRE(engram_session_open(&o, &s) == 0);
    REQUIRE(engram_alloc(s, n * 8, reinterpret_cast<void**>(&rows)) == 0);
    REQUIRE(engram_alloc(s, n * 8, reinterpret_cast<void**>(&offsets)) == 0);
    REQUIRE(engram_alloc(s, n * kRowBytes, reinterpret_cast<void**>(&out)) == 0);
    for (uint64_t i = 0; i < n; ++i) offsets[i] = (n - 1 - i) * kRowBytes;
  }
  ~Client() { engram_session_close(s); }
  std::pair<int, std::string> Gather(uint32_t layer, uint32_t flags) {
    std::memset(out, 0xEE, n * kRowBytes);
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
  engram_session_stats Stats() {
    engram_session_stats st{.size = sizeof(st)};
    REQUIRE(engram_get_session_stats(s, &st) == 0);
    return st;
  }
  uint64_t n;
  engram_session* s = nullptr;
  uint64_t *rows = nullptr, *offsets = nullptr;
  uint8_t* out = nullptr;
};

int InChild(const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// This process's mapping of a memfd named `name`: its address and length (0 when none).
std::pair<uintptr_t, uint64_t> FindMapping(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("memfd:" + name) == std::string::npos) continue;
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &begin, &end) == 2) {
      return {begin, end - begin};
    }
  }
  return {0, 0};
}

TEST_CASE("in-place gathers of a cached table copy hits in the client, send only misses",
          "[incache]") {
  const Daemon& d = CacheDaemon();
  REQUIRE(d.alive());
  Client c(d);
  // A working set well inside the cache: through engramd twice, so every row is cached.
  FillRows(c.rows, c.n, 1500, 41);
  for (int i = 0; i < 2; ++i) REQUIRE(c.Gather(1, ENGRAM_GATHER_VIA_DAEMON).first == 0);
  REQUIRE(FirstBadRow(1, c.rows, c.n, c.out, c.offsets) == -1);

  // The same rows through engramd and in place: the same bytes and the same statistics.
  const auto deltas = [&](uint32_t flags) {
    const json t0 = TableEntry(Ctl(d, "stats"), 1);
    const json s0 = Ctl(d, "status")["store"]["cache"];
    REQUIRE(c.Gather(1, flags).first == 0);
    CHECK(FirstBadRow(1, c.rows, c.n, c.out, c.offsets) == -1);
    const json t1 = TableEntry(Ctl(d, "stats"), 1);
    const json s1 = Ctl(d, "status")["store"]["cache"];
    std::vector<uint64_t> out;
    for (const char* k : {"store_requests", "store_all_hit_requests", "store_rows",
                          "store_hit_rows"}) {
      out.push_back(t1[k].get<uint64_t>() - t0[k].get<uint64_t>());
    }
    out.push_back(s1["hits"].get<uint64_t>() - s0["hits"].get<uint64_t>());
    return out;
  };
  const engram_session_stats before = c.Stats();
  const std::vector<uint64_t> through = deltas(ENGRAM_GATHER_VIA_DAEMON);
  const engram_session_stats middle = c.Stats();
  const std::vector<uint64_t> in_place = deltas(ENGRAM_GATHER_IN_PLACE);
  const engram_session_stats after = c.Stats();
  CHECK(through == std::vector<uint64_t>{1, 1, c.n, c.n, c.n});
  CHECK(in_place == through);
  CHECK(middle.rows - before.rows == c.n);
  // Every row a hit: no request reached engramd, every row was copied here.
  CHECK(after.rows == middle.rows);
  CHECK(after.requests_submitted == middle.requests_submitted);
  CHECK(after.rows_in_place - middle.rows_in_place == c.n);
  // engramctl counts them for the session, from its touch page.
  uint64_t session_in_place = 0;
  const json clients = Ctl(d, "stats")["clients"];
  for (const json& e : clients) {
    if (e["pid"] == getpid()) session_in_place += e["cache_rows_in_place"].get<uint64_t>();
  }
  INFO(clients.dump());
  CHECK(session_in_place == after.rows_in_place);

  // Rows from the whole table: mostly misses, sent as one request into the same slots.
  FillRows(c.rows, c.n, kRows, 42);
  c.rows[c.n - 1] = c.rows[0];
  const engram_session_stats s0 = c.Stats();
  REQUIRE(c.Gather(1, ENGRAM_GATHER_IN_PLACE).first == 0);
  CHECK(FirstBadRow(1, c.rows, c.n, c.out, c.offsets) == -1);
  const engram_session_stats s1 = c.Stats();
  CHECK(s1.requests_submitted - s0.requests_submitted == 1);
  CHECK((s1.rows - s0.rows) + (s1.rows_in_place - s0.rows_in_place) == c.n);
  CHECK(s1.rows - s0.rows > c.n / 2);

  // A bad request fails as through engramd, naming the row.
  c.rows[5] = kRows;
  const auto [rc, why] = c.Gather(1, ENGRAM_GATHER_IN_PLACE);
  const auto [daemon_rc, daemon_why] = c.Gather(1, ENGRAM_GATHER_VIA_DAEMON);
  CHECK(rc == daemon_rc);
  CHECK(why.find("row 20000 (index 5) is past the end of layer 1") != std::string::npos);
  CHECK(daemon_why.find("row 20000 (index 5) is past the end of layer 1") != std::string::npos);

  // engram_table_map_open still refuses a cached table (its callers may not know info.kind);
  // engram_table_map_open_any maps its row cache (for a GPU); a table read from storage
  // (layer 14 here) has nothing to map.
  engram_table_map* map = nullptr;
  CHECK(engram_table_map_open(c.s, 1, &map) == -EOPNOTSUPP);
  CHECK(std::string(engram_last_error()).find("row cache") != std::string::npos);
  CHECK(engram_table_map_open_any(c.s, 14, &map) == -EOPNOTSUPP);
  CHECK(map == nullptr);
  REQUIRE(engram_table_map_open_any(c.s, 1, &map) == 0);
  engram_table_map_info info{.size = sizeof(info)};
  REQUIRE(engram_get_table_map_info(map, &info) == 0);
  CHECK(info.kind == ENGRAM_TABLE_MAP_ROW_CACHE);
  CHECK(info.layer == 1);
  CHECK(info.covered_end - info.covered_begin == kRows);
  CHECK(info.base != nullptr);
  CHECK(engram_table_map_check(map) == 0);
  // A CPU gather from it cannot say which rows it missed: refused, dest untouched.
  std::vector<uint8_t> dest(kRowBytes, 0xEE);
  CHECK(engram_table_map_gather(map, c.rows, 1, dest.data()) == -EOPNOTSUPP);
  CHECK(std::string(engram_last_error()).find("ENGRAM_GATHER_IN_PLACE") != std::string::npos);
  CHECK(dest == std::vector<uint8_t>(kRowBytes, 0xEE));
  // Without a GPU registration there is nothing to describe for a kernel.
  engram_gpu_row_cache gc{.size = sizeof(gc)};
  CHECK(engram_table_map_gpu_cache(map, nullptr, &gc) == -EINVAL);
  // Hits a GPU read in place reach the table's statistics as engram_gather's own do.
  const json t0 = TableEntry(Ctl(d, "stats"), 1);
  CHECK(engram_table_map_report_hits(map, 7, 1, nullptr, 0) == 0);
  const json t1 = TableEntry(Ctl(d, "stats"), 1);
  CHECK(t1["store_hit_rows"].get<uint64_t>() - t0["store_hit_rows"].get<uint64_t>() == 7);
  CHECK(t1["store_all_hit_requests"].get<uint64_t>() - t0["store_all_hit_requests"].get<uint64_t>() ==
        1);
  engram_table_map_close(map);
}

// A client process: `batches` in-place gathers over the first `span` rows, every byte checked.
int InPlaceChecked(const Daemon& d, uint64_t span, int batches, uint64_t seed) {
  const uint64_t n = 1152;
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
    std::memset(out, 0xEE, n * kRowBytes);
    engram_gather_request r{.size = sizeof(r),
                            .layer = 1,
                            .flags = ENGRAM_GATHER_IN_PLACE,
                            .rows = rows,
                            .num_rows = n,
                            .dest = out,
                            .dest_offsets = offsets};
    if (engram_gather(s, &r, 10'000'000'000) != 0) return 12;
    if (FirstBadRow(1, rows, n, out, offsets) >= 0) return 13;
  }
  engram_session_stats st{.size = sizeof(st)};
  if (engram_get_session_stats(s, &st) != 0 || st.rows_in_place == 0) return 14;
  engram_session_close(s);
  return 0;
}

TEST_CASE("several processes gather in place byte-exact while the cache evicts constantly",
          "[incache]") {
  const Daemon& d = CacheDaemon();
  const uint64_t evictions = Ctl(d, "status")["store"]["cache"]["evictions"].get<uint64_t>();
  std::vector<pid_t> kids;
  // Working sets of 3,000-5,000 rows each, 4 processes: together far more than the cache.
  for (int c = 0; c < 4; ++c) {
    pid_t pid = fork();
    if (pid == 0) _exit(InPlaceChecked(d, 3000 + 700 * c, 25, 20 + c));
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    INFO("exit " << WEXITSTATUS(status) << " (12: gather failed, 13: wrong bytes, 14: no hit)");
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
  }
  CHECK(Ctl(d, "status")["store"]["cache"]["evictions"].get<uint64_t>() > evictions + 10000);
}

TEST_CASE("a client cannot write its row cache mapping or reopen it writable", "[incache]") {
  const Daemon& d = CacheDaemon();
  Client c(d, 16);
  FillRows(c.rows, c.n, 100, 5);
  REQUIRE(c.Gather(1, ENGRAM_GATHER_IN_PLACE).first == 0);
  const auto [addr, len] = FindMapping("engram-row-cache");
  REQUIRE(addr != 0);
  void* p = reinterpret_cast<void*>(addr);
  // Mapped from a read-only descriptor: it cannot be made writable.
  CHECK(mprotect(p, len, PROT_READ | PROT_WRITE) == -1);
  CHECK(errno == EACCES);
  // A write through it faults.
  CHECK(InChild([&] {
          signal(SIGSEGV, SIG_DFL);  // not the test framework's handler
          *static_cast<volatile uint8_t*>(p) = 1;
          return 0;
        }) == 128 + SIGSEGV);
  // The mapping still reads.
  REQUIRE(c.Gather(1, ENGRAM_GATHER_IN_PLACE).first == 0);
  CHECK(FirstBadRow(1, c.rows, c.n, c.out, c.offsets) == -1);
}

TEST_CASE("the row cache memfd a client holds allows no write, seal, punch or writable reopen",
          "[incache][mapfiles]") {
  const Daemon& d = CacheDaemon();
  Client c(d, 16);
  FillRows(c.rows, c.n, 100, 5);
  REQUIRE(c.Gather(1, ENGRAM_GATHER_IN_PLACE).first == 0);
  const auto [addr, len] = FindMapping("engram-row-cache");
  REQUIRE(addr != 0);
  // The descriptor behind it allows no write, seal or hole punch, and its mode lets no one but
  // the daemon's user reopen it (for writing: not even that user, without CAP_DAC_OVERRIDE).
  char path[96];
  std::snprintf(path, sizeof(path), "/proc/self/map_files/%" PRIxPTR "-%" PRIxPTR, addr,
                addr + len);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    ENGRAM_SKIP(std::string("cannot open ") + path + " (needs CAP_SYS_ADMIN): " + strerror(errno));
  }
  struct stat st;
  REQUIRE(fstat(fd, &st) == 0);
  CHECK((st.st_mode & 07777) == S_IRUSR);
  CHECK(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
  CHECK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == -1);
  CHECK(ftruncate(fd, 0) == -1);
  CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) == -1);
  // A client of another user reopening it through /proc: refused.
  CHECK(InChild([&] {
          if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) return 3;
          prctl(PR_SET_DUMPABLE, 1);
          char again[64];
          std::snprintf(again, sizeof(again), "/proc/self/fd/%d", fd);
          const int w = open(again, O_RDWR);
          return w < 0 && errno == EACCES ? 0 : 1;
        }) == 0);
  close(fd);
}

TEST_CASE("a flooded touch page grows nothing and breaks nothing", "[incache]") {
  const Daemon& d = CacheDaemon();
  Client c(d);
  FillRows(c.rows, c.n, 1500, 7);
  REQUIRE(c.Gather(1, ENGRAM_GATHER_IN_PLACE).first == 0);
  const auto [addr, len] = FindMapping("engram-cache-touch");
  REQUIRE(addr != 0);
  auto* page = reinterpret_cast<engram_cache_touch_page*>(addr);
  // Garbage everywhere the client may write: the head far ahead, entries naming slots and keys
  // that do not exist, counters that go backwards.
  auto* ring = reinterpret_cast<engram_cache_touch_entry*>(addr + page->ring_offset);
  for (uint32_t i = 0; i < ENGRAM_CACHE_TOUCH_ENTRIES; ++i) {
    ring[i] = {.key = ~uint64_t{0} - i, .slot = 0xFFFFFFF0u + (i & 15), .reserved = 7};
  }
  page->head += uint64_t{1} << 40;
  auto* counters = reinterpret_cast<engram_cache_touch_counters*>(addr + page->counters_offset);
  for (uint32_t t = 0; t < page->tables; ++t) counters[t].rows = 0;
  const json s0 = Ctl(d, "status")["store"]["cache"];
  for (int b = 0; b < 20; ++b) {
    FillRows(c.rows, c.n, kRows, 100 + b);
    REQUIRE(c.Gather(1, ENGRAM_GATHER_IN_PLACE).first == 0);
    REQUIRE(FirstBadRow(1, c.rows, c.n, c.out, c.offsets) == -1);
    page->head += 12345;  // and again, between gathers
  }
  const json s1 = Ctl(d, "status")["store"]["cache"];
  CHECK(s1["bytes"] == s0["bytes"]);
  CHECK(s1["used_rows"].get<uint64_t>() <= s1["capacity_rows"].get<uint64_t>());
  // The page is the size it was made; it cannot be grown.
  CHECK(FindMapping("engram-cache-touch").second == len);
  CHECK(d.alive());
}

TEST_CASE("a mapping held across a daemon restart is never read again", "[incache]") {
  Daemon d({"--tier", "1=cache", "--cache-bytes", "1M"}, "incache-restart");
  REQUIRE(d.alive());
  Client c(d);
  FillRows(c.rows, c.n, 1000, 9);
  for (int i = 0; i < 2; ++i) REQUIRE(c.Gather(1, ENGRAM_GATHER_IN_PLACE).first == 0);
  REQUIRE(c.Stats().rows_in_place > 0);
  d.Stop(SIGKILL);  // no goodbye: the kernel marks the table state page's liveness word
  d.Start();
  const auto [rc, why] = c.Gather(1, ENGRAM_GATHER_IN_PLACE);
  CHECK(rc == -ENOTCONN);
  CHECK(why.find("connect again") != std::string::npos);
  // A new session maps the new daemon's cache and reads it.
  Client fresh(d);
  FillRows(fresh.rows, fresh.n, 1000, 9);
  for (int i = 0; i < 2; ++i) REQUIRE(fresh.Gather(1, ENGRAM_GATHER_IN_PLACE).first == 0);
  CHECK(FirstBadRow(1, fresh.rows, fresh.n, fresh.out, fresh.offsets) == -1);
  CHECK(fresh.Stats().rows_in_place > 0);
}

}  // namespace
