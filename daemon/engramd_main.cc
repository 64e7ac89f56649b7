// engramd: opens and validates the Engram tables named on the command line, then serves row
// gathers to local clients through the Unix socket and shared-memory arenas until SIGTERM.
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "daemon/gather_engine.h"
#include "daemon/log.h"
#include "daemon/server.h"
#include "daemon/server_config.h"
#include "daemon/table.h"

namespace engram {
namespace {

absl::StatusOr<uid_t> ResolveUser(const std::string& text) {
  uint32_t id;
  if (absl::SimpleAtoi(text, &id)) return static_cast<uid_t>(id);
  passwd* p = getpwnam(text.c_str());
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrFormat("no user '%s'", text));
  return p->pw_uid;
}

absl::StatusOr<gid_t> ResolveGroup(const std::string& text) {
  uint32_t id;
  if (absl::SimpleAtoi(text, &id)) return static_cast<gid_t>(id);
  group* g = getgrnam(text.c_str());
  if (g == nullptr) return absl::InvalidArgumentError(absl::StrFormat("no group '%s'", text));
  return g->gr_gid;
}

// Opens every table of every source and checks that no layer is served twice.
absl::StatusOr<std::vector<std::unique_ptr<Table>>> OpenAll(const ServerConfig& config) {
  std::vector<std::unique_ptr<Table>> all;
  std::map<uint32_t, std::string> seen;
  for (const TableSource& source : config.sources) {
    OpenOptions options;
    options.rows = source.rows;
    options.check_holes = config.check_holes;
    options.layers = config.layers;
    absl::StatusOr<std::vector<std::unique_ptr<Table>>> tables = OpenTables(source.path, options);
    if (!tables.ok()) return tables.status();
    for (auto& t : *tables) {
      auto [it, inserted] = seen.emplace(t->layer_id(), t->Describe());
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "layer %u is served twice: by %s and by %s", t->layer_id(), it->second, t->Describe()));
      }
      all.push_back(std::move(t));
    }
  }
  for (uint32_t layer : config.layers) {
    if (seen.count(layer) == 0) {
      return absl::NotFoundError(
          absl::StrFormat("layer %u was asked for (--layers) but no source holds it", layer));
    }
  }
  if (all.empty()) {
    return absl::NotFoundError("no Engram table found in the sources given");
  }
  return all;
}

int Main(int argc, char** argv) {
  CLI::App app{"engramd: serves DeepSeek-V4.1 Engram table rows to local processes"};
  app.set_version_flag("--version", absl::StrFormat("engramd %s (protocol %u.%u)", ENGRAMD_VERSION,
                                                    ENGRAM_PROTOCOL_MAJOR, ENGRAM_PROTOCOL_MINOR));
  ServerConfig config;
  std::vector<std::string> models, tables, allow_users, allow_groups;
  std::string rows_text, log_level = "info";
  bool no_check_holes = false;
  std::string mode_text = "0660";
  app.add_option("--model", models, "Checkpoint directory; every Engram table in it is served")
      ->type_name("DIR");
  app.add_option("--table", tables, "A packed table file (or a checkpoint directory)")
      ->type_name("PATH");
  app.add_option("--rows", rows_text,
                 "Per-rank copy: the rows A:B the sources hold (others are refused)")
      ->type_name("A:B");
  app.add_option("--layers", config.layers, "Serve only these layer ids")->delimiter(',');
  app.add_flag("--no-check-holes", no_check_holes,
               "Do not check sparse copies for holes in the rows they claim");
  app.add_option("--socket", config.socket_path, "Unix socket to listen on")->capture_default_str();
  app.add_option("--socket-mode", mode_text, "File mode of the socket (octal)")
      ->capture_default_str();
  app.add_option("--socket-group", config.socket_group, "Group owning the socket");
  app.add_option("--allow-uid", allow_users,
                 "User (name or uid) allowed to connect; repeatable (default: own uid and root)");
  app.add_option("--allow-gid", allow_groups,
                 "Group (name or gid) whose members may connect; repeatable");
  app.add_option("--max-clients", config.limits.max_clients, "Sessions at once")
      ->capture_default_str();
  app.add_option("--max-inflight", config.limits.max_inflight, "Requests in flight per session")
      ->capture_default_str();
  app.add_option("--max-rows-per-request", config.limits.max_rows_per_request,
                 "Rows in one request")
      ->capture_default_str();
  app.add_option("--max-arena-bytes", config.limits.max_arena_bytes,
                 "Data region of one session (bytes; K/M/G suffixes)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--max-total-arena-bytes", config.limits.max_total_arena_bytes,
                 "Arenas of all sessions together")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--workers", config.workers, "Gather workers (0: one per CPU)")
      ->capture_default_str();
  app.add_option("--request-threads", config.request_threads,
                 "Requests gathered at the same time (each helped by the workers)")
      ->capture_default_str();
  uint64_t spin_min_us = config.poll.spin_min_ns / 1000,
           spin_max_us = config.poll.spin_max_ns / 1000;
  app.add_option("--poll-spin-min-us", spin_min_us, "Shortest polling spell before sleeping")
      ->capture_default_str();
  app.add_option("--poll-spin-max-us", spin_max_us, "Longest polling spell before sleeping")
      ->capture_default_str();
  app.add_option("--inline-rows", config.poll.inline_rows,
                 "Gather requests of up to this many rows on the polling thread")
      ->capture_default_str();
  std::string read_mode = "buffered";
  app.add_option("--read-mode", read_mode,
                 "buffered (page cache, RWF_NOWAIT fast path) or direct (O_DIRECT, for tables "
                 "much larger than RAM)")
      ->check(CLI::IsMember({"buffered", "direct"}))
      ->capture_default_str();
  app.add_option("--log-level", log_level, "error, warning, notice, info or debug")
      ->check(CLI::IsMember({"error", "warning", "notice", "info", "debug"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const std::map<std::string, log::Priority> levels = {{"error", log::kError},
                                                       {"warning", log::kWarning},
                                                       {"notice", log::kNotice},
                                                       {"info", log::kInfo},
                                                       {"debug", log::kDebug}};
  log::g_max_priority = levels.at(log_level);
  auto fail = [](const absl::Status& s) {
    log::Error("engramd: {}", s.ToString());
    return 1;
  };
  if (models.empty() && tables.empty()) {
    return fail(absl::InvalidArgumentError("nothing to serve: give --model DIR or --table PATH"));
  }
  std::optional<RowRange> rows;
  if (!rows_text.empty()) {
    absl::StatusOr<RowRange> r = ParseRowRange(rows_text);
    if (!r.ok()) return fail(r.status());
    rows = *r;
  }
  for (const auto& m : models) config.sources.push_back({.path = m, .rows = rows});
  for (const auto& t : tables) config.sources.push_back({.path = t, .rows = rows});
  config.check_holes = !no_check_holes;
  char* end = nullptr;
  config.socket_mode = static_cast<uint32_t>(strtoul(mode_text.c_str(), &end, 8));
  if (end == mode_text.c_str() || *end != '\0' || config.socket_mode > 07777) {
    return fail(absl::InvalidArgumentError(
        absl::StrFormat("--socket-mode '%s' is not an octal file mode", mode_text)));
  }
  for (const auto& u : allow_users) {
    absl::StatusOr<uid_t> uid = ResolveUser(u);
    if (!uid.ok()) return fail(uid.status());
    config.allow_uids.push_back(*uid);
  }
  for (const auto& g : allow_groups) {
    absl::StatusOr<gid_t> gid = ResolveGroup(g);
    if (!gid.ok()) return fail(gid.status());
    config.allow_gids.push_back(*gid);
  }
  if (!config.allow_gids.empty() && config.allow_uids.empty()) {
    // Naming groups must not lock out the operator: keep the daemon's own uid and root.
    config.allow_uids = {geteuid(), 0};
  }
  config.poll.spin_min_ns = spin_min_us * 1000;
  config.poll.spin_max_ns = std::max(spin_max_us, spin_min_us) * 1000;
  if (config.limits.max_clients == 0 || config.limits.max_inflight == 0 ||
      config.limits.max_rows_per_request == 0 || config.limits.max_arena_bytes == 0) {
    return fail(absl::InvalidArgumentError("limits must be above 0"));
  }

  // Signals are read through a signalfd by the server: block them before any thread starts.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<std::vector<std::unique_ptr<Table>>> opened = OpenAll(config);
  if (!opened.ok()) return fail(opened.status());
  absl::StatusOr<std::unique_ptr<GatherEngine>> engine =
      GatherEngine::Create({.workers = config.workers});
  if (!engine.ok()) return fail(engine.status());
  for (const auto& t : *opened) {
    TableGatherOptions table_options;
    table_options.mode = read_mode == "direct" ? ReadMode::kDirect : ReadMode::kBuffered;
    if (absl::Status s = (*engine)->AddTable(t.get(), table_options); !s.ok()) return fail(s);
  }
  absl::StatusOr<std::unique_ptr<Server>> server =
      Server::Create(config, std::move(*opened), std::move(*engine));
  if (!server.ok()) return fail(server.status());
  absl::Status s = (*server)->Run();
  if (!s.ok()) return fail(s);
  return 0;
}

}  // namespace
}  // namespace engram

int main(int argc, char** argv) { return engram::Main(argc, argv); }
