// What a SIGHUP changes (reload.h).
#include "daemon/ops/reload.h"

#include <map>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/ops/log.h"

namespace engram {
namespace {

void CompareLive(const ServerConfig& cur, const ServerConfig& next, ReloadReport* report) {
  auto live = [&](const char* key, const auto& from, const auto& to) {
    if (from != to) {
      report->changed.push_back(absl::StrFormat("%s %s -> %s", key, absl::FormatStreamed(from),
                                                absl::FormatStreamed(to)));
    }
  };
  auto live_ids = [&](const char* what, const std::vector<uint32_t>& from,
                      const std::vector<uint32_t>& to) {
    if (from != to) {
      report->changed.push_back(absl::StrFormat("%s [%s] -> [%s]", what, absl::StrJoin(from, ","),
                                                absl::StrJoin(to, ",")));
    }
  };
  // Read by the control thread only (handshakes, warm and evict).
  live("limits.max_clients", cur.limits.max_clients, next.limits.max_clients);
  live("limits.max_arena_bytes", cur.limits.max_arena_bytes, next.limits.max_arena_bytes);
  live("limits.max_total_arena_bytes", cur.limits.max_total_arena_bytes,
       next.limits.max_total_arena_bytes);
  live("limits.default_data_bytes", cur.limits.default_data_bytes, next.limits.default_data_bytes);
  live("limits.default_slots", cur.limits.default_slots, next.limits.default_slots);
  live_ids("allowed uids", cur.allow_uids, next.allow_uids);
  live_ids("allowed gids", cur.allow_gids, next.allow_gids);
  live_ids("administrator uids", cur.admin_uids, next.admin_uids);
  live_ids("administrator gids", cur.admin_gids, next.admin_gids);
}

// Names `key` in `keys` when its value differs: a setting fixed at start.
void NeedsRestart(std::vector<std::string>* keys, const char* key, bool differs) {
  if (differs) keys->push_back(key);
}

void CompareFixed(const ServerConfig& cur, const ServerConfig& next, ReloadReport* report) {
  auto needs_restart = [&](const char* key, bool differs) {
    NeedsRestart(&report->restart, key, differs);
  };
  // Fixed at start: the poller reads these without a lock, clients were told them in WELCOME,
  // or they name what was opened and bound.
  needs_restart("limits.max_inflight", cur.limits.max_inflight != next.limits.max_inflight);
  needs_restart("limits.max_rows_per_request",
                cur.limits.max_rows_per_request != next.limits.max_rows_per_request);
  needs_restart("limits.prefetch_queue_rows",
                cur.limits.prefetch_queue_rows != next.limits.prefetch_queue_rows);
  needs_restart("engine.inline_rows", cur.poll.inline_rows != next.poll.inline_rows);
  needs_restart("engine.pace", cur.poll.pace != next.poll.pace);
  needs_restart("engine.poll_spin_min_us/max_us",
                cur.poll.spin_min_ns != next.poll.spin_min_ns ||
                    cur.poll.spin_max_ns != next.poll.spin_max_ns);
  needs_restart("engine.workers", cur.workers != next.workers);
  needs_restart("memory.budget", cur.memory_budget != next.memory_budget);
  needs_restart("engine.request_threads", cur.request_threads != next.request_threads);
  needs_restart("socket.path", cur.socket_path != next.socket_path);
  needs_restart("socket.mode", cur.socket_mode != next.socket_mode);
  needs_restart("socket.group", cur.socket_group != next.socket_group);
  bool sources_differ = cur.sources.size() != next.sources.size();
  for (size_t i = 0; !sources_differ && i < cur.sources.size(); ++i) {
    sources_differ =
        cur.sources[i].path != next.sources[i].path || cur.sources[i].rows != next.sources[i].rows;
  }
  needs_restart("tables",
                sources_differ || cur.layers != next.layers || cur.check_holes != next.check_holes);
}

}  // namespace

ReloadReport CompareServerConfigs(const ServerConfig& cur, const ServerConfig& next) {
  ReloadReport report;
  CompareLive(cur, next, &report);
  CompareFixed(cur, next, &report);
  return report;
}

std::vector<std::string> CompareStoreConfigs(const StoreConfig& cur, const StoreConfig& next) {
  std::vector<std::string> keys;
  auto needs_restart = [&](const char* key, bool differs) { NeedsRestart(&keys, key, differs); };
  needs_restart("tables.tier", cur.default_tier != next.default_tier);
  needs_restart("tables.tiers", cur.tiers != next.tiers);
  needs_restart("memory.cache", cur.cache_bytes != next.cache_bytes);
  needs_restart("memory.pressure", cur.pressure != next.pressure);
  needs_restart("memory.huge_pages", cur.huge_pages != next.huge_pages);
  needs_restart("memory.load_at_start", cur.load_at_start != next.load_at_start);
  needs_restart("memory.load_rate", cur.load_rate_bytes_per_s != next.load_rate_bytes_per_s);
  // memory.budget is compared with the server's settings (it also bounds the arenas).
  return keys;
}

void CompareOpsSettings(const ReloadedConfig& next, std::string* log_level,
                        MetricsOptions* metrics, ReloadReport* report) {
  if (next.log_level != *log_level && SetLogLevel(next.log_level)) {
    report->changed.push_back(absl::StrFormat("log.level %s -> %s", *log_level, next.log_level));
    *log_level = next.log_level;
  }
  if (next.metrics.textfile_dir != metrics->textfile_dir ||
      next.metrics.textfile_interval_s != metrics->textfile_interval_s) {
    report->changed.push_back(absl::StrFormat(
        "metrics textfile '%s' every %u s -> '%s' every %u s", metrics->textfile_dir,
        metrics->textfile_interval_s, next.metrics.textfile_dir, next.metrics.textfile_interval_s));
    metrics->textfile_dir = next.metrics.textfile_dir;
    metrics->textfile_interval_s = next.metrics.textfile_interval_s;
  }
  report->restart.insert(report->restart.end(), next.restart.begin(), next.restart.end());
  if (next.metrics.http_port != metrics->http_port ||
      next.metrics.http_address != metrics->http_address) {
    report->restart.push_back("metrics.http_port/http_address");
  }
}

bool SetLogLevel(const std::string& level) {
  static const std::map<std::string, log::Priority> levels = {{"error", log::kError},
                                                              {"warning", log::kWarning},
                                                              {"notice", log::kNotice},
                                                              {"info", log::kInfo},
                                                              {"debug", log::kDebug}};
  auto it = levels.find(level);
  if (it == levels.end()) return false;
  log::g_max_priority = it->second;
  return true;
}

}  // namespace engram
