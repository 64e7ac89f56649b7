// SIGHUP: what a re-read configuration changes. Each row of Settings() (config_file.h) says
// whether a new value applies live or needs a restart; this file compares and takes values row by
// row and keeps no list of its own.
#pragma once

#include <string>
#include <vector>

#include "daemon/ops/config_file.h"

namespace engram {

struct ReloadReport {
  // Live settings that changed, applied: "limits.max_clients 64 -> 32".
  std::vector<std::string> changed;
  // Settings that changed but keep their running value until a restart:
  // "tables.read_mode \"buffered\" -> \"direct\"".
  std::vector<std::string> restart;
};

// Every setting whose value differs between `running` (in force) and `fresh` (re-read), in the
// order of Settings(): a live one in `changed`, the others in `restart`.
ReloadReport CompareSettings(const DaemonSettings& running, const DaemonSettings& fresh);

// `running` with the value of every live setting taken from `fresh`: what is in force after the
// SIGHUP. Only the settings themselves are taken; what is derived from them (ServerConfig's
// resolved uids, say) is for the caller to derive again.
DaemonSettings TakeLiveSettings(const DaemonSettings& running, const DaemonSettings& fresh);

// What a SIGHUP re-read yields: the settings in force afterwards (TakeLiveSettings, resolved:
// `settings.server` is the server configuration to apply) and what changed.
struct ReloadedConfig {
  DaemonSettings settings;
  ReloadReport report;
};

// The log lines of a report: "changed: a 1 -> 2; b ..." (or that nothing live changed), and,
// when something needs a restart, "needs a restart: c x -> y; ...".
std::string ChangedLine(const ReloadReport& report);
std::string RestartLine(const ReloadReport& report);

}  // namespace engram
