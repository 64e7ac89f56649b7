// The client's read-only mapping of a resident table (engram_table_map_open in engram.h): the
// mapping and what the daemon said about it. Internal to libengram_client.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "engram/engram.h"
#include "engram/protocol.h"
#include "protocol/codec.h"
#include "protocol/row_cache_reader.h"

struct engram_table_map {
  const uint8_t* base = nullptr;  // PROT_READ, MAP_SHARED of the sealed memfd
  uint64_t map_bytes = 0;
  uint32_t layer_id = 0;
  uint32_t row_bytes = 0;
  uint64_t covered_begin = 0;
  uint64_t covered_end = 0;
  // The daemon's table state page (PROT_READ) and, inside it, the two words every read checks.
  const engram_table_state_page* state_page = nullptr;
  uint64_t state_bytes = 0;
  const uint32_t* table_state = nullptr;  // this table's entry's `state`
  // A table of the cache tier: base/map_bytes are the daemon's row cache (PROT_READ of a
  // read-only descriptor), looked up with `cache`. `touch` is the session's touch page
  // (read-write), where its entry `state_index` counts the rows read in place: always for the
  // cache tier, for a resident table where the daemon sent it (protocol 1.5), else null.
  bool row_cache = false;
  engram::RowCacheReader cache;
  engram_cache_touch_page* touch = nullptr;
  uint64_t touch_bytes = 0;
  engram_cache_touch_counters* touch_counters = nullptr;  // this table's
  engram_cache_touch_entry* touch_ring = nullptr;
};

namespace engram::client {

// What a map's TABLE_MAPPED said.
struct MappedTable {
  uint32_t layer = 0;
  uint32_t row_bytes = 0;
  uint64_t covered_begin = 0;
  uint64_t covered_end = 0;
  uint64_t map_bytes = 0;
  uint32_t state_index = 0;
};

// Checks the memfd's seals and size against what the daemon said, and the table state page
// (seals, magic, the table's entry), maps both read-only and returns the map (or -errno with
// engram_last_error() set). `touch_fd`, -1 for none (a daemon before protocol 1.5): the
// session's touch page, mapped read-write after its layout is checked, where ReportResident
// counts the rows read in place. Takes ownership of the fds.
int MapSealedTable(int fd, int state_fd, int touch_fd, const MappedTable& table,
                   engram_table_map** ret_map);
// The same for TABLE_MAPPED of kind ENGRAM_TABLE_MAPPED_ROW_CACHE: maps the row cache read-only
// (its header checked by RowCacheReader::Attach), the table state page and the touch page
// (checked against the protocol's layout). Takes ownership of the three fds.
int MapRowCache(int cache_fd, int state_fd, int touch_fd, const MappedTable& table,
                engram_table_map** ret_map);

// Whether the map may be read now: the daemon lives (the kernel has not marked its liveness
// word) and the table is SERVING. Two acquire loads, no syscall; the loads of the rows a caller
// then reads cannot move before them. Call it before and after reading rows
// (MapUsableAfterRead for the second: it orders the rows' loads before its own).
inline bool MapUsable(const engram_table_map& map) {
  const uint32_t alive =
      std::atomic_ref<uint32_t>(const_cast<uint32_t&>(map.state_page->daemon_alive))
          .load(std::memory_order_acquire);
  const uint32_t state = std::atomic_ref<uint32_t>(const_cast<uint32_t&>(*map.table_state))
                             .load(std::memory_order_acquire);
  return (alive & ENGRAM_DAEMON_TID_MASK) != 0 && (alive & ENGRAM_DAEMON_OWNER_DIED) == 0 &&
         state == ENGRAM_TABLE_SERVING;
}
inline bool MapUsableAfterRead(const engram_table_map& map) {
  // The rows' loads complete before the words are read again (a LoadLoad barrier on Arm).
  std::atomic_thread_fence(std::memory_order_acquire);
  return MapUsable(map);
}
// 0 when MapUsable(map); otherwise -ENOTCONN (the daemon is gone) or -ESTALE (the table was
// withdrawn), with engram_last_error() naming the table.
int MapError(const engram_table_map& map);

// A table as engram_gather reads it in place (ENGRAM_GATHER_IN_PLACE): its mapping and bounds,
// or why there is none. Owns the mapping.
struct InPlaceTable {
  engram_table_map* map = nullptr;
  protocol::TableBounds bounds;  // what requests are checked against, as the daemon checks them
  bool never = false;            // not resident: a table changes tier only with a restart
  int64_t retry_at_ns = 0;       // loading, or refused for another reason: ask again from then

  InPlaceTable() = default;
  InPlaceTable(const InPlaceTable&) = delete;
  InPlaceTable& operator=(const InPlaceTable&) = delete;
  ~InPlaceTable() { engram_table_map_close(map); }
};

// Copies the rows of `request` (decoded and checked against `table.bounds`) from the mapping into
// the data region at `data`, as the daemon would. 0, or MapError's when the map could not be
// read before the copy or stopped being readable while it ran (the rows are then not to be used).
int CopyInPlace(const InPlaceTable& table, const protocol::DecodedRequest& request, uint8_t* data);

// A cache-tier table's rows read in place: what CopyCached found.
struct CachedCopy {
  std::vector<uint64_t> miss_rows;     // the rows not in the cache (or moved during the copy)
  std::vector<uint64_t> miss_offsets;  // where each goes, from the request's destination
  std::vector<engram_cache_touch_entry> touches;  // hits whose use count had not saturated
  uint64_t hits = 0;
};
// Copies the rows of `request` that the row cache holds into the data region at `data`, each
// validated by its slot's sequence (a row evicted, moved or rewritten during its copy is a
// miss), and lists the others. 0, or MapError's as CopyInPlace (then nothing is to be used).
int CopyCached(const InPlaceTable& table, const protocol::DecodedRequest& request, uint8_t* data,
               CachedCopy* ret_copy);
// Adds a gather's hits to the touch page: the table's counters (`all_hit`: no request went to
// the daemon) and as many touches as the ring has room for (the rest counted as dropped). The
// caller serialises calls per session (the ring has one producer).
void ReportCached(const engram_table_map& map, const CachedCopy& copy, bool all_hit);
// The same with a number of gathers answered wholly in place (engram_table_map_report_hits).
void ReportHits(const engram_table_map& map, const CachedCopy& copy, uint64_t all_hit_requests);
// Counts one gather of `rows` rows read in place from a resident table in the touch page's
// counters, where the map has a touch page (two relaxed adds; any thread).
void ReportResident(const engram_table_map& map, uint64_t rows);

}  // namespace engram::client
