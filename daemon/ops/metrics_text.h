// engramd's Prometheus metrics (every `engram_*` family, docs/operations.md), rendered from
// what the server lets the operator side see. Thread-safe: the HTTP listener, the textfile
// writer and the `metrics` control command all call it.
//
//   ClientSeries clients;              // lives as long as the daemon
//   clients.Retire(*session);          // before the session leaves the server's list
//   std::string text = RenderMetrics(server, version, clients);
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "daemon/ops/metrics.h"
#include "daemon/server/server_view.h"

namespace engram {

// The engram_client_* series, one set per client name rather than per session, so that
// reconnecting clients do not multiply series: the sessions of one name are added up, and a
// name's counters keep what its ended sessions counted. The first `max_names` distinct names
// since the start (in the order their sessions connected, as renders and ends see them) get
// their own series; sessions of later names are added up under client="other". Per-session
// detail is in `engramctl clients`.
class ClientSeries {
 public:
  static constexpr size_t kMaxNames = 32;
  explicit ClientSeries(size_t max_names = kMaxNames) : max_names_(max_names) {}

  // A session that ends: its counters stay in its name's totals. Call it while the session is
  // still in the server's list (Sessions()); a render that still sees it counts it once.
  void Retire(const Session& session);
  // Appends the engram_client_* families: the server's live sessions' counters plus the ended
  // ones'.
  void Append(const ServerView& server, metrics::Exposition& e);

 private:
  struct Totals {
    metrics::Labels labels;
    std::vector<uint64_t> counters;  // in Session::ForEachCounter order; gauges stay 0
    uint64_t latency[64] = {};
    uint64_t latency_sum_ns = 0;
  };
  // The totals of the series `name` belongs to; mu_ held.
  Totals& SeriesOf(const std::string& name);
  // Adds the session's counters to `totals`; mu_ held.
  void Add(const Session& session, Totals* totals);

  const size_t max_names_;
  mutable std::mutex mu_;
  std::vector<SessionCounterInfo> infos_;  // Session::ForEachCounter's entries, once seen
  std::map<std::string, Totals> by_name_;  // the raw name bytes; at most max_names_
  std::unique_ptr<Totals> other_;
  // Sessions retired that a render may still find in its snapshot of the list (taken under mu_);
  // pruned when a snapshot no longer has them, and bounded: the server takes a session off its
  // list right after retiring it.
  std::unordered_set<uint64_t> retired_ids_;
};

std::string RenderMetrics(const ServerView& server, const std::string& version,
                          ClientSeries& clients);

}  // namespace engram
