// The control commands: one table that is both the dispatcher and the list of commands
// (engramctl's help, the "unknown command" error and the administrator rules all come from it).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/ops/config_file.h"
#include "daemon/ops/page_cache.h"
#include "daemon/server/server_view.h"

namespace engram {

// What a command may use besides the server. Control thread only.
struct CommandContext {
  const ServerView& server;
  const std::shared_ptr<Session>& session;
  const nlohmann::json& request;
  const std::string& command;
  const std::string& version;
  const std::string& log_level;
  uint64_t watchdog_ns;
  bool peer_is_administrator;
  PageCacheWorker& worker;
  // For a command that answers later (from the worker): sends the reply of this request.
  std::function<void(absl::StatusOr<nlohmann::json>)> reply_later;
  // The whole Prometheus exposition (Control::MetricsText).
  std::function<std::string()> metrics_text;
  // The settings in force, each as the part that applies it holds it (Control::RunningSettings).
  std::function<DaemonSettings()> running_settings;
};

// A command's answer: the reply object, or nullopt when reply_later will send it.
using CommandResult = absl::StatusOr<std::optional<nlohmann::json>>;

struct CommandSpec {
  const char* name;
  // Why it needs an administrator; nullptr: any peer the socket admits may run it.
  const char* admin_reason;
  CommandResult (*run)(CommandContext& context);
};

std::span<const CommandSpec> ControlCommands();
const CommandSpec* FindControlCommand(const std::string& name);
// Command names in table order: all, or only those that need an administrator.
std::vector<std::string> ControlCommandNames(bool admin_only);

}  // namespace engram
