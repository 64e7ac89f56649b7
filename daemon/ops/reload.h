// SIGHUP: what a re-read configuration changes. The settings the server reads only on the
// control thread (handshake limits, access lists) change live; the rest is named as needing a
// restart.
#pragma once

#include <string>
#include <vector>

#include "daemon/ops/config_file.h"
#include "daemon/server/server_config.h"
#include "store/store_config.h"

namespace engram {

// What a SIGHUP re-read yields: the resolved server configuration and the rest of the settings.
struct ReloadedConfig {
  ServerConfig server;
  std::string log_level;
  MetricsOptions metrics;
  // Settings the re-read found changed that the reloader compared itself (the row store's,
  // which the server does not hold): all need a restart.
  std::vector<std::string> restart;
};

struct ReloadReport {
  std::vector<std::string> changed;  // "limits.max_clients 64 -> 32", applied live
  std::vector<std::string> restart;  // keys that changed but need a restart
};

// Compares the server settings of `cur` and `next`: the live ones go to `changed`, the others
// that differ to `restart`. Applying the live ones is the server's (ServerView).
ReloadReport CompareServerConfigs(const ServerConfig& cur, const ServerConfig& next);

// The [tables] tier and [memory] keys that differ between `cur` and `next` (the row store is
// built once, at start: every one of them needs a restart).
std::vector<std::string> CompareStoreConfigs(const StoreConfig& cur, const StoreConfig& next);

// Appends the metrics and log changes of `next` against the running values to `report`, and
// updates those values.
void CompareOpsSettings(const ReloadedConfig& next, std::string* log_level,
                        MetricsOptions* metrics, ReloadReport* report);

// Sets log::g_max_priority from a level name ("error" ... "debug"); false if unknown.
bool SetLogLevel(const std::string& level);

}  // namespace engram
