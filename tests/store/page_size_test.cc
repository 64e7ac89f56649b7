// Page-granular memory code run with page granules larger than the kernel's (16 and 64 KiB, as
// on arm64 kernels built for them) as well as the kernel's own: shared regions give back only
// whole pages and leave every other byte alone, the row cache punches holes only from a slot
// that starts a page and charges its budget for whole pages, and the pages the daemon shares
// are whole pages. A leftover 4 KiB assumption shows as a hole, a size or a charge that is not
// a multiple of the granule.
#include "base/page_size.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "store/cache_touch.h"
#include "store/memory_budget.h"
#include "store/row_cache.h"
#include "store/shared_region.h"
#include "testkit/synthetic.h"

namespace engram {
namespace {

constexpr uint64_t kSeed = 5;

// The kernel's page and the larger granules of 16 and 64 KiB kernels, each a Catch2 section.
uint64_t GranuleSection() {
  const uint64_t kernel = KernelPageBytes();
  std::vector<uint64_t> granules = {kernel};
  for (uint64_t g : {uint64_t{16} << 10, uint64_t{64} << 10}) {
    if (g > kernel) granules.push_back(g);
  }
  // Every section must be met on every run (Catch2 finds the ones still to run that way), and
  // one is entered per run.
  uint64_t chosen = 0;
  for (uint64_t g : granules) {
    DYNAMIC_SECTION("page granule " << (g >> 10) << " KiB") { chosen = g; }
  }
  return chosen;
}

// Whether each kernel page of `fd`'s [0, bytes) holds memory (mincore over a fresh mapping):
// what the kernel freed, at its own page size.
std::vector<bool> ResidentPages(int fd, uint64_t bytes) {
  const uint64_t page = KernelPageBytes();
  void* map = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(map != MAP_FAILED);
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  REQUIRE(mincore(map, bytes, vec.data()) == 0);
  munmap(map, bytes);
  std::vector<bool> out(vec.size());
  for (size_t i = 0; i < vec.size(); ++i) out[i] = (vec[i] & 1) != 0;
  return out;
}

uint64_t FileBytes(int fd) {
  struct stat st {};
  REQUIRE(fstat(fd, &st) == 0);
  return static_cast<uint64_t>(st.st_size);
}

TEST_CASE("the page size comes from the kernel, a test granule replaces it", "[page]") {
  CHECK(KernelPageBytes() == static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
  CHECK(PageBytes() == KernelPageBytes());
  {
    TestPageGranule granule(64 << 10);
    CHECK(PageBytes() == (64 << 10));
    CHECK(KernelPageBytes() == static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
  }
  CHECK(PageBytes() == KernelPageBytes());
  CHECK(ParseHugepagesize("MemTotal: 1 kB\nHugepagesize:       2048 kB\nHugetlb: 0 kB\n") ==
        (2 << 20));
  CHECK(ParseHugepagesize("Hugepagesize:     524288 kB\n") == (uint64_t{512} << 20));
  CHECK(ParseHugepagesize("MemTotal: 1 kB\n") == 0);
  CHECK(ParseHugepagesize("XHugepagesize: 2048 kB\n") == 0);
  CHECK(ParseHugepagesize("Hugepagesize: kB\n") == 0);
  // Whatever the machine says, HugePageBytes() says the same.
  FILE* f = fopen("/proc/meminfo", "r");
  REQUIRE(f != nullptr);
  std::string text(1 << 16, '\0');
  text.resize(fread(text.data(), 1, text.size(), f));
  fclose(f);
  CHECK(HugePageBytes() == ParseHugepagesize(text));
}

TEST_CASE("a shared region is whole pages and gives back only whole pages", "[page]") {
  const uint64_t g = GranuleSection();
  if (g == 0) return;
  TestPageGranule granule(g);
  auto region = SharedRegion::Create("engram-page-test", 3 * g + 100, {});
  REQUIRE(region.ok());
  CHECK(region->page_bytes() == g);
  CHECK(region->size() == 4 * g);
  CHECK(FileBytes(region->fd()) == 4 * g);
  CHECK(SharedRegion::LargestSize(3 * g + 100, {}) == 4 * g);
  std::memset(region->data(), 0xA5, region->size());
  const uint64_t resident = region->ResidentBytes();
  CHECK(resident == 4 * g);

  // [g / 2, 3g + g / 2) holds whole pages [g, 3g) only: the half pages at either end keep
  // every byte, as a kernel with pages of g bytes would (punching part of one zeroes it).
  REQUIRE(region->Release(g / 2, 3 * g).ok());
  const std::vector<bool> pages = ResidentPages(region->fd(), region->size());
  for (size_t p = 0; p < pages.size(); ++p) {
    const uint64_t at = p * KernelPageBytes();
    INFO("kernel page at " << at);
    CHECK(pages[p] == (at < g || at >= 3 * g));
  }
  CHECK(region->ResidentBytes() == resident - 2 * g);
  // pread, not the mapping: reading a hole through a shared mapping would allocate its page.
  std::vector<uint8_t> bytes(region->size());
  REQUIRE(pread(region->fd(), bytes.data(), bytes.size(), 0) == ssize_t(bytes.size()));
  for (uint64_t at = 0; at < bytes.size(); at += 64) {
    INFO("offset " << at);
    REQUIRE(bytes[at] == (at >= g && at < 3 * g ? 0 : 0xA5));
  }
  // Less than a page: nothing given back, nothing changed.
  REQUIRE(region->Release(3 * g + 64, g - 128).ok());
  CHECK(region->ResidentBytes() == resident - 2 * g);
  REQUIRE(pread(region->fd(), bytes.data(), 1, 3 * g + 64) == 1);
  CHECK(bytes[0] == 0xA5);
}

TEST_CASE("a shared region handed over keeps the granule and refuses partial pages", "[page]") {
  const uint64_t g = GranuleSection();
  if (g == 0) return;
  TestPageGranule granule(g);
  auto made = SharedRegion::Create("engram-page-test", 2 * g, {});
  REQUIRE(made.ok());
  auto adopted = SharedRegion::Adopt("engram-page-test", UniqueFd(dup(made->fd())));
  REQUIRE(adopted.ok());
  CHECK(adopted->page_bytes() == g);
  CHECK(!adopted->huge_pages());
  if (g > KernelPageBytes()) {
    // A memfd of whole kernel pages but not whole granules is refused.
    UniqueFd odd(memfd_create("engram-page-odd", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    REQUIRE(ftruncate(odd.get(), static_cast<off_t>(g + KernelPageBytes())) == 0);
    auto refused = SharedRegion::Adopt("engram-page-odd", std::move(odd));
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

void InsertSynthetic(RowCache& cache, uint32_t layer, uint64_t row) {
  uint8_t data[kRowBytes];
  SyntheticRow(kSeed, layer, row, data);
  REQUIRE(cache.Insert(layer, row, data).ok());
}

bool LookupChecked(RowCache& cache, uint32_t layer, uint64_t row) {
  uint8_t got[kRowBytes], want[kRowBytes];
  if (!cache.Lookup(layer, row, got)) return false;
  SyntheticRow(kSeed, layer, row, want);
  if (std::memcmp(got, want, kRowBytes) != 0) FAIL("layer " << layer << " row " << row);
  return true;
}

TEST_CASE("the row cache gives back whole pages from a page-aligned slot and charges whole pages",
          "[page][cache]") {
  const uint64_t g = GranuleSection();
  if (g == 0) return;
  TestPageGranule granule(g);
  MemoryBudget budget(0);
  auto created = RowCache::Create({.max_bytes = 6 << 20}, &budget);
  REQUIRE(created.ok());
  RowCache& cache = **created;
  const uint64_t full = cache.capacity_slots();
  const int fd = cache.fd();
  uint64_t slots_offset = 0;
  REQUIRE(pread(fd, &slots_offset, sizeof slots_offset, offsetof(RowCacheHeader, slots_offset)) ==
          sizeof slots_offset);
  CHECK(slots_offset % g == 0);
  CHECK(cache.region_bytes() % g == 0);
  CHECK(FileBytes(fd) == cache.region_bytes());
  for (uint64_t r = 0; r < full; ++r) InsertSynthetic(cache, 14, r);
  const uint64_t used_full = budget.used();
  CHECK(cache.ChargedSlotBytes(full) == cache.region_bytes() - slots_offset);

  // Capacities that end inside a page: the slots of that page and those up to the next slot
  // that starts a page keep their memory; everything above is given back, from a page start.
  const uint64_t period = g / 32;  // slots of 288 bytes start a page once every g / 32 slots
  for (uint64_t target : {full / 2 + 7, full / 5 + 1, uint64_t{3}}) {
    INFO("capacity " << target << " of " << full);
    REQUIRE(cache.SetCapacitySlots(target) == target);
    const uint64_t charged = cache.ChargedSlotBytes(target);
    CHECK(charged % g == 0);
    CHECK(charged >= target * kRowCacheSlotBytes);
    CHECK(charged < (target + period) * kRowCacheSlotBytes);
    CHECK(budget.used() == used_full - cache.ChargedSlotBytes(full) + charged);
    // The slots' pages hold memory exactly up to the charge's end, a page start.
    const std::vector<bool> pages = ResidentPages(fd, cache.region_bytes());
    uint64_t wrong = 0;
    for (size_t p = slots_offset / KernelPageBytes(); p < pages.size(); ++p) {
      wrong += pages[p] != (p * KernelPageBytes() < slots_offset + charged);
    }
    CHECK(wrong == 0);
    uint64_t hits = 0;
    for (uint64_t r = 0; r < full; ++r) hits += LookupChecked(cache, 14, r);
    CHECK(hits == target);  // every kept row moved down byte-exact, none torn by a hole
    CHECK(cache.Stats().bytes == slots_offset + charged);
  }
  REQUIRE(cache.SetCapacitySlots(full) == full);
  CHECK(budget.used() == used_full);
}

TEST_CASE("a budget that ends inside a page grows the row cache by whole pages only",
          "[page][cache]") {
  const uint64_t g = GranuleSection();
  if (g == 0) return;
  TestPageGranule granule(g);
  MemoryBudget budget(16 << 20);
  auto created = RowCache::Create({.max_bytes = 4 << 20}, &budget);
  REQUIRE(created.ok());
  RowCache& cache = **created;
  const uint64_t full = cache.capacity_slots();
  REQUIRE(cache.SetCapacitySlots(full / 4) == full / 4);
  const uint64_t charged = cache.ChargedSlotBytes(full / 4);
  // Slots of 288 bytes start a page every g / 32 slots, 9 pages: the charge moves in steps of
  // 9 pages. Another owner leaves room for one and a half steps.
  const uint64_t step = 9 * g;
  REQUIRE(budget.Reserve(budget.available() - (step + step / 2), "another owner").ok());
  const uint64_t grown = cache.SetCapacitySlots(full);
  INFO("grew from " << full / 4 << " to " << grown << " of " << full);
  CHECK(grown > full / 4);
  CHECK(grown < full);
  CHECK(cache.ChargedSlotBytes(grown) == charged + step);                // one whole step, not 1.5
  CHECK(cache.ChargedSlotBytes(grown + 1) > charged + step + step / 2);  // the largest that fits
  CHECK(budget.available() == step / 2);
  CHECK(budget.used() == budget.budget() - step / 2);
}

TEST_CASE("the touch page is whole pages", "[page]") {
  const uint64_t g = GranuleSection();
  if (g == 0) return;
  TestPageGranule granule(g);
  for (size_t tables : {size_t{1}, size_t{300}}) {
    auto page = CacheTouchPage::Create(tables);
    REQUIRE(page.ok());
    const uint64_t bytes = FileBytes((*page)->fd());
    CHECK(bytes % g == 0);
    CHECK(bytes >= sizeof(engram_cache_touch_page) +
                       uint64_t{ENGRAM_CACHE_TOUCH_ENTRIES} * sizeof(engram_cache_touch_entry));
  }
}

}  // namespace
}  // namespace engram
