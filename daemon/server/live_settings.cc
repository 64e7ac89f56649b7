// The settings a SIGHUP changes on a running server (Server::ApplyLiveSettings, see server.h).
// The operator side walks the settings table's live rows and copies each one's value; the server
// keeps no list of its own.
#include "daemon/server/server.h"

namespace engram {

void Server::ApplyLiveSettings(const std::function<void(ServerConfig*)>& apply) {
  // The live fields are read by the control thread only (handshakes, warm and evict), the
  // thread this runs on: safe to change here.
  apply(&config_);
}

}  // namespace engram
