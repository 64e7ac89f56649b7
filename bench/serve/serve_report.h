// engram-serve's results: one row per method and load point, printed as two 80-column tables
// (what the requests saw; what the iterations cost) and written as one JSON file that
// bench/serve/plot_serve.py draws.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "bench/serve/serve_driver.h"
#include "bench/serve/serve_requests.h"
#include "bench/serve/serve_stats.h"
#include "nlohmann/json.hpp"

namespace engram::bench::serve {

struct PointResult {
  std::string method;
  LoadPoint load;
  RequestStats req;
  IterationStats its;
  double engramd_cpu_cores = 0;  // engramd's CPU seconds a second of the window (all threads)
  double engramd_cpu_us_per_it = 0;
  double unified_memory_bound = 0;  // gb10: UnifiedMemoryBoundUs over the iterations' wall time
  uint64_t rows = 0;                // Engram rows the window's iterations looked up (both layers)
  std::string error;                // why the method stopped, if it did
};

// Summarises a load point's run; engramd's CPU over the run is `daemon_cpu_ns` (0: none).
PointResult Summarize(const std::string& method, const LoadPoint& load, const LoadRun& run,
                      uint64_t daemon_cpu_ns, uint32_t heads, double max_sm_mhz);

class Report {
 public:
  explicit Report(nlohmann::json header) : json_(std::move(header)) {}
  void Add(const PointResult& r);
  // The JSON so far to `path` (nothing when empty); false when it could not be written.
  bool Write(const std::string& path) const;
  // Both tables of every row so far.
  void Print(FILE* out) const;
  const std::vector<PointResult>& points() const { return points_; }
  const nlohmann::json& json() const { return json_; }

 private:
  nlohmann::json json_;
  std::vector<PointResult> points_;
};

}  // namespace engram::bench::serve
