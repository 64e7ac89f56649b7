// Tests of the gather engine's io_uring paths: a ring whose io_uring_enter fails in the middle of a
// batch (reads in flight are reaped, the ring is replaced, the batch still succeeds and nothing
// lands in a destination afterwards), and O_DIRECT reads through a registered bounce buffer.
#include <fcntl.h>
#include <liburing.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gather/gather_engine.h"
#include "gather/gather_planner.h"
#include "gather/gather_reader.h"
#include "tests/gather/gather_catch_util.h"

namespace engram {
namespace {

using testing::Evict;
using testing::FirstMismatch;
using testing::GatherInto;
using testing::Notices;
using testing::RequireEngine;
using testing::RequireTable;
using testing::StatsOf;
using testing::TempDir;
using testing::Warm;

constexpr uint64_t kSeed = 23;
constexpr uint64_t kRows = 30000;
constexpr uint32_t kLayer = 9;

// The whole binary is about io_uring: without it there is nothing to test.
void RequireUring() {
  static const bool ok = [] {
    io_uring ring;
    const int r = io_uring_queue_init(8, &ring, 0);
    if (r < 0) {
      std::fprintf(stderr, "io_uring is unavailable here (%s): skipping\n", std::strerror(-r));
      std::exit(77);
    }
    io_uring_queue_exit(&ring);
    return true;
  }();
  (void)ok;
}

struct Fixture {
  TempDir dir;
  std::string packed;
  Fixture() {
    RequireUring();
    REQUIRE(dir.ok());
    packed = dir.path() + "/layer9.engram";
    REQUIRE(testing::WriteSyntheticPacked(packed, kLayer, kRows, kSeed).ok());
  }
};

Fixture& Files() {
  static Fixture f;
  return f;
}

std::unique_ptr<Table> Open() { return RequireTable(Files().packed, kLayer); }

// Rows 19 apart (5,016 bytes: never on one 4 KiB page), without wrapping around the table: one
// planned read per row on a 4 KiB-page kernel, fewer where a larger page holds several of them.
std::vector<uint64_t> SpreadRows(size_t n, uint64_t first) {
  REQUIRE(first + n * 19 < kRows);
  std::vector<uint64_t> rows;
  for (size_t i = 0; i < n; ++i) rows.push_back(first + i * 19);
  return rows;
}

// The reads the engine's planner makes of `rows` (merged within the kernel's pages).
uint64_t PlannedReads(const Table& table, const std::vector<uint64_t>& rows) {
  std::vector<uint8_t> dest(rows.size() * kRowBytes);
  GatherPlan plan;
  REQUIRE(GatherPlanner(PlannerOptions{})
              .Plan({.table = &table, .rows = rows, .dest = dest.data()}, &plan)
              .ok());
  return plan.reads.size();
}

std::vector<uint64_t> RandomRows(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> rows(n);
  for (auto& r : rows) r = rng() % kRows;
  return rows;
}

// Makes the gather rings' io_uring_enter fail with `err` on call number `fail_at` (0-based), and
// on every later call as well when `sticky`; with `after_submit` the failing call submits what
// was queued first, so reads are in flight when the ring breaks.
struct EnterFault {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> fail_at{UINT64_MAX};
  std::atomic<int> err{ENXIO};
  std::atomic<bool> sticky{false};
  std::atomic<bool> after_submit{true};
  UringEnterFaultFn Fn() {
    return [this]() -> UringEnterFault {
      const uint64_t n = calls.fetch_add(1);
      const uint64_t at = fail_at.load();
      if (n == at || (sticky && n >= at)) return {err.load(), after_submit.load()};
      return {};
    };
  }
};

// Overwrites the destination after the batch returned, gives any read still in flight time to
// land (every system call in between runs the kernel's pending completion work for this thread),
// and reports whether the pattern survived.
bool NothingLandsAfterReturn(std::vector<uint8_t>& dest) {
  std::memset(dest.data(), 0x5A, dest.size());
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    (void)getppid();
  }
  return std::all_of(dest.begin(), dest.end(), [](uint8_t b) { return b == 0x5A; });
}

TEST_CASE("RecoverRing abandons what the kernel never took and reaps what it did",
          "[gather][uring]") {
  auto table = Open();
  const TableFile& file = table->files()[0];
  Notices notices;
  ReaderShared shared;
  shared.notice = notices.Fn();
  ReaderContext ctx(&shared);
  REQUIRE(ctx.InitRing(64, 8).ok());
  std::vector<int> fds(8, -1);
  std::vector<uint64_t> versions(8, 0);
  fds[3] = file.fd;
  versions[3] = 1;
  ctx.SyncFixedFiles(fds, versions, 1);
  REQUIRE(ctx.fixed_files());

  Evict(*table);
  constexpr uint32_t kSubmitted = 40, kQueued = 20;
  std::vector<uint8_t> buf((kSubmitted + kQueued) * kRowBytes, 0);
  auto offset_of = [&](uint32_t i) { return file.size / (kSubmitted + kQueued + 1) * (i + 1); };
  auto prep = [&](uint32_t i) {
    io_uring_sqe* sqe = io_uring_get_sqe(ctx.ring());
    REQUIRE(sqe != nullptr);
    io_uring_prep_read(sqe, 3, buf.data() + i * kRowBytes, kRowBytes, offset_of(i));
    sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, i);
  };
  for (uint32_t i = 0; i < kSubmitted; ++i) prep(i);
  REQUIRE(io_uring_submit(ctx.ring()) == static_cast<int>(kSubmitted));
  for (uint32_t i = kSubmitted; i < kSubmitted + kQueued; ++i) prep(i);  // never submitted

  uint32_t inflight = kSubmitted + kQueued;
  std::set<uint64_t> abandoned, reaped, full;
  bool unexpected_result = false;
  ReadCounters c;
  ctx.RecoverRing(
      ENXIO, inflight, "the test file", [&](uint64_t d) { abandoned.insert(d); },
      [&](const io_uring_cqe& cqe) {
        reaped.insert(cqe.user_data);
        if (cqe.res == static_cast<int>(kRowBytes)) {
          full.insert(cqe.user_data);
        } else if (cqe.res != -ECANCELED && cqe.res != -EINTR) {
          unexpected_result = true;  // only the cancellation may cut a read short
        }
      },
      c);
  CHECK(inflight == 0);
  CHECK(abandoned.size() == kQueued);
  CHECK(reaped.size() == kSubmitted);
  for (uint64_t d : abandoned) CHECK(d >= kSubmitted);
  for (uint64_t d : reaped) CHECK(d < kSubmitted);
  CHECK_FALSE(unexpected_result);
  // Every read reaped whole has its bytes in place; no abandoned one ever ran.
  std::vector<uint8_t> want(kRowBytes);
  for (uint32_t i = 0; i < kSubmitted + kQueued; ++i) {
    const uint8_t* got = buf.data() + i * kRowBytes;
    if (full.contains(i)) {
      REQUIRE(pread(file.fd, want.data(), kRowBytes, offset_of(i)) == kRowBytes);
      CHECK(std::memcmp(got, want.data(), kRowBytes) == 0);
    } else if (i >= kSubmitted) {
      CHECK(std::all_of(got, got + kRowBytes, [](uint8_t b) { return b == 0; }));
    }
  }
  CHECK(c.ring_failures == 1);
  CHECK(c.ring_resets == 1);
  CHECK(notices.Count("io_uring_enter failed (No such device or address) while reading the test "
                      "file") == 1);

  // The fresh ring works and holds the same fixed files.
  REQUIRE(ctx.has_ring());
  REQUIRE(ctx.fixed_files());
  std::vector<uint8_t> again(kRowBytes, 0);
  io_uring_sqe* sqe = io_uring_get_sqe(ctx.ring());
  REQUIRE(sqe != nullptr);
  io_uring_prep_read(sqe, 3, again.data(), kRowBytes, offset_of(0));
  sqe->flags |= IOSQE_FIXED_FILE;
  REQUIRE(ctx.SubmitAndWait(1) == 1);
  io_uring_cqe* cqe = nullptr;
  REQUIRE(io_uring_peek_cqe(ctx.ring(), &cqe) == 0);
  CHECK(cqe->res == static_cast<int>(kRowBytes));
  io_uring_cqe_seen(ctx.ring(), cqe);
  REQUIRE(pread(file.fd, want.data(), kRowBytes, offset_of(0)) == kRowBytes);
  CHECK(std::memcmp(again.data(), want.data(), kRowBytes) == 0);
}

TEST_CASE("a residue ring that fails mid-batch is drained and replaced; every batch is exact",
          "[gather][uring]") {
  auto table = Open();
  struct Case {
    uint64_t fail_at;
    int err;
    bool after_submit;
  };
  // Failing on entry (nothing submitted: the first call has nothing in flight either) or while
  // waiting for a ring's worth of cold reads just submitted, early and later in the batch.
  for (const Case& k : {Case{0, ENXIO, false}, Case{0, EFAULT, true}, Case{3, ENXIO, false},
                        Case{4, EBADF, true}}) {
    DYNAMIC_SECTION("enter call " << k.fail_at << " fails with " << std::strerror(k.err)
                                  << (k.after_submit ? " after submitting" : " on entry")) {
      EnterFault fault;
      Notices notices;
      GatherEngineOptions o{.workers = 1, .ring_entries = 64};
      o.nowait_pass = NowaitPass::kOff;  // every read goes through the residue ring
      o.split_reads = 1 << 20;           // one chunk, on the calling thread
      o.uring_enter_fault = fault.Fn();
      o.notice = notices.Fn();
      auto engine = RequireEngine(o);
      REQUIRE(engine->AddTable(table.get(), {}).ok());

      const auto rows = SpreadRows(1500, 5);
      std::vector<uint8_t> out;
      Evict(*table);
      fault.err = k.err;
      fault.after_submit = k.after_submit;
      fault.fail_at = k.fail_at;
      absl::Status s = GatherInto(*engine, *table, rows, out);
      INFO(s.ToString());
      REQUIRE(s.ok());
      CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
      CHECK(NothingLandsAfterReturn(out));
      auto st = StatsOf(*engine);
      CHECK(st.ring_failures == 1);
      CHECK(st.ring_resets == 1);
      CHECK(st.errors == 0);
      CHECK(st.uring_reads + st.pool_reads == PlannedReads(*table, rows));
      CHECK(notices.Count("io_uring_enter failed") == 1);
      CHECK(notices.Count("could not replace") == 0);

      // The next batches run on the replacement ring.
      for (int b = 0; b < 3; ++b) {
        const auto more = RandomRows(800, 100 + b);
        Evict(*table);
        const uint64_t calls_before = fault.calls.load();
        const uint64_t uring_before = StatsOf(*engine).uring_reads;
        REQUIRE(GatherInto(*engine, *table, more, out).ok());
        CHECK(FirstMismatch(kSeed, *table, more, out.data()) == -1);
        CHECK(fault.calls.load() > calls_before);
        CHECK(StatsOf(*engine).uring_reads > uring_before);
      }
      st = StatsOf(*engine);
      CHECK(st.ring_failures == 1);
      CHECK(st.errors == 0);
    }
  }
}

TEST_CASE("a NOWAIT pass whose ring fails hands its reads on and the batch is exact",
          "[gather][uring]") {
  auto table = Open();
  Warm(*table);
  EnterFault fault;
  GatherEngineOptions o{.workers = 1, .ring_entries = 32};
  o.nowait_pass = NowaitPass::kUring;
  o.split_reads = 1 << 20;
  o.uring_enter_fault = fault.Fn();
  auto engine = RequireEngine(o);
  REQUIRE(engine->AddTable(table.get(), {}).ok());
  const auto rows = SpreadRows(600, 11);
  std::vector<uint8_t> out;
  REQUIRE(GatherInto(*engine, *table, rows, out).ok());  // the first batch sets the hit rate
  const auto before = StatsOf(*engine);
  // Most reads hit (enough to keep the pass on: nowait_min_hit_rate is 0.5), not necessarily
  // all: between Warm() and the batch the kernel may reclaim a page or hold one locked, and
  // NOWAIT then answers EAGAIN for it (596 of 600 on a loaded VM).
  REQUIRE(before.nowait_hits > rows.size() / 2);
  fault.fail_at = fault.calls.load() + 3;
  REQUIRE(GatherInto(*engine, *table, rows, out).ok());
  CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
  CHECK(NothingLandsAfterReturn(out));
  const auto st = StatsOf(*engine);
  CHECK(st.ring_failures == 1);
  CHECK(st.ring_resets == 1);
  CHECK(st.errors == 0);
  // The replacement ring runs the NOWAIT pass again (again most reads, for the same reason; the
  // residue path reads the others).
  const uint64_t calls = fault.calls.load();
  REQUIRE(GatherInto(*engine, *table, rows, out).ok());
  CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
  CHECK(fault.calls.load() > calls);
  CHECK(StatsOf(*engine).nowait_hits - st.nowait_hits > rows.size() / 2);
}

TEST_CASE("a worker's ring that fails under Submit and split batches is replaced",
          "[gather][uring]") {
  auto table = Open();
  EnterFault fault;
  GatherEngineOptions o{.workers = 2, .ring_entries = 32};
  o.nowait_pass = NowaitPass::kOff;
  o.split_reads = 256;  // chunks of 128 reads over the caller and both workers
  o.uring_enter_fault = fault.Fn();
  auto engine = RequireEngine(o);
  REQUIRE(engine->AddTable(table.get(), {}).ok());
  Evict(*table);
  const auto rows = SpreadRows(1500, 1);
  std::vector<uint8_t> out(rows.size() * kRowBytes, 0xEE);
  fault.fail_at = 2;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::Status status;
  engine->Submit({.table = table.get(), .rows = rows, .dest = out.data()}, [&](absl::Status s) {
    std::lock_guard<std::mutex> l(mu);
    status = std::move(s);
    done = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return done; });
  }
  INFO(status.ToString());
  REQUIRE(status.ok());
  CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
  CHECK(NothingLandsAfterReturn(out));
  CHECK(StatsOf(*engine).ring_failures == 1);
  CHECK(StatsOf(*engine).ring_resets == 1);
  for (int b = 0; b < 3; ++b) {
    Evict(*table);
    const auto more = RandomRows(1500, 40 + b);
    REQUIRE(GatherInto(*engine, *table, more, out).ok());
    CHECK(FirstMismatch(kSeed, *table, more, out.data()) == -1);
  }
}

TEST_CASE("rings that keep failing are given up: the thread reads with blocking preadv2",
          "[gather][uring]") {
  auto table = Open();
  EnterFault fault;
  Notices notices;
  GatherEngineOptions o{.workers = 1, .ring_entries = 64};
  o.nowait_pass = NowaitPass::kOff;
  o.split_reads = 1 << 20;
  o.uring_enter_fault = fault.Fn();
  o.notice = notices.Fn();
  auto engine = RequireEngine(o);
  REQUIRE(engine->AddTable(table.get(), {}).ok());
  fault.sticky = true;
  fault.fail_at = 0;
  std::vector<uint8_t> out;
  int batches = 0;
  while (notices.Count("could not replace") == 0 && batches < 10) {
    const auto rows = SpreadRows(500, 70 + batches);
    Evict(*table);
    REQUIRE(GatherInto(*engine, *table, rows, out).ok());
    CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
    ++batches;
  }
  REQUIRE(notices.Count("could not replace") == 1);
  CHECK(notices.Count("io_uring_enter failed") == 1);  // once, whatever the count
  const auto given_up = StatsOf(*engine);
  CHECK(given_up.ring_failures == 5);  // four replacements, then none
  CHECK(given_up.ring_resets == 4);
  CHECK(given_up.errors == 0);
  CHECK(given_up.residue_path ==
        "io_uring (1 thread(s) on blocking reads after their rings kept failing)");

  const uint64_t calls = fault.calls.load();
  const auto rows = SpreadRows(500, 99);
  Evict(*table);
  REQUIRE(GatherInto(*engine, *table, rows, out).ok());
  CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
  CHECK(fault.calls.load() == calls);  // no ring any more
  const auto after = StatsOf(*engine);
  CHECK(after.pool_reads - given_up.pool_reads == PlannedReads(*table, rows));
  CHECK(after.ring_failures == given_up.ring_failures);
}

TEST_CASE("an O_DIRECT pass whose ring fails reaps its page runs and reads the rest plainly",
          "[gather][uring]") {
  auto table = Open();
  for (bool fixed : {true, false}) {
    DYNAMIC_SECTION((fixed ? "registered bounce area" : "unregistered bounce area")) {
      EnterFault fault;
      GatherEngineOptions o{.workers = 1, .ring_entries = 4};
      o.split_reads = 1 << 20;
      o.direct_bounce_bytes = 256 * 1024;  // several flushes per batch
      o.register_direct_buffers = fixed;
      o.uring_enter_fault = fault.Fn();
      auto engine = RequireEngine(o);
      REQUIRE(engine->AddTable(table.get(), {.mode = ReadMode::kDirect}).ok());
      auto rows = RandomRows(1500, 3);
      rows.push_back(kRows - 1);
      fault.fail_at = 3;
      std::vector<uint8_t> out;
      REQUIRE(GatherInto(*engine, *table, rows, out).ok());
      CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
      CHECK(NothingLandsAfterReturn(out));
      auto st = StatsOf(*engine);
      CHECK(st.ring_failures == 1);
      CHECK(st.ring_resets == 1);
      CHECK(st.errors == 0);
      const uint64_t fixed_before = st.fixed_reads;
      if (fixed) CHECK(fixed_before > 0);
      if (!fixed) CHECK(fixed_before == 0);

      // The replacement ring registers the bounce area again.
      const auto more = RandomRows(1500, 4);
      REQUIRE(GatherInto(*engine, *table, more, out).ok());
      CHECK(FirstMismatch(kSeed, *table, more, out.data()) == -1);
      st = StatsOf(*engine);
      if (fixed) CHECK(st.fixed_reads > fixed_before);
      if (!fixed) CHECK(st.fixed_reads == 0);
    }
  }
}

TEST_CASE("O_DIRECT gathers read through the registered bounce area", "[gather][uring]") {
  auto table = Open();
  Notices notices;
  for (bool fixed : {true, false}) {
    for (uint32_t workers : {1u, 2u}) {
      GatherEngineOptions o{.workers = workers, .split_reads = 256};
      o.register_direct_buffers = fixed;
      o.notice = notices.Fn();
      auto engine = RequireEngine(o);
      REQUIRE(engine->AddTable(table.get(), {.mode = ReadMode::kDirect}).ok());
      for (int b = 0; b < 3; ++b) {
        auto rows = RandomRows(3000, 10 + b);
        rows.push_back(0);
        rows.push_back(kRows - 1);
        std::vector<uint8_t> out;
        REQUIRE(GatherInto(*engine, *table, rows, out).ok());
        CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
      }
      const auto st = StatsOf(*engine);
      CHECK(st.direct_reads > 0);
      CHECK(st.fixed_reads == (fixed ? st.direct_reads : 0));
      CHECK(st.errors == 0);
    }
  }
  CHECK(notices.Count("refused to register") == 0);
}

TEST_CASE("a bounce area that grows is registered again", "[gather][uring]") {
  auto table = Open();
  const TableFile& file = table->files()[0];
  const int direct_fd = open(file.path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  REQUIRE(direct_fd >= 0);
  ReaderShared shared;
  ReaderContext ctx(&shared);
  REQUIRE(ctx.InitRing(8, 0).ok());
  auto read_fixed_at = [&](size_t bounce_offset) {
    io_uring_sqe* sqe = io_uring_get_sqe(ctx.ring());
    REQUIRE(sqe != nullptr);
    io_uring_prep_read_fixed(sqe, direct_fd, ctx.Bounce(0) + bounce_offset, 4096, 4096, 0);
    REQUIRE(ctx.SubmitAndWait(1) == 1);
    io_uring_cqe* cqe = nullptr;
    REQUIRE(io_uring_peek_cqe(ctx.ring(), &cqe) == 0);
    const int res = cqe->res;
    io_uring_cqe_seen(ctx.ring(), cqe);
    return res;
  };
  REQUIRE(ctx.Bounce(64 * 1024) != nullptr);
  REQUIRE(ctx.FixedBounce());
  CHECK(read_fixed_at(0) == 4096);
  CHECK(read_fixed_at(64 * 1024) == -EFAULT);  // outside the registered area
  REQUIRE(ctx.Bounce(1 << 20) != nullptr);
  REQUIRE(ctx.FixedBounce());
  CHECK(read_fixed_at(512 * 1024) == 4096);
  std::vector<uint8_t> want(4096);
  REQUIRE(pread(file.fd, want.data(), 4096, 4096) == 4096);
  CHECK(std::memcmp(ctx.Bounce(0) + 512 * 1024, want.data(), 4096) == 0);
  close(direct_fd);
}

// Drops CAP_IPC_LOCK, which exempts a process from RLIMIT_MEMLOCK, from this process.
bool DropIpcLock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  const uint32_t bit = 1u << (CAP_IPC_LOCK % 32);
  data[CAP_IPC_LOCK / 32].effective &= ~bit;
  data[CAP_IPC_LOCK / 32].permitted &= ~bit;
  data[CAP_IPC_LOCK / 32].inheritable &= ~bit;
  return syscall(SYS_capset, &header, data) == 0;
}

TEST_CASE("under a small RLIMIT_MEMLOCK the bounce area goes unregistered, with one notice",
          "[gather][uring]") {
  auto table = Open();
  // A child process, so that the lowered limit and the dropped capability stay there.
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Exit codes: 0 passed, 10+ which check failed.
    const rlimit small{64 * 1024, 64 * 1024};
    if (!DropIpcLock() || setrlimit(RLIMIT_MEMLOCK, &small) != 0) _exit(10);
    int code = 0;
    {
      Notices notices;
      GatherEngineOptions o{.workers = 2, .split_reads = 256};
      o.notice = notices.Fn();
      auto engine = GatherEngine::Create(o);
      if (!engine.ok()) _exit(11);
      if (!(*engine)->AddTable(table.get(), {.mode = ReadMode::kDirect}).ok()) _exit(12);
      for (int b = 0; b < 3 && code == 0; ++b) {
        const auto rows = RandomRows(2000, 50 + b);
        std::vector<uint8_t> out(rows.size() * kRowBytes);
        if (!(*engine)->Gather({.table = table.get(), .rows = rows, .dest = out.data()}).ok()) {
          code = 13;
        } else if (FirstMismatch(kSeed, *table, rows, out.data()) != -1) {
          code = 14;
        }
      }
      const auto st = (*engine)->Stats();
      if (code == 0 && (st.size() != 1 || st[0].direct_reads == 0)) code = 15;
      if (code == 0 && st[0].fixed_reads != 0) code = 16;
      if (code == 0 && notices.Count("refused to register") != 1) code = 17;
      if (code == 0 && notices.Count("RLIMIT_MEMLOCK 64 KiB") != 1) code = 18;
    }
    _exit(code);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace engram
