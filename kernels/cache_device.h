// The device half of reading the daemon's row cache in place (protocol/row_cache_layout.h): the
// lookup of one row by one warp, checked by the slot's row check rather than its seqlock, shared
// by engram_dequant_cache_gather (engram_cache.cu) and the queue's cache step (engram_queue.cu).
// Included only by .cu sources. Why the check is enough is docs/gpu.md's "Row cache hits on the
// GPU".
#pragma once

#include <cstdint>

#include "engram/gpu.h"
#include "kernels/dequant_device.h"
#include "kernels/gpu_compat.h"
#include "protocol/row_cache_layout.h"  // its shared part: the host's structs stay out

namespace engram::kernels {

// Plain (weak) loads of host memory a CPU thread writes concurrently. A warp's plain loads of
// neighbouring words are coalesced into one request per 32-byte sector, where system-scope
// strong loads go over PCIe one per lane: on the H200 host a slot's 35 words read strong took
// the lookup to 4x the resident read. Nothing here relies on a load's order, atomicity or
// freshness: the row check decides whether what they read is one row, and a row's bytes never
// change for its key (docs/gpu.md, "Row cache hits on the GPU"). What matters is that the words
// checked are the words dequantised: each is loaded once, by a load the compiler may not repeat
// or re-read later (volatile asm on CUDA, a volatile access on HIP), into a register.
#if defined(ENGRAM_HIP)
__device__ __forceinline__ uint32_t LoadWord32(const void* p) {
  return *static_cast<const volatile uint32_t*>(p);
}
__device__ __forceinline__ uint64_t LoadWord64(const void* p) {
  return *static_cast<const volatile uint64_t*>(p);
}
#else
__device__ __forceinline__ uint32_t LoadWord32(const void* p) {
  uint32_t v;
  asm volatile("ld.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint64_t LoadWord64(const void* p) {
  uint64_t v;
  asm volatile("ld.global.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}
#endif

// The 32-thread group's vote and shuffle (a warp on CUDA; half a 64-lane wavefront on
// AMD, whose lanes run in lockstep).
#if defined(ENGRAM_HIP)
__device__ __forceinline__ uint32_t GroupBallot(bool p) {
  return static_cast<uint32_t>(static_cast<uint64_t>(__ballot(p)) >> (threadIdx.x & 32u));
}
__device__ __forceinline__ uint64_t GroupShfl64(uint64_t v, uint32_t src) {
  return __shfl(static_cast<unsigned long long>(v), static_cast<int>(src), 32);
}
#else
__device__ __forceinline__ uint32_t GroupBallot(bool p) { return __ballot_sync(0xffffffffu, p); }
__device__ __forceinline__ uint64_t GroupShfl64(uint64_t v, uint32_t src) {
  return __shfl_sync(0xffffffffu, v, src);
}
#endif

// What a kernel needs of the cache (engram_gpu_row_cache, checked by the host).
struct DeviceRowCache {
  const uint8_t* buckets;
  const uint8_t* slots;
  uint64_t covered_begin, covered_end;
  uint32_t bucket_mask;
  uint32_t max_slots;
  uint32_t slot_bytes;
  uint32_t layer;
  uint64_t slots_offset;      // of the region's first slot, from its first byte
  uint32_t guard_page_bytes;  // 0, or slots across a multiple of it are misses
};

// Where a warp records what it did not fill, and the hits for the policy.
struct DeviceMisses {
  uint64_t* rows;
  uint32_t* slots;
  uint32_t* count;
  engram_gpu_cache_hit* hits;
  uint32_t* hit_count;
  uint64_t* hit_total;
};

// What one lane reads of a slot in one round trip: its 8 of the row's values, and one more
// word for lanes 0-2 (the check, the row's 8 scale bytes, the seq and use count).
struct LaneSlot {
  uint64_t values;
  uint64_t extra;
};

// Lane `lane` of a warp reads its part of the slot at `slot`.
__device__ __forceinline__ LaneSlot ReadSlot(const uint8_t* slot, uint32_t lane) {
  const uint8_t* row = slot + kRowCacheSlotRowOffset;
  const uint8_t* extra = lane == 0   ? slot + kRowCacheSlotCheckOffset
                         : lane == 1 ? row + ENGRAM_ROW_VALUES
                                     : slot;
  return {LoadWord64(row + lane * kValuesPerThread), lane < 3 ? LoadWord64(extra) : 0};
}

// Probe positions one lookup reads at once: 16 buckets, 64 bytes. A chain longer than that (rare
// at the index's load of at most one half) is a miss, which the daemon serves.
constexpr uint32_t kProbeLanes = 16;

// The slot a page guard makes a miss: it straddles a page boundary (engram_gpu_row_cache).
__device__ __forceinline__ bool Guarded(const DeviceRowCache& c, uint32_t slot) {
  if (c.guard_page_bytes == 0) return false;
  const uint64_t first = c.slots_offset + uint64_t(slot) * c.slot_bytes;
  return first / c.guard_page_bytes != (first + c.slot_bytes - 1) / c.guard_page_bytes;
}

// The warp looks a key up as RowCacheReader::Find does, lane i taking probe position i (one
// round trip for the chain), and reads the row of the first position whose slot holds the key.
// Round trips: the buckets; then every candidate's key together with the first candidate's row,
// check, scale bytes and use count; a third only when a later candidate holds the key. No fence:
// the row is accepted when the slot's check equals the check of the key looked up and the words
// read (RowCacheCheck), so a slot rewritten, moved or emptied while it was read is a miss but for
// a 64-bit collision. True (all lanes) for a row read whole; *ret_values and *ret_scale are the
// lane's part of it, *ret_slot and *ret_freq the slot and its use count.
__device__ __forceinline__ bool CacheFind(const DeviceRowCache& c, uint64_t key, uint32_t lane,
                                          uint64_t* ret_values, uint32_t* ret_scale,
                                          uint32_t* ret_slot, uint32_t* ret_freq) {
  const uint32_t home = static_cast<uint32_t>(RowCacheHash(key)) & c.bucket_mask;
  const bool window = lane < kProbeLanes && lane <= c.bucket_mask;
  const uint32_t b = window ? LoadWord32(c.buckets + 4 * ((home + lane) & c.bucket_mask)) : 1;
  const uint32_t empty = GroupBallot(window && b == 0);
  const uint32_t live = (empty == 0 ? (1u << kProbeLanes) : (empty & (0u - empty))) - 1u;
  const bool probe = ((live >> lane) & 1u) != 0 && b != 0 && b <= c.max_slots && !Guarded(c, b - 1);
  const uint32_t candidates = GroupBallot(probe);
  if (candidates == 0) return false;
  uint32_t at = __ffs(candidates) - 1;
  const uint8_t* mine = c.slots + uint64_t(probe ? b - 1 : 0) * c.slot_bytes;
  LaneSlot read = ReadSlot(
      c.slots + uint64_t(static_cast<uint32_t>(GroupShfl64(b, at)) - 1) * c.slot_bytes, lane);
  const uint32_t matches = GroupBallot(probe && LoadWord64(mine + kRowCacheSlotKeyOffset) == key);
  if (matches == 0) return false;
  if ((matches & (1u << at)) == 0) {  // a later candidate holds the key: read its slot instead
    at = __ffs(matches) - 1;
    read = ReadSlot(
        c.slots + uint64_t(static_cast<uint32_t>(GroupShfl64(b, at)) - 1) * c.slot_bytes, lane);
  }
  // The check of the key looked up and the 33 row words read: lane i mixes value word i, lane 0
  // the key too, lane 1 the scale word; the warp XORs the terms together.
  const uint64_t scales = GroupShfl64(read.extra, 1);
  uint64_t term = RowCacheCheckTerm(read.values, lane + 1);
  if (lane == 0) term ^= RowCacheCheckTerm(key, 0);
  if (lane == 1) term ^= RowCacheCheckTerm(scales, ENGRAM_ROW_VALUES / 8 + 1);
#pragma unroll
  for (uint32_t m = 16; m >= 1; m /= 2) term ^= GroupShfl64(term, lane ^ m);
  *ret_values = read.values;
  *ret_scale = static_cast<uint32_t>(scales >> (8 * (lane * kValuesPerThread / 32))) & 0xFFu;
  *ret_slot = static_cast<uint32_t>(GroupShfl64(b, at)) - 1;
  *ret_freq = static_cast<uint32_t>(GroupShfl64(read.extra, 2) >> 32) & 0xFFu;
  return term == GroupShfl64(read.extra, 0);
}

// One output slot of a cache gather, by one warp: the row of row_ids[s] from the cache into
// out, or the slot listed as a miss, or NaN for a bad id.
__device__ __forceinline__ void CacheGatherSlot(const DeviceRowCache& c, uint64_t id, uint32_t s,
                                                uint32_t lane, uint16_t* out_slot,
                                                const DeviceMisses& m, uint32_t* bad_index_count) {
  if (id < c.covered_begin || id >= c.covered_end || id >= (uint64_t{1} << kRowCacheRowBits)) {
    DequantSlot(nullptr, false, lane, out_slot, bad_index_count);
    return;
  }
  const uint64_t key = RowCacheKey(c.layer, id);
  uint64_t values = 0;
  uint32_t scale = 0, slot = 0, freq = 0;
  if (!CacheFind(c, key, lane, &values, &scale, &slot, &freq)) {
    if (lane == 0) {
      const uint32_t i = atomicAdd(m.count, 1u);
      m.rows[i] = id;
      m.slots[i] = s;
    }
    return;
  }
  DequantLane(values, scale, lane, out_slot);
  if (lane != 0) return;
  if (m.hit_total != nullptr) atomicAdd(reinterpret_cast<unsigned long long*>(m.hit_total), 1ull);
  if (m.hits != nullptr && freq < kRowCacheMaxFreq) {
    const uint32_t i = atomicAdd(m.hit_count, 1u);
    m.hits[i] = {key, slot, 0};
  }
}

}  // namespace engram::kernels

namespace engram::kernels {

// Host side (engram_cache.cu). The caller's engram_gpu_row_cache and engram_gpu_cache_misses,
// checked (for `slots` output slots) and turned into what the kernels take; 0 or -errno with
// the message recorded, naming the entry point `what`.
int ReadRowCache(const char* what, const engram_gpu_row_cache* theirs, DeviceRowCache* ret);
int ReadMisses(const char* what, const engram_gpu_cache_misses* theirs, DeviceMisses* ret);
// Loads the lookup kernel (outside any capture: gpu_compat.h, PreloadKernel).
int PreloadCacheLookup();
// Queues the counters' reset and the lookup kernel (one warp per slot) on `stream`.
int LaunchCacheLookup(const char* what, const DeviceRowCache& cache, const uint64_t* row_ids,
                      uint64_t slots, uint16_t* out, const DeviceMisses& misses,
                      uint32_t* bad_index_count, gpuStream_t stream);

}  // namespace engram::kernels
