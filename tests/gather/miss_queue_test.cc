// Tests of the miss queue: decode steps before prefills before prefetches before admissions,
// rows due first going first within a class, pieces shed when the device is behind, the demand
// and wait figures it reports, a decode step's wait behind a prefill bounded by the reads already
// in flight (whatever the prefill's size), the reserve left to decode steps, the queue bound for
// prefetches, the measured read rate; and ReadMisses through a real engine on a paged table (one
// page read a row, same-page rows in one read). The test thread plays the device: it completes
// reads one piece at a time, and waits on the queue's own counters, never on sleeps.
#include "gather/miss_queue.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/metric_sink.h"
#include "tests/gather/gather_catch_util.h"

namespace engram {
namespace {

using testing::FirstMismatch;
using testing::RequireEngine;
using testing::RequireTable;
using testing::StatsOf;
using testing::TempDir;

// Pieces granted and not yet completed, in grant order: the "device".
struct Device {
  std::mutex mu;
  std::deque<std::pair<MissClass, uint32_t>> pieces;
  void Push(MissClass c, uint32_t n) {
    std::lock_guard lock(mu);
    pieces.emplace_back(c, n);
  }
  bool CompleteOne(MissQueue& q) {
    std::pair<MissClass, uint32_t> p;
    {
      std::lock_guard lock(mu);
      if (pieces.empty()) return false;
      p = pieces.front();
      pieces.pop_front();
    }
    q.Release(p.first, p.second);
    return true;
  }
};

const MissClassStats& Of(const MissQueueStats& s, MissClass c) {
  return s.classes[static_cast<int>(c)];
}

// Spins (yielding) until `pred(stats)` holds.
template <typename Pred>
void WaitFor(const MissQueue& q, Pred pred) {
  const uint64_t deadline = NowNs() + 30'000'000'000ull;
  while (!pred(q.Stats())) {
    REQUIRE(NowNs() < deadline);
    std::this_thread::yield();
  }
}

// A prefill of `prefill_pieces` pieces submitted asynchronously (each piece waits for the queue,
// then goes to the device); once it holds all it may, a decode step of 40 rows arrives: it goes
// to the device at once, and no prefill piece starts until it is done. Returns the stats when the
// decode step was granted.
MissQueueStats DecodeBesidePrefill(uint64_t prefill_pieces) {
  MissQueue q({.depth = 16});
  Device dev;
  const uint32_t piece = q.PieceReads(MissClass::kPrefill);
  REQUIRE(piece == 12);  // 16 - 4 reserved
  // Catch2's assertions are for the test thread: other threads count what went wrong.
  std::atomic<int> refused{0};
  std::thread prefill([&] {
    for (uint64_t i = 0; i < prefill_pieces; ++i) {
      if (!q.Acquire(MissClass::kPrefill, piece)) refused++;
      dev.Push(MissClass::kPrefill, piece);
    }
  });
  // The prefill holds the 12 reads it may (the reserve of 4 is left) and waits for more.
  WaitFor(q, [&](const MissQueueStats& s) {
    return Of(s, MissClass::kPrefill).in_flight_reads == 12 &&
           Of(s, MissClass::kPrefill).waiting_reads == piece;
  });
  REQUIRE(q.Acquire(MissClass::kDecode, 40));  // at once, on this thread
  const MissQueueStats at_decode = q.Stats();
  const uint64_t prefill_pieces_before = Of(at_decode, MissClass::kPrefill).pieces;
  // The device completes the prefill's piece; the prefill still waits for the decode step.
  REQUIRE(dev.CompleteOne(q));
  CHECK(Of(q.Stats(), MissClass::kPrefill).pieces == prefill_pieces_before);
  CHECK(Of(q.Stats(), MissClass::kPrefill).waiting_reads == piece);
  q.Release(MissClass::kDecode, 40);
  // Let the prefill finish.
  while (true) {
    const MissQueueStats s = q.Stats();
    if (Of(s, MissClass::kPrefill).pieces == prefill_pieces &&
        Of(s, MissClass::kPrefill).in_flight_reads == 0) {
      break;
    }
    if (!dev.CompleteOne(q)) std::this_thread::yield();
  }
  prefill.join();
  CHECK(refused == 0);
  return at_decode;
}

TEST_CASE("a decode step goes to the device at once beside a prefill of any size", "[miss_queue]") {
  // However large the prefill, the decode step waited for nothing and shared the device with
  // the 12 reads the prefill had there.
  for (uint64_t pieces : {8, 64, 2048}) {
    INFO("prefill of " << pieces << " pieces");
    const MissQueueStats s = DecodeBesidePrefill(pieces);
    CHECK(Of(s, MissClass::kDecode).pieces == 1);
    CHECK(Of(s, MissClass::kDecode).max_reads_waited == 0);
    CHECK(Of(s, MissClass::kDecode).max_wait_ns < 1'000'000'000);
    CHECK(Of(s, MissClass::kPrefill).in_flight_reads == 12);
  }
}

TEST_CASE("prefill pieces leave a quarter of the depth to decode steps", "[miss_queue]") {
  MissQueue q({.depth = 16});
  Device dev;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(q.Acquire(MissClass::kPrefill, 4));
    dev.Push(MissClass::kPrefill, 4);
  }
  // 12 prefill reads in flight: the reserve of 4 is the decode step's.
  REQUIRE(q.Acquire(MissClass::kDecode, 4));
  const MissQueueStats s = q.Stats();
  CHECK(Of(s, MissClass::kDecode).max_reads_waited == 0);
  CHECK(Of(s, MissClass::kDecode).in_flight_reads == 4);
  q.Release(MissClass::kDecode, 4);
  while (dev.CompleteOne(q)) {
  }
  CHECK(q.Stats().completed_reads == 16);
  CHECK(q.Stats().read_rate_per_s > 0);
}

TEST_CASE("a decode step of several pieces lets no prefill piece in between", "[miss_queue]") {
  MissQueue q({.depth = 8});
  REQUIRE(q.Acquire(MissClass::kDecode, 8));
  std::atomic<bool> prefilled{false};
  std::thread prefill([&] {
    if (q.Acquire(MissClass::kPrefill, 2)) prefilled = true;
  });
  WaitFor(q, [](const MissQueueStats& s) { return Of(s, MissClass::kPrefill).waiting_reads == 2; });
  // The first piece is done and a second follows: the prefill still waits.
  q.Release(MissClass::kDecode, 8, /*more=*/true);
  CHECK(Of(q.Stats(), MissClass::kPrefill).pieces == 0);
  REQUIRE(q.Acquire(MissClass::kDecode, 8));
  CHECK(Of(q.Stats(), MissClass::kPrefill).pieces == 0);
  CHECK(Of(q.Stats(), MissClass::kDecode).max_reads_waited == 0);
  // The last piece: the prefill goes.
  q.Release(MissClass::kDecode, 8);
  prefill.join();
  CHECK(prefilled);
  CHECK(Of(q.Stats(), MissClass::kPrefill).pieces == 1);
  q.Release(MissClass::kPrefill, 2);
}

TEST_CASE("prefills go before prefetches", "[miss_queue]") {
  MissQueue q({.depth = 4});
  Device dev;
  REQUIRE(q.PieceReads(MissClass::kPrefetch) == 3);
  // The three reads prefill and prefetch may hold together, taken by prefetches one at a time.
  for (int i = 0; i < 3; ++i) {
    REQUIRE(q.Acquire(MissClass::kPrefetch, 1));
    dev.Push(MissClass::kPrefetch, 1);
  }
  std::vector<MissClass> order;
  std::mutex order_mu;
  std::atomic<int> refused{0};
  auto waiter = [&](MissClass c) {
    return std::thread([&, c] {
      if (!q.Acquire(c, 1)) refused++;
      {
        std::lock_guard lock(order_mu);
        order.push_back(c);
      }
      dev.Push(c, 1);
    });
  };
  // A prefetch waits first, then a prefill: the prefill goes first.
  std::thread prefetch = waiter(MissClass::kPrefetch);
  WaitFor(q,
          [](const MissQueueStats& s) { return Of(s, MissClass::kPrefetch).waiting_reads == 1; });
  std::thread prefill = waiter(MissClass::kPrefill);
  WaitFor(q, [](const MissQueueStats& s) { return Of(s, MissClass::kPrefill).waiting_reads == 1; });
  // One prefetch read is done: room for one piece, and the prefill's goes first.
  REQUIRE(dev.CompleteOne(q));
  WaitFor(q, [](const MissQueueStats& s) { return Of(s, MissClass::kPrefill).pieces == 1; });
  CHECK(Of(q.Stats(), MissClass::kPrefetch).pieces == 3);
  REQUIRE(dev.CompleteOne(q));
  WaitFor(q, [](const MissQueueStats& s) { return Of(s, MissClass::kPrefetch).pieces == 4; });
  prefetch.join();
  prefill.join();
  CHECK(refused == 0);
  CHECK(order.size() == 2);
  while (dev.CompleteOne(q)) {
  }
  CHECK(q.Stats().completed_reads == 5);
}

TEST_CASE("the queue is bounded: a prefetch past the bound is dropped", "[miss_queue]") {
  MissQueue q({.depth = 4, .max_queued_reads = 4});
  REQUIRE(q.Acquire(MissClass::kDecode, 4));  // the device is full
  std::vector<std::thread> waiting;
  for (int i = 0; i < 4; ++i) {
    waiting.emplace_back([&] {
      if (q.Acquire(MissClass::kPrefill, 1)) q.Release(MissClass::kPrefill, 1);
    });
  }
  WaitFor(q, [](const MissQueueStats& s) { return Of(s, MissClass::kPrefill).waiting_reads == 4; });
  CHECK_FALSE(q.Acquire(MissClass::kPrefetch, 1));
  CHECK(Of(q.Stats(), MissClass::kPrefetch).dropped_reads == 1);
  CHECK(Of(q.Stats(), MissClass::kPrefetch).pieces == 0);
  q.Release(MissClass::kDecode, 4);
  for (std::thread& t : waiting) t.join();
  CHECK(Of(q.Stats(), MissClass::kPrefill).reads == 4);
}

// Waiters of one read each that note the order the queue granted them in. The test thread
// keeps the non-decode share of the device full and frees one read at a time, so that each
// release grants exactly one waiter.
struct GrantOrder {
  MissQueue& q;
  Device& dev;
  std::mutex mu;
  std::vector<std::string> order;
  std::vector<std::thread> threads;
  ~GrantOrder() {
    for (std::thread& t : threads) t.join();
  }
  // Queues `name` and returns once it waits.
  void Queue(const std::string& name, MissClass c, uint64_t due = 0) {
    const uint64_t waiting = Of(q.Stats(), c).waiting_reads;
    threads.emplace_back([this, name, c, due] {
      const bool granted = q.Acquire(c, 1, due);
      if (granted) dev.Push(c, 1);  // before it counts as granted: Drain completes it later
      std::lock_guard lock(mu);
      order.push_back(granted ? name : name + " (refused)");
    });
    WaitFor(q, [&](const MissQueueStats& s) { return Of(s, c).waiting_reads == waiting + 1; });
  }
  size_t Size() {
    std::lock_guard lock(mu);
    return order.size();
  }
  // Waits until `n` waiters have their answer; the answers in the order they came.
  std::vector<std::string> WaitAnswers(size_t n) {
    const uint64_t deadline = NowNs() + 30'000'000'000ull;
    while (Size() < n) {
      REQUIRE(NowNs() < deadline);
      std::this_thread::yield();
    }
    std::lock_guard lock(mu);
    return order;
  }
  // Completes one read at a time until every waiter was granted; the grant order.
  std::vector<std::string> Drain() {
    const size_t n = threads.size();
    for (size_t k = 1; k <= n; ++k) {
      REQUIRE(dev.CompleteOne(q));
      const uint64_t deadline = NowNs() + 30'000'000'000ull;
      while (Size() < k) {
        REQUIRE(NowNs() < deadline);
        std::this_thread::yield();
      }
      // Exactly one grant a release: the others still wait.
      CHECK(Size() == k);
    }
    while (dev.CompleteOne(q)) {
    }
    std::lock_guard lock(mu);
    return order;
  }
};

// Fills what prefill, prefetch and admission may hold of a queue of depth 4 (three reads).
void FillOthersShare(MissQueue& q, Device& dev) {
  REQUIRE(q.PieceReads(MissClass::kPrefill) == 3);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(q.Acquire(MissClass::kPrefill, 1));
    dev.Push(MissClass::kPrefill, 1);
  }
}

// A clock the test moves.
std::atomic<uint64_t> g_now{1'000'000'000};
uint64_t TestNow() { return g_now.load(); }
constexpr uint64_t kSecond = 1'000'000'000, kMs = 1'000'000;

TEST_CASE("admissions go after prefetches, prefetches after prefills", "[miss_queue]") {
  MissQueue q({.depth = 4});
  Device dev;
  FillOthersShare(q, dev);
  GrantOrder g{q, dev};
  g.Queue("admission", MissClass::kAdmission);
  g.Queue("prefetch", MissClass::kPrefetch);
  g.Queue("prefill", MissClass::kPrefill);
  CHECK(g.Drain() == std::vector<std::string>{"prefill", "prefetch", "admission"});
  CHECK(Of(q.Stats(), MissClass::kAdmission).pieces == 1);
}

TEST_CASE("within a class, rows due first go first: layer 1 before 14, this step before the next",
          "[miss_queue]") {
  MissQueue q({.depth = 4, .layer_spacing_ns = kMs, .clock = TestNow});
  Device dev;
  FillOthersShare(q, dev);
  GrantOrder g{q, dev};
  // One step asks for layer 14 first, then layer 1; the next step (20 ms later) asks for layer 1.
  const uint64_t step = g_now;
  g.Queue("step 1 layer 14", MissClass::kPrefill, q.Due(14));
  g.Queue("step 1 layer 1", MissClass::kPrefill, q.Due(1));
  CHECK(q.Due(14) == step + 14 * kMs);
  g_now += 20 * kMs;
  g.Queue("step 2 layer 1", MissClass::kPrefill, q.Due(1));
  // Asked with no due: due when asked, after step 1's layer 14 (14 ms) and before step 2's
  // layer 1 (21 ms).
  g.Queue("step 2 undated", MissClass::kPrefill);
  CHECK(g.Drain() == std::vector<std::string>{"step 1 layer 1", "step 1 layer 14", "step 2 undated",
                                              "step 2 layer 1"});
}

// A queue of depth 4 whose device read 4 rows in its first second of work, a decode step's.
void MeasureFourPerSecond(MissQueue& q) {
  q.Announce(MissClass::kDecode, 4);
  REQUIRE(q.Acquire(MissClass::kDecode, 4));
  g_now += kSecond;
  q.Release(MissClass::kDecode, 4);
  REQUIRE(q.Stats().read_rate_per_s == Approx(4.0));
  REQUIRE(Of(q.Stats(), MissClass::kDecode).pending_reads == 0);
}

TEST_CASE("a device behind sheds prefetch and admission pieces, never a gather's", "[miss_queue]") {
  MissQueue q({.depth = 4, .shed_backlog_ns = kSecond, .clock = TestNow});
  MeasureFourPerSecond(q);
  // A prefill of 8 missed rows starts: with a prefetch's own read, nine reads ahead of it,
  // 2.25 s at 4 a second, though none of the prefill's pieces waits yet.
  q.Announce(MissClass::kPrefill, 8);
  CHECK(q.Stats().backlog_s == Approx(8.0 / 4));
  CHECK_FALSE(q.Acquire(MissClass::kPrefetch, 1));
  CHECK_FALSE(q.Acquire(MissClass::kAdmission, 1));
  MissQueueStats s = q.Stats();
  CHECK(Of(s, MissClass::kPrefetch).shed_reads == 1);
  CHECK(Of(s, MissClass::kAdmission).shed_reads == 1);
  CHECK(Of(s, MissClass::kPrefetch).dropped_reads == 0);
  CHECK(Of(s, MissClass::kPrefetch).pieces == 0);
  // Gathers are never shed: a decode step goes at once, the prefill's pieces wait their turn.
  REQUIRE(q.Acquire(MissClass::kDecode, 1));
  q.Release(MissClass::kDecode, 1);
  // The prefill reads four of its rows: five ahead now, 1.25 s: still behind.
  for (int i = 0; i < 4; ++i) {
    REQUIRE(q.Acquire(MissClass::kPrefill, 1));
    q.Release(MissClass::kPrefill, 1);
  }
  CHECK(Of(q.Stats(), MissClass::kPrefill).pending_reads == 4);
  CHECK_FALSE(q.Acquire(MissClass::kAdmission, 1));
  // Two more: three ahead, 0.75 s: an admission piece goes.
  for (int i = 0; i < 2; ++i) {
    REQUIRE(q.Acquire(MissClass::kPrefill, 1));
    q.Release(MissClass::kPrefill, 1);
  }
  REQUIRE(q.Acquire(MissClass::kAdmission, 1));
  q.Release(MissClass::kAdmission, 1);
  q.Retire(MissClass::kPrefill, 2);  // the prefill failed before its last two rows
  CHECK(Of(q.Stats(), MissClass::kPrefill).pending_reads == 0);
  // With the device idle again, a large admission is work to do, not overload: its pieces go
  // (one device read ahead of each, a quarter of a second).
  q.Announce(MissClass::kAdmission, 20);
  for (int i = 0; i < 20; ++i) {
    REQUIRE(q.Acquire(MissClass::kAdmission, 1));
    q.Release(MissClass::kAdmission, 1);
  }
  CHECK(Of(q.Stats(), MissClass::kAdmission).shed_reads == 2);
  CHECK(Of(q.Stats(), MissClass::kAdmission).pending_reads == 0);
}

TEST_CASE("a prefetch or admission piece that waited too long is shed", "[miss_queue]") {
  MissQueue q({.depth = 4, .shed_backlog_ns = kSecond, .clock = TestNow});
  Device dev;
  FillOthersShare(q, dev);  // no rate measured yet: nothing is shed on arrival
  GrantOrder g{q, dev};
  g.Queue("admission", MissClass::kAdmission);
  g.Queue("prefetch", MissClass::kPrefetch);
  g_now += kSecond / 2;
  g.Queue("late prefetch", MissClass::kPrefetch);
  // 1.2 s on, the first two waited past the second the device may fall behind; the third has
  // waited 0.7 s and is granted at the next release.
  g_now += 7 * kSecond / 10;
  REQUIRE(dev.CompleteOne(q));
  std::vector<std::string> order = g.WaitAnswers(3);
  while (dev.CompleteOne(q)) {
  }
  std::sort(order.begin(), order.end());
  CHECK(order ==
        std::vector<std::string>{"admission (refused)", "late prefetch", "prefetch (refused)"});
  const MissQueueStats s = q.Stats();
  CHECK(Of(s, MissClass::kAdmission).shed_reads == 1);
  CHECK(Of(s, MissClass::kPrefetch).shed_reads == 1);
  CHECK(Of(s, MissClass::kPrefetch).pieces == 1);
  CHECK(Of(s, MissClass::kPrefetch).waiting_reads == 0);
}

TEST_CASE("the queue tells demand against the device's rate", "[miss_queue]") {
  MissQueue q({.depth = 4, .clock = TestNow});
  MeasureFourPerSecond(q);  // 4 reads announced in the first second
  q.Announce(MissClass::kDecode, 8);
  REQUIRE(q.Acquire(MissClass::kDecode, 8));
  g_now += kSecond;
  q.Announce(MissClass::kDecode, 1);  // closes a second in which 8 reads were announced
  REQUIRE(q.Acquire(MissClass::kDecode, 1));
  MissQueueStats s = q.Stats();
  CHECK(s.demand_per_s == Approx(8.0));
  CHECK(s.load == Approx(2.0));           // the device is the bottleneck, twice over
  CHECK(s.backlog_s == Approx(9.0 / 4));  // nine reads in flight at 4 a second
  g_now += 3 * kSecond;                   // nothing announced since: the window went stale
  CHECK(q.Stats().demand_per_s == Approx(1.0 / 3));
  q.Release(MissClass::kDecode, 8);
  q.Release(MissClass::kDecode, 1);
  CHECK(q.Stats().backlog_s == 0);
}

TEST_CASE("each class's waits are kept by length", "[miss_queue]") {
  MissQueue q({.depth = 4, .clock = TestNow});
  REQUIRE(q.Acquire(MissClass::kDecode, 4));
  std::thread prefill([&] {
    if (q.Acquire(MissClass::kPrefill, 1)) q.Release(MissClass::kPrefill, 1);
  });
  WaitFor(q, [](const MissQueueStats& s) { return Of(s, MissClass::kPrefill).waiting_reads == 1; });
  g_now += 3 * kMs;  // the prefill piece waits 3 ms: bucket [2^21, 2^22) ns
  q.Release(MissClass::kDecode, 4);
  prefill.join();
  const MissClassStats p = Of(q.Stats(), MissClass::kPrefill);
  CHECK(p.wait_buckets[21] == 1);
  CHECK(Log2QuantileNs(p.wait_buckets, 0.99) == uint64_t{1} << 22);
  CHECK(Of(q.Stats(), MissClass::kDecode).wait_buckets[0] == 1);  // waited 0 ns
}

TEST_CASE("ReadMisses reads a paged table one page a row, in granted pieces", "[miss_queue]") {
  TempDir dir;
  REQUIRE(dir.ok());
  constexpr uint64_t kRows = 15000, kSeed = 3;
  const std::string path = dir.path() + "/paged.engram";
  REQUIRE(testing::WriteSyntheticPacked(path, 14, kRows, kSeed, /*paged=*/true).ok());
  auto table = RequireTable(path, 14);
  for (MissClass c : {MissClass::kDecode, MissClass::kPrefill}) {
    DYNAMIC_SECTION(MissClassName(c)) {
      auto engine = RequireEngine({.workers = 1});
      REQUIRE(engine->AddTable(table.get(), {.mode = ReadMode::kDirect}).ok());
      MissQueue q({.depth = 64});
      // Rows of pages three apart, in no order, two of them on every ninth page: one read of
      // 4 KiB a page.
      std::vector<uint64_t> rows;
      size_t pages = 0;
      for (uint64_t page = 0; page < 900; page += 3, ++pages) {
        rows.push_back(((page * 7919) % 900 / 3 * 3) * 15 + page % 15);
      }
      for (uint64_t page = 0; page < 900; page += 9) rows.push_back(page * 15 + 14);
      std::vector<uint8_t> bounce, out(rows.size() * kRowBytes, 0xEE);
      std::vector<int> calls(rows.size(), 0);
      REQUIRE(ReadMisses(engine.get(), &q, c, table.get(), rows, bounce,
                         [&](size_t i, const uint8_t* row) {
                           calls[i]++;
                           std::memcpy(out.data() + i * kRowBytes, row, kRowBytes);
                         })
                  .ok());
      CHECK(std::count(calls.begin(), calls.end(), 1) == static_cast<long>(rows.size()));
      CHECK(FirstMismatch(kSeed, *table, rows, out.data()) == -1);
      const TableGatherStats e = StatsOf(*engine);
      // A piece boundary may split one page's two rows: at most one extra read a piece.
      const MissQueueStats s = q.Stats();
      const uint64_t pieces = Of(s, c).pieces;
      CHECK(pieces == (rows.size() + q.PieceReads(c) - 1) / q.PieceReads(c));
      CHECK(e.direct_reads >= pages);
      CHECK(e.direct_reads <= pages + pieces);
      CHECK(e.bytes_read == e.direct_reads * 4096);
      CHECK(Of(s, c).reads == rows.size());
      CHECK(Of(s, c).in_flight_reads == 0);
      CHECK(Of(s, c).pending_reads == 0);  // announced at the start, every one read since
      CHECK(s.completed_reads == rows.size());
    }
  }
}

}  // namespace
}  // namespace engram
