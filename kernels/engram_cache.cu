// engram_dequant_cache_gather (include/engram/gpu.h): rows looked up in the daemon's row cache
// and read in place by the GPU, hits dequantised, misses listed. The device half is
// kernels/cache_device.h; one source for nvcc and hipcc (see gpu_compat.h).
#include <cerrno>
#include <cstdint>
#include <mutex>

#include "engram/engram.h"
#include "engram/gpu.h"
#include "kernels/cache_device.h"
#include "kernels/gpu_compat.h"
#include "kernels/kernel_errors.h"

namespace engram::kernels {

namespace {

constexpr uint32_t kBlockThreads = 256;
constexpr uint32_t kSlotsPerBlock = kBlockThreads / kThreadsPerSlot;
constexpr uint32_t kMaxBlocks = 1u << 20;

__global__ void __launch_bounds__(kBlockThreads)
    CacheLookupKernel(DeviceRowCache cache, const uint64_t* row_ids, uint64_t slots,
                      uint16_t* __restrict__ out, DeviceMisses misses, uint32_t* bad_index_count) {
  const uint32_t lane = threadIdx.x % kThreadsPerSlot;
  const uint64_t first = uint64_t{blockIdx.x} * kSlotsPerBlock + threadIdx.x / kThreadsPerSlot;
  const uint64_t stride = uint64_t{gridDim.x} * kSlotsPerBlock;
  for (uint64_t slot = first; slot < slots; slot += stride) {
    CacheGatherSlot(cache, row_ids[slot], static_cast<uint32_t>(slot), lane,
                    out + slot * ENGRAM_ROW_VALUES, misses, bad_index_count);
  }
}

}  // namespace

int ReadRowCache(const char* what, const engram_gpu_row_cache* theirs, DeviceRowCache* ret) {
  if (theirs == nullptr) return Fail(EINVAL, "%s: NULL row cache", what);
  engram_gpu_row_cache c{};
  if (int rc = ReadStruct(what, "engram_gpu_row_cache", theirs, &c); rc < 0) return rc;
  const bool power_of_two = c.bucket_count != 0 && (c.bucket_count & (c.bucket_count - 1)) == 0;
  if (c.cache == nullptr || !power_of_two || c.slot_bytes != kRowCacheSlotBytes ||
      c.buckets_offset % 4 != 0 || c.slots_offset % 32 != 0 || c.max_slots == 0 ||
      c.covered_end < c.covered_begin ||
      (c.guard_page_bytes != 0 && c.guard_page_bytes < c.slot_bytes)) {
    return Fail(EINVAL,
                "%s: the row cache (cache %p, %u buckets at +%llu, %u slots of %u bytes at +%llu) "
                "is not one engram_gpu_row_cache described",
                what, c.cache, c.bucket_count, static_cast<unsigned long long>(c.buckets_offset),
                c.max_slots, c.slot_bytes, static_cast<unsigned long long>(c.slots_offset));
  }
  const auto* base = static_cast<const uint8_t*>(c.cache);
  *ret = {base + c.buckets_offset, base + c.slots_offset, c.covered_begin, c.covered_end,
          c.bucket_count - 1,      c.max_slots,           c.slot_bytes,    c.layer,
          c.slots_offset,          c.guard_page_bytes};
  return 0;
}

int ReadMisses(const char* what, const engram_gpu_cache_misses* theirs, DeviceMisses* ret) {
  if (theirs == nullptr) return Fail(EINVAL, "%s: NULL misses", what);
  engram_gpu_cache_misses m{};
  if (int rc = ReadStruct(what, "engram_gpu_cache_misses", theirs, &m); rc < 0) return rc;
  if (m.rows == nullptr || m.slots == nullptr || m.count == nullptr ||
      (m.hits == nullptr) != (m.hit_count == nullptr)) {
    return Fail(EINVAL,
                "%s: misses.rows (%p), .slots (%p) and .count (%p) must be set, and .hits (%p) "
                "and .hit_count (%p) both or neither",
                what, static_cast<void*>(m.rows), static_cast<void*>(m.slots),
                static_cast<void*>(m.count), static_cast<void*>(m.hits),
                static_cast<void*>(m.hit_count));
  }
  *ret = {m.rows, m.slots, m.count, m.hits, m.hit_count, m.hit_total};
  return 0;
}

int PreloadCacheLookup() {
  static std::once_flag once;
  static gpuError_t loaded = gpuSuccess;
  std::call_once(once, [] { loaded = PreloadKernel(CacheLookupKernel); });
  return loaded == gpuSuccess ? 0 : FailRuntime("loading the engram row cache kernel", loaded);
}

int LaunchCacheLookup(const char* what, const DeviceRowCache& cache, const uint64_t* row_ids,
                      uint64_t slots, uint16_t* out, const DeviceMisses& misses,
                      uint32_t* bad_index_count, gpuStream_t stream) {
  if (int rc = PreloadCacheLookup(); rc < 0) return rc;
  gpuError_t st = gpuMemsetAsync(misses.count, 0, sizeof(uint32_t), stream);
  if (st == gpuSuccess && misses.hit_count != nullptr) {
    st = gpuMemsetAsync(misses.hit_count, 0, sizeof(uint32_t), stream);
  }
  if (st != gpuSuccess) return FailRuntime(what, st);
  if (slots == 0) return 0;
  uint64_t blocks = (slots + kSlotsPerBlock - 1) / kSlotsPerBlock;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  st = LaunchAfterPrior(false, CacheLookupKernel, static_cast<unsigned>(blocks), kBlockThreads, 0,
                        stream, cache, row_ids, slots, out, misses, bad_index_count);
  return st == gpuSuccess ? 0 : FailRuntime(what, st);
}

}  // namespace engram::kernels

extern "C" {

int engram_dequant_cache_gather(const struct engram_gpu_row_cache* cache, const uint64_t* row_ids,
                                uint32_t tokens, uint32_t heads, void* out,
                                const struct engram_gpu_cache_misses* misses,
                                uint32_t* bad_index_count, uintptr_t stream) {
  constexpr const char* kWhat = "engram_dequant_cache_gather";
  using namespace engram::kernels;
  DeviceRowCache c;
  DeviceMisses m;
  if (int rc = ReadRowCache(kWhat, cache, &c); rc < 0) return rc;
  if (int rc = ReadMisses(kWhat, misses, &m); rc < 0) return rc;
  const uint64_t slots = uint64_t{tokens} * heads;
  if (slots > 0 && (row_ids == nullptr || out == nullptr)) {
    return Fail(EINVAL, "%s: row_ids (%p) and out (%p) must be set for %u tokens x %u heads", kWhat,
                static_cast<const void*>(row_ids), out, tokens, heads);
  }
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0 || slots > uint64_t{UINT32_MAX}) {
    return Fail(EINVAL, "%s: out %p must be 16-byte aligned and %u x %u slots at most 2^32 - 1",
                kWhat, out, tokens, heads);
  }
  return LaunchCacheLookup(kWhat, c, row_ids, slots, static_cast<uint16_t*>(out), m,
                           bad_index_count, reinterpret_cast<gpuStream_t>(stream));
}

}  // extern "C"
