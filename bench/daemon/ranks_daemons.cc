// engram-ranks' engramd processes: started with the run's tables and settings (one per
// --poll-modes entry, or with a row cache of a given size), stopped, and their row cache's
// counters read through engramctl.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/common/engramd_process.h"
#include "bench/daemon/ranks.h"
#include "engram/engram.h"
#include "nlohmann/json.hpp"

namespace engram::bench::ranks {
namespace {

// Waits until both tables are resident: engram_table_map_open answers -EAGAIN while one loads.
absl::Status WaitResident(const std::string& sock) {
  engram_connect_options o;
  engram_connect_options_init(&o, sizeof(o));
  o.socket_path = sock.c_str();
  o.client_name = "engram-ranks";
  engram_session* s = nullptr;
  if (engram_session_open(&o, &s) != 0) {
    return absl::UnavailableError(absl::StrCat("connect: ", engram_last_error()));
  }
  absl::Status status = absl::DeadlineExceededError("the tables did not load within 600 s");
  for (int i = 0; i < 60000; ++i) {
    int loaded = 0;
    for (uint32_t layer : kLayers) {
      engram_table_map* m = nullptr;
      const int rc = engram_table_map_open(s, layer, &m);
      if (rc == 0) ++loaded;
      engram_table_map_close(m);
      if (rc != 0 && rc != -EAGAIN) {
        status = absl::FailedPreconditionError(
            absl::StrCat("map layer ", layer, ": ", engram_last_error()));
        i = 60000;
        break;
      }
    }
    if (loaded == 2) {
      status = absl::OkStatus();
      break;
    }
    usleep(10000);
  }
  engram_session_close(s);
  return status;
}

// Starts engramd serving the tables (args holds the table arguments already) with `tier` as its
// default tier (empty: --tier) and waits for the resident tier to load; -1 after saying why.
pid_t StartDaemon(const Config& cfg, const std::string& sock, std::vector<std::string> args,
                  std::string tier = "") {
  if (tier.empty()) tier = cfg.tier;
  args.insert(args.end(), {"--socket", sock, "--log-level", "warning", "--max-clients", "256",
                           "--default-tier", tier});
  if (cfg.emulate_latency_us != 0 || cfg.emulate_iops != 0) {
    args.insert(args.end(), {"--emulate-read-latency-us", absl::StrCat(cfg.emulate_latency_us),
                             "--emulate-read-iops", absl::StrCat(cfg.emulate_iops)});
  }
  args.insert(args.end(), cfg.daemon_args.begin(), cfg.daemon_args.end());
  if (cfg.poll_modes.empty() && !CacheTargetsMode(cfg)) {
    PrintHeader(cfg, args);
  } else {
    printf("engramd:");
    for (size_t i = 1; i < args.size(); ++i) printf(" %s", args[i].c_str());
    printf("\n");
  }
  const pid_t daemon = StartEngramd(args, sock);
  if (daemon < 0) return -1;
  if (tier == "resident") {
    if (absl::Status s = WaitResident(sock); !s.ok()) {
      fprintf(stderr, "%s\n", s.ToString().c_str());
      kill(daemon, SIGTERM);
      waitpid(daemon, nullptr, 0);
      return -1;
    }
  }
  return daemon;
}

// engramd's arguments for a --poll-modes entry ("off", "auto", "on", "on:N"); nullopt after
// saying what is wrong.
std::optional<std::vector<std::string>> PollModeArgs(const std::string& entry) {
  const std::vector<std::string> parts = absl::StrSplit(entry, ':');
  uint32_t cores = 0;
  if (parts.size() > 2 || (parts[0] != "off" && parts[0] != "on" && parts[0] != "auto") ||
      (parts.size() == 2 && (parts[0] != "on" || !absl::SimpleAtoi(parts[1], &cores)))) {
    fprintf(stderr, "--poll-modes: '%s' is not off, auto, on or on:CORES\n", entry.c_str());
    return std::nullopt;
  }
  std::vector<std::string> args = {"--poll-mode", parts[0]};
  if (parts.size() == 2) args.insert(args.end(), {"--poll-cores", parts[1]});
  return args;
}

// engramctl: --engramctl, else $ENGRAMCTL, else beside engramd (a bundle's bin/), else the build
// tree's.
std::string EngramctlPath(const Config& cfg) {
  if (!cfg.engramctl.empty()) return cfg.engramctl;
  if (const char* env = getenv("ENGRAMCTL"); env != nullptr && env[0] != '\0') return env;
  const std::filesystem::path dir = std::filesystem::path(cfg.engramd).parent_path();
  if (std::filesystem::exists(dir / "engramctl")) return (dir / "engramctl").string();
  return (dir / "../tools/engramctl/engramctl").string();
}

}  // namespace

std::vector<Daemon> StartDaemons(const Config& cfg, const std::vector<std::string>& args) {
  std::vector<Daemon> daemons;
  if (cfg.poll_modes.empty()) {
    Daemon d{"", cfg.dir + "/engramd.sock"};
    d.pid = StartDaemon(cfg, d.sock, args);
    if (d.pid > 0) daemons.push_back(d);
    return daemons;
  }
  PrintHeader(cfg, args);
  for (size_t i = 0; i < cfg.poll_modes.size(); ++i) {
    std::optional<std::vector<std::string>> mode = PollModeArgs(cfg.poll_modes[i]);
    Daemon d{cfg.poll_modes[i], absl::StrCat(cfg.dir, "/engramd-", i, ".sock")};
    if (mode) {
      std::vector<std::string> with = args;
      with.insert(with.end(), mode->begin(), mode->end());
      d.pid = StartDaemon(cfg, d.sock, with);
    }
    if (d.pid <= 0) {
      StopDaemons(daemons);
      return {};
    }
    daemons.push_back(d);
  }
  printf("\n");
  return daemons;
}

int StopDaemons(const std::vector<Daemon>& daemons) {
  int first = 0;
  for (const Daemon& d : daemons) kill(d.pid, SIGTERM);
  for (const Daemon& d : daemons) {
    int status = 0;
    waitpid(d.pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (first == 0) first = code;
  }
  return first;
}

Daemon StartLabelled(const Config& cfg, const std::string& label, const std::string& tier,
                     uint64_t cache_bytes, std::vector<std::string> args) {
  if (cache_bytes != 0) args.insert(args.end(), {"--cache-bytes", absl::StrCat(cache_bytes)});
  Daemon d{label, absl::StrCat(cfg.dir, "/engramd-", label.substr(0, label.find(' ')), ".sock")};
  printf("%s, ", label.c_str());  // StartDaemon prints the command line after it
  d.pid = StartDaemon(cfg, d.sock, args, tier);
  fflush(stdout);
  return d;
}

// An engramd whose row cache holds `rows` rows (within 2 %): the cache's bookkeeping per slot
// depends on its size (store/row_cache.cc), so the size is found by starting it, reading the
// capacity engramctl reports and starting it again with the bytes scaled (at most 4 starts).
// pid -1 after saying why.
Daemon StartSizedCache(const Config& cfg, const std::string& label, uint64_t rows,
                       const std::vector<std::string>& args) {
  uint64_t bytes = rows * 400 + (64 << 10);
  for (int attempt = 0;; ++attempt) {
    Daemon d = StartLabelled(cfg, label, "cache", bytes, args);
    if (d.pid <= 0) return d;
    const auto c = ReadCacheCounters(cfg, d.sock);
    if (!c.ok() || c->capacity_rows == 0) {
      fprintf(stderr, "%s: %s\n", label.c_str(),
              c.ok() ? "the row cache reports no capacity" : c.status().ToString().c_str());
      StopDaemons({d});
      return Daemon{label, d.sock, -1};
    }
    const double off = double(c->capacity_rows) / double(rows);
    if ((off > 0.98 && off < 1.02) || attempt == 3) {
      printf("engramd (%s): the row cache holds %" PRIu64 " rows (%.3f of the %" PRIu64
             " wanted)\n",
             label.c_str(), c->capacity_rows, off, rows);
      return d;
    }
    StopDaemons({d});
    bytes = static_cast<uint64_t>(double(bytes) / off) + 4096;
  }
}

absl::StatusOr<CacheCounters> ReadCacheCounters(const Config& cfg, const std::string& sock) {
  const std::string line =
      absl::StrCat(EngramctlPath(cfg), " status --json --socket ", sock, " 2>&1");
  FILE* p = popen(line.c_str(), "r");
  if (p == nullptr) return absl::InternalError(absl::StrCat("cannot run `", line, "`"));
  std::string text;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) text.append(buf, n);
  const int rc = pclose(p);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (rc != 0 || j.is_discarded() || !j.contains("store") || !j["store"].contains("cache")) {
    return absl::UnavailableError(absl::StrCat("`", line, "` gave no row cache counters (set ",
                                               "--engramctl): ", text.substr(0, 200)));
  }
  const nlohmann::json& c = j["store"]["cache"];
  return CacheCounters{c.value("hits", uint64_t{0}), c.value("misses", uint64_t{0}),
                       c.value("used_rows", uint64_t{0}), c.value("capacity_rows", uint64_t{0})};
}

double HitRate(const CacheCounters& a, const CacheCounters& b) {
  const uint64_t hits = b.hits - a.hits, lookups = hits + (b.misses - a.misses);
  return lookups == 0 ? -1 : double(hits) / double(lookups);
}

}  // namespace engram::bench::ranks
