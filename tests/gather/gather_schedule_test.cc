// The gather engine's scheduler: a batch is shared with workers only when its measured work pays
// for them, never with more than the workers, and a pool thread helping one batch turns to
// another batch's waiting task after its current chunk.
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "gather/thread_pool.h"
#include "tests/gather/gather_catch_util.h"

namespace engram::testing {
namespace {

constexpr uint64_t kSeed = 5;
constexpr uint32_t kLayer = 14;
constexpr uint64_t kRows = 200000;

std::vector<uint64_t> RandomRows(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> rows(n);
  for (auto& r : rows) r = rng() % kRows;
  return rows;
}

struct Fixture {
  TempDir dir;
  std::unique_ptr<Table> table;
  Fixture() {
    REQUIRE(dir.ok());
    const std::string path = dir.path() + "/t.engram";
    REQUIRE(WriteSyntheticPacked(path, kLayer, kRows, kSeed).ok());
    table = RequireTable(path, kLayer);
    Warm(*table);
  }
};

TEST_CASE("a decode-sized batch whose work does not pay for a helper stays on the caller",
          "[gather][schedule]") {
  Fixture f;
  auto engine =
      RequireEngine({.workers = 4, .split_reads = 64, .helper_min_work_ns = 1'000'000'000});
  REQUIRE(engine->AddTable(f.table.get(), {}).ok());
  std::vector<uint8_t> out;
  const auto rows = RandomRows(1152, 1);
  for (int i = 0; i < 3; ++i) REQUIRE(GatherInto(*engine, *f.table, rows, out).ok());
  CHECK(FirstMismatch(kSeed, *f.table, rows, out.data()) == -1);
  const TableGatherStats s = StatsOf(*engine);
  CHECK(s.batches == 3);
  CHECK(s.fanout_batches == 0);
  CHECK(s.helper_tasks == 0);
}

TEST_CASE("a batch whose work pays for helpers fans out, never over more than the workers",
          "[gather][schedule]") {
  Fixture f;
  auto engine = RequireEngine({.workers = 3, .split_reads = 64, .helper_min_work_ns = 1});
  REQUIRE(engine->AddTable(f.table.get(), {}).ok());
  std::vector<uint8_t> out;
  const auto rows = RandomRows(20000, 2);
  REQUIRE(GatherInto(*engine, *f.table, rows, out).ok());
  CHECK(FirstMismatch(kSeed, *f.table, rows, out.data()) == -1);
  const TableGatherStats s = StatsOf(*engine);
  CHECK(s.fanout_batches == 1);
  CHECK(s.helper_tasks >= 1);
  CHECK(s.helper_tasks <= 3);
}

TEST_CASE("concurrent batches never get more helpers than the workers between them",
          "[gather][schedule]") {
  Fixture f;
  auto engine = RequireEngine({.workers = 1, .split_reads = 64, .helper_min_work_ns = 1});
  REQUIRE(engine->AddTable(f.table.get(), {}).ok());
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> out;
      for (int b = 0; b < 6; ++b) {
        const auto rows = RandomRows(20000, 100 + t * 10 + b);
        if (!GatherInto(*engine, *f.table, rows, out).ok() ||
            FirstMismatch(kSeed, *f.table, rows, out.data()) != -1) {
          bad++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
  const TableGatherStats s = StatsOf(*engine);
  INFO("fanned out: " << s.fanout_batches << " of " << s.batches
                      << ", helpers allowed: " << s.helper_tasks);
  CHECK(s.helper_tasks <= s.fanout_batches);  // one worker: at most one helper per batch
}

TEST_CASE("a batch no larger than split_reads never fans out", "[gather][schedule]") {
  Fixture f;
  auto engine = RequireEngine({.workers = 4, .split_reads = 1u << 20, .helper_min_work_ns = 1});
  REQUIRE(engine->AddTable(f.table.get(), {}).ok());
  std::vector<uint8_t> out;
  const auto rows = RandomRows(20000, 3);
  REQUIRE(GatherInto(*engine, *f.table, rows, out).ok());
  CHECK(FirstMismatch(kSeed, *f.table, rows, out.data()) == -1);
  CHECK(StatsOf(*engine).fanout_batches == 0);
}

TEST_CASE("a batch that went cold costs one wave of NOWAIT misses, not one per chunk",
          "[gather][schedule][nowait]") {
  Fixture f;
  std::atomic<uint64_t> nowait_calls{0};
  GatherEngineOptions o{.workers = 3, .split_reads = 64, .helper_min_work_ns = 1};
  o.read_fn = [&](int fd, const iovec* iov, int cnt, off_t off, int flags) {
    if (flags & RWF_NOWAIT) nowait_calls.fetch_add(1);
    return RealRead(fd, iov, cnt, off, flags);
  };
  auto engine = RequireEngine(o);
  REQUIRE(engine->AddTable(f.table.get(), {}).ok());
  std::vector<uint8_t> out;
  const auto warm = RandomRows(2000, 4);
  REQUIRE(GatherInto(*engine, *f.table, warm, out).ok());  // the policy has seen a warm table
  REQUIRE(StatsOf(*engine).nowait_enabled);
  Evict(*f.table);
  nowait_calls = 0;
  const auto rows = RandomRows(20000, 5);
  REQUIRE(GatherInto(*engine, *f.table, rows, out).ok());
  CHECK(FirstMismatch(kSeed, *f.table, rows, out.data()) == -1);
  const TableGatherStats s = StatsOf(*engine);
  CHECK(s.fanout_batches == 2);
  INFO("NOWAIT reads tried on the cold batch: " << nowait_calls.load());
  // One wave of probe_reads (32) reads, each at most a few calls when it comes back partial;
  // a wave per chunk would be 16 x 32.
  CHECK(nowait_calls.load() <= 2 * o.probe_reads);
  CHECK_FALSE(s.nowait_enabled);
}

TEST_CASE("a pool thread helping one batch turns to another batch's task after its chunk",
          "[gather][schedule]") {
  ThreadPool pool(1, /*spin_ns=*/0, [] { return std::make_unique<ReaderContext>(); });
  ReaderContext caller_a, caller_b;
  std::atomic<int> a_done{0};
  std::atomic<int> a_done_when_b_helped{-1};
  const auto slow = [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  std::thread a([&] {
    ParallelFor(&pool, 60, 1, caller_a, [&](size_t, ReaderContext&) {
      slow(1);
      a_done.fetch_add(1);
    });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ParallelFor(&pool, 4, 1, caller_b, [&](size_t, ReaderContext& ctx) {
    if (&ctx != &caller_b) {
      int expected = -1;
      a_done_when_b_helped.compare_exchange_strong(expected, a_done.load());
    }
    slow(5);
  });
  a.join();
  CHECK(a_done.load() == 60);
  INFO("batch A's indexes done when the pool thread first helped batch B: "
       << a_done_when_b_helped.load());
  // Without turning, the pool thread would stay with A until its 60 indexes were gone.
  CHECK(a_done_when_b_helped.load() >= 0);
  CHECK(a_done_when_b_helped.load() < 40);
}

TEST_CASE("helpers step aside while asked to and come back after", "[gather][schedule]") {
  ThreadPool pool(2, /*spin_ns=*/0, [] { return std::make_unique<ReaderContext>(); });
  ReaderContext caller;
  std::atomic<bool> aside{false};
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  auto ms_since = [&] {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  std::mutex mu;
  std::vector<double> helper_starts;  // ms since t0 of every index a helper started
  double aside_from = 0, aside_until = 0;
  std::thread flip([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    aside_from = ms_since();
    aside = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    aside_until = ms_since();
    aside = false;
  });
  ParallelFor(
      &pool, 80, 2, caller,
      [&](size_t, ReaderContext& ctx) {
        if (&ctx != &caller) {
          std::lock_guard<std::mutex> l(mu);
          helper_starts.push_back(ms_since());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      },
      [&] { return aside.load(); });
  flip.join();
  size_t during = 0, after = 0;
  for (double t : helper_starts) {
    // An index a helper had claimed when the flag went up may start a moment later.
    if (t > aside_from + 3 && t < aside_until) ++during;
    if (t > aside_until) ++after;
  }
  INFO("helper indexes: " << helper_starts.size() << ", during the aside window: " << during
                          << ", after it: " << after);
  CHECK(during == 0);
  CHECK(after > 0);
}

}  // namespace
}  // namespace engram::testing
