// engramd: opens and validates the Engram tables named on the command line, then serves row
// gathers to local clients through the Unix socket and shared-memory arenas until SIGTERM. Main
// composes the process: the settings (daemon/ops/config_resolve.h), the client socket, the
// gather engine, the row store, the server and operations' Control over it.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "base/log.h"
#include "base/page_size.h"
#include "cli/command_line.h"
#include "daemon/ops/cgroup_memory.h"
#include "daemon/ops/config_file.h"
#include "daemon/ops/config_resolve.h"
#include "daemon/ops/control.h"
#include "daemon/ops/fd_store.h"
#include "daemon/ops/notify.h"
#include "daemon/ops/start_checks.h"
#include "daemon/ops/starting_gate.h"
#include "daemon/server/hot_set.h"
#include "daemon/server/server.h"
#include "daemon/server/server_config.h"
#include "gather/gather_engine.h"
#include "store/cache_handoff.h"
#include "store/pressure_monitor.h"
#include "store/row_store.h"
#include "tables/table.h"

namespace engram {
namespace {

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

// A row store error with the budget's split appended, when a budget is set: what the store's
// share is and where the rest went.
absl::Status WithPlan(const absl::Status& s, const MemoryPlan& plan) {
  if (!plan.bounded()) return s;
  return absl::Status(
      s.code(), absl::StrFormat("%s ([memory] budget: %s)", s.message(), DescribeMemoryPlan(plan)));
}

// Without a budget nothing bounds the row store but [memory] cache and the resident tables'
// sizes: refuses a store larger than the machine's memory (MemTotal), which would fill it and be
// OOM-killed, with the numbers. (A budget above MemTotal is refused by PlanMemory.)
absl::Status CheckStoreFitsMachine(const StoreConfig& store,
                                   const std::vector<std::unique_ptr<Table>>& tables,
                                   uint64_t mem_total) {
  if (store.budget_bytes != 0 || mem_total == 0) return absl::OkStatus();
  uint64_t resident = 0;
  bool any_cache = false;
  for (const auto& t : tables) {
    const Tier tier = store.TierOf(t->layer_id());
    if (tier == Tier::kResident) resident += t->data_bytes();
    any_cache |= tier == Tier::kCache;
  }
  const uint64_t cache = any_cache ? store.cache_bytes : 0;
  if (cache + resident <= mem_total) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "the row store would hold %.2f GiB (%u bytes: row cache [memory] cache %.2f GiB + resident "
      "tables %.2f GiB) but this machine's memory is MemTotal %.2f GiB (%u bytes): it would be "
      "OOM-killed before the store is full; lower [memory] cache, move tables to the cache or "
      "storage tier, or set [memory] budget",
      double(cache + resident) / (1 << 30), cache + resident, double(cache) / (1 << 30),
      double(resident) / (1 << 30), double(mem_total) / (1 << 30), mem_total));
}

// Opens the tables and checks the row store's settings against them: what --check-config and a
// start both run, so that a configuration one refuses the other refuses too, with the same words.
absl::StatusOr<std::vector<std::unique_ptr<Table>>> OpenChecked(const DaemonSettings& settings) {
  absl::StatusOr<std::vector<std::unique_ptr<Table>>> opened = OpenAll(settings.server);
  if (!opened.ok()) return opened.status();
  if (absl::Status s = RowStore::Validate(settings.store, *opened); !s.ok()) {
    return WithPlan(s, settings.server.memory_plan);
  }
  if (absl::Status s = CheckStoreFitsMachine(settings.store, *opened, ReadMemTotal().value_or(0));
      !s.ok()) {
    return s;
  }
  return opened;
}

int Fail(const absl::Status& s) {
  log::Error("engramd: {}", s.ToString());
  return 1;
}

// Signals are read through a signalfd by the server: block them before any thread starts.
void BlockSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

// --check-config: what would be served, and to whom.
void PrintCheckedConfig(const ServerConfig& config, const StoreConfig& store,
                        const std::vector<std::string>& files,
                        const std::vector<std::unique_ptr<Table>>& tables) {
  printf("configuration OK (%s)\n", files.empty() ? "no configuration file; defaults and flags"
                                                  : absl::StrJoin(files, ", ").c_str());
  for (const auto& t : tables) {
    printf("  %s: rows [%lu, %lu) of %lu, tier %s\n", t->Describe().c_str(), t->covered().begin,
           t->covered().end, t->num_rows(), TierName(store.TierOf(t->layer_id())));
  }
  printf("  may connect: %s\n", DescribeAdmitted(config, geteuid()).c_str());
  printf("  administrators (%s): %s\n", absl::StrJoin(AdminCommandNames(), ", ").c_str(),
         DescribeAdministrators(config, geteuid()).c_str());
  printf("  memory budget: %s\n",
         config.memory_budget == 0
             ? "unbounded"
             : absl::StrFormat("%u bytes: %s (`engramd --memory-dropin` prints the unit's bounds)",
                               config.memory_budget, DescribeMemoryPlan(config.memory_plan))
                   .c_str());
}

// The hot set written by the last run, read as a start that did not keep the row cache reads it;
// nullopt when there is none to warm from, the reason logged.
std::optional<std::vector<uint64_t>> ReadLastHotSet(const ServerConfig& config) {
  absl::StatusOr<std::vector<uint64_t>> keys = ReadHotSet(config.hot_set_path, config.hot_set_rows);
  if (!keys.ok()) {
    if (absl::IsNotFound(keys.status())) {
      log::Info("hot set not warmed: {}", std::string(keys.status().message()));
    } else {
      log::Warning("hot set not warmed: {}", std::string(keys.status().message()));
    }
    return std::nullopt;
  }
  return std::move(*keys);
}

// The warmer of a start whose row cache was not kept: the hot set written by the last run, if
// there is one to read (null otherwise, with the reason logged).
std::unique_ptr<HotSetWarmer> MakeWarmer(const ServerConfig& config, bool adopted) {
  if (adopted) {
    log::Info("hot set not warmed: the row cache was kept across the restart");
    return nullptr;
  }
  std::optional<std::vector<uint64_t>> keys = ReadLastHotSet(config);
  if (!keys) return nullptr;
  log::Notice("row cache: warming {} rows of the hot set in {} in the background", keys->size(),
              config.hot_set_path);
  return std::make_unique<HotSetWarmer>(std::move(*keys));
}

// `text` wrapped to 80 columns for --check-config's listing, each line after the first indented
// by `indent` + 2.
std::string Wrapped(const std::string& text, size_t indent) {
  std::string out(indent, ' ');
  size_t column = indent;
  // A size stays on one line with its unit ("786.7 MiB").
  const std::string glued = absl::StrReplaceAll(text, {{" MiB", "\x01MiB"}, {" GiB", "\x01GiB"}});
  for (absl::string_view piece : absl::StrSplit(glued, ' ', absl::SkipEmpty())) {
    std::string word(piece);
    std::replace(word.begin(), word.end(), '\x01', ' ');
    if (column > indent && column + 1 + word.size() > 80) {
      out += "\n" + std::string(indent + 2, ' ');
      column = indent + 2;
    } else if (column > indent) {
      out += ' ';
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
  }
  return out;
}

// --check-config: the row cache a start would make (RowStore::PlanCache, the cache's own sizing)
// and the files of it a start would read (the PSI file, the hot set), read as the start reads
// them and reported in its words.
void CheckCacheFiles(const DaemonSettings& settings,
                     const std::vector<std::unique_ptr<Table>>& tables) {
  const StoreConfig& store = settings.store;
  std::optional<RowCacheSizing> plan = RowStore::PlanCache(store, tables);
  if (!plan) return;
  std::vector<const Table*> cached;
  for (const auto& t : tables) {
    if (store.TierOf(t->layer_id()) == Tier::kCache) cached.push_back(t.get());
  }
  printf("%s\n", Wrapped(RowStore::DescribeCache(*plan, store, cached), 2).c_str());
  if (store.pressure) {
    absl::StatusOr<std::string> psi = store.pressure_file.empty()
                                          ? FindMemoryPressureFile()
                                          : absl::StatusOr<std::string>(store.pressure_file);
    absl::Status s = psi.ok() ? CheckPressureFile(*psi) : psi.status();
    if (s.ok()) {
      printf("  row cache follows memory pressure from %s\n", psi->c_str());
    } else if (store.pressure_file.empty()) {  // a file named in the settings: StartWarnings
      log::Notice("row cache keeps its size under memory pressure: {}", std::string(s.message()));
    }
  }
  const std::string& hot = settings.server.hot_set_path;
  if (hot.empty()) return;
  if (std::optional<std::vector<uint64_t>> keys = ReadLastHotSet(settings.server)) {
    printf("  hot set: %zu rows in %s, warmed after a start that does not keep the row cache\n",
           keys->size(), hot.c_str());
  }
}

// --check-config: what a start would refuse or warn of, found by the functions the start runs,
// in the same order and words (the socket, the metrics port, the tables and the row store, the
// files the settings name), then what it would serve. Exits 1 where the start would, but for an
// engramd serving on the path: that one is said as a warning, since a configuration is checked
// before the restart that stops it (as `nginx -t` and `sshd -t` check beside a running daemon).
int CheckConfig(const DaemonSettings& settings, const std::vector<std::string>& files) {
  if (absl::Status s = CheckClientSocket(settings.server); absl::IsAlreadyExists(s)) {
    log::Warning("{} (a start beside it is refused; a restart stops it first)",
                 std::string(s.message()));
  } else if (!s.ok()) {
    return Fail(s);
  }
  if (std::optional<std::string> port = CheckMetricsPort(settings.metrics)) {
    log::Warning("{}", *port);
  }
  absl::StatusOr<std::vector<std::unique_ptr<Table>>> opened = OpenChecked(settings);
  if (!opened.ok()) return Fail(opened.status());
  for (const std::string& w : StartWarnings(settings, *opened)) log::Warning("{}", w);
  PrintCheckedConfig(settings.server, settings.store, files, *opened);
  CheckCacheFiles(settings, *opened);
  return 0;
}

// A SIGTERM or SIGINT came while starting: engramd stops, as it would once serving.
int StoppedWhileStarting() {
  notify::Send("STOPPING=1\nSTATUS=Stopped before serving");
  log::Notice("engramd stopped before serving");
  return 0;
}

std::string Gib(uint64_t bytes) { return absl::StrFormat("%.2f GiB", double(bytes) / (1 << 30)); }

// What the row store is about to build, for the start's progress: "building the row store: row
// cache up to 48.00 GiB, 1 resident table(s) of 7.50 GiB".
std::string StoreStep(const StoreConfig& store, const std::vector<std::unique_ptr<Table>>& tables) {
  uint64_t resident = 0, resident_bytes = 0;
  bool any_cache = false;
  for (const auto& t : tables) {
    const Tier tier = store.TierOf(t->layer_id());
    resident += tier == Tier::kResident ? 1 : 0;
    resident_bytes += tier == Tier::kResident ? t->data_bytes() : 0;
    any_cache |= tier == Tier::kCache;
  }
  std::string step = "building the row store:";
  if (any_cache) {
    step += store.cache_bytes != 0 ? " row cache up to " + Gib(store.cache_bytes)
                                   : std::string(" row cache of what the budget leaves");
  }
  if (resident != 0) {
    absl::StrAppendFormat(&step, "%s%u resident table(s) of %s", any_cache ? ", " : " ", resident,
                          Gib(resident_bytes));
  }
  return step;
}

// The one block an operator reads when engramd starts serving: what it is, what it serves from
// where, and how much memory and how many threads it took.
std::string ServingSummary(const ServerConfig& config, const StoreConfig& store_config,
                           const Server& server, double start_seconds, uint16_t metrics_port) {
  std::vector<std::string> tables;
  bool huge = false;
  for (const auto& t : server.tables()) {
    const Tier tier = store_config.TierOf(t->layer_id());
    std::string line = absl::StrFormat("layer %u %s", t->layer_id(), TierName(tier));
    const RowStore* store = server.row_store();
    if (const ResidentTable* r = store != nullptr ? store->resident(t->layer_id()) : nullptr) {
      absl::StrAppendFormat(&line, " (%s, %s pages)", Gib(t->data_bytes()),
                            PageSizeName(r->page_bytes()));
      huge |= r->huge_pages();
    }
    tables.push_back(line);
  }
  const RowStore* store = server.row_store();
  const std::string cache =
      store != nullptr && store->cache() != nullptr
          ? absl::StrFormat("%s (%u rows)", Gib(store->cache()->region_bytes()),
                            store->cache()->capacity_slots())
          : "none";
  const uint32_t cpus = std::thread::hardware_concurrency();
  return absl::StrFormat(
      "engramd %s (protocol %u.%u) serving, pid %d, %.1f s after start, on %s: %u table(s): %s; "
      "row cache %s; memory budget %s; %u gather worker(s), %u request thread(s); polling "
      "mode %s; huge pages %s; metrics %s",
      ENGRAMD_VERSION, ENGRAM_PROTOCOL_MAJOR, ENGRAM_PROTOCOL_MINOR, getpid(), start_seconds,
      config.socket_path, tables.size(), absl::StrJoin(tables, ", "), cache,
      config.memory_plan.bounded() ? DescribeMemoryPlan(config.memory_plan)
                                   : std::string("unbounded"),
      config.workers != 0 ? config.workers : cpus,
      config.request_threads != 0 ? config.request_threads : DefaultRequestThreads(cpus),
      config.poll.hold_cores != 0
          ? absl::StrFormat("%u core(s) while clients are active", config.poll.hold_cores)
          : std::string("off"),
      huge ? "in use" : (store_config.huge_pages ? "asked for, none in use" : "off"),
      metrics_port != 0 ? absl::StrFormat("on port %u", metrics_port) : std::string("off"));
}

// The gather engine as the settings say.
absl::StatusOr<std::unique_ptr<GatherEngine>> StartEngine(const DaemonSettings& settings) {
  if (settings.emulate_read_latency_us != 0 || settings.emulate_read_iops != 0) {
    log::Warning(
        "engine.emulate_read_*: every O_DIRECT read is held to an emulated device ({} µs, {} "
        "reads/s of 4 KiB; 0: no bound): for benchmarks only",
        settings.emulate_read_latency_us, settings.emulate_read_iops);
  }
  return GatherEngine::Create(
      {.workers = settings.server.workers,
       .direct_bounce_bytes = DirectBounceBytes(settings.server.memory_budget),
       // Once per file or worker: a file without RWF_NOWAIT, io_uring
       // missing or failing, unregistrable O_DIRECT buffers.
       .notice = [](const std::string& notice) { log::Notice("gather engine: {}", notice); },
       .emulated_device = {.latency_ns = settings.emulate_read_latency_us * 1000,
                           .iops = settings.emulate_read_iops}});
}

// Starts the gather engine, the row store and the server on the opened tables, takes the socket
// over from the gate and serves until a signal.
int Serve(const ConfigSources& sources, DaemonSettings* settings,
          std::vector<std::unique_ptr<Table>> tables, StartingGate& gate, UniqueFd kept_cache) {
  ServerConfig& config = settings->server;
  if (std::optional<std::string> mismatch =
          BudgetMismatch(ReadMemoryReport().cgroup, config.memory_budget)) {
    log::Warning("{}", *mismatch);
  }
  if (config.memory_plan.bounded()) {
    log::Info("memory.budget split: {}", DescribeMemoryPlan(config.memory_plan));
  }
  gate.Step("starting the gather engine");
  CacheHandoff handoff{.fd = std::move(kept_cache), .tables_identity = TablesIdentity(tables)};
  absl::StatusOr<std::unique_ptr<GatherEngine>> engine = StartEngine(*settings);
  if (!engine.ok()) return Fail(engine.status());
  if (gate.stop_requested()) return StoppedWhileStarting();
  StoreConfig store_config = settings->store;  // a SIGHUP replaces *settings
  // Start warned that the PSI file named cannot be read: the store would say so again.
  if (PressureFileWarned(*settings, tables)) store_config.pressure = false;
  bool use_store = false;
  for (const auto& t : tables) {
    const Tier tier = store_config.TierOf(t->layer_id());
    use_store |= tier != Tier::kStorage;
    TableGatherOptions table_options;
    table_options.mode = RowStore::ReadModeFor(
        tier, settings->read_mode == "direct" ? ReadMode::kDirect : ReadMode::kBuffered);
    if (absl::Status s = (*engine)->AddTable(t.get(), table_options); !s.ok()) return Fail(s);
  }
  std::unique_ptr<RowStore> store;
  if (use_store && !gate.stop_requested()) {
    gate.Step(StoreStep(store_config, tables));
    auto created = RowStore::Create(
        store_config, tables, engine->get(),
        [](const std::string& line) { log::Notice("{}", line); }, &handoff);
    if (!created.ok()) return Fail(WithPlan(created.status(), config.memory_plan));
    store = std::move(*created);
  }
  if (store != nullptr && store->cache() != nullptr) {
    if (StoreRowCacheFd(store->cache()->fd(), handoff.adopted)) {
      log::Info("row cache handed to systemd's file-descriptor store as {} (kept across restarts)",
                kRowCacheFdName);
    }
  } else if (handoff.fd.valid()) {
    log::Notice(
        "row cache: discarded the region handed over by the previous engramd: no table "
        "uses the cache tier now");
    handoff.fd.Reset();
    notify::Send(absl::StrFormat("FDSTOREREMOVE=1\nFDNAME=%s", kRowCacheFdName));
  }
  gate.Step("starting the server");
  config.listen_fd = gate.TakeSocket();
  if (gate.stop_requested()) return StoppedWhileStarting();
  std::unique_ptr<metrics::HttpListener> http = gate.TakeHttp();
  const uint16_t metrics_port = http != nullptr ? http->port() : 0;
  absl::StatusOr<std::unique_ptr<Server>> server =
      Server::Create(config, std::move(tables), std::move(*engine), [&](ServerView* view) {
        auto control = std::make_unique<Control>(view);
        control->Configure(*settings, ENGRAMD_VERSION, std::move(http));
        control->SetReloader([&sources, settings] { return ReloadSettings(sources, settings); });
        return control;
      });
  if (!server.ok()) return Fail(server.status());
  (*server)->SetSocketClaim(gate.TakeClaim());
  if (store != nullptr) {
    store->StartLoading(store_config.load_at_start);
    std::unique_ptr<HotSetKeeper> keeper;
    std::unique_ptr<HotSetWarmer> warmer;
    if (store->cache() != nullptr && !config.hot_set_path.empty()) {
      keeper = std::make_unique<HotSetKeeper>(config.hot_set_path,
                                              uint64_t{config.hot_set_interval_s} * 1'000'000'000,
                                              config.hot_set_rows, store->cache());
      warmer = MakeWarmer(config, handoff.adopted);
    }
    (*server)->SetRowStore(std::move(store));
    (*server)->SetHotSet(std::move(keeper), std::move(warmer));
  }
  log::Notice("{}", ServingSummary(config, store_config, **server, gate.Elapsed(), metrics_port));
  if (absl::Status s = (*server)->Run(); !s.ok()) return Fail(s);
  return 0;
}

// The client socket: the one systemd passed (socket activation; no claim), or bound at
// socket.path under engramd's claim on the path.
absl::StatusOr<BoundSocket> ClientSocket(const ServerConfig& config, int passed_fd) {
  if (passed_fd >= 0) {
    log::Info("using the socket passed by systemd for {}", config.socket_path);
    return BoundSocket{.fd = UniqueFd(passed_fd), .claim = nullptr};
  }
  return BindClientSocket(config);
}

// The start: the socket answers "starting" from here on (StartingGate) while the tables open
// and the row store is built, then Serve hands it to the server.
int Start(const ConfigSources& sources, DaemonSettings* settings) {
  log::Info("engramd {} (protocol {}.{}) starting, pid {}", ENGRAMD_VERSION, ENGRAM_PROTOCOL_MAJOR,
            ENGRAM_PROTOCOL_MINOR, getpid());
  const ServerConfig& config = settings->server;
  // Socket activation's listening socket and the row cache kept in the file-descriptor store
  // come in together, told apart by name (cache_handoff.h).
  PassedFds passed = TakePassedFds();
  for (const std::string& note : passed.notes) log::Notice("{}", note);
  absl::StatusOr<BoundSocket> socket = ClientSocket(config, passed.socket_fd);
  if (!socket.ok()) return Fail(socket.status());
  absl::StatusOr<std::unique_ptr<StartingGate>> gate = StartingGate::Open(
      std::move(socket->fd), std::move(socket->claim), settings->metrics, ENGRAMD_VERSION);
  if (!gate.ok()) return Fail(gate.status());
  (*gate)->Step(
      absl::StrFormat("opening and validating %u table source(s)", config.sources.size()));
  absl::StatusOr<std::vector<std::unique_ptr<Table>>> opened = OpenChecked(*settings);
  if (!opened.ok()) return Fail(opened.status());
  for (const std::string& w : StartWarnings(*settings, *opened)) log::Warning("{}", w);
  if ((*gate)->stop_requested()) return StoppedWhileStarting();
  return Serve(sources, settings, std::move(*opened), **gate, std::move(passed.row_cache));
}

int Main(int argc, char** argv) {
  CLI::App app{"engramd: serves DeepSeek-V4.1 Engram table rows to local processes"};
  app.set_version_flag("--version", absl::StrFormat("engramd %s (protocol %u.%u)", ENGRAMD_VERSION,
                                                    ENGRAM_PROTOCOL_MAJOR, ENGRAM_PROTOCOL_MINOR));
  ConfigSources sources{.app = &app, .argc = argc, .argv = argv};
  sources.config_path = FindConfigPath(argc, argv, &sources.config_given);
  DaemonSettings settings;
  std::vector<std::string> config_files;
  const absl::Status config_status =
      LoadConfig(sources.config_path, sources.config_given, &settings, &config_files);
  bool check_config = false;
  std::string config_flag = sources.config_path;  // parsed again by FindConfigPath
  app.add_option("--config", config_flag,
                 "Configuration file; drop-ins in PATH.d/*.toml are applied after it")
      ->type_name("PATH")
      ->capture_default_str();
  app.add_flag("--check-config", check_config,
               "Validate the configuration and open every table, then exit without serving");
  bool memory_dropin = false;
  app.add_flag("--memory-dropin", memory_dropin,
               "Print the systemd drop-in that bounds engramd.service to memory.budget, then exit");
  AddSettingFlags(app, &settings);
  app.footer(
      "Settings marked [SIGHUP: live] change on SIGHUP (systemctl reload engramd); a change to "
      "any other is logged as needing a restart.");
  if (std::optional<int> done = cli::Parse(app, argc, argv)) return *done;  // usage errors: 2
  if (!config_status.ok()) return Fail(config_status);
  if (memory_dropin) {
    absl::StatusOr<MemoryPlan> plan = MemoryPlanFor(settings);
    if (!plan.ok()) return Fail(plan.status());
    fputs(MemoryDropIn(*plan).c_str(), stdout);
    return 0;
  }
  log::SetLogLevel(settings.log_level);  // checked when it was set
  if (absl::Status s = ResolveSettings(sources.config_path, &settings); !s.ok()) return Fail(s);
  // Before anything is opened: a FIFO named here would block the start, a device be read or
  // replaced (config_resolve.h). --check-config refuses what a start refuses.
  if (absl::Status s = CheckPathSettings(settings); !s.ok()) return Fail(s);
  if (!config_files.empty()) {
    log::Info("configuration read from {}", absl::StrJoin(config_files, ", "));
  }
  BlockSignals();
  if (check_config) return CheckConfig(settings, config_files);
  return Start(sources, &settings);
}

}  // namespace
}  // namespace engram

int main(int argc, char** argv) { return engram::Main(argc, argv); }
