// The operator side of engramd: control requests on the socket (JSON in and out; the commands
// are in control_commands.h), and the pieces the server's control loop drives: the metrics
// listener, systemd notifications and the watchdog (watchdog.h), SIGHUP reloads (reload.h).
// Runs on the server's control thread, except MetricsText(), which the HTTP listener calls
// from its own, and warm steps, which run on a worker (page_cache.h). Any peer the socket
// admits may read; the requests that change what every client sees (warm, evict) need an
// administrator (ServerConfig's admin_uids / admin_gids, root, the daemon's own uid) and are
// refused with PermissionDenied. It sees the server only through ServerView.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "base/log.h"
#include "daemon/ops/config_file.h"
#include "daemon/ops/metrics.h"
#include "daemon/ops/metrics_text.h"
#include "daemon/ops/page_cache.h"
#include "daemon/ops/reload.h"
#include "daemon/ops/watchdog.h"
#include "daemon/server/control_handler.h"
#include "daemon/server/server_view.h"
#include "engram/protocol.h"

namespace engram {

// The control commands that need an administrator ("warm", "evict").
std::vector<std::string> AdminCommandNames();

class Control final : public ControlHandler {
 public:
  explicit Control(ServerView* server);
  ~Control() override;

  // Answers one ENGRAM_MSG_CONTROL message of `session` (body: JSON text). No exception
  // escapes: a command that throws is that request's InternalError.
  void Handle(const std::shared_ptr<Session>& session, const engram_msg_header& header,
              const uint8_t* body, size_t body_bytes) override;

  // The whole Prometheus exposition. Thread-safe.
  std::string MetricsText() const;

  // The settings in force (resolved, as the server was created with them); called before
  // Server::Run. `http`: the metrics listener the start already opened (it answered /healthz
  // with 503 while the tables opened), or null to open one in Start() if the settings ask for it.
  void Configure(const DaemonSettings& settings, const std::string& version,
                 std::unique_ptr<metrics::HttpListener> http = nullptr);
  // Starts what the metrics options ask for (HTTP listener) and tells systemd the daemon is
  // ready. Called once from Server::Run before serving.
  void Start() override;
  // What GET /healthz answers: ok while serving, the reason while stopping. Thread-safe.
  metrics::Health Health() const;
  // A session ends (before it leaves the server's list): its counts stay in its client name's
  // series.
  void SessionClosed(const Session& session) override { clients_.Retire(session); }
  // Control loop: how long it may sleep (ms, -1 forever) and the periodic work.
  int WaitMs() const override { return watchdog_.WaitMs(); }
  void Tick() override { watchdog_.Tick(); }
  // SIGHUP: re-reads the configuration through the reloader and applies every live row of the
  // settings table: its value is copied into the settings in force, and the part of engramd the
  // row names (Setting::Applies) takes its new values from them.
  void Reload() override;
  // The settings in force, each as the part that applies it holds it (the server's own
  // configuration, the logger, the watchdog); the others as engramd started with them.
  DaemonSettings RunningSettings() const;
  void SetReloader(std::function<absl::StatusOr<ReloadedConfig>()> reloader) {
    reloader_ = std::move(reloader);
  }
  // Stopping: tells systemd; /healthz answers 503 from here on.
  void Stopping() override {
    stopping_.store(true);
    watchdog_.Stopping();
  }
  // Requests drained, sessions about to close: the metrics textfile, if configured, is written a
  // last time (with engram_up 0), so that node-exporter does not go on showing a serving daemon.
  void Stopped() override { watchdog_.WriteTextfile(); }

 private:
  absl::StatusOr<std::optional<std::string>> Run(const std::shared_ptr<Session>& session,
                                                 uint32_t request_id,
                                                 const std::string& request_text);
  bool PeerIsAdministrator(const Session& session) const;
  absl::Status Refuse(const Session& session, const std::string& command, const char* admin_reason);
  // Logs a refused request at warning level: once per uid a minute, with the count of the
  // refusals not logged since.
  void LogRefusal(const Session& session, const std::string& command);
  // Sends the reply (or the error) of request `request_id`. Any thread.
  void Answer(Session& session, uint32_t request_id, const absl::StatusOr<std::string>& reply);
  void Reply(Session& session, uint32_t request_id, const std::string& text);
  // Copies every live row's value from `next` into running_; returns the parts the rows name.
  std::set<Setting::Applies> CopyLiveRows(const DaemonSettings& next);
  // Has `part` take its values from running_, or write those it holds into *shown.
  void Take(Setting::Applies part);
  void Report(Setting::Applies part, DaemonSettings* shown) const;

  ServerView* const server_;
  std::function<absl::StatusOr<ReloadedConfig>()> reloader_;
  // The settings in force: as engramd started, with every SIGHUP's live rows copied in.
  DaemonSettings running_;
  std::string version_ = "unknown";
  mutable ClientSeries clients_;  // before http_: the listener's thread renders them
  std::atomic<bool> stopping_{false};
  std::unique_ptr<metrics::HttpListener> http_;
  Watchdog watchdog_;
  struct Refusals {
    uint64_t logged_ns = 0;
    uint64_t unlogged = 0;
  };
  std::unordered_map<uid_t, Refusals> refusals_;
  log::RateLimit refusal_log_{5};  // refusal lines of all uids together, per second
  log::RateLimit error_log_{5};    // refused control requests, all peers together
  PageCacheWorker page_cache_{4};  // last member: its jobs reply through this object
};

}  // namespace engram
