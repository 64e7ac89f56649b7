// The offline cache policies engram-trace-replay sets beside engramd's hit rate
// (testkit/cache_sim.h): LRU, S3-FIFO as engramd runs it, and both behind a TinyLFU admission
// filter, fed the replay's requests in its order at the cache's capacity.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "testkit/cache_sim.h"

namespace engram::bench {

// What one policy did with the replay's requests.
struct PolicyResult {
  std::string name;
  SimCounts counts;
  uint64_t requests = 0, all_hit = 0;  // requests (one a layer and step) and those with no miss
  uint64_t warm_lookups = 0, warm_hits = 0;  // of the requests after the warm-up
  bool filtered = false;                     // has an admission filter (counts.admitted, .rejected)
};

// Calls `visit` with every request's keys, in the replay's order, and whether the request comes
// after the warm-up.
using RequestVisitor = std::function<void(std::span<const uint64_t> keys, bool warm)>;
using ForEachRequest = std::function<void(const RequestVisitor& visit)>;

// Every policy over the same requests, in one pass, each with `capacity` rows. With
// `tinylfu_variants`, S3-FIFO's filter is also run with each setting of its sketch's sample,
// doorkeeper, ties and ghost (S3FifoSimOptions).
std::vector<PolicyResult> SimulatePolicies(const ForEachRequest& requests, uint64_t capacity,
                                           bool tinylfu_variants);

// One line a policy: hit rate, share of requests with no miss, hit rate after the warm-up (with
// `warmup`), and for a filter the misses it admitted and refused.
void PrintPolicies(const std::vector<PolicyResult>& results, bool warmup);

}  // namespace engram::bench
