// LruSim and S3FifoSim.
#include "testkit/cache_sim.h"

#include <algorithm>

namespace engram {

uint64_t LruSim::Batch(std::span<const uint64_t> keys) {
  uint64_t hits = 0;
  misses_.clear();
  for (uint64_t k : keys) {
    auto it = where_.find(k);
    if (it == where_.end()) {
      misses_.push_back(k);
      continue;
    }
    ++hits;
    order_.splice(order_.begin(), order_, it->second);
  }
  for (uint64_t k : misses_) {
    if (capacity_ == 0 || where_.contains(k)) continue;
    if (where_.size() >= capacity_) {
      where_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(k);
    where_[k] = order_.begin();
  }
  counts.lookups += keys.size();
  counts.hits += hits;
  return hits;
}

S3FifoSim::S3FifoSim(uint64_t capacity)
    : capacity_(capacity),
      small_target_(std::max<uint64_t>(1, static_cast<uint64_t>(capacity * 0.1))) {}

void S3FifoSim::Evict() {
  for (;;) {
    if ((small_.size() >= small_target_ || main_.empty()) && !small_.empty()) {
      const uint64_t k = small_.front();
      small_.pop_front();
      Entry& e = entries_[k];
      if (e.freq >= 1) {
        e.freq = 0;
        e.main = true;
        main_.push_back(k);
        continue;
      }
      entries_.erase(k);
      ghost_.emplace_back(k, ++ghost_seq_);
      ghost_index_[k] = ghost_seq_;
      const uint64_t limit = std::max<uint64_t>(1, capacity_ - small_target_);
      while (ghost_.size() > limit) {
        auto [g, seq] = ghost_.front();
        ghost_.pop_front();
        auto it = ghost_index_.find(g);
        if (it != ghost_index_.end() && it->second == seq) ghost_index_.erase(it);
      }
      return;
    }
    const uint64_t k = main_.front();
    main_.pop_front();
    Entry& e = entries_[k];
    if (e.freq > 0) {
      --e.freq;
      main_.push_back(k);
      continue;
    }
    entries_.erase(k);
    return;
  }
}

void S3FifoSim::Insert(uint64_t key) {
  if (capacity_ == 0 || entries_.contains(key)) return;
  if (entries_.size() >= capacity_) Evict();
  auto ghost = ghost_index_.find(key);
  Entry e;
  if (ghost != ghost_index_.end()) {
    ghost_index_.erase(ghost);
    e.main = true;
    main_.push_back(key);
  } else {
    small_.push_back(key);
  }
  entries_[key] = e;
}

uint64_t S3FifoSim::Batch(std::span<const uint64_t> keys) {
  uint64_t hits = 0;
  misses_.clear();
  for (uint64_t k : keys) {
    auto it = entries_.find(k);
    if (it == entries_.end()) {
      misses_.push_back(k);
      continue;
    }
    ++hits;
    if (it->second.freq < 3) ++it->second.freq;
  }
  for (uint64_t k : misses_) Insert(k);
  counts.lookups += keys.size();
  counts.hits += hits;
  return hits;
}

}  // namespace engram
