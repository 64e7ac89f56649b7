#include "store/ghost_queue.h"

#include <algorithm>
#include <bit>
#include <new>

#include "protocol/row_cache_layout.h"

namespace engram {
namespace {

// calloc: large blocks come from fresh anonymous mappings, zero without being written.
template <typename T>
T* ZeroedArray(uint64_t n) {
  void* p = std::calloc(n, sizeof(T));
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<T*>(p);
}

}  // namespace

namespace {

// Ring slots are stored + 1 in 32-bit buckets; the index is at most half full.
uint64_t RingSize(uint64_t max_keys) { return std::clamp<uint64_t>(max_keys, 1, UINT32_MAX - 1); }
uint64_t IndexBuckets(uint64_t ring_size) { return std::bit_ceil(2 * ring_size); }

}  // namespace

uint64_t GhostQueue::BytesFor(uint64_t max_keys) {
  const uint64_t ring = RingSize(max_keys);
  return ring * sizeof(uint64_t) + IndexBuckets(ring) * sizeof(uint32_t);
}

GhostQueue::GhostQueue(uint64_t max_keys) : ring_size_(RingSize(max_keys)) {
  const uint64_t buckets = IndexBuckets(ring_size_);
  ring_.reset(ZeroedArray<uint64_t>(ring_size_));
  index_.reset(ZeroedArray<uint32_t>(buckets));
  index_mask_ = buckets - 1;
}

int64_t GhostQueue::Find(uint64_t key) const {
  for (uint64_t at = RowCacheHash(key) & index_mask_;; at = (at + 1) & index_mask_) {
    const uint32_t b = index_[at];
    if (b == 0) return -1;
    if (ring_[b - 1] == key) return static_cast<int64_t>(at);
  }
}

// Backward-shift deletion, as in the row cache's own index: later entries of the probe run move
// up so that no lookup stops at the hole.
void GhostQueue::Erase(uint64_t hole) {
  for (uint64_t next = hole;;) {
    next = (next + 1) & index_mask_;
    const uint32_t b = index_[next];
    if (b == 0) break;
    const uint64_t home = RowCacheHash(ring_[b - 1]) & index_mask_;
    const bool stays = hole <= next ? (home > hole && home <= next) : (home > hole || home <= next);
    if (stays) continue;
    index_[hole] = b;
    hole = next;
  }
  index_[hole] = 0;
}

void GhostQueue::PopOldest() {
  uint64_t& key = ring_[head_ % ring_size_];
  if (key != 0) {
    Erase(static_cast<uint64_t>(Find(key)));
    key = 0;
    --live_;
  }
  ++head_;
}

void GhostQueue::Push(uint64_t key, uint64_t limit) {
  limit = std::clamp<uint64_t>(limit, 1, ring_size_);
  Take(key);  // a key already here moves to the young end
  // The last `limit` keys pushed stay, less those taken since (they keep their positions).
  while (tail_ - head_ >= limit) PopOldest();
  const uint64_t slot = tail_++ % ring_size_;
  ring_[slot] = key;
  uint64_t at = RowCacheHash(key) & index_mask_;
  while (index_[at] != 0) at = (at + 1) & index_mask_;
  index_[at] = static_cast<uint32_t>(slot + 1);
  ++live_;
}

bool GhostQueue::Take(uint64_t key) {
  const int64_t at = Find(key);
  if (at < 0) return false;
  const uint32_t slot = index_[at] - 1;
  Erase(static_cast<uint64_t>(at));
  ring_[slot] = 0;
  --live_;
  return true;
}

}  // namespace engram
