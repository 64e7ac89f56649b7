// Offline cache simulations for the trace-replay benchmark: LRU, S3-FIFO, and both with a
// TinyLFU admission filter, over row keys, written independently of the daemon's RowCache so that
// the benchmark can set the daemon's hit rate beside what a policy should give. Each takes a
// batch the way engramd serves one: every row is looked up first (hits counted, use marked,
// every key recorded in the filter's sketch), then the misses are admitted in order (a key
// already present is not admitted twice).
//
//   engram::S3FifoSim s3(170'000, {.admission = engram::TinyLfuAt::kInsert});
//   for (const auto& batch : batches) s3.Batch(batch);
//   printf("%.4f\n", s3.counts.hit_rate());
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace engram {

struct SimCounts {
  uint64_t lookups = 0;
  uint64_t hits = 0;
  uint64_t admitted = 0;  // misses the admission filter let in (with a filter only)
  uint64_t rejected = 0;  // misses it kept out
  double hit_rate() const { return lookups == 0 ? 0 : double(hits) / double(lookups); }
};

// TinyLFU's frequency sketch (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache
// Admission Policy", ACM ToS 2017): a count-min sketch of 4-bit counters, four rows of
// bit_ceil(capacity) counters (2 to 4 bytes a cached key), every access recorded; after
// `sample_factor` x capacity records every counter is halved, so that counts follow recent
// popularity. The optional doorkeeper, a Bloom filter cleared with each halving, takes a key's
// first access so that keys seen once never reach the counters.
class FrequencySketch {
 public:
  struct Options {
    bool doorkeeper = true;
    uint32_t sample_factor = 10;
  };
  FrequencySketch(uint64_t capacity, Options options);
  void Record(uint64_t key);
  // How often `key` was recorded (older records halved at each halving), as a count-min sketch
  // tells it: collisions only add; at most 15 (16 with the doorkeeper).
  uint32_t Estimate(uint64_t key) const;
  uint64_t halvings() const { return halvings_; }

 private:
  static constexpr int kRows = 4;
  uint32_t Counter(int row, uint64_t index) const;
  uint64_t Index(int row, uint64_t key) const;
  std::pair<uint64_t, uint64_t> DoorkeeperBits(uint64_t key) const;  // the two bits a key sets
  bool DoorkeeperHas(uint64_t key) const;
  void Halve();

  Options options_;
  uint64_t width_mask_;               // counters a row, less one (a power of two)
  std::vector<uint64_t> counters_;    // kRows rows, 16 counters a word
  std::vector<uint64_t> doorkeeper_;  // bits; empty without one
  uint64_t doorkeeper_mask_ = 0;
  uint64_t sample_ = 0, samples_until_halving_;
  uint64_t halvings_ = 0;
};

// Where S3-FIFO consults the TinyLFU sketch.
enum class TinyLfuAt {
  kNone,
  // A miss whose insert must evict is admitted only if the sketch rates it above the row S3-FIFO
  // would evict for it (the victim stays, at the head of its queue, when the miss is refused).
  kInsert,
  // Every miss enters the small FIFO; a row leaving it unused competes with the main FIFO's
  // victim: the one the sketch rates higher goes to (or stays in) the main FIFO, the other
  // leaves (W-TinyLFU's window in front of its main cache, with S3-FIFO's queues). While the
  // main FIFO is empty the row leaves, as in S3-FIFO.
  kSmallExit,
};

class LruSim {
 public:
  // With a sketch (TinyLFU over LRU, as the TinyLFU paper tests it): a miss that would evict is
  // admitted only if the sketch rates it above the least recently used row.
  explicit LruSim(uint64_t capacity, bool tinylfu = false,
                  FrequencySketch::Options sketch = FrequencySketch::Options());
  // Returns the batch's hits.
  uint64_t Batch(std::span<const uint64_t> keys);
  SimCounts counts;

 private:
  uint64_t capacity_;
  std::list<uint64_t> order_;  // front: most recent
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> where_;
  std::vector<uint64_t> misses_;
  std::optional<FrequencySketch> sketch_;
};

// S3-FIFO (Yang et al., SOSP 2023) with the parameters engramd uses: small FIFO 10 % of the
// capacity, promotion after one use, use counters saturating at 3, a ghost of main's size; with
// a TinyLFU filter where `admission` says.
struct S3FifoSimOptions {
  TinyLfuAt admission = TinyLfuAt::kNone;
  FrequencySketch::Options sketch;
  // The filter lets a key in when the sketch rates it as high as the row it would displace (by
  // default only when higher: ties keep the row held, as TinyLFU does).
  bool admit_ties = false;
  // kInsert: a key the ghost remembers skips the filter (S3-FIFO's ghost already says that it
  // was evicted too early).
  bool ghost_bypass = false;
};

class S3FifoSim {
 public:
  explicit S3FifoSim(uint64_t capacity, S3FifoSimOptions options = S3FifoSimOptions());
  uint64_t Batch(std::span<const uint64_t> keys);
  SimCounts counts;
  bool Contains(uint64_t key) const { return entries_.contains(key); }

 private:
  struct Entry {
    uint8_t freq = 0;
    bool main = false;
  };
  enum class Queue { kSmall, kMain };
  void Insert(uint64_t key);
  // Runs the queues' clock (promotions, reinsertions) until the head of the returned queue is
  // the row S3-FIFO evicts next; EvictHead then evicts it.
  Queue FindVictim();
  void MainVictim();  // main's clock until its head is unused; main is not empty
  void EvictHead(Queue q);
  void AddGhost(uint64_t key);
  // Whether the filter lets `candidate` displace `incumbent`.
  bool Rates(uint64_t candidate, uint64_t incumbent) const {
    const uint32_t c = sketch_->Estimate(candidate), i = sketch_->Estimate(incumbent);
    return c > i || (options_.admit_ties && c == i);
  }
  uint64_t capacity_, small_target_;
  S3FifoSimOptions options_;
  std::deque<uint64_t> small_, main_;
  absl::flat_hash_map<uint64_t, Entry> entries_;
  std::deque<std::pair<uint64_t, uint64_t>> ghost_;
  absl::flat_hash_map<uint64_t, uint64_t> ghost_index_;
  uint64_t ghost_seq_ = 0;
  std::vector<uint64_t> misses_;
  std::optional<FrequencySketch> sketch_;
};

}  // namespace engram
