// Prometheus text exposition for engramd: a small writer that keeps each family's HELP/TYPE
// lines together, the process_* families read from /proc/self, the optional loopback HTTP
// listener serving GET /metrics and GET /healthz, and the node-exporter textfile writer. What
// the metrics say is assembled in metrics_text.cc.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/metric_sink.h"

namespace engram::metrics {

using Labels = MetricLabels;

// Which log2 nanosecond buckets a histogram exposes: `le` edges 2^first_log2 ns,
// 2^(first_log2 + step) ns, ... up to 2^last_log2 ns, then +Inf. Observations below the first
// edge count in the first bucket.
struct Log2Edges {
  int first_log2;
  int last_log2;
  int step = 1;
};
// The engine's batch histograms: 26 edges from 2^10 ns (1.024 µs) to 2^35 ns (34.4 s).
inline constexpr Log2Edges kFineEdges{.first_log2 = 10, .last_log2 = 35, .step = 1};
// Per-client histograms, one per client name: 10 edges, a factor of 4 apart, from 2^12 ns
// (4.1 µs) to 2^30 ns (1.07 s), so that many clients do not multiply into many series.
inline constexpr Log2Edges kClientEdges{.first_log2 = 12, .last_log2 = 30, .step = 2};

class Exposition final : public MetricSink {
 public:
  // Each sample names its family; the family's HELP and TYPE come once, before its samples.
  void Gauge(const std::string& name, const std::string& help, const Labels& labels,
             double value) override;
  void Counter(const std::string& name, const std::string& help, const Labels& labels,
               double value) override;
  // A histogram from log2 nanosecond buckets (bucket i counts [2^i, 2^(i+1)) ns) and the exact
  // total of the observations (`sum_ns`), exposed in seconds with the `edges` given.
  void Log2Histogram(const std::string& name, const std::string& help, const Labels& labels,
                     const uint64_t* buckets, size_t num_buckets, uint64_t sum_ns,
                     const Log2Edges& edges);
  // The engine's edges (kFineEdges): what a library reporting through MetricSink gets.
  void Log2Histogram(const std::string& name, const std::string& help, const Labels& labels,
                     const uint64_t* buckets, size_t num_buckets, uint64_t sum_ns) override {
    Log2Histogram(name, help, labels, buckets, num_buckets, sum_ns, kFineEdges);
  }
  std::string Text() const;

 private:
  struct Family {
    std::string help;
    std::string type;
    std::vector<std::string> samples;
  };
  Family& Get(const std::string& name, const std::string& help, const char* type);
  std::vector<std::string> order_;
  std::map<std::string, Family> families_;
};

// A sample value as the exposition writes it: an integer exactly, in digits; any other number in
// the shortest form that reads back as the same double; NaN and +Inf/-Inf by name.
std::string FormatSampleValue(double v);

// Escapes a label value (backslash, quote, newline).
std::string EscapeLabel(const std::string& value);

// The standard process_* families (process_cpu_seconds_total, process_resident_memory_bytes,
// process_virtual_memory_bytes, process_open_fds, process_max_fds, process_start_time_seconds)
// of the calling process, read from /proc/self under `proc` ("/proc"); a file it cannot read
// leaves its families out.
void AppendProcessMetrics(Exposition& e, const std::string& proc = "/proc");

// What GET /healthz answers: 200 "ok" when `ok`, else 503 with `reason`.
struct Health {
  bool ok = false;
  std::string reason;
};

// Serves GET /metrics on a loopback TCP port from its own thread with whatever `render`
// returns, and GET /healthz with what `health` says. Up to 64 connections are served at once, none
// blocking another; each has 0.5 s from accept to the end of its request and 2 s to its answer's
// last byte. A 65th closes the oldest that has not sent its request yet, so that a flood of idle
// connections never closes a scraper whose request has come (docs/reliability.md).
class HttpListener {
 public:
  static absl::StatusOr<std::unique_ptr<HttpListener>> Start(const std::string& address,
                                                             uint16_t port,
                                                             std::function<std::string()> render,
                                                             std::function<Health()> health);
  ~HttpListener();
  uint16_t port() const { return port_; }
  // Replaces what the listener answers with (engramd starting, then serving). Thread-safe.
  void SetHandlers(std::function<std::string()> render, std::function<Health()> health);

 private:
  struct Connection;
  HttpListener() = default;
  void Loop();
  void Accept(std::vector<Connection>* conns, uint64_t now);
  void Serve(Connection& c);
  int fd_ = -1;
  int stop_fd_ = -1;
  uint16_t port_ = 0;
  std::mutex handlers_mu_;  // guards render_ and health_
  std::function<std::string()> render_;
  std::function<Health()> health_;
  std::thread thread_;
};

// Writes `text` to DIR/engramd.prom through a temporary file and rename, so node-exporter
// never reads half a file.
absl::Status WriteTextfile(const std::string& dir, const std::string& text);

// Removes DIR/engramd.prom (and a temporary file left beside it): node-exporter stops exporting
// a textfile that is no longer written. A file already gone is not an error.
absl::Status RemoveTextfile(const std::string& dir);

// The families only the textfile carries: when it was written (`written_unix_s`, seconds since the
// epoch) and how often it is, so that an alert can tell a file nobody writes any more (a killed
// engramd) from a fresh one: engram_textfile_written_timestamp_seconds and
// engram_textfile_interval_seconds.
std::string TextfileFreshness(double written_unix_s, uint32_t interval_s);

}  // namespace engram::metrics
