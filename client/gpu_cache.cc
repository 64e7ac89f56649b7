// A cache-tier table's row cache described for a GPU (engram_table_map_gpu_cache) and the hits a
// kernel read there reported to the daemon (engram_table_map_report_hits): engram/gpu.h.
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "client/abi_struct.h"
#include "client/gpu_register.h"
#include "client/last_error.h"
#include "client/table_map.h"  // and protocol/row_cache_layout.h, through protocol/row_cache_reader.h
#include "engram/gpu.h"

using engram::client::SetError;

static_assert(sizeof(engram_gpu_cache_hit) == sizeof(engram_cache_touch_entry));
static_assert(offsetof(engram_gpu_cache_hit, slot) == offsetof(engram_cache_touch_entry, slot));

extern "C" {

ENGRAM_API int engram_table_map_gpu_cache(const engram_table_map* map,
                                          const engram_gpu_registration* reg,
                                          struct engram_gpu_row_cache* ret_cache) {
  if (map == nullptr || reg == nullptr || ret_cache == nullptr) {
    return SetError(-EINVAL,
                    "engram_table_map_gpu_cache needs a map, a registration and ret_cache");
  }
  if (int rc = engram::client::CheckOutput("engram_table_map_gpu_cache", ret_cache,
                                           sizeof(engram_gpu_row_cache));
      rc < 0) {
    return rc;
  }
  if (!map->row_cache) {
    return SetError(-EINVAL,
                    "layer %u's map is a resident table, not a row cache: engram_dequant_gather "
                    "reads it in place",
                    map->layer_id);
  }
  const void* device = engram_gpu_device_ptr(reg, map->base);
  if (device == nullptr || engram_gpu_device_ptr(reg, map->base + map->map_bytes - 1) == nullptr) {
    return SetError(-EINVAL,
                    "the registration does not cover layer %u's row cache mapping [%p, +%llu): "
                    "register info.base with info.map_bytes",
                    map->layer_id, static_cast<const void*>(map->base),
                    static_cast<unsigned long long>(map->map_bytes));
  }
  // Checked when the map was made (RowCacheReader::Attach); immutable for the region's life.
  const auto* header = reinterpret_cast<const engram::RowCacheHeader*>(map->base);
  if ((header->flags & engram::kRowCacheFlagRowCheck) == 0) {
    return SetError(-EOPNOTSUPP,
                    "layer %u's row cache carries no row checks (written by an engramd older than "
                    "this library): a GPU cannot read it in place; gather through the arena",
                    map->layer_id);
  }
  engram_gpu_row_cache out{};
  out.size = sizeof(out);
  out.cache = device;
  out.layer = map->layer_id;
  out.bucket_count = header->bucket_count;
  out.buckets_offset = header->buckets_offset;
  out.slots_offset = header->slots_offset;
  out.max_slots = header->max_slots;
  out.slot_bytes = header->slot_bytes;
  out.covered_begin = map->covered_begin;
  out.covered_end = map->covered_end;
  // A pinned registration keeps pages the cache gives back; a slot the GPU would read half from
  // such a page fails its row check, so no slot needs guarding.
  out.guard_page_bytes = 0;
  return engram::client::WriteStruct("engram_gpu_row_cache", out, ret_cache);
}

ENGRAM_API int engram_table_map_report_hits(const engram_table_map* map, uint64_t hit_rows,
                                            uint64_t all_hit_gathers,
                                            const struct engram_gpu_cache_hit* hits, size_t n) {
  if (map == nullptr || (n != 0 && hits == nullptr)) {
    return SetError(-EINVAL, "engram_table_map_report_hits needs a map, and hits for %zu hits", n);
  }
  if (!map->row_cache) {
    return SetError(-EINVAL,
                    "layer %u's map is a resident table: it has no row cache to report hits to",
                    map->layer_id);
  }
  engram::client::CachedCopy copy;
  copy.hits = hit_rows;
  copy.touches.resize(n);
  if (n != 0) std::memcpy(copy.touches.data(), hits, n * sizeof(engram_cache_touch_entry));
  engram::client::ReportHits(*map, copy, all_hit_gathers);
  return 0;
}

}  // extern "C"
