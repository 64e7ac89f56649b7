// FrequencySketch, LruSim and S3FifoSim.
#include "testkit/cache_sim.h"

#include <algorithm>
#include <bit>

namespace engram {
namespace {

// splitmix64's finaliser: every input bit reaches every output bit.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr uint64_t kRowSeeds[5] = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full,
                                   0x165667b19e3779f9ull, 0xd6e8feb86659fd93ull,
                                   0xa0761d6478bd642full};
constexpr uint32_t kMaxCount = 15;  // 4-bit counters

}  // namespace

FrequencySketch::FrequencySketch(uint64_t capacity, Options options)
    : options_(options),
      width_mask_(std::bit_ceil(std::max<uint64_t>(capacity, 16)) - 1),
      counters_(kRows * (width_mask_ + 1) / 16),
      samples_until_halving_(std::max<uint64_t>(1, uint64_t{options.sample_factor} * capacity)) {
  if (options_.doorkeeper) {
    // 16 bits a cached key, two probes.
    doorkeeper_.resize((width_mask_ + 1) * 16 / 64);
    doorkeeper_mask_ = (width_mask_ + 1) * 16 - 1;
  }
}

uint64_t FrequencySketch::Index(int row, uint64_t key) const {
  return Mix(key ^ kRowSeeds[row]) & width_mask_;
}

uint32_t FrequencySketch::Counter(int row, uint64_t index) const {
  const uint64_t at = row * (width_mask_ + 1) + index;
  return static_cast<uint32_t>(counters_[at / 16] >> (at % 16 * 4)) & kMaxCount;
}

std::pair<uint64_t, uint64_t> FrequencySketch::DoorkeeperBits(uint64_t key) const {
  const uint64_t h = Mix(key ^ kRowSeeds[4]);
  return {h & doorkeeper_mask_, (h >> 32) & doorkeeper_mask_};
}

bool FrequencySketch::DoorkeeperHas(uint64_t key) const {
  const auto [a, b] = DoorkeeperBits(key);
  return (doorkeeper_[a / 64] >> (a % 64) & 1) != 0 && (doorkeeper_[b / 64] >> (b % 64) & 1) != 0;
}

void FrequencySketch::Record(uint64_t key) {
  bool counted = false;  // by the doorkeeper
  if (options_.doorkeeper && !DoorkeeperHas(key)) {
    const auto [a, b] = DoorkeeperBits(key);
    doorkeeper_[a / 64] |= uint64_t{1} << (a % 64);
    doorkeeper_[b / 64] |= uint64_t{1} << (b % 64);
    counted = true;
  }
  for (int row = 0; row < kRows && !counted; ++row) {
    const uint64_t at = row * (width_mask_ + 1) + Index(row, key);
    if ((counters_[at / 16] >> (at % 16 * 4) & kMaxCount) < kMaxCount) {
      counters_[at / 16] += uint64_t{1} << (at % 16 * 4);
    }
  }
  if (++sample_ >= samples_until_halving_) Halve();
}

uint32_t FrequencySketch::Estimate(uint64_t key) const {
  uint32_t m = kMaxCount;
  for (int row = 0; row < kRows; ++row) m = std::min(m, Counter(row, Index(row, key)));
  return options_.doorkeeper && DoorkeeperHas(key) ? m + 1 : m;
}

void FrequencySketch::Halve() {
  for (uint64_t& w : counters_) w = (w >> 1) & 0x7777777777777777ull;
  std::fill(doorkeeper_.begin(), doorkeeper_.end(), 0);
  sample_ = 0;
  ++halvings_;
}

LruSim::LruSim(uint64_t capacity, bool tinylfu, FrequencySketch::Options sketch)
    : capacity_(capacity) {
  if (tinylfu) sketch_.emplace(capacity, sketch);
}

uint64_t LruSim::Batch(std::span<const uint64_t> keys) {
  uint64_t hits = 0;
  misses_.clear();
  for (uint64_t k : keys) {
    if (sketch_) sketch_->Record(k);
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
      if (sketch_) {
        if (sketch_->Estimate(k) <= sketch_->Estimate(order_.back())) {
          ++counts.rejected;
          continue;
        }
        ++counts.admitted;
      }
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

S3FifoSim::S3FifoSim(uint64_t capacity, S3FifoSimOptions options)
    : capacity_(capacity),
      small_target_(std::max<uint64_t>(1, static_cast<uint64_t>(capacity * 0.1))),
      options_(options) {
  if (options.admission != TinyLfuAt::kNone) sketch_.emplace(capacity, options.sketch);
}

void S3FifoSim::MainVictim() {
  for (;;) {
    const uint64_t k = main_.front();
    Entry& e = entries_[k];
    if (e.freq == 0) return;
    --e.freq;
    main_.pop_front();
    main_.push_back(k);
  }
}

S3FifoSim::Queue S3FifoSim::FindVictim() {
  for (;;) {
    if ((small_.size() >= small_target_ || main_.empty()) && !small_.empty()) {
      const uint64_t k = small_.front();
      Entry& e = entries_[k];
      if (e.freq >= 1) {
        small_.pop_front();
        e.freq = 0;
        e.main = true;
        main_.push_back(k);
        continue;
      }
      if (options_.admission == TinyLfuAt::kSmallExit && !main_.empty()) {
        MainVictim();
        if (Rates(k, main_.front())) {  // k takes the main victim's place
          small_.pop_front();
          e.main = true;
          main_.push_back(k);
          ++counts.admitted;
          return Queue::kMain;
        }
        ++counts.rejected;
      }
      return Queue::kSmall;
    }
    MainVictim();
    return Queue::kMain;
  }
}

void S3FifoSim::AddGhost(uint64_t key) {
  ghost_.emplace_back(key, ++ghost_seq_);
  ghost_index_[key] = ghost_seq_;
  const uint64_t limit = std::max<uint64_t>(1, capacity_ - small_target_);
  while (ghost_.size() > limit) {
    auto [g, seq] = ghost_.front();
    ghost_.pop_front();
    auto it = ghost_index_.find(g);
    if (it != ghost_index_.end() && it->second == seq) ghost_index_.erase(it);
  }
}

void S3FifoSim::EvictHead(Queue q) {
  std::deque<uint64_t>& queue = q == Queue::kSmall ? small_ : main_;
  const uint64_t k = queue.front();
  queue.pop_front();
  entries_.erase(k);
  if (q == Queue::kSmall) AddGhost(k);
}

void S3FifoSim::Insert(uint64_t key) {
  if (capacity_ == 0 || entries_.contains(key)) return;
  if (entries_.size() >= capacity_) {
    const Queue q = FindVictim();
    if (options_.admission == TinyLfuAt::kInsert &&
        !(options_.ghost_bypass && ghost_index_.contains(key))) {
      if (!Rates(key, q == Queue::kSmall ? small_.front() : main_.front())) {
        ++counts.rejected;
        return;
      }
      ++counts.admitted;
    }
    EvictHead(q);
  }
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
    if (sketch_) sketch_->Record(k);
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
