// Prefetch through engramd: rows prefetched into the row cache are then gathered as byte-exact
// hits and counted as used once; bad row ids and unknown tables are refused naming them; a full
// queue drops and counts; a client that prefetches and dies disturbs nobody; a storage table's
// prefetched rows end up in the page cache.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "engram/engram.h"
#include "engram/protocol.h"  // ENGRAM_PREFETCH_MAX_ROWS
#include "nlohmann/json.hpp"
#include "tables/table.h"
#include "testkit/daemon_test_util.h"

using engram::kRowBytes;
using nlohmann::json;
using namespace engram::testing;

namespace {

json TableStats(const Daemon& d, uint32_t layer) {
  const json reply = Ctl(d, "stats");
  for (const json& t : reply["tables"]) {
    if (t["layer"] == layer) return t;
  }
  FAIL("no layer " << layer << " in " << reply.dump());
  return {};
}

uint64_t U(const json& j, const char* key) {
  INFO(key << " in " << j.dump());
  REQUIRE(j.contains(key));
  return j[key].get<uint64_t>();
}

// Waits until `done` holds of the daemon's status (the prefetch thread runs at idle priority:
// on a busy machine this takes a while).
void WaitStatus(const Daemon& d, const std::function<bool(const json&)>& done, const char* what) {
  for (int i = 0; i < 3000; ++i) {
    if (done(Ctl(d, "status"))) return;
    usleep(20000);
  }
  FAIL(what << ": " << Ctl(d, "status").dump());
}

// Waits until the daemon's prefetch queue is empty.
void WaitPrefetched(const Daemon& d) {
  WaitStatus(
      d, [](const json& s) { return U(s["prefetch"], "queue_rows") == 0; },
      "the prefetch queue did not drain");
}

// `n` distinct rows of [0, kRows), deterministic.
std::vector<uint64_t> DistinctRows(uint64_t n, uint64_t seed) {
  std::vector<uint64_t> rows;
  std::set<uint64_t> seen;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  while (rows.size() < n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    if (seen.insert(x % kRows).second) rows.push_back(x % kRows);
  }
  return rows;
}

struct Client {
  engram_session* s = nullptr;
  explicit Client(const Daemon& d, uint64_t data_bytes = 8 << 20) {
    engram_connect_options o = d.Options(data_bytes, 8);
    REQUIRE(engram_session_open(&o, &s) == 0);
  }
  ~Client() { engram_session_close(s); }
  // Gathers `rows` of `layer` through engramd (whose prefetch accounting these tests check) and
  // checks every byte against the synthetic rows.
  void GatherChecked(uint32_t layer, const std::vector<uint64_t>& rows) {
    uint64_t* ids;
    uint8_t* out;
    REQUIRE(engram_alloc(s, rows.size() * 8, reinterpret_cast<void**>(&ids)) == 0);
    REQUIRE(engram_alloc(s, rows.size() * kRowBytes, reinterpret_cast<void**>(&out)) == 0);
    std::copy(rows.begin(), rows.end(), ids);
    std::memset(out, 0xEE, rows.size() * kRowBytes);
    engram_gather_request r{.size = sizeof(r),
                            .layer = layer,
                            .flags = ENGRAM_GATHER_VIA_DAEMON,
                            .rows = ids,
                            .num_rows = rows.size(),
                            .dest = out};
    INFO(engram_last_error());
    REQUIRE(engram_gather(s, &r, 30'000'000'000) == 0);
    CHECK(FirstBadRow(layer, ids, rows.size(), out) == -1);
    engram_free(s, ids);
    engram_free(s, out);
  }
};

int InChild(const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("prefetched rows of a cached table are gathered as byte-exact hits, used once",
          "[prefetch]") {
  // Layer 1 cached in 4 MiB (~14,000 rows), layer 14 from storage; nothing gathered before.
  Daemon d({"--tier", "1=cache", "--cache-bytes", "4M"}, "prefetch-cache");
  REQUIRE(d.alive());
  Client c(d);
  const std::vector<uint64_t> rows = DistinctRows(2000, 1);
  uint64_t queued = 0;
  // The ids live in ordinary memory: the library copies them into the arena.
  REQUIRE(engram_prefetch(c.s, 1, rows.data(), rows.size(), 0, &queued) == 0);
  CHECK(queued == rows.size());
  WaitPrefetched(d);
  json t = TableStats(d, 1);
  CHECK(U(t, "prefetch_requested_rows") == rows.size());
  CHECK(U(t, "prefetch_fetched_rows") == rows.size());  // a cold cache held none of them
  CHECK(U(t, "prefetch_held_rows") == 0);
  CHECK(U(t, "prefetch_used_rows") == 0);
  const uint64_t hits_before = U(t, "store_hit_rows");

  c.GatherChecked(1, rows);
  t = TableStats(d, 1);
  // Every row was a hit, and each counts once as a prefetch used.
  CHECK(U(t, "store_hit_rows") - hits_before == rows.size());
  CHECK(U(t, "prefetch_used_rows") == rows.size());

  // A second gather hits again but uses no prefetch a second time; prefetching rows the cache
  // holds counts them as held.
  c.GatherChecked(1, rows);
  REQUIRE(engram_prefetch(c.s, 1, rows.data(), 500, 0, &queued) == 0);
  WaitPrefetched(d);
  t = TableStats(d, 1);
  CHECK(U(t, "prefetch_used_rows") == rows.size());
  CHECK(U(t, "prefetch_held_rows") == 500);
  CHECK(U(t, "prefetch_fetched_rows") == rows.size());

  // Rows gathered without a prefetch are misses (the hits above came from the prefetch).
  const std::vector<uint64_t> other = DistinctRows(3000, 2);
  std::vector<uint64_t> fresh;
  const std::set<uint64_t> had(rows.begin(), rows.end());
  for (uint64_t r : other) {
    if (!had.count(r) && fresh.size() < 500) fresh.push_back(r);
  }
  const uint64_t rows_before = U(t, "store_rows"), hit_before = U(t, "store_hit_rows");
  c.GatherChecked(1, fresh);
  t = TableStats(d, 1);
  CHECK(U(t, "store_rows") - rows_before == fresh.size());
  CHECK(U(t, "store_hit_rows") - hit_before == 0);

  const json status = Ctl(d, "status");
  CHECK(U(status["prefetch"], "used_rows") == rows.size());
  const std::string text = Ctl(d, "metrics")["text"];
  CHECK(text.find("engram_prefetch_used_rows_total{table=\"1\"} 2000") != std::string::npos);
  CHECK(text.find("engram_prefetch_fetched_rows_total{table=\"1\"} 2000") != std::string::npos);
}

TEST_CASE("a prefetch with a bad row id or table is refused naming it", "[prefetch]") {
  Daemon d({"--tier", "1=cache", "--cache-bytes", "1M"}, "prefetch-bad");
  REQUIRE(d.alive());
  Client c(d);
  const uint64_t rows[3] = {5, 17, kRows + 3};
  REQUIRE(engram_prefetch(c.s, 1, rows, 3, 0, nullptr) == -ERANGE);
  std::string error = engram_last_error();
  INFO(error);
  CHECK(error.find("row " + std::to_string(kRows + 3)) != std::string::npos);
  CHECK(error.find("index 2") != std::string::npos);
  CHECK(error.find("layer 1") != std::string::npos);
  REQUIRE(engram_prefetch(c.s, 7, rows, 2, 0, nullptr) == -ENOENT);
  error = engram_last_error();
  CHECK(error.find("layer 7") != std::string::npos);
  REQUIRE(engram_prefetch(c.s, 1, rows, 2, 1, nullptr) == -EINVAL);
  // A bad row in the second entry of a large prefetch names the entry's place in the array.
  std::vector<uint64_t> many(ENGRAM_PREFETCH_MAX_ROWS + 10, 3);
  many[ENGRAM_PREFETCH_MAX_ROWS + 4] = kRows;
  REQUIRE(engram_prefetch(c.s, 1, many.data(), many.size(), 0, nullptr) == -ERANGE);
  error = engram_last_error();
  CHECK(error.find(std::to_string(ENGRAM_PREFETCH_MAX_ROWS)) != std::string::npos);
  CHECK(error.find("row " + std::to_string(kRows)) != std::string::npos);
  // Nothing of a refused entry was queued; the first entry of the large one was.
  WaitPrefetched(d);
  CHECK(U(TableStats(d, 1), "prefetch_requested_rows") == ENGRAM_PREFETCH_MAX_ROWS);
  // The session and the daemon carry on.
  c.GatherChecked(1, {5, 17});
}

TEST_CASE("a full prefetch queue drops rows and counts them", "[prefetch]") {
  Daemon d({"--tier", "1=cache", "--cache-bytes", "1M", "--prefetch-queue-rows", "100"},
           "prefetch-full");
  REQUIRE(d.alive());
  Client c(d);
  const std::vector<uint64_t> rows = DistinctRows(5000, 3);
  uint64_t queued = 0;
  // One entry: the queue takes 100 of its rows at once, the rest are dropped.
  REQUIRE(engram_prefetch(c.s, 1, rows.data(), rows.size(), 0, &queued) == 0);
  CHECK(queued == 100);
  WaitPrefetched(d);
  const json t = TableStats(d, 1);
  CHECK(U(t, "prefetch_requested_rows") == 100);
  CHECK(U(t, "prefetch_dropped_rows") == 4900);
  CHECK(U(t, "prefetch_fetched_rows") + U(t, "prefetch_held_rows") == 100);
  CHECK(U(Ctl(d, "status")["prefetch"], "dropped_rows") == 4900);
  const std::string text = Ctl(d, "metrics")["text"];
  CHECK(text.find("engram_prefetch_dropped_rows_total{table=\"1\"} 4900") != std::string::npos);
  // With the queue drained, a prefetch is queued again.
  REQUIRE(engram_prefetch(c.s, 1, rows.data(), 50, 0, &queued) == 0);
  CHECK(queued == 50);
}

TEST_CASE("a client that prefetches and dies does not disturb another", "[prefetch]") {
  Daemon d({"--tier", "1=cache", "--cache-bytes", "1M"}, "prefetch-die");
  REQUIRE(d.alive());
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const pid_t prefetcher = fork();
  if (prefetcher == 0) {
    engram_connect_options o = d.Options(1 << 20, 8);
    engram_session* s = nullptr;
    if (engram_session_open(&o, &s) != 0) _exit(10);
    std::vector<uint64_t> rows(ENGRAM_PREFETCH_MAX_ROWS);
    for (uint64_t round = 0;; ++round) {
      FillRows(rows.data(), rows.size(), kRows, round);
      // -ENOSPC: the session already has limits.prefetch_session_rows rows waiting; the hint
      // is refused and the client goes on.
      const int rc =
          engram_prefetch(s, round % 2 == 0 ? 1 : 14, rows.data(), rows.size(), 0, nullptr);
      if (rc != 0 && rc != -ENOSPC) _exit(11);
      if (round == 3) (void)write(pipe_fds[1], "x", 1);
    }
  }
  close(pipe_fds[1]);
  char x;
  REQUIRE(read(pipe_fds[0], &x, 1) == 1);  // it is prefetching
  close(pipe_fds[0]);
  // Another client gathers, byte-checked, while the first prefetches; then the first is killed
  // in the middle of its prefetches and the other gathers on.
  const int gathered = InChild([&] {
    engram_connect_options o = d.Options(4 << 20, 8);
    engram_session* s = nullptr;
    if (engram_session_open(&o, &s) != 0) return 20;
    uint64_t* rows;
    uint8_t* out;
    engram_alloc(s, 1152 * 8, reinterpret_cast<void**>(&rows));
    engram_alloc(s, 1152 * kRowBytes, reinterpret_cast<void**>(&out));
    for (int b = 0; b < 40; ++b) {
      if (b == 10) kill(prefetcher, SIGKILL);
      FillRows(rows, 1152, kRows, 1000 + b);
      engram_gather_request r{.size = sizeof(r),
                              .layer = b % 2 == 0 ? 1u : 14u,
                              .rows = rows,
                              .num_rows = 1152,
                              .dest = out};
      if (engram_gather(s, &r, 30'000'000'000) != 0) return 21;
      if (FirstBadRow(r.layer, rows, 1152, out) >= 0) return 22;
    }
    engram_session_close(s);
    return 0;
  });
  int status = 0;
  waitpid(prefetcher, &status, 0);
  CHECK(WIFSIGNALED(status));
  CHECK(gathered == 0);
  REQUIRE(d.alive());
  WaitPrefetched(d);
  CHECK(U(TableStats(d, 1), "prefetch_requested_rows") > 0);
  CHECK(U(TableStats(d, 14), "prefetch_requested_rows") > 0);
  Client c(d);
  c.GatherChecked(14, DistinctRows(100, 9));
}

namespace {

// Whether the pages of [offset, offset + bytes) of `fd` are all in the page cache (mincore).
bool Resident(int fd, uint64_t offset, uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t begin = offset / page * page;
  const uint64_t len = offset + bytes - begin;
  void* map = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(begin));
  REQUIRE(map != MAP_FAILED);
  std::vector<unsigned char> vec((len + page - 1) / page);
  REQUIRE(mincore(map, len, vec.data()) == 0);
  munmap(map, len);
  for (unsigned char v : vec) {
    if ((v & 1) == 0) return false;
  }
  return true;
}

}  // namespace

// Run alone (meson test store_prefetch_pagecache): where the page cache keeps evicted pages it
// cannot show what prefetch did, and the whole test program exits 77 (skipped) saying why.
TEST_CASE("prefetched rows of a table served from storage end up in the page cache",
          "[pagecache]") {
  Daemon d({}, "prefetch-storage");  // every table from storage, through the page cache
  REQUIRE(d.alive());
  auto tables = engram::OpenCheckpoint(Checkpoint(), {.layers = {14}});
  REQUIRE(tables.ok());
  const engram::Table& table = *(*tables)[0];
  // Rows far apart, so that each part of each row has pages of its own.
  std::vector<uint64_t> rows;
  for (uint64_t r = 97; r < kRows; r += 997) rows.push_back(r);
  auto all_resident = [&](bool want) {
    for (uint64_t row : rows) {
      for (const engram::RowPart& part : table.parts()) {
        if (Resident(table.files()[part.file].fd, part.FileOffset(row), part.bytes) != want) {
          return false;
        }
      }
    }
    return true;
  };
  for (const engram::TableFile& f : table.files()) {
    fdatasync(f.fd);
    REQUIRE(posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  }
  if (!all_resident(false)) {
    // A filesystem that keeps the pages (tmpfs, some overlays) cannot show what prefetch did.
    fprintf(stderr, "SKIP: the page cache kept the table's pages after POSIX_FADV_DONTNEED\n");
    std::exit(77);
  }
  Client c(d);
  uint64_t queued = 0;
  REQUIRE(engram_prefetch(c.s, 14, rows.data(), rows.size(), 0, &queued) == 0);
  CHECK(queued == rows.size());
  WaitPrefetched(d);
  // The reads ahead were started by the prefetch; give them a moment to complete.
  bool resident = false;
  for (int i = 0; i < 500 && !(resident = all_resident(true)); ++i) usleep(10000);
  CHECK(resident);
  // Each row counts once. A row whose pages the prefetch's own RWF_NOWAIT probe started reading
  // counts as held when the read completed before the probe returned (a fast device; more
  // often where a larger page holds another row's part already read ahead): most, not all,
  // are fetched.
  json t = TableStats(d, 14);
  CHECK(U(t, "prefetch_fetched_rows") + U(t, "prefetch_held_rows") == rows.size());
  CHECK(U(t, "prefetch_fetched_rows") >= rows.size() / 2);
  const uint64_t held_before = U(t, "prefetch_held_rows");
  // Now they are resident: prefetching them again finds them held.
  REQUIRE(engram_prefetch(c.s, 14, rows.data(), rows.size(), 0, &queued) == 0);
  WaitPrefetched(d);
  t = TableStats(d, 14);
  CHECK(U(t, "prefetch_held_rows") - held_before == rows.size());
  c.GatherChecked(14, rows);
}

namespace {

json Admissions(const Daemon& d) { return Ctl(d, "status")["store"]["admissions"]; }
uint64_t CachePinned(const Daemon& d) {
  return U(Ctl(d, "status")["store"]["cache"], "pinned_rows");
}

// Rows of [0, kRows) not in `taken`, each gathered twice (the second time a hit, so the policy
// keeps them as it keeps rows in use): every row of the cache that is not pinned is pushed out.
void Flood(Client& c, uint32_t layer, const std::vector<uint64_t>& taken) {
  const std::set<uint64_t> skip(taken.begin(), taken.end());
  std::vector<uint64_t> chunk;
  for (uint64_t r = 0; r < kRows; ++r) {
    if (!skip.contains(r)) chunk.push_back(r);
    if (chunk.size() == 2000 || (r + 1 == kRows && !chunk.empty())) {
      c.GatherChecked(layer, chunk);
      c.GatherChecked(layer, chunk);
      chunk.clear();
    }
  }
}

}  // namespace

TEST_CASE("admitted rows stay in the row cache through a flood until their request is done",
          "[admit]") {
  // Layer 1 cached in 2 MiB (about 7,000 rows; a quarter of them may be pinned).
  Daemon d({"--tier", "1=cache", "--cache-bytes", "2M"}, "admit-pinned");
  REQUIRE(d.alive());
  Client c(d);
  const std::vector<uint64_t> all = DistinctRows(2000, 3);
  const std::vector<uint64_t> admitted(all.begin(), all.begin() + 1000);
  const std::vector<uint64_t> hinted(all.begin() + 1000, all.end());
  uint64_t queued = 0;
  REQUIRE(engram_admit(c.s, /*request_id=*/7, 1, admitted.data(), admitted.size(), 0, &queued) ==
          0);
  CHECK(queued == admitted.size());
  // The control: rows only hinted, which the flood may push out.
  REQUIRE(engram_prefetch(c.s, 1, hinted.data(), hinted.size(), 0, &queued) == 0);
  WaitPrefetched(d);
  json a = Admissions(d);
  CHECK(U(a, "active") == 1);
  CHECK(U(a, "reserved_rows") == admitted.size());
  CHECK(U(a, "pinned_rows") == admitted.size());
  CHECK(CachePinned(d) == admitted.size());

  Flood(c, 1, all);
  uint64_t hits = U(TableStats(d, 1), "store_hit_rows");
  c.GatherChecked(1, admitted);
  CHECK(U(TableStats(d, 1), "store_hit_rows") - hits == admitted.size());
  hits = U(TableStats(d, 1), "store_hit_rows");
  c.GatherChecked(1, hinted);
  CHECK(U(TableStats(d, 1), "store_hit_rows") - hits < hinted.size() / 10);

  int found = -1;
  REQUIRE(engram_admit_done(c.s, 7, &found) == 0);
  CHECK(found == 1);
  REQUIRE(engram_admit_done(c.s, 7, &found) == 0);
  CHECK(found == 0);
  a = Admissions(d);
  CHECK(U(a, "active") == 0);
  CHECK(U(a, "released") == 1);
  CHECK(CachePinned(d) == 0);
  // Unpinned, they go the way of the hinted rows.
  Flood(c, 1, all);
  hits = U(TableStats(d, 1), "store_hit_rows");
  c.GatherChecked(1, admitted);
  CHECK(U(TableStats(d, 1), "store_hit_rows") - hits < admitted.size() / 10);
}

TEST_CASE("admissions past a bound or with a bad row are refused naming it; nothing is pinned",
          "[admit]") {
  Daemon d({"--tier", "1=cache", "--cache-bytes", "4M", "--admit-session-rows", "1000"},
           "admit-bounds");
  REQUIRE(d.alive());
  Client c(d);
  const std::vector<uint64_t> rows = DistinctRows(1300, 4);
  REQUIRE(engram_admit(c.s, 1, 1, rows.data(), 800, 0, nullptr) == 0);
  CHECK(engram_admit(c.s, 2, 1, rows.data() + 800, 300, 0, nullptr) == -ENOSPC);
  CHECK_THAT(engram_last_error(), Catch::Matchers::Contains("memory.admit_session_rows"));
  std::vector<uint64_t> bad = {5, kRows + 3};
  CHECK(engram_admit(c.s, 3, 1, bad.data(), bad.size(), 0, nullptr) == -ERANGE);
  CHECK_THAT(engram_last_error(), Catch::Matchers::Contains(std::to_string(kRows + 3)));
  CHECK(engram_admit(c.s, 3, 99, bad.data(), 1, 0, nullptr) == -ENOENT);
  WaitPrefetched(d);
  const json a = Admissions(d);
  CHECK(U(a, "active") == 1);
  CHECK(U(a, "reserved_rows") == 800);
  CHECK(U(a, "refused_rows") == 300);
  int found = -1;
  REQUIRE(engram_admit_done(c.s, 2, &found) == 0);
  CHECK(found == 0);
  // Rows of the table served from storage are hints: no pin reserved, no admission made.
  REQUIRE(engram_admit(c.s, 4, 14, rows.data(), 100, 0, nullptr) == 0);
  CHECK(U(Admissions(d), "reserved_rows") == 800);
  REQUIRE(engram_admit_done(c.s, 4, &found) == 0);
  CHECK(found == 0);
}

TEST_CASE("an admission's pins go at its deadline and when its session ends", "[admit]") {
  Daemon d({"--tier", "1=cache", "--cache-bytes", "4M", "--admit-ttl-ms", "300"}, "admit-ttl");
  REQUIRE(d.alive());
  const std::vector<uint64_t> rows = DistinctRows(400, 5);
  {
    Client c(d);
    // Asks for an hour: the daemon's 300 ms apply.
    REQUIRE(engram_admit(c.s, 1, 1, rows.data(), 200, 3'600'000'000'000, nullptr) == 0);
    WaitStatus(
        d, [](const json& s) { return s["store"]["admissions"]["expired"] == 1; }, "expiry");
    CHECK(CachePinned(d) == 0);
    // A second admission: the session closes before its deadline (on an idle machine).
    REQUIRE(engram_admit(c.s, 2, 1, rows.data() + 200, 200, 0, nullptr) == 0);
    WaitPrefetched(d);
    // Still held, or past its 300 ms already on a slow (sanitized) machine.
    const json a = Admissions(d);
    CHECK(U(a, "active") + U(a, "expired") == 2);
  }
  WaitStatus(
      d, [](const json& s) { return s["store"]["admissions"]["active"] == 0; }, "release at end");
  const json a = Admissions(d);
  // Closed before its 300 ms passed on an idle machine, or expired first on a slow one.
  CHECK(U(a, "ended") + U(a, "expired") == 2);
  CHECK(CachePinned(d) == 0);
}

TEST_CASE("without a row cache, admitted rows are prefetched as hints and nothing is pinned",
          "[admit]") {
  Daemon d({}, "admit-no-cache");
  REQUIRE(d.alive());
  Client c(d);
  const std::vector<uint64_t> rows = DistinctRows(100, 6);
  uint64_t queued = 0;
  REQUIRE(engram_admit(c.s, 1, 14, rows.data(), rows.size(), 0, &queued) == 0);
  CHECK(queued == rows.size());
  int found = -1;
  REQUIRE(engram_admit_done(c.s, 1, &found) == 0);
  CHECK(found == 0);
  CHECK_FALSE(Ctl(d, "status")["store"].contains("admissions"));
}
