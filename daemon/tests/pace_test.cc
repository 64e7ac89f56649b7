// The poller's pace predictor: regular bursts give a spin window around the next one, irregular
// ones give none, a skipped step moves the window on, and a change of pace is relearned.
#include "daemon/server/pace.h"

#include <catch2/catch.hpp>
#include <random>

namespace engram {
namespace {

constexpr uint64_t kMs = 1'000'000;

TEST_CASE("regular steps give a window around the next one", "[pace]") {
  PacePredictor p;
  uint64_t t = 1000 * kMs;
  for (int i = 0; i < 5; ++i, t += 10 * kMs) {
    p.OnBurst(t);
    CHECK_FALSE(p.Window(t).has_value());  // not stable yet
  }
  p.OnBurst(t);
  auto w = p.Window(t + 1 * kMs);
  REQUIRE(w.has_value());
  CHECK(p.period_ns() == 10 * kMs);
  CHECK(w->wake_ns == t + 10 * kMs - p.lead_ns());
  CHECK(w->until_ns == t + 10 * kMs + p.lead_ns());
  CHECK(p.lead_ns() == p.options().min_lead_ns);
}

TEST_CASE("jittered steps widen the lead, within its bound", "[pace]") {
  PacePredictor p;
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int64_t> jitter(-300'000, 300'000);
  uint64_t t = 1000 * kMs;
  for (int i = 0; i < 50; ++i, t += 10 * kMs) p.OnBurst(t + jitter(rng));
  REQUIRE(p.predicting());
  CHECK(p.lead_ns() > p.options().min_lead_ns);
  CHECK(p.lead_ns() <= p.options().max_lead_ns);
}

TEST_CASE("irregular bursts are not predicted", "[pace]") {
  PacePredictor p;
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<uint64_t> gap(2 * kMs, 40 * kMs);
  uint64_t t = 1000 * kMs;
  int predicted = 0;
  for (int i = 0; i < 200; ++i) {
    t += gap(rng);
    p.OnBurst(t);
    predicted += p.Window(t).has_value();
  }
  CHECK(predicted == 0);
}

TEST_CASE("a skipped step moves the window on by a period", "[pace]") {
  PacePredictor p;
  uint64_t t = 1000 * kMs;
  for (int i = 0; i < 6; ++i, t += 10 * kMs) p.OnBurst(t);
  const uint64_t last = t - 10 * kMs;
  // The step due at last + 10 ms did not come: after its window the next one is predicted.
  auto w = p.Window(last + 10 * kMs + p.lead_ns() + 1);
  REQUIRE(w.has_value());
  CHECK(w->wake_ns == last + 20 * kMs - p.lead_ns());
}

TEST_CASE("one burst off the pace is passed over", "[pace]") {
  PacePredictor p;
  uint64_t t = 1000 * kMs;
  for (int i = 0; i < 6; ++i, t += 10 * kMs) p.OnBurst(t);
  REQUIRE(p.predicting());
  t += 7 * kMs;  // a late step
  p.OnBurst(t - 10 * kMs);
  CHECK(p.predicting());
  CHECK(p.period_ns() == 10 * kMs);
  p.OnBurst(t);  // back on pace (10 ms after the late one)
  CHECK(p.predicting());
}

TEST_CASE("a new pace is relearned and periods out of range are not predicted", "[pace]") {
  PacePredictor p;
  uint64_t t = 1000 * kMs;
  for (int i = 0; i < 6; ++i, t += 10 * kMs) p.OnBurst(t);
  REQUIRE(p.predicting());
  for (int i = 0; i < 3; ++i, t += 25 * kMs) p.OnBurst(t);  // two bursts off the pace in a row
  CHECK_FALSE(p.predicting());
  for (int i = 0; i < 6; ++i, t += 25 * kMs) p.OnBurst(t);
  CHECK(p.predicting());
  CHECK(p.period_ns() == 25 * kMs);
  PacePredictor fast;
  for (int i = 0; i < 20; ++i) fast.OnBurst(1000 * kMs + i * kMs);  // 1 ms: busy, not paced
  CHECK_FALSE(fast.predicting());
}

}  // namespace
}  // namespace engram
