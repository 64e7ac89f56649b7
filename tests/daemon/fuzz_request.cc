// libFuzzer target: the decoder of submission entries, fed an arbitrary entry and data region.
// Whatever it accepts must name a valid slot and table, rows the table serves, and destinations
// that lie inside the data region.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "protocol/codec.h"

using namespace engram::protocol;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < sizeof(engram_sqe)) return 0;
  engram_sqe sqe;
  memcpy(&sqe, data, sizeof(sqe));
  // The rest is the data region; make its size vary but keep it small and 8-aligned in memory.
  std::vector<uint64_t> region((size - sizeof(sqe) + 7) / 8 + 1);
  memcpy(region.data(), data + sizeof(sqe), size - sizeof(sqe));
  const uint64_t data_bytes = size - sizeof(sqe);
  const TableBounds tables[] = {
      {.layer_id = 1, .num_rows = 1000, .covered_begin = 0, .covered_end = 1000},
      {.layer_id = 14, .num_rows = 5000, .covered_begin = 1000, .covered_end = 2000}};
  RequestContext context{.slots = 8,
                         .max_rows = 64,
                         .data = reinterpret_cast<const uint8_t*>(region.data()),
                         .data_bytes = data_bytes,
                         .tables = tables};
  DecodedRequest request;
  bool slot_valid = false;
  CodecError error;
  if (!DecodeRequest(sqe, context, &request, &slot_valid, &error)) {
    if (error.code == 0 || error.message.empty()) abort();
    if (slot_valid && request.slot >= context.slots) abort();
    return 0;
  }
  if (request.slot >= context.slots) abort();
  if (request.opcode == ENGRAM_OP_NOP) return 0;
  const TableBounds& t = tables[request.table_index];
  if (t.layer_id != sqe.table || request.rows.size() > context.max_rows) abort();
  for (size_t i = 0; i < request.rows.size(); ++i) {
    if (request.rows[i] < t.covered_begin || request.rows[i] >= t.covered_end) abort();
    if (request.opcode == ENGRAM_OP_PREFETCH) continue;  // a prefetch has no destination
    const uint64_t off =
        request.dest_offsets.empty() ? i * ENGRAM_ROW_BYTES : request.dest_offsets[i];
    if (request.dest_offset + off + ENGRAM_ROW_BYTES > data_bytes) abort();
    if (request.dest_offset + off < request.dest_offset) abort();  // wrapped
  }
  return 0;
}
