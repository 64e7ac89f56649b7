// engram-serve's tables and JSON (serve_report.h).
#include "bench/serve/serve_report.h"

#include <cmath>
#include <fstream>

#include "bench/serve/serve_platform.h"

namespace engram::bench::serve {

PointResult Summarize(const std::string& method, const LoadPoint& load, const LoadRun& run,
                      uint64_t daemon_cpu_ns, uint32_t heads, double max_sm_mhz) {
  PointResult p;
  p.method = method;
  p.load = load;
  p.error = run.error;
  p.req = SummarizeRequests(run.requests, run.begin_ns, run.end_ns);
  p.its = SummarizeIterations(run.iterations, max_sm_mhz);
  double wall_us = 0, bound_us = 0;
  for (const IterationRecord& r : run.iterations) {
    const uint64_t rows = uint64_t{r.bucket} * heads * 2;
    p.rows += rows;
    wall_us += r.wall_us;
    bound_us += UnifiedMemoryBoundUs(rows);
  }
  p.unified_memory_bound = wall_us > 0 ? bound_us / wall_us : 0;
  // engramd's CPU over the whole run (drain included), a second of it and an iteration.
  const double run_s = (run.finish_ns - run.start_ns) / 1e9;
  p.engramd_cpu_cores = run_s > 0 ? daemon_cpu_ns / 1e9 / run_s : 0;
  p.engramd_cpu_us_per_it =
      run.iterations_all > 0 ? daemon_cpu_ns / 1e3 / static_cast<double>(run.iterations_all) : 0;
  return p;
}

namespace {

nlohmann::json PointJson(const PointResult& p) {
  const RequestStats& q = p.req;
  const IterationStats& i = p.its;
  // NaN is not JSON: a figure without samples is null.
  auto v = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
  return {{"method", p.method},
          {"load", p.load.Name()},
          {"load_kind", p.load.kind == LoadPoint::kConcurrency ? "concurrency" : "rate"},
          {"load_value", p.load.value},
          {"error", p.error},
          {"requests", q.requests},
          {"finished", q.finished},
          {"ttft_p50_ms", v(q.ttft_p50_ms)},
          {"ttft_p99_ms", v(q.ttft_p99_ms)},
          {"tpot_p50_ms", v(q.tpot_p50_ms)},
          {"tpot_p99_ms", v(q.tpot_p99_ms)},
          {"itl_p99_ms", v(q.itl_p99_ms)},
          {"itl_p999_ms", v(q.itl_p999_ms)},
          {"gaps", q.gaps},
          {"stutters", q.stutters},
          {"longest_gap_ms", v(q.longest_gap_ms)},
          {"output_tok_s", v(q.output_tok_s)},
          {"iterations", i.iterations},
          {"engram_share", v(i.engram_share)},
          {"iteration_p50_us", v(i.wall_p50_us)},
          {"iteration_p99_us", v(i.wall_p99_us)},
          {"layer1_wait_p99_us", v(i.wait_p99_us)},
          {"misses_p50", v(i.misses_p50)},
          {"misses_p99", v(i.misses_p99)},
          {"slow_iterations",
           {{"all", i.slow},
            {"gpu_clock", i.slow_clock},
            {"engram_wait", i.slow_engram},
            {"other", i.slow_other}}},
          {"sm_mhz_p50", v(i.sm_mhz_p50)},
          {"sm_mhz_min", v(i.sm_mhz_min)},
          {"power_w_p50", v(i.power_w_p50)},
          {"slow_clock_fraction", v(i.slow_clock_fraction)},
          {"engramd_cpu_cores", p.engramd_cpu_cores},
          {"engramd_cpu_us_per_iteration", p.engramd_cpu_us_per_it},
          {"rows", p.rows},
          {"unified_memory_bound", p.unified_memory_bound}};
}

}  // namespace

void Report::Add(const PointResult& r) {
  points_.push_back(r);
  json_["points"].push_back(PointJson(r));
}

bool Report::Write(const std::string& path) const {
  if (path.empty()) return true;
  std::ofstream f(path, std::ios::trunc);
  f << json_.dump(1) << "\n";
  return static_cast<bool>(f);
}

namespace {

// The row's first two columns: method and load point (22 of the 80).
void Lead(FILE* out, const PointResult& p) {
  std::fprintf(out, "%-16.16s %-5.5s", p.method.c_str(), p.load.Name().c_str());
}

}  // namespace

void Report::Print(FILE* out) const {
  std::fprintf(out,
               "\nrequests (ms; itl: inter-token gap; stut: stutters, gaps over 2x their "
               "request's\nmedian; longest: the longest gap)\n%-16s %-5s%7s%8s%7s%7s%7s%7s%5s%8s\n",
               "method", "load", "ttft50", "ttft99", "tpot50", "tpot99", "itl99", "itl999", "stut",
               "longest");
  for (const PointResult& p : points_) {
    const RequestStats& q = p.req;
    Lead(out, p);
    std::fprintf(out, "%7.1f%8.1f%7.2f%7.2f%7.1f%7.1f%5llu%8.1f\n", q.ttft_p50_ms, q.ttft_p99_ms,
                 q.tpot_p50_ms, q.tpot_p99_ms, q.itl_p99_ms, q.itl_p999_ms,
                 static_cast<unsigned long long>(q.stutters), q.longest_gap_ms);
  }
  std::fprintf(out,
               "\nthroughput and cost (engram: share of GPU time; it p99, wait99 (for layer 1's\n"
               "rows): us; miss: rows missed p99; cpu: engramd's cores; slow: iterations over\n"
               "2x the step without Engram, by cause clock/engram/other)\n"
               "%-16s %-5s%7s%7s%8s%8s%6s%6s%12s\n",
               "method", "load", "tok/s", "engram", "it p99", "wait99", "miss", "cpu", "slow");
  for (const PointResult& p : points_) {
    const IterationStats& i = p.its;
    char slow[40];
    std::snprintf(slow, sizeof(slow), "%llu/%llu/%llu",
                  static_cast<unsigned long long>(i.slow_clock),
                  static_cast<unsigned long long>(i.slow_engram),
                  static_cast<unsigned long long>(i.slow_other));
    Lead(out, p);
    std::fprintf(out, "%7.0f%6.1f%%%8.0f%8.0f%6.0f%6.2f%12s\n", p.req.output_tok_s,
                 100 * i.engram_share, i.wall_p99_us, i.wait_p99_us, i.misses_p99,
                 p.engramd_cpu_cores, slow);
    if (!p.error.empty()) std::fprintf(out, "  FAILED: %s\n", p.error.c_str());
  }
  std::fprintf(out,
               "\nGPU state (NVML, each iteration: SM clock p50 and lowest, the share of\n"
               "iterations under 90 %% of the top clock, power p50)\n%-16s %-5s%7s%7s%8s%6s\n",
               "method", "load", "MHz50", "MHzlo", "slow %", "W50");
  for (const PointResult& p : points_) {
    const IterationStats& i = p.its;
    Lead(out, p);
    std::fprintf(out, "%7.0f%7.0f%8.1f%6.0f\n", i.sm_mhz_p50, i.sm_mhz_min,
                 100 * i.slow_clock_fraction, i.power_w_p50);
  }
}

}  // namespace engram::bench::serve
