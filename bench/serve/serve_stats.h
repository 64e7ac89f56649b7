// engram-serve's figures: what the requests saw (time to first token, time per output token,
// the gaps between token deliveries and the stutters among them, output tokens a second) and
// what the iterations cost (Engram's share of GPU time, the waits for rows, the GPU's clock and
// power), with each slow iteration put down to its cause.
#pragma once

#include <cstdint>
#include <vector>

#include "bench/serve/serve_scheduler.h"

namespace engram::bench::serve {

struct RequestStats {
  uint64_t requests = 0, finished = 0, gaps = 0, stutters = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0, tpot_p50_ms = 0, tpot_p99_ms = 0;
  double itl_p99_ms = 0, itl_p999_ms = 0, longest_gap_ms = 0, output_tok_s = 0;
};

// Over the requests that arrived in [begin_ns, end_ns): TTFT (first delivery - arrival), TPOT
// ((last - first delivery) / (tokens - 1), requests of 2 tokens or more), the inter-token gaps
// (between successive deliveries: tokens that arrive together are one delivery, as an engine's
// stream sends them), stutters (a gap over 2x the median of its request's gaps, requests with
// 3 gaps or more) and the longest gap. Output tokens/s counts every request's tokens delivered
// within [begin_ns, end_ns). NaN where there is no sample.
RequestStats SummarizeRequests(const std::vector<RequestRecord>& records, uint64_t begin_ns,
                               uint64_t end_ns);

// One iteration as measured.
struct IterationRecord {
  uint64_t end_ns = 0;
  uint32_t bucket = 0, tokens = 0, prefill_tokens = 0;
  double wall_us = 0;  // launch to completion, host clock
  double span_us = 0;  // first to last kernel, GPU clock
  double base_us = 0;  // the same bucket's step without Engram (its median span)
  double wait_us = 0;  // the main stream's wait for layer 1's rows
  double launch_cpu_us = 0;
  uint32_t misses = 0;  // rows the cache tier's lookup missed (the in-place cache method)
  double sm_mhz = 0, power_w = 0;  // NVML at the iteration's end; 0 where unknown
};

struct IterationStats {
  uint64_t iterations = 0;
  double engram_share = 0;  // (sum of spans - sum of the no-Engram spans) / sum of spans
  double wall_p50_us = 0, wall_p99_us = 0, wait_p99_us = 0, misses_p50 = 0, misses_p99 = 0;
  double sm_mhz_p50 = 0, sm_mhz_min = 0, power_w_p50 = 0;
  // Iterations with the SM clock under 90 % of its maximum, of those with a reading; NaN when
  // the clock is unknown.
  double slow_clock_fraction = 0;
  // Iterations over 2x their bucket's step without Engram, by cause: the GPU's clock low, the
  // wait for Engram's rows over half the excess, else the rest (the layers, the host).
  uint64_t slow = 0, slow_clock = 0, slow_engram = 0, slow_other = 0;
};

// `max_sm_mhz` 0: the clock is unknown and nothing is put down to it.
IterationStats SummarizeIterations(const std::vector<IterationRecord>& its, double max_sm_mhz);

}  // namespace engram::bench::serve
