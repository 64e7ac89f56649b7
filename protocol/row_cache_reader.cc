// RowCacheReader: the header check and the lock-free lookups (row_cache_reader.h).
#include "protocol/row_cache_reader.h"

#include "absl/strings/str_cat.h"
#include "base/prefetch.h"

namespace engram {

absl::StatusOr<RowCacheReader> RowCacheReader::Attach(const uint8_t* base, uint64_t bytes) {
  if (bytes < sizeof(RowCacheHeader)) {
    return absl::InvalidArgumentError(
        absl::StrCat("row cache region of ", bytes, " bytes is too small"));
  }
  const auto* h = reinterpret_cast<const RowCacheHeader*>(base);
  const bool pow2 = h->bucket_count != 0 && (h->bucket_count & (h->bucket_count - 1)) == 0;
  if (h->magic != kRowCacheMagic || h->version != kRowCacheVersion ||
      h->header_bytes != sizeof(RowCacheHeader) || h->slot_bytes != sizeof(RowCacheSlot) || !pow2 ||
      h->buckets_offset + uint64_t{h->bucket_count} * sizeof(RowCacheBucket) > h->slots_offset ||
      h->slots_offset % alignof(RowCacheSlot) != 0 ||
      h->slots_offset + uint64_t{h->max_slots} * sizeof(RowCacheSlot) > bytes) {
    return absl::InvalidArgumentError("row cache region: bad header (magic, version or sizes)");
  }
  RowCacheReader r;
  r.header_ = h;
  r.buckets_ = reinterpret_cast<RowCacheBucket*>(const_cast<uint8_t*>(base) + h->buckets_offset);
  r.slots_ = reinterpret_cast<RowCacheSlot*>(const_cast<uint8_t*>(base) + h->slots_offset);
  r.bucket_mask_ = h->bucket_count - 1;
  r.max_slots_ = h->max_slots;
  return r;
}

int64_t RowCacheReader::Find(uint64_t key, uint8_t* dst) const {
  if (slots_ == nullptr) return -1;
  const uint64_t home = RowCacheHash(key);
  for (uint64_t i = 0; i <= bucket_mask_; ++i) {
    const uint32_t b = buckets_[(home + i) & bucket_mask_].load(std::memory_order_acquire);
    if (b == 0) return -1;
    if (b > max_slots_) continue;
    RowCacheSlot& s = slots_[b - 1];
    const uint32_t before = s.seq.load(std::memory_order_acquire);
    if ((before & 1) != 0 || s.key.load(std::memory_order_relaxed) != key) continue;
    if (dst != nullptr) LoadRowCacheRow(s, dst);
    // The copy must be complete before seq is read again (the seqlock's read side).
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != before) return -1;
    return b - 1;
  }
  return -1;
}

bool RowCacheReader::Lookup(uint32_t layer, uint64_t row, uint8_t* dst) const {
  const int64_t b = Find(RowCacheKey(layer, row), dst);
  if (b < 0) return false;
  RowCacheSlot& s = slots_[b];
  uint8_t f = s.freq.load(std::memory_order_relaxed);
  if (mark_use_ && f < kRowCacheMaxFreq) s.freq.store(f + 1, std::memory_order_relaxed);
  return true;
}

int64_t RowCacheReader::LookupSlot(uint32_t layer, uint64_t row, uint8_t* dst,
                                   uint8_t* ret_freq) const {
  const int64_t b = Find(RowCacheKey(layer, row), dst);
  *ret_freq = b >= 0 ? slots_[b].freq.load(std::memory_order_relaxed) : 0;
  return b;
}

bool RowCacheReader::Contains(uint32_t layer, uint64_t row) const {
  return Find(RowCacheKey(layer, row), nullptr) >= 0;
}

void RowCacheReader::PrefetchBucket(uint32_t layer, uint64_t row) const {
  if (slots_ == nullptr) return;
  __builtin_prefetch(&buckets_[RowCacheHash(RowCacheKey(layer, row)) & bucket_mask_]);
}

void RowCacheReader::PrefetchSlot(uint32_t layer, uint64_t row) const {
  if (slots_ == nullptr) return;
  const uint64_t home = RowCacheHash(RowCacheKey(layer, row)) & bucket_mask_;
  const uint32_t b = buckets_[home].load(std::memory_order_relaxed);
  if (b == 0 || b > max_slots_) return;
  PrefetchLines(&slots_[b - 1], sizeof(RowCacheSlot));
}

}  // namespace engram
