// GhostQueue: the keys of rows the row cache recently evicted from its small FIFO, oldest first,
// with a set lookup (S3-FIFO's ghost queue). A row whose key is still here when it is read again
// goes straight to the main FIFO.
//
// Its memory is sized once, for the most keys it may ever hold, and never grows or rehashes:
// a growing hash map rehashed all its keys while the cache's writer lock was held (tens of
// millions of keys for a 16 GiB cache, ~0.3 s during which every insert waited), and one with
// tombstones rebuilt itself in place as keys came and went. Here a ring holds the keys in order
// and an open-addressing index (linear probing, backward-shift deletion, no tombstones) holds
// ring positions, so every operation costs a few probes. Both arrays are zero-filled on demand
// by the kernel: the pages a small ghost never reaches are never touched.
//
//   GhostQueue ghost(max_keys);
//   ghost.Push(key, limit);            // evicted from the small FIFO
//   if (ghost.Take(key)) { /* seen again: admit to the main FIFO */ }
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

namespace engram {

class GhostQueue {
 public:
  GhostQueue() = default;
  // Room for up to `max_keys` keys (keys are never 0).
  explicit GhostQueue(uint64_t max_keys);

  // Appends `key` (moving it to the young end if it is here already) and keeps what is left of
  // the last `limit` keys pushed (limit is clamped to [1, max_keys]): a key taken since still
  // counts against the limit until it would have dropped out.
  void Push(uint64_t key, uint64_t limit);
  // Removes `key` and returns true if it is in the queue.
  bool Take(uint64_t key);
  bool Contains(uint64_t key) const { return Find(key) >= 0; }
  uint64_t size() const { return live_; }
  uint64_t max_keys() const { return ring_size_; }
  // The memory a queue for `max_keys` keys has mapped when it is full.
  static uint64_t BytesFor(uint64_t max_keys);

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  // The index bucket whose ring position holds `key`, or -1.
  int64_t Find(uint64_t key) const;
  void Erase(uint64_t bucket);
  void PopOldest();

  uint64_t ring_size_ = 0;
  std::unique_ptr<uint64_t[], Free> ring_;   // keys by position % ring_size_; 0 once taken
  std::unique_ptr<uint32_t[], Free> index_;  // ring slot + 1 per bucket, 0 when empty
  uint64_t index_mask_ = 0;
  uint64_t head_ = 0;  // position of the oldest entry (taken entries included)
  uint64_t tail_ = 0;  // position the next key takes
  uint64_t live_ = 0;  // keys in the queue (entries not taken)
};

}  // namespace engram
