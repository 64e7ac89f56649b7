// The settings a SIGHUP changes on a running server (Server::ApplyLiveSettings, see server.h).
// The operator side walks the settings table's live rows and copies each one's value; the server
// keeps no list of its own. An allow list that no longer admits a session's peer closes it.
#include <sys/socket.h>

#include <vector>

#include "daemon/server/server.h"

namespace engram {

void Server::ApplyLiveSettings(const std::function<void(ServerConfig*)>& apply) {
  // The live fields are read by the control thread only (handshakes, warm and evict), the
  // thread this runs on: safe to change here.
  apply(&config_);
  CloseSessionsNoLongerAdmitted();
}

void Server::CloseSessionsNoLongerAdmitted() {
  std::vector<std::shared_ptr<Session>> revoked;
  for (const auto& [fd, session] : by_fd_) {
    const PeerInfo& peer = session->peer();
    // The groups the kernel recorded when the peer connected, as its handshake was checked.
    std::vector<gid_t> groups;
    if (!config_.allow_gids.empty()) groups = PeerGroups(fd);
    if (!IsAdmitted(config_, own_uid_, peer.uid, peer.gid, groups)) revoked.push_back(session);
  }
  for (const std::shared_ptr<Session>& session : revoked) {
    log::Warning("{}: uid {} is no longer admitted (allowed now: {}); closing its session",
                 session->Describe(), session->peer().uid, DescribeAdmitted(config_, own_uid_));
    // Its ring is read no more and its client sees the session stopped, its requests in flight
    // finish; the connection is shut so that the client hears of it at once.
    session->MarkStopped();
    shutdown(session->socket_fd(), SHUT_RDWR);
    Disconnect(session, "is no longer admitted by the reloaded allow list");
  }
}

}  // namespace engram
