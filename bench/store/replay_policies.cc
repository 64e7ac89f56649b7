// SimulatePolicies and PrintPolicies.
#include "bench/store/replay_policies.h"

#include <algorithm>
#include <cstdio>
#include <variant>

#include "absl/strings/str_cat.h"

namespace engram::bench {
namespace {

struct Policy {
  std::string name;
  std::variant<LruSim, S3FifoSim> sim;
  bool filtered;
};

// S3-FIFO's filter at `at` under every setting of the sketch and the comparison.
void AddVariants(uint64_t capacity, TinyLfuAt at, std::vector<Policy>& ret) {
  for (uint32_t sample : {1u, 10u, 50u}) {
    for (bool doorkeeper : {true, false}) {
      for (bool ties : {false, true}) {
        for (bool ghost : {false, true}) {
          if (ghost && at != TinyLfuAt::kInsert) continue;  // only kInsert consults the ghost
          const S3FifoSimOptions o{.admission = at,
                                   .sketch = {.doorkeeper = doorkeeper, .sample_factor = sample},
                                   .admit_ties = ties,
                                   .ghost_bypass = ghost};
          ret.push_back({absl::StrCat("  ", at == TinyLfuAt::kInsert ? "insert" : "small exit",
                                      ", sample ", sample, "x", doorkeeper ? ", doorkeeper" : "",
                                      ties ? ", ties in" : "", ghost ? ", ghost in" : ""),
                         S3FifoSim(capacity, o), true});
        }
      }
    }
  }
}

std::vector<Policy> MakePolicies(uint64_t capacity, bool tinylfu_variants) {
  std::vector<Policy> p;
  p.push_back({"LRU", LruSim(capacity), false});
  p.push_back({"LRU + TinyLFU", LruSim(capacity, true), true});
  p.push_back({"S3-FIFO", S3FifoSim(capacity), false});
  p.push_back({"S3-FIFO + TinyLFU at insert",
               S3FifoSim(capacity, {.admission = TinyLfuAt::kInsert}), true});
  p.push_back({"S3-FIFO + TinyLFU at small exit",
               S3FifoSim(capacity, {.admission = TinyLfuAt::kSmallExit}), true});
  if (tinylfu_variants) {
    AddVariants(capacity, TinyLfuAt::kInsert, p);
    AddVariants(capacity, TinyLfuAt::kSmallExit, p);
  }
  return p;
}

}  // namespace

std::vector<PolicyResult> SimulatePolicies(const ForEachRequest& requests, uint64_t capacity,
                                           bool tinylfu_variants) {
  std::vector<Policy> policies = MakePolicies(capacity, tinylfu_variants);
  std::vector<PolicyResult> results(policies.size());
  requests([&](std::span<const uint64_t> keys, bool warm) {
    for (size_t i = 0; i < policies.size(); ++i) {
      const uint64_t hits = std::visit([&](auto& sim) { return sim.Batch(keys); }, policies[i].sim);
      PolicyResult& r = results[i];
      r.all_hit += hits == keys.size();
      ++r.requests;
      if (warm) r.warm_lookups += keys.size(), r.warm_hits += hits;
    }
  });
  for (size_t i = 0; i < policies.size(); ++i) {
    results[i].name = policies[i].name;
    results[i].filtered = policies[i].filtered;
    results[i].counts = std::visit([](auto& sim) { return sim.counts; }, policies[i].sim);
  }
  return results;
}

void PrintPolicies(const std::vector<PolicyResult>& results, bool warmup) {
  for (const PolicyResult& r : results) {
    const std::string name = r.name.starts_with(" ") ? r.name : "simulated " + r.name;
    printf("  %-52s %10.4f %14.4f", name.c_str(), r.counts.hit_rate(),
           double(r.all_hit) / double(std::max<uint64_t>(1, r.requests)));
    if (warmup) {  // beside engramd's row misses
      printf(" %12s %17.4f", "",
             double(r.warm_hits) / double(std::max<uint64_t>(1, r.warm_lookups)));
    }
    if (r.filtered) {
      printf("   admitted %lu, refused %lu", r.counts.admitted, r.counts.rejected);
    }
    printf("\n");
  }
}

}  // namespace engram::bench
