// Control requests, metrics, systemd notifications and reloads of engramd (control.h).
#include "daemon/control.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/cgroup_memory.h"
#include "daemon/clock.h"
#include "daemon/log.h"
#include "daemon/notify.h"
#include "daemon/residency.h"
#include "daemon/server.h"

namespace engram {
namespace {

using nlohmann::json;

constexpr int kSchemaVersion = 1;
// Most bytes one warm or evict request touches: keeps the control thread's pause short and
// gives engramctl a progress step.
constexpr uint64_t kMaxStepBytes = uint64_t{64} << 20;

// The byte ranges of the files of `table` that hold rows [begin, end).
struct FileRange {
  int fd;
  const std::string* path;
  uint64_t offset;
  uint64_t bytes;
};
std::vector<FileRange> RangesOf(const Table& table, uint64_t begin, uint64_t end) {
  std::vector<FileRange> out;
  for (const RowPart& p : table.parts()) {
    const TableFile& f = table.files()[p.file];
    const uint64_t a = p.FileOffset(begin), b = p.FileOffset(end);
    out.push_back({f.fd, &f.path, a, std::min(b, f.size) - std::min(a, f.size)});
  }
  return out;
}

// Every control command, and why it needs an administrator (nullptr: any peer the socket
// admits may run it). The reading ones only report; warm and evict change the page cache that
// every client's gathers depend on, so on a shared node they are the operators' to run.
struct CommandSpec {
  const char* name;
  const char* admin_reason;
};
constexpr CommandSpec kCommands[] = {
    {"status", nullptr},
    {"tables", nullptr},
    {"stats", nullptr},
    {"clients", nullptr},
    {"metrics", nullptr},
    {"warm", "it fills the page cache every client shares"},
    {"evict", "it drops table pages that every client reads from the page cache"},
};

const CommandSpec* FindCommand(const std::string& name) {
  for (const CommandSpec& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

// The command names in table order: all, or only those that need an administrator.
std::vector<std::string> CommandNames(bool admin_only) {
  std::vector<std::string> names;
  for (const CommandSpec& c : kCommands) {
    if (!admin_only || c.admin_reason != nullptr) names.push_back(c.name);
  }
  return names;
}

// A refused peer's uid is logged at most once in this long; the refusals in between are counted.
constexpr uint64_t kRefusalLogWindowNs = 60'000'000'000;
// Uids remembered for that. Past it, those not logged within the window are forgotten, and if
// that is not enough, all (a burst of refusals from that many uids is logged again).
constexpr size_t kMaxRefusalUids = 4096;

const char* StateName(bool draining) { return draining ? "stopping" : "serving"; }

json EngineStatsJson(const TableGatherStats& s) {
  return {{"layer", s.layer_id},
          {"batches", s.batches},
          {"rows_requested", s.rows_requested},
          {"rows_unique", s.rows_unique},
          {"dedup_saved_rows", s.rows_requested - std::min(s.rows_requested, s.rows_unique)},
          {"dedup_copies", s.dedup_copies},
          {"read_calls", s.read_calls},
          {"syscalls", s.syscalls},
          {"nowait_hits", s.nowait_hits},
          {"nowait_eagain", s.nowait_eagain},
          {"nowait_zero", s.nowait_zero},
          {"nowait_supported", s.nowait_supported},
          {"nowait_enabled", s.nowait_enabled},
          {"nowait_probes", s.probes},
          {"recent_hit_rate", s.recent_hit_rate},
          {"partial_reads", s.partial_reads},
          {"eintr_retries", s.eintr_retries},
          {"uring_reads", s.uring_reads},
          {"pool_reads", s.pool_reads},
          {"direct_reads", s.direct_reads},
          {"fixed_reads", s.fixed_reads},
          {"ring_failures", s.ring_failures},
          {"ring_resets", s.ring_resets},
          {"bytes_read", s.bytes_read},
          {"errors", s.errors},
          {"read_mode", s.mode == ReadMode::kDirect ? "direct" : "buffered"},
          {"residue_path", s.residue_path},
          {"latency_p50_ns", s.LatencyPercentileNs(0.50)},
          {"latency_p99_ns", s.LatencyPercentileNs(0.99)},
          {"latency_p999_ns", s.LatencyPercentileNs(0.999)}};
}

}  // namespace

std::vector<std::string> AdminCommandNames() { return CommandNames(true); }

Control::Control(Server* server) : server_(server) {}
Control::~Control() = default;

void Control::Reply(Session& session, uint32_t request_id, const std::string& text) {
  std::vector<uint8_t> out(sizeof(engram_msg_header));
  int memfd = -1;
  if (sizeof(engram_msg_header) + text.size() <= ENGRAM_MSG_MAX_BYTES) {
    out.insert(out.end(), text.begin(), text.end());
  } else {
    // Too long for one message: the reply travels in a sealed memfd.
    memfd = memfd_create("engramd-reply", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    bool ok = memfd >= 0;
    size_t done = 0;
    while (ok && done < text.size()) {
      const ssize_t n = write(memfd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      ok = n > 0;
      if (ok) done += static_cast<size_t>(n);
    }
    if (ok) {
      ok = fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) == 0;
    }
    if (!ok) {
      if (memfd >= 0) close(memfd);
      std::vector<uint8_t> e = protocol::EncodeError(
          ENGRAM_STATUS_RESOURCE_EXHAUSTED,
          absl::StrFormat("cannot hand over a %u-byte reply: %s", text.size(), strerror(errno)),
          request_id);
      send(session.socket_fd(), e.data(), e.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      return;
    }
  }
  engram_msg_header h;
  protocol::FillHeader(&h, ENGRAM_MSG_CONTROL_REPLY, static_cast<uint32_t>(out.size()), request_id);
  memcpy(out.data(), &h, sizeof(h));
  (void)protocol::SendMessage(session.socket_fd(), out.data(), out.size(), &memfd,
                              memfd >= 0 ? 1 : 0);
  if (memfd >= 0) close(memfd);
}

void Control::Handle(Session& session, const engram_msg_header& header, const uint8_t* body,
                     size_t body_bytes) {
  absl::StatusOr<std::string> reply =
      Run(session, std::string(reinterpret_cast<const char*>(body), body_bytes));
  if (!reply.ok()) {
    uint64_t suppressed = 0;
    // Permission refusals were logged by Run, per uid.
    if (reply.status().code() != absl::StatusCode::kPermissionDenied &&
        server_->garbage_log_.Allow(NowNs(), &suppressed)) {
      log::Info("{}: control request refused: {} ({} similar messages suppressed)",
                session.Describe(), std::string(reply.status().message()), suppressed);
    }
    std::vector<uint8_t> e =
        protocol::EncodeError(static_cast<int32_t>(reply.status().code()),
                              std::string(reply.status().message()), header.request_id);
    send(session.socket_fd(), e.data(), e.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    return;
  }
  Reply(session, header.request_id, *reply);
}

bool Control::PeerIsAdministrator(const Session& session) const {
  const PeerInfo& peer = session.peer();
  const Server& s = *server_;
  std::vector<gid_t> groups;
  if (!s.config_.admin_gids.empty()) groups = PeerGroups(session.socket_fd());
  return IsAdministrator(s.config_, s.own_uid_, peer.uid, peer.gid, groups);
}

void Control::LogRefusal(const Session& session, const std::string& command) {
  const uint64_t now = NowNs();
  const uid_t uid = session.peer().uid;
  auto it = refusals_.find(uid);
  if (it == refusals_.end()) {
    if (refusals_.size() >= kMaxRefusalUids) {
      std::erase_if(refusals_,
                    [&](const auto& e) { return now - e.second.logged_ns >= kRefusalLogWindowNs; });
    }
    if (refusals_.size() >= kMaxRefusalUids) refusals_.clear();
    it = refusals_.emplace(uid, Refusals{}).first;
  }
  Refusals& r = it->second;
  uint64_t suppressed = 0;
  if ((r.logged_ns != 0 && now - r.logged_ns < kRefusalLogWindowNs) ||
      !refusal_log_.Allow(now, &suppressed)) {
    ++r.unlogged;
    return;
  }
  log::Warning(
      "{}: refused '{}': uid {} is not an engramd administrator (access.admin_uids / "
      "admin_gids){}",
      session.Describe(), command, uid,
      r.unlogged == 0 ? ""
                      : fmt::format("; {} more refusal(s) of uid {} since the last such line",
                                    r.unlogged, uid));
  r.logged_ns = now;
  r.unlogged = 0;
}

absl::StatusOr<std::string> Control::Run(Session& session, const std::string& request_text) {
  json request = json::parse(request_text, nullptr, /*allow_exceptions=*/false);
  if (!request.is_object() || !request.contains("command") || !request["command"].is_string()) {
    return absl::InvalidArgumentError(
        "a control request is a JSON object with a string \"command\"");
  }
  const std::string command = request["command"];
  Server& s = *server_;
  const CommandSpec* spec = FindCommand(command);
  if (spec == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("unknown control command '%s' (%s)", command,
                                                      absl::StrJoin(CommandNames(false), ", ")));
  }
  if (spec->admin_reason != nullptr && !PeerIsAdministrator(session)) {
    LogRefusal(session, command);
    const PeerInfo& peer = session.peer();
    return absl::PermissionDeniedError(absl::StrFormat(
        "'%s' needs an engramd administrator because %s; uid %u (gid %u, pid %d) is not one "
        "(administrators: %s). To allow it, add the uid to [access] admin_uids, or one of its "
        "groups to admin_gids, in engramd's configuration and reload (systemctl reload "
        "engramd), or run it as root",
        command, spec->admin_reason, peer.uid, peer.gid, peer.pid,
        DescribeAdministrators(s.config_, s.own_uid_)));
  }
  json out = {{"schema_version", kSchemaVersion}, {"command", command}};
  auto find_table = [&](const json& r) -> absl::StatusOr<const Table*> {
    if (!r.contains("table") || !r["table"].is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("'%s' needs \"table\": a layer id", command));
    }
    const uint32_t layer = r["table"];
    for (const auto& t : s.tables_) {
      if (t->layer_id() == layer) return t.get();
    }
    std::vector<uint32_t> layers;
    for (const auto& t : s.tables_) layers.push_back(t->layer_id());
    return absl::NotFoundError(absl::StrFormat(
        "engramd serves no table for layer %u (it serves %s)", layer, absl::StrJoin(layers, ", ")));
  };
  auto range_of = [&](const json& r, const Table& t) -> absl::StatusOr<RowRange> {
    RowRange range = t.covered();
    if (r.contains("begin")) {
      if (!r["begin"].is_number_unsigned()) return absl::InvalidArgumentError("bad \"begin\"");
      range.begin = r["begin"];
    }
    if (r.contains("end")) {
      if (!r["end"].is_number_unsigned()) return absl::InvalidArgumentError("bad \"end\"");
      range.end = r["end"];
    }
    if (range.begin >= range.end || range.begin < t.covered().begin ||
        range.end > t.covered().end) {
      return absl::OutOfRangeError(
          absl::StrFormat("rows [%u, %u) are not inside the rows %s serves, [%u, %u)", range.begin,
                          range.end, t.Describe(), t.covered().begin, t.covered().end));
    }
    return range;
  };

  if (command == "status") {
    std::lock_guard<std::mutex> lock(s.sessions_mutex_);
    out["state"] = StateName(s.draining_.load());
    out["version"] = version_;
    out["protocol"] = absl::StrFormat("%u.%u", ENGRAM_PROTOCOL_MAJOR, ENGRAM_PROTOCOL_MINOR);
    out["pid"] = getpid();
    out["uptime_seconds"] = double(NowNs() - s.start_ns_) / 1e9;
    out["socket"] = s.config_.socket_path;
    out["tables"] = s.tables_.size();
    out["clients"] = s.sessions_.size();
    out["max_clients"] = s.config_.limits.max_clients;
    out["requests_in_flight"] = s.inflight_total_.load();
    out["arena_bytes"] = s.total_arena_bytes_;
    out["watchdog_usec"] = watchdog_ns_ / 1000;
    out["log_level"] = log_level_;
    uint64_t rows = 0, batches = 0;
    for (const TableGatherStats& t : s.engine_->Stats()) {
      rows += t.rows_requested;
      batches += t.batches;
    }
    out["rows_served"] = rows;
    out["batches"] = batches;
    out["memory"] = MemoryReportJson(ReadMemoryReport(), s.config_.memory_budget);
    // Who may do what, and what the asking peer may.
    std::vector<uid_t> admin_uids = s.config_.admin_uids;
    admin_uids.push_back(0);
    admin_uids.push_back(s.own_uid_);
    std::sort(admin_uids.begin(), admin_uids.end());
    admin_uids.erase(std::unique(admin_uids.begin(), admin_uids.end()), admin_uids.end());
    std::vector<uid_t> allow_uids = s.config_.allow_uids;
    if (allow_uids.empty()) allow_uids = {s.own_uid_, 0};
    out["access"] = {{"allow_uids", allow_uids},
                     {"allow_gids", s.config_.allow_gids},
                     {"admin_uids", admin_uids},
                     {"admin_gids", s.config_.admin_gids},
                     {"admin_commands", CommandNames(true)},
                     {"administrators", DescribeAdministrators(s.config_, s.own_uid_)},
                     {"peer_uid", session.peer().uid},
                     {"peer_is_administrator", PeerIsAdministrator(session)}};
  } else if (command == "tables") {
    const bool residency = !request.contains("residency") || request["residency"] == true;
    json tables = json::array();
    for (const auto& t : s.tables_) {
      json files = json::array();
      for (const TableFile& f : t->files()) files.push_back(f.path);
      json j = {{"layer", t->layer_id()},
                {"rows", t->num_rows()},
                {"row_bytes", t->row_bytes()},
                {"layout", TableLayoutName(t->layout())},
                {"source", t->source()},
                {"files", files},
                {"covered_begin", t->covered().begin},
                {"covered_end", t->covered().end},
                {"data_bytes", t->data_bytes()}};
      if (residency) {
        uint64_t total = 0, resident = 0, evicted = 0;
        const char* method = "cachestat";
        for (const FileRange& r : RangesOf(*t, t->covered().begin, t->covered().end)) {
          absl::StatusOr<Residency> res = ResidencyOf(r.fd, *r.path, r.offset, r.bytes);
          if (!res.ok()) return res.status();
          total += r.bytes;
          resident += res->resident_bytes;
          evicted += res->recently_evicted_bytes;
          if (std::string_view(res->method) == "mincore") method = res->method;
        }
        j["resident_bytes"] = resident;
        j["resident_fraction"] = total == 0 ? 0.0 : double(resident) / double(total);
        j["recently_evicted_bytes"] = evicted;
        j["residency_method"] = method;
      }
      tables.push_back(j);
    }
    out["tables"] = tables;
  } else if (command == "stats") {
    json tables = json::array();
    for (const TableGatherStats& t : s.engine_->Stats()) tables.push_back(EngineStatsJson(t));
    out["tables"] = tables;
    json clients = json::array();
    std::lock_guard<std::mutex> lock(s.sessions_mutex_);
    for (const auto& session : s.sessions_) {
      const engram_wire_session_stats w = session->Stats();
      clients.push_back({{"session", w.session_id},
                         {"name", session->name()},
                         {"pid", session->peer().pid},
                         {"uid", session->peer().uid},
                         {"requests_submitted", w.requests_submitted},
                         {"requests_ok", w.requests_ok},
                         {"requests_failed", w.requests_failed},
                         {"rows", w.rows},
                         {"bytes", w.bytes},
                         {"inflight", w.inflight},
                         {"doorbells", w.doorbells},
                         {"cq_overflows", w.cq_overflows},
                         {"garbage", session->counters.garbage.load()},
                         {"latency_p50_ns", w.latency_p50_ns},
                         {"latency_p99_ns", w.latency_p99_ns},
                         {"latency_max_ns", w.latency_max_ns}});
    }
    out["clients"] = clients;
    out["uptime_seconds"] = double(NowNs() - s.start_ns_) / 1e9;
  } else if (command == "clients") {
    json clients = json::array();
    std::lock_guard<std::mutex> lock(s.sessions_mutex_);
    for (const auto& session : s.sessions_) {
      clients.push_back({{"session", session->id()},
                         {"name", session->name()},
                         {"pid", session->peer().pid},
                         {"uid", session->peer().uid},
                         {"gid", session->peer().gid},
                         {"slots", session->arena().layout().slots},
                         {"arena_bytes", session->arena().bytes()},
                         {"data_bytes", session->arena().data_bytes()},
                         {"inflight", session->inflight.load()},
                         {"requests", session->counters.submitted.load()},
                         {"rows", session->counters.rows.load()}});
    }
    out["clients"] = clients;
  } else if (command == "warm" || command == "evict") {
    absl::StatusOr<const Table*> t = find_table(request);
    if (!t.ok()) return t.status();
    absl::StatusOr<RowRange> range = range_of(request, **t);
    if (!range.ok()) return range.status();
    // One step covers at most kMaxStepBytes of rows; engramctl walks the range step by step.
    const uint64_t step_rows = std::max<uint64_t>(1, kMaxStepBytes / (*t)->row_bytes());
    const RowRange done{range->begin, std::min(range->end, range->begin + step_rows)};
    const uint64_t start = NowNs();
    uint64_t bytes = 0;
    std::vector<char> buffer(command == "warm" ? (1u << 20) : 0);
    for (const FileRange& r : RangesOf(**t, done.begin, done.end)) {
      if (command == "evict") {
        if (int rc = posix_fadvise(r.fd, static_cast<off_t>(r.offset), static_cast<off_t>(r.bytes),
                                   POSIX_FADV_DONTNEED);
            rc != 0) {
          return absl::InternalError(
              absl::StrFormat("posix_fadvise(DONTNEED) on %s: %s", *r.path, strerror(rc)));
        }
        bytes += r.bytes;
        continue;
      }
      posix_fadvise(r.fd, static_cast<off_t>(r.offset), static_cast<off_t>(r.bytes),
                    POSIX_FADV_WILLNEED);
      for (uint64_t at = r.offset; at < r.offset + r.bytes;) {
        const size_t want =
            static_cast<size_t>(std::min<uint64_t>(buffer.size(), r.offset + r.bytes - at));
        const ssize_t n = pread(r.fd, buffer.data(), want, static_cast<off_t>(at));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          return absl::DataLossError(absl::StrFormat("reading %s at %u to warm it: %s", *r.path, at,
                                                     n == 0 ? "end of file" : strerror(errno)));
        }
        at += static_cast<uint64_t>(n);
        bytes += static_cast<uint64_t>(n);
      }
    }
    out["layer"] = (*t)->layer_id();
    out["begin"] = done.begin;
    out["end"] = done.end;
    out["bytes"] = bytes;
    out["seconds"] = double(NowNs() - start) / 1e9;
  } else if (command == "metrics") {
    out["text"] = MetricsText();
  } else {
    return absl::InternalError(absl::StrFormat("control command '%s' has no handler", command));
  }
  return out.dump();
}

std::string Control::MetricsText() const {
  const Server& s = *server_;
  metrics::Exposition e;
  e.Gauge("engram_up", "1 while engramd serves", {}, s.draining_.load() ? 0 : 1);
  e.Gauge("engram_build_info", "engramd version and protocol",
          {{"version", version_},
           {"protocol", absl::StrFormat("%u.%u", ENGRAM_PROTOCOL_MAJOR, ENGRAM_PROTOCOL_MINOR)}},
          1);
  e.Gauge("engram_uptime_seconds", "Seconds since engramd started serving", {},
          double(NowNs() - s.start_ns_) / 1e9);
  e.Gauge("engram_tables", "Tables served", {}, double(s.tables_.size()));
  for (const auto& t : s.tables_) {
    const metrics::Labels l = {{"table", std::to_string(t->layer_id())}};
    e.Gauge("engram_table_rows", "Rows of the table's logical row space", l, double(t->num_rows()));
    e.Gauge("engram_table_covered_rows", "Rows this copy of the table serves", l,
            double(t->covered().size()));
    e.Gauge("engram_table_bytes", "Row bytes the table holds", l, double(t->data_bytes()));
  }
  for (const TableGatherStats& t : s.engine_->Stats()) {
    const metrics::Labels l = {{"table", std::to_string(t.layer_id)}};
    e.Counter("engram_gather_batches_total", "Gather batches run", l, double(t.batches));
    e.Counter("engram_gather_rows_total", "Rows requested by gathers", l, double(t.rows_requested));
    e.Counter("engram_gather_unique_rows_total", "Rows left after de-duplication", l,
              double(t.rows_unique));
    e.Counter("engram_gather_read_calls_total", "Reads issued after merging", l,
              double(t.read_calls));
    e.Counter("engram_gather_syscalls_total", "preadv2, pread and io_uring_enter calls", l,
              double(t.syscalls));
    e.Counter("engram_gather_nowait_hits_total", "Rows served by the RWF_NOWAIT pass", l,
              double(t.nowait_hits));
    e.Counter("engram_gather_nowait_misses_total", "Rows the RWF_NOWAIT pass left (EAGAIN)", l,
              double(t.nowait_eagain));
    e.Gauge("engram_gather_nowait_enabled", "1 while the adaptive policy runs the NOWAIT pass", l,
            t.nowait_enabled ? 1 : 0);
    e.Counter("engram_gather_uring_reads_total", "Residue reads through io_uring", l,
              double(t.uring_reads));
    e.Counter("engram_gather_pool_reads_total", "Residue reads through the blocking pool", l,
              double(t.pool_reads));
    e.Counter("engram_gather_direct_reads_total", "O_DIRECT reads", l, double(t.direct_reads));
    e.Counter("engram_gather_fixed_reads_total", "O_DIRECT reads into registered buffers", l,
              double(t.fixed_reads));
    e.Counter("engram_gather_ring_failures_total",
              "io_uring_enter failures survived by draining and replacing the ring", l,
              double(t.ring_failures));
    e.Counter("engram_gather_ring_resets_total", "io_uring rings replaced after a failure", l,
              double(t.ring_resets));
    e.Counter("engram_gather_read_bytes_total", "Bytes read from the table files", l,
              double(t.bytes_read));
    e.Counter("engram_gather_errors_total", "Gathers that failed", l, double(t.errors));
    e.Log2Histogram("engram_gather_batch_duration_seconds", "Latency of one gather batch", l,
                    t.latency_buckets.data(), t.latency_buckets.size(), t.latency_sum_ns);
  }
  std::vector<std::shared_ptr<Session>> sessions;
  {
    std::lock_guard<std::mutex> lock(const_cast<Server&>(s).sessions_mutex_);
    sessions = s.sessions_;
  }
  e.Gauge("engram_clients", "Connected client sessions", {}, double(sessions.size()));
  e.Gauge("engram_arena_bytes", "Shared memory handed to all sessions", {},
          double(s.total_arena_bytes_));
  for (const auto& session : sessions) {
    const metrics::Labels l = {{"client", session->name().empty() ? "-" : session->name()},
                               {"session", std::to_string(session->id())}};
    const Session::Counters& c = session->counters;
    auto with = [&](const char* k, const char* v) {
      metrics::Labels x = l;
      x.emplace_back(k, v);
      return x;
    };
    e.Counter("engram_client_requests_total", "Requests a client submitted, by result",
              with("result", "ok"), double(c.ok.load()));
    e.Counter("engram_client_requests_total", "Requests a client submitted, by result",
              with("result", "failed"), double(c.failed.load()));
    e.Counter("engram_client_rows_total", "Rows gathered for a client", l, double(c.rows.load()));
    e.Counter("engram_client_bytes_total", "Bytes written into a client's arena", l,
              double(c.bytes.load()));
    e.Counter("engram_client_doorbells_total", "Times a client woke the poller", l,
              double(c.doorbells.load()));
    e.Gauge("engram_client_requests_in_flight", "Requests of a client in flight", l,
            double(session->inflight.load()));
    uint64_t buckets[64];
    for (size_t i = 0; i < 64; ++i) buckets[i] = c.latency_log2[i].load();
    e.Log2Histogram("engram_client_request_duration_seconds",
                    "Service time of a client's requests in the daemon", l, buckets, 64,
                    c.latency_sum_ns.load());
  }
  AppendMemoryMetrics(e, ReadMemoryReport(), s.config_.memory_budget);
  return e.Text();
}

std::string Control::StatusLine() const {
  const Server& s = *server_;
  size_t clients;
  {
    std::lock_guard<std::mutex> lock(const_cast<Server&>(s).sessions_mutex_);
    clients = s.sessions_.size();
  }
  return absl::StrFormat("Serving %u table(s) to %u client(s) on %s", s.tables_.size(), clients,
                         s.config_.socket_path);
}

void Control::Start() {
  if (metrics_.http_port != 0) {
    auto l = metrics::HttpListener::Start(metrics_.http_address,
                                          static_cast<uint16_t>(metrics_.http_port),
                                          [this] { return MetricsText(); });
    if (l.ok()) {
      http_ = std::move(*l);
      log::Info("metrics on http://{}:{}/metrics", metrics_.http_address, http_->port());
    } else {
      log::Error("{}; serving without the metrics port", std::string(l.status().message()));
    }
  }
  watchdog_ns_ = notify::WatchdogUsec() * 1000;
  last_status_ = StatusLine();
  notify::Send("READY=1\nSTATUS=" + last_status_);
  last_ping_ns_ = NowNs();
  notify::Send("WATCHDOG=1");
  Tick();
}

int Control::WaitMs() const {
  int64_t ms = -1;
  auto lower = [&](int64_t v) { ms = ms < 0 ? v : std::min(ms, v); };
  if (watchdog_ns_ != 0) lower(std::max<int64_t>(1, watchdog_ns_ / 4 / 1'000'000));
  if (!metrics_.textfile_dir.empty()) lower(int64_t{metrics_.textfile_interval_s} * 1000);
  lower(2000);  // STATUS= stays current within two seconds
  return static_cast<int>(ms);
}

void Control::Tick() {
  const uint64_t now = NowNs();
  const Server& s = *server_;
  if (watchdog_ns_ != 0 && now - last_ping_ns_ >= watchdog_ns_ / 2) {
    // The poller is the part that can wedge (a stuck ring, a blocked engine): ping only while
    // it has run recently, so systemd restarts a daemon whose poller stopped.
    // An idle poller sleeps up to a second between passes, so a pass within two seconds (or
    // half the watchdog interval, when that is longer) counts as alive.
    const uint64_t beat = s.poller_heartbeat_ns_.load(std::memory_order_relaxed);
    if (now - std::min(now, beat) < std::max<uint64_t>(watchdog_ns_ / 2, 2'000'000'000)) {
      notify::Send("WATCHDOG=1");
      last_ping_ns_ = now;
      poller_stall_reported_ = false;
    } else if (!poller_stall_reported_) {
      log::Error("the request poller has not run for {} ms; withholding the watchdog ping",
                 (now - beat) / 1'000'000);
      poller_stall_reported_ = true;
    }
  }
  if (std::optional<std::string> line = memory_watch_.Check(ReadMemoryReport(), now)) {
    log::Warning("{}", *line);
  }
  const std::string status = StatusLine();
  if (status != last_status_) {
    notify::Send("STATUS=" + status);
    last_status_ = status;
  }
  if (!metrics_.textfile_dir.empty() &&
      now - last_textfile_ns_ >= uint64_t{metrics_.textfile_interval_s} * 1'000'000'000) {
    last_textfile_ns_ = now;
    if (absl::Status st = metrics::WriteTextfile(metrics_.textfile_dir, MetricsText()); !st.ok()) {
      uint64_t suppressed = 0;
      if (server_->garbage_log_.Allow(now, &suppressed))
        log::Warning("{}", std::string(st.message()));
    }
  }
}

void Control::Stopping() { notify::Send("STOPPING=1\nSTATUS=Finishing requests in flight"); }

void Control::Reload() {
  notify::Send("RELOADING=1\nSTATUS=Reloading the configuration");
  if (!reloader_) {
    log::Notice("SIGHUP: no configuration to re-read");
    notify::Send("READY=1\nSTATUS=" + StatusLine());
    return;
  }
  absl::StatusOr<ReloadedConfig> fresh = reloader_();
  if (!fresh.ok()) {
    log::Error("SIGHUP: configuration refused, keeping the running one: {}",
               std::string(fresh.status().message()));
    notify::Send("READY=1\nSTATUS=" + StatusLine());
    return;
  }
  ServerConfig& cur = server_->config_;
  const ServerConfig& next = fresh->server;
  std::vector<std::string> changed, restart;
  auto live = [&](const char* key, auto& field, const auto& value) {
    if (field != value) {
      changed.push_back(absl::StrFormat("%s %s -> %s", key, absl::FormatStreamed(field),
                                        absl::FormatStreamed(value)));
      field = value;
    }
  };
  auto needs_restart = [&](const char* key, bool differs) {
    if (differs) restart.push_back(key);
  };
  // Read by the control thread only (handshakes): safe to change here.
  live("limits.max_clients", cur.limits.max_clients, next.limits.max_clients);
  live("limits.max_arena_bytes", cur.limits.max_arena_bytes, next.limits.max_arena_bytes);
  live("limits.max_total_arena_bytes", cur.limits.max_total_arena_bytes,
       next.limits.max_total_arena_bytes);
  live("limits.default_data_bytes", cur.limits.default_data_bytes, next.limits.default_data_bytes);
  live("limits.default_slots", cur.limits.default_slots, next.limits.default_slots);
  auto live_ids = [&](const char* what, std::vector<uint32_t>& field,
                      const std::vector<uint32_t>& value) {
    if (field != value) {
      changed.push_back(absl::StrFormat("%s [%s] -> [%s]", what, absl::StrJoin(field, ","),
                                        absl::StrJoin(value, ",")));
      field = value;
    }
  };
  live_ids("allowed uids", cur.allow_uids, next.allow_uids);
  live_ids("allowed gids", cur.allow_gids, next.allow_gids);
  // Read by the control thread only, on each warm or evict: live.
  live_ids("administrator uids", cur.admin_uids, next.admin_uids);
  live_ids("administrator gids", cur.admin_gids, next.admin_gids);
  if (fresh->log_level != log_level_) {
    static const std::map<std::string, log::Priority> levels = {{"error", log::kError},
                                                                {"warning", log::kWarning},
                                                                {"notice", log::kNotice},
                                                                {"info", log::kInfo},
                                                                {"debug", log::kDebug}};
    changed.push_back(absl::StrFormat("log.level %s -> %s", log_level_, fresh->log_level));
    log_level_ = fresh->log_level;
    log::g_max_priority = levels.at(log_level_);
  }
  if (fresh->metrics.textfile_dir != metrics_.textfile_dir ||
      fresh->metrics.textfile_interval_s != metrics_.textfile_interval_s) {
    changed.push_back(absl::StrFormat("metrics textfile '%s' every %u s -> '%s' every %u s",
                                      metrics_.textfile_dir, metrics_.textfile_interval_s,
                                      fresh->metrics.textfile_dir,
                                      fresh->metrics.textfile_interval_s));
    metrics_.textfile_dir = fresh->metrics.textfile_dir;
    metrics_.textfile_interval_s = fresh->metrics.textfile_interval_s;
  }
  // Fixed at start: the poller reads these without a lock, clients were told them in WELCOME,
  // or they name what was opened and bound.
  needs_restart("limits.max_inflight", cur.limits.max_inflight != next.limits.max_inflight);
  needs_restart("limits.max_rows_per_request",
                cur.limits.max_rows_per_request != next.limits.max_rows_per_request);
  needs_restart("engine.inline_rows", cur.poll.inline_rows != next.poll.inline_rows);
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
  needs_restart("metrics.http_port/http_address",
                fresh->metrics.http_port != metrics_.http_port ||
                    fresh->metrics.http_address != metrics_.http_address);
  if (changed.empty()) {
    log::Notice("SIGHUP: configuration re-read; nothing that can change live changed");
  } else {
    log::Notice("SIGHUP: configuration re-read; changed: {}", absl::StrJoin(changed, "; "));
  }
  if (!restart.empty()) {
    log::Warning("SIGHUP: these settings changed but only take effect after a restart: {}",
                 absl::StrJoin(restart, ", "));
  }
  notify::Send("READY=1\nSTATUS=" + StatusLine());
}

}  // namespace engram
