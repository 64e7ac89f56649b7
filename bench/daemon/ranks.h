// engram-ranks' shared driver: the run's configuration, a case, what the rank processes report,
// and the calls its cases are built from (tables, engramd, running one case, the report).
//
// The benchmark is its cases (ranks_matrix.cc: the matrix of methods and rank counts;
// ranks_cache_targets.cc: the row cache's targets) over this driver: ranks_bench.cc (options and
// validation), ranks_tables.cc, ranks_daemons.cc, ranks_gatherers.cc (one step by one method),
// ranks_run_case.cc (the rank processes on a common clock, their latencies) and ranks_report.cc.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tables/table.h"

namespace engram::bench::ranks {

constexpr uint32_t kLayers[2] = {1, 14};
constexpr uint64_t kPrefillRows = 98304;
constexpr int kMaxRanks = 64;
constexpr uint64_t kSeed = 3;  // of the synthetic tables

struct Config {
  std::string engramd, dir, layout = "checkpoint", trace, methods_arg;
  std::string tier = "storage";  // the daemon's --default-tier
  uint64_t rows = 1'000'000;
  std::vector<int> ranks = {1, 4, 8, 16};
  uint32_t tp = 4;
  uint64_t step_rows = 1152;
  double period_ms = 10;
  uint32_t steps = 200;
  double zipf_s = 1.0;
  double miss = 0.05;
  uint32_t client_spin_us = 0;  // 0: the client library's adaptive default
  uint32_t piece_rows = 144;    // the pieces method: rows per request
  std::vector<std::string> daemon_args;
  bool smoke = false;
  int prefetch_flood = 0;  // >0: only the pair of cases with and without that many floods
  // One engramd per entry, started with that engine.poll_mode ("on:N" adds engine.poll_cores
  // N), every method through engramd run against each side by side; empty: one engramd.
  std::vector<std::string> poll_modes;
  // engramd's emulated device for O_DIRECT reads (engine.emulate_read_*; 0: off).
  uint64_t emulate_latency_us = 0, emulate_iops = 0;
  // The cache tier's targets instead of the matrix (RunCacheTargets; --tier cache, --trace):
  // --steady, and a cold start's timeline of --timeline-s seconds in --window-s windows.
  bool steady = false;
  double cache_fraction = 0.5;  // the part cache holds this fraction of the trace's rows
  double warm_passes = 1;       // passes over the trace before the timed steps
  double timeline_s = 0, window_s = 5;
  uint32_t read_samples = 2000;  // O_DIRECT reads that measure one device read
  std::string engramctl;
};

inline bool CacheTargetsMode(const Config& cfg) { return cfg.steady || cfg.timeline_s > 0; }

// One engramd the matrix runs against: its label in the table ("" when it is the only one).
struct Daemon {
  std::string label;
  std::string sock;
  pid_t pid = -1;
};

// One case of the matrix.
struct Case {
  std::string name;
  int ranks = 1;
  double period_ms = 10;  // 0: back to back
  std::string dist = "uniform";
  double evict = 0;             // fraction of each step's rows evicted before the step
  bool prefill = false;         // one more process gathers 98,304-row batches back to back
  int flooders = 0;             // processes that prefetch 4 x 8,192 rows per call, back to back
  uint32_t steps = 0;           // steps per rank (0: --steps)
  uint32_t trace_offset = 0;    // each rank starts this many steps into its share of the trace
  bool warm_page_cache = true;  // read every table file into the page cache first
  bool prefault = false;  // each rank gathers its steps once, untimed, before the clock (trace)
};

inline uint32_t StepsOf(const Config& cfg, const Case& c) {
  return c.steps != 0 ? c.steps : cfg.steps;
}

// What the rank processes report, in memory shared with the parent.
struct SharedResults {
  std::atomic<int> ready{0};
  std::atomic<uint64_t> start_ns{0};
  std::atomic<int> decode_done{0};
  std::atomic<int> failures{0};
  uint64_t cpu_ns[kMaxRanks + 1];
  // How late each rank's timer woke it for its steps (not counted in the latencies).
  uint64_t wake_late_sum_ns[kMaxRanks + 1];
  uint64_t wake_late_max_ns[kMaxRanks + 1];
  uint64_t prefill_batches = 0;
  uint64_t prefill_ns_sum = 0;
  uint64_t prefill_max_ns = 0;
  std::atomic<uint64_t> flood_rows{0};     // rows the flood processes' prefetches queued
  std::atomic<uint64_t> flood_refused{0};  // their calls refused (the session's bound)
  char error[256];
  // lat[rank * steps + step], ns; followed by the prefill latencies.
  uint64_t lat[1];
};

// The rows a --trace file holds: steps[i][layer index] = ids. One line per step, groups
// `LAYER:ID,ID,...` separated by blanks; lines starting with '#' are comments.
using StepTrace = std::vector<std::array<std::vector<uint64_t>, 2>>;

// What every case of a run reads: the options, both tables, the engramd it talks to, the trace.
struct Env {
  const Config* cfg;
  std::vector<const Table*> tables;  // layer 1, layer 14
  std::string sock;
  const StepTrace* trace = nullptr;
  uint64_t seed = 0;
};

struct CaseResult {
  bool ok = true;
  std::string error;
  std::vector<uint64_t> p50, p99, p999;  // per decode rank, ns
  uint64_t all_p50 = 0, all_p99 = 0, all_p999 = 0;
  double rows_per_s = 0;
  double server_cpu_us_per_row = 0;  // the daemon's, or the rank processes' for in-process
  double client_cpu_us_per_row = 0;  // the rank processes' (daemon method only)
  uint64_t prefill_batches = 0;
  double prefill_mean_ms = 0, prefill_max_ms = 0;
  uint64_t flood_rows = 0, flood_refused = 0;
  double wake_late_mean_us = 0, wake_late_max_us = 0;  // the ranks' timers (paced cases)
  uint64_t wall_ns = 0;
  std::vector<uint64_t> lat;  // every decode step's latency, ns: lat[rank * steps + step]
};

// A case run against one engramd with the row cache's hit rate over it.
struct CountedCase {
  CaseResult r;
  double hit_rate = -1;
  uint64_t lookups = 0;
};

// ---- Tables (ranks_tables.cc) ----

// The trace file at `path`, every id checked against [0, rows).
absl::StatusOr<StepTrace> ReadStepTrace(const std::string& path, uint64_t rows);

// Opens the benchmark's tables, writing them first when they are missing; `args` gets the
// engramd arguments that serve them.
absl::Status PrepareTables(const Config& cfg, std::vector<std::unique_ptr<Table>>* tables,
                           std::vector<std::string>* args);

// Reads every table file once so that the case starts warm.
void WarmTables(const std::vector<const Table*>& tables);

// Drops the pages of `n` rows of `table` from the page cache.
void EvictRows(const Table& table, const uint64_t* rows, size_t n);

// One O_DIRECT 4 KiB read at queue depth 1, random pages of the largest table file: the device's
// latency for one row as engramd's misses read it.
struct OneRead {
  uint64_t p50 = 0, p99 = 0;
  uint32_t reads = 0;
  std::string file;
};
absl::StatusOr<OneRead> MeasureOneRead(const std::vector<const Table*>& tables, uint32_t reads);

// Distinct (layer, row) pairs the trace reads: the rows a cache holding all of them holds.
uint64_t DistinctRows(const StepTrace& trace);

// Pages of the table files in the page cache (mincore), after dropping them when `drop`.
uint64_t TablePagesCached(const std::vector<const Table*>& tables, bool drop, uint64_t* ret_pages);

// ---- engramd (ranks_daemons.cc) ----

// Starts one engramd, or one per --poll-modes entry; empty after saying why one did not start
// (those started are stopped).
std::vector<Daemon> StartDaemons(const Config& cfg, const std::vector<std::string>& args);

// Stops every daemon; the first nonzero exit status (-1: killed by a signal), else 0.
int StopDaemons(const std::vector<Daemon>& daemons);

// Starts one engramd of the cache-targets run: `tier` by default, a row cache of `cache_bytes`
// (0: none); prints its label and command line.
Daemon StartLabelled(const Config& cfg, const std::string& label, const std::string& tier,
                     uint64_t cache_bytes, std::vector<std::string> args);

// An engramd whose row cache holds `rows` rows (within 2 %); pid -1 after saying why.
Daemon StartSizedCache(const Config& cfg, const std::string& label, uint64_t rows,
                       const std::vector<std::string>& args);

// The row cache's counters, from `engramctl status --json` (in-place hits folded in).
struct CacheCounters {
  uint64_t hits = 0, misses = 0, used_rows = 0, capacity_rows = 0;
};
absl::StatusOr<CacheCounters> ReadCacheCounters(const Config& cfg, const std::string& sock);

// Hit rate between two counter readings (-1: no lookups).
double HitRate(const CacheCounters& a, const CacheCounters& b);

// ---- One case (ranks_run_case.cc) ----

// Runs in the parent once a case's ranks are started (arguments: the common start,
// CLOCK_MONOTONIC ns, and the ranks' shared results) and before their exits are collected.
using During = std::function<void(uint64_t, const SharedResults&)>;

// Runs case `c` by `method`: one process per rank (and the prefill and flood processes it asks
// for) on a common clock; `daemon` is the engramd whose CPU is charged (-1: none). `during`:
// see During.
CaseResult RunCase(const Env& env, const Case& c, const std::string& method, pid_t daemon,
                   const During& during = nullptr);

// ---- The report (ranks_report.cc) ----

// The machine, the tables, the step and the methods, and engramd's command line (`args`).
void PrintHeader(const Config& cfg, const std::vector<std::string>& args);

// One row of a case table. ref_p99: the worst rank's p99 of the reference method (mapped for
// resident tables, else the in-process engine); 0 when it did not run.
void PrintCase(const Case& c, const std::string& method, const CaseResult& r, double ref_p99);

// A case table's head (the cache targets' cases, reference "ref").
extern const char* const kTargetsTableHead;

// One target's verdict as a line of its own, which bench/spark-targets.sh reads.
void PrintTarget(const char* target, const std::string& what, double measured,
                 const std::string& limit, bool ok, bool met, const std::string& detail);

// A warm-up case's line, and a counted case's row with its hit rate.
void PrintWarmUp(const Case& w, const CountedCase& r);
void PrintCounted(const Case& c, const std::string& method, const CountedCase& r, double ref);

// ---- The cases ----

// Runs every case of the matrix with every method (through every engramd) and prints the table;
// returns the failures (ranks_matrix.cc).
int RunMatrix(Env& env, const std::vector<std::string>& methods,
              const std::vector<Daemon>& daemons);

// The cache tier's targets (--steady, --timeline-s), each against an engramd of its own started
// with `args`; returns the failures (ranks_cache_targets.cc).
int RunCacheTargets(Env& env, const std::vector<std::string>& args);

}  // namespace engram::bench::ranks
