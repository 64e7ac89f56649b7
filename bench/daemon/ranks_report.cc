// engram-ranks' report: the run's header (machine, tables, step, methods), a row per case and
// method, and the cache targets' verdict lines that bench/spark-targets.sh reads.
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/daemon/ranks.h"
#include "bench/daemon/ranks_gatherers.h"

namespace engram::bench::ranks {

void PrintHeader(const Config& cfg, const std::vector<std::string>& args) {
  utsname u{};
  uname(&u);
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, cpu = "?";
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  printf("# engram-ranks\nmachine: %s, %ld online CPUs, Linux %s\n", cpu.c_str(),
         sysconf(_SC_NPROCESSORS_ONLN), u.release);
  printf("tables: synthetic %s, layers 1 and 14 x %" PRIu64
         " rows, in %s; rank r reads TP%u "
         "slice r mod %u\n",
         cfg.layout.c_str(), cfg.rows, cfg.dir.c_str(), cfg.tp, cfg.tp);
  printf("step: %" PRIu64
         " rows of each layer (two requests in flight), %u steps per rank, "
         "every %.1f ms on a common clock; latency from the submission to both layers' rows "
         "in place, or from the scheduled start when the rank's last step overran it (the ranks' "
         "own timer lateness is printed beside each paced case, not counted); client spin: %s\n",
         cfg.step_rows, cfg.steps, cfg.period_ms,
         cfg.client_spin_us ? absl::StrCat(cfg.client_spin_us, " µs").c_str() : "library default");
  printf(
      "methods: daemon = engramd with its defaults and one client process per rank; inplace = "
      "the same clients' engram_gather with ENGRAM_GATHER_IN_PLACE, one layer after the other "
      "(resident tables copied in the client, others gathered by engramd); pieces = the same "
      "clients, each layer's rows as requests of %u rows, all in flight together (the prefill "
      "process as for daemon); mapped = "
      "the daemon's resident tables mapped into each rank process, rows copied there; engine = "
      "the gather engine (defaults) inside each rank process; uring = a plain io_uring loop "
      "(one ring, one read per row part) inside each rank process\nengramd:",
      cfg.piece_rows);
  for (size_t i = 1; i < args.size(); ++i) printf(" %s", args[i].c_str());
  printf("\n\n");
}

void PrintCase(const Case& c, const std::string& method, const CaseResult& r, double ref_p99) {
  auto us = [](uint64_t ns) { return ns / 1e3; };
  const uint64_t worst99 = r.p99.empty() ? 0 : *std::max_element(r.p99.begin(), r.p99.end());
  const uint64_t worst999 = r.p999.empty() ? 0 : *std::max_element(r.p999.begin(), r.p999.end());
  const std::string period = c.period_ms > 0 ? absl::StrFormat("%g ms", c.period_ms) : "b2b";
  printf(
      "| %-26s | %2d | %6s | %-11s | %8.1f | %8.1f | %8.1f | %8.1f | %5.2fx | %6.2f M | "
      "%6.3f | %6.3f |",
      c.name.c_str(), c.ranks, period.c_str(), method.c_str(), us(r.all_p50), us(r.all_p99),
      us(worst99), us(worst999), ref_p99 > 0 ? worst99 / ref_p99 : 0.0, r.rows_per_s / 1e6,
      r.server_cpu_us_per_row, r.client_cpu_us_per_row);
  if (c.prefill) {
    printf(" prefill: %" PRIu64 " x 98,304 rows, mean %.1f ms, max %.1f ms |", r.prefill_batches,
           r.prefill_mean_ms, r.prefill_max_ms);
  }
  if (c.flooders > 0) {
    printf(" floods: %" PRIu64 " rows queued, %" PRIu64 " calls refused |", r.flood_rows,
           r.flood_refused);
  }
  if (c.period_ms > 0) {
    printf(" rank timers late %.0f µs mean, %.0f max |", r.wake_late_mean_us, r.wake_late_max_us);
  }
  if (!r.ok) printf(" FAILED: %s", r.error.c_str());
  printf("\n");
  if (ThroughDaemon(method.substr(0, method.find('/'))) && r.p99.size() > 1) {
    printf("|   per rank p50/p99/p99.9 µs:");
    for (size_t i = 0; i < r.p99.size(); ++i) {
      printf(" %.0f/%.0f/%.0f", us(r.p50[i]), us(r.p99[i]), us(r.p999[i]));
    }
    printf(" |\n");
  }
  fflush(stdout);
}

const char* const kTargetsTableHead =
    "| case | N | period | method | p50 µs | p99 µs | worst rank p99 | worst rank p99.9 | "
    "vs ref | rows/s | server CPU µs/row | client CPU µs/row |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|\n";

// One target's verdict as a line of its own, which bench/spark-targets.sh reads:
// `target (X) WHAT | measured M | limit L | met|missed|not measured | DETAIL`; `ok` false: the
// cases behind it failed (not measured).
void PrintTarget(const char* target, const std::string& what, double measured,
                 const std::string& limit, bool ok, bool met, const std::string& detail) {
  printf("target (%s) %s | measured %.3f | limit %s | %s | %s\n", target, what.c_str(), measured,
         limit.c_str(),
         !ok   ? "not measured"
         : met ? "met"
               : "missed",
         detail.c_str());
  fflush(stdout);
}

void PrintWarmUp(const Case& w, const CountedCase& r) {
  printf("|   %s: %u steps a rank back to back in %.1f s, hit rate %.3f over %" PRIu64
         " lookups%s |\n",
         w.name.c_str(), w.steps, r.r.wall_ns / 1e9, r.hit_rate, r.lookups,
         r.r.ok ? "" : (" FAILED: " + r.r.error).c_str());
}

void PrintCounted(const Case& c, const std::string& method, const CountedCase& r, double ref) {
  PrintCase(c, method, r.r, ref);
  printf("|   row cache hit rate in the timed window: %.3f over %" PRIu64 " lookups |\n",
         r.hit_rate, r.lookups);
  fflush(stdout);
}

}  // namespace engram::bench::ranks
