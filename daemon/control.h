// The operator side of engramd: control requests on the socket (status, tables, stats, clients,
// warm, evict, metrics; JSON in and out), the Prometheus metrics, systemd notifications and the
// watchdog, and SIGHUP reloads. Runs on the server's control thread, except MetricsText(),
// which the HTTP listener calls from its own. Any peer the socket admits may read; the requests
// that change what every client sees (warm, evict) need an administrator (ServerConfig's
// admin_uids / admin_gids, root, the daemon's own uid) and are refused with PermissionDenied.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/cgroup_memory.h"
#include "daemon/config_file.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "engram/protocol.h"

namespace engram {

class Server;
class Session;

// The control commands that need an administrator ("warm", "evict").
std::vector<std::string> AdminCommandNames();

// What a SIGHUP re-read yields: the resolved server configuration and the rest of the settings.
struct ReloadedConfig {
  ServerConfig server;
  std::string log_level;
  MetricsOptions metrics;
};

class Control {
 public:
  explicit Control(Server* server);
  ~Control();

  // Answers one ENGRAM_MSG_CONTROL message of `session` (body: JSON text).
  void Handle(Session& session, const engram_msg_header& header, const uint8_t* body,
              size_t body_bytes);

  // The whole Prometheus exposition. Thread-safe.
  std::string MetricsText() const;

  // The metrics options and log level in force; called before Server::Run.
  void Configure(const MetricsOptions& metrics, const std::string& log_level,
                 const std::string& version) {
    metrics_ = metrics;
    log_level_ = log_level;
    version_ = version;
  }
  // Starts what the metrics options ask for (HTTP listener) and tells systemd the daemon is
  // ready. Called once from Server::Run before serving.
  void Start();
  // Control loop: how long it may sleep (ms, -1 forever) and the periodic work (watchdog ping,
  // STATUS=, textfile).
  int WaitMs() const;
  void Tick();
  // SIGHUP: re-reads the configuration through the reloader and applies what can change live.
  void Reload();
  void SetReloader(std::function<absl::StatusOr<ReloadedConfig>()> reloader) {
    reloader_ = std::move(reloader);
  }
  // Stopping: tells systemd.
  void Stopping();

 private:
  absl::StatusOr<std::string> Run(Session& session, const std::string& request_text);
  bool PeerIsAdministrator(const Session& session) const;
  // Logs a refused request at warning level: once per uid a minute, with the count of the
  // refusals not logged since.
  void LogRefusal(const Session& session, const std::string& command);
  std::string StatusLine() const;
  void Reply(Session& session, uint32_t request_id, const std::string& text);

  Server* const server_;
  std::function<absl::StatusOr<ReloadedConfig>()> reloader_;
  MetricsOptions metrics_;
  std::string log_level_ = "info";
  std::string version_ = "unknown";
  std::unique_ptr<metrics::HttpListener> http_;
  uint64_t watchdog_ns_ = 0;
  uint64_t last_ping_ns_ = 0;
  uint64_t last_textfile_ns_ = 0;
  std::string last_status_;
  bool poller_stall_reported_ = false;
  struct Refusals {
    uint64_t logged_ns = 0;
    uint64_t unlogged = 0;
  };
  std::unordered_map<uid_t, Refusals> refusals_;
  log::RateLimit refusal_log_{5};  // refusal lines of all uids together, per second
  MemoryThrottleWatch memory_watch_;  // throttling of the cgroup: a line a minute at most
};

}  // namespace engram
