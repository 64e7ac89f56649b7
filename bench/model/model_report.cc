// engram-model-step's report: the run's header, the per-method table and the timeline of a step,
// printed and as JSON (bench/model/plot_model_step.py draws it).
#include <cmath>
#include <cstdio>

#include "bench/common/stats.h"
#include "bench/model/model_step.h"
#include "bench/model/model_tokens.h"

namespace engram::bench::model_step {
namespace {

// The q-quantile of a method's samples; NaN when it has none.
double Pct(const std::vector<double>& v, double q) { return Quantile(v, q, NAN); }

const char* const kStampNames[kStamps] = {
    "step start",          "lookup start",          "layer-1 rows ready",
    "layer-14 rows ready", "layer-1 Engram starts", "layer 0 end",
    "layer 1 end",         "layer 2 end",           "step end"};

}  // namespace

json ReportMethods(const std::vector<Method>& methods, const ShapeRun& run) {
  const auto& samples = run.samples;
  const double base = Pct(samples[1].wall_us, 0.5), none = Pct(samples[0].wall_us, 0.5);
  std::printf("%-17s %9s %9s %9s %9s %8s %9s %10s %10s\n", "method", "p50 us", "p99 us", "gpu p50",
              "engram", "vs gpu", "vs gpu", "launch", "engramd");
  std::printf("%-17s %9s %9s %9s %9s %8s %9s %10s %10s\n", "", "(wall)", "(wall)", "(span)",
              "share", "p50", "(us)", "cpu us", "cpu us");
  json jm = json::array();
  for (size_t mi = 0; mi < methods.size(); ++mi) {
    const Sample& sm = samples[mi];
    if (sm.wall_us.empty()) continue;  // failed: said above
    const double p50 = Pct(sm.wall_us, 0.5), p99 = Pct(sm.wall_us, 0.99);
    const double share = mi == 0 ? 0 : (p50 - none) / p50;
    const double vs = p50 / base;
    std::printf("%-17s %9.1f %9.1f %9.1f %8.1f%% %8.4f %+9.1f %10.1f %10.1f\n",
                methods[mi].name.c_str(), p50, p99, Pct(sm.span_us, 0.5), 100 * share, vs,
                p50 - base, Mean(sm.launch_cpu_us), Mean(sm.daemon_cpu_us));
    json tl;
    for (int k = 0; k < kStamps; ++k) tl[kStampNames[k]] = Pct(sm.stamps_us[k], 0.5);
    jm.push_back({{"name", methods[mi].name},
                  {"p50_us", p50},
                  {"p99_us", p99},
                  {"span_p50_us", Pct(sm.span_us, 0.5)},
                  {"span_p99_us", Pct(sm.span_us, 0.99)},
                  {"engram_share", share},
                  {"vs_gpu_memory", vs},
                  {"vs_gpu_memory_p99", p99 / Pct(samples[1].wall_us, 0.99)},
                  {"launch_cpu_us", Mean(sm.launch_cpu_us)},
                  {"engramd_cpu_us", Mean(sm.daemon_cpu_us)},
                  {"timeline_us", tl},
                  {"steps", sm.wall_us.size()}});
  }
  return jm;
}

void PrintTimelines(const std::vector<Method>& methods, const ShapeRun& run) {
  std::printf(
      "timeline of a step (median us after the step starts, GPU clock): lookup "
      "start..layer-1 rows..layer-14 rows | layer 0 end, layer-1 Engram starts, "
      "layer 1 end, layer 2 end | step end\n");
  for (size_t mi = 0; mi < methods.size(); ++mi) {
    const Sample& sm = run.samples[mi];
    if (sm.wall_us.empty()) continue;
    auto p = [&](StampAt k) {
      return mi == 0 && k <= kMix1Start ? NAN : Pct(sm.stamps_us[k], 0.5);
    };
    std::printf("  %-17s %7.1f..%7.1f..%7.1f | %8.1f %8.1f %8.1f %8.1f | %9.1f   stall %+.1f\n",
                methods[mi].name.c_str(), p(kLookupStart), p(kLookup1End), p(kLookup14End),
                p(kLayer0End), p(kMix1Start), p(kLayer1End), p(kLayer2End), p(kStepEnd),
                mi == 0 ? 0.0 : p(kMix1Start) - p(kLayer0End));
  }
}

json Describe(const Options& o, const cudaDeviceProp& prop, const TokenSource& source,
              const Hashing& hs, const ResidentMaps& rm, uint64_t cache_bytes) {
  json out;
  out["device"] = prop.name;
  out["tokens"] = source.source();
  out["model"] = {{"hidden", kHidden},
                  {"hc_mult", kHc},
                  {"layers", kLayers},
                  {"engram_layers", {1, 14}},
                  {"tp", kTp},
                  {"rank", kRank},
                  {"rank_heads", {hs.h.head_begin, hs.h.head_end}},
                  {"table_rows", {rm.Rows(0), rm.Rows(1)}},
                  {"rank_rows", {hs.rank_rows[0], hs.rank_rows[1]}},
                  {"cache_bytes", cache_bytes}};
  out["stand_in"] = {{"layer_weight_gb", o.layer_weight_gb},
                     {"layer_active_mparams", o.layer_active_mparams},
                     {"hbm_tbs", o.hbm_tbs},
                     {"fp8_tflops", o.fp8_tflops}};
  std::printf(
      "\n%s, %s; TP%u rank %u (heads [%u, %u) of each table: %llu + %llu rows of %llu + %llu); "
      "cache tier budget %.0f MiB (half the rank's rows)\n",
      prop.name, source.source().c_str(), kTp, kRank, hs.h.head_begin, hs.h.head_end,
      static_cast<unsigned long long>(hs.rank_rows[0]),
      static_cast<unsigned long long>(hs.rank_rows[1]), static_cast<unsigned long long>(rm.Rows(0)),
      static_cast<unsigned long long>(rm.Rows(1)), cache_bytes / 1048576.0);
  return out;
}

}  // namespace engram::bench::model_step
