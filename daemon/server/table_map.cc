// MAP_TABLE: hands a client the sealed memfd of a resident table so that it can read rows in
// place (PROT_READ), with no request. Only resident, fully loaded tables can be mapped: their
// memfd never changes or shrinks again (F_SEAL_FUTURE_WRITE, SHRINK, GROW, SEAL), so a client
// mapping stays valid whatever the daemon does, restarts included.
#include "absl/strings/str_format.h"
#include "daemon/server/server.h"

namespace engram {

void Server::SendTableMap(Session& session, const engram_msg_header& header,
                          const uint8_t* message) {
  if (header.bytes != sizeof(engram_msg_map_table)) {
    SendError(session, ENGRAM_STATUS_INVALID_ARGUMENT,
              absl::StrFormat("MAP_TABLE is %u bytes, got %u", sizeof(engram_msg_map_table),
                              header.bytes),
              header.request_id);
    return;
  }
  engram_msg_map_table request;
  memcpy(&request, message, sizeof(request));
  const uint32_t layer = request.layer_id;
  const Table* table = nullptr;
  for (const auto& t : tables_) {
    if (t->layer_id() == layer) table = t.get();
  }
  if (table == nullptr) {
    SendError(session, ENGRAM_STATUS_NOT_FOUND,
              absl::StrFormat("engramd serves no table of layer %u", layer), header.request_id);
    return;
  }
  const ResidentTable* resident = store_ != nullptr ? store_->resident(layer) : nullptr;
  if (resident == nullptr) {
    SendError(session, ENGRAM_STATUS_FAILED_PRECONDITION,
              absl::StrFormat("%s is not resident, so it cannot be mapped (only tables of the "
                              "resident tier can: [tables] tiers or --tier %u=resident)",
                              table->Describe(), layer),
              header.request_id);
    return;
  }
  if (!resident->loaded()) {
    SendError(
        session, ENGRAM_STATUS_UNAVAILABLE,
        absl::StrFormat("%s is still loading (%u of %u rows); map it once it is loaded",
                        table->Describe(), resident->rows_loaded(), resident->covered().size()),
        header.request_id);
    return;
  }
  engram_msg_table_mapped reply{};
  protocol::FillHeader(&reply.header, ENGRAM_MSG_TABLE_MAPPED, sizeof(reply), header.request_id);
  reply.layer_id = layer;
  reply.row_bytes = kRowBytes;
  reply.covered_begin = resident->covered().begin;
  reply.covered_end = resident->covered().end;
  reply.map_bytes = resident->bytes();
  const int fd = resident->fd();
  (void)protocol::SendMessage(session.socket_fd(), &reply, sizeof(reply), &fd, 1);
}

}  // namespace engram
