// The control commands and their dispatch table (control_commands.h).
#include "daemon/ops/control_commands.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/clock.h"
#include "base/escape.h"
#include "daemon/ops/cgroup_memory.h"
#include "daemon/ops/metrics_text.h"
#include "daemon/ops/residency.h"
#include "store/store_config.h"

namespace engram {
namespace {

using nlohmann::json;

const char* StateName(bool draining) { return draining ? "stopping" : "serving"; }

// The effective rules: root and the daemon's own uid are in both uid lists, as they are
// always admitted and always administrators.
json AccessJson(CommandContext& c) {
  const ServerConfig& config = c.server.config();
  const uid_t own = c.server.own_uid();
  return {{"allow_uids", AlwaysAndListed(own, config.allow_uids)},
          {"allow_gids", config.allow_gids},
          {"may_connect", DescribeAdmitted(config, own)},
          {"admin_uids", AlwaysAndListed(own, config.admin_uids)},
          {"admin_gids", config.admin_gids},
          {"admin_commands", ControlCommandNames(true)},
          {"administrators", DescribeAdministrators(config, own)},
          {"peer_uid", c.session->peer().uid},
          {"peer_is_administrator", c.peer_is_administrator}};
}

CommandResult Status(CommandContext& c) {
  const ServerView& s = c.server;
  json out;
  out["state"] = StateName(s.draining());
  out["version"] = c.version;
  out["protocol"] = absl::StrFormat("%u.%u", ENGRAM_PROTOCOL_MAJOR, ENGRAM_PROTOCOL_MINOR);
  out["pid"] = getpid();
  out["uptime_seconds"] = double(NowNs() - s.start_ns()) / 1e9;
  SetJsonText(&out, "socket", s.config().socket_path);
  out["tables"] = s.tables().size();
  size_t changed = 0;
  for (size_t i = 0; i < s.tables().size(); ++i) changed += s.TableHealth(i).ok() ? 0 : 1;
  out["tables_not_serving"] = changed;
  out["clients"] = s.Sessions().size();
  out["max_clients"] = s.config().limits.max_clients;
  out["requests_in_flight"] = s.requests_in_flight();
  out["pace"] = {{"windows", s.pace_windows()}, {"caught", s.pace_windows_caught()}};
  out["poll"] = {{"cores", s.config().poll.hold_cores},
                 {"idle_ms", s.config().poll.hold_idle_ns / 1'000'000},
                 {"holding", s.poll_holding()},
                 {"poller_spin_seconds", double(s.poller_spin_ns()) / 1e9},
                 {"request_threads_spin_seconds", double(s.request_threads_spin_ns()) / 1e9}};
  out["arena_bytes"] = s.total_arena_bytes();
  out["watchdog_usec"] = c.watchdog_ns / 1000;
  out["log_level"] = c.log_level;
  uint64_t rows = 0, batches = 0;
  for (const TableGatherStats& t : s.EngineStats()) {
    rows += t.rows_requested;
    batches += t.batches;
  }
  out["rows_served"] = rows;
  out["batches"] = batches;
  out["memory"] = MemoryReportJson(ReadMemoryReport(), s.config().memory_plan);
  out["access"] = AccessJson(c);
  return out;
}

absl::StatusOr<json> ResidencyJson(const Table& t) {
  uint64_t total = 0, resident = 0, evicted = 0;
  const char* method = "cachestat";
  for (const FileRange& r : RangesOf(t, t.covered().begin, t.covered().end)) {
    absl::StatusOr<Residency> res = ResidencyOf(r.fd, *r.path, r.offset, r.bytes);
    if (!res.ok()) return res.status();
    total += r.bytes;
    resident += res->resident_bytes;
    evicted += res->recently_evicted_bytes;
    if (std::string_view(res->method) == "mincore") method = res->method;
  }
  return json{{"resident_bytes", resident},
              {"resident_fraction", total == 0 ? 0.0 : double(resident) / double(total)},
              {"recently_evicted_bytes", evicted},
              {"residency_method", method}};
}

CommandResult Tables(CommandContext& c) {
  const bool residency = !c.request.contains("residency") || c.request["residency"] == true;
  json tables = json::array();
  const auto all = c.server.tables();
  for (size_t i = 0; i < all.size(); ++i) {
    const Table& t = *all[i];
    json files = json::array();
    for (const TableFile& f : t.files()) files.push_back(Utf8Text(f.path));
    const absl::Status health = c.server.TableHealth(i);
    json j = {{"layer", t.layer_id()},
              {"rows", t.num_rows()},
              {"row_bytes", t.row_bytes()},
              {"layout", TableLayoutName(t.layout())},
              {"files", files},
              {"covered_begin", t.covered().begin},
              {"covered_end", t.covered().end},
              {"data_bytes", t.data_bytes()},
              {"serving", health.ok()}};
    SetJsonText(&j, "source", t.source());
    if (!health.ok()) j["problem"] = Utf8Text(std::string(health.message()));
    if (residency) {
      absl::StatusOr<json> r = ResidencyJson(t);
      if (!r.ok()) return r.status();
      j.update(*r);
    }
    tables.push_back(j);
  }
  return json{{"tables", tables}};
}

json EngineStatsJson(const TableGatherStats& s) {
  json j = {{"layer", s.layer_id},
            {"dedup_saved_rows", s.rows_requested - std::min(s.rows_requested, s.rows_unique)},
            {"nowait_supported", s.nowait_supported},
            {"nowait_enabled", s.nowait_enabled},
            {"recent_hit_rate", s.recent_hit_rate},
            {"read_mode", s.mode == ReadMode::kDirect ? "direct" : "buffered"},
            {"residue_path", s.residue_path},
            {"latency_p50_ns", s.LatencyPercentileNs(0.50)},
            {"latency_p99_ns", s.LatencyPercentileNs(0.99)},
            {"latency_p999_ns", s.LatencyPercentileNs(0.999)}};
  ForEachGatherCounter(s, [&](const GatherCounterInfo& c, uint64_t v) { j[c.json_key] = v; });
  return j;
}

// Who the session is, then every counter the daemon reports of it (Session::ForEachCounter).
json SessionJson(const Session& session) {
  json j = {{"session", session.id()}, {"pid", session.peer().pid}, {"uid", session.peer().uid}};
  session.ForEachCounter([&](const SessionCounterInfo& c, uint64_t v) { j[c.field] = v; });
  SetJsonText(&j, "name", session.name());
  return j;
}

CommandResult Stats(CommandContext& c) {
  json tables = json::array();
  for (const TableGatherStats& t : c.server.EngineStats()) tables.push_back(EngineStatsJson(t));
  json clients = json::array();
  for (const auto& session : c.server.Sessions()) clients.push_back(SessionJson(*session));
  return json{{"tables", tables},
              {"clients", clients},
              {"uptime_seconds", double(NowNs() - c.server.start_ns()) / 1e9}};
}

CommandResult Clients(CommandContext& c) {
  json clients = json::array();
  for (const auto& session : c.server.Sessions()) {
    Arena& arena = session->arena();
    json j = SessionJson(*session);
    j["gid"] = session->peer().gid;
    j["slots"] = arena.layout().slots;
    j["arena_bytes"] = arena.bytes();
    j["data_bytes"] = arena.data_bytes();
    clients.push_back(j);
  }
  return json{{"clients", clients}};
}

CommandResult Metrics(CommandContext& c) { return json{{"text", c.metrics_text()}}; }

absl::StatusOr<const Table*> FindTable(CommandContext& c) {
  const json& r = c.request;
  if (!r.contains("table") || !r["table"].is_number_unsigned()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s' needs \"table\": a layer id", c.command));
  }
  const uint64_t layer = r["table"];
  std::vector<uint32_t> layers;
  for (const auto& t : c.server.tables()) {
    if (t->layer_id() == layer) return t.get();
    layers.push_back(t->layer_id());
  }
  return absl::NotFoundError(absl::StrFormat("engramd serves no table for layer %u (it serves %s)",
                                             layer, absl::StrJoin(layers, ", ")));
}

absl::StatusOr<RowRange> RangeOf(CommandContext& c, const Table& t) {
  const json& r = c.request;
  RowRange range = t.covered();
  for (const auto& [key, field] : {std::pair{"begin", &range.begin}, {"end", &range.end}}) {
    if (!r.contains(key)) continue;
    if (!r[key].is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrFormat("bad \"%s\"", key));
    }
    *field = r[key];
  }
  if (range.begin >= range.end || range.begin < t.covered().begin || range.end > t.covered().end) {
    return absl::OutOfRangeError(
        absl::StrFormat("rows [%u, %u) are not inside the rows %s serves, [%u, %u)", range.begin,
                        range.end, EscapeBytes(t.Describe()), t.covered().begin, t.covered().end));
  }
  return range;
}

json StepJson(const Table& t, RowRange step, uint64_t bytes, uint64_t start_ns) {
  return {{"layer", t.layer_id()},
          {"begin", step.begin},
          {"end", step.end},
          {"bytes", bytes},
          {"seconds", double(NowNs() - start_ns) / 1e9}};
}

CommandResult Evict(CommandContext& c) {
  absl::StatusOr<const Table*> t = FindTable(c);
  if (!t.ok()) return t.status();
  absl::StatusOr<RowRange> range = RangeOf(c, **t);
  if (!range.ok()) return range.status();
  const uint64_t start = NowNs();
  const RowRange step = StepOf(**t, *range);
  absl::StatusOr<uint64_t> bytes = EvictRows(**t, step);  // fadvise: no waiting on the disk
  if (!bytes.ok()) return bytes.status();
  return StepJson(**t, step, *bytes, start);
}

// The tier of `t` as `engramctl tables` reports it: the row store names the tiers it serves;
// without a row store every table is of the storage tier.
std::string TierOf(CommandContext& c, const Table& t) {
  json out = {{"tables", json::array({json{{"layer", t.layer_id()}}})}};
  c.server.AddStoreControlFields("tables", &out);
  return out["tables"][0].value("tier", TierName(Tier::kStorage));
}

bool ReadDirect(CommandContext& c, const Table& t) {
  for (const TableGatherStats& s : c.server.EngineStats()) {
    if (s.layer_id == t.layer_id()) return s.mode == ReadMode::kDirect;
  }
  return false;
}

// OK when gathers on `t` read through the page cache, so that warming it helps them; else
// FailedPrecondition naming the table, its tier and what does help. On a machine whose GPU
// memory is its host memory (a DGX Spark), page cache nobody reads is memory the GPU lacks.
absl::Status CheckWarmHelps(CommandContext& c, const Table& t) {
  const std::string tier = TierOf(c, t);
  const uint32_t layer = t.layer_id();
  std::string why;
  if (tier == TierName(Tier::kResident)) {
    why = absl::StrFormat(
        "it is of the resident tier: its rows are served from engramd's memory once loaded "
        "(`engramctl load %u` loads it, `engramctl tables` shows how far)",
        layer);
  } else if (tier == TierName(Tier::kCache)) {
    why =
        "it is of the cache tier: the rows the row cache misses are read with O_DIRECT, past the "
        "page cache (a larger [memory] cache or budget raises the cache's hit rate)";
  } else if (ReadDirect(c, t)) {
    why =
        "it is of the storage tier read with O_DIRECT (tables.read_mode = \"direct\"), past "
        "the page cache";
  } else {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrFormat("not warming layer %u: %s; warming would only fill the page cache, which "
                      "no gather on it reads",
                      layer, why));
}

// The reads run on the page-cache worker: the control thread never waits on the disk.
CommandResult Warm(CommandContext& c) {
  absl::StatusOr<const Table*> t = FindTable(c);
  if (!t.ok()) return t.status();
  if (absl::Status s = CheckWarmHelps(c, **t); !s.ok()) return s;
  absl::StatusOr<RowRange> range = RangeOf(c, **t);
  if (!range.ok()) return range.status();
  const Table* table = *t;
  const RowRange step = StepOf(*table, *range);
  const uint64_t start = NowNs();
  auto reply = c.reply_later;
  const bool queued = c.worker.Post([table, step, start, reply] {
    absl::StatusOr<uint64_t> bytes = WarmRows(*table, step);
    if (!bytes.ok()) {
      reply(bytes.status());
    } else {
      reply(StepJson(*table, step, *bytes, start));
    }
  });
  if (!queued) {
    return absl::ResourceExhaustedError(
        "engramd is already warming as much as it queues; try again when a step finished");
  }
  return std::nullopt;
}

// A resident table's load into memory: {"table": L, "action": "start" | "cancel" | "status"}.
// The store's loader thread reads; the reply is the table's load state at once.
CommandResult Load(CommandContext& c) {
  absl::StatusOr<const Table*> t = FindTable(c);
  if (!t.ok()) return t.status();
  const json& r = c.request;
  std::string action = "start";
  if (r.contains("action")) {
    if (!r["action"].is_string()) {
      return absl::InvalidArgumentError(
          "'load' needs \"action\": \"start\", \"cancel\" or \"status\"");
    }
    action = r["action"].get<std::string>();
  }
  ServerView::LoadAction a;
  if (action == "start") {
    a = ServerView::LoadAction::kStart;
  } else if (action == "cancel") {
    a = ServerView::LoadAction::kCancel;
  } else if (action == "status") {
    a = ServerView::LoadAction::kStatus;
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'load' has no action \"%s\" (start, cancel, status)", EscapeBytes(action)));
  }
  absl::StatusOr<ResidentLoadStatus> s = c.server.ResidentLoad((*t)->layer_id(), a);
  if (!s.ok()) return s.status();
  json out = {{"layer", s->layer},
              {"state", LoadStateName(s->state)},
              {"rows_loaded", s->rows_loaded},
              {"rows", s->rows},
              {"bytes", s->bytes}};
  if (!s->error.empty()) out["error"] = Utf8Text(s->error);
  return out;
}

// One setting's value as JSON: numbers (byte sizes in bytes), text (escaped once, by the JSON
// writer) and lists of either. `value` is the storage the row's Kind names, or, for the server's
// value of a setting it reads resolved (`resolved`), the ids it resolved to.
json ValueJson(const Setting& row, const void* value, bool resolved) {
  using Kind = Setting::Kind;
  switch (row.kind) {
    case Kind::kUint32:
      return *static_cast<const uint32_t*>(value);
    case Kind::kUint64:
    case Kind::kBytes:
    case Kind::kBytesOrZero:
      return *static_cast<const uint64_t*>(value);
    case Kind::kString:
      return Utf8Text(*static_cast<const std::string*>(value));
    case Kind::kBool:
      return *static_cast<const bool*>(value);
    case Kind::kIds:
      return *static_cast<const std::vector<uint32_t>*>(value);
    case Kind::kStrings:
      if (resolved) return *static_cast<const std::vector<uint32_t>*>(value);
      json list = json::array();
      for (const std::string& v : *static_cast<const std::vector<std::string>*>(value)) {
        list.push_back(Utf8Text(v));
      }
      return list;
  }
  return nullptr;
}

// engramctl config: every setting in the order of Settings(), with the value engramd runs with
// (where the server reads a value of its own, that one: access.allow_users as the uids it admits)
// and whether a SIGHUP changes it.
CommandResult Config(CommandContext& c) {
  DaemonSettings running = c.running_settings();
  json settings = json::array();
  for (const Setting& row : Settings()) {
    const bool server = row.server_field != nullptr;
    const void* value = server ? row.server_field(&running.server) : row.At(&running);
    settings.push_back({{"key", row.key},
                        {"value", ValueJson(row, value, server && row.field != nullptr)},
                        {"live", row.live()}});
  }
  return json{{"settings", settings}};
}

constexpr CommandSpec kCommands[] = {
    {"status", nullptr, Status},
    {"tables", nullptr, Tables},
    {"stats", nullptr, Stats},
    {"clients", nullptr, Clients},
    {"metrics", nullptr, Metrics},
    {"config", nullptr, Config},
    {"warm", "it fills the page cache every client shares", Warm},
    {"evict", "it drops table pages that every client reads from the page cache", Evict},
    {"load", "it fills memory of the node's row store that every client shares", Load},
};

}  // namespace

std::span<const CommandSpec> ControlCommands() { return kCommands; }

const CommandSpec* FindControlCommand(const std::string& name) {
  for (const CommandSpec& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

std::vector<std::string> ControlCommandNames(bool admin_only) {
  std::vector<std::string> names;
  for (const CommandSpec& c : kCommands) {
    if (!admin_only || c.admin_reason != nullptr) names.push_back(c.name);
  }
  return names;
}

}  // namespace engram
