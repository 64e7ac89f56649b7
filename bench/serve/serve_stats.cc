// engram-serve's figures (serve_stats.h).
#include "bench/serve/serve_stats.h"

#include <algorithm>
#include <cmath>

#include "bench/common/stats.h"

namespace engram::bench::serve {
namespace {

double Ms(uint64_t ns) { return static_cast<double>(ns) / 1e6; }

// Stutters among one request's gaps: those over twice their median.
uint64_t Stutters(const std::vector<double>& gaps) {
  if (gaps.size() < 3) return 0;
  const double median = Quantile(gaps, 0.5);
  return std::count_if(gaps.begin(), gaps.end(), [&](double g) { return g > 2 * median; });
}

}  // namespace

RequestStats SummarizeRequests(const std::vector<RequestRecord>& records, uint64_t begin_ns,
                               uint64_t end_ns) {
  RequestStats s;
  std::vector<double> ttft, tpot, itl;
  uint64_t tokens = 0;
  for (const RequestRecord& r : records) {
    for (size_t i = 0; i < r.delivery_ns.size(); ++i) {
      if (r.delivery_ns[i] >= begin_ns && r.delivery_ns[i] < end_ns) tokens += r.delivery_tokens[i];
    }
    if (r.arrival_ns < begin_ns || r.arrival_ns >= end_ns) continue;
    ++s.requests;
    s.finished += r.finished ? 1 : 0;
    if (r.delivery_ns.empty()) continue;
    ttft.push_back(Ms(r.delivery_ns.front() - r.arrival_ns));
    if (r.delivered >= 2) {
      tpot.push_back(Ms(r.delivery_ns.back() - r.delivery_ns.front()) / (r.delivered - 1));
    }
    std::vector<double> gaps;
    for (size_t i = 1; i < r.delivery_ns.size(); ++i) {
      gaps.push_back(Ms(r.delivery_ns[i] - r.delivery_ns[i - 1]));
    }
    s.stutters += Stutters(gaps);
    itl.insert(itl.end(), gaps.begin(), gaps.end());
  }
  s.gaps = itl.size();
  s.ttft_p50_ms = Quantile(ttft, 0.5, NAN);
  s.ttft_p99_ms = Quantile(ttft, 0.99, NAN);
  s.tpot_p50_ms = Quantile(tpot, 0.5, NAN);
  s.tpot_p99_ms = Quantile(tpot, 0.99, NAN);
  s.itl_p99_ms = Quantile(itl, 0.99, NAN);
  s.itl_p999_ms = Quantile(itl, 0.999, NAN);
  s.longest_gap_ms = Quantile(itl, 1.0, NAN);
  s.output_tok_s = end_ns > begin_ns ? tokens / (Ms(end_ns - begin_ns) / 1e3) : NAN;
  return s;
}

IterationStats SummarizeIterations(const std::vector<IterationRecord>& its, double max_sm_mhz) {
  IterationStats s;
  s.iterations = its.size();
  std::vector<double> wall, wait, misses, mhz, power;
  double span = 0, base = 0;
  uint64_t slow_clock_its = 0;
  for (const IterationRecord& r : its) {
    wall.push_back(r.wall_us);
    wait.push_back(r.wait_us);
    misses.push_back(r.misses);
    if (r.sm_mhz > 0) mhz.push_back(r.sm_mhz);
    if (r.power_w > 0) power.push_back(r.power_w);
    span += r.span_us;
    base += r.base_us;
    const bool clock_low = max_sm_mhz > 0 && r.sm_mhz > 0 && r.sm_mhz < 0.9 * max_sm_mhz;
    slow_clock_its += clock_low ? 1 : 0;
    if (r.base_us <= 0 || r.wall_us <= 2 * r.base_us) continue;
    ++s.slow;
    if (clock_low) {
      ++s.slow_clock;
    } else if (r.wait_us > 0.5 * (r.wall_us - r.base_us)) {
      ++s.slow_engram;
    } else {
      ++s.slow_other;
    }
  }
  s.engram_share = span > 0 ? (span - base) / span : NAN;
  s.wall_p50_us = Quantile(wall, 0.5, NAN);
  s.wall_p99_us = Quantile(wall, 0.99, NAN);
  s.wait_p99_us = Quantile(wait, 0.99, NAN);
  s.misses_p50 = Quantile(misses, 0.5, NAN);
  s.misses_p99 = Quantile(misses, 0.99, NAN);
  s.sm_mhz_p50 = Quantile(mhz, 0.5, NAN);
  s.sm_mhz_min = Quantile(mhz, 0.0, NAN);
  s.power_w_p50 = Quantile(power, 0.5, NAN);
  s.slow_clock_fraction =
      mhz.empty() || max_sm_mhz <= 0 ? NAN : static_cast<double>(slow_clock_its) / mhz.size();
  return s;
}

}  // namespace engram::bench::serve
