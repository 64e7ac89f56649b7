// Tests of the memory budget, PSI parsing and the pressure monitor's shrink and grow
// steps (driven through a PSI file the test writes, then against the kernel's own file).
#include "store/memory_budget.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "store/pressure_monitor.h"
#include "testkit/table_test_util.h"

namespace engram {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("the budget refuses what it does not have, naming the asker", "[budget]") {
  MemoryBudget budget(1000);
  REQUIRE(budget.Reserve(600, "resident layer 1").ok());
  absl::Status s = budget.Reserve(500, "resident layer 14");
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE_THAT(std::string(s.message()), Contains("resident layer 14") && Contains("400 of 1000"));
  REQUIRE(budget.used() == 600);
  budget.Give(600);
  REQUIRE(budget.Reserve(1000, "x").ok());
  MemoryBudget unbounded(0);
  REQUIRE(unbounded.Reserve(uint64_t{1} << 60, "x").ok());
  REQUIRE(unbounded.available() == UINT64_MAX);
}

TEST_CASE("the budget is split: fixed pieces first, the row store gets the rest", "[budget]") {
  const uint64_t mib = 1 << 20;
  absl::StatusOr<MemoryPlan> plan = PlanMemory(
      {.budget = 1000 * mib, .process = 50 * mib, .buffers = 30 * mib, .arena_limit = 16ull << 30});
  REQUIRE(plan.ok());
  CHECK(plan->arenas == 250 * mib);  // a quarter: the limit is larger
  CHECK(plan->page_cache == 100 * mib);
  CHECK(plan->store == 1000 * mib - 50 * mib - 30 * mib - 250 * mib - 100 * mib);
  CHECK(plan->process + plan->buffers + plan->arenas + plan->page_cache + plan->store ==
        plan->budget);
  CHECK(plan->unreclaimable() == 900 * mib);
  CHECK_THAT(DescribeMemoryPlan(*plan), Contains("arenas 250.0 MiB") && Contains("= budget"));
  // A smaller arena limit is the arenas' share; the store gets the difference.
  plan = PlanMemory(
      {.budget = 1000 * mib, .process = 50 * mib, .buffers = 30 * mib, .arena_limit = 10 * mib});
  REQUIRE(plan.ok());
  CHECK(plan->arenas == 10 * mib);
  CHECK(plan->store == 810 * mib);
  // Unbounded: no plan.
  plan = PlanMemory({.process = 50 * mib});
  REQUIRE(plan.ok());
  CHECK_FALSE(plan->bounded());
}

TEST_CASE("a budget the pieces do not fit, or larger than the machine, is refused", "[budget]") {
  const uint64_t mib = 1 << 20;
  absl::StatusOr<MemoryPlan> plan = PlanMemory(
      {.budget = 64 * mib, .process = 40 * mib, .buffers = 20 * mib, .arena_limit = 16ull << 30});
  REQUIRE(plan.status().code() == absl::StatusCode::kResourceExhausted);
  const std::string m(plan.status().message());
  CHECK_THAT(m, Contains("process 40.0 MiB") && Contains("buffers 20.0 MiB") &&
                    Contains("arenas 16.0 MiB") && Contains("page cache 6.4 MiB") &&
                    Contains("= 82.4 MiB"));
  // The budget it names is enough.
  const size_t at = m.find("budget to at least ") + 19;
  const double least_mib = std::stod(m.substr(at));
  CHECK(PlanMemory({.budget = uint64_t(least_mib * mib) + mib, .process = 40 * mib,
                    .buffers = 20 * mib, .arena_limit = 16ull << 30})
            .ok());
  plan = PlanMemory({.budget = 32ull << 30, .process = mib, .mem_total = 24ull << 30});
  REQUIRE(plan.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(plan.status().message()),
             Contains("32.00 GiB") && Contains("MemTotal 24.00 GiB"));
}

TEST_CASE("PSI text parses, malformed text is refused", "[pressure]") {
  auto s = ParseMemoryPressure(
      "some avg10=1.00 avg60=0.50 avg300=0.10 total=123456\n"
      "full avg10=0.00 avg60=0.00 avg300=0.00 total=789\n");
  REQUIRE(s.has_value());
  REQUIRE(s->some.total_us == 123456);
  REQUIRE(s->full->total_us == 789);
  REQUIRE_FALSE(ParseMemoryPressure("").has_value());
  REQUIRE_FALSE(ParseMemoryPressure("full total=3\n").has_value());
}

void WritePsi(const std::string& path, uint64_t some_us) {
  std::ofstream out(path, std::ios::trunc);
  out << "some avg10=0.00 avg60=0.00 avg300=0.00 total=" << some_us << "\n"
      << "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
}

TEST_CASE("pressure shrinks the cache step by step and calm grows it back", "[pressure]") {
  testing::TempDir dir;
  const std::string psi = dir / "memory.pressure";
  auto cache = RowCache::Create({.max_bytes = 4 << 20}, nullptr);
  REQUIRE(cache.ok());
  const uint64_t full = (*cache)->capacity_slots();
  std::vector<std::string> notices;
  PressureOptions options{.path = psi, .calm_intervals = 2};
  PressureMonitor monitor(cache->get(), full, options,
                          [&](const std::string& line) { notices.push_back(line); });
  constexpr uint64_t kSecond = 1'000'000'000;
  uint64_t now = kSecond, stalled_us = 0;
  WritePsi(psi, stalled_us);
  REQUIRE_FALSE(monitor.Tick(now).has_value());  // the first sample only sets the baseline

  for (int i = 0; i < 30; ++i) {  // 30 % of every second stalled
    stalled_us += 300'000;
    WritePsi(psi, stalled_us);
    now += kSecond;
    auto stall = monitor.Tick(now);
    REQUIRE(stall.has_value());
    REQUIRE(*stall == Approx(0.3));
  }
  const uint64_t floor = static_cast<uint64_t>(full * options.floor_fraction);
  REQUIRE((*cache)->capacity_slots() == floor);
  REQUIRE(notices.size() >= 5);
  REQUIRE_THAT(notices[0], Contains("memory pressure") && Contains("shrunk") && Contains(psi));
  const size_t shrink_notices = notices.size();

  for (int i = 0; i < 40; ++i) {  // calm
    WritePsi(psi, stalled_us);
    now += kSecond;
    monitor.Tick(now);
  }
  REQUIRE((*cache)->capacity_slots() == full);
  REQUIRE(notices.size() > shrink_notices);
  REQUIRE_THAT(notices.back(), Contains("grown"));

  // An unreadable file is no sample, and changes nothing.
  std::filesystem::remove(psi);
  REQUIRE_FALSE(monitor.Tick(now + kSecond).has_value());
  REQUIRE((*cache)->capacity_slots() == full);
}

TEST_CASE("a PSI file named that cannot be read as one is refused at start, naming it",
          "[pressure]") {
  testing::TempDir dir;
  auto cache = RowCache::Create({.max_bytes = 1 << 20}, nullptr);
  REQUIRE(cache.ok());
  const std::string missing = dir / "no-such-file";
  PressureMonitor absent(cache->get(), (*cache)->capacity_slots(), {.path = missing},
                         [](const std::string&) {});
  absl::Status s = absent.Start();
  REQUIRE(absl::IsNotFound(s));
  REQUIRE_THAT(std::string(s.message()), Contains(missing));
  const std::string garbage = dir / "garbage";
  std::ofstream(garbage) << "not PSI\n";
  PressureMonitor unreadable(cache->get(), (*cache)->capacity_slots(), {.path = garbage},
                             [](const std::string&) {});
  s = unreadable.Start();
  REQUIRE(absl::IsNotFound(s));
  REQUIRE_THAT(std::string(s.message()), Contains(garbage));
}

// Run alone (meson test store_pressure_kernel): it exits 77 where the kernel has no PSI.
TEST_CASE("the kernel's PSI file is found and sampled", "[psi]") {
  auto path = FindMemoryPressureFile();
  if (!path.ok()) {
    std::fprintf(stderr, "%s: skipping\n", std::string(path.status().message()).c_str());
    std::exit(77);
  }
  auto cache = RowCache::Create({.max_bytes = 1 << 20}, nullptr);
  REQUIRE(cache.ok());
  PressureMonitor monitor(cache->get(), (*cache)->capacity_slots(),
                          {.path = *path, .interval_ns = 20'000'000}, [](const std::string&) {});
  REQUIRE(monitor.Start().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  monitor.Stop();
  REQUIRE(monitor.path() == *path);
}

}  // namespace
}  // namespace engram
