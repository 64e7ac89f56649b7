// Tests of the row cache's pins and of Admissions: a pinned row outlives any flood of other rows
// and a shrink that moves it, pins count, a cache of nothing but pinned rows still evicts; the
// admissions' bounds per owner and in all, and their release by the owner, by deadline and at the
// owner's end, each taking its pins off.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "store/admissions.h"
#include "store/row_cache.h"
#include "testkit/synthetic.h"

namespace engram {
namespace {

using Catch::Matchers::Contains;

constexpr uint64_t kSeed = 5;
constexpr uint32_t kLayer = 14;

std::unique_ptr<RowCache> MakeCache(uint64_t slots) {
  auto cache =
      RowCache::Create({.max_bytes = 64 * 1024 + RowCache::BytesForSlots(slots) * 2}, nullptr);
  REQUIRE(cache.ok());
  (*cache)->SetCapacitySlots(slots);
  REQUIRE((*cache)->capacity_slots() == slots);
  return std::move(*cache);
}

void Insert(RowCache& cache, uint64_t row) {
  uint8_t data[kRowBytes];
  SyntheticRow(kSeed, kLayer, row, data);
  REQUIRE(cache.Insert(kLayer, row, data).ok());
}

bool InsertPinned(RowCache& cache, uint64_t row) {
  uint8_t data[kRowBytes];
  SyntheticRow(kSeed, kLayer, row, data);
  bool inserted = false, pinned = false;
  REQUIRE(cache.InsertPinned(kLayer, row, data, &inserted, &pinned).ok());
  return pinned;
}

// Rows [first, first + n) go through the cache, each hit once after its insert so that the
// policy keeps it (a scan of rows used once would only cycle S3-FIFO's small queue): evicts
// every unpinned row of a cache of at most n / 2 rows.
void Flood(RowCache& cache, uint64_t first, uint64_t n) {
  uint8_t row[kRowBytes];
  for (uint64_t r = first; r < first + n; ++r) {
    Insert(cache, r);
    (void)cache.Lookup(kLayer, r, row);
  }
}

bool Holds(const RowCache& cache, uint64_t row) { return cache.Contains(kLayer, row); }

TEST_CASE("pinned rows outlive a flood of other rows; unpinned, they go", "[pins]") {
  auto cache = MakeCache(100);
  for (uint64_t r = 0; r < 20; ++r) REQUIRE(InsertPinned(*cache, r));
  for (uint64_t r = 20; r < 30; ++r) Insert(*cache, r);
  REQUIRE(cache->Pin(kLayer, 25));  // held before: pinned in place
  REQUIRE_FALSE(cache->Pin(kLayer, 5000));
  Flood(*cache, 1000, 1000);
  for (uint64_t r = 0; r < 20; ++r) REQUIRE(Holds(*cache, r));
  REQUIRE(Holds(*cache, 25));
  REQUIRE_FALSE(Holds(*cache, 24));
  RowCacheStats st = cache->Stats();
  CHECK(st.pinned_rows == 21);
  CHECK(st.pinned_evictions == 0);
  CHECK(st.used_slots == 100);
  for (uint64_t r = 0; r < 20; ++r) cache->Unpin(kLayer, r);
  cache->Unpin(kLayer, 25);
  CHECK(cache->Stats().pinned_rows == 0);
  Flood(*cache, 5000, 1000);
  for (uint64_t r = 0; r < 30; ++r) REQUIRE_FALSE(Holds(*cache, r));
}

TEST_CASE("pins count: a row pinned twice stays until both let go", "[pins]") {
  auto cache = MakeCache(50);
  REQUIRE(InsertPinned(*cache, 7));
  REQUIRE(InsertPinned(*cache, 7));  // present: a second pin
  cache->Unpin(kLayer, 7);
  Flood(*cache, 1000, 500);
  REQUIRE(Holds(*cache, 7));
  cache->Unpin(kLayer, 7);
  cache->Unpin(kLayer, 7);  // one too many: nothing
  Flood(*cache, 2000, 500);
  REQUIRE_FALSE(Holds(*cache, 7));
  CHECK(cache->Stats().pinned_rows == 0);
}

TEST_CASE("a cache of nothing but pinned rows still takes new rows, counting what it broke",
          "[pins]") {
  auto cache = MakeCache(10);
  for (uint64_t r = 0; r < 10; ++r) REQUIRE(InsertPinned(*cache, r));
  Insert(*cache, 100);
  REQUIRE(Holds(*cache, 100));
  const RowCacheStats st = cache->Stats();
  CHECK(st.pinned_evictions == 1);
  CHECK(st.pinned_rows == 9);
  CHECK(st.used_slots == 10);
}

TEST_CASE("a shrink keeps pinned rows, moving them below the new size with their pins", "[pins]") {
  auto cache = MakeCache(400);
  Flood(*cache, 0, 400);
  // The first and the last rows inserted: one of the two sets lies in slots a shrink to 100
  // empties, whichever end the free list hands out first.
  std::vector<uint64_t> pinned;
  for (uint64_t r = 0; r < 10; ++r) pinned.push_back(r);
  for (uint64_t r = 390; r < 400; ++r) pinned.push_back(r);
  for (uint64_t r : pinned) REQUIRE(cache->Pin(kLayer, r));
  REQUIRE(cache->SetCapacitySlots(100) == 100);
  for (uint64_t r : pinned) REQUIRE(Holds(*cache, r));
  CHECK(cache->Stats().pinned_rows == 20);
  Flood(*cache, 10000, 1000);
  for (uint64_t r : pinned) REQUIRE(Holds(*cache, r));
  for (uint64_t r : pinned) cache->Unpin(kLayer, r);
  CHECK(cache->Stats().pinned_rows == 0);
  CHECK(cache->Stats().pinned_evictions == 0);
}

constexpr uint64_t kOwnerA = 1, kOwnerB = 2;

TEST_CASE("admissions are bounded per owner and in all, naming the setting", "[admissions]") {
  auto cache = MakeCache(1000);
  Admissions admissions({.max_rows = 300, .max_owner_rows = 200}, cache.get());
  CHECK(admissions.MaxRows() == 300);
  REQUIRE(admissions.Reserve(kOwnerA, 1, 0, 150, 0).ok());
  auto over_owner = admissions.Reserve(kOwnerA, 2, 0, 51, 0);
  REQUIRE(over_owner.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(over_owner.status().message()), Contains("memory.admit_session_rows"));
  REQUIRE(admissions.Reserve(kOwnerA, 2, 0, 50, 0).ok());
  REQUIRE(admissions.Reserve(kOwnerB, 1, 0, 100, 0).ok());
  auto over_all = admissions.Reserve(kOwnerB, 1, 0, 1, 0);
  REQUIRE(over_all.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(over_all.status().message()), Contains("memory.admit_rows"));
  AdmissionStats st = admissions.Stats();
  CHECK(st.active == 3);
  CHECK(st.reserved_rows == 300);
  CHECK(st.refused_rows == 52);
  // A release gives its reservation back.
  REQUIRE(admissions.Release(kOwnerA, 1));
  REQUIRE_FALSE(admissions.Release(kOwnerA, 1));
  REQUIRE(admissions.Reserve(kOwnerB, 1, 0, 100, 0).ok());  // B's 200, the owner's bound
  st = admissions.Stats();
  CHECK(st.reserved_rows == 250);
  CHECK(st.released == 1);
}

TEST_CASE("the bound in all is a quarter of the cache by default and never over half",
          "[admissions]") {
  auto cache = MakeCache(1000);
  CHECK(Admissions({}, cache.get()).MaxRows() == 250);
  CHECK(Admissions({.max_rows = 900}, cache.get()).MaxRows() == 500);
  // It follows the cache's present size.
  Admissions admissions({}, cache.get());
  cache->SetCapacitySlots(400);
  CHECK(admissions.MaxRows() == 100);
  REQUIRE_FALSE(admissions.Reserve(kOwnerA, 1, 0, 101, 0).ok());
}

TEST_CASE("a released, expired or ended admission takes its pins off", "[admissions]") {
  auto cache = MakeCache(200);
  Admissions admissions({.max_ttl_ns = 1000}, cache.get());
  auto pin = [&](const std::shared_ptr<Admission>& a, uint64_t first, uint64_t n) {
    for (uint64_t r = first; r < first + n; ++r) {
      REQUIRE(InsertPinned(*cache, r));
      a->Pinned(kLayer, r);
    }
  };
  auto a = admissions.Reserve(kOwnerA, 1, 0, 10, /*now_ns=*/0);     // deadline 1000 (the limit)
  auto b = admissions.Reserve(kOwnerA, 2, 500, 10, /*now_ns=*/0);   // deadline 500
  auto c = admissions.Reserve(kOwnerB, 1, 5000, 10, /*now_ns=*/0);  // asks past it: 1000
  REQUIRE((a.ok() && b.ok() && c.ok()));
  pin(*a, 0, 10);
  pin(*b, 10, 10);
  pin(*c, 20, 10);
  CHECK(cache->Stats().pinned_rows == 30);
  CHECK(admissions.Stats().pinned_rows == 30);
  CHECK(admissions.Expire(499) == 0);
  CHECK(admissions.Expire(500) == 1);  // b
  CHECK((*b)->released());
  CHECK(cache->Stats().pinned_rows == 20);
  // A row pinned for an admission already released is unpinned at once.
  REQUIRE(InsertPinned(*cache, 100));
  (*b)->Pinned(kLayer, 100);
  CHECK(cache->Stats().pinned_rows == 20);
  CHECK(admissions.ReleaseOwner(kOwnerB) == 1);  // c
  CHECK(cache->Stats().pinned_rows == 10);
  REQUIRE(admissions.Release(kOwnerA, 1));  // a
  const AdmissionStats st = admissions.Stats();
  CHECK(cache->Stats().pinned_rows == 0);
  CHECK(st.active == 0);
  CHECK(st.reserved_rows == 0);
  CHECK(st.expired == 1);
  CHECK(st.ended == 1);
  CHECK(st.released == 1);
  // Nothing pinned is left to keep: a flood takes every row.
  Flood(*cache, 1000, 400);
  for (uint64_t r = 0; r < 30; ++r) REQUIRE_FALSE(Holds(*cache, r));
}

TEST_CASE("a later reservation of the same request moves its deadline out", "[admissions]") {
  auto cache = MakeCache(200);
  Admissions admissions({.max_ttl_ns = 1000}, cache.get());
  REQUIRE(admissions.Reserve(kOwnerA, 9, 100, 5, /*now_ns=*/0).ok());
  REQUIRE(admissions.Reserve(kOwnerA, 9, 100, 5, /*now_ns=*/50).ok());
  CHECK(admissions.Stats().active == 1);
  CHECK(admissions.Stats().reserved_rows == 10);
  CHECK(admissions.Expire(100) == 0);
  CHECK(admissions.Expire(150) == 1);
}

}  // namespace
}  // namespace engram
