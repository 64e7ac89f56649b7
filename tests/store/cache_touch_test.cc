// The touch page's ring between processes, under stress: a forked client writes entries and
// publishes `head` as client/table_map.cc's ReportHits does, the daemon's own CacheTouchPage::Fold
// reads them and publishes `tail`; every entry must arrive whole and in order. On a weakly
// ordered CPU a missing release or acquire on either side shows as a torn or stale entry.
#include "store/cache_touch.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <thread>

#include "engram/protocol.h"

namespace engram {
namespace {

constexpr uint64_t kEntries = uint64_t{1} << 19;  // 128 trips round the ring

uint64_t KeyOf(uint64_t n) { return (n * 0x9E3779B97F4A7C15ull) | 1; }
uint32_t SlotOf(uint64_t n) { return static_cast<uint32_t>(n ^ (n >> 7)); }

template <typename T>
std::atomic_ref<T> Shared(T& word) {
  return std::atomic_ref<T>(word);
}

// The client: entries n = 0, 1, ... in batches of 1 to 64, each batch published by one release
// store of head once the daemon's tail (acquire) says there is room; one row counted per entry.
// Never drops (a real client would count a drop): the test wants every entry through.
int RunClient(uint8_t* base) {
  auto& page = *reinterpret_cast<engram_cache_touch_page*>(base);
  auto* ring = reinterpret_cast<engram_cache_touch_entry*>(base + page.ring_offset);
  auto* counters = reinterpret_cast<engram_cache_touch_counters*>(base + page.counters_offset);
  uint64_t head = 0;
  while (head < kEntries) {
    const uint64_t batch = std::min<uint64_t>(1 + head % 64, kEntries - head);
    while (head + batch - Shared(page.tail).load(std::memory_order_acquire) >
           ENGRAM_CACHE_TOUCH_ENTRIES) {
      std::this_thread::yield();
    }
    for (uint64_t n = head; n < head + batch; ++n) {
      engram_cache_touch_entry& e = ring[n % ENGRAM_CACHE_TOUCH_ENTRIES];
      Shared(e.key).store(KeyOf(n), std::memory_order_relaxed);
      Shared(e.slot).store(SlotOf(n), std::memory_order_relaxed);
    }
    head += batch;
    Shared(page.head).store(head, std::memory_order_release);
    Shared(counters[0].rows).fetch_add(batch, std::memory_order_relaxed);
  }
  return 0;
}

TEST_CASE("touch ring entries cross processes whole and in order under stress", "[touch]") {
  auto page = CacheTouchPage::Create(1);
  REQUIRE(page.ok());
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    void* map =
        mmap(nullptr, (*page)->bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, (*page)->fd(), 0);
    _exit(map == MAP_FAILED ? 100 : RunClient(static_cast<uint8_t*>(map)));
  }
  uint64_t next = 0, wrong = 0, rows = 0;
  const auto touch = [&](uint64_t key, uint32_t slot) {
    wrong += key != KeyOf(next) || slot != SlotOf(next);
    ++next;
  };
  const auto count = [&](size_t, uint64_t, uint64_t more_rows) {
    rows += more_rows;
    return CacheTouchPage::Counted::kCache;
  };
  int wstatus = 0;
  pid_t done = 0;
  while (done == 0 && wrong == 0) {
    if ((*page)->Fold(touch, count) == 0) std::this_thread::yield();
    done = waitpid(child, &wstatus, WNOHANG);
  }
  if (done == 0) {
    kill(child, SIGKILL);
    waitpid(child, &wstatus, 0);
  }
  (*page)->Fold(touch, count);
  INFO("entries folded " << next << ", rows counted " << rows);
  CHECK(wrong == 0);  // an entry read before its bytes, or overwritten before it was read
  REQUIRE(WIFEXITED(wstatus));
  CHECK(WEXITSTATUS(wstatus) == 0);
  CHECK(next == kEntries);
  CHECK(rows == kEntries);
}

}  // namespace
}  // namespace engram
