// engram-serve's run: the options, and the two ways to run the load points: on the GPU
// (serve_gpu.cc: engram-model-step's TP4 rank serving, one method at a time) or, for the
// CPU-only smoke run, on a model of the iterations' times (serve_bench.cc).
#pragma once

#include <cstdint>
#include <string>

#include "bench/serve/serve_platform.h"
#include "bench/serve/serve_report.h"
#include "bench/serve/serve_requests.h"
#include "bench/serve/serve_scheduler.h"

namespace engram::bench::serve {

struct ServeOptions {
  std::string platform = "h200", trace, dir = "/var/tmp/engram-serve", json_out;
  std::string methods, loads;                          // empty: the platform's
  double duration_s = 0, warmup_s = -1, drain_s = -1;  // <0 (0 for the duration): the platform's
  PlatformInputs inputs;
  RequestOptions requests;  // caps of 0: the platform's
  SchedulerOptions sched;
  uint64_t engram_vocab_size = 200'000;  // the synthetic tables' prime search start
  double cache_fraction = 0;             // the cache tier's budget of the rank's rows; 0: the
                                         // platform's
  bool smoke = false;                    // CPU only: the iterations' times modelled
};

// The driver's options for one load point of the run.
DriverOptions LoadOptions(const ServeOptions& o, const Platform& p, const LoadPoint& load);

// Runs every load point of every method on the GPU, adding each to `report` (and writing its
// JSON after each). Returns 0, 1 when a method failed or its rows differ from the GPU-memory
// copy's, 77 without a GPU (or in a build without CUDA).
int RunOnGpu(const ServeOptions& o, const Platform& p, RequestSource& requests, Report& report);

}  // namespace engram::bench::serve
