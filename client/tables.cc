// The daemon's tables as a session sees them: their list (engram_list_tables) and the mapping of
// one for reading in place (engram_table_map_open and _open_any; the map itself: table_map.cc).
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "client/abi_struct.h"
#include "client/last_error.h"
#include "client/session.h"
#include "client/table_map.h"
#include "engram/engram.h"
#include "engram/protocol.h"
#include "protocol/codec.h"

namespace {

namespace proto = engram::protocol;
using engram::client::FetchTables;
using engram::client::OpenTableMap;
using engram::client::SetError;
using engram::client::WriteStruct;

}  // namespace

namespace engram::client {

// The daemon's table list, as the wire gives it.
int FetchTables(engram_session* s, std::vector<engram_wire_table>* ret_tables) {
  std::vector<uint8_t> reply;
  if (int rc = ControlExchange(s, ENGRAM_MSG_LIST_TABLES, ENGRAM_MSG_TABLES, &reply); rc < 0) {
    return rc;
  }
  engram_msg_tables head;
  if (reply.size() < sizeof(head)) return SetError(-EPROTO, "short TABLES reply");
  memcpy(&head, reply.data(), sizeof(head));
  if (head.entry_bytes < sizeof(engram_wire_table) ||
      (reply.size() - sizeof(head)) / head.entry_bytes < head.count) {
    return SetError(-EPROTO, "TABLES reply with %u entries of %u bytes in %zu bytes", head.count,
                    head.entry_bytes, reply.size());
  }
  ret_tables->resize(head.count);
  for (uint32_t i = 0; i < head.count; ++i) {
    memcpy(&(*ret_tables)[i], reply.data() + sizeof(head) + size_t{i} * head.entry_bytes,
           sizeof(engram_wire_table));
  }
  return 0;
}

// engram_table_map_open; `row_cache`: a cache-tier table's row cache mapping is wanted too
// (engram_gather's in-place path), else such a table is refused as not resident.
int OpenTableMap(engram_session* s, uint32_t layer, bool row_cache, engram_table_map** ret_map) {
  if (s->lost.load()) return LostError(s);
  if (!(s->welcome.features & ENGRAM_FEATURE_TABLE_STATE)) {
    return SetError(-EOPNOTSUPP,
                    "engramd at %s (protocol %u.%u) cannot tell a client when a mapped table is "
                    "withdrawn (protocol 1.3 can), so its tables are not read in place; upgrade it",
                    s->socket_path.c_str(), s->welcome.version_major, s->welcome.version_minor);
  }
  std::lock_guard<std::mutex> lock(s->control_mutex);
  engram_msg_map_table request{};
  const uint32_t id = s->next_request_id++;
  proto::FillHeader(&request.header, ENGRAM_MSG_MAP_TABLE, sizeof(request), id);
  request.layer_id = layer;
  if (SendAll(s->socket.get(), &request, sizeof(request)) < 0) {
    s->lost.store(true);
    return LostError(s);
  }
  std::vector<uint8_t> reply(ENGRAM_MSG_MAX_BYTES);
  int fds[3] = {-1, -1, -1};
  int nfds = 0;
  const ssize_t n =
      proto::ReceiveMessage(s->socket.get(), reply.data(), reply.size(), fds, 3, &nfds);
  const auto close_fds = [&] {
    for (int i = 0; i < nfds; ++i) close(fds[i]);
  };
  if (n == 0 || n == -ECONNRESET || n == -EPIPE) {
    s->lost.store(true);
    return LostError(s);
  }
  if (n < 0) return SetError(static_cast<int>(n), "no reply from engramd: %s", strerror(-n));
  engram_msg_header header;
  proto::CodecError error;
  if (!proto::DecodeHeader(reply.data(), static_cast<size_t>(n), &header, &error) ||
      header.request_id != id ||
      (header.type != ENGRAM_MSG_ERROR && header.type != ENGRAM_MSG_TABLE_MAPPED)) {
    close_fds();
    return SetError(-EPROTO, "bad reply from engramd to MAP_TABLE for layer %u", layer);
  }
  if (header.type == ENGRAM_MSG_ERROR) {
    close_fds();
    proto::DecodeError(reply.data(), static_cast<size_t>(n), &error);
    // Not -ENOTCONN for "still loading": that means "reconnect" everywhere else.
    const int rc = error.code == ENGRAM_STATUS_FAILED_PRECONDITION ? -EOPNOTSUPP
                   : error.code == ENGRAM_STATUS_UNAVAILABLE       ? -EAGAIN
                                                                   : ErrnoForCode(error.code);
    return SetError(rc, "engramd: %s", error.message.c_str());
  }
  engram_msg_table_mapped m;
  if (static_cast<size_t>(n) != sizeof(m)) {
    close_fds();
    return SetError(-EPROTO, "TABLE_MAPPED reply of %zd bytes with %d descriptors", n, nfds);
  }
  memcpy(&m, reply.data(), sizeof(m));
  const engram::client::MappedTable table{.layer = m.layer_id,
                                          .row_bytes = m.row_bytes,
                                          .covered_begin = m.covered_begin,
                                          .covered_end = m.covered_end,
                                          .map_bytes = m.map_bytes,
                                          .state_index = m.state_index};
  if (m.kind == ENGRAM_TABLE_MAPPED_ROW_CACHE && nfds == 3) {
    if (!row_cache) {
      close_fds();
      return SetError(-EOPNOTSUPP,
                      "layer %u is served from engramd's row cache (the cache tier), not "
                      "resident: only engram_gather reads its rows in place (the hits; the misses "
                      "through engramd)",
                      layer);
    }
    return engram::client::MapRowCache(fds[0], fds[1], fds[2], table, ret_map);
  }
  // With ENGRAM_FEATURE_RESIDENT_TOUCH a resident table comes with the session's touch page.
  const int resident_fds = (s->welcome.features & ENGRAM_FEATURE_RESIDENT_TOUCH) ? 3 : 2;
  if (m.kind != ENGRAM_TABLE_MAPPED_RESIDENT || nfds != resident_fds) {
    close_fds();
    return SetError(-EPROTO, "TABLE_MAPPED reply of kind %u with %d descriptors", m.kind, nfds);
  }
  return engram::client::MapSealedTable(fds[0], fds[1], resident_fds == 3 ? fds[2] : -1, table,
                                        ret_map);
}

}  // namespace engram::client

namespace {

engram_table_info TableInfo(const engram_wire_table& w) {
  engram_table_info t{};
  t.size = sizeof(t);
  t.layer = w.layer_id;
  t.row_bytes = w.row_bytes;
  t.num_rows = w.num_rows;
  t.covered_begin = w.covered_begin;
  t.covered_end = w.covered_end;
  t.layout = w.layout;
  t.files = w.files;
  t.data_bytes = w.data_bytes;
  t.tier = w.tier;
  return t;
}

}  // namespace

extern "C" {

int engram_list_tables(engram_session* s, struct engram_table_info* ret_tables, size_t capacity,
                       size_t* ret_count) {
  if (s == nullptr || ret_count == nullptr || (capacity != 0 && ret_tables == nullptr)) {
    return SetError(-EINVAL, "engram_list_tables needs a session, ret_count and room");
  }
  size_t stride = 0;
  if (int rc = engram::client::CheckArray("engram_table_info", ret_tables, capacity,
                                          sizeof(engram_table_info), &stride);
      rc < 0) {
    return rc;
  }
  std::vector<engram_wire_table> tables;
  if (int rc = FetchTables(s, &tables); rc < 0) return rc;
  for (size_t i = 0; i < tables.size() && i < capacity; ++i) {
    WriteStruct("engram_table_info", TableInfo(tables[i]),
                engram::client::ArrayElement(static_cast<void*>(ret_tables), stride, i));
  }
  *ret_count = tables.size();
  return 0;
}

int engram_table_map_open(engram_session* s, uint32_t layer, engram_table_map** ret_map) {
  if (s == nullptr || ret_map == nullptr) {
    return SetError(-EINVAL, "engram_table_map_open needs a session and ret_map");
  }
  return OpenTableMap(s, layer, /*row_cache=*/false, ret_map);
}

// A cache-tier table's map is its row cache (ENGRAM_TABLE_MAP_ROW_CACHE), for a GPU to read. A
// call of its own: callers of engram_table_map_open built before info.kind read every map as
// a resident table.
int engram_table_map_open_any(engram_session* s, uint32_t layer, engram_table_map** ret_map) {
  if (s == nullptr || ret_map == nullptr) {
    return SetError(-EINVAL, "engram_table_map_open_any needs a session and ret_map");
  }
  return OpenTableMap(s, layer, /*row_cache=*/true, ret_map);
}

}  // extern "C"
