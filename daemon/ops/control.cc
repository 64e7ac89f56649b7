// Control requests: parse, check the peer, dispatch through the command table, reply; plus the
// metrics listener and SIGHUP (control.h).
#include "daemon/ops/control.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/clock.h"
#include "base/escape.h"
#include "daemon/ops/control_commands.h"
#include "daemon/ops/metrics_text.h"
#include "daemon/ops/start_checks.h"
#include "protocol/codec.h"

namespace engram {
namespace {

using nlohmann::json;

constexpr int kSchemaVersion = 1;
// A refused peer's uid is logged at most once in this long; the refusals in between are counted.
constexpr uint64_t kRefusalLogWindowNs = 60'000'000'000;
// Uids remembered for that. Past it, those not logged within the window are forgotten, and if
// that is not enough, all (a burst of refusals from that many uids is logged again).
constexpr size_t kMaxRefusalUids = 4096;

// A reply too long for one message travels in a sealed memfd; -1 (errno set) if it cannot.
int SealedMemfd(const std::string& text) {
  const int memfd = memfd_create("engramd-reply", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  bool ok = memfd >= 0;
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = write(memfd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  if (ok) {
    ok = fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) == 0;
  }
  if (!ok && memfd >= 0) {
    const int err = errno;
    close(memfd);
    errno = err;
    return -1;
  }
  return memfd;
}

void SendError(Session& session, const absl::Status& status, uint32_t request_id) {
  std::vector<uint8_t> e = protocol::EncodeError(static_cast<int32_t>(status.code()),
                                                 std::string(status.message()), request_id);
  send(session.socket_fd(), e.data(), e.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// The level the logger runs at, by its log.level name.
std::string RunningLogLevel() {
  const int priority = log::g_max_priority.load(std::memory_order_relaxed);
  for (const log::LevelName& l : log::kLevelNames) {
    if (l.priority == priority) return l.name;
  }
  return std::to_string(priority);
}

}  // namespace

std::vector<std::string> AdminCommandNames() { return ControlCommandNames(true); }

Control::Control(ServerView* server)
    : server_(server), watchdog_(*server, [this] { return MetricsText(); }) {}
Control::~Control() = default;

void Control::Configure(const DaemonSettings& settings, const std::string& version,
                        std::unique_ptr<metrics::HttpListener> http) {
  running_ = settings;
  http_ = std::move(http);
  version_ = version;
  // The server was created with these settings and main set the log level from them.
  Take(Setting::Applies::kTextfile);
}

void Control::Reply(Session& session, uint32_t request_id, const std::string& text) {
  std::vector<uint8_t> out(sizeof(engram_msg_header));
  int memfd = -1;
  if (sizeof(engram_msg_header) + text.size() <= ENGRAM_MSG_MAX_BYTES) {
    out.insert(out.end(), text.begin(), text.end());
  } else if ((memfd = SealedMemfd(text)) < 0) {
    SendError(session,
              absl::ResourceExhaustedError(absl::StrFormat("cannot hand over a %u-byte reply: %s",
                                                           text.size(), strerror(errno))),
              request_id);
    return;
  }
  engram_msg_header h;
  protocol::FillHeader(&h, ENGRAM_MSG_CONTROL_REPLY, static_cast<uint32_t>(out.size()), request_id);
  memcpy(out.data(), &h, sizeof(h));
  (void)protocol::SendMessage(session.socket_fd(), out.data(), out.size(), &memfd,
                              memfd >= 0 ? 1 : 0);
  if (memfd >= 0) close(memfd);
}

void Control::Answer(Session& session, uint32_t request_id,
                     const absl::StatusOr<std::string>& reply) {
  if (reply.ok()) {
    Reply(session, request_id, *reply);
    return;
  }
  uint64_t suppressed = 0;
  // Permission refusals were logged by Refuse, per uid.
  if (reply.status().code() != absl::StatusCode::kPermissionDenied &&
      error_log_.Allow(NowNs(), &suppressed)) {
    log::Info("{}: control request refused: {} ({} similar messages suppressed)",
              session.Describe(), std::string(reply.status().message()), suppressed);
  }
  SendError(session, reply.status(), request_id);
}

void Control::Handle(const std::shared_ptr<Session>& session, const engram_msg_header& header,
                     const uint8_t* body, size_t body_bytes) {
  absl::StatusOr<std::optional<std::string>> reply;
  // No exception may end the daemon: whatever a command throws is that request's error.
  try {
    reply = Run(session, header.request_id,
                std::string(reinterpret_cast<const char*>(body), body_bytes));
  } catch (const std::exception& e) {
    reply =
        absl::InternalError(absl::StrFormat("control command failed: %s", EscapeBytes(e.what())));
  }
  if (!reply.ok()) {
    Answer(*session, header.request_id, reply.status());
  } else if (reply->has_value()) {
    Answer(*session, header.request_id, **reply);
  }
}

bool Control::PeerIsAdministrator(const Session& session) const {
  const PeerInfo& peer = session.peer();
  const ServerConfig& config = server_->config();
  std::vector<gid_t> groups;
  if (!config.admin_gids.empty()) groups = PeerGroups(session.socket_fd());
  return IsAdministrator(config, server_->own_uid(), peer.uid, peer.gid, groups);
}

namespace {

// One line per control call, with its arguments: at info for a call that changes what every
// client shares (an administrator's command; `load`'s status polls only read), at debug for one
// that only reads, so that `engramctl status` in a loop does not fill the log.
void LogCall(const Session& session, const CommandSpec& spec, const json& request) {
  json args = request;
  args.erase("command");
  const bool reads_only =
      spec.admin_reason == nullptr || args.value("action", std::string()) == "status";
  if (reads_only && log::g_max_priority.load(std::memory_order_relaxed) < log::kDebug) return;
  log::Write(reads_only ? log::kDebug : log::kInfo,
             fmt::format("{}: control command '{}' {}", session.Describe(), spec.name,
                         args.dump(-1, ' ', false, json::error_handler_t::replace)));
}

}  // namespace

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

absl::Status Control::Refuse(const Session& session, const std::string& command,
                             const char* admin_reason) {
  LogRefusal(session, command);
  const PeerInfo& peer = session.peer();
  return absl::PermissionDeniedError(absl::StrFormat(
      "'%s' needs an engramd administrator because %s; uid %u (gid %u, pid %d) is not one "
      "(administrators: %s). To allow it, add the uid to [access] admin_uids, or one of its "
      "groups to admin_gids, in engramd's configuration and reload (systemctl reload "
      "engramd), or run it as root",
      command, admin_reason, peer.uid, peer.gid, peer.pid,
      DescribeAdministrators(server_->config(), server_->own_uid())));
}

absl::StatusOr<std::optional<std::string>> Control::Run(const std::shared_ptr<Session>& session,
                                                        uint32_t request_id,
                                                        const std::string& request_text) {
  const json request = json::parse(request_text, nullptr, /*allow_exceptions=*/false);
  if (!request.is_object() || !request.contains("command") || !request["command"].is_string()) {
    return absl::InvalidArgumentError(
        "a control request is a JSON object with a string \"command\"");
  }
  const std::string command = request["command"];
  const CommandSpec* spec = FindControlCommand(command);
  if (spec == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown control command '%s' (%s)", EscapeBytes(command),
                        absl::StrJoin(ControlCommandNames(false), ", ")));
  }
  const bool admin = PeerIsAdministrator(*session);
  if (spec->admin_reason != nullptr && !admin) return Refuse(*session, command, spec->admin_reason);
  LogCall(*session, *spec, request);
  // Every reply is the command's object with these two keys first; the dump never throws on
  // text that is not UTF-8 (there should be none left: outside text is escaped).
  auto finish = [this, command](const json& result) {
    json out = {{"schema_version", kSchemaVersion}, {"command", command}};
    out.update(result);
    server_->AddStoreControlFields(command, &out);
    return out.dump(-1, ' ', false, json::error_handler_t::replace);
  };
  const std::string log_level = RunningLogLevel();
  CommandContext context{.server = *server_,
                         .session = session,
                         .request = request,
                         .command = command,
                         .version = version_,
                         .log_level = log_level,
                         .watchdog_ns = watchdog_.interval_ns(),
                         .peer_is_administrator = admin,
                         .worker = page_cache_,
                         .reply_later =
                             [this, session, request_id, finish](absl::StatusOr<json> result) {
                               if (!result.ok()) {
                                 Answer(*session, request_id, result.status());
                               } else {
                                 Answer(*session, request_id, finish(*result));
                               }
                             },
                         .metrics_text = [this] { return MetricsText(); },
                         .running_settings = [this] { return RunningSettings(); }};
  CommandResult result = spec->run(context);
  if (!result.ok()) return result.status();
  if (!result->has_value()) return std::optional<std::string>();
  return std::optional<std::string>(finish(**result));
}

std::string Control::MetricsText() const { return RenderMetrics(*server_, version_, clients_); }

metrics::Health Control::Health() const {
  if (stopping_.load() || server_->draining()) {
    return {.ok = false, .reason = "stopping: finishing requests in flight"};
  }
  return {.ok = true};
}

void Control::Start() {
  if (http_ != nullptr) {
    http_->SetHandlers([this] { return MetricsText(); }, [this] { return Health(); });
  } else if (const MetricsOptions& metrics = running_.metrics; metrics.http_port != 0) {
    auto l = metrics::HttpListener::Start(
        metrics.http_address, static_cast<uint16_t>(metrics.http_port),
        [this] { return MetricsText(); }, [this] { return Health(); });
    if (l.ok()) {
      http_ = std::move(*l);
      log::Info("metrics on http://{}:{}/metrics", metrics.http_address, http_->port());
    } else {
      log::Warning("{}", WithoutMetricsPort(l.status()));
    }
  }
  watchdog_.Start();
}

void Control::Reload() {
  watchdog_.Reloading();
  if (!reloader_) {
    log::Notice("SIGHUP: no configuration to re-read");
    watchdog_.Reloaded();
    return;
  }
  log::Debug("SIGHUP: re-reading the configuration files and flags");
  absl::StatusOr<ReloadedConfig> fresh = reloader_();
  if (!fresh.ok()) {
    log::Error("SIGHUP: configuration refused, keeping the running one: {}",
               std::string(fresh.status().message()));
    watchdog_.Reloaded();
    return;
  }
  const DaemonSettings& next = fresh->settings;
  const std::set<Setting::Applies> parts = CopyLiveRows(next);
  log::Debug("SIGHUP: configuration read; applying the live settings to {} part(s)", parts.size());
  for (Setting::Applies part : parts) {
    if (part != Setting::Applies::kLog) Take(part);
  }
  // Logged before the level changes, so that lowering it does not hide its own report; the
  // "configuration re-read" line comes last.
  if (!fresh->report.restart.empty()) log::Warning("SIGHUP: {}", RestartLine(fresh->report));
  // A value derived from a live setting that no row names (Resolve's) would stay behind.
  if (!(server_->config() == next.server)) {
    log::Error(
        "SIGHUP: the server did not take every live setting (a value of its configuration that "
        "no live row of Settings() names); restart engramd to apply it");
  }
  log::Notice("SIGHUP: configuration re-read; {}", ChangedLine(fresh->report));
  if (parts.contains(Setting::Applies::kLog)) Take(Setting::Applies::kLog);
  watchdog_.Reloaded();
}

std::set<Setting::Applies> Control::CopyLiveRows(const DaemonSettings& next) {
  std::set<Setting::Applies> parts;
  for (const Setting& row : Settings()) {
    if (!row.live()) continue;
    row.Copy(next, &running_);
    parts.insert(row.applies);
  }
  return parts;
}

void Control::Take(Setting::Applies part) {
  switch (part) {
    case Setting::Applies::kRestart:
      return;
    case Setting::Applies::kServer:
      // The server keeps its own configuration; only its live rows' values change in it.
      server_->ApplyLiveSettings([this](ServerConfig* config) {
        for (const Setting& row : Settings()) {
          if (row.applies == Setting::Applies::kServer)
            row.CopyServerValue(running_.server, config);
        }
      });
      return;
    case Setting::Applies::kLog:
      log::SetLogLevel(running_.log_level);
      return;
    case Setting::Applies::kTextfile:
      watchdog_.set_textfile(running_.metrics.textfile_dir, running_.metrics.textfile_interval_s);
      return;
  }
}

void Control::Report(Setting::Applies part, DaemonSettings* shown) const {
  switch (part) {
    case Setting::Applies::kRestart:
      return;  // as engramd started
    case Setting::Applies::kServer:
      for (const Setting& row : Settings()) {
        if (row.applies == Setting::Applies::kServer) {
          row.CopyServerValue(server_->config(), &shown->server);
        }
      }
      return;
    case Setting::Applies::kLog:
      shown->log_level = RunningLogLevel();
      return;
    case Setting::Applies::kTextfile:
      shown->metrics.textfile_dir = watchdog_.textfile_dir();
      shown->metrics.textfile_interval_s = watchdog_.textfile_interval_s();
      return;
  }
}

DaemonSettings Control::RunningSettings() const {
  // A live row shows what its part holds, never running_'s copy: one whose part did not report
  // it would show its default, which a test that changes every live row tells apart.
  DaemonSettings shown = running_;
  const DaemonSettings defaults;
  std::set<Setting::Applies> parts;
  for (const Setting& row : Settings()) {
    if (row.live()) row.Copy(defaults, &shown);
    parts.insert(row.applies);
  }
  for (Setting::Applies part : parts) Report(part, &shown);
  return shown;
}

}  // namespace engram
