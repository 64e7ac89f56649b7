// The row cache across restarts: RowCache::Adopt takes over the region of an earlier engramd and
// rebuilds the policy state (the S3-FIFO queues, the free list, each slot's seq as last written)
// from its slots; RowCache::HotKeys lists the rows held, for the hot-set snapshot.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "store/row_cache.h"

namespace engram {
namespace {

// What a writer needs of a header that RowCacheReader::Attach accepted (it checks what a reader
// relies on): the index after the header and at most half full (inserts probe until an empty
// bucket), and the rows of the tables served now.
absl::Status CheckWritable(const RowCacheHeader& h, uint64_t tables_identity) {
  if (h.buckets_offset < sizeof(RowCacheHeader) || h.buckets_offset % sizeof(RowCacheBucket) ||
      h.max_slots == 0 || h.max_slots > UINT32_MAX / 4 ||
      uint64_t{h.bucket_count} < 2 * uint64_t{h.max_slots}) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "row cache region handed over: bad geometry (%u slots, %u buckets at offset %u)",
        h.max_slots, h.bucket_count, h.buckets_offset));
  }
  if (h.tables_identity != tables_identity) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "row cache region handed over holds rows of other tables (identity %016x, the tables "
        "served now are %016x): a table file was replaced, repacked or moved, or the served "
        "layers or row ranges changed",
        h.tables_identity, tables_identity));
  }
  return absl::OkStatus();
}

// Which slots lie wholly in a hole of the memfd (never written, or given back by a shrink):
// reading one would make the kernel allocate its page. Asked in ascending slot order.
class SlotHoles {
 public:
  SlotHoles(int fd, uint64_t slots_offset) : fd_(fd), slots_offset_(slots_offset) {}
  bool InHole(uint64_t slot) {
    const int64_t at = static_cast<int64_t>(slots_offset_ + slot * sizeof(RowCacheSlot));
    if (at >= data_end_) Next(at);
    // Only the slot's seq and key are read where its row is not wanted; a slot whose first
    // bytes lie in a hole holds no row, even if its row's bytes reach a page with data.
    return at + static_cast<int64_t>(offsetof(RowCacheSlot, row)) <= data_begin_;
  }

 private:
  // The next extent of data at or after `at` (SEEK_DATA, SEEK_HOLE).
  void Next(int64_t at) {
    const off_t data = lseek(fd_, at, SEEK_DATA);
    if (data < 0) {
      // ENXIO: no data after `at`. Anything else: holes cannot be told, so every slot is read.
      data_begin_ = errno == ENXIO ? INT64_MAX : 0;
      data_end_ = INT64_MAX;
      return;
    }
    data_begin_ = data;
    const off_t hole = lseek(fd_, data, SEEK_HOLE);
    data_end_ = hole < 0 ? INT64_MAX : hole;
  }
  const int fd_;
  const uint64_t slots_offset_;
  int64_t data_begin_ = -1;
  int64_t data_end_ = -1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RowCache>> RowCache::Adopt(UniqueFd fd,
                                                          const RowCacheOptions& options,
                                                          MemoryBudget* budget, const KeepRow& keep,
                                                          RowCacheAdoption* ret_adoption) {
  *ret_adoption = RowCacheAdoption{};
  if (options.small_fraction <= 0 || options.small_fraction >= 1) {
    return absl::InvalidArgumentError("row cache: small_fraction must lie in (0, 1)");
  }
  auto region = SharedRegion::Adopt("engram-row-cache", std::move(fd));
  if (!region.ok()) return region.status();
  uint8_t* base = region->data();
  auto reader = RowCacheReader::Attach(base, region->size());
  if (!reader.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row cache region handed over (", region->size(), " bytes): ", reader.status().message(),
        "; it was not written by this version of engramd"));
  }
  auto* h = reinterpret_cast<RowCacheHeader*>(base);
  if (absl::Status s = CheckWritable(*h, options.tables_identity); !s.ok()) return s;
  h->flags |= kRowCacheFlagAlignedRelease;  // this engramd's releases start on a slot boundary
  // A region an engramd wrote before slots carried checks: RebuildFromSlots writes them for the
  // rows it keeps, before any client maps the region, and the flag says so from then on.
  const bool write_checks = (h->flags & kRowCacheFlagRowCheck) == 0;
  std::unique_ptr<RowCache> cache(new RowCache(options, budget));
  const uint64_t max_slots = h->max_slots;
  // What the budget allows now: the index first (it cannot shrink), then as many slots as fit
  // under options.max_bytes and what the budget has left.
  const uint64_t index_bytes = h->slots_offset + BookkeepingBytes(max_slots);
  if (budget != nullptr) {
    if (absl::Status s = budget->Reserve(index_bytes, "row cache index and bookkeeping"); !s.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("row cache region handed over: its index and bookkeeping (", index_bytes,
                       " bytes) do not fit the memory budget: ", s.message()));
    }
    cache->reserved_bytes_ = index_bytes;
  }
  uint64_t allowed = max_slots;
  if (options.max_bytes != 0) {
    allowed = std::min(allowed, options.max_bytes > index_bytes
                                    ? SlotsForBytes(options.max_bytes - index_bytes)
                                    : uint64_t{0});
  }

  cache->region_ = std::move(*region);
  cache->header_ = h;
  cache->buckets_ = reinterpret_cast<RowCacheBucket*>(base + h->buckets_offset);
  cache->slots_ = reinterpret_cast<RowCacheSlot*>(base + h->slots_offset);
  cache->bucket_mask_ = h->bucket_count - 1;
  cache->max_slots_ = h->max_slots;
  cache->meta_.resize(max_slots);
  cache->ghost_ = GhostQueue(max_slots);
  cache->reader_ = *reader;
  cache->reader_.mark_use_ = true;
  // Whole pages of slots, as many as the budget has room for.
  if (budget != nullptr) allowed = cache->SlotsFitting(0, allowed, budget->available());
  // Slots at or above the capacity the earlier daemon had were given back (or, after a crash in
  // the middle of a shrink, hold rows it had not moved down yet: those are lost); they are not
  // read, which would allocate their pages again.
  const uint64_t usable = std::min<uint64_t>(max_slots, h->capacity_slots.load());
  cache->RebuildFromSlots(usable, keep, write_checks, ret_adoption);
  h->flags |= kRowCacheFlagRowCheck;
  // Shrink by the normal path to what is allowed, or grow to it. The budget is not charged for
  // slots above `allowed` (the shrink gives them back to the kernel), so it is detached while
  // the shrink runs and charged for what is left after.
  const uint64_t evictions_before = cache->evictions_;
  if (allowed < usable) {
    MemoryBudget* saved = cache->budget_;
    cache->budget_ = nullptr;
    cache->SetCapacitySlots(allowed);
    cache->budget_ = saved;
  }
  ret_adoption->evicted_to_fit = cache->evictions_ - evictions_before;
  const uint64_t held = cache->capacity_slots();
  if (budget != nullptr && held > 0) {
    const uint64_t charge = cache->ChargedSlotBytes(held) - cache->ChargedSlotBytes(0);
    if (absl::Status s = budget->Reserve(charge, "row cache"); !s.ok()) {
      return s;  // available() said it fits; only a racing owner of the budget gets here
    }
    cache->reserved_bytes_ += charge;
  }
  if (allowed > held) cache->SetCapacitySlots(allowed);  // grows, charging the budget
  return cache;
}

void RowCache::RebuildFromSlots(uint64_t usable_slots, const KeepRow& keep, bool write_checks,
                                RowCacheAdoption* ret) {
  std::lock_guard<std::mutex> lock(mu_);
  // The index is rebuilt from scratch: whatever the earlier daemon left in it (a probe run cut
  // by a crash in the middle of a deletion) is never trusted.
  for (uint64_t b = 0; b <= bucket_mask_; ++b) buckets_[b].store(0, std::memory_order_relaxed);
  header_->capacity_slots.store(static_cast<uint32_t>(usable_slots), std::memory_order_relaxed);
  std::vector<uint32_t> kept_small;
  std::vector<uint32_t> kept_main;
  SlotHoles holes(region_.fd(), reinterpret_cast<uint8_t*>(slots_) - region_.data());
  for (uint64_t i = 0; i < usable_slots; ++i) {
    if (holes.InHole(i)) {  // never written or given back: free, and left untouched
      free_.push_back(static_cast<uint32_t>(i));
      continue;
    }
    RowCacheSlot& s = slot(static_cast<uint32_t>(i));
    const uint32_t seq = s.seq.load(std::memory_order_relaxed);
    const uint64_t key = s.key.load(std::memory_order_relaxed);
    // Writes go on from an even seq past the one found, so that seq keeps growing.
    meta_[i].seq = (seq & 1) != 0 ? seq + 1 : seq;
    meta_[i].key = key;
    meta_[i].queue = kFree;
    bool good = key != 0 && (seq & 1) == 0;
    if (key != 0 && (seq & 1) != 0) ++ret->torn;
    good = good && KeepsAdoptedSlot(static_cast<uint32_t>(i), key, keep, write_checks, ret);
    if (!good) {
      if (key != 0 || (seq & 1) != 0) ClearSlot(static_cast<uint32_t>(i));
      free_.push_back(static_cast<uint32_t>(i));
      continue;
    }
    s.prefetched.store(0, std::memory_order_relaxed);
    InsertBucket(key, static_cast<uint32_t>(i));
    (s.freq.load(std::memory_order_relaxed) > 0 ? kept_main : kept_small)
        .push_back(static_cast<uint32_t>(i));
    ++ret->kept;
  }
  // free_ pops from the back: the lowest free slots are used first.
  std::reverse(free_.begin(), free_.end());
  for (uint32_t i : kept_main) Push(kMain, i);
  for (uint32_t i : kept_small) Push(kSmall, i);
}

bool RowCache::KeepsAdoptedSlot(uint32_t i, uint64_t key, const KeepRow& keep, bool write_checks,
                                RowCacheAdoption* ret) {
  const uint64_t layer = (key >> kRowCacheRowBits) - 1;
  const uint64_t row = key & ((uint64_t{1} << kRowCacheRowBits) - 1);
  if (layer >= (1u << 23) || !keep(static_cast<uint32_t>(layer), row)) {
    ++ret->not_served;
    return false;
  }
  RowCacheSlot& s = slot(i);
  uint8_t data[ENGRAM_ROW_BYTES];
  LoadRowCacheRow(s, data);
  const uint64_t check = RowCacheCheck(key, data);
  if (write_checks) {
    // A region written before slots carried checks: ProveRows compares each such row with its
    // file before anything is served.
    s.check.store(check, std::memory_order_relaxed);
  } else if (s.check.load(std::memory_order_relaxed) != check) {
    // Checked before the duplicate test: a slot whose key was overwritten with another kept
    // slot's key must not make that slot a duplicate of it.
    ++ret->bad_check;
    ++ret->bad_check_by_layer[static_cast<uint32_t>(layer)];
    return false;
  }
  if (FindBucket(key) >= 0) {
    ++ret->duplicates;
    return false;
  }
  return true;
}

absl::Status RowCache::ProveRows(const ReadRows& read, uint64_t deadline_ns,
                                 RowCacheProof* ret_proof) {
  *ret_proof = RowCacheProof{};
  std::lock_guard<std::mutex> lock(mu_);
  // One pending piece per layer, filled in slot order: memory stays a piece per layer however
  // large the cache, and a piece's rows are sorted before the read so that rows sharing a page
  // are one read.
  std::map<uint32_t, std::vector<uint32_t>> pending;
  const uint64_t capacity = capacity_slots();
  for (uint64_t i = 0; i < capacity; ++i) {
    if (meta_[i].queue == kFree) continue;
    const auto layer = static_cast<uint32_t>((meta_[i].key >> kRowCacheRowBits) - 1);
    std::vector<uint32_t>& piece = pending[layer];
    piece.push_back(static_cast<uint32_t>(i));
    if (piece.size() < kProvePieceRows) continue;
    if (absl::Status s = ProvePiece(layer, piece, read, deadline_ns, ret_proof); !s.ok()) return s;
  }
  for (auto& [layer, piece] : pending) {
    if (absl::Status s = ProvePiece(layer, piece, read, deadline_ns, ret_proof); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status RowCache::ProvePiece(uint32_t layer, std::vector<uint32_t>& slots,
                                  const ReadRows& read, uint64_t deadline_ns, RowCacheProof* ret) {
  if (slots.empty()) return absl::OkStatus();
  if (deadline_ns != 0 && NowNs() >= deadline_ns) {
    for (const uint32_t s : slots) {
      RemoveSlot(s, /*to_ghost=*/false);
      free_.push_back(s);
    }
    ret->unproven += slots.size();
    slots.clear();
    return absl::OkStatus();
  }
  constexpr uint64_t kRowMask = (uint64_t{1} << kRowCacheRowBits) - 1;
  std::sort(slots.begin(), slots.end(),
            [&](uint32_t a, uint32_t b) { return meta_[a].key < meta_[b].key; });
  std::vector<uint64_t> rows(slots.size());
  for (size_t k = 0; k < slots.size(); ++k) rows[k] = meta_[slots[k]].key & kRowMask;
  std::vector<uint8_t> stored(slots.size() * ENGRAM_ROW_BYTES);
  if (absl::Status s = read(layer, rows, stored.data()); !s.ok()) return s;
  uint8_t cached[ENGRAM_ROW_BYTES];
  for (size_t k = 0; k < slots.size(); ++k) {
    LoadRowCacheRow(slot(slots[k]), cached);  // the writer's own slot: no seq check needed
    ++ret->compared;
    if (std::memcmp(cached, stored.data() + k * ENGRAM_ROW_BYTES, ENGRAM_ROW_BYTES) == 0) {
      continue;
    }
    RemoveSlot(slots[k], /*to_ghost=*/false);
    free_.push_back(slots[k]);
    ++ret->stale;
    ++ret->stale_by_layer[layer];
  }
  slots.clear();
  return absl::OkStatus();
}

std::vector<uint64_t> RowCache::HotKeys(uint64_t max_keys) const {
  std::vector<uint64_t> keys;
  const uint64_t capacity = capacity_slots();
  // Lock-free, as a reader: a slot being written (odd or changed seq) is skipped, and so is one
  // in a hole of the memfd (reading it would allocate its page). Rows hit since admission
  // first, then the others.
  for (int pass = 0; pass < 2; ++pass) {
    SlotHoles holes(region_.fd(), reinterpret_cast<const uint8_t*>(slots_) - region_.data());
    for (uint64_t i = 0; i < capacity && keys.size() < max_keys; ++i) {
      if (holes.InHole(i)) continue;
      const RowCacheSlot& s = slots_[i];
      const uint32_t before = s.seq.load(std::memory_order_acquire);
      const uint64_t key = s.key.load(std::memory_order_relaxed);
      const bool used = s.freq.load(std::memory_order_relaxed) > 0;
      if ((before & 1) != 0 || key == 0 || used != (pass == 0)) continue;
      std::atomic_thread_fence(std::memory_order_acquire);
      if (s.seq.load(std::memory_order_relaxed) != before) continue;
      keys.push_back(key);
    }
  }
  return keys;
}

}  // namespace engram
