// What the operator side (daemon/ops: control commands, metrics, watchdog, reload) may see of
// the running server, and the two things it may change: the settings a SIGHUP applies live, and
// which resident tables the row store loads (`engramctl load`).
// The server implements it; ops code never reaches into the server's members.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/metric_sink.h"
#include "daemon/server/server_config.h"
#include "daemon/server/session.h"
#include "gather/gather_engine.h"
#include "store/load_status.h"
#include "tables/table.h"

namespace engram {

class ServerView {
 public:
  virtual ~ServerView() = default;

  // Control thread only (the configuration changes only there, on SIGHUP).
  virtual const ServerConfig& config() const = 0;
  // Runs `apply` on the configuration in force, which may change there only the settings a
  // SIGHUP applies live (the fields only the control thread reads: handshake limits, access
  // lists; the settings table's rows say which). Sessions of peers the access lists no longer
  // admit are then closed, each logged naming its client. Control thread only.
  virtual void ApplyLiveSettings(const std::function<void(ServerConfig*)>& apply) = 0;

  // Thread-safe from here on.
  virtual uid_t own_uid() const = 0;
  virtual uint64_t start_ns() const = 0;
  virtual bool draining() const = 0;
  virtual uint64_t requests_in_flight() const = 0;
  virtual uint64_t total_arena_bytes() const = 0;
  // The poller's last pass (for the watchdog).
  virtual uint64_t poller_heartbeat_ns() const = 0;
  // Windows the poller spun through ahead of an expected burst of requests (engine.pace), and
  // how many of them the burst came in.
  virtual uint64_t pace_windows() const = 0;
  virtual uint64_t pace_windows_caught() const = 0;
  // Polling mode (PollOptions::hold_cores): whether it holds cores spinning now (clients are
  // active), and the time the poller and the request threads spent spinning with nothing to
  // do, in ns (every spell counts: the adaptive one, pace windows and polling mode).
  virtual bool poll_holding() const = 0;
  virtual uint64_t poller_spin_ns() const = 0;
  virtual uint64_t request_threads_spin_ns() const = 0;
  // Tables, sorted by layer id; fixed for the server's life.
  virtual std::span<const std::unique_ptr<Table>> tables() const = 0;
  // OK, or DataLoss naming the file, when a file of tables()[index] changed while served.
  virtual absl::Status TableHealth(size_t index) const = 0;
  virtual std::vector<TableGatherStats> EngineStats() const = 0;
  // A snapshot of the connected sessions.
  virtual std::vector<std::shared_ptr<Session>> Sessions() const = 0;
  // The row store's fields in the reply to `command` and its metrics; nothing without a store
  // (docs/row-store.md).
  virtual void AddStoreControlFields(const std::string& command, nlohmann::json* out) const = 0;
  virtual void AddStoreMetrics(MetricSink* e) const = 0;
  // A resident table's load: start (or resume) it, cancel it, or only report it. The row store's
  // loader thread does the reading; this returns at once. FailedPrecondition without a row store
  // or for a table of another tier, NotFound for a layer not served.
  enum class LoadAction { kStart, kCancel, kStatus };
  virtual absl::StatusOr<ResidentLoadStatus> ResidentLoad(uint32_t layer,
                                                          LoadAction action) const = 0;
};

}  // namespace engram
