// engram-ranks: decode latency under load. N client processes (one per engine rank) each gather
// their rank's rows of both Engram layers every T ms on a common clock, through engramd and, side
// by side, with the same gather engine in each process and with a plain io_uring loop in each
// process; per-step p50/p99/p99.9 per rank, aggregate rows/s and CPU per row; a mixed case runs
// one prefill process next to the decode ranks. With --prefetch-flood N, one decode rank alone
// and then beside N processes that send PREFETCH entries as fast as engramd answers them. With
// --steady and --timeline-s (--tier cache, --trace), the row cache's targets instead: a steady
// state with part of the trace's rows cached against all of them cached plus one device read,
// decode alone and beside a prefill, the all-hit cache read in place against a resident table,
// and a cold start's p99 and hit rate per window (bench/README.md, "DGX Spark targets").
//
// This file is the driver's entry: the options, their checks, and the run; ranks.h says where
// the rest of the driver and the cases are.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>

#include "absl/strings/str_split.h"
#include "base/clock.h"
#include "bench/common/engramd_process.h"
#include "bench/daemon/ranks.h"
#include "bench/daemon/ranks_gatherers.h"

namespace engram::bench::ranks {
namespace {

// Fills in engramd's path and a temporary work directory when the options left them out;
// false (after saying why) when the directory cannot be made.
bool ResolveDefaults(Config& cfg, bool* temp_dir) {
  if (cfg.engramd.empty()) {
    cfg.engramd = EngramdPath(
        (std::filesystem::canonical("/proc/self/exe").parent_path() / "../../daemon/engramd")
            .string());
  }
  *temp_dir = cfg.dir.empty();
  if (*temp_dir) {
    char tmpl[] = "/var/tmp/engram-ranks-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      perror("mkdtemp");
      return false;
    }
    cfg.dir = tmpl;
  }
  std::filesystem::create_directories(cfg.dir);
  return true;
}

// The methods to run, checked against the tier and the other options; nullopt after saying
// what is wrong.
std::optional<std::vector<std::string>> CheckedMethods(Config& cfg) {
  if (cfg.tier != "storage" && cfg.tier != "resident" && cfg.tier != "cache") {
    fprintf(stderr, "--tier: '%s' is not storage, resident or cache\n", cfg.tier.c_str());
    return std::nullopt;
  }
  if (cfg.methods_arg.empty()) {
    cfg.methods_arg =
        cfg.tier == "resident" ? "daemon,inplace,mapped,engine" : "daemon,engine,uring";
  }
  std::vector<std::string> methods = absl::StrSplit(cfg.methods_arg, ',', absl::SkipEmpty());
  for (const std::string& m : methods) {
    if (!ThroughDaemon(m) && m != "engine" && m != "uring" && m != "mapped") {
      fprintf(stderr,
              "--methods: unknown method '%s' (daemon, inplace, pieces, mapped, engine, uring)\n",
              m.c_str());
      return std::nullopt;
    }
    if (m == "pieces" && cfg.piece_rows == 0) {
      fprintf(stderr, "--piece-rows must be positive for the pieces method\n");
      return std::nullopt;
    }
    if (m == "mapped" && cfg.tier != "resident") {
      fprintf(stderr,
              "--methods: 'mapped' reads the daemon's resident tables: add --tier resident\n");
      return std::nullopt;
    }
  }
  if (CacheTargetsMode(cfg)) {
    if (cfg.tier != "cache" || cfg.trace.empty()) {
      fprintf(stderr,
              "--steady and --timeline-s measure the cache tier on a trace: add --tier "
              "cache and --trace FILE\n");
      return std::nullopt;
    }
    for (const std::string& a : cfg.daemon_args) {
      if (a.rfind("--cache-bytes", 0) == 0 || a.rfind("--default-tier", 0) == 0) {
        fprintf(stderr,
                "--daemon-arg=%s: --steady and --timeline-s size the cache and pick the "
                "tier themselves\n",
                a.c_str());
        return std::nullopt;
      }
    }
    if (!(cfg.cache_fraction > 0 && cfg.cache_fraction < 1) || !(cfg.warm_passes > 0) ||
        !(cfg.window_s > 0) || cfg.period_ms <= 0 || cfg.read_samples == 0) {
      fprintf(stderr,
              "--cache-fraction must be in (0, 1); --warm-passes, --window-s, "
              "--period-ms and --read-samples positive\n");
      return std::nullopt;
    }
  }
  for (int n : cfg.ranks) {
    if (n < 1 || n > kMaxRanks) {
      fprintf(stderr, "--ranks: %d is not in [1, %d]\n", n, kMaxRanks);
      return std::nullopt;
    }
  }
  return methods;
}

int Run(Config& cfg) {
  bool temp_dir = false;
  if (!ResolveDefaults(cfg, &temp_dir)) return 1;
  const std::optional<std::vector<std::string>> methods = CheckedMethods(cfg);
  if (!methods) return 2;
  std::vector<std::unique_ptr<Table>> owned;
  std::vector<std::string> args = {cfg.engramd};
  if (absl::Status s = PrepareTables(cfg, &owned, &args); !s.ok()) {
    fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  Env env{.cfg = &cfg, .tables = {owned[0].get(), owned[1].get()}};
  StepTrace trace;
  if (!cfg.trace.empty()) {
    auto t = ReadStepTrace(cfg.trace, std::min(owned[0]->num_rows(), owned[1]->num_rows()));
    if (!t.ok()) {
      fprintf(stderr, "%s\n", t.status().ToString().c_str());
      return 2;
    }
    trace = std::move(*t);
    env.trace = &trace;
  }
  if (CacheTargetsMode(cfg)) {
    const uint64_t t0 = NowNs();
    const int failures = RunCacheTargets(env, args);
    printf("\n%s in %.0f s\n", failures ? "FAILURES" : "every case ran", (NowNs() - t0) / 1e9);
    owned.clear();
    if (temp_dir) std::filesystem::remove_all(cfg.dir);
    return failures == 0 ? 0 : 1;
  }
  const std::vector<Daemon> daemons = StartDaemons(cfg, args);
  if (daemons.empty()) return 1;
  const uint64_t t0 = NowNs();
  const int failures = RunMatrix(env, *methods, daemons);
  const int stopped = StopDaemons(daemons);
  printf("\n%s in %.0f s; engramd exit status %d\n", failures ? "FAILURES" : "every case ran",
         (NowNs() - t0) / 1e9, stopped);
  owned.clear();
  if (temp_dir) std::filesystem::remove_all(cfg.dir);
  return failures == 0 && stopped == 0 ? 0 : 1;
}

// The options of the cache tier's targets (RunCacheTargets).
void AddCacheTargetOptions(CLI::App& app, Config& cfg) {
  app.add_flag("--steady", cfg.steady,
               "instead of the matrix (--tier cache --trace FILE): for each --ranks count, the "
               "trace's ids with a cache holding --cache-fraction of the trace's rows, warmed by "
               "the workload, against the same ids with every row cached plus one O_DIRECT read "
               "(measured here); then decode alone and beside a prefill on that cache; then the "
               "all-hit cache read in place against a resident table read in place");
  app.add_option("--cache-fraction", cfg.cache_fraction,
                 "--steady, --timeline-s: the part cache holds this fraction of the distinct rows "
                 "the trace reads")
      ->capture_default_str();
  app.add_option("--warm-passes", cfg.warm_passes,
                 "--steady: passes over the trace (shared among the ranks, back to back) that "
                 "warm the cache before each rank count's timed steps")
      ->capture_default_str();
  app.add_option("--timeline-s", cfg.timeline_s,
                 "(--tier cache --trace FILE) a cold start: a fresh engramd with an empty cache "
                 "of the part cache's size, the last --ranks count paced for this many seconds, "
                 "p50/p99 and hit rate per --window-s window and when every window's p99 came "
                 "within 2x of the steady state's (0: no timeline)")
      ->capture_default_str();
  app.add_option("--window-s", cfg.window_s, "--timeline-s: seconds a window")
      ->capture_default_str();
  app.add_option("--read-samples", cfg.read_samples,
                 "--steady, --timeline-s: O_DIRECT 4 KiB reads at queue depth 1 that measure one "
                 "device read")
      ->capture_default_str();
  app.add_option("--engramctl", cfg.engramctl,
                 "engramctl binary for the row cache's counters (default: $ENGRAMCTL, beside "
                 "engramd, or the build's)");
}

void AddOptions(CLI::App& app, Config& cfg) {
  app.add_option("--engramd", cfg.engramd, "engramd binary (default: $ENGRAMD or the build's)");
  app.add_option("--dir", cfg.dir, "where the tables are written and reused (default: temporary)");
  app.add_option("--rows", cfg.rows, "rows per table")->capture_default_str();
  app.add_option("--layout", cfg.layout, "checkpoint or packed")->capture_default_str();
  app.add_option("--ranks", cfg.ranks, "client processes per case")->delimiter(',');
  app.add_option("--tp", cfg.tp, "rank r reads slice r mod tp of every table")
      ->capture_default_str();
  app.add_option("--step-rows", cfg.step_rows, "rows per layer per step")->capture_default_str();
  app.add_option("--period-ms", cfg.period_ms, "one step every this many ms (0: back to back)")
      ->capture_default_str();
  app.add_option("--steps", cfg.steps, "steps per rank and case")->capture_default_str();
  app.add_option("--zipf-s", cfg.zipf_s, "Zipf exponent")->capture_default_str();
  app.add_option("--miss", cfg.miss,
                 "fraction of each step's rows evicted before the step in the miss cases (0: no "
                 "miss cases)")
      ->capture_default_str();
  app.add_option("--trace", cfg.trace,
                 "row ids per step from a text file: one line per step, LAYER:ID,ID,... groups");
  app.add_option("--tier", cfg.tier,
                 "the daemon's tier for both tables: storage, resident (adds the inplace and "
                 "mapped methods: the same memory read in each rank's process) or cache (give it "
                 "a size with "
                 "--daemon-arg=--cache-bytes=...)")
      ->capture_default_str();
  app.add_option("--methods", cfg.methods_arg,
                 "daemon, inplace, pieces, mapped, engine, uring (default: daemon,engine,uring; "
                 "with --tier resident daemon,inplace,mapped,engine)");
  app.add_option("--piece-rows", cfg.piece_rows,
                 "the pieces method: rows per request (each layer's step in pieces)")
      ->capture_default_str();
  app.add_option("--daemon-arg", cfg.daemon_args, "extra engramd argument (repeatable)");
  app.add_option("--client-spin-us", cfg.client_spin_us,
                 "how long a client spins for its completion before sleeping (0: the library's "
                 "adaptive default)");
  app.add_option("--poll-modes", cfg.poll_modes,
                 "one engramd per engine.poll_mode listed (off, auto, on, on:CORES), each method "
                 "through engramd run against each side by side")
      ->delimiter(',');
  app.add_option("--emulate-read-latency-us", cfg.emulate_latency_us,
                 "engramd holds every O_DIRECT read (cache-tier misses) to at least this latency "
                 "(benchmarking only; a DGX Spark NVMe: 286)");
  app.add_option("--emulate-read-iops", cfg.emulate_iops,
                 "engramd completes O_DIRECT reads no faster than this many 4 KiB reads/s "
                 "(benchmarking only; a DGX Spark NVMe: 112000)");
  AddCacheTargetOptions(app, cfg);
  app.add_flag("--smoke", cfg.smoke, "a tiny run that only checks that the benchmark works");
  app.add_option("--prefetch-flood", cfg.prefetch_flood,
                 "run only one decode rank alone and beside this many processes that prefetch "
                 "as fast as engramd answers (0: the usual matrix)")
      ->check(CLI::Range(0, 64));
}

}  // namespace

}  // namespace engram::bench::ranks

int main(int argc, char** argv) {
  engram::bench::ranks::Config cfg;
  CLI::App app{"engram-ranks: per-rank decode latency with many client processes"};
  engram::bench::ranks::AddOptions(app, cfg);
  CLI11_PARSE(app, argc, argv);
  if (cfg.smoke) {
    cfg.rows = 20000;
    cfg.ranks = {1, 2};
    cfg.steps = 5;
    cfg.step_rows = 64;
    cfg.period_ms = 2;
  }
  if (cfg.steps == 0 || cfg.step_rows == 0 || cfg.tp == 0 || cfg.ranks.empty()) {
    fprintf(stderr, "--steps, --step-rows, --tp and --ranks must be positive\n");
    return 2;
  }
  return engram::bench::ranks::Run(cfg);
}
