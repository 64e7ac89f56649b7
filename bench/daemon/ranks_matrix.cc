// engram-ranks' matrix of cases: paced warm uniform and Zipf steps, steps with evicted rows,
// back-to-back steps and a prefill beside the decode ranks, for every rank count, each by every
// method (through every engramd of --poll-modes) side by side; or the prefetch-flood pair.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/daemon/ranks.h"
#include "bench/daemon/ranks_gatherers.h"

namespace engram::bench::ranks {
namespace {

// The cases of one run: paced warm uniform and Zipf, paced with evicted rows, back to back, and
// the mixed case, for every rank count; with a trace, the trace's steps instead of the ids.
std::vector<Case> Matrix(const Config& cfg) {
  std::vector<Case> cases;
  const std::string first = cfg.trace.empty() ? "uniform" : "trace";
  if (cfg.prefetch_flood > 0) {
    Case alone{"1 rank, no flood", 1, cfg.period_ms, first};
    Case flooded = alone;
    flooded.name = absl::StrCat("1 rank + ", cfg.prefetch_flood, " prefetch floods");
    flooded.flooders = cfg.prefetch_flood;
    return {alone, flooded};
  }
  for (int n : cfg.ranks) cases.push_back({"warm " + first, n, cfg.period_ms, first});
  if (cfg.trace.empty()) {
    for (int n : cfg.ranks) cases.push_back({"warm zipf", n, cfg.period_ms, "zipf"});
  }
  // Evicting page-cache pages makes misses only for tables served from storage.
  if (cfg.miss > 0 && cfg.tier == "storage") {
    for (int n : cfg.ranks) {
      cases.push_back({absl::StrFormat("%s, %.0f%% evicted", first, cfg.miss * 100), n,
                       cfg.period_ms, first, cfg.miss});
    }
  }
  if (cfg.period_ms > 0) {
    cases.push_back({"back to back " + first, cfg.ranks.front(), 0, first});
    if (cfg.ranks.size() > 1) {
      cases.push_back({"back to back " + first, cfg.ranks[cfg.ranks.size() / 2], 0, first});
    }
  }
  const int mixed = std::max(2, std::min(8, cfg.ranks.back()));
  cases.push_back(
      {absl::StrCat("mixed ", mixed - 1, " + 1 prefill"), mixed, cfg.period_ms, first, 0, true});
  return cases;
}

}  // namespace

int RunMatrix(Env& env, const std::vector<std::string>& methods,
              const std::vector<Daemon>& daemons) {
  const std::string reference =
      std::find(methods.begin(), methods.end(), "mapped") != methods.end() ? "mapped" : "engine";
  printf(
      "| case | N | period | method | p50 µs | p99 µs | worst rank p99 | worst rank p99.9 | "
      "vs %s | rows/s | server CPU µs/row | client CPU µs/row |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      reference.c_str());
  int failures = 0;
  for (const Case& c : Matrix(*env.cfg)) {
    std::vector<std::pair<std::string, CaseResult>> results;
    double ref_p99 = 0;
    env.seed = 17 + c.ranks;  // every method of a case gathers the same ids
    for (const std::string& m : methods) {
      for (const Daemon& d : daemons) {
        if (!ThroughDaemon(m) && &d != &daemons.front()) break;
        env.sock = d.sock;
        CaseResult r = RunCase(env, c, m, ThroughDaemon(m) ? d.pid : -1);
        failures += !r.ok;
        if (m == reference && !r.p99.empty()) {
          ref_p99 = *std::max_element(r.p99.begin(), r.p99.end());
        }
        const bool labelled = ThroughDaemon(m) && !d.label.empty();
        results.emplace_back(labelled ? absl::StrCat(m, "/", d.label) : m, std::move(r));
      }
    }
    for (const auto& [m, r] : results) PrintCase(c, m, r, ref_p99);
  }
  return failures;
}

}  // namespace engram::bench::ranks
