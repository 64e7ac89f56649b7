// What the server's own files share (server.cc, server_socket.cc, handshake.cc, poller.cc,
// dispatch.cc): the epoll tags, the pending-handshake bounds and the reply send. Private to them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "protocol/codec.h"

namespace engram {

// epoll data tags of the control loop; session sockets are tagged by their fd (>= 0 … < 2^31).
inline constexpr uint64_t kTagListen = uint64_t{1} << 40;
inline constexpr uint64_t kTagStop = kTagListen + 1;
inline constexpr uint64_t kTagSignal = kTagListen + 2;
inline constexpr uint64_t kTagLease = kTagListen + 3;
inline constexpr uint64_t kTagInotify = kTagListen + 4;
// The poller's kick eventfd; session doorbells are tagged by session id (from 1).
inline constexpr uint64_t kTagKick = 0;

// Connections that have not sent HELLO yet, per uid and in all (PendingHandshakes). A client
// sends HELLO right after connecting, so only a peer that holds connections open without
// speaking ever gets near these.
inline constexpr size_t kMaxPendingHandshakes = 256;
inline constexpr size_t kMaxPendingHandshakesPerUid = 32;

// A client that does not read its replies loses them (SendMessage never blocks): the daemon
// never waits on one.
inline void SendBytes(int fd, const void* data, size_t size) {
  (void)protocol::SendMessage(fd, data, size, nullptr, 0);
}

}  // namespace engram
