// Tests of RowCache: byte-exact hits, the S3-FIFO policy (capacity, scan resistance, ghost
// re-admission), resizing with rows kept and pages given back, and readers in threads and in
// other processes racing a writer that churns a tiny cache: a hit is never torn or wrong.
#include "store/row_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <thread>

#include "base/clock.h"
#include "store/ghost_queue.h"
#include "testkit/synthetic.h"

namespace engram {
namespace {

constexpr uint64_t kSeed = 11;

std::unique_ptr<RowCache> MakeCache(uint64_t slots, MemoryBudget* budget = nullptr) {
  auto cache =
      RowCache::Create({.max_bytes = 64 * 1024 + RowCache::BytesForSlots(slots) * 2}, budget);
  REQUIRE(cache.ok());
  (*cache)->SetCapacitySlots(slots);
  REQUIRE((*cache)->capacity_slots() == slots);
  return std::move(*cache);
}

void InsertSynthetic(RowCache& cache, uint32_t layer, uint64_t row) {
  uint8_t data[kRowBytes];
  SyntheticRow(kSeed, layer, row, data);
  REQUIRE(cache.Insert(layer, row, data).ok());
}

// Looks a row up; a hit must carry exactly the synthetic bytes of that row.
bool LookupChecked(RowCache& cache, uint32_t layer, uint64_t row) {
  uint8_t got[kRowBytes], want[kRowBytes];
  if (!cache.Lookup(layer, row, got)) return false;
  SyntheticRow(kSeed, layer, row, want);
  if (std::memcmp(got, want, kRowBytes) != 0) FAIL("layer " << layer << " row " << row);
  return true;
}

TEST_CASE("rows of several tables hit byte-exact and others miss", "[cache]") {
  auto cache = MakeCache(1000);
  for (uint64_t r = 0; r < 400; ++r) {
    InsertSynthetic(*cache, 1, r * 7);
    InsertSynthetic(*cache, 14, r * 7);
  }
  for (uint64_t r = 0; r < 400; ++r) {
    REQUIRE(LookupChecked(*cache, 1, r * 7));
    REQUIRE(LookupChecked(*cache, 14, r * 7));
    REQUIRE_FALSE(LookupChecked(*cache, 1, r * 7 + 1));
  }
  REQUIRE_FALSE(LookupChecked(*cache, 2, 0));
  RowCacheStats st = cache->Stats();
  REQUIRE(st.used_slots == 800);
  REQUIRE(st.hits == 0);  // lookups are counted by the caller, a batch at a time
  cache->CountLookups(800, 401);
  st = cache->Stats();
  REQUIRE(st.hits == 800);
  REQUIRE(st.misses == 401);
  REQUIRE(st.evictions == 0);
  uint8_t row[kRowBytes] = {};
  REQUIRE(cache->Insert(1, uint64_t{1} << 40, row).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the cache holds at most its capacity and evicts by S3-FIFO", "[cache]") {
  auto cache = MakeCache(500);
  for (uint64_t r = 0; r < 5000; ++r) InsertSynthetic(*cache, 14, r);
  RowCacheStats st = cache->Stats();
  REQUIRE(st.used_slots == 500);
  REQUIRE(st.evictions == 4500);
  uint64_t hits = 0;
  for (uint64_t r = 0; r < 5000; ++r) hits += LookupChecked(*cache, 14, r);
  REQUIRE(hits == 500);
  // A row evicted from the small FIFO is remembered by the ghost and re-admitted to main.
  const uint64_t ghosts = cache->Stats().ghost_hits;
  InsertSynthetic(*cache, 14, 4400);  // evicted recently enough to be in the ghost
  REQUIRE(cache->Stats().ghost_hits == ghosts + 1);
}

TEST_CASE("hot rows survive a one-pass scan many times the cache", "[cache]") {
  auto cache = MakeCache(1000);
  uint64_t hot_hits = 0, hot_lookups = 0, scan_row = 1'000'000;
  for (int round = 0; round < 200; ++round) {
    for (uint64_t r = 0; r < 300; ++r) {  // the hot set: 30 % of the cache, reused every round
      ++hot_lookups;
      if (LookupChecked(*cache, 1, r))
        ++hot_hits;
      else
        InsertSynthetic(*cache, 1, r);
    }
    for (int i = 0; i < 500; ++i) {  // 100,000 rows seen once: 100x the cache in all
      if (!LookupChecked(*cache, 1, scan_row)) InsertSynthetic(*cache, 1, scan_row);
      ++scan_row;
    }
  }
  INFO("hot hit rate " << double(hot_hits) / hot_lookups);
  // An LRU of 1,000 rows loses the hot set every round (800 distinct rows between reuses fit, so
  // LRU keeps it too here); S3-FIFO must keep it with the scan going through the small FIFO.
  REQUIRE(double(hot_hits) / hot_lookups > 0.95);
}

TEST_CASE("shrinking keeps rows byte-exact, gives pages and budget back; growing returns",
          "[cache]") {
  MemoryBudget budget(0);
  auto created = RowCache::Create({.max_bytes = 8 << 20}, &budget);
  REQUIRE(created.ok());
  RowCache& cache = **created;
  const uint64_t full = cache.capacity_slots();
  REQUIRE(full > 20000);
  for (uint64_t r = 0; r < full; ++r) InsertSynthetic(cache, 14, r);
  const uint64_t used_full = budget.used();
  const uint64_t resident_full = cache.Stats().resident_bytes;
  REQUIRE(resident_full >= RowCache::BytesForSlots(full));

  REQUIRE(cache.SetCapacitySlots(full / 4) == full / 4);
  RowCacheStats st = cache.Stats();
  REQUIRE(st.used_slots == full / 4);
  REQUIRE(st.resident_bytes < resident_full / 2);
  // The budget gets back the whole pages given back.
  REQUIRE(budget.used() ==
          used_full - (cache.ChargedSlotBytes(full) - cache.ChargedSlotBytes(full / 4)));
  uint64_t hits = 0;
  for (uint64_t r = 0; r < full; ++r) hits += LookupChecked(cache, 14, r);
  REQUIRE(hits == full / 4);  // every kept row moved below the new capacity, none lost or torn

  REQUIRE(cache.SetCapacitySlots(full) == full);
  REQUIRE(budget.used() == used_full);
  for (uint64_t r = full; r < 2 * full; ++r) InsertSynthetic(cache, 14, r);
  REQUIRE(cache.Stats().used_slots == full);
}

// A reader that keeps the pages the cache gives back (a GPU registration that pinned them) must
// never see a slot half in a given-back page and half in a kept one: the cache gives pages back
// only from a slot that starts a page, and says so in its header.
TEST_CASE("a shrink gives pages back only from a slot that starts a page", "[cache]") {
  auto created = RowCache::Create({.max_bytes = 8 << 20}, nullptr);
  REQUIRE(created.ok());
  RowCache& cache = **created;
  const auto* header = reinterpret_cast<const RowCacheHeader*>(
      mmap(nullptr, sizeof(RowCacheHeader), PROT_READ, MAP_SHARED, cache.fd(), 0));
  REQUIRE(header != MAP_FAILED);
  REQUIRE((header->flags & kRowCacheFlagAlignedRelease) != 0);
  const uint64_t full = cache.capacity_slots();
  for (uint64_t r = 0; r < full; ++r) InsertSynthetic(cache, 14, r);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (const uint64_t keep : {full / 3 + 1, full / 5 + 7, uint64_t{1001}}) {
    REQUIRE(cache.SetCapacitySlots(keep) == keep);
    // The first hole at or above the capacity's first slot: a slot boundary on a page boundary,
    // with every byte from the capacity up to it still allocated.
    const uint64_t from = header->slots_offset + keep * sizeof(RowCacheSlot);
    const off_t hole = lseek(cache.fd(), static_cast<off_t>(from), SEEK_HOLE);
    REQUIRE(hole > 0);
    const uint64_t at = static_cast<uint64_t>(hole);
    INFO("capacity " << keep << ": first hole at " << at);
    REQUIRE(at < header->slots_offset + full * sizeof(RowCacheSlot));
    REQUIRE(at % page == 0);
    REQUIRE((at - header->slots_offset) % sizeof(RowCacheSlot) == 0);
    REQUIRE(at - from < page / 32 * sizeof(RowCacheSlot));  // within one period of slot starts
    REQUIRE(cache.SetCapacitySlots(full) == full);
    for (uint64_t r = 0; r < full; ++r) InsertSynthetic(cache, 14, r);
  }
  munmap(const_cast<RowCacheHeader*>(header), sizeof(RowCacheHeader));
}

// A pressure shrink of a large cache must not hold the writer's lock for the whole of it: a
// gather's misses insert rows, and each insert would wait until the shrink is done (hundreds of
// milliseconds for a few hundred thousand rows, seconds for a 16 GiB cache). The shrink works in
// chunks; an insert waits at most about one chunk, whatever the shrink's size.
TEST_CASE("a large shrink stalls inserts for one chunk at most, not the whole shrink",
          "[cache][shrink]") {
  MemoryBudget budget(0);
  auto created = RowCache::Create({.max_bytes = 160 << 20}, &budget);
  REQUIRE(created.ok());
  RowCache& cache = **created;
  const uint64_t full = cache.capacity_slots();
  REQUIRE(full > 400000);
  for (uint64_t r = 0; r < full; ++r) InsertSynthetic(cache, 14, r);
  const uint64_t used_full = budget.used();

  std::atomic<bool> stop{false}, started{false};
  uint64_t max_wait_ns = 0, inserts = 0;
  std::thread misses([&] {
    uint8_t data[kRowBytes];
    SyntheticRow(kSeed, 2, 0, data);
    for (uint64_t r = 0; !stop.load(std::memory_order_relaxed); ++r) {
      const uint64_t t0 = NowNs();
      (void)cache.Insert(2, r, data);  // a gather's miss admitted after its read
      max_wait_ns = std::max(max_wait_ns, NowNs() - t0);
      ++inserts;
      started.store(true, std::memory_order_relaxed);
    }
  });
  while (!started.load()) std::this_thread::yield();
  const uint64_t t0 = NowNs();
  REQUIRE(cache.SetCapacitySlots(full / 4) == full / 4);
  const uint64_t shrink_ns = NowNs() - t0;
  stop = true;
  misses.join();
  INFO("shrink of " << full - full / 4 << " slots took " << shrink_ns / 1000
                    << " us; the longest "
                       "insert waited "
                    << max_wait_ns / 1000 << " us (" << inserts << " inserts)");
  CHECK(max_wait_ns < shrink_ns / 4);
  RowCacheStats st = cache.Stats();
  CHECK(st.used_slots <= full / 4);
  CHECK(budget.used() ==
        used_full - (cache.ChargedSlotBytes(full) - cache.ChargedSlotBytes(full / 4)));
  uint64_t hits = 0;
  for (uint64_t r = 0; r < full; ++r) hits += LookupChecked(cache, 14, r);
  CHECK(hits <= full / 4);
  // After the shrink, inserts evict by policy again.
  for (uint64_t r = 0; r < 1000; ++r) InsertSynthetic(cache, 3, r);
  CHECK(cache.Stats().used_slots == full / 4);
  for (uint64_t r = 0; r < 1000; ++r) CHECK(LookupChecked(cache, 3, r));
}

// Shrinking gives the slots' pages back, and they read 0 afterwards, their `seq` included. A
// reader that read a slot's `seq`, was preempted while the cache shrank, grew and the slot was
// written anew, and then read `seq` again must not find the value it started with, or it would
// take a torn row: a slot's `seq` never returns to an earlier value.
TEST_CASE("a slot's seq never returns to an earlier value across a shrink and a regrowth",
          "[cache]") {
  auto cache = MakeCache(1024);
  for (uint64_t r = 0; r < 1024; ++r) InsertSynthetic(*cache, 14, r);
  // The slots as a reader in another process sees them.
  void* p = ::mmap(nullptr, cache->region_bytes(), PROT_READ, MAP_SHARED, cache->fd(), 0);
  REQUIRE(p != MAP_FAILED);
  const auto* header = static_cast<const RowCacheHeader*>(p);
  const auto* slots =
      reinterpret_cast<const RowCacheSlot*>(static_cast<const uint8_t*>(p) + header->slots_offset);
  std::vector<uint32_t> before(1024);
  for (size_t i = 0; i < before.size(); ++i) before[i] = slots[i].seq.load();
  REQUIRE(cache->SetCapacitySlots(64) == 64);
  CHECK(slots[1023].seq.load() == 0);  // its page was given back
  REQUIRE(cache->SetCapacitySlots(1024) == 1024);
  for (uint64_t r = 0; r < 960; ++r) InsertSynthetic(*cache, 1, r);  // into the slots given back
  for (size_t i = 64; i < before.size(); ++i) {
    INFO("slot " << i);
    CHECK(slots[i].seq.load() > before[i]);
  }
  ::munmap(p, cache->region_bytes());
}

TEST_CASE("a budget smaller than the cache caps its capacity", "[cache][budget]") {
  MemoryBudget budget(1 << 20);
  auto cache = RowCache::Create({.max_bytes = 64 << 20}, &budget);
  REQUIRE(cache.ok());
  REQUIRE(budget.used() <= budget.budget());
  // The index and the bookkeeping are sized for what the budget can give, and the slots take
  // the rest of it.
  REQUIRE((*cache)->capacity_slots() == (*cache)->max_slots());
  REQUIRE(budget.available() < 16 * 1024);
  REQUIRE((*cache)->capacity_slots() > (1 << 20) / (288 + 8 + 80));
  REQUIRE(budget.used() > RowCache::BytesForSlots((*cache)->capacity_slots()) +
                              RowCache::BookkeepingBytes((*cache)->max_slots()));
  REQUIRE((*cache)->capacity_slots() < (1 << 20) / 288);
  REQUIRE((*cache)->SetCapacitySlots((*cache)->max_slots()) == (*cache)->capacity_slots());
  REQUIRE(RowCache::Create({.max_bytes = 4096}, nullptr).status().code() ==
          absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a read-only mapping of the cache finds the same rows", "[cache]") {
  auto cache = MakeCache(100);
  for (uint64_t r = 0; r < 50; ++r) InsertSynthetic(*cache, 1, r);
  void* p = ::mmap(nullptr, cache->region_bytes(), PROT_READ, MAP_SHARED, cache->fd(), 0);
  REQUIRE(p != MAP_FAILED);
  auto reader = RowCacheReader::Attach(static_cast<uint8_t*>(p), cache->region_bytes());
  REQUIRE(reader.ok());
  uint8_t got[kRowBytes], want[kRowBytes];
  for (uint64_t r = 0; r < 50; ++r) {
    REQUIRE(reader->Lookup(1, r, got));
    SyntheticRow(kSeed, 1, r, want);
    REQUIRE(std::memcmp(got, want, kRowBytes) == 0);
  }
  REQUIRE_FALSE(reader->Lookup(1, 50, got));
  REQUIRE_FALSE(RowCacheReader::Attach(static_cast<uint8_t*>(p), 4096).ok());
  ::munmap(p, cache->region_bytes());
}

// Reads random rows of [0, rows) until `stop`; returns the number of hits, or -1 after the first
// hit whose bytes are not the row's.
int64_t ReadUntil(const RowCacheReader& reader, uint64_t rows, const std::atomic<bool>& stop,
                  uint32_t seed) {
  std::mt19937_64 rng(seed);
  uint8_t got[kRowBytes], want[kRowBytes];
  int64_t hits = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    const uint32_t layer = rng() & 1 ? 14 : 1;
    const uint64_t row = rng() % rows;
    if (!reader.Lookup(layer, row, got)) continue;
    SyntheticRow(kSeed, layer, row, want);
    if (std::memcmp(got, want, kRowBytes) != 0) return -1;
    ++hits;
  }
  return hits;
}

// The writer: inserts random rows of [0, rows) into a tiny cache so that slots are reused all
// the time, and resizes it now and then (moving rows between slots) for `ns`.
void Churn(RowCache& cache, uint64_t rows, uint64_t ns) {
  std::mt19937_64 rng(99);
  uint8_t data[kRowBytes];
  const uint64_t end = NowNs() + ns;
  for (uint64_t i = 0; NowNs() < end; ++i) {
    const uint32_t layer = rng() & 1 ? 14 : 1;
    const uint64_t row = rng() % rows;
    SyntheticRow(kSeed, layer, row, data);
    REQUIRE(cache.Insert(layer, row, data).ok());
    if (i % 5000 == 4999) cache.SetCapacitySlots(cache.capacity_slots() == 64 ? 32 : 64);
  }
}

TEST_CASE("readers in threads never see a torn or wrong row", "[cache][concurrency]") {
  auto cache = MakeCache(64);
  std::atomic<bool> stop{false};
  std::vector<int64_t> hits(3);
  std::vector<std::thread> readers;
  for (size_t t = 0; t < hits.size(); ++t) {
    readers.emplace_back([&, t] { hits[t] = ReadUntil(cache->reader(), 160, stop, uint32_t(t)); });
  }
  Churn(*cache, 160, 1'500'000'000);
  stop = true;
  for (auto& t : readers) t.join();
  for (int64_t h : hits) {
    REQUIRE(h >= 0);
    REQUIRE(h > 100);  // the readers really raced the writer on live rows
  }
  REQUIRE(cache->Stats().evictions > 10000);
}

TEST_CASE("readers in other processes never see a torn or wrong row", "[cache][concurrency]") {
  auto cache = MakeCache(64);
  // The children map the region read-only from the fd, as a client would.
  auto* stop = static_cast<std::atomic<bool>*>(
      ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(stop != MAP_FAILED);
  new (stop) std::atomic<bool>(false);
  std::vector<pid_t> children;
  for (int c = 0; c < 3; ++c) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      void* p = ::mmap(nullptr, cache->region_bytes(), PROT_READ, MAP_SHARED, cache->fd(), 0);
      if (p == MAP_FAILED) ::_exit(3);
      auto reader = RowCacheReader::Attach(static_cast<uint8_t*>(p), cache->region_bytes());
      if (!reader.ok()) ::_exit(4);
      int64_t hits = ReadUntil(*reader, 160, *stop, 100 + c);
      ::_exit(hits < 0 ? 1 : hits < 100 ? 2 : 0);
    }
    children.push_back(pid);
  }
  Churn(*cache, 160, 1'500'000'000);
  stop->store(true);
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    INFO("child exit status " << WEXITSTATUS(status) << " (1: wrong row, 2: too few hits)");
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
  }
  ::munmap(stop, 4096);
}

// A reader that cannot afford ordered loads (a GPU across PCIe, kernels/cache_device.h): reads a
// slot's key, then its row words last to first, then its check, all without the seq, and takes
// the row only when the check of the key and the words read equals the check read. Returns the
// rows taken, or -1 after the first taken row whose bytes are not the row's.
int64_t ReadByCheckUntil(const uint8_t* region, const std::atomic<bool>& stop) {
  const auto* header = reinterpret_cast<const RowCacheHeader*>(region);
  const auto* slots = reinterpret_cast<const RowCacheSlot*>(region + header->slots_offset);
  uint8_t got[kRowBytes], want[kRowBytes];
  int64_t taken = 0;
  for (uint32_t i = 0; !stop.load(std::memory_order_relaxed); i = (i + 1) % header->max_slots) {
    const RowCacheSlot& s = slots[i];
    const uint64_t key = s.key.load(std::memory_order_relaxed);
    for (size_t w = kRowCacheRowWords; w-- > 0;) {
      const uint64_t word = s.row[w].load(std::memory_order_relaxed);
      std::memcpy(got + w * sizeof word, &word, sizeof word);
    }
    if (key == 0 || s.check.load(std::memory_order_relaxed) != RowCacheCheck(key, got)) continue;
    const uint32_t layer = (key >> 40) - 1;  // RowCacheKey: (layer + 1) << 40 | row
    const uint64_t row = key & ((uint64_t{1} << 40) - 1);
    if ((layer != 1 && layer != 14) || RowCacheKey(layer, row) != key) return -1;
    SyntheticRow(kSeed, layer, row, want);
    if (std::memcmp(got, want, kRowBytes) != 0) return -1;
    ++taken;
  }
  return taken;
}

TEST_CASE("readers trusting only the row check never take a torn row", "[cache][concurrency]") {
  auto cache = MakeCache(64);
  void* p = ::mmap(nullptr, cache->region_bytes(), PROT_READ, MAP_SHARED, cache->fd(), 0);
  REQUIRE(p != MAP_FAILED);
  REQUIRE((static_cast<const RowCacheHeader*>(p)->flags & kRowCacheFlagRowCheck) != 0);
  std::atomic<bool> stop{false};
  int64_t taken = 0;
  std::thread reader([&] { taken = ReadByCheckUntil(static_cast<uint8_t*>(p), stop); });
  Churn(*cache, 160, 1'500'000'000);
  stop = true;
  reader.join();
  ::munmap(p, cache->region_bytes());
  REQUIRE(taken >= 0);   // a row whose bytes were not its key's passed the check
  REQUIRE(taken > 100);  // the reader really raced the writer on live rows
}

// The ghost queue against a plain model (the last `limit` keys pushed, oldest first, each marked
// once taken): the same keys are found after every step of a random mix of pushes (new and
// repeated keys), takes and limit changes, with keys that collide in the index and a ring that
// wraps many times.
TEST_CASE("the ghost queue keeps the last keys pushed up to its limit, less those taken",
          "[cache][ghost]") {
  constexpr uint64_t kMaxKeys = 500;
  GhostQueue ghost(kMaxKeys);
  std::deque<std::pair<uint64_t, bool>> model;  // (key, still in the queue)
  std::mt19937_64 rng(kSeed);
  uint64_t limit = kMaxKeys;
  auto model_take = [&](uint64_t key) {
    for (auto& [k, live] : model) {
      if (k == key && live) return !(live = false);
    }
    return false;
  };
  auto model_size = [&] {
    return static_cast<uint64_t>(
        std::count_if(model.begin(), model.end(), [](const auto& e) { return e.second; }));
  };
  for (int step = 0; step < 200000; ++step) {
    const uint64_t key = rng() % 2000 + 1;  // few keys: repeats and takes are common
    if (rng() % 8 == 0) {
      REQUIRE(ghost.Take(key) == model_take(key));
    } else {
      if (step % 97 == 0) limit = rng() % (kMaxKeys + 10);  // 0 and above max: clamped
      ghost.Push(key, limit);
      model_take(key);
      const uint64_t bound = std::clamp<uint64_t>(limit, 1, kMaxKeys);
      while (model.size() >= bound) model.pop_front();
      model.emplace_back(key, true);
    }
    REQUIRE(ghost.size() == model_size());
    if (step % 1000 == 0) {
      for (uint64_t k = 1; k <= 2000; ++k) {
        const bool in_model =
            std::find(model.begin(), model.end(), std::make_pair(k, true)) != model.end();
        REQUIRE(ghost.Contains(k) == in_model);
      }
    }
  }
}

// A cache whose ghost fills while it shrinks: the ghost is sized at creation, so it takes no
// memory beyond that as it fills, and re-admission still goes by it after the shrink.
TEST_CASE("evictions fill the ghost without growing it; a key seen again goes to main",
          "[cache][ghost]") {
  auto created = RowCache::Create({.max_bytes = 16 << 20}, nullptr);
  REQUIRE(created.ok());
  RowCache& cache = **created;
  const uint64_t full = cache.capacity_slots();
  for (uint64_t r = 0; r < full; ++r) InsertSynthetic(cache, 14, r);
  cache.SetCapacitySlots(full / 2);  // evicts half the rows from the small FIFO to the ghost
  RowCacheStats before = cache.Stats();
  uint64_t evicted = 0;
  for (uint64_t r = full; r-- > 0 && evicted < 100;) {  // the newest evictions first
    if (cache.Contains(14, r)) continue;
    ++evicted;
    InsertSynthetic(cache, 14, r);
  }
  REQUIRE(evicted == 100);
  // Rows whose keys were still in the ghost are admitted to the main FIFO.
  CHECK(cache.Stats().ghost_hits - before.ghost_hits == 100);
}

TEST_CASE("a hit reported by a client (Touch) counts as a use; a stale report does not",
          "[cache]") {
  auto cache = MakeCache(100);
  InsertSynthetic(*cache, 1, 1000);  // A: the client hits it
  InsertSynthetic(*cache, 1, 1001);  // B: only bogus reports name it
  void* p = ::mmap(nullptr, cache->region_bytes(), PROT_READ, MAP_SHARED, cache->fd(), 0);
  REQUIRE(p != MAP_FAILED);
  auto client = RowCacheReader::Attach(static_cast<uint8_t*>(p), cache->region_bytes());
  REQUIRE(client.ok());
  uint8_t got[kRowBytes], want[kRowBytes];
  uint8_t freq = 9;
  const int64_t a = client->LookupSlot(1, 1000, got, &freq);
  REQUIRE(a >= 0);
  CHECK(freq == 0);  // the client's own lookup marks nothing
  SyntheticRow(kSeed, 1, 1000, want);
  REQUIRE(std::memcmp(got, want, kRowBytes) == 0);
  const int64_t b = client->LookupSlot(1, 1001, got, &freq);
  REQUIRE(b >= 0);
  CHECK(client->LookupSlot(1, 5, got, &freq) == -1);
  cache->Touch(static_cast<uint32_t>(a), RowCacheKey(1, 1000));
  cache->Touch(static_cast<uint32_t>(b), RowCacheKey(1, 1000));  // another row's key
  cache->Touch(static_cast<uint32_t>(b), 0);                     // no key
  cache->Touch(cache->max_slots() + 5, RowCacheKey(1, 1001));    // no such slot
  cache->Touch(static_cast<uint32_t>(cache->capacity_slots()), RowCacheKey(1, 1001));
  REQUIRE(client->LookupSlot(1, 1000, got, &freq) == a);
  CHECK(freq == 1);
  REQUIRE(client->LookupSlot(1, 1001, got, &freq) == b);
  CHECK(freq == 0);
  // A one-pass scan of the whole cache: the used row is promoted and stays, the other leaves.
  for (uint64_t r = 0; r < 150; ++r) InsertSynthetic(*cache, 14, r);
  CHECK(cache->Contains(1, 1000));
  CHECK_FALSE(cache->Contains(1, 1001));
  ::munmap(p, cache->region_bytes());
}

TEST_CASE("pages a reader faults back in above the capacity are given back again", "[cache]") {
  auto cache = MakeCache(4096);
  for (uint64_t r = 0; r < 4096; ++r) InsertSynthetic(*cache, 1, r);
  cache->SetCapacitySlots(64);
  const uint64_t shrunk = cache->Stats().resident_bytes;
  // A reader touching every slot above the capacity, as one that followed stale buckets would.
  void* p = ::mmap(nullptr, cache->region_bytes(), PROT_READ, MAP_SHARED, cache->fd(), 0);
  REQUIRE(p != MAP_FAILED);
  const auto* base = static_cast<const volatile uint8_t*>(p);
  uint64_t sum = 0;
  for (uint64_t at = cache->region_bytes() / 2; at < cache->region_bytes(); at += 4096) {
    sum += base[at];
  }
  CHECK(sum == 0);  // given back: zeros
  const uint64_t faulted = cache->Stats().resident_bytes;
  INFO("resident after the shrink " << shrunk << ", after the reads " << faulted);
  REQUIRE(faulted > shrunk + cache->region_bytes() / 4);  // the reads brought the pages back
  const uint64_t released = cache->ReleaseAboveCapacity();
  CHECK(cache->Stats().resident_bytes <= shrunk + 4096);
  CHECK(released == faulted - cache->Stats().resident_bytes);
  // The rows below the capacity are untouched.
  uint64_t hits = 0;
  for (uint64_t r = 0; r < 4096; ++r) hits += LookupChecked(*cache, 1, r);
  CHECK(hits == 64);
  ::munmap(p, cache->region_bytes());
}

TEST_CASE("readers of a read-only descriptor get misses, never zeros, through shrink storms",
          "[cache][concurrency]") {
  auto cache = MakeCache(64);
  auto* stop = static_cast<std::atomic<bool>*>(
      ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(stop != MAP_FAILED);
  new (stop) std::atomic<bool>(false);
  std::vector<pid_t> children;
  for (int c = 0; c < 2; ++c) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // As engramd hands it to clients: the memfd opened again, read-only.
      const int fd = ::open(("/proc/self/fd/" + std::to_string(cache->fd())).c_str(), O_RDONLY);
      if (fd < 0) ::_exit(5);
      void* p = ::mmap(nullptr, cache->region_bytes(), PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) ::_exit(3);
      if (::mprotect(p, cache->region_bytes(), PROT_READ | PROT_WRITE) == 0) ::_exit(6);
      auto reader = RowCacheReader::Attach(static_cast<uint8_t*>(p), cache->region_bytes());
      if (!reader.ok()) ::_exit(4);
      int64_t hits = ReadUntil(*reader, 160, *stop, 200 + c);
      ::_exit(hits < 0 ? 1 : hits < 100 ? 2 : 0);
    }
    children.push_back(pid);
  }
  // Inserts, and a shrink to 2 slots and back every 500 (the slots above are punched out).
  std::mt19937_64 rng(7);
  uint8_t data[kRowBytes];
  const uint64_t end = NowNs() + 1'500'000'000;
  uint64_t shrinks = 0;
  for (uint64_t i = 0; NowNs() < end; ++i) {
    const uint32_t layer = rng() & 1 ? 14 : 1;
    const uint64_t row = rng() % 160;
    SyntheticRow(kSeed, layer, row, data);
    REQUIRE(cache->Insert(layer, row, data).ok());
    if (i % 500 == 499) {
      cache->SetCapacitySlots(2);
      cache->SetCapacitySlots(64);
      ++shrinks;
    }
  }
  stop->store(true);
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    INFO("child exit status " << WEXITSTATUS(status)
                              << " (1: wrong row, 2: too few hits, 6: made writable)");
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
  }
  CHECK(shrinks > 10);
  ::munmap(stop, 4096);
}

}  // namespace
}  // namespace engram
