// MetricSink: where a library reports its metrics, without knowing how they are exposed. The row
// store and the prefetcher add their samples to one; engramd's operations implement it with the
// Prometheus text exposition (daemon/ops/metrics.h).
//
//   void Report(MetricSink* sink) {
//     sink->Gauge("engram_store_bytes", "Bytes the row store holds", {}, double(used));
//     sink->Counter("engram_cache_hits_total", "Rows served from the cache", {{"table", "2"}}, 7);
//   }
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
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

// Log2 nanosecond buckets, as Log2Histogram takes them: the bucket `ns` counts in (the last of
// `num_buckets` takes everything above).
inline size_t Log2BucketOf(uint64_t ns, size_t num_buckets = 64) {
  return std::min<size_t>(num_buckets - 1, std::bit_width(ns | 1) - 1);
}

// The q-quantile of log2 buckets, as the upper edge of the bucket it falls in (0 when empty;
// UINT64_MAX in the last of 64).
inline uint64_t Log2QuantileNs(std::span<const uint64_t> buckets, double q) {
  uint64_t total = 0;
  for (uint64_t b : buckets) total += b;
  if (total == 0) return 0;
  q = std::clamp(q, 0.0, 1.0);
  const uint64_t target = std::max<uint64_t>(1, static_cast<uint64_t>(q * double(total) + 0.5));
  uint64_t seen = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    seen += buckets[i];
    if (seen >= target) return i >= 63 ? UINT64_MAX : uint64_t{2} << i;
  }
  return UINT64_MAX;
}

}  // namespace engram
