// The device half of reading the daemon's row cache in place (protocol/row_cache_layout.h): the
// lookup of one row by one warp, with the slot's seqlock read at system scope, shared by
// engram_dequant_cache_gather (engram_cache.cu) and the queue's cache step (engram_queue.cu).
// Included only by .cu sources. The ordering argument is docs/gpu.md's "Row cache hits on the
// GPU".
#pragma once

#include <cstdint>

#include "engram/gpu.h"
#include "kernels/dequant_device.h"
#include "kernels/gpu_compat.h"

namespace engram::kernels {

// The layout's numbers (protocol/row_cache_layout.h, whose C++20 headers nvcc's C++17 does not
// take: client/gpu_cache.cc checks these against it).
constexpr uint32_t kCacheRowBits = 40;
constexpr uint32_t kCacheSlotBytes = 288;
constexpr uint32_t kCacheSlotRowOffset = 16;  // RowCacheSlot::row
constexpr uint32_t kCacheSlotKeyOffset = 8;   // RowCacheSlot::key
constexpr uint32_t kCacheMaxFreq = 3;

__device__ __forceinline__ uint64_t CacheHash(uint64_t key) {  // RowCacheHash
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdull;
  key ^= key >> 33;
  key *= 0xc4ceb9fe1a85ec53ull;
  key ^= key >> 33;
  return key;
}

// System-scope loads of host memory a CPU thread writes concurrently: acquire (no later load of
// this thread is performed before it) and relaxed (coherent at system scope, never a stale
// cached copy, no ordering of its own), and the fence that orders the loads before it ahead of
// the loads after it.
#if defined(ENGRAM_HIP)
__device__ __forceinline__ uint64_t LoadAcquireSys64(const void* p) {
  return __hip_atomic_load(static_cast<const uint64_t*>(p), __ATOMIC_ACQUIRE,
                           __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ uint32_t LoadRelaxedSys32(const void* p) {
  return __hip_atomic_load(static_cast<const uint32_t*>(p), __ATOMIC_RELAXED,
                           __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ uint64_t LoadRelaxedSys64(const void* p) {
  return __hip_atomic_load(static_cast<const uint64_t*>(p), __ATOMIC_RELAXED,
                           __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ uint32_t LoadRelaxedSys8(const void* p) {
  return __hip_atomic_load(static_cast<const uint8_t*>(p), __ATOMIC_RELAXED,
                           __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ void FenceAcquireSys() { __threadfence_system(); }
#else
__device__ __forceinline__ uint64_t LoadAcquireSys64(const void* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t LoadRelaxedSys32(const void* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t LoadRelaxedSys64(const void* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t LoadRelaxedSys8(const void* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u8 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void FenceAcquireSys() {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}
#endif

// The 32-thread group's vote, shuffle and barrier (a warp on CUDA; half a 64-lane wavefront on
// AMD, whose lanes run in lockstep).
#if defined(ENGRAM_HIP)
__device__ __forceinline__ uint32_t GroupBallot(bool p) {
  return static_cast<uint32_t>(static_cast<uint64_t>(__ballot(p)) >> (threadIdx.x & 32u));
}
__device__ __forceinline__ uint64_t GroupShfl64(uint64_t v, uint32_t src) {
  return __shfl(static_cast<unsigned long long>(v), static_cast<int>(src), 32);
}
__device__ __forceinline__ void GroupSync() { __builtin_amdgcn_wave_barrier(); }
#else
__device__ __forceinline__ uint32_t GroupBallot(bool p) { return __ballot_sync(0xffffffffu, p); }
__device__ __forceinline__ uint64_t GroupShfl64(uint64_t v, uint32_t src) {
  return __shfl_sync(0xffffffffu, v, src);
}
__device__ __forceinline__ void GroupSync() { __syncwarp(); }
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

// The values and scale of one lane (8 values) of a row read under the seqlock.
struct LaneRow {
  uint64_t values;
  uint32_t scale;
};

// Lane `lane` of a warp reads its part of the row at `row` (relaxed, system scope).
__device__ __forceinline__ LaneRow ReadLane(const uint8_t* row, uint32_t lane) {
  return {LoadRelaxedSys64(row + lane * kValuesPerThread),
          LoadRelaxedSys8(row + ENGRAM_ROW_VALUES + lane * kValuesPerThread / 32)};
}

// Probe positions one lookup reads at once: 16 buckets, 64 bytes. A chain longer than that (rare
// at the index's load of at most one half) is a miss, which the daemon serves.
constexpr uint32_t kProbeLanes = 16;

__device__ __forceinline__ uint32_t LoadAcquireSys32(const void* p) {
#if defined(ENGRAM_HIP)
  return __hip_atomic_load(static_cast<const uint32_t*>(p), __ATOMIC_ACQUIRE,
                           __HIP_MEMORY_SCOPE_SYSTEM);
#else
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#endif
}

// The slot a page guard makes a miss: it straddles a page boundary (engram_gpu_row_cache).
__device__ __forceinline__ bool Guarded(const DeviceRowCache& c, uint32_t slot) {
  if (c.guard_page_bytes == 0) return false;
  const uint64_t first = c.slots_offset + uint64_t(slot) * c.slot_bytes;
  return first / c.guard_page_bytes != (first + c.slot_bytes - 1) / c.guard_page_bytes;
}

// The warp looks a key up as RowCacheReader::Find does, lane i taking probe position i (one
// round trip for the chain), and reads the row of the first position whose slot holds the key
// with an even sequence. Round trips: the buckets (acquire); the candidates' seq (acquire); their
// keys together with the first candidate's row; a system-scope acquire fence; seq again. True
// (all lanes) when the row was read whole: the slot's seq was the same even value before and
// after, with the key read in between. *ret_slot and *ret_freq name the slot and its use count.
__device__ __forceinline__ bool CacheFind(const DeviceRowCache& c, uint64_t key, uint32_t lane,
                                          LaneRow* ret_row, uint32_t* ret_slot,
                                          uint32_t* ret_freq) {
  const uint32_t home = static_cast<uint32_t>(CacheHash(key)) & c.bucket_mask;
  const bool window = lane < kProbeLanes && lane <= c.bucket_mask;
  // Acquire, as the CPU's load of a bucket: a bucket the writer published with release names a
  // slot whose seq and key are visible to this lane's loads after it.
  const uint32_t b = window ? LoadAcquireSys32(c.buckets + 4 * ((home + lane) & c.bucket_mask)) : 1;
  const uint32_t empty = GroupBallot(window && b == 0);
  const uint32_t live = (empty == 0 ? (1u << kProbeLanes) : (empty & (0u - empty))) - 1u;
  const bool probe = ((live >> lane) & 1u) != 0 && b != 0 && b <= c.max_slots &&
                     !Guarded(c, b - 1);
  const uint8_t* slot = c.slots + uint64_t(probe ? b - 1 : 0) * c.slot_bytes;
  const uint64_t head = probe ? LoadAcquireSys64(slot) : 1;  // seq (low word), freq (byte 4)
  const uint32_t candidates = GroupBallot(probe && (head & 1u) == 0);
  if (candidates == 0) return false;
  // Lane `first` acquired the first candidate's seq; the warp barrier orders that load before
  // every lane's loads of its row (causality through the barrier), as if each lane had.
  GroupSync();
  uint32_t at = __ffs(candidates) - 1;
  const uint8_t* row =
      c.slots + uint64_t(static_cast<uint32_t>(GroupShfl64(b, at)) - 1) * c.slot_bytes;
  LaneRow r = ReadLane(row + kCacheSlotRowOffset, lane);
  const bool match = ((candidates >> lane) & 1u) != 0 &&
                     LoadRelaxedSys64(slot + kCacheSlotKeyOffset) == key;
  const uint32_t matches = GroupBallot(match);
  if (matches == 0) return false;
  if ((matches & (1u << at)) == 0) {  // a later candidate holds the key: read its row instead
    at = __ffs(matches) - 1;
    row = c.slots + uint64_t(static_cast<uint32_t>(GroupShfl64(b, at)) - 1) * c.slot_bytes;
    r = ReadLane(row + kCacheSlotRowOffset, lane);
  }
  const uint64_t chosen = GroupShfl64(head, at);
  // Each lane's row loads are done before it reads seq again (the seqlock's read side); the 32
  // loads of one word are one transaction. A load that saw a byte the writer stored after its
  // odd seq (and release fence) makes this acquire fence see that odd seq, or a later one.
  FenceAcquireSys();
  const bool same = LoadRelaxedSys32(row) == static_cast<uint32_t>(chosen);
  *ret_row = r;
  *ret_slot = static_cast<uint32_t>(GroupShfl64(b, at)) - 1;
  *ret_freq = static_cast<uint32_t>(chosen >> 32) & 0xFFu;
  return GroupBallot(same) == 0xffffffffu;
}

// One output slot of a cache gather, by one warp: the row of row_ids[s] from the cache into
// out, or the slot listed as a miss, or NaN for a bad id.
__device__ __forceinline__ void CacheGatherSlot(const DeviceRowCache& c, uint64_t id, uint32_t s,
                                                uint32_t lane, uint16_t* out_slot,
                                                const DeviceMisses& m,
                                                uint32_t* bad_index_count) {
  if (id < c.covered_begin || id >= c.covered_end || id >= (uint64_t{1} << kCacheRowBits)) {
    DequantSlot(nullptr, false, lane, out_slot, bad_index_count);
    return;
  }
  const uint64_t key = (uint64_t{c.layer} + 1) << kCacheRowBits | id;
  LaneRow r;
  uint32_t slot = 0, freq = 0;
  if (!CacheFind(c, key, lane, &r, &slot, &freq)) {
    if (lane == 0) {
      const uint32_t i = atomicAdd(m.count, 1u);
      m.rows[i] = id;
      m.slots[i] = s;
    }
    return;
  }
  DequantLane(r.values, r.scale, lane, out_slot);
  if (lane != 0) return;
  if (m.hit_total != nullptr) atomicAdd(reinterpret_cast<unsigned long long*>(m.hit_total), 1ull);
  if (m.hits != nullptr && freq < kCacheMaxFreq) {
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
