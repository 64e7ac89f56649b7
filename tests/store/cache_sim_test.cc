// The offline cache policies engram-trace-replay sets beside engramd (testkit/cache_sim.h):
// TinyLFU's frequency sketch (counts, saturation, halving, doorkeeper), LRU and S3-FIFO on
// hand-worked small caches, and the workloads where each admission filter must win: a scan
// LRU alone lets through, and a reused set that S3-FIFO alone forgets.
#include "testkit/cache_sim.h"

#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <vector>

namespace engram {
namespace {

// One key a batch: each is looked up, then admitted if it missed.
void Access(auto& sim, std::initializer_list<uint64_t> keys) {
  for (uint64_t k : keys) sim.Batch(std::span<const uint64_t>(&k, 1));
}

TEST_CASE("the sketch counts a key's records, saturates at 15 and halves after its sample") {
  FrequencySketch s(1024, {.doorkeeper = false, .sample_factor = 1});
  CHECK(s.Estimate(7) == 0);
  for (int i = 0; i < 5; ++i) s.Record(7);
  CHECK(s.Estimate(7) == 5);
  for (int i = 0; i < 20; ++i) s.Record(8);
  CHECK(s.Estimate(8) == 15);
  // 25 records so far; the 1,024th halves every counter (and rounds down).
  for (int i = 0; i < 1024 - 25 - 1; ++i) s.Record(99);
  CHECK(s.halvings() == 0);
  s.Record(7);
  CHECK(s.halvings() == 1);
  CHECK(s.Estimate(7) == 3);  // 6 halved
  CHECK(s.Estimate(8) == 7);  // 15 halved
}

TEST_CASE("the doorkeeper takes a key's first record, and forgets it at a halving") {
  FrequencySketch s(64, {.doorkeeper = true, .sample_factor = 1});
  CHECK(s.Estimate(3) == 0);
  s.Record(3);
  CHECK(s.Estimate(3) == 1);
  s.Record(3);
  s.Record(3);
  CHECK(s.Estimate(3) == 3);
  for (int i = 0; i < 61; ++i) s.Record(500);  // the 64th record halves
  REQUIRE(s.halvings() == 1);
  CHECK(s.Estimate(3) == 1);  // the counters' 2 halved; the doorkeeper cleared
}

TEST_CASE("the sketch never counts a key below its records") {
  FrequencySketch s(4096, {.doorkeeper = true, .sample_factor = 100});
  std::mt19937_64 rng(3);
  std::map<uint64_t, uint32_t> truth;
  for (int i = 0; i < 5000; ++i) {
    const uint64_t k = rng() % 2000;
    s.Record(k);
    ++truth[k];
  }
  REQUIRE(s.halvings() == 0);
  uint64_t exact = 0;
  for (auto [k, n] : truth) {
    const uint32_t e = s.Estimate(k);
    CHECK(e >= std::min<uint32_t>(n, 15));
    exact += e == std::min<uint32_t>(n, 15);
  }
  CHECK(exact > truth.size() * 9 / 10);  // 4,096 counters a row for 2,000 keys: mostly exact
}

TEST_CASE("a batch is looked up whole before its misses are admitted, each once") {
  S3FifoSim s3(4);
  const uint64_t batch[] = {5, 5, 6};
  CHECK(s3.Batch(batch) == 0);
  CHECK(s3.Contains(5));
  CHECK(s3.Batch(batch) == 3);
  CHECK(s3.counts.lookups == 6);
  CHECK(s3.counts.hits == 3);
}

TEST_CASE("LRU evicts the least recently used row; TinyLFU admits only a row seen more") {
  LruSim lru(3);
  Access(lru, {1, 2, 3, 1, 4});
  CHECK(lru.counts.hits == 1);
  Access(lru, {2});  // 2 was least recently used when 4 came
  CHECK(lru.counts.hits == 1);

  LruSim filtered(3, true, {.doorkeeper = false});
  Access(filtered, {1, 2, 3, 1, 4});  // 4 (seen once) against 2 (seen once): refused
  CHECK(filtered.counts.rejected == 1);
  Access(filtered, {4});  // 4 seen twice now, 2 once: 2 leaves
  CHECK(filtered.counts.admitted == 1);
  Access(filtered, {1, 3, 4});
  CHECK(filtered.counts.hits == 1 + 3);
}

// A 10-row S3-FIFO: the small FIFO holds 1 row, the ghost 9 keys. Rows 1-10 fill it (all in
// the small FIFO), 1-9 are hit once.
template <typename Sim>
void FillTen(Sim& s) {
  for (uint64_t k = 1; k <= 10; ++k) Access(s, {k});
  for (uint64_t k = 1; k <= 9; ++k) Access(s, {k});
  REQUIRE(s.counts.hits == 9);
}

TEST_CASE("S3-FIFO promotes used rows, evicts an unused one to the ghost, readmits it to main") {
  S3FifoSim s3(10);
  FillTen(s3);
  Access(s3, {11});  // 1-9 move to main, 10 leaves for the ghost, 11 enters the small FIFO
  CHECK(!s3.Contains(10));
  for (uint64_t k = 1; k <= 9; ++k) CHECK(s3.Contains(k));
  CHECK(s3.Contains(11));
  // 10 comes back from the ghost into the main FIFO; the small FIFO is at its share, so its
  // oldest row, 11 (unused), leaves.
  Access(s3, {10});
  CHECK(s3.Contains(10));
  CHECK(!s3.Contains(11));
  CHECK(s3.Contains(1));
}

TEST_CASE("TinyLFU at insert: a miss displaces S3-FIFO's victim only if seen more often") {
  S3FifoSim s3(10, {.admission = TinyLfuAt::kInsert, .sketch = {.doorkeeper = false}});
  FillTen(s3);
  Access(s3, {11});  // 11 (seen once) against the victim 10 (seen once): refused
  CHECK(s3.counts.rejected == 1);
  CHECK(!s3.Contains(11));
  CHECK(s3.Contains(10));
  Access(s3, {11});  // seen twice now: 10 leaves
  CHECK(s3.counts.admitted == 1);
  CHECK(s3.Contains(11));
  CHECK(!s3.Contains(10));
}

TEST_CASE("TinyLFU at insert, variants: ties admitted, keys the ghost remembers let through") {
  S3FifoSim ties(
      10, {.admission = TinyLfuAt::kInsert, .sketch = {.doorkeeper = false}, .admit_ties = true});
  FillTen(ties);
  Access(ties, {11});  // seen once, as the victim 10: in
  CHECK(ties.Contains(11));
  CHECK(!ties.Contains(10));

  S3FifoSim ghost(
      10, {.admission = TinyLfuAt::kInsert, .sketch = {.doorkeeper = false}, .ghost_bypass = true});
  FillTen(ghost);
  Access(ghost, {11, 11});  // refused once, then in; 10 leaves for the ghost
  REQUIRE(!ghost.Contains(10));
  Access(ghost, {10});  // 10 (twice) ties the victim 11 (twice), but the ghost lets it in
  CHECK(ghost.Contains(10));
  CHECK(ghost.counts.rejected == 1);
}

TEST_CASE("TinyLFU at the small FIFO's exit: an unused row seen often takes main's victim") {
  S3FifoSim s3(10, {.admission = TinyLfuAt::kSmallExit, .sketch = {.doorkeeper = false}});
  FillTen(s3);
  Access(s3, {11});  // 10 (seen once) against main's victim 1 (twice): 10 leaves, as in S3-FIFO
  CHECK(s3.counts.rejected == 1);
  CHECK(!s3.Contains(10));
  CHECK(s3.Contains(1));
  const uint64_t thrice[] = {12, 12, 12};  // three misses of one batch, admitted once
  s3.Batch(thrice);  // 11 (once) against 1: 11 leaves, 12 enters the small FIFO
  CHECK(s3.counts.rejected == 2);
  CHECK(!s3.Contains(11));
  Access(s3, {13});  // 12 unused, but seen 3 times against 1's 2: 12 to main, 1 leaves
  CHECK(s3.counts.admitted == 1);
  CHECK(s3.Contains(12));
  CHECK(!s3.Contains(1));
  CHECK(s3.Contains(13));

  S3FifoSim plain(10);  // the same accesses without the filter: 12 leaves, 1 stays
  FillTen(plain);
  Access(plain, {11});
  plain.Batch(thrice);
  Access(plain, {13});
  CHECK(!plain.Contains(12));
  CHECK(plain.Contains(1));
}

// Hits on a hot set of 50 keys (in a 100-row cache) while a one-pass scan of 8,000 keys goes by,
// 4 scan keys before each hot access, after the hot set was read 20 times over. A hot key is
// read 4 times in the sketch's sample (1,000 records): its count outlasts each halving.
template <typename Sim>
double HotHitRateUnderScan(Sim& sim) {
  uint64_t next_scan = 1'000'000, hot_lookups = 0, hot_hits = 0;
  for (int round = 0; round < 20; ++round) {
    for (uint64_t k = 0; k < 50; ++k) Access(sim, {k});
  }
  for (int i = 0; i < 2000; ++i) {
    for (int j = 0; j < 4; ++j) Access(sim, {next_scan++});
    const uint64_t hot = i % 50;
    const uint64_t before = sim.counts.hits;
    Access(sim, {hot});
    hot_hits += sim.counts.hits - before;
    ++hot_lookups;
  }
  return double(hot_hits) / double(hot_lookups);
}

TEST_CASE("a one-pass scan: LRU loses the hot set, TinyLFU in front of it keeps it") {
  LruSim lru(100), lru_tinylfu(100, true);
  S3FifoSim s3(100), s3_tinylfu(100, {.admission = TinyLfuAt::kInsert});
  const double lru_rate = HotHitRateUnderScan(lru);
  const double lru_tinylfu_rate = HotHitRateUnderScan(lru_tinylfu);
  const double s3_rate = HotHitRateUnderScan(s3);
  const double s3_tinylfu_rate = HotHitRateUnderScan(s3_tinylfu);
  INFO("LRU " << lru_rate << ", LRU + TinyLFU " << lru_tinylfu_rate << ", S3-FIFO " << s3_rate
              << ", S3-FIFO + TinyLFU " << s3_tinylfu_rate);
  CHECK(lru_rate < 0.05);  // 249 other keys between a hot key's accesses: always gone
  CHECK(lru_tinylfu_rate > 0.95);
  CHECK(s3_rate > 0.95);  // S3-FIFO resists scans on its own
  CHECK(s3_tinylfu_rate > 0.95);
  INFO("refused " << s3_tinylfu.counts.rejected);
  CHECK(s3_tinylfu.counts.rejected > 7'000);  // most of the scan never got in
}

// 80 keys each reused every 320 accesses, 3 one-time keys before each (a 100-row cache): with
// nothing hit, S3-FIFO's main FIFO stays empty and the small one takes the whole cache, and the
// reuse distance is beyond it and the ghost (90 keys), so S3-FIFO alone never keeps them; the
// sketch knows them as frequent and keeps the one-time keys out. (The filter at the small FIFO's
// exit has no main FIFO to compare against here: it behaves as S3-FIFO.)
TEST_CASE("a reused set past the ghost's reach: TinyLFU at insert keeps it, S3-FIFO does not") {
  auto reused_hit_rate = [](S3FifoSim& sim) {
    uint64_t next_once = 1'000'000, lookups = 0, hits = 0;
    for (int i = 0; i < 80 * 60; ++i) {
      Access(sim, {next_once++, next_once++, next_once++});
      const uint64_t before = sim.counts.hits;
      Access(sim, {uint64_t(i % 80)});
      if (i >= 80 * 10) hits += sim.counts.hits - before, ++lookups;  // after 10 rounds
    }
    return double(hits) / double(lookups);
  };
  S3FifoSim plain(100), at_insert(100, {.admission = TinyLfuAt::kInsert});
  const double plain_rate = reused_hit_rate(plain);
  const double insert_rate = reused_hit_rate(at_insert);
  INFO("S3-FIFO " << plain_rate << ", S3-FIFO + TinyLFU at insert " << insert_rate);
  CHECK(plain_rate < 0.1);
  CHECK(insert_rate > 0.9);
}

}  // namespace
}  // namespace engram
