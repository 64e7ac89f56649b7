// RowCacheReader: rows looked up in a mapped row cache region (protocol/row_cache_layout.h)
// with no lock and no syscall. The daemon's RowCache reads through one; the client library
// attaches one to its read-only mapping of the cache to read hits in place (docs/row-store.md).
//
//   auto reader = engram::RowCacheReader::Attach(base, bytes);  // checks the header first
//   uint8_t row[ENGRAM_ROW_BYTES];
//   if (reader.ok() && reader->Lookup(14, 42, row)) { /* a hit, never torn */ }
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "protocol/row_cache_layout.h"

namespace engram {

// Looks rows up in a mapped row cache region; used by RowCache itself and by any process that
// maps the region (it validates the header before trusting any offset in it).
class RowCacheReader {
 public:
  RowCacheReader() = default;
  // `base` is the start of a region of `bytes` bytes. InvalidArgument if the header does not
  // describe a row cache that fits in it.
  static absl::StatusOr<RowCacheReader> Attach(const uint8_t* base, uint64_t bytes);

  // Copies row (layer, row) into dst (264 bytes) and returns true if it is cached. Never returns
  // a torn row or another row's bytes; may miss a row that is being moved. Lock-free, no syscall.
  // A reader that Attach() made only reads the region (it may be mapped read-only).
  bool Lookup(uint32_t layer, uint64_t row, uint8_t* dst) const;
  // Whether row (layer, row) is cached now, without copying it or marking it used.
  bool Contains(uint32_t layer, uint64_t row) const;
  // Lookup that returns the slot the row was copied from (-1: a miss) and, in *ret_freq, the
  // slot's use count as it was read (for a reader that reports its hits, docs/row-store.md).
  int64_t LookupSlot(uint32_t layer, uint64_t row, uint8_t* dst, uint8_t* ret_freq) const;
  // Hints for a gather that looks up many rows at random: ask the CPU for the line of the
  // bucket a row's probe starts at some rows ahead (PrefetchBucket), and, a few rows later when
  // that line has arrived, for the row's slot if the bucket names one (PrefetchSlot). They read
  // nothing a lookup relies on.
  void PrefetchBucket(uint32_t layer, uint64_t row) const;
  void PrefetchSlot(uint32_t layer, uint64_t row) const;

 private:
  friend class RowCache;
  // Finds the slot of `key` and copies its row into dst (null: no copy); the slot's index, or -1.
  int64_t Find(uint64_t key, uint8_t* dst) const;

  bool mark_use_ = false;  // count hits in the slots' use counters (the writer's own reader)
  const RowCacheHeader* header_ = nullptr;
  RowCacheBucket* buckets_ = nullptr;
  RowCacheSlot* slots_ = nullptr;
  uint32_t bucket_mask_ = 0;
  uint32_t max_slots_ = 0;
};

}  // namespace engram
