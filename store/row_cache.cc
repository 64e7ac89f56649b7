// RowCache: the shared-memory slot array and bucket index, and the S3-FIFO policy over them.
#include "store/row_cache.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/page_size.h"
#include "base/prefetch.h"

namespace engram {
namespace {

constexpr uint64_t kBucketsOffset = 64;
constexpr uint64_t kSlotBytes = sizeof(RowCacheSlot);

struct Geometry {
  uint32_t max_slots = 0;
  uint32_t bucket_count = 0;
  uint64_t slots_offset = 0;
  uint64_t region_bytes = 0;
};

Geometry GeometryFor(uint64_t slots) {
  Geometry g;
  g.max_slots = static_cast<uint32_t>(slots);
  g.bucket_count = static_cast<uint32_t>(std::bit_ceil(std::max<uint64_t>(2 * slots, 64)));
  // The slot array starts a page, so the first slot's page can be given back and the index's
  // pages are never shared with slots; the region is whole pages, as the kernel maps it.
  const uint64_t page = PageBytes();
  g.slots_offset =
      RoundUpTo(kBucketsOffset + uint64_t{g.bucket_count} * sizeof(RowCacheBucket), page);
  g.region_bytes = RoundUpTo(g.slots_offset + slots * kSlotBytes, page);
  return g;
}

}  // namespace

bool RowCache::Lookup(uint32_t layer, uint64_t row, uint8_t* dst, bool* ret_prefetch_used) {
  *ret_prefetch_used = false;
  const int64_t b = reader_.Find(RowCacheKey(layer, row), dst);
  if (b < 0) return false;
  RowCacheSlot& s = slots_[b];
  uint8_t f = s.freq.load(std::memory_order_relaxed);
  if (f < kRowCacheMaxFreq) s.freq.store(f + 1, std::memory_order_relaxed);
  // Cheap test first: a plain load, and the exchange only on a marked slot. Two hits racing on
  // one marked row: the exchange lets exactly one of them count it. A mark the slot got for
  // another row after the seqlock check is at worst one use counted for the wrong row.
  *ret_prefetch_used = s.prefetched.load(std::memory_order_relaxed) != 0 &&
                       s.prefetched.exchange(0, std::memory_order_relaxed) != 0;
  return true;
}

void RowCache::Touch(uint32_t slot, uint64_t key) {
  // Below the capacity only: a slot above it may be a released page, which a read would bring
  // back. A slot rewritten since the client's hit holds another key and is left alone.
  if (key == 0 || slot >= capacity_slots()) return;
  RowCacheSlot& s = slots_[slot];
  if (s.key.load(std::memory_order_relaxed) != key) return;
  const uint8_t f = s.freq.load(std::memory_order_relaxed);
  if (f < kRowCacheMaxFreq) s.freq.store(f + 1, std::memory_order_relaxed);
}

uint64_t RowCache::BytesForSlots(uint64_t slots) { return slots * kSlotBytes; }

uint64_t RowCache::BookkeepingBytes(uint64_t max_slots) {
  // Per slot: the policy's state, a free-list entry and room for two FIFO entries (a slot's
  // current one and a stale one not yet popped); and the ghost's ring and index.
  return max_slots * (sizeof(SlotMeta) + sizeof(uint32_t) + 2 * sizeof(QueueEntry)) +
         GhostQueue::BytesFor(max_slots);
}
uint64_t RowCache::SlotsForBytes(uint64_t bytes) { return bytes / kSlotBytes; }

RowCacheSizing RowCache::Size(uint64_t max_bytes) {
  // The largest slot count whose slots and index fit max_bytes (Create takes the smaller of its
  // size and what the budget has left): the cache can never grow past it, so a larger index
  // would be memory wasted.
  uint64_t slots = std::min<uint64_t>(max_bytes / (kSlotBytes + 8), UINT32_MAX / 4);
  while (slots > 0 && GeometryFor(slots).region_bytes + BookkeepingBytes(slots) > max_bytes) {
    slots -= slots / 64 + 1;
  }
  RowCacheSizing s{.max_bytes = max_bytes, .slots = slots};
  if (slots == 0) {
    s.unused_bytes = max_bytes;
    return s;
  }
  const Geometry g = GeometryFor(slots);
  s.row_bytes = slots * kRowBytes;
  s.slot_header_bytes = slots * (kSlotBytes - kRowBytes);
  s.index_bytes = g.slots_offset;
  s.buckets = g.bucket_count;
  s.bookkeeping_bytes = BookkeepingBytes(slots);
  s.unused_bytes = max_bytes - g.region_bytes - s.bookkeeping_bytes;
  return s;
}

absl::StatusOr<std::unique_ptr<RowCache>> RowCache::Create(const RowCacheOptions& options,
                                                           MemoryBudget* budget) {
  const uint64_t max_bytes =
      budget != nullptr ? std::min(options.max_bytes, budget->available()) : options.max_bytes;
  const uint64_t slots = Size(max_bytes).slots;
  if (slots == 0) {
    return absl::InvalidArgumentError(absl::StrCat("row cache: ", max_bytes,
                                                   " bytes (the smaller of its size and what the "
                                                   "memory budget has left) hold no row"));
  }
  if (options.small_fraction <= 0 || options.small_fraction >= 1) {
    return absl::InvalidArgumentError("row cache: small_fraction must lie in (0, 1)");
  }
  const Geometry g = GeometryFor(slots);
  std::unique_ptr<RowCache> cache(new RowCache(options, budget));
  if (budget != nullptr) {
    const uint64_t fixed = g.slots_offset + BookkeepingBytes(g.max_slots);
    if (absl::Status s = budget->Reserve(fixed, "row cache index and bookkeeping"); !s.ok()) {
      return s;
    }
    cache->reserved_bytes_ = fixed;
  }
  auto region = SharedRegion::Create("engram-row-cache", g.region_bytes, {});
  if (!region.ok()) return region.status();
  cache->region_ = std::move(*region);
  uint8_t* base = cache->region_.data();
  auto* h = new (base) RowCacheHeader{};
  h->magic = kRowCacheMagic;
  h->version = kRowCacheVersion;
  h->header_bytes = sizeof(RowCacheHeader);
  h->slot_bytes = sizeof(RowCacheSlot);
  h->max_slots = g.max_slots;
  h->bucket_count = g.bucket_count;
  h->flags = kRowCacheFlagAlignedRelease | kRowCacheFlagRowCheck;
  h->buckets_offset = kBucketsOffset;
  h->slots_offset = g.slots_offset;
  h->capacity_slots.store(0, std::memory_order_relaxed);
  h->tables_identity = options.tables_identity;
  // The region is zero-filled: every bucket is empty, every slot has seq 0 and key 0.
  cache->header_ = h;
  cache->buckets_ = reinterpret_cast<RowCacheBucket*>(base + kBucketsOffset);
  cache->slots_ = reinterpret_cast<RowCacheSlot*>(base + g.slots_offset);
  cache->bucket_mask_ = g.bucket_count - 1;
  cache->max_slots_ = g.max_slots;
  cache->meta_.resize(g.max_slots);
  cache->ghost_ = GhostQueue(g.max_slots);
  auto reader = RowCacheReader::Attach(base, cache->region_.size());
  if (!reader.ok()) return reader.status();
  cache->reader_ = *reader;
  cache->reader_.mark_use_ = true;
  cache->SetCapacitySlots(g.max_slots);
  return cache;
}

RowCache::~RowCache() {
  if (budget_ != nullptr) budget_->Give(reserved_bytes_);
}

uint64_t RowCache::capacity_slots() const {
  return header_->capacity_slots.load(std::memory_order_relaxed);
}

uint64_t RowCache::SmallTarget() const {
  return std::max<uint64_t>(1, static_cast<uint64_t>(capacity_slots() * options_.small_fraction));
}

int64_t RowCache::FindBucket(uint64_t key) const {
  const uint64_t home = RowCacheHash(key);
  for (uint64_t i = 0; i <= bucket_mask_; ++i) {
    const uint64_t at = (home + i) & bucket_mask_;
    const uint32_t b = buckets_[at].load(std::memory_order_relaxed);
    if (b == 0) return -1;
    if (meta_[b - 1].key == key) return static_cast<int64_t>(at);
  }
  return -1;
}

int64_t RowCache::FindSlot(uint64_t key) const {
  const int64_t b = FindBucket(key);
  return b < 0 ? -1 : int64_t{buckets_[b].load(std::memory_order_relaxed)} - 1;
}

void RowCache::InsertBucket(uint64_t key, uint32_t s) {
  const uint64_t home = RowCacheHash(key);
  for (uint64_t i = 0;; ++i) {  // the index is at most half full: an empty bucket exists
    RowCacheBucket& b = buckets_[(home + i) & bucket_mask_];
    if (b.load(std::memory_order_relaxed) == 0) {
      b.store(s + 1, std::memory_order_release);
      return;
    }
  }
}

// Backward-shift deletion: later entries of the probe run move up so that no lookup stops at
// the hole. An entry is stored in its new bucket before the old one is cleared, so a concurrent
// reader sees it twice or, at worst, misses it (a miss, never a wrong row).
void RowCache::EraseBucket(uint64_t hole) {
  uint64_t next = hole;
  for (;;) {
    next = (next + 1) & bucket_mask_;
    const uint32_t b = buckets_[next].load(std::memory_order_relaxed);
    if (b == 0) break;
    const uint64_t home = RowCacheHash(meta_[b - 1].key) & bucket_mask_;
    // Move the entry at `next` into the hole unless its home lies cyclically in (hole, next].
    const bool stays = hole <= next ? (home > hole && home <= next) : (home > hole || home <= next);
    if (stays) continue;
    buckets_[hole].store(b, std::memory_order_release);
    hole = next;
  }
  buckets_[hole].store(0, std::memory_order_release);
}

void RowCache::WriteSlot(uint32_t i, uint64_t key, const uint8_t* data) {
  RowCacheSlot& s = slot(i);
  const uint32_t seq = meta_[i].seq;
  s.seq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // odd seq is seen before any new byte
  s.key.store(key, std::memory_order_relaxed);
  StoreRowCacheRow(s, data);
  s.check.store(RowCacheCheck(key, data), std::memory_order_relaxed);
  s.freq.store(0, std::memory_order_relaxed);
  s.prefetched.store(0, std::memory_order_relaxed);
  s.seq.store(seq + 2, std::memory_order_release);
  meta_[i].seq = seq + 2;
  meta_[i].key = key;
}

void RowCache::ClearSlot(uint32_t i) {
  RowCacheSlot& s = slot(i);
  const uint32_t seq = meta_[i].seq;
  s.seq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.key.store(0, std::memory_order_relaxed);
  s.seq.store(seq + 2, std::memory_order_release);
  meta_[i].seq = seq + 2;
  meta_[i].key = 0;
}

void RowCache::Push(Queue queue, uint32_t s) {
  meta_[s].queue = queue;
  QueueEntry e{s, meta_[s].generation};
  if (queue == kSmall) {
    small_.push_back(e);
    ++small_count_;
  } else {
    main_.push_back(e);
    ++main_count_;
  }
}

// Pops the oldest entry of `queue` that still describes its slot (entries go stale when a slot
// is removed or moved outside the policy's order).
bool RowCache::PopLive(std::deque<QueueEntry>& queue, Queue which, uint32_t* ret_slot) {
  while (!queue.empty()) {
    QueueEntry e = queue.front();
    queue.pop_front();
    if (meta_[e.slot].generation != e.generation || meta_[e.slot].queue != which) continue;
    (which == kSmall ? small_count_ : main_count_) -= 1;
    *ret_slot = e.slot;
    return true;
  }
  return false;
}

void RowCache::AddGhost(uint64_t key) {
  // The ghost remembers as many keys as the main FIFO holds rows.
  ghost_.Push(key, std::max<uint64_t>(1, capacity_slots() - SmallTarget()));
}

void RowCache::RemoveSlot(uint32_t s, bool to_ghost) {
  const uint64_t key = meta_[s].key;
  if (meta_[s].pins != 0) {
    meta_[s].pins = 0;
    --pinned_rows_;
  }
  if (int64_t b = FindBucket(key); b >= 0) EraseBucket(static_cast<uint64_t>(b));
  ClearSlot(s);
  if (meta_[s].queue == kSmall) --small_count_;
  if (meta_[s].queue == kMain) --main_count_;
  meta_[s].queue = kFree;
  ++meta_[s].generation;
  if (to_ghost) AddGhost(key);
}

// S3-FIFO eviction: while the small FIFO is over its share, its oldest row moves to the main FIFO
// if it was used since admission, else it leaves (its key goes to the ghost); otherwise the main
// FIFO's oldest row is reinserted while its use count lasts (decremented each time) and then
// leaves. A pinned row is passed over (to the main FIFO's young end) until every row held has
// been passed over once. Returns the freed slot.
uint32_t RowCache::EvictOne() {
  // Callers evict only from a cache that holds rows (no free slot and a capacity above 0, or
  // more rows than the capacity).
  const uint64_t held = small_count_ + main_count_;
  uint64_t passed = 0;  // pinned rows passed over: past `held`, every row is pinned
  auto keep_pinned = [&](uint32_t s) {
    if (meta_[s].pins == 0) return false;
    if (passed++ >= held) {
      ++pinned_evictions_;
      return false;
    }
    Push(kMain, s);
    return true;
  };
  for (;;) {
    uint32_t s = 0;
    if ((small_count_ >= SmallTarget() || main_count_ == 0) && PopLive(small_, kSmall, &s)) {
      meta_[s].queue = kFree;
      if (keep_pinned(s)) continue;
      if (slot(s).freq.load(std::memory_order_relaxed) >= options_.promote_threshold) {
        slot(s).freq.store(0, std::memory_order_relaxed);
        Push(kMain, s);
        ++promotions_;
        continue;
      }
      meta_[s].queue = kSmall;
      ++small_count_;
      RemoveSlot(s, /*to_ghost=*/true);
      ++evictions_;
      return s;
    }
    if (!PopLive(main_, kMain, &s)) continue;  // the small FIFO holds every row: pop it above
    if (keep_pinned(s)) continue;
    const uint8_t f = slot(s).freq.load(std::memory_order_relaxed);
    if (f > 0) {
      slot(s).freq.store(f - 1, std::memory_order_relaxed);
      Push(kMain, s);
      continue;
    }
    meta_[s].queue = kMain;
    ++main_count_;
    RemoveSlot(s, /*to_ghost=*/false);
    ++evictions_;
    return s;
  }
}

absl::Status RowCache::Insert(uint32_t layer, uint64_t row, const uint8_t* data) {
  return InsertWith(layer, row, data, /*prefetched=*/false, /*pin=*/false, nullptr, nullptr);
}

absl::Status RowCache::InsertPrefetched(uint32_t layer, uint64_t row, const uint8_t* data,
                                        bool* ret_inserted) {
  return InsertWith(layer, row, data, /*prefetched=*/true, /*pin=*/false, ret_inserted, nullptr);
}

absl::Status RowCache::InsertPinned(uint32_t layer, uint64_t row, const uint8_t* data,
                                    bool* ret_inserted, bool* ret_pinned) {
  return InsertWith(layer, row, data, /*prefetched=*/true, /*pin=*/true, ret_inserted, ret_pinned);
}

bool RowCache::PinSlot(uint32_t s) {
  if (meta_[s].pins == kMaxPins) return false;
  if (meta_[s].pins++ == 0) ++pinned_rows_;
  return true;
}

bool RowCache::Pin(uint32_t layer, uint64_t row) {
  if (row >> kRowCacheRowBits != 0 || layer >= (1u << 23)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t s = FindSlot(RowCacheKey(layer, row));
  return s >= 0 && PinSlot(static_cast<uint32_t>(s));
}

void RowCache::Unpin(uint32_t layer, uint64_t row) {
  if (row >> kRowCacheRowBits != 0 || layer >= (1u << 23)) return;
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t s = FindSlot(RowCacheKey(layer, row));
  if (s < 0 || meta_[s].pins == 0) return;
  if (--meta_[s].pins == 0) --pinned_rows_;
}

absl::Status RowCache::InsertWith(uint32_t layer, uint64_t row, const uint8_t* data,
                                  bool prefetched, bool pin, bool* ret_inserted, bool* ret_pinned) {
  if (ret_inserted != nullptr) *ret_inserted = false;
  if (ret_pinned != nullptr) *ret_pinned = false;
  if (row >> kRowCacheRowBits != 0 || layer >= (1u << 23)) {
    return absl::InvalidArgumentError(
        absl::StrCat("row cache: layer ", layer, " row ", row, " is outside the key space"));
  }
  const uint64_t key = RowCacheKey(layer, row);
  insert_waiters_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  insert_waiters_.fetch_sub(1, std::memory_order_relaxed);
  insert_entries_.fetch_add(1, std::memory_order_relaxed);
  if (capacity_slots() == 0) return absl::OkStatus();
  if (const int64_t held = FindSlot(key); held >= 0) {
    if (pin && ret_pinned != nullptr) *ret_pinned = PinSlot(static_cast<uint32_t>(held));
    return absl::OkStatus();
  }
  uint32_t s;
  if (!TakeSlot(&s)) {
    ++shrink_skipped_inserts_;
    return absl::OkStatus();
  }
  WriteSlot(s, key, data);
  if (prefetched) {
    // Set before the bucket publishes the slot: no reader finds the row unmarked.
    slot(s).prefetched.store(1, std::memory_order_relaxed);
    ++prefetch_inserts_;
  }
  InsertBucket(key, s);
  ++inserts_;
  if (ret_inserted != nullptr) *ret_inserted = true;
  if (pin) {
    PinSlot(s);  // a fresh slot: its first pin
    if (ret_pinned != nullptr) *ret_pinned = true;
  }
  if (ghost_.Take(key)) {
    ++ghost_hits_;
    Push(kMain, s);
  } else {
    Push(kSmall, s);
  }
  return absl::OkStatus();
}

bool RowCache::TakeSlot(uint32_t* ret_slot) {
  if (!shrinking_) {
    if (free_.empty()) {
      *ret_slot = EvictOne();
      return true;
    }
    *ret_slot = free_.back();
    free_.pop_back();
    return true;
  }
  // Between a shrink's chunks: nothing is evicted (the shrink does that by policy) and no row
  // lands in a slot the shrink has to empty; free slots above the new capacity that are found on
  // the way are dropped from the list (at most a few per insert, so none waits long for it).
  constexpr int kMaxDropped = 64;
  const uint64_t capacity = capacity_slots();
  if (small_count_ + main_count_ >= capacity) return false;
  for (int i = 0; i < kMaxDropped && !free_.empty(); ++i) {
    const uint32_t s = free_.back();
    free_.pop_back();
    if (s < capacity) {
      *ret_slot = s;
      return true;
    }
  }
  return false;
}

// Moves the row in slot `from` to the free slot `to`, keeping its queue (at the young end).
void RowCache::MoveDown(uint32_t from, uint32_t to) {
  const uint64_t key = meta_[from].key;
  const Queue queue = meta_[from].queue;
  const uint8_t freq = slot(from).freq.load(std::memory_order_relaxed);
  const uint8_t prefetched = slot(from).prefetched.load(std::memory_order_relaxed);
  uint8_t row[kRowBytes];
  LoadRowCacheRow(slot(from), row);  // the writer's own slot: no seq check needed
  WriteSlot(to, key, row);
  slot(to).freq.store(freq, std::memory_order_relaxed);
  slot(to).prefetched.store(prefetched, std::memory_order_relaxed);
  // Both slots hold the row now; point its bucket at the new one, then clear the old.
  const uint64_t home = RowCacheHash(key);
  for (uint64_t i = 0; i <= bucket_mask_; ++i) {
    RowCacheBucket& bucket = buckets_[(home + i) & bucket_mask_];
    if (bucket.load(std::memory_order_relaxed) == from + 1) {
      bucket.store(to + 1, std::memory_order_release);
      break;
    }
  }
  meta_[to].pins = meta_[from].pins;
  meta_[from].pins = 0;
  ClearSlot(from);
  meta_[from].queue = kFree;
  ++meta_[from].generation;
  (queue == kSmall ? small_count_ : main_count_) -= 1;
  Push(queue, to);
}

uint64_t RowCache::SetCapacitySlots(uint64_t slots) {
  std::lock_guard<std::mutex> resize(resize_mu_);
  uint64_t old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = capacity_slots();
    slots = std::min<uint64_t>(slots, max_slots_);
    if (slots >= old) return Grow(slots, old);
    // From here on no insert evicts or writes a slot at or above `slots` (TakeSlot).
    header_->capacity_slots.store(static_cast<uint32_t>(slots), std::memory_order_relaxed);
    shrinking_ = true;
  }
  Shrink(slots, old);
  return slots;
}

uint64_t RowCache::Grow(uint64_t slots, uint64_t old) {
  uint64_t charge = 0;
  if (slots > old && budget_ != nullptr) {
    slots = SlotsFitting(old, slots, budget_->available());
    charge = ChargedSlotBytes(slots) - ChargedSlotBytes(old);
    // Reserve cannot fail for what available() allowed unless another owner raced us.
    if (charge > 0 && !budget_->Reserve(charge, "row cache").ok()) slots = old;
  }
  if (slots == old) return old;
  for (uint64_t s = slots; s-- > old;) free_.push_back(static_cast<uint32_t>(s));
  header_->capacity_slots.store(static_cast<uint32_t>(slots), std::memory_order_relaxed);
  reserved_bytes_ += charge;
  return slots;
}

uint64_t RowCache::ChargedSlotBytes(uint64_t capacity) const {
  const uint64_t offset = reinterpret_cast<uint8_t*>(slots_) - region_.data();
  const uint64_t end =
      std::min(region_.size(), offset + FirstPageAlignedSlot(capacity) * kSlotBytes);
  return end - offset;
}

uint64_t RowCache::SlotsFitting(uint64_t from, uint64_t to, uint64_t bytes) const {
  const uint64_t base = ChargedSlotBytes(from);
  while (from < to) {  // ChargedSlotBytes grows with the capacity: a binary search
    const uint64_t mid = from + (to - from + 1) / 2;
    if (ChargedSlotBytes(mid) - base <= bytes) {
      from = mid;
    } else {
      to = mid - 1;
    }
  }
  return from;
}

// A mutex is not fair: the shrink, releasing it and taking it again at once, would win it over an
// insert that waits to be scheduled, chunk after chunk. So between chunks it waits (briefly, and
// only while inserts wait) until as many inserts as were waiting have had the lock.
void RowCache::LetWritersIn() {
  const uint32_t waiting = insert_waiters_.load(std::memory_order_relaxed);
  if (waiting == 0) return;
  const uint64_t target = insert_entries_.load(std::memory_order_relaxed) + waiting;
  const uint64_t deadline = NowNs() + 2'000'000;
  while (insert_entries_.load(std::memory_order_relaxed) < target && NowNs() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// A shrink in chunks, each under the writer's lock: evict by policy until the rows fit, drop the
// free slots at or above the new capacity from the free list, move the rows left up there down
// into free slots below it, give the pages and the budget back.
void RowCache::Shrink(uint64_t slots, uint64_t old) {
  const uint64_t chunk = std::max<uint32_t>(1, options_.shrink_chunk_slots);
  for (bool more = true; more;) {
    LetWritersIn();
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t i = 0; i < chunk && small_count_ + main_count_ > slots; ++i) {
      free_.push_back(EvictOne());
    }
    more = small_count_ + main_count_ > slots;
  }
  ShrinkFreeList(slots);
  // Rows fit (inserts keep them within `slots`), and every free slot below `slots` is on the
  // free list: there is one for every row still above.
  for (uint64_t s = slots; s < old;) {
    LetWritersIn();
    std::lock_guard<std::mutex> lock(mu_);
    for (const uint64_t end = std::min(old, s + chunk); s < end; ++s) {
      if (meta_[s].queue == kFree) continue;
      const uint32_t to = free_.back();
      free_.pop_back();
      MoveDown(static_cast<uint32_t>(s), to);
    }
  }
  ReleaseSlots(slots, old);
  std::lock_guard<std::mutex> lock(mu_);
  if (budget_ != nullptr) {  // the whole pages given back, no more
    const uint64_t freed = ChargedSlotBytes(old) - ChargedSlotBytes(slots);
    budget_->Give(freed);
    reserved_bytes_ -= freed;
  }
  shrinking_ = false;
}

// Removes the free slots at or above `slots` from the free list, a chunk at a time. Entries
// before `at` are checked; an insert between chunks only pops from the back.
void RowCache::ShrinkFreeList(uint64_t slots) {
  const uint64_t chunk = std::max<uint32_t>(1, options_.shrink_chunk_slots);
  for (size_t at = 0;;) {
    LetWritersIn();
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t i = 0; i < chunk && at < free_.size(); ++i) {
      if (free_[at] < slots) {
        ++at;
        continue;
      }
      free_[at] = free_.back();
      free_.pop_back();
    }
    if (at >= free_.size()) return;
  }
}

// Gives the pages of slots [slots, old) back. No writer touches them while the shrink runs, so
// this needs no lock; it goes in pieces so that a client's page fault elsewhere in the region
// never waits behind one long hole punch.
uint64_t RowCache::FirstPageAlignedSlot(uint64_t from) const {
  // Slot starts fall on a page boundary once every page / gcd(slot, page) slots; the first such
  // slot at or above `from` is found within one period.
  const uint64_t page = region_.page_bytes();
  const uint64_t offset = reinterpret_cast<uint8_t*>(slots_) - region_.data();
  const uint64_t period = page / std::gcd(kSlotBytes, page);
  for (uint64_t i = from; i < from + period; ++i) {
    if ((offset + i * kSlotBytes) % page == 0) return i;
  }
  return from;  // unreachable: the slot array starts on a multiple of gcd(slot, page)
}

void RowCache::ReleaseSlots(uint64_t slots, uint64_t old) {
  constexpr uint64_t kPiece = 16 << 20;  // a multiple of any page size
  // From the first slot that starts a page (kRowCacheFlagAlignedRelease): the slots below it
  // keep their pages (at most page / 32 - 1 slots of 288 bytes: 36 KiB with 4 KiB pages,
  // 576 KiB with 64 KiB ones), and Release() never cuts into a page.
  slots = FirstPageAlignedSlot(slots);
  if (slots >= old) return;
  // Up to the end of what `old` held: the pages of the slots past it up to the next page start,
  // and the region's last page, go too.
  const uint64_t slots_offset = reinterpret_cast<uint8_t*>(slots_) - region_.data();
  const uint64_t begin = slots_offset + slots * kSlotBytes;
  const uint64_t end = slots_offset + ChargedSlotBytes(old);
  for (uint64_t at = begin; at < end;) {
    const uint64_t next = std::min(end, (at / kPiece + 1) * kPiece);
    (void)region_.Release(at, next - at);
    at = next;
  }
}

uint64_t RowCache::ReleaseAboveCapacity() {
  std::unique_lock<std::mutex> resize(resize_mu_, std::try_to_lock);  // the capacity holds still
  if (!resize.owns_lock()) return 0;
  const uint64_t before = region_.ResidentBytes();
  const uint64_t capacity = capacity_slots();
  if (capacity < max_slots_) ReleaseSlots(capacity, max_slots_);
  const uint64_t after = region_.ResidentBytes();
  return before > after ? before - after : 0;
}

RowCacheStats RowCache::Stats() const {
  RowCacheStats st;
  std::lock_guard<std::mutex> lock(mu_);
  st.capacity_slots = capacity_slots();
  st.max_slots = max_slots_;
  st.used_slots = small_count_ + main_count_;
  st.bytes = header_ != nullptr ? reinterpret_cast<const uint8_t*>(slots_) - region_.data() +
                                      ChargedSlotBytes(st.capacity_slots)
                                : 0;
  st.resident_bytes = region_.ResidentBytes();
  st.hits = hits_.load(std::memory_order_relaxed);
  st.misses = misses_.load(std::memory_order_relaxed);
  st.inserts = inserts_;
  st.evictions = evictions_;
  st.ghost_hits = ghost_hits_;
  st.promotions = promotions_;
  st.prefetch_inserts = prefetch_inserts_;
  st.shrink_skipped_inserts = shrink_skipped_inserts_;
  st.pinned_rows = pinned_rows_;
  st.pinned_evictions = pinned_evictions_;
  return st;
}

}  // namespace engram
