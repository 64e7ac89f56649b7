// MAP_TABLE: hands a client the sealed memfd of a resident table so that it can read rows in
// place (PROT_READ), with no request, together with the table state page that tells it when to
// stop. Only resident tables that loaded, were verified against their files and whose files have
// not changed since can be mapped: their memfd never changes or shrinks again (F_SEAL_FUTURE_WRITE,
// SHRINK, GROW, SEAL), and the daemon withdraws the table in the state page when a file changes
// or it stops; the kernel marks the page's liveness word when the daemon dies.
// A cache-tier table is answered with the row cache instead (protocol 1.4, a session with
// ENGRAM_FEATURE_ROW_CACHE_MAP): a read-only descriptor of the cache's memfd, the table state
// page and the session's touch page (docs/protocol.md, "Reading the row cache in place"). A
// resident table's answer carries the touch page too for a session with
// ENGRAM_FEATURE_RESIDENT_TOUCH (1.5), where the client counts the rows it reads in place. The
// row cache is never mapped for a client of engramd's own uid (other than root).
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "daemon/server/server.h"

namespace engram {
namespace {

// The table of `layer` and its index, or null.
const Table* FindTable(std::span<const std::unique_ptr<Table>> tables, uint32_t layer,
                       size_t* ret_index) {
  for (size_t i = 0; i < tables.size(); ++i) {
    if (tables[i]->layer_id() != layer) continue;
    *ret_index = i;
    return tables[i].get();
  }
  return nullptr;
}

}  // namespace

void Server::SendTableMap(Session& session, const engram_msg_header& header,
                          const uint8_t* message) {
  const auto refuse = [&](int32_t code, const std::string& why) {
    SendError(session, code, why, header.request_id);
  };
  engram_msg_map_table request;
  protocol::CodecError error;
  if (!protocol::DecodeMapTable(message, header.bytes, &request, &error)) {
    refuse(error.code, error.message);
    return;
  }
  const uint32_t layer = request.layer_id;
  size_t index = 0;
  const Table* table = FindTable(tables_, layer, &index);
  if (table == nullptr) {
    refuse(ENGRAM_STATUS_NOT_FOUND, absl::StrFormat("engramd serves no table of layer %u", layer));
    return;
  }
  const ResidentTable* resident = store_ != nullptr ? store_->resident(layer) : nullptr;
  if (resident == nullptr && store_ != nullptr && store_->Cached(table) &&
      session.row_cache_map() && session.table_state()) {
    SendRowCacheMap(session, header, *table, index);
    return;
  }
  if (resident == nullptr) {
    refuse(ENGRAM_STATUS_FAILED_PRECONDITION,
           absl::StrFormat("%s is not resident, so it cannot be mapped (only tables of the "
                           "resident tier can: [tables] tiers or --tier %u=resident)",
                           table->Describe(), layer));
    return;
  }
  // A client that cannot see the table withdrawn would go on reading it after its file changed
  // or the daemon died: it gathers through the daemon instead (FAILED_PRECONDITION means
  // "not for you, ever" to the client library, which then stops asking).
  if (!session.table_state()) {
    refuse(ENGRAM_STATUS_FAILED_PRECONDITION,
           absl::StrFormat("%s is not mapped for this client: its library predates protocol "
                           "1.3, which tells in-place readers when a table is withdrawn; "
                           "upgrade libengram_client to read it in place",
                           table->Describe()));
    return;
  }
  if (table_states_ == nullptr) {
    refuse(ENGRAM_STATUS_UNAVAILABLE, absl::StrFormat("%s cannot be read in place: %s",
                                                      table->Describe(), table_states_error_));
    return;
  }
  // As gathers through the daemon: a changed file refuses the table, naming the file.
  if (absl::Status s = watch_->Check(index); !s.ok()) {
    table_states_->Withdraw(index);
    refuse(ENGRAM_STATUS_DATA_LOSS,
           absl::StrFormat("%s cannot be mapped: %s", table->Describe(), s.message()));
    return;
  }
  if (!resident->refusal().ok()) {
    refuse(ENGRAM_STATUS_DATA_LOSS, absl::StrFormat("%s cannot be mapped: %s", table->Describe(),
                                                    resident->refusal().message()));
    return;
  }
  if (!resident->loaded()) {
    refuse(ENGRAM_STATUS_UNAVAILABLE,
           absl::StrFormat("%s is still loading (%u of %u rows); map it once it is loaded",
                           table->Describe(), resident->rows_loaded(), resident->covered().size()));
    return;
  }
  SendResidentMap(session, header, *table, *resident, index);
}

// A resident table that may be mapped: its sealed memfd and the table state page, and the
// session's touch page where the session has ENGRAM_FEATURE_RESIDENT_TOUCH.
void Server::SendResidentMap(Session& session, const engram_msg_header& header, const Table& table,
                             const ResidentTable& resident, size_t index) {
  int fds[3] = {resident.fd(), table_states_->fd(), -1};
  if (session.resident_touch()) {
    absl::StatusOr<int> touch = TouchPageFd(session);
    if (!touch.ok()) {
      SendError(session, ENGRAM_STATUS_UNAVAILABLE,
                absl::StrFormat("%s cannot be read in place: %s", table.Describe(),
                                touch.status().message()),
                header.request_id);
      return;
    }
    fds[2] = *touch;
  }
  engram_msg_table_mapped reply{};
  protocol::FillHeader(&reply.header, ENGRAM_MSG_TABLE_MAPPED, sizeof(reply), header.request_id);
  reply.layer_id = table.layer_id();
  reply.row_bytes = kRowBytes;
  reply.covered_begin = resident.covered().begin;
  reply.covered_end = resident.covered().end;
  reply.map_bytes = resident.bytes();
  reply.state_index = static_cast<uint32_t>(index);
  (void)protocol::SendMessage(session.socket_fd(), &reply, sizeof(reply), fds,
                              session.resident_touch() ? 3 : 2);
}

absl::StatusOr<int> Server::TouchPageFd(Session& session) {
  if (session.touch_page == nullptr) {
    auto page = CacheTouchPage::Create(tables_.size());
    if (!page.ok()) return page.status();
    session.touch_page = *page;
    session.touch_page->Attach({.cache_rows = &session.counters.cache_rows_in_place,
                                .resident_rows = &session.counters.resident_rows_in_place,
                                .clamped = &session.counters.touch_reports_clamped,
                                .name = session.Describe()});
    store_->AddTouchPage(*page);
  }
  return session.touch_page->fd();
}

// A cache-tier table: the row cache, read-only, with the table state page and the session's
// touch page (made by its first such request).
void Server::SendRowCacheMap(Session& session, const engram_msg_header& header, const Table& table,
                             size_t index) {
  const auto refuse = [&](int32_t code, const std::string& why) {
    SendError(session, code, why, header.request_id);
  };
  // A peer of engramd's own uid owns the cache's memfd as engramd does: it could fchmod the
  // read-only descriptor and reopen it writable through /proc/self/fd, then rewrite rows that
  // every client reads. No seal keeps the memfd writable for engramd yet closed to that (a
  // write seal also stops the shrink's hole punch and the next engramd's mapping), so such a
  // peer is not given it (docs/reliability.md, "Threat model"). Root could reopen any file
  // writable anyway.
  if (session.peer().uid == own_uid_ && own_uid_ != 0) {
    log::Warning(
        "{} runs as engramd's own uid {}: its rows of {} are gathered by engramd, not "
        "read in place (a client of this uid could make the row cache writable); run "
        "clients as another uid",
        session.Describe(), own_uid_, table.Describe());
    refuse(ENGRAM_STATUS_PERMISSION_DENIED,
           absl::StrFormat("%s: the row cache is not mapped for a client of engramd's own uid %u "
                           "(it could make it writable); its rows are gathered by engramd",
                           table.Describe(), own_uid_));
    return;
  }
  if (table_states_ == nullptr) {
    refuse(ENGRAM_STATUS_UNAVAILABLE, absl::StrFormat("%s cannot be read in place: %s",
                                                      table.Describe(), table_states_error_));
    return;
  }
  if (absl::Status s = watch_->Check(index); !s.ok()) {
    table_states_->Withdraw(index);
    refuse(ENGRAM_STATUS_DATA_LOSS,
           absl::StrFormat("%s cannot be mapped: %s", table.Describe(), s.message()));
    return;
  }
  absl::StatusOr<int> cache_fd = store_->CacheReadOnlyFd();
  if (!cache_fd.ok()) {
    refuse(ENGRAM_STATUS_UNAVAILABLE,
           absl::StrFormat("%s: its row cache cannot be read in place: %s", table.Describe(),
                           cache_fd.status().message()));
    return;
  }
  absl::StatusOr<int> touch = TouchPageFd(session);
  if (!touch.ok()) {
    refuse(ENGRAM_STATUS_UNAVAILABLE,
           absl::StrFormat("%s: its row cache cannot be read in place: %s", table.Describe(),
                           touch.status().message()));
    return;
  }
  engram_msg_table_mapped reply{};
  protocol::FillHeader(&reply.header, ENGRAM_MSG_TABLE_MAPPED, sizeof(reply), header.request_id);
  reply.layer_id = table.layer_id();
  reply.row_bytes = kRowBytes;
  reply.covered_begin = table.covered().begin;
  reply.covered_end = table.covered().end;
  reply.map_bytes = store_->cache_region_bytes();
  reply.state_index = static_cast<uint32_t>(index);
  reply.kind = ENGRAM_TABLE_MAPPED_ROW_CACHE;
  const int fds[3] = {*cache_fd, table_states_->fd(), *touch};
  (void)protocol::SendMessage(session.socket_fd(), &reply, sizeof(reply), fds, 3);
}

}  // namespace engram
