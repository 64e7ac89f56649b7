// engram_gather's in-place path: a resident table's rows copied from the library's own read-only
// mapping, a cache-tier table's hits from the daemon's row cache (the misses through the daemon).
#include <errno.h>
#include <string.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "client/last_error.h"
#include "client/session.h"
#include "client/table_map.h"
#include "engram/engram.h"
#include "engram/protocol.h"
#include "protocol/codec.h"

namespace {

namespace proto = engram::protocol;
using engram::client::ErrnoForCode;
using engram::client::FetchTables;
using engram::client::LostError;
using engram::client::OpenTableMap;
using engram::client::Push;
using engram::client::SetError;
using engram::client::SignedNowNs;

// How often a table that could not be mapped yet (still loading) is asked for again.
constexpr int64_t kInPlaceRetryNs = 100'000'000;

// The table engram_gather reads `layer` from in place, or null when the daemon is to gather it:
// the table is not resident, still loading, or its mapping failed (asked again later). The
// first call for a table maps it; the mutex is held meanwhile, so concurrent first calls map
// it once.
const engram::client::InPlaceTable* InPlaceFor(engram_session* s, uint32_t layer) {
  std::lock_guard<std::mutex> lock(s->in_place_mutex);
  engram::client::InPlaceTable& t = s->in_place[layer];
  // A withdrawn table is gathered by the daemon (which names the changed file); its mapping
  // stays until the session closes, as another thread may be reading it.
  if (t.map != nullptr) return &t;
  if (t.never || SignedNowNs() < t.retry_at_ns) return nullptr;
  // A daemon that cannot hand out mappings is not asked for every table.
  if (!(s->welcome.features & ENGRAM_FEATURE_TABLE_STATE)) {
    t.never = true;
    return nullptr;
  }
  // The asking is the library's own business: when it ends in the daemon gathering instead, the
  // thread's last error stays what it was, not the refusal of a mapping nobody asked for.
  const std::string last_error = engram::client::LastError();
  std::vector<engram_wire_table> tables;
  const engram_wire_table* wire = nullptr;
  if (FetchTables(s, &tables) == 0) {
    for (const engram_wire_table& w : tables) {
      if (w.layer_id == layer) wire = &w;
    }
  }
  engram_table_map* map = nullptr;
  const int rc = wire != nullptr ? OpenTableMap(s, layer, /*row_cache=*/true, &map) : -ENOENT;
  if (rc == 0) {
    t.map = map;
    t.bounds = {.layer_id = layer,
                .num_rows = wire->num_rows,
                .covered_begin = map->covered_begin,
                .covered_end = map->covered_end};
    return &t;
  }
  // Not resident, refused because its file changed (-EIO: DATA_LOSS), not mapped for this
  // client's uid (-EACCES: PERMISSION_DENIED), or no such table (the daemon's answer to the
  // request names it): for good.
  t.never =
      rc == -EOPNOTSUPP || rc == -EIO || rc == -EACCES || (wire == nullptr && tables.size() != 0);
  t.retry_at_ns = SignedNowNs() + kInPlaceRetryNs;
  engram::client::SetErrorMessage(0, last_error);
  return nullptr;
}

// Checks a request for a table read in place as the daemon checks requests (the same decoder,
// so the same errors), as slot 0 of a one-slot context: it never enters the ring.
int DecodeInPlace(engram_session* s, const engram::client::InPlaceTable& table, engram_sqe sqe,
                  proto::DecodedRequest* ret_request) {
  sqe.ticket = uint64_t{1} << 16;
  const proto::RequestContext context{.slots = 1,
                                      .max_rows = s->welcome.max_rows_per_request,
                                      .data = s->data,
                                      .data_bytes = s->data_bytes,
                                      .tables = {&table.bounds, 1}};
  bool slot_valid = false;
  proto::CodecError error;
  if (!proto::DecodeRequest(sqe, context, ret_request, &slot_valid, &error)) {
    return SetError(ErrnoForCode(error.code), "engramd (table %u read in place): %s: %s", sqe.table,
                    proto::StatusCodeName(error.code), error.message.c_str());
  }
  return 0;
}

// engram_gather of a request for a table read in place: checked as the daemon checks requests
// (the same decoder, so the same errors), then copied on this thread. -ESTALE when the table
// was withdrawn before or during the copy: the caller asks the daemon instead.
int GatherInPlace(engram_session* s, const engram::client::InPlaceTable& table, engram_sqe sqe) {
  proto::DecodedRequest request;
  if (int rc = DecodeInPlace(s, table, sqe, &request); rc < 0) return rc;
  if (int rc = engram::client::CopyInPlace(table, request, s->data); rc < 0) {
    // The daemon died (the kernel marked the table state page): the session is lost too.
    if (rc == -ENOTCONN) s->lost.store(true);
    return rc == -ENOTCONN ? LostError(s) : rc;
  }
  s->counters.rows_in_place.fetch_add(request.rows.size(), std::memory_order_relaxed);
  engram::client::ReportResident(*table.map, request.rows.size());
  return 0;
}

// GatherInPlace for a table of the cache tier: the hits are copied here, the misses go to the
// daemon as one request into the same destination slots (it reads them and admits them to the
// cache as it would have). -ESTALE as GatherInPlace's (nothing was sent).
int GatherCachedInPlace(engram_session* s, const engram::client::InPlaceTable& table,
                        engram_sqe sqe, int64_t timeout_ns) {
  proto::DecodedRequest request;
  if (int rc = DecodeInPlace(s, table, sqe, &request); rc < 0) return rc;
  thread_local engram::client::CachedCopy copy;
  if (int rc = engram::client::CopyCached(table, request, s->data, &copy); rc < 0) {
    if (rc == -ENOTCONN) s->lost.store(true);
    return rc == -ENOTCONN ? LostError(s) : rc;
  }
  const uint64_t misses = copy.miss_rows.size();
  // The misses' ids and offsets go into the data region, where the daemon reads requests.
  uint8_t* scratch = nullptr;
  if (misses != 0 && engram_alloc(s, misses * 16, reinterpret_cast<void**>(&scratch)) < 0) {
    // No room for them: the daemon gathers the whole request (the hits again too).
    uint64_t ticket;
    if (int rc = Push(s, sqe, &ticket); rc < 0) return rc;
    return engram_wait(s, ticket, timeout_ns);
  }
  {
    std::lock_guard<std::mutex> lock(s->touch_mutex);
    engram::client::ReportCached(*table.map, copy, /*all_hit=*/misses == 0);
  }
  s->counters.rows_in_place.fetch_add(copy.hits, std::memory_order_relaxed);
  if (misses == 0) return 0;
  memcpy(scratch, copy.miss_rows.data(), misses * 8);
  memcpy(scratch + misses * 8, copy.miss_offsets.data(), misses * 8);
  engram_sqe miss{};
  miss.opcode = ENGRAM_OP_GATHER;
  miss.table = sqe.table;
  miss.num_rows = misses;
  miss.flags = ENGRAM_SQE_DEST_OFFSETS;
  miss.rows_offset = static_cast<uint64_t>(scratch - s->data);
  miss.dest_offset = request.dest_offset;
  miss.dest_offsets_offset = miss.rows_offset + misses * 8;
  uint64_t ticket;
  int rc = Push(s, miss, &ticket);
  if (rc == 0) rc = engram_wait(s, ticket, timeout_ns);
  // A request still in flight (timed out, or the session lost) keeps its ids until the end.
  if (rc != -ETIMEDOUT && rc != -ENOTCONN) engram_free(s, scratch);
  return rc;
}

}  // namespace

namespace engram::client {

// engram_gather of a checked submission entry: in place where `in_place` and the table can be
// read here, else (or when the table was withdrawn meanwhile) through the daemon.
int GatherNow(engram_session* s, const engram_sqe& sqe, bool in_place, int64_t timeout_ns) {
  if (in_place) {
    if (CheckLostCheap(s)) return LostError(s);
    if (const engram::client::InPlaceTable* t = InPlaceFor(s, sqe.table); t != nullptr) {
      const int rc = t->map->row_cache ? GatherCachedInPlace(s, *t, sqe, timeout_ns)
                                       : GatherInPlace(s, *t, sqe);
      if (rc != -ESTALE) return rc;
    }
  }
  uint64_t ticket;
  if (int rc = Push(s, sqe, &ticket); rc < 0) return rc;
  return engram_wait(s, ticket, timeout_ns);
}

}  // namespace engram::client
