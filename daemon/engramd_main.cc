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
#include "absl/strings/str_join.h"
#include "daemon/cgroup_memory.h"
#include "daemon/config_file.h"
#include "daemon/control.h"
#include "daemon/gather_engine.h"
#include "daemon/log.h"
#include "daemon/notify.h"
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
    // Validating a large table (hole checks, headers of many shards) can take a while: ask
    // systemd for more start-up time before each source instead of a huge TimeoutStartSec.
    notify::Send(absl::StrFormat("EXTEND_TIMEOUT_USEC=%u\nSTATUS=Opening and validating %s",
                                 uint64_t{300} * 1'000'000, source.path));
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
  // The configuration file is read before the flags are parsed into the same settings, so a
  // flag given on the command line overrides the file.
  std::string config_path = kDefaultConfigPath;
  bool config_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      config_path = argv[i + 1];
      config_given = true;
    } else if (a.rfind("--config=", 0) == 0) {
      config_path = a.substr(9);
      config_given = true;
    }
  }
  DaemonSettings settings;
  std::vector<std::string> config_files;
  const absl::Status config_status =
      LoadConfig(config_path, config_given, &settings, &config_files);
  ServerConfig& config = settings.server;
  std::vector<std::string>&models = settings.models, &tables = settings.tables,
  &allow_users = settings.allow_users, &allow_groups = settings.allow_groups;
  std::string &rows_text = settings.rows, &log_level = settings.log_level;
  bool no_check_holes = false, check_config = false;
  std::string& mode_text = settings.socket_mode;
  app.add_option("--config", config_path,
                 "Configuration file; drop-ins in PATH.d/*.toml are applied after it")
      ->type_name("PATH")
      ->capture_default_str();
  app.add_flag("--check-config", check_config,
               "Validate the configuration and open every table, then exit without serving");
  app.add_option("--metrics-port", settings.metrics.http_port,
                 "Serve Prometheus metrics on this loopback TCP port (0: off)")
      ->capture_default_str();
  app.add_option("--metrics-textfile-dir", settings.metrics.textfile_dir,
                 "Write engramd.prom for node-exporter's textfile collector into this directory");
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
  app.add_option("--admin-uid", config.admin_uids,
                 "uid that may also run warm and evict (root and engramd's own uid always may); "
                 "repeatable")
      ->type_name("UID")
      ->check(CLI::Range(uint32_t{0}, kMaxId));
  app.add_option("--admin-gid", config.admin_gids,
                 "gid whose members may run warm and evict; repeatable")
      ->type_name("GID")
      ->check(CLI::Range(uint32_t{0}, kMaxId));
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
  uint64_t &spin_min_us = settings.spin_min_us, &spin_max_us = settings.spin_max_us;
  app.add_option("--poll-spin-min-us", spin_min_us, "Shortest polling spell before sleeping")
      ->capture_default_str();
  app.add_option("--poll-spin-max-us", spin_max_us, "Longest polling spell before sleeping")
      ->capture_default_str();
  app.add_option("--inline-rows", config.poll.inline_rows,
                 "Gather requests of up to this many rows on the polling thread")
      ->capture_default_str();
  std::string& read_mode = settings.read_mode;
  app.add_option("--read-mode", read_mode,
                 "buffered (page cache, RWF_NOWAIT fast path) or direct (O_DIRECT, for tables "
                 "much larger than RAM)")
      ->check(CLI::IsMember({"buffered", "direct"}))
      ->capture_default_str();
  app.add_option("--log-level", log_level, "error, warning, notice, info or debug")
      ->check(CLI::IsMember({"error", "warning", "notice", "info", "debug"}))
      ->capture_default_str();
  app.add_option("--memory-budget", config.memory_budget,
                 "Memory engramd.service may use, page cache included (bytes; K/M/G suffixes; "
                 "0: unbounded); see --memory-dropin")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  bool memory_dropin = false;
  app.add_flag("--memory-dropin", memory_dropin,
               "Print the systemd drop-in that bounds engramd.service to the memory budget");
  CLI11_PARSE(app, argc, argv);
  if (!config_status.ok()) {
    log::Error("engramd: {}", config_status.ToString());
    return 1;
  }
  if (memory_dropin) {
    fputs(MemoryDropIn(config.memory_budget).c_str(), stdout);
    return 0;
  }

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
  // Turns the settings into the server configuration (names resolved, text parsed). Also
  // used by SIGHUP, which reloads the files and applies the same flags again.
  auto resolve = [&]() -> absl::Status {
    if (models.empty() && tables.empty()) {
      return absl::InvalidArgumentError(
          "nothing to serve: give --model DIR or --table PATH, or tables.models / tables.files "
          "in " +
          config_path);
    }
    std::optional<RowRange> rows;
    if (!rows_text.empty()) {
      absl::StatusOr<RowRange> r = ParseRowRange(rows_text);
      if (!r.ok()) return r.status();
      rows = *r;
    }
    config.sources.clear();
    for (const auto& m : models) config.sources.push_back({.path = m, .rows = rows});
    for (const auto& t : tables) config.sources.push_back({.path = t, .rows = rows});
    if (no_check_holes) config.check_holes = false;
    char* end = nullptr;
    config.socket_mode = static_cast<uint32_t>(strtoul(mode_text.c_str(), &end, 8));
    if (end == mode_text.c_str() || *end != '\0' || config.socket_mode > 07777) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--socket-mode '%s' is not an octal file mode", mode_text));
    }
    config.allow_uids.clear();
    config.allow_gids.clear();
    for (const auto& u : allow_users) {
      absl::StatusOr<uid_t> uid = ResolveUser(u);
      if (!uid.ok()) return uid.status();
      config.allow_uids.push_back(*uid);
    }
    for (const auto& g : allow_groups) {
      absl::StatusOr<gid_t> gid = ResolveGroup(g);
      if (!gid.ok()) return gid.status();
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
      return absl::InvalidArgumentError("limits must be above 0");
    }
    return absl::OkStatus();
  };
  if (absl::Status s = resolve(); !s.ok()) return fail(s);
  log::g_max_priority = levels.at(log_level);
  if (!config_files.empty()) {
    log::Info("configuration read from {}", absl::StrJoin(config_files, ", "));
  }

  // Signals are read through a signalfd by the server: block them before any thread starts.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<std::vector<std::unique_ptr<Table>>> opened = OpenAll(config);
  if (!opened.ok()) return fail(opened.status());
  if (check_config) {
    printf("configuration OK (%s)\n", config_files.empty()
                                          ? "no configuration file; defaults and flags"
                                          : absl::StrJoin(config_files, ", ").c_str());
    for (const auto& t : *opened) {
      printf("  %s: rows [%lu, %lu) of %lu\n", t->Describe().c_str(), t->covered().begin,
             t->covered().end, t->num_rows());
    }
    printf("  may connect: %s%s\n",
           config.allow_uids.empty()
               ? absl::StrFormat("root and uid %u (engramd's own)", geteuid()).c_str()
               : ("uids " + absl::StrJoin(config.allow_uids, ",")).c_str(),
           config.allow_gids.empty()
               ? ""
               : (", members of gids " + absl::StrJoin(config.allow_gids, ",")).c_str());
    printf("  administrators (%s): %s\n", absl::StrJoin(AdminCommandNames(), ", ").c_str(),
           DescribeAdministrators(config, geteuid()).c_str());
    printf("  memory budget: %s\n",
           config.memory_budget == 0
               ? "unbounded"
               : absl::StrFormat("%u bytes (`engramd --memory-dropin` prints the unit's bounds)",
                                 config.memory_budget)
                     .c_str());
    return 0;
  }
  if (std::optional<std::string> mismatch =
          BudgetMismatch(ReadMemoryReport().cgroup, config.memory_budget)) {
    log::Warning("{}", *mismatch);
  }
  if (std::vector<int> fds = notify::ListenFds(); !fds.empty()) {
    config.listen_fd = fds[0];
    log::Info("using the socket passed by systemd for {}", config.socket_path);
  }
  absl::StatusOr<std::unique_ptr<GatherEngine>> engine =
      GatherEngine::Create({.workers = config.workers,
                            // Once per file or worker: a file without RWF_NOWAIT, io_uring
                            // missing or failing, unregistrable O_DIRECT buffers.
                            .notice = [](const std::string& notice) {
                              log::Notice("gather engine: {}", notice);
                            }});
  if (!engine.ok()) return fail(engine.status());
  for (const auto& t : *opened) {
    TableGatherOptions table_options;
    table_options.mode = read_mode == "direct" ? ReadMode::kDirect : ReadMode::kBuffered;
    if (absl::Status s = (*engine)->AddTable(t.get(), table_options); !s.ok()) return fail(s);
  }
  absl::StatusOr<std::unique_ptr<Server>> server =
      Server::Create(config, std::move(*opened), std::move(*engine));
  if (!server.ok()) return fail(server.status());
  (*server)->control().Configure(settings.metrics, log_level, ENGRAMD_VERSION);
  // SIGHUP: the files again, then the same flags over them.
  (*server)->control().SetReloader([&]() -> absl::StatusOr<ReloadedConfig> {
    DaemonSettings fresh;
    std::vector<std::string> files;
    if (absl::Status s = LoadConfig(config_path, config_given, &fresh, &files); !s.ok()) return s;
    const int listen_fd = config.listen_fd;
    settings = fresh;
    no_check_holes = false;
    app.clear();
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return absl::InvalidArgumentError(e.what());
    }
    if (absl::Status s = resolve(); !s.ok()) return s;
    config.listen_fd = listen_fd;
    return ReloadedConfig{.server = config, .log_level = log_level, .metrics = settings.metrics};
  });
  absl::Status s = (*server)->Run();
  if (!s.ok()) return fail(s);
  return 0;
}

}  // namespace
}  // namespace engram

int main(int argc, char** argv) { return engram::Main(argc, argv); }
