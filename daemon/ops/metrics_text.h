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
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/ops/metrics.h"
#include "daemon/server/server_view.h"

namespace engram {

// The engram_client_* series, one set per client name rather than per session, so that
// reconnecting clients do not multiply series: the sessions of one name are added up, and a
// name's counters keep what its ended sessions counted. At most `max_names` names hold series
// of their own, and they are the names of the clients connected now: a name whose sessions have
// all ended keeps its series for kIdleRetentionNs, or until a newly connected name needs its
// slot (the name idle longest gives it up), and then its series ends. Only while every slot
// belongs to a name with a session connected are the sessions of further names added up under
// client="other". A session keeps the series it was first counted in for its whole life, so no
// series ever goes down. Per-session detail is in `engramctl clients`.
class ClientSeries {
 public:
  static constexpr size_t kMaxNames = 32;
  // Longer than the rate() windows of the dashboard and the alert rules, so that a client's last
  // requests still show in them after it disconnects.
  static constexpr uint64_t kIdleRetentionNs = 15ull * 60 * 1'000'000'000;
  explicit ClientSeries(size_t max_names = kMaxNames) : max_names_(max_names) {}

  // A session that ends: its counters stay in its series' totals. Call it while the session is
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
    size_t sessions = 0;         // sessions counted here that have not ended
    uint64_t idle_since_ns = 0;  // when `sessions` last fell to 0
  };
  // The series a session is counted in, chosen when it is first seen; mu_ held.
  Totals& SeriesFor(const Session& session, uint64_t now_ns);
  // The series of a name new to a session: its own, a free slot, an idle name's slot, or
  // "other"; mu_ held.
  Totals& SeriesOf(const std::string& name);
  // Ends the series of names idle for kIdleRetentionNs; mu_ held.
  void ExpireIdle(uint64_t now_ns);
  // A session counted in `series` has ended; mu_ held.
  static void Ended(Totals* series, uint64_t now_ns);
  // Adds the session's counters to `totals`; mu_ held.
  void Add(const Session& session, Totals* totals);
  // Appends one series' samples: `t`'s counters, `gauges` (its live sessions', or none).
  void AppendSeries(const Totals& t, const std::vector<uint64_t>* gauges,
                    metrics::Exposition& e) const;

  const size_t max_names_;
  mutable std::mutex mu_;
  std::vector<SessionCounterInfo> infos_;  // Session::ForEachCounter's entries, once seen
  std::map<std::string, Totals> by_name_;  // the raw name bytes; at most max_names_
  std::unique_ptr<Totals> other_;
  // Live sessions and the series each is counted in (pointers into by_name_ or other_: a name
  // with a session here is never erased).
  std::unordered_map<uint64_t, Totals*> series_of_;
  // Sessions retired that a render may still find in its snapshot of the list (taken under mu_);
  // pruned when a snapshot no longer has them, and bounded: the server takes a session off its
  // list right after retiring it.
  std::unordered_set<uint64_t> retired_ids_;
};

std::string RenderMetrics(const ServerView& server, const std::string& version,
                          ClientSeries& clients);

}  // namespace engram
