// ControlHandler: the server's one way to its control plane. The server hands it control
// messages, SIGHUP and the control loop's turns, and tells it when serving starts and stops;
// operations implement it (daemon/ops/control.h: commands, metrics, watchdog, systemd notify,
// reload) over the ServerView the server offers. engramd's main wires the two:
//
//   auto server = Server::Create(config, std::move(tables), std::move(engine),
//       [](ServerView* view) { return std::make_unique<Control>(view); });  // a ControlHandler
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engram/protocol.h"

namespace engram {

class Session;

class ControlHandler {
 public:
  virtual ~ControlHandler() = default;
  // Answers one ENGRAM_MSG_CONTROL message of `session` (body: JSON text). Control thread; no
  // exception escapes.
  virtual void Handle(const std::shared_ptr<Session>& session, const engram_msg_header& header,
                      const uint8_t* body, size_t body_bytes) = 0;
  // Serving starts: once, from Server::Run, before the control loop's first turn.
  virtual void Start() = 0;
  // The control loop: how long it may sleep (ms, -1 forever), then the periodic work.
  virtual int WaitMs() const = 0;
  virtual void Tick() = 0;
  // SIGHUP arrived.
  virtual void Reload() = 0;
  // Serving stops: Run is draining the requests in flight.
  virtual void Stopping() = 0;
  // The requests are drained and the sessions about to close.
  virtual void Stopped() = 0;
  // A session ends, before it leaves the server's list (its counts stay with its client name).
  virtual void SessionClosed(const Session& session) = 0;
};

}  // namespace engram
