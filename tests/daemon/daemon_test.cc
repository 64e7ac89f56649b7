// engramd end to end: a real daemon on a private socket serving a synthetic checkpoint, driven
// through libengram_client from this process and from forked client processes.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tables/table.h"
#include "engram/engram.h"
#include "engram/engram.hpp"
#include "engram/protocol.h"
#include "testkit/daemon_test_util.h"

using engram::kRowBytes;
using namespace engram::testing;

namespace {

// Wakes the daemon's poller for sessions driven by hand: writes to every eventfd this process
// holds (the library's doorbells are the only ones).
void RingDoorbells() {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (!ec && target == "anon_inode:[eventfd]") {
      const uint64_t one = 1;
      ssize_t ignored = write(std::stoi(entry.path().filename().string()), &one, sizeof(one));
      (void)ignored;
    }
  }
}

// A session with two buffers for up to `n` rows.
struct Client {
  engram_session* s = nullptr;
  uint64_t* rows = nullptr;
  uint8_t* out = nullptr;
  uint64_t* offsets = nullptr;
  explicit Client(const Daemon& d, uint64_t n = 4096, uint32_t slots = 0) {
    engram_connect_options o = d.Options(n * (kRowBytes + 16) + (1 << 20), slots);
    int rc = engram_session_open(&o, &s);
    INFO(engram_last_error());
    REQUIRE(rc == 0);
    REQUIRE(engram_alloc(s, n * 8, reinterpret_cast<void**>(&rows)) == 0);
    REQUIRE(engram_alloc(s, n * 8, reinterpret_cast<void**>(&offsets)) == 0);
    REQUIRE(engram_alloc(s, n * kRowBytes, reinterpret_cast<void**>(&out)) == 0);
  }
  ~Client() { engram_session_close(s); }
  int Gather(uint32_t table, uint64_t n, bool scattered = false) {
    engram_gather_request r{.size = sizeof(r),
                            .layer = table,
                            .flags = 0,
                            .rows = rows,
                            .num_rows = n,
                            .dest = out,
                            .dest_offsets = scattered ? offsets : nullptr};
    return engram_gather(s, &r, 10'000'000'000);
  }
};

// Session arenas the daemon has mapped (its memfds are named "engram-session-<id>").
int ArenasMapped(pid_t daemon) {
  std::ifstream maps("/proc/" + std::to_string(daemon) + "/maps");
  int mapped = 0;
  for (std::string line; std::getline(maps, line);) {
    mapped += line.find("engram-session-") != std::string::npos;
  }
  return mapped;
}

// Runs `body` in a child process; returns its exit code (or 128 + signal).
template <typename F>
pid_t Spawn(F body) {
  pid_t pid = fork();
  if (pid == 0) {
    int code = body();
    _exit(code);  // never run the parent's atexit handlers (they remove the test directory)
  }
  return pid;
}

int Reap(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A child that gathers `requests` batches with several in flight and checks every byte.
int GatherAndCheck(const Daemon& d, uint64_t seed, int requests) {
  engram_connect_options o = d.Options(16 << 20, 8);
  engram_session* s;
  if (engram_session_open(&o, &s) != 0) return 10;
  constexpr int kInFlight = 4;
  constexpr uint64_t kN = 1152;
  uint64_t* rows[kInFlight];
  uint8_t* out[kInFlight];
  uint64_t tickets[kInFlight];
  for (int k = 0; k < kInFlight; ++k) {
    if (engram_alloc(s, kN * 8, reinterpret_cast<void**>(&rows[k])) != 0) return 11;
    if (engram_alloc(s, kN * kRowBytes, reinterpret_cast<void**>(&out[k])) != 0) return 11;
  }
  for (int i = 0; i < requests; i += kInFlight) {
    for (int k = 0; k < kInFlight; ++k) {
      FillRows(rows[k], kN, kRows, seed * 1000 + i + k);
      engram_gather_request r{.size = sizeof(r),
                              .layer = (i + k) % 2 ? 14u : 1u,
                              .flags = 0,
                              .rows = rows[k],
                              .num_rows = kN,
                              .dest = out[k],
                              .dest_offsets = nullptr};
      if (engram_submit(s, &r, &tickets[k]) != 0) return 12;
    }
    for (int k = kInFlight - 1; k >= 0; --k) {  // waited on out of submission order
      if (engram_wait(s, tickets[k], 10'000'000'000) != 0) return 13;
      if (FirstBadRow((i + k) % 2 ? 14 : 1, rows[k], kN, out[k]) >= 0) return 14;
    }
  }
  engram_session_close(s);
  return 0;
}

}  // namespace

TEST_CASE("engramd lists its tables with their geometry", "[daemon]") {
  Daemon d;
  REQUIRE(d.alive());
  Client c(d, 16);
  engram_table_info tables[4];
  for (auto& t : tables) t.size = sizeof(t);
  size_t count = 0;
  REQUIRE(engram_list_tables(c.s, tables, 4, &count) == 0);
  REQUIRE(count == 2);
  CHECK(tables[0].layer == 1);
  CHECK(tables[1].layer == 14);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(tables[i].num_rows == kRows);
    CHECK(tables[i].covered_begin == 0);
    CHECK(tables[i].covered_end == kRows);
    CHECK(tables[i].row_bytes == kRowBytes);
    CHECK(tables[i].layout == ENGRAM_TABLE_CHECKPOINT);
    CHECK(tables[i].data_bytes == kRows * kRowBytes);
  }
  // The C++ wrapper sees the same.
  engram::Session session;
  engram::ConnectOptions o;
  o.socket_path = d.socket();
  REQUIRE(engram::Session::Connect(o, &session).ok());
  std::vector<engram_table_info> listed;
  REQUIRE(session.ListTables(&listed).ok());
  REQUIRE(listed.size() == 2);
  CHECK(listed[1].layer == 14);
}

TEST_CASE("gathers return every byte of the checkpoint", "[daemon]") {
  Daemon d;
  Client c(d, 8192);
  SECTION("contiguous destinations, both layers, many sizes") {
    for (uint32_t layer : {1u, 14u}) {
      for (uint64_t n : {1ull, 7ull, 1152ull, 8192ull}) {
        FillRows(c.rows, n, kRows, n + layer);
        c.rows[0] = kRows - 1;  // the last row
        if (n > 1) c.rows[1] = 0;
        REQUIRE(c.Gather(layer, n) == 0);
        CHECK(FirstBadRow(layer, c.rows, n, c.out) == -1);
      }
    }
  }
  SECTION("scattered destinations and repeated rows") {
    const uint64_t n = 2000;
    FillRows(c.rows, n, 50, 3);                                               // many duplicates
    for (uint64_t i = 0; i < n; ++i) c.offsets[i] = (n - 1 - i) * kRowBytes;  // reversed
    REQUIRE(c.Gather(14, n, true) == 0);
    CHECK(FirstBadRow(14, c.rows, n, c.out, c.offsets) == -1);
  }
  SECTION("several requests in flight, completed in any order, polled") {
    engram::Session s;
    engram::ConnectOptions o;
    o.socket_path = d.socket();
    o.data_bytes = 8 << 20;
    REQUIRE(engram::Session::Connect(o, &s).ok());
    constexpr int kK = 6;
    engram::Buffer rows[kK], out[kK];
    engram::Ticket t[kK];
    for (int k = 0; k < kK; ++k) {
      const uint64_t n = 100 + 500 * k;
      REQUIRE(s.Alloc(n * 8, &rows[k]).ok());
      REQUIRE(s.Alloc(n * kRowBytes, &out[k]).ok());
      FillRows(rows[k].as<uint64_t>(), n, kRows, 77 + k);
      REQUIRE(s.Submit(1, rows[k].as<uint64_t>(), n, out[k].data(), &t[k]).ok());
    }
    for (int k = kK - 1; k >= 0; --k) {
      engram::Status st;
      while ((st = s.Poll(t[k])).code() == -EAGAIN) {
      }
      REQUIRE(st.ok());
      CHECK(FirstBadRow(1, rows[k].as<uint64_t>(), 100 + 500 * k, out[k].as<uint8_t>()) == -1);
    }
    CHECK(s.Poll(t[0]).code() == -EINVAL);  // consumed
    struct engram_session_stats st;
    REQUIRE(s.Stats(&st).ok());
    CHECK(st.requests_ok == kK);
    CHECK(st.rows == 6 * 100 + 500 * 15);
    CHECK(st.inflight == 0);
  }
  SECTION("the completion counter only grows, once per request") {
    const volatile uint64_t* counter;
    REQUIRE(engram_completion_counter(c.s, &counter) == 0);
    CHECK(reinterpret_cast<uintptr_t>(counter) % 8 == 0);
    const uint64_t before = *counter;
    uint64_t t;
    REQUIRE(engram_submit_nop(c.s, &t) == 0);
    REQUIRE(engram_wait(c.s, t, -1) == 0);
    FillRows(c.rows, 10, kRows, 5);
    REQUIRE(c.Gather(1, 10) == 0);
    CHECK(*counter == before + 2);
  }
}

TEST_CASE("client processes gather concurrently", "[daemon]") {
  Daemon d;
  std::vector<pid_t> children;
  for (int i = 0; i < 4; ++i) children.push_back(Spawn([&] { return GatherAndCheck(d, i, 48); }));
  for (pid_t p : children) CHECK(Reap(p) == 0);
  CHECK(d.alive());
}

TEST_CASE("threads of one process share a session", "[daemon]") {
  Daemon d;
  engram_connect_options o = d.Options(32 << 20, 16);
  engram_session* s;
  REQUIRE(engram_session_open(&o, &s) == 0);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      uint64_t* rows;
      uint8_t* out;
      if (engram_alloc(s, 1152 * 8, reinterpret_cast<void**>(&rows)) != 0 ||
          engram_alloc(s, 1152 * kRowBytes, reinterpret_cast<void**>(&out)) != 0) {
        failures++;
        return;
      }
      for (int i = 0; i < 40; ++i) {
        const uint64_t n = 1 + (i * 37 + t * 11) % 1152;
        FillRows(rows, n, kRows, t * 1000 + i);
        engram_gather_request r{.size = sizeof(r),
                                .layer = t % 2 ? 14u : 1u,
                                .flags = 0,
                                .rows = rows,
                                .num_rows = n,
                                .dest = out,
                                .dest_offsets = nullptr};
        if (engram_gather(s, &r, 10'000'000'000) != 0 ||
            FirstBadRow(t % 2 ? 14 : 1, rows, n, out) >= 0) {
          failures++;
        }
      }
      engram_free(s, rows);
      engram_free(s, out);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  struct engram_session_stats st {
    .size = sizeof(st)
  };
  REQUIRE(engram_get_session_stats(s, &st) == 0);
  CHECK(st.requests_ok == 160);
  CHECK(st.requests_failed == 0);
  engram_session_close(s);
}

TEST_CASE("a client killed mid-request does not disturb the others", "[daemon]") {
  Daemon d;
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  // The victim keeps large gathers in flight, never waiting for them.
  pid_t victim = Spawn([&] {
    engram_connect_options o = d.Options(64 << 20, 8);
    engram_session* s;
    if (engram_session_open(&o, &s) != 0) return 10;
    const uint64_t n = 98304;
    uint64_t* rows[2];
    uint8_t* out[2];
    for (int k = 0; k < 2; ++k) {
      engram_alloc(s, n * 8, reinterpret_cast<void**>(&rows[k]));
      engram_alloc(s, n * kRowBytes, reinterpret_cast<void**>(&out[k]));
      FillRows(rows[k], n, kRows, k);
    }
    for (uint64_t i = 0;; ++i) {
      engram_gather_request r{.size = sizeof(r),
                              .layer = 1,
                              .flags = 0,
                              .rows = rows[i % 2],
                              .num_rows = n,
                              .dest = out[i % 2],
                              .dest_offsets = nullptr};
      uint64_t t;
      while (engram_submit(s, &r, &t) == -ENOSPC) {
      }
      if (i == 2) {
        char c = 1;
        if (write(ready[1], &c, 1) != 1) return 11;
      }
      if (i >= 6) engram_wait(s, t, -1);  // keep the ring busy but bounded
    }
  });
  char c;
  REQUIRE(read(ready[0], &c, 1) == 1);
  CHECK(ArenasMapped(d.pid()) == 1);  // the victim's
  pid_t survivor = Spawn([&] { return GatherAndCheck(d, 99, 64); });
  usleep(20000);
  kill(victim, SIGKILL);
  CHECK(Reap(victim) == 128 + SIGKILL);
  CHECK(Reap(survivor) == 0);
  REQUIRE(d.alive());
  // Both sessions are gone: once the victim's gathers in flight finished, the daemon unmapped
  // its arena (and the survivor's) — nothing leaks.
  int mapped = -1;
  for (int i = 0; i < 500 && mapped != 0; ++i) {
    mapped = ArenasMapped(d.pid());
    if (mapped != 0) usleep(10000);
  }
  CHECK(mapped == 0);
  // The daemon serves new sessions after tearing the dead one down.
  Client fresh(d, 1152);
  FillRows(fresh.rows, 1152, kRows, 4);
  REQUIRE(fresh.Gather(14, 1152) == 0);
  CHECK(FirstBadRow(14, fresh.rows, 1152, fresh.out) == -1);
  close(ready[0]);
  close(ready[1]);
}

TEST_CASE("clients see Unavailable when engramd goes and reconnect when it is back", "[daemon]") {
  Daemon d({}, "restart");
  Client c(d, 1152);
  FillRows(c.rows, 1152, kRows, 8);
  REQUIRE(c.Gather(1, 1152) == 0);

  SECTION("killed") {
    d.Stop(SIGKILL);
    int rc = c.Gather(1, 1152);
    CHECK(rc == -ENOTCONN);
    CHECK(std::string(engram_last_error()).find("connect again") != std::string::npos);
  }
  SECTION("stopped with SIGTERM") {
    int status = d.Stop(SIGTERM);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(c.Gather(1, 1152) == -ENOTCONN);
    struct engram_session_stats st {
      .size = sizeof(st)
    };
    CHECK(engram_get_session_stats(c.s, &st) == -ENOTCONN);
  }
  engram_session* none = nullptr;
  engram_connect_options o = d.Options();
  CHECK(engram_session_open(&o, &none) == -ECONNREFUSED);
  CHECK(std::string(engram_last_error()).find(d.socket()) != std::string::npos);
  d.Start();
  REQUIRE(d.alive());
  Client again(d, 1152);  // the same call as the first time
  FillRows(again.rows, 1152, kRows, 9);
  REQUIRE(again.Gather(14, 1152) == 0);
  CHECK(FirstBadRow(14, again.rows, 1152, again.out) == -1);
}

TEST_CASE("SIGTERM finishes the gathers in flight, then exits 0", "[daemon]") {
  Daemon d({}, "drain");
  Client c(d, 98304);
  const uint64_t n = 98304;
  FillRows(c.rows, n, kRows, 12);
  engram_gather_request r{.size = sizeof(r),
                          .layer = 1,
                          .flags = 0,
                          .rows = c.rows,
                          .num_rows = n,
                          .dest = c.out,
                          .dest_offsets = nullptr};
  uint64_t t;
  REQUIRE(engram_submit(c.s, &r, &t) == 0);
  // Let the poller take it, then ask the daemon to stop while it is being gathered.
  while (true) {
    engram_arena_header* h;
    uint64_t bytes;
    engram_arena(c.s, reinterpret_cast<void**>(&h), &bytes);
    if (__atomic_load_n(&h->sq_head, __ATOMIC_ACQUIRE) == 1) break;
  }
  kill(d.pid(), SIGTERM);
  CHECK(engram_wait(c.s, t, 10'000'000'000) == 0);
  CHECK(FirstBadRow(1, c.rows, n, c.out) == -1);
  int status = d.Stop(0);  // already signalled: just reap it
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(!SocketAnswers(d.socket()));
}

TEST_CASE("bad requests fail alone with a precise status", "[daemon]") {
  Daemon d;
  Client c(d, 2048);
  FillRows(c.rows, 100, kRows, 1);
  SECTION("unknown table") {
    CHECK(c.Gather(7, 100) == -ENOENT);
    CHECK(std::string(engram_last_error()).find("no table for layer 7 (served: 1, 14)") !=
          std::string::npos);
  }
  SECTION("row past the table") {
    c.rows[42] = kRows;
    CHECK(c.Gather(14, 100) == -ERANGE);
    CHECK(std::string(engram_last_error()).find("row 20000 (index 42)") != std::string::npos);
  }
  SECTION("a 64-bit row id") {
    c.rows[0] = ~0ull;
    CHECK(c.Gather(1, 100) == -ERANGE);
  }
  SECTION("row ids or destination outside the data region") {
    std::vector<uint64_t> heap(10, 1);
    engram_gather_request r{.size = sizeof(r),
                            .layer = 1,
                            .flags = 0,
                            .rows = heap.data(),
                            .num_rows = 10,
                            .dest = c.out,
                            .dest_offsets = nullptr};
    CHECK(engram_gather(c.s, &r, -1) == -EINVAL);
    r.rows = c.rows;
    r.dest = heap.data();
    CHECK(engram_gather(c.s, &r, -1) == -EINVAL);
    r.size = 3;
    CHECK(engram_gather(c.s, &r, -1) == -EINVAL);
  }
  SECTION("scattered destination past the end of the data region") {
    void* base;
    uint64_t bytes;
    engram_data_region(c.s, &base, &bytes);
    for (int i = 0; i < 100; ++i) c.offsets[i] = i * kRowBytes;
    c.offsets[99] =
        bytes - (reinterpret_cast<uint8_t*>(c.out) - static_cast<uint8_t*>(base)) - kRowBytes + 1;
    CHECK(c.Gather(1, 100, true) == -EINVAL);
    CHECK(std::string(engram_last_error()).find("row index 99") != std::string::npos);
  }
  // Whatever failed, the session carries on.
  FillRows(c.rows, 100, kRows, 2);
  REQUIRE(c.Gather(14, 100) == 0);
  CHECK(FirstBadRow(14, c.rows, 100, c.out) == -1);
}

TEST_CASE("row ids rewritten while the daemon reads them", "[daemon]") {
  // The daemon copies a request before checking it: whatever a client scribbles meanwhile,
  // each request either succeeds with the rows of one consistent snapshot or fails with
  // OutOfRange, and the daemon carries on.
  Daemon d;
  Client c(d, 4096);
  FillRows(c.rows, 4096, kRows, 21);
  c.rows[7] = 123;
  const std::vector<uint64_t> expected(c.rows, c.rows + 4096);
  std::atomic<bool> stop{false};
  std::thread scribbler([&] {
    volatile uint64_t* row = &c.rows[7];
    for (uint64_t k = 0; !stop.load(std::memory_order_relaxed); ++k) {
      *row = (k & 1) ? kRows * 1000 + k : 123;
    }
  });
  int ok = 0, refused = 0, other = 0, wrong = 0;
  for (int i = 0; i < 300; ++i) {
    const int rc = c.Gather(1, 4096);
    if (rc == 0) {
      ok++;
      wrong += FirstBadRow(1, expected.data(), 4096, c.out) >= 0;
    } else {
      (rc == -ERANGE ? refused : other)++;
    }
  }
  stop = true;
  scribbler.join();
  INFO("ok " << ok << ", refused " << refused);
  CHECK(other == 0);
  CHECK(wrong == 0);
  CHECK(ok + refused == 300);
  c.rows[7] = 123;
  REQUIRE(c.Gather(1, 4096) == 0);
  CHECK(FirstBadRow(1, expected.data(), 4096, c.out) == -1);
}

TEST_CASE("garbage written straight into the rings fails only those requests", "[daemon]") {
  Daemon d;
  Client raw(d, 64, 8);  // used only through its arena below, never through submit
  uint8_t* arena;
  uint64_t bytes;
  REQUIRE(engram_arena(raw.s, reinterpret_cast<void**>(&arena), &bytes) == 0);
  auto* h = reinterpret_cast<engram_arena_header*>(arena);
  auto* sq = reinterpret_cast<engram_sqe*>(arena + h->sq_offset);
  auto* status = reinterpret_cast<engram_request_status*>(arena + h->status_offset);
  uint8_t* data = arena + h->data_offset;
  uint32_t tail = h->sq_tail;
  uint64_t generation = 1;
  auto push = [&](engram_sqe e) {
    sq[tail % h->slots] = e;
    __atomic_store_n(&h->sq_tail, ++tail, __ATOMIC_SEQ_CST);
    RingDoorbells();
  };
  auto await = [&](uint64_t ticket) {
    for (int i = 0;
         i < 3000 && __atomic_load_n(&status[ticket & 0xFFFF].ticket, __ATOMIC_ACQUIRE) != ticket;
         ++i) {
      usleep(1000);
    }
    return status[ticket & 0xFFFF];
  };
  auto ticket = [&](uint32_t slot) { return (++generation << 16) | slot; };
  const uint64_t rows_off = reinterpret_cast<uint8_t*>(raw.rows) - data;
  const uint64_t out_off = raw.out - data;
  FillRows(raw.rows, 64, kRows, 3);

  engram_sqe bad{};
  bad.ticket = ticket(0);
  bad.opcode = 99;
  push(bad);
  engram_request_status st = await(bad.ticket);
  CHECK(st.code == ENGRAM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(st.message, st.message_bytes) == "unknown opcode 99");

  engram_sqe outside{.ticket = ticket(1),
                     .opcode = ENGRAM_OP_GATHER,
                     .flags = 0,
                     .table = 1,
                     .num_rows = 64,
                     .rows_offset = h->data_bytes - 8,
                     .dest_offset = out_off};
  push(outside);
  st = await(outside.ticket);
  CHECK(st.code == ENGRAM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(st.message, st.message_bytes).find("outside the") != std::string::npos);

  engram_sqe unaligned = outside;
  unaligned.ticket = ticket(2);
  unaligned.rows_offset = rows_off + 3;
  push(unaligned);
  CHECK(await(unaligned.ticket).code == ENGRAM_STATUS_INVALID_ARGUMENT);

  engram_sqe no_slot = outside;
  no_slot.ticket = ticket(200);  // beyond the 8 slots: nothing can be reported
  push(no_slot);

  // A tail far beyond the slots: the daemon skips to it and carries on.
  tail += 100000;
  __atomic_store_n(&h->sq_tail, tail, __ATOMIC_SEQ_CST);
  RingDoorbells();
  for (int i = 0; i < 3000 && __atomic_load_n(&h->sq_head, __ATOMIC_ACQUIRE) != tail; ++i) {
    usleep(1000);
  }
  REQUIRE(h->sq_head == tail);

  engram_sqe good{.ticket = ticket(3),
                  .opcode = ENGRAM_OP_GATHER,
                  .flags = 0,
                  .table = 14,
                  .num_rows = 64,
                  .rows_offset = rows_off,
                  .dest_offset = out_off};
  push(good);
  st = await(good.ticket);
  CHECK(st.code == ENGRAM_STATUS_OK);
  CHECK(st.rows == 64);
  CHECK(FirstBadRow(14, raw.rows, 64, raw.out) == -1);

  // Other sessions never noticed.
  Client other(d, 1152);
  FillRows(other.rows, 1152, kRows, 6);
  REQUIRE(other.Gather(1, 1152) == 0);
  CHECK(FirstBadRow(1, other.rows, 1152, other.out) == -1);
}

namespace {

// Sends raw bytes as the first message and returns the daemon's ERROR text ("" if none).
std::string RawHandshake(const std::string& socket_path, const void* bytes, size_t size,
                         int32_t* ret_code) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_path.c_str());
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(send(fd, bytes, size, MSG_NOSIGNAL) == static_cast<ssize_t>(size));
  uint8_t reply[ENGRAM_MSG_MAX_BYTES];
  ssize_t n = recv(fd, reply, sizeof(reply), 0);
  close(fd);
  if (n < static_cast<ssize_t>(sizeof(engram_msg_error))) return "";
  engram_msg_error e;
  memcpy(&e, reply, sizeof(e));
  if (e.header.type != ENGRAM_MSG_ERROR) return "";
  *ret_code = e.code;
  return std::string(reinterpret_cast<char*>(reply) + sizeof(e), e.message_bytes);
}

}  // namespace

TEST_CASE("handshakes engramd refuses", "[daemon]") {
  Daemon d;
  engram_msg_hello hello{};
  hello.header = {.magic = ENGRAM_MSG_MAGIC,
                  .type = ENGRAM_MSG_HELLO,
                  .reserved = 0,
                  .bytes = sizeof(hello),
                  .request_id = 0};
  hello.version_major = ENGRAM_PROTOCOL_MAJOR;
  int32_t code = 0;
  SECTION("a different major version, naming both") {
    hello.version_major = 2;
    hello.version_minor = 3;
    std::string text = RawHandshake(d.socket(), &hello, sizeof(hello), &code);
    CHECK(code == ENGRAM_STATUS_FAILED_PRECONDITION);
    CHECK(text == "protocol version mismatch: client speaks 2.3, engramd speaks " +
                      std::to_string(ENGRAM_PROTOCOL_MAJOR) + "." +
                      std::to_string(ENGRAM_PROTOCOL_MINOR));
  }
  SECTION("not our protocol") {
    const char junk[] = "GET / HTTP/1.1\r\n\r\n";
    std::string text = RawHandshake(d.socket(), junk, sizeof(junk), &code);
    CHECK(code == ENGRAM_STATUS_INVALID_ARGUMENT);
    CHECK(text.find("magic") != std::string::npos);
  }
  SECTION("a truncated HELLO") {
    hello.header.bytes = 40;
    std::string text = RawHandshake(d.socket(), &hello, 40, &code);
    CHECK(code == ENGRAM_STATUS_INVALID_ARGUMENT);
    CHECK(text.find("HELLO of 40 bytes") != std::string::npos);
  }
  SECTION("an allow list that names neither root nor engramd's own uid") {
    // Root and engramd's own uid are admitted whatever the allow lists say; the refusal of a uid
    // not listed is tested from an unprivileged uid in tests/ops/access_test.cc.
    Daemon strict({"--allow-uid", "12345"}, "strict");
    engram_connect_options o = strict.Options();
    engram_session* s = nullptr;
    REQUIRE(engram_session_open(&o, &s) == 0);
    engram_session_close(s);
  }
  // The daemon still serves.
  Client c(d, 16);
  FillRows(c.rows, 16, kRows, 1);
  CHECK(c.Gather(1, 16) == 0);
}

TEST_CASE("each limit is an error the client sees", "[daemon]") {
  Daemon d({"--max-clients", "2", "--max-inflight", "4", "--max-rows-per-request", "1000",
            "--max-arena-bytes", "4M"},
           "limits");
  SECTION("clients") {
    engram_connect_options o = d.Options(1 << 20);
    engram_session *a, *b, *c = nullptr;
    REQUIRE(engram_session_open(&o, &a) == 0);
    REQUIRE(engram_session_open(&o, &b) == 0);
    CHECK(engram_session_open(&o, &c) == -ENOSPC);
    CHECK(std::string(engram_last_error()).find("--max-clients") != std::string::npos);
    engram_session_close(b);
    // The daemon notices the close asynchronously.
    int rc = -1;
    for (int i = 0; i < 200 && (rc = engram_session_open(&o, &c)) != 0; ++i) usleep(5000);
    CHECK(rc == 0);
    engram_session_close(c);
    engram_session_close(a);
  }
  SECTION("requests in flight") {
    Client c(d, 100, 16);  // asks for 16 slots, gets 4
    FillRows(c.rows, 100, kRows, 1);
    engram_gather_request r{.size = sizeof(r),
                            .layer = 1,
                            .flags = 0,
                            .rows = c.rows,
                            .num_rows = 100,
                            .dest = c.out,
                            .dest_offsets = nullptr};
    uint64_t t[5];
    for (int i = 0; i < 4; ++i) REQUIRE(engram_submit(c.s, &r, &t[i]) == 0);
    CHECK(engram_submit(c.s, &r, &t[4]) == -ENOSPC);
    CHECK(std::string(engram_last_error()).find("all 4 request slots") != std::string::npos);
    for (int i = 0; i < 4; ++i) CHECK(engram_wait(c.s, t[i], -1) == 0);
    REQUIRE(engram_submit(c.s, &r, &t[0]) == 0);
    CHECK(engram_wait(c.s, t[0], -1) == 0);
  }
  SECTION("rows per request") {
    Client c(d, 1001);
    FillRows(c.rows, 1001, kRows, 1);
    CHECK(c.Gather(1, 1000) == 0);
    CHECK(c.Gather(1, 1001) == -ENOSPC);
    CHECK(std::string(engram_last_error()).find("1001 rows in one request, the limit is 1000") !=
          std::string::npos);
  }
  SECTION("arena bytes") {
    engram_connect_options o = d.Options(8 << 20);
    engram_session* s = nullptr;
    CHECK(engram_session_open(&o, &s) == -ENOSPC);
    CHECK(std::string(engram_last_error()).find("--max-arena-bytes") != std::string::npos);
  }
  SECTION("the data region") {
    Client c(d, 16);
    void* p;
    CHECK(engram_alloc(c.s, 5 << 20, &p) == -ENOSPC);
  }
}

TEST_CASE("a per-rank copy serves only its rows", "[daemon]") {
  Daemon d({"--rows", "5000:10000"}, "rank");
  REQUIRE(d.alive());
  Client c(d, 64);
  engram_table_info t[2];
  for (auto& e : t) e.size = sizeof(e);
  size_t count;
  REQUIRE(engram_list_tables(c.s, t, 2, &count) == 0);
  CHECK(t[0].covered_begin == 5000);
  CHECK(t[0].covered_end == 10000);
  for (int i = 0; i < 64; ++i) c.rows[i] = 5000 + i * 78;
  REQUIRE(c.Gather(1, 64) == 0);
  CHECK(FirstBadRow(1, c.rows, 64, c.out) == -1);
  c.rows[10] = 4999;
  CHECK(c.Gather(1, 64) == -ERANGE);
  CHECK(std::string(engram_last_error()).find("outside the rows [5000, 10000)") !=
        std::string::npos);
  c.rows[10] = 10000;
  CHECK(c.Gather(14, 64) == -ERANGE);
}

TEST_CASE("engramd refuses to start on what it cannot serve", "[daemon]") {
  auto run = [](std::vector<std::string> args) {
    args.insert(args.begin(), EngramdPath());
    std::string cmd;
    for (auto& a : args) cmd += "'" + a + "' ";
    cmd += "2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[512];
    while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
    int status = pclose(p);
    return std::make_pair(WEXITSTATUS(status), out);
  };
  auto [rc, out] = run({"--model", TestDir() + "/nonexistent", "--socket", TestDir() + "/x.sock"});
  CHECK(rc != 0);
  CHECK(out.find("nonexistent") != std::string::npos);
  std::tie(rc, out) = run({"--socket", TestDir() + "/x.sock"});
  CHECK(rc != 0);
  CHECK(out.find("--model") != std::string::npos);
  Daemon d({}, "taken");
  std::tie(rc, out) = run({"--model", Checkpoint(), "--socket", d.socket()});
  CHECK(rc != 0);
  CHECK(out.find("another engramd") != std::string::npos);
  CHECK(d.alive());
}
