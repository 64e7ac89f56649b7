// engramd between its start and serving: the client socket is bound from the first second and
// answers every HELLO with a retryable UNAVAILABLE error that names the step in progress
// ("engramd is starting: building the row cache (12 s); retry when it serves"), so that
// `engramctl status` says "starting" instead of "not running" and no client is served before
// the tables are ready. The step is logged when it begins and every 10 s while it lasts, and
// sent to systemd as STATUS=. A SIGTERM while starting stops engramd once the step ends. The
// metrics port, if configured, answers /healthz with 503 and the step, and /metrics with engram_up
// 0. Serve takes the socket and the listener over: a client that connects in between waits in the
// socket's backlog instead of being refused. Under socket activation the gate does not answer:
// clients wait in the backlog, as systemd means them to.
//
//   auto bound = engram::BindClientSocket(config);  // daemon/server/server.h
//   auto gate = engram::StartingGate::Open(std::move(bound->fd), std::move(bound->claim),
//                                          metrics_options, version);
//   (*gate)->Step("opening the tables");
//   ...
//   config.listen_fd = (*gate)->TakeSocket();
//   server->SetSocketClaim((*gate)->TakeClaim());
//   control.Configure(metrics_options, level, version, (*gate)->TakeHttp());
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "daemon/ops/config_file.h"
#include "daemon/ops/metrics.h"
#include "daemon/server/socket_claim.h"

namespace engram {

class StartingGate {
 public:
  // Takes the listening client socket and starts answering on its own thread. `claim`: engramd's
  // claim on the path where it bound `listen_fd` (the gate answers on it, and releases the claim,
  // removing the path if still this socket, when it goes unless TakeClaim took it); null for
  // the socket systemd passed (socket activation: the gate leaves connections in the backlog
  // and the path to systemd). A metrics port that cannot be opened is logged; the daemon starts
  // without it, as it would later.
  static absl::StatusOr<std::unique_ptr<StartingGate>> Open(UniqueFd listen_fd,
                                                            std::unique_ptr<SocketClaim> claim,
                                                            const MetricsOptions& metrics,
                                                            const std::string& version);
  // Stops answering; releases the claim it still holds (a start that failed before serving).
  ~StartingGate();

  // The step in progress ("building the row cache (48.0 GiB)"): logged now and every 10 s while
  // it lasts, and what a client, engramctl, /healthz and systemd are told.
  void Step(const std::string& what);
  // "engramd is starting: <step> (<seconds> s); retry when it serves": what a HELLO is answered.
  std::string Message() const;
  // Seconds since Open.
  double Elapsed() const;
  // SIGTERM or SIGINT came while starting (they must be blocked in every thread, as engramd
  // does before it opens the gate): the caller stops before serving, at the end of the step in
  // progress. Once the socket is taken over, they are left to the server's signalfd.
  bool stop_requested() const { return stop_signal_.load() != 0; }
  // Stops answering and hands over the listening socket (for ServerConfig::listen_fd) and the
  // metrics listener (null when none). Connections not accepted yet stay queued on the socket.
  int TakeSocket();
  std::unique_ptr<metrics::HttpListener> TakeHttp() { return std::move(http_); }
  // The claim on the socket path, for the server (Server::SetSocketClaim); null under socket
  // activation.
  std::unique_ptr<SocketClaim> TakeClaim() { return std::move(claim_); }

 private:
  StartingGate() = default;
  void Loop();
  void Answer(int fd);
  void LogProgress(uint64_t now);
  std::string StartingMetrics() const;

  UniqueFd listen_fd_;
  UniqueFd stop_fd_;
  UniqueFd signal_fd_;  // SIGTERM and SIGINT while starting
  std::atomic<int> stop_signal_{0};
  std::unique_ptr<SocketClaim> claim_;  // null under socket activation
  bool answer_ = true;                  // false under socket activation
  std::string version_;
  uint64_t start_ns_ = 0;
  mutable std::mutex mu_;  // guards step_ and its times
  std::string step_ = "opening the tables";
  uint64_t step_ns_ = 0;
  uint64_t logged_ns_ = 0;
  std::unique_ptr<metrics::HttpListener> http_;
  std::thread thread_;
};

}  // namespace engram
