// The row cache's shared-memory layout: a header, a bucket index and an array of row slots.
// Readers in any process that maps the region find a row with no lock and no syscall, and a
// per-slot sequence number with the row's key, checked after the copy, keeps them from ever
// returning a torn row or another row's bytes. docs/row-store.md describes it. It sits in
// protocol/ because both sides of the mapping use it: the daemon's RowCache (store/) writes it,
// the client library reads it in place (protocol/row_cache_reader.h), and the GPU kernels look
// rows up in it (kernels/cache_device.h): the numbers and functions first, which device code
// uses too, then the host's structs over them, which nvcc and hipcc never see.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engram/row.h"

// What device code calls as well as host code: compiled for both by nvcc and hipcc.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define ENGRAM_HOST_DEVICE __host__ __device__
#else
#define ENGRAM_HOST_DEVICE
#endif

namespace engram {

inline constexpr uint64_t kRowCacheMagic = 0x314843524d524745ull;  // "EGRMRCH1"
// 2: the header carries tables_identity (a region handed to a later engramd is adopted only by
// one serving the same tables).
inline constexpr uint32_t kRowCacheVersion = 2;

// Identifies a row across tables: (layer + 1) << 40 | row. 0 is never a key (empty slot).
inline constexpr uint32_t kRowCacheRowBits = 40;
ENGRAM_HOST_DEVICE inline constexpr uint64_t RowCacheKey(uint32_t layer, uint64_t row) {
  return (uint64_t{layer} + 1) << kRowCacheRowBits | row;
}
ENGRAM_HOST_DEVICE inline constexpr uint64_t RowCacheHash(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdull;
  key ^= key >> 33;
  key *= 0xc4ceb9fe1a85ec53ull;
  key ^= key >> 33;
  return key;
}

// RowCacheHeader.flags. kRowCacheFlagAlignedRelease: pages are given back (hole-punched) only
// from a slot that starts on a page boundary, so no slot ever lies partly in a page given back
// and partly in one kept. A reader whose mapping keeps old pages (a GPU registration that pinned
// them) then sees every slot whole, old or new; without the flag such a reader must treat slots
// across a page boundary as misses.
inline constexpr uint32_t kRowCacheFlagAlignedRelease = 1u << 0;
// kRowCacheFlagRowCheck: every slot holding a key carries RowCacheSlot::check, a 64-bit check of
// that key and row, written with them. A reader that cannot afford the seqlock's ordered loads
// (a GPU across PCIe, where each acquire waits a round trip) may read the key, row and check in
// any order and accept the row when its check matches (docs/gpu.md, "Row cache hits on the
// GPU"): a row's bytes never change for its key, so any row that matches is the right one.
inline constexpr uint32_t kRowCacheFlagRowCheck = 1u << 1;

// Where a slot's fields lie (RowCacheSlot below, which is checked against these): what a reader
// without the host's structs (a GPU kernel) reads by offset.
inline constexpr uint32_t kRowCacheSlotBytes = 288;
inline constexpr uint32_t kRowCacheSlotSeqOffset = 0;
inline constexpr uint32_t kRowCacheSlotFreqOffset = 4;
inline constexpr uint32_t kRowCacheSlotKeyOffset = 8;
inline constexpr uint32_t kRowCacheSlotRowOffset = 16;
inline constexpr uint32_t kRowCacheSlotCheckOffset = kRowCacheSlotRowOffset + ENGRAM_ROW_BYTES;
inline constexpr size_t kRowCacheRowWords = ENGRAM_ROW_BYTES / sizeof(uint64_t);
static_assert(ENGRAM_ROW_BYTES % sizeof(uint64_t) == 0);
// A slot's use count saturates here (RowCacheSlot::freq).
inline constexpr uint8_t kRowCacheMaxFreq = 3;

// RowCacheSlot::check: the XOR of one term per 8-byte word of the key and the row (word 0 the
// key, words 1 to 33 the row's), each word mixed with its position by RowCacheHash, a bijection.
// Words from two different rows give a wrong check unless 64 bits collide. The host computes it
// whole (RowCacheCheck); a GPU warp one lane a word (kernels/cache_device.h).
inline constexpr uint64_t kRowCacheCheckSeed = 0x9e3779b97f4a7c15ull;
ENGRAM_HOST_DEVICE inline constexpr uint64_t RowCacheCheckTerm(uint64_t word, uint32_t position) {
  return RowCacheHash(word ^ (uint64_t{position} + 1) * kRowCacheCheckSeed);
}

// Buckets are 32-bit words: slot + 1, or 0 when empty.
inline constexpr uint32_t kRowCacheBucketBytes = 4;

}  // namespace engram

// The host's side: atomics over the layout above, and the copies in and out of a slot. Device
// code reads the region by the offsets above instead.
#if !defined(__CUDACC__) && !defined(__HIPCC__)
#include <atomic>
#include <cstring>

namespace engram {

struct RowCacheHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;    // sizeof(RowCacheHeader)
  uint32_t slot_bytes;      // sizeof(RowCacheSlot)
  uint32_t max_slots;       // slots the region has room for
  uint32_t bucket_count;    // a power of two, >= 2 * max_slots
  uint32_t flags;           // kRowCacheFlag*: what the writer guarantees its readers
  uint64_t buckets_offset;  // from the start of the region
  uint64_t slots_offset;
  std::atomic<uint32_t> capacity_slots;  // slots in use by the policy now (shrinks and grows)
  uint32_t reserved1;
  // What the rows were read from: a hash of the served tables' identities (the daemon's
  // TablesIdentity, store/cache_handoff.h); 0 when not set. A region handed to a later
  // engramd is adopted only if this equals its own.
  uint64_t tables_identity;
};
static_assert(sizeof(RowCacheHeader) == 64);
static_assert(offsetof(RowCacheHeader, tables_identity) == 56);
static_assert(offsetof(RowCacheHeader, buckets_offset) == 32);
static_assert(offsetof(RowCacheHeader, capacity_slots) == 48);

// One row. `seq` is odd while the writer changes the slot; a reader copies `row` between two
// equal even reads of `seq` and checks `key` in between. The row's bytes are 8-byte words read
// and written relaxed (LoadRowCacheRow, StoreRowCacheRow): a reader copies while the writer may
// be rewriting them, and plain copies would then be a data race (undefined behaviour) even
// though the seqlock discards what such a copy read. Relaxed word accesses are plain loads and
// stores on x86-64 and aarch64.
struct alignas(32) RowCacheSlot {
  std::atomic<uint32_t> seq;
  std::atomic<uint8_t> freq;  // accesses since admission, up to kRowCacheMaxFreq (policy input)
  // 1 while the row was admitted by a prefetch and no gather has hit it yet: the first hit
  // clears it and is counted as a prefetch used. Only the daemon reads and writes it.
  std::atomic<uint8_t> prefetched;
  uint8_t reserved[2];
  std::atomic<uint64_t> key;                     // RowCacheKey, 0 when empty
  std::atomic<uint64_t> row[kRowCacheRowWords];  // the row's ENGRAM_ROW_BYTES bytes
  std::atomic<uint64_t> check;                   // RowCacheCheck(key, row) (kRowCacheFlagRowCheck)
};
static_assert(sizeof(RowCacheSlot) == kRowCacheSlotBytes);
static_assert(offsetof(RowCacheSlot, seq) == kRowCacheSlotSeqOffset);
static_assert(offsetof(RowCacheSlot, freq) == kRowCacheSlotFreqOffset);
static_assert(offsetof(RowCacheSlot, prefetched) == 5);
static_assert(offsetof(RowCacheSlot, key) == kRowCacheSlotKeyOffset);
static_assert(offsetof(RowCacheSlot, row) == kRowCacheSlotRowOffset);
static_assert(offsetof(RowCacheSlot, check) == kRowCacheSlotCheckOffset);
static_assert(sizeof(RowCacheSlot::row) == ENGRAM_ROW_BYTES);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

inline void LoadRowCacheRow(const RowCacheSlot& slot, uint8_t* dst) {
  for (size_t i = 0; i < kRowCacheRowWords; ++i) {
    const uint64_t word = slot.row[i].load(std::memory_order_relaxed);
    std::memcpy(dst + i * sizeof(word), &word, sizeof(word));
  }
}

inline void StoreRowCacheRow(RowCacheSlot& slot, const uint8_t* src) {
  for (size_t i = 0; i < kRowCacheRowWords; ++i) {
    uint64_t word;
    std::memcpy(&word, src + i * sizeof(word), sizeof(word));
    slot.row[i].store(word, std::memory_order_relaxed);
  }
}

// RowCacheSlot::check of a key and its row's ENGRAM_ROW_BYTES bytes (kRowCacheCheckSeed above).
inline uint64_t RowCacheCheck(uint64_t key, const uint8_t* row) {
  uint64_t check = RowCacheCheckTerm(key, 0);
  for (size_t i = 0; i < kRowCacheRowWords; ++i) {
    uint64_t word;
    std::memcpy(&word, row + i * sizeof(word), sizeof(word));
    check ^= RowCacheCheckTerm(word, static_cast<uint32_t>(i + 1));
  }
  return check;
}

// Bucket i holds slot + 1 (0: empty); linear probing from RowCacheHash(key) & (count - 1).
using RowCacheBucket = std::atomic<uint32_t>;
static_assert(sizeof(RowCacheBucket) == kRowCacheBucketBytes);

}  // namespace engram
#endif  // !defined(__CUDACC__) && !defined(__HIPCC__)
