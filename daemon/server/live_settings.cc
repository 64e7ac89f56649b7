// The settings a SIGHUP changes on a running server (Server::ApplyLiveSettings, see server.h).
#include "daemon/server/server.h"

namespace engram {

void Server::ApplyLiveSettings(const ServerConfig& next) {
  // Read by the control thread only (handshakes, warm and evict): safe to change here.
  config_.limits.max_clients = next.limits.max_clients;
  config_.limits.max_arena_bytes = next.limits.max_arena_bytes;
  config_.limits.max_total_arena_bytes = next.limits.max_total_arena_bytes;
  config_.limits.default_data_bytes = next.limits.default_data_bytes;
  config_.limits.default_slots = next.limits.default_slots;
  config_.limits.max_device_sessions = next.limits.max_device_sessions;
  config_.allow_uids = next.allow_uids;
  config_.allow_gids = next.allow_gids;
  config_.admin_uids = next.admin_uids;
  config_.admin_gids = next.admin_gids;
}

}  // namespace engram
