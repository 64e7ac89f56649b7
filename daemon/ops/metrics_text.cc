// The engram_* metrics families (metrics_text.h).
#include "daemon/ops/metrics_text.h"

#include <algorithm>
#include <string_view>

#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "base/escape.h"
#include "daemon/ops/cgroup_memory.h"
#include "daemon/ops/metrics.h"
#include "engram/protocol.h"

namespace engram {
namespace {

void AddTables(const ServerView& server, metrics::Exposition& e) {
  const auto tables = server.tables();
  e.Gauge("engram_tables", "Tables served", {}, double(tables.size()));
  for (size_t i = 0; i < tables.size(); ++i) {
    const Table& t = *tables[i];
    const metrics::Labels l = {{"table", std::to_string(t.layer_id())}};
    e.Gauge("engram_table_rows", "Rows of the table's logical row space", l, double(t.num_rows()));
    e.Gauge("engram_table_covered_rows", "Rows this copy of the table serves", l,
            double(t.covered().size()));
    e.Gauge("engram_table_bytes", "Row bytes the table holds", l, double(t.data_bytes()));
    e.Gauge("engram_table_serving",
            "1 while the table serves; 0 once one of its files changed after it was validated", l,
            server.TableHealth(i).ok() ? 1 : 0);
  }
}

void AddEngine(const ServerView& server, metrics::Exposition& e) {
  for (const TableGatherStats& t : server.EngineStats()) {
    const metrics::Labels l = {{"table", std::to_string(t.layer_id)}};
    ForEachGatherCounter(t, [&](const GatherCounterInfo& c, uint64_t v) {
      e.Counter(c.metric, c.help, l, double(v));
    });
    e.Gauge("engram_gather_nowait_enabled", "1 while the adaptive policy runs the NOWAIT pass", l,
            t.nowait_enabled ? 1 : 0);
    e.Log2Histogram("engram_gather_batch_duration_seconds", "Latency of one gather batch", l,
                    t.latency_buckets.data(), t.latency_buckets.size(), t.latency_sum_ns);
  }
}

// A counter's family and the label its metric spec may end in: "name{key=value}".
void AddCounterSample(const SessionCounterInfo& c, metrics::Labels labels, double value,
                      metrics::Exposition& e) {
  std::string_view name = c.metric;
  if (const size_t brace = name.find('{'); brace != std::string_view::npos) {
    const std::string_view label = name.substr(brace + 1, name.size() - brace - 2);
    const size_t eq = label.find('=');
    labels.emplace_back(std::string(label.substr(0, eq)), std::string(label.substr(eq + 1)));
    name = name.substr(0, brace);
  }
  if (c.grows) {
    e.Counter(std::string(name), c.help, labels, value);
  } else {
    e.Gauge(std::string(name), c.help, labels, value);
  }
}

// The labels of a client name's series: the name escaped once (EscapeLabel, as it writes the
// label); bytes that are not UTF-8, which a label cannot hold, are also given in client_hex.
metrics::Labels ClientLabels(const std::string& name) {
  metrics::Labels l = {{"client", name.empty() ? "-" : Utf8Text(name)}};
  if (!IsValidUtf8(name)) l.emplace_back("client_hex", HexBytes(name));
  return l;
}

}  // namespace

ClientSeries::Totals& ClientSeries::SeriesOf(const std::string& name) {
  if (auto it = by_name_.find(name); it != by_name_.end()) return it->second;
  if (by_name_.size() >= max_names_) {
    // The name idle longest gives its slot to one connected now; none does while every name
    // has a session connected.
    auto idle = by_name_.end();
    for (auto it = by_name_.begin(); it != by_name_.end(); ++it) {
      if (it->second.sessions == 0 &&
          (idle == by_name_.end() || it->second.idle_since_ns < idle->second.idle_since_ns)) {
        idle = it;
      }
    }
    if (idle != by_name_.end()) by_name_.erase(idle);
  }
  // A client that names itself "other" shares the series of that name rather than doubling it.
  if (by_name_.size() < max_names_ && name != "other") {
    Totals& t = by_name_[name];
    t.labels = ClientLabels(name);
    return t;
  }
  if (other_ == nullptr) {
    other_ = std::make_unique<Totals>();
    other_->labels = {{"client", "other"}};
  }
  return *other_;
}

ClientSeries::Totals& ClientSeries::SeriesFor(const Session& session, uint64_t now_ns) {
  if (auto it = series_of_.find(session.id()); it != series_of_.end()) return *it->second;
  Totals& series = SeriesOf(session.name());
  ++series.sessions;
  series.idle_since_ns = now_ns;
  series_of_[session.id()] = &series;
  return series;
}

void ClientSeries::Ended(Totals* series, uint64_t now_ns) {
  if (series->sessions > 0) --series->sessions;
  series->idle_since_ns = now_ns;
}

void ClientSeries::ExpireIdle(uint64_t now_ns) {
  std::erase_if(by_name_, [&](const auto& entry) {
    const Totals& t = entry.second;
    return t.sessions == 0 && now_ns - t.idle_since_ns >= kIdleRetentionNs;
  });
}

void ClientSeries::Add(const Session& session, Totals* totals) {
  const bool first = infos_.empty();
  size_t i = 0;
  session.ForEachCounter([&](const SessionCounterInfo& c, uint64_t v) {
    if (first) infos_.push_back(c);  // the same entries, in the same order, for every session
    if (totals->counters.size() <= i) totals->counters.resize(i + 1);
    if (c.grows) totals->counters[i] += v;
    ++i;
  });
  for (size_t b = 0; b < 64; ++b) totals->latency[b] += session.counters.latency_log2[b].load();
  totals->latency_sum_ns += session.counters.latency_sum_ns.load();
}

void ClientSeries::Retire(const Session& session) {
  std::lock_guard lock(mu_);
  const uint64_t now = NowNs();
  Totals& series = SeriesFor(session, now);
  Add(session, &series);
  Ended(&series, now);
  series_of_.erase(session.id());
  if (retired_ids_.size() >= 4096) retired_ids_.clear();
  retired_ids_.insert(session.id());
}

void ClientSeries::Append(const ServerView& server, metrics::Exposition& e) {
  std::lock_guard lock(mu_);
  const uint64_t now = NowNs();
  ExpireIdle(now);
  std::vector<std::shared_ptr<Session>> live = server.Sessions();
  // In the order they connected: while slots are short, the sessions that came first get them.
  std::sort(live.begin(), live.end(),
            [](const auto& a, const auto& b) { return a->id() < b->id(); });
  // Every series' ended sessions, plus its live ones; the live ones' gauges (requests in flight).
  // A retired session's counts are in its series already.
  std::map<const Totals*, Totals> sums;
  std::map<const Totals*, std::vector<uint64_t>> gauges;
  std::unordered_set<uint64_t> listed;
  for (const auto& session : live) {
    listed.insert(session->id());
    if (retired_ids_.count(session->id()) != 0) continue;
    Totals& series = SeriesFor(*session, now);
    const auto it = sums.try_emplace(&series, series).first;
    std::vector<uint64_t>& g = gauges[&series];
    size_t i = 0;
    session->ForEachCounter([&](const SessionCounterInfo& c, uint64_t v) {
      if (g.size() <= i) g.resize(i + 1);
      if (!c.grows) g[i] += v;
      ++i;
    });
    Add(*session, &it->second);
  }
  // A session gone from the list without being retired (its counts are lost) no longer holds
  // its series.
  std::erase_if(series_of_, [&](const auto& entry) {
    if (listed.count(entry.first) != 0) return false;
    Ended(entry.second, now);
    return true;
  });
  std::erase_if(retired_ids_, [&](uint64_t id) { return listed.count(id) == 0; });
  std::vector<const Totals*> all;
  for (const auto& [name, t] : by_name_) all.push_back(&t);
  if (other_ != nullptr) all.push_back(other_.get());
  for (const Totals* series : all) {
    const auto at = sums.find(series);
    const Totals& t = at != sums.end() ? at->second : *series;
    const auto g = gauges.find(series);
    AppendSeries(t, g != gauges.end() ? &g->second : nullptr, e);
  }
}

void ClientSeries::AppendSeries(const Totals& t, const std::vector<uint64_t>* gauges,
                                metrics::Exposition& e) const {
  size_t i = 0;
  for (const SessionCounterInfo& c : infos_) {
    const uint64_t v = c.grows ? (i < t.counters.size() ? t.counters[i] : 0)
                               : (gauges != nullptr && i < gauges->size() ? (*gauges)[i] : 0);
    if (*c.metric != '\0') AddCounterSample(c, t.labels, double(v), e);
    ++i;
  }
  e.Log2Histogram("engram_client_request_duration_seconds",
                  "Service time of the requests of a client name's sessions in the daemon",
                  t.labels, t.latency, 64, t.latency_sum_ns, metrics::kClientEdges);
}

std::string RenderMetrics(const ServerView& server, const std::string& version,
                          ClientSeries& clients) {
  metrics::Exposition e;
  e.Gauge("engram_up", "1 while engramd serves", {}, server.draining() ? 0 : 1);
  e.Gauge("engram_build_info", "engramd version and protocol",
          {{"version", version},
           {"protocol", absl::StrFormat("%u.%u", ENGRAM_PROTOCOL_MAJOR, ENGRAM_PROTOCOL_MINOR)}},
          1);
  e.Gauge("engram_uptime_seconds", "Seconds since engramd started serving", {},
          double(NowNs() - server.start_ns()) / 1e9);
  AddTables(server, e);
  AddEngine(server, e);
  const std::vector<std::shared_ptr<Session>> sessions = server.Sessions();
  e.Gauge("engram_clients", "Connected client sessions", {}, double(sessions.size()));
  e.Gauge("engram_arena_bytes", "Shared memory handed to all sessions", {},
          double(server.total_arena_bytes()));
  e.Counter("engram_poller_pace_windows_total",
            "Windows the poller spun through ahead of an expected burst of requests", {},
            double(server.pace_windows()));
  e.Counter("engram_poller_pace_windows_caught_total",
            "Pace windows the expected burst of requests came in", {},
            double(server.pace_windows_caught()));
  e.Counter("engram_poller_spin_seconds_total",
            "Time the poller spun over the submission rings finding no work", {},
            double(server.poller_spin_ns()) / 1e9);
  e.Counter("engram_request_threads_spin_seconds_total",
            "Time the request threads spun waiting for requests, all together", {},
            double(server.request_threads_spin_ns()) / 1e9);
  e.Gauge("engram_poll_cores_held",
          "Cores polling mode keeps spinning now: engine.poll_cores while clients are active, "
          "else 0",
          {}, server.poll_holding() ? double(server.config().poll.hold_cores) : 0.0);
  clients.Append(server, e);
  server.AddStoreMetrics(&e);
  AppendMemoryMetrics(e, ReadMemoryReport(), server.config().memory_plan);
  metrics::AppendProcessMetrics(e);
  return e.Text();
}

}  // namespace engram
