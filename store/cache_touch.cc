// CacheTouchPage: creating the page and folding what a client wrote into it.
#include "store/cache_touch.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "base/page_size.h"

namespace engram {
namespace {

absl::Status Refused(const char* step) {
  return absl::InternalError(absl::StrCat("cache touch page: ", step, ": ", std::strerror(errno)));
}

template <typename T>
std::atomic_ref<T> Shared(T& word) {
  return std::atomic_ref<T>(word);
}

}  // namespace

absl::StatusOr<std::shared_ptr<CacheTouchPage>> CacheTouchPage::Create(size_t tables) {
  std::shared_ptr<CacheTouchPage> page(new CacheTouchPage());
  const uint64_t counters_offset = sizeof(engram_cache_touch_page);
  const uint64_t ring_offset =
      (counters_offset + tables * sizeof(engram_cache_touch_counters) + 63) / 64 * 64;
  // Whole pages: the size the kernel maps (the header says it, so a client maps it all).
  const uint64_t bytes = RoundUpTo(
      ring_offset + uint64_t{ENGRAM_CACHE_TOUCH_ENTRIES} * sizeof(engram_cache_touch_entry),
      PageBytes());
  page->fd_.Reset(memfd_create("engram-cache-touch", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!page->fd_.valid()) return Refused("memfd_create");
  if (ftruncate(page->fd_.get(), static_cast<off_t>(bytes)) != 0) return Refused("ftruncate");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, page->fd_.get(), 0);
  if (p == MAP_FAILED) return Refused("mmap");
  page->map_.Reset(p, bytes);
  page->tables_ = tables;
  page->seen_.assign(tables, engram_cache_touch_counters{});
  page->last_fold_ns_ = NowNs();
  engram_cache_touch_page* h = page->header();
  h->magic = ENGRAM_CACHE_TOUCH_MAGIC;
  h->entries = ENGRAM_CACHE_TOUCH_ENTRIES;
  h->page_bytes = bytes;
  h->tables = static_cast<uint32_t>(tables);
  h->counters_offset = counters_offset;
  h->ring_offset = ring_offset;
  // Neither side may resize it (a client's write stays within what was mapped).
  if (fcntl(page->fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Refused("sealing");
  }
  return page;
}

void CacheTouchPage::Refill() {
  // Rows of ENGRAM_ROW_BYTES per millisecond; whole milliseconds keep the product far from
  // overflow (a minute's worth is ~6e10 rows).
  constexpr uint64_t kRowsPerMs = kInPlaceBytesPerSecond / ENGRAM_ROW_BYTES / 1000;
  constexpr uint64_t kMostRows = kInPlaceBurstNs / 1'000'000 * kRowsPerMs;
  const uint64_t now = NowNs();
  const uint64_t ms = std::min(now - last_fold_ns_, kInPlaceBurstNs) / 1'000'000;
  if (ms == 0) return;  // the rest of the millisecond counts at the next fold
  last_fold_ns_ += ms * 1'000'000;
  allowance_.requests = std::min(kMostRows, allowance_.requests + ms * kRowsPerMs);
  allowance_.rows = std::min(kMostRows, allowance_.rows + ms * kRowsPerMs);
  if (now - last_fold_ns_ >= kInPlaceBurstNs) last_fold_ns_ = now;
}

void CacheTouchPage::ReportClamp(size_t table, uint64_t requests, uint64_t rows,
                                 const ReportFn& report) {
  if (owner_.clamped != nullptr) owner_.clamped->fetch_add(1, std::memory_order_relaxed);
  if (clamp_reported_ || !report) return;
  clamp_reported_ = true;
  report(absl::StrFormat(
      "%s reported %u gathers and %u rows read in place of table %u since the last fold, more "
      "than it could have read (at most %u GiB/s of rows); counted %u and %u, and its later "
      "reports past the bound are clamped without this message",
      owner_.name.empty() ? std::string("a session") : owner_.name, requests, rows, table,
      kInPlaceBytesPerSecond >> 30, std::min(requests, allowance_.requests),
      std::min(rows, allowance_.rows)));
}

uint64_t CacheTouchPage::Fold(const TouchFn& touch, const CountFn& count, const ReportFn& report) {
  std::lock_guard<std::mutex> lock(mu_);
  engram_cache_touch_page* h = header();
  auto* base = static_cast<uint8_t*>(map_.get());
  // The offsets are the daemon's own (the client may have overwritten the page's copy).
  const uint64_t counters_offset = sizeof(engram_cache_touch_page);
  const uint64_t ring_offset =
      (counters_offset + tables_ * sizeof(engram_cache_touch_counters) + 63) / 64 * 64;
  auto* counters = reinterpret_cast<engram_cache_touch_counters*>(base + counters_offset);
  auto* ring = reinterpret_cast<engram_cache_touch_entry*>(base + ring_offset);
  Refill();
  for (size_t t = 0; t < tables_; ++t) {
    const uint64_t requests = Shared(counters[t].requests).load(std::memory_order_relaxed);
    const uint64_t rows = Shared(counters[t].rows).load(std::memory_order_relaxed);
    engram_cache_touch_counters& seen = seen_[t];
    uint64_t more_requests = requests >= seen.requests ? requests - seen.requests : 0;
    uint64_t more_rows = rows >= seen.rows ? rows - seen.rows : 0;
    // The whole growth is taken as seen: what went past the bound is dropped, not carried over.
    seen.requests = requests;
    seen.rows = rows;
    if (more_requests == 0 && more_rows == 0) continue;
    if (more_requests > allowance_.requests || more_rows > allowance_.rows) {
      ReportClamp(t, more_requests, more_rows, report);
      more_requests = std::min(more_requests, allowance_.requests);
      more_rows = std::min(more_rows, allowance_.rows);
    }
    allowance_.requests -= more_requests;
    allowance_.rows -= more_rows;
    if (more_requests == 0 && more_rows == 0) continue;
    std::atomic<uint64_t>* session = nullptr;
    switch (count(t, more_requests, more_rows)) {
      case Counted::kNot:
        break;
      case Counted::kCache:
        session = owner_.cache_rows;
        break;
      case Counted::kResident:
        session = owner_.resident_rows;
        break;
    }
    if (session != nullptr) session->fetch_add(more_rows, std::memory_order_relaxed);
  }
  // The entries below head were written before it was published (its release store).
  const uint64_t head = Shared(h->head).load(std::memory_order_acquire);
  if (head == tail_) return 0;
  uint64_t from = tail_;
  // A head behind the tail or more than a ring ahead was not written by the protocol: read at
  // most the ring's newest entries, once.
  if (head < tail_ || head - tail_ > ENGRAM_CACHE_TOUCH_ENTRIES) {
    from = head >= ENGRAM_CACHE_TOUCH_ENTRIES ? head - ENGRAM_CACHE_TOUCH_ENTRIES : 0;
  }
  for (uint64_t i = from; i != head; ++i) {
    engram_cache_touch_entry& e = ring[i % ENGRAM_CACHE_TOUCH_ENTRIES];
    touch(Shared(e.key).load(std::memory_order_relaxed),
          Shared(e.slot).load(std::memory_order_relaxed));
  }
  tail_ = head;
  // The entries were read before the client may write them again.
  Shared(h->tail).store(head, std::memory_order_release);
  return head - from;
}

uint64_t CacheTouchPage::dropped() const {
  return Shared(header()->dropped).load(std::memory_order_relaxed);
}

}  // namespace engram
