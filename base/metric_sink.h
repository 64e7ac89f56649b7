// MetricSink: where a library reports its metrics, without knowing how they are exposed. The row
// store and the prefetcher add their samples to one; engramd's operations implement it with the
// Prometheus text exposition (daemon/ops/metrics.h).
//
//   void Report(MetricSink* sink) {
//     sink->Gauge("engram_store_bytes", "Bytes the row store holds", {}, double(used));
//     sink->Counter("engram_cache_hits_total", "Rows served from the cache", {{"table", "2"}}, 7);
//   }
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace engram {

// Label set, rendered in the order given. Values are outside text: the sink escapes them.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class MetricSink {
 public:
  virtual ~MetricSink() = default;
  // Each sample names its family (`name`, `help`); a counter only grows.
  virtual void Gauge(const std::string& name, const std::string& help, const MetricLabels& labels,
                     double value) = 0;
  virtual void Counter(const std::string& name, const std::string& help, const MetricLabels& labels,
                       double value) = 0;
  // A histogram from log2 nanosecond buckets (bucket i counts [2^i, 2^(i+1)) ns) and the exact
  // total of the observations (`sum_ns`).
  virtual void Log2Histogram(const std::string& name, const std::string& help,
                             const MetricLabels& labels, const uint64_t* buckets,
                             size_t num_buckets, uint64_t sum_ns) = 0;
};

}  // namespace engram
