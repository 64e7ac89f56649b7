// engram-serve's driver: one load point served by the scheduler over an executor that runs the
// iterations (on the GPU, or a model of their times for the CPU-only smoke run and the tests),
// requests arriving from closed-loop clients or a Poisson process.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/serve/serve_requests.h"
#include "bench/serve/serve_scheduler.h"
#include "bench/serve/serve_stats.h"

namespace engram::bench::serve {

class Executor {
 public:
  virtual ~Executor() = default;
  virtual uint64_t Now() = 0;  // ns
  virtual void WaitUntil(uint64_t ns) = 0;
  // Sequences the iteration's inputs are laid out for (Scheduler::Inputs).
  virtual uint32_t Seqs() const = 0;
  // Runs `it` on inputs `b`, filling rec's times, clock and misses (not the scheduler's counts).
  // Returns an empty string, or why the method failed.
  virtual std::string Run(const Iteration& it, const Batch& b, IterationRecord& rec) = 0;
};

// Iterations of modelled length on a virtual clock: `step_us(bucket)` each.
class ModelExecutor : public Executor {
 public:
  ModelExecutor(uint32_t seqs, std::function<double(uint32_t)> step_us)
      : seqs_(seqs), step_us_(std::move(step_us)) {}
  uint64_t Now() override { return now_; }
  void WaitUntil(uint64_t ns) override { now_ = std::max(now_, ns); }
  uint32_t Seqs() const override { return seqs_; }
  std::string Run(const Iteration& it, const Batch& b, IterationRecord& rec) override;

 private:
  uint32_t seqs_;
  std::function<double(uint32_t)> step_us_;
  uint64_t now_ = 1'000'000'000;
};

struct DriverOptions {
  SchedulerOptions sched;
  std::vector<uint32_t> buckets;
  LoadPoint load;
  // Requests are sent for duration_ns; those arriving after warmup_ns are measured; then the
  // requests in flight run for at most drain_ns more.
  uint64_t duration_ns = 4'000'000'000, warmup_ns = 500'000'000, drain_ns = 2'000'000'000;
  uint64_t seed = 1;  // the Poisson arrivals
};

struct LoadRun {
  std::vector<RequestRecord> requests;      // finished, then the unfinished
  std::vector<IterationRecord> iterations;  // those ending inside the measured window
  uint64_t begin_ns = 0, end_ns = 0;        // the measured window
  uint64_t start_ns = 0, finish_ns = 0;     // the whole run, drain included
  uint64_t iterations_all = 0;
  std::string error;  // the executor's, if it failed
};

// Serves `o.load` from `requests` (rewound first) on `ex`.
LoadRun RunLoad(const DriverOptions& o, RequestSource& requests, Executor& ex);

}  // namespace engram::bench::serve
