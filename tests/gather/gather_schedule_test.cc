// The gather engine's scheduler: a batch is shared with workers only when its measured work pays
// for them, never with more than the workers, and a pool thread helping one batch turns to
// another batch's waiting task after its current chunk.
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <memory>
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

TEST_CASE("an O_DIRECT batch fans out over direct_max_helpers helpers at most",
          "[gather][schedule]") {
  Fixture f;
  for (uint32_t cap : {1u, 2u}) {
    auto engine = RequireEngine(
        {.workers = 4, .split_reads = 64, .helper_min_work_ns = 1, .direct_max_helpers = cap});
    REQUIRE(engine->AddTable(f.table.get(), {.mode = ReadMode::kDirect}).ok());
    std::vector<uint8_t> out;
    for (int b = 0; b < 3; ++b) {
      const auto rows = RandomRows(4000, 30 + b);
      REQUIRE(GatherInto(*engine, *f.table, rows, out).ok());
      CHECK(FirstMismatch(kSeed, *f.table, rows, out.data()) == -1);
    }
    const TableGatherStats s = StatsOf(*engine);
    INFO("cap " << cap << ": fanned out " << s.fanout_batches << " of " << s.batches << ", helpers "
                << s.helper_tasks);
    CHECK(s.direct_reads > 0);
    CHECK(s.fanout_batches == 3);  // the work pays for helpers: the cap, not the cost, bounds them
    CHECK(s.helper_tasks == 3 * cap);
  }
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

// Ordering between the threads of a scheduling test: each step waits for an event the other
// side records, never for time to pass. A wait gives up after kPatience (the CHECKs after it
// then fail) so that a scheduler that never delivers the event fails instead of hanging.
class Events {
 public:
  static constexpr std::chrono::seconds kPatience{10};
  template <typename Predicate>
  bool WaitFor(Predicate ready, std::chrono::milliseconds patience = kPatience) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, patience, ready);
  }
  template <typename Change>
  void Record(Change change) {
    {
      std::lock_guard<std::mutex> l(mu_);
      change();
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

TEST_CASE("a pool thread helping one batch turns to another batch's task after its chunk",
          "[gather][schedule]") {
  ThreadPool pool(1, /*spin_ns=*/0, [] { return std::make_unique<ReaderContext>(); });
  ReaderContext caller_a, caller_b;
  Events events;
  // Guarded by events: the pool thread is inside one of A's indexes; B's helper task is queued
  // (B's caller posts it before claiming its first index); the pool thread ran one of B's.
  bool pool_in_a = false, b_queued = false, pool_helped_b = false;
  int a_indexes_on_pool_after_b = 0;  // what turning after the current chunk makes 0
  std::atomic<int> a_done{0};
  std::thread a([&] {
    ParallelFor(&pool, 60, 1, caller_a, [&](size_t, ReaderContext& ctx) {
      if (&ctx == &caller_a) {
        // A's caller leaves A's indexes to the pool thread until it has turned to B.
        events.WaitFor([&] { return pool_helped_b; });
      } else {
        events.Record([&] {
          pool_in_a = true;
          if (b_queued && !pool_helped_b) ++a_indexes_on_pool_after_b;
        });
        events.WaitFor([&] { return b_queued; });
      }
      a_done.fetch_add(1);
    });
  });
  CHECK(events.WaitFor([&] { return pool_in_a; }));  // not REQUIRE: thread a must be joined
  ParallelFor(&pool, 4, 1, caller_b, [&](size_t, ReaderContext& ctx) {
    if (&ctx == &caller_b) {
      events.Record([&] { b_queued = true; });
      events.WaitFor([&] { return pool_helped_b; });
    } else {
      events.Record([&] { pool_helped_b = true; });
    }
  });
  a.join();
  CHECK(a_done.load() == 60);
  CHECK(pool_helped_b);
  // Without turning, the pool thread would stay with A until its indexes were gone.
  CHECK(a_indexes_on_pool_after_b == 0);
}

TEST_CASE("helpers step aside while asked to and come back after", "[gather][schedule]") {
  ThreadPool pool(2, /*spin_ns=*/0, [] { return std::make_unique<ReaderContext>(); });
  ReaderContext caller;
  // Shared with the predicate: a late helper may ask it after ParallelFor returned.
  const auto aside_flag = std::make_shared<std::atomic<bool>>(false);
  std::atomic<bool>& aside = *aside_flag;
  Events events;
  // Guarded by events. Phases, driven by the caller's indexes: 0 until a helper runs an index
  // (held there until the flag goes up), 1 with the flag up for kAsideIndexes of the caller's,
  // 2 after the flag went down, until a helper runs an index again.
  constexpr int kAsideIndexes = 10;
  int phase = 0, caller_aside_indexes = 0;
  int helper_indexes[3] = {0, 0, 0};  // helper indexes started in each phase
  ParallelFor(
      &pool, 200, 2, caller,
      [&](size_t, ReaderContext& ctx) {
        if (&ctx != &caller) {
          int started_in = 0;
          events.Record([&] { ++helper_indexes[started_in = phase]; });
          if (started_in == 0) events.WaitFor([&] { return phase > 0; });
          // A pause for the helpers to run ahead in if they ignored the flag; nothing is timed.
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          return;
        }
        int now = 0;
        events.Record([&] { now = phase; });
        if (now == 0) {
          events.WaitFor([&] { return helper_indexes[0] > 0; });
          aside = true;  // before the phase changes: a helper started in phase 1 saw it up...
          events.Record([&] { phase = 1; });
        } else if (now == 1) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          bool last = false;
          events.Record([&] { last = ++caller_aside_indexes == kAsideIndexes; });
          if (last) {
            aside = false;
            events.Record([&] { phase = 2; });
            return;  // the caller brings the helpers back before claiming its next index
          }
        } else {
          // Between two of its indexes the caller brings back the helpers that have left: wait
          // for one a while, then let the caller look again (190 indexes: over 9 s in all).
          events.WaitFor([&] { return helper_indexes[2] > 0; }, std::chrono::milliseconds(50));
        }
      },
      [aside_flag] { return aside_flag->load(); });
  INFO("helper indexes started before, while and after the helpers were asked to step aside: "
       << helper_indexes[0] << ", " << helper_indexes[1] << ", " << helper_indexes[2]);
  CHECK(helper_indexes[0] > 0);
  CHECK(caller_aside_indexes == kAsideIndexes);
  // ...or had claimed its index just before: at most one per pool thread.
  CHECK(helper_indexes[1] <= 2);
  CHECK(helper_indexes[2] > 0);
}

}  // namespace
}  // namespace engram::testing
