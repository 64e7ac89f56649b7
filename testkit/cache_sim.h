// Offline cache simulations for the trace-replay benchmark: LRU and S3-FIFO over row keys,
// written independently of the daemon's RowCache so that the benchmark can set the daemon's
// hit rate beside what the policy should give. Both take a batch the way engramd serves one:
// every row is looked up first (hits counted, use marked), then the misses are admitted in
// order (a key already present is not admitted twice).
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace engram {

struct SimCounts {
  uint64_t lookups = 0;
  uint64_t hits = 0;
  double hit_rate() const { return lookups == 0 ? 0 : double(hits) / double(lookups); }
};

class LruSim {
 public:
  explicit LruSim(uint64_t capacity) : capacity_(capacity) {}
  // Returns the batch's hits.
  uint64_t Batch(std::span<const uint64_t> keys);
  SimCounts counts;

 private:
  uint64_t capacity_;
  std::list<uint64_t> order_;  // front: most recent
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> where_;
  std::vector<uint64_t> misses_;
};

// S3-FIFO (Yang et al., SOSP 2023) with the parameters engramd uses: small FIFO 10 % of the
// capacity, promotion after one use, use counters saturating at 3, a ghost of main's size.
class S3FifoSim {
 public:
  explicit S3FifoSim(uint64_t capacity);
  uint64_t Batch(std::span<const uint64_t> keys);
  SimCounts counts;

 private:
  struct Entry {
    uint8_t freq = 0;
    bool main = false;
  };
  void Insert(uint64_t key);
  void Evict();
  uint64_t capacity_, small_target_;
  std::deque<uint64_t> small_, main_;
  absl::flat_hash_map<uint64_t, Entry> entries_;
  std::deque<std::pair<uint64_t, uint64_t>> ghost_;
  absl::flat_hash_map<uint64_t, uint64_t> ghost_index_;
  uint64_t ghost_seq_ = 0;
  std::vector<uint64_t> misses_;
};

}  // namespace engram
