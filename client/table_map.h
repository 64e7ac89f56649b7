// The client's read-only mapping of a resident table (engram_map_table in engram.h): the
// mapping and what the daemon said about it. Internal to libengram_client.
#pragma once

#include <cstdint>

#include "engram/engram.h"
#include "protocol/codec.h"

struct engram_table_map {
  const uint8_t* base = nullptr;  // PROT_READ, MAP_SHARED of the sealed memfd
  uint64_t map_bytes = 0;
  uint32_t layer_id = 0;
  uint32_t row_bytes = 0;
  uint64_t covered_begin = 0;
  uint64_t covered_end = 0;
};

namespace engram::client {

// Checks the memfd's seals and size against what the daemon said, maps it read-only and
// returns the map (or -errno with engram_last_error() set). Takes ownership of `fd`.
int MapSealedTable(int fd, uint32_t layer, uint32_t row_bytes, uint64_t covered_begin,
                   uint64_t covered_end, uint64_t map_bytes, engram_table_map** ret_map);

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
  ~InPlaceTable() { engram_unmap_table(map); }
};

// Copies the rows of `request` (decoded and checked against `table.bounds`) from the mapping into
// the data region at `data`, as the daemon would.
void CopyInPlace(const InPlaceTable& table, const protocol::DecodedRequest& request, uint8_t* data);

}  // namespace engram::client
