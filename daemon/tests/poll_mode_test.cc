// Polling mode: the rule that picks how many cores spin (PollCores), and the request threads it
// holds awake (RequestPool::Hold), seen through the pool's spin counter.
#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "base/clock.h"
#include "daemon/server/request_pool.h"
#include "daemon/server/server_config.h"

namespace engram {
namespace {

TEST_CASE("auto polls from 16 CPUs up with an eighth of them, at least 2", "[poll]") {
  CHECK(PollCores(PollMode::kAuto, 0, 2) == 0);
  CHECK(PollCores(PollMode::kAuto, 0, 15) == 0);
  CHECK(PollCores(PollMode::kAuto, 0, 16) == 2);
  CHECK(PollCores(PollMode::kAuto, 0, 20) == 2);  // a DGX Spark
  CHECK(PollCores(PollMode::kAuto, 0, 64) == 8);
  CHECK(PollCores(PollMode::kAuto, 5, 16) == 5);
  CHECK(PollCores(PollMode::kAuto, 5, 8) == 0);  // below the machine size auto polls from
  CHECK(PollCores(PollMode::kOn, 0, 2) == 2);
  CHECK(PollCores(PollMode::kOn, 3, 2) == 3);
  CHECK(PollCores(PollMode::kOff, 4, 64) == 0);
}

TEST_CASE("poll modes parse, and a wrong one is named", "[poll]") {
  CHECK(*ParsePollMode("auto") == PollMode::kAuto);
  CHECK(*ParsePollMode("on") == PollMode::kOn);
  CHECK(*ParsePollMode("off") == PollMode::kOff);
  const auto bad = ParsePollMode("always");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("'always'") != std::string::npos);
}

// Waits (bounded) until the pool has spun `ns` in all; false when it did not within 20 s.
bool SpinsAtLeast(const RequestPool& pool, uint64_t ns) {
  const uint64_t give_up = NowNs() + 20'000'000'000;
  while (pool.spin_ns() < ns) {
    if (NowNs() > give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST_CASE("a hold keeps request threads spinning, not asleep, until it ends", "[poll]") {
  // No spell of its own (spin 0): without a hold its threads sleep at once and never spin.
  RequestPool pool(2, /*spin_ns=*/0);
  std::atomic<int> ran{0};
  pool.Post(1, [&] { ran.fetch_add(1); });
  while (ran.load() == 0) std::this_thread::yield();
  CHECK(pool.spin_ns() == 0);
  // A held thread spins until the hold ends (a minute away) and its time is counted as it
  // passes: the counter reaches 30 ms however slowly the machine schedules the thread.
  pool.Hold(1, NowNs() + 60'000'000'000);
  CHECK(SpinsAtLeast(pool, 30'000'000));
  // Work posted while held still runs.
  pool.Post(2, [&] { ran.fetch_add(1); });
  while (ran.load() < 2) std::this_thread::yield();
  // The hold ends: the thread sleeps, and its counter (added to every millisecond while it
  // spins) stands still through a 50 ms window. A thread that went on spinning fails this.
  pool.Hold(1, 0);
  const uint64_t give_up = NowNs() + 20'000'000'000;
  bool still = false;
  while (!still && NowNs() < give_up) {
    const uint64_t before = pool.spin_ns();
    const uint64_t watch = NowNs() + 50'000'000;
    while (NowNs() < watch) std::this_thread::yield();
    still = pool.spin_ns() == before;
  }
  CHECK(still);
}

}  // namespace
}  // namespace engram
