// Tests of RowCache::Adopt: a region handed over keeps its rows byte-exact and hits at once; a
// slot being written when the earlier writer stopped, a row of a layer no longer served, a
// duplicate key and a garbage bucket index never serve a wrong row; garbage headers, another
// version and other tables' identities are refused; an adopted region larger than the budget
// allows is shrunk by policy; slots whose bytes were scribbled on or whose keys were swapped
// fail their check word and are dropped; ProveRows drops the rows that differ from their files.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "store/row_cache.h"
#include "testkit/synthetic.h"

namespace engram {
namespace {

constexpr uint64_t kSeed = 23;
constexpr uint64_t kIdentity = 0x5eed0000cafe0001ull;

std::unique_ptr<RowCache> MakeCache(uint64_t slots, uint64_t identity = kIdentity) {
  auto cache = RowCache::Create(
      {.max_bytes = 64 * 1024 + RowCache::BytesForSlots(slots) * 2, .tables_identity = identity},
      nullptr);
  REQUIRE(cache.ok());
  (*cache)->SetCapacitySlots(slots);
  return std::move(*cache);
}

void Fill(RowCache& cache, uint32_t layer, uint64_t rows) {
  uint8_t data[kRowBytes];
  for (uint64_t r = 0; r < rows; ++r) {
    SyntheticRow(kSeed, layer, r * 3, data);
    REQUIRE(cache.Insert(layer, r * 3, data).ok());
  }
}

// A hit must carry exactly the synthetic bytes of that row.
bool Hit(RowCache& cache, uint32_t layer, uint64_t row) {
  uint8_t got[kRowBytes], want[kRowBytes];
  if (!cache.Lookup(layer, row, got)) return false;
  SyntheticRow(kSeed, layer, row, want);
  if (std::memcmp(got, want, kRowBytes) != 0)
    FAIL("wrong bytes: layer " << layer << " row " << row);
  return true;
}

UniqueFd Dup(const RowCache& cache) { return UniqueFd(fcntl(cache.fd(), F_DUPFD_CLOEXEC, 3)); }

bool KeepAll(uint32_t, uint64_t) { return true; }

RowCacheHeader* HeaderOf(int fd, void** ret_map, uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(p != MAP_FAILED);
  *ret_map = p;
  return static_cast<RowCacheHeader*>(p);
}

TEST_CASE("an adopted region serves every row it held, byte-exact, at once", "[adopt]") {
  UniqueFd fd;
  uint64_t used = 0;
  {
    auto cache = MakeCache(2000);
    Fill(*cache, 1, 800);
    Fill(*cache, 14, 800);
    for (uint64_t r = 0; r < 100; ++r) REQUIRE(Hit(*cache, 14, r * 3));  // some in the main FIFO
    used = cache->Stats().used_slots;
    fd = Dup(*cache);
  }  // the earlier daemon is gone; the memfd lives on in `fd`
  RowCacheAdoption a;
  auto adopted =
      RowCache::Adopt(std::move(fd), {.tables_identity = kIdentity}, nullptr, KeepAll, &a);
  REQUIRE(adopted.ok());
  RowCache& cache = **adopted;
  REQUIRE(a.kept == used);
  REQUIRE(a.torn == 0);
  REQUIRE(cache.Stats().used_slots == used);
  uint64_t hits = 0;
  for (uint32_t layer : {1u, 14u}) {
    for (uint64_t r = 0; r < 800; ++r) hits += Hit(cache, layer, r * 3);
    REQUIRE_FALSE(Hit(cache, layer, 1));
  }
  REQUIRE(hits == used);
  // The policy goes on: new rows are admitted and evict adopted ones, still byte-exact.
  Fill(cache, 2, 3000);
  REQUIRE(cache.Stats().used_slots <= cache.capacity_slots());
  for (uint64_t r = 2990; r < 3000; ++r) REQUIRE(Hit(cache, 2, r * 3));
  for (uint64_t r = 0; r < 800; ++r) (void)Hit(cache, 14, r * 3);
}

TEST_CASE("adoption drops torn slots, unserved rows and duplicates and rebuilds the index",
          "[adopt]") {
  auto cache = MakeCache(500);
  Fill(*cache, 1, 300);
  Fill(*cache, 7, 100);
  void* map = nullptr;
  const uint64_t bytes = cache->region_bytes();
  auto* h = HeaderOf(cache->fd(), &map, bytes);
  auto* buckets = reinterpret_cast<RowCacheBucket*>(static_cast<uint8_t*>(map) + h->buckets_offset);
  auto* slots = reinterpret_cast<RowCacheSlot*>(static_cast<uint8_t*>(map) + h->slots_offset);
  // Find the slots of two rows of layer 1: one left torn (a writer stopped in the middle), and
  // one whose key another slot holds too (a move between slots cut short).
  auto slot_of = [&](uint64_t key) -> RowCacheSlot* {
    for (uint32_t i = 0; i < h->max_slots; ++i) {
      if (slots[i].key.load() == key) return &slots[i];
    }
    return nullptr;
  };
  RowCacheSlot* torn = slot_of(RowCacheKey(1, 0));
  REQUIRE(torn != nullptr);
  torn->seq.store(torn->seq.load() + 1);
  RowCacheSlot* dup_src = slot_of(RowCacheKey(1, 3));
  RowCacheSlot* dup_dst = slot_of(RowCacheKey(1, 6));
  // A move cut short: the row, its key and check written into the second slot, the first not
  // cleared.
  for (size_t w = 0; w < kRowCacheRowWords; ++w) dup_dst->row[w].store(dup_src->row[w].load());
  dup_dst->key.store(RowCacheKey(1, 3));
  dup_dst->check.store(dup_src->check.load());
  // Garbage in the index: every bucket points at slot 1.
  for (uint32_t b = 0; b < h->bucket_count; ++b) buckets[b].store(1);
  UniqueFd fd = Dup(*cache);
  cache.reset();
  RowCacheAdoption a;
  auto adopted = RowCache::Adopt(
      std::move(fd), {.tables_identity = kIdentity}, nullptr,
      [](uint32_t layer, uint64_t row) { return layer == 1 && row < 600; }, &a);
  REQUIRE(adopted.ok());
  REQUIRE(a.torn == 1);
  REQUIRE(a.duplicates == 1);
  REQUIRE(a.not_served == 100 + 100);  // layer 7, and layer 1's rows from 600 on
  REQUIRE(a.kept == 300 - 100 - 2);
  uint64_t hits = 0;
  for (uint64_t r = 0; r < 300; ++r) hits += Hit(**adopted, 1, r * 3);  // FAILs on wrong bytes
  REQUIRE(hits == a.kept);
  REQUIRE_FALSE(Hit(**adopted, 1, 0));
  for (uint64_t r = 0; r < 100; ++r) REQUIRE_FALSE(Hit(**adopted, 7, r * 3));
  munmap(map, bytes);
}

// Every slot that holds a key carries the check of that key and row (kRowCacheFlagRowCheck);
// returns how many slots hold a key.
uint64_t CheckSlots(const RowCacheHeader* h, const uint8_t* base) {
  REQUIRE((h->flags & kRowCacheFlagRowCheck) != 0);
  const auto* slots = reinterpret_cast<const RowCacheSlot*>(base + h->slots_offset);
  uint64_t keyed = 0;
  for (uint32_t i = 0; i < h->capacity_slots.load(); ++i) {
    const uint64_t key = slots[i].key.load();
    if (key == 0) continue;
    uint8_t row[kRowBytes];
    LoadRowCacheRow(slots[i], row);
    INFO("slot " << i << " key " << key);
    REQUIRE(slots[i].check.load() == RowCacheCheck(key, row));
    ++keyed;
  }
  return keyed;
}

TEST_CASE("every row written carries its row check; a region written without them gets them",
          "[adopt]") {
  auto cache = MakeCache(600);
  Fill(*cache, 1, 900);  // evicts: slots are rewritten with other rows
  void* map = nullptr;
  const uint64_t bytes = cache->region_bytes();
  auto* h = HeaderOf(cache->fd(), &map, bytes);
  const auto* base = static_cast<const uint8_t*>(map);
  const uint64_t used = cache->Stats().used_slots;
  REQUIRE(CheckSlots(h, base) == used);
  // A check says whether words are one row's: another key, or one word of another row, fails.
  const auto* slots = reinterpret_cast<const RowCacheSlot*>(base + h->slots_offset);
  uint8_t row[kRowBytes];
  LoadRowCacheRow(slots[0], row);
  const uint64_t key = slots[0].key.load();
  REQUIRE(RowCacheCheck(key + 1, row) != slots[0].check.load());
  row[kRowBytes - 1] ^= 1;
  REQUIRE(RowCacheCheck(key, row) != slots[0].check.load());
  // As an engramd before row checks left it: no flag, and checks that are not the rows'.
  h->flags &= ~kRowCacheFlagRowCheck;
  auto* writable = reinterpret_cast<RowCacheSlot*>(static_cast<uint8_t*>(map) + h->slots_offset);
  for (uint32_t i = 0; i < h->max_slots; ++i) writable[i].check.store(0);
  UniqueFd fd = Dup(*cache);
  cache.reset();
  RowCacheAdoption a;
  auto adopted =
      RowCache::Adopt(std::move(fd), {.tables_identity = kIdentity}, nullptr, KeepAll, &a);
  REQUIRE(adopted.ok());
  REQUIRE(a.kept == used);
  REQUIRE(CheckSlots(h, base) == used);
  munmap(map, bytes);
}

// The slots of a cache as a writable mapping, for tests that damage them.
struct MappedSlots {
  explicit MappedSlots(const RowCache& cache) : bytes(cache.region_bytes()) {
    h = HeaderOf(cache.fd(), &map, bytes);
    slots = reinterpret_cast<RowCacheSlot*>(static_cast<uint8_t*>(map) + h->slots_offset);
  }
  ~MappedSlots() { munmap(map, bytes); }
  RowCacheSlot* Of(uint64_t key) {
    for (uint32_t i = 0; i < h->capacity_slots.load(); ++i) {
      if (slots[i].key.load() == key) return &slots[i];
    }
    FAIL("no slot holds key " << key);
    return nullptr;
  }
  uint64_t bytes;
  void* map = nullptr;
  RowCacheHeader* h = nullptr;
  RowCacheSlot* slots = nullptr;
};

TEST_CASE("slots whose row bytes were scribbled on or whose keys were swapped are dropped",
          "[adopt]") {
  auto cache = MakeCache(1000);
  Fill(*cache, 1, 600);
  Fill(*cache, 7, 200);
  const uint64_t used = cache->Stats().used_slots;
  REQUIRE(used == 800);
  MappedSlots m(*cache);
  // 10 slots of layer 1 with a word of their row scribbled on: the key stays, the bytes are
  // not that row's any more.
  std::vector<uint64_t> damaged;
  for (uint64_t r = 0; r < 10; ++r) {
    const uint64_t row = (r * 37) * 3;
    RowCacheSlot* s = m.Of(RowCacheKey(1, row));
    s->row[r % kRowCacheRowWords].store(s->row[r % kRowCacheRowWords].load() ^ 0xdeadbeefull);
    damaged.push_back(row);
  }
  // 20 slots (10 pairs, 5 pairs in each layer) whose keys were swapped: each serves the other's
  // row under its key.
  for (uint64_t p = 0; p < 10; ++p) {
    const uint32_t layer = p < 5 ? 1 : 7;
    const uint64_t a = (p * 41 + 1) * 3 % (layer == 1 ? 1800 : 600);
    const uint64_t b = a + 3;
    REQUIRE(std::find(damaged.begin(), damaged.end(), a) == damaged.end());
    RowCacheSlot* sa = m.Of(RowCacheKey(layer, a));
    RowCacheSlot* sb = m.Of(RowCacheKey(layer, b));
    sa->key.store(RowCacheKey(layer, b));
    sb->key.store(RowCacheKey(layer, a));
    if (layer == 1) {
      damaged.push_back(a);
      damaged.push_back(b);
    }
  }
  REQUIRE(damaged.size() == 20);
  UniqueFd fd = Dup(*cache);
  cache.reset();
  RowCacheAdoption a;
  auto adopted =
      RowCache::Adopt(std::move(fd), {.tables_identity = kIdentity}, nullptr, KeepAll, &a);
  REQUIRE(adopted.ok());
  CHECK(a.bad_check == 30);
  CHECK(a.bad_check_by_layer == std::map<uint32_t, uint64_t>{{1, 20}, {7, 10}});
  CHECK(a.duplicates == 0);
  CHECK(a.kept == used - 30);
  // Every row served is byte-exact (Hit FAILs otherwise); the damaged ones are misses.
  uint64_t hits = 0;
  for (uint64_t r = 0; r < 600; ++r) hits += Hit(**adopted, 1, r * 3);
  for (uint64_t r = 0; r < 200; ++r) hits += Hit(**adopted, 7, r * 3);
  CHECK(hits == used - 30);
  for (const uint64_t row : damaged) CHECK_FALSE(Hit(**adopted, 1, row));
}

TEST_CASE("ProveRows drops every row that differs from its file, or is not compared in time",
          "[adopt]") {
  auto cache = MakeCache(1000);
  Fill(*cache, 1, 500);
  Fill(*cache, 9, 300);
  UniqueFd fd = Dup(*cache);
  cache.reset();
  RowCacheAdoption a;
  auto adopted =
      RowCache::Adopt(std::move(fd), {.tables_identity = kIdentity}, nullptr, KeepAll, &a);
  REQUIRE(adopted.ok());
  REQUIRE(a.kept == 800);
  // The "files" now: synthetic rows, except every 50th row of layer 9, rewritten.
  auto rewritten = [](uint32_t layer, uint64_t row) { return layer == 9 && row % 150 == 0; };
  uint64_t reads = 0;
  size_t largest_piece = 0;
  auto read = [&](uint32_t layer, std::span<const uint64_t> rows, uint8_t* dest) {
    largest_piece = std::max(largest_piece, rows.size());
    for (size_t k = 0; k < rows.size(); ++k) {
      REQUIRE((k == 0 || rows[k - 1] < rows[k]));  // ascending within a piece
      SyntheticRow(kSeed + (rewritten(layer, rows[k]) ? 1 : 0), layer, rows[k],
                   dest + k * kRowBytes);
      ++reads;
    }
    return absl::OkStatus();
  };
  RowCacheProof proof;
  REQUIRE((*adopted)->ProveRows(read, /*deadline_ns=*/0, &proof).ok());
  CHECK(reads == 800);
  CHECK(largest_piece <= RowCache::kProvePieceRows);
  CHECK(proof.compared == 800);
  CHECK(proof.stale == 6);
  CHECK(proof.stale_by_layer == std::map<uint32_t, uint64_t>{{9, 6}});
  CHECK((*adopted)->Stats().used_slots == 794);
  for (uint64_t r = 0; r < 300; ++r) CHECK(Hit(**adopted, 9, r * 3) == !rewritten(9, r * 3));
  for (uint64_t r = 0; r < 500; ++r) CHECK(Hit(**adopted, 1, r * 3));
  // A read that fails is returned: the caller discards the cache, its rows unproven.
  auto failing = [](uint32_t, std::span<const uint64_t>, uint8_t*) {
    return absl::DataLossError("short read");
  };
  CHECK((*adopted)->ProveRows(failing, 0, &proof).code() == absl::StatusCode::kDataLoss);
  // Past its deadline nothing more is read: the rows not compared are dropped, never kept.
  CHECK((*adopted)->ProveRows(read, /*deadline_ns=*/1, &proof).ok());
  CHECK(proof.compared == 0);
  CHECK(proof.unproven == 794);
  CHECK(reads == 800);
  CHECK((*adopted)->Stats().used_slots == 0);
  for (uint64_t r = 0; r < 500; ++r) CHECK_FALSE(Hit(**adopted, 1, r * 3));
}

TEST_CASE("a garbage, foreign or other tables' region is refused", "[adopt]") {
  auto cache = MakeCache(200);
  Fill(*cache, 1, 100);
  const uint64_t bytes = cache->region_bytes();
  void* map = nullptr;
  auto* h = HeaderOf(cache->fd(), &map, bytes);
  auto adopt = [&](uint64_t identity) {
    RowCacheAdoption a;
    return RowCache::Adopt(Dup(*cache), {.tables_identity = identity}, nullptr, KeepAll, &a)
        .status();
  };
  SECTION("other tables") {
    absl::Status s = adopt(kIdentity + 1);
    REQUIRE(s.code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE_THAT(std::string(s.message()), Catch::Contains("other tables"));
  }
  SECTION("an earlier version of the layout") {
    h->version = 1;
    REQUIRE(adopt(kIdentity).code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("garbage header") {
    std::mt19937_64 rng(5);
    for (int round = 0; round < 200; ++round) {
      uint64_t words[8];
      for (auto& w : words) w = rng();
      if (round % 2 == 0) words[0] = kRowCacheMagic;  // a right magic, wrong rest
      std::memcpy(map, words, sizeof(words));
      REQUIRE_FALSE(adopt(kIdentity).ok());
    }
  }
  SECTION("more slots than the region holds") {
    h->max_slots += 1000;
    REQUIRE(adopt(kIdentity).code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("an index that could fill up") {
    h->bucket_count = 64;
    h->max_slots = 100;
    REQUIRE(adopt(kIdentity).code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("not a memfd") {
    RowCacheAdoption a;
    UniqueFd file(open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
    absl::Status s =
        RowCache::Adopt(std::move(file), {.tables_identity = kIdentity}, nullptr, KeepAll, &a)
            .status();
    REQUIRE_THAT(std::string(s.message()), Catch::Contains("not a memfd"));
  }
  munmap(map, bytes);
}

TEST_CASE("adopting a mostly empty region leaves its unwritten pages unallocated", "[adopt]") {
  auto cache = MakeCache(20000);
  Fill(*cache, 5, 100);
  const uint64_t slots_bytes = RowCache::BytesForSlots(cache->capacity_slots());
  const uint64_t before = cache->Stats().resident_bytes;
  UniqueFd fd = Dup(*cache);
  cache.reset();
  RowCacheAdoption a;
  auto adopted =
      RowCache::Adopt(std::move(fd), {.tables_identity = kIdentity}, nullptr, KeepAll, &a);
  REQUIRE(adopted.ok());
  REQUIRE(a.kept == 100);
  for (uint64_t r = 0; r < 100; ++r) REQUIRE(Hit(**adopted, 5, r * 3));
  // The index is rewritten whole; of the slots only the pages that held rows are there.
  const uint64_t after = (*adopted)->Stats().resident_bytes;
  INFO("resident before " << before << ", after " << after << ", slots " << slots_bytes);
  REQUIRE(after < slots_bytes / 4);
  REQUIRE((*adopted)->HotKeys(1000).size() == 100);
  REQUIRE((*adopted)->Stats().resident_bytes == after);  // listing the rows allocated nothing
}

TEST_CASE("an adopted region larger than the budget allows is shrunk by policy", "[adopt]") {
  auto cache = MakeCache(4000);
  Fill(*cache, 3, 4000);
  for (uint64_t r = 0; r < 500; ++r) REQUIRE(Hit(*cache, 3, r * 3));  // the hot rows
  void* map = nullptr;
  const RowCacheHeader* h = HeaderOf(cache->fd(), &map, 4096);
  const uint64_t index = h->slots_offset + RowCache::BookkeepingBytes(h->max_slots);
  munmap(map, 4096);
  // Room for 1,000 slots in whole pages: up to the first slot at or above 1,000 that starts one.
  const uint64_t charge = cache->ChargedSlotBytes(1000);
  UniqueFd fd = Dup(*cache);
  cache.reset();
  MemoryBudget budget(index + charge);
  RowCacheAdoption a;
  auto adopted =
      RowCache::Adopt(std::move(fd), {.tables_identity = kIdentity}, &budget, KeepAll, &a);
  REQUIRE(adopted.ok());
  REQUIRE(a.kept == 4000);
  // The slots up to that page start are charged either way, so the capacity reaches it.
  const uint64_t capacity = (*adopted)->capacity_slots();
  REQUIRE(capacity >= 1000);
  REQUIRE((*adopted)->ChargedSlotBytes(capacity) == charge);
  REQUIRE((*adopted)->ChargedSlotBytes(capacity + 1) > charge);
  REQUIRE((*adopted)->Stats().used_slots <= capacity);
  REQUIRE(a.evicted_to_fit >= 4000 - capacity);
  REQUIRE(budget.available() == 0);
  uint64_t hot = 0;
  for (uint64_t r = 0; r < 500; ++r) hot += Hit(**adopted, 3, r * 3);
  REQUIRE(hot == 500);  // hit since admission: in the main FIFO, kept by the shrink
  adopted->reset();
  REQUIRE(budget.available() == budget.budget());
}

}  // namespace
}  // namespace engram
