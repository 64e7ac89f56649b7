// The engram_* metrics families (metrics_text.h).
#include "daemon/ops/metrics_text.h"

#include <string_view>

#include "absl/strings/str_format.h"
#include "daemon/ops/cgroup_memory.h"
#include "daemon/ops/escape.h"
#include "daemon/ops/metrics.h"
#include "engram/protocol.h"
#include "protocol/clock.h"

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

void AddSession(const Session& session, metrics::Exposition& e) {
  // The client chose its name: EscapeLabel escapes it once, as it writes the label; bytes that
  // are not UTF-8 (which a label cannot hold) are also given exactly in client_hex.
  metrics::Labels l = {{"client", session.name().empty() ? "-" : Utf8Text(session.name())},
                       {"session", std::to_string(session.id())}};
  if (!IsValidUtf8(session.name())) l.emplace_back("client_hex", HexBytes(session.name()));
  session.ForEachCounter([&](const SessionCounterInfo& c, uint64_t v) {
    if (*c.metric != '\0') AddCounterSample(c, l, double(v), e);
  });
  const Session::Counters& c = session.counters;
  uint64_t buckets[64];
  for (size_t i = 0; i < 64; ++i) buckets[i] = c.latency_log2[i].load();
  e.Log2Histogram("engram_client_request_duration_seconds",
                  "Service time of a client's requests in the daemon", l, buckets, 64,
                  c.latency_sum_ns.load());
}

}  // namespace

std::string RenderMetrics(const ServerView& server, const std::string& version) {
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
  for (const auto& session : sessions) AddSession(*session, e);
  server.AddStoreMetrics(&e);
  AppendMemoryMetrics(e, ReadMemoryReport(), server.config().memory_plan);
  return e.Text();
}

}  // namespace engram
