// Prometheus text exposition for engramd: a small writer that keeps each family's HELP/TYPE
// lines together, the optional loopback HTTP listener serving GET /metrics, and the
// node-exporter textfile writer. What the metrics say is assembled in control.cc.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace engram::metrics {

// Label set, rendered in the order given.
using Labels = std::vector<std::pair<std::string, std::string>>;

class Exposition {
 public:
  // Each sample names its family; the family's HELP and TYPE come once, before its samples.
  void Gauge(const std::string& name, const std::string& help, const Labels& labels, double value);
  void Counter(const std::string& name, const std::string& help, const Labels& labels,
               double value);
  // A histogram from log2 nanosecond buckets (bucket i counts [2^i, 2^(i+1)) ns) and the exact
  // total of the observations (`sum_ns`), exposed in seconds.
  void Log2Histogram(const std::string& name, const std::string& help, const Labels& labels,
                     const uint64_t* buckets, size_t num_buckets, uint64_t sum_ns);
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

// Escapes a label value (backslash, quote, newline).
std::string EscapeLabel(const std::string& value);

// Serves GET /metrics on a loopback TCP port from its own thread with whatever `render`
// returns. Up to 64 connections are served at once, none blocking another; each has 0.5 s from
// accept to the end of its request and 2 s to its answer's last byte. A 65th closes the oldest
// that has not sent its request yet, so that a flood of idle connections never closes a scraper
// whose request has come (docs/reliability.md).
class HttpListener {
 public:
  static absl::StatusOr<std::unique_ptr<HttpListener>> Start(const std::string& address,
                                                             uint16_t port,
                                                             std::function<std::string()> render);
  ~HttpListener();
  uint16_t port() const { return port_; }

 private:
  struct Connection;
  HttpListener() = default;
  void Loop();
  void Accept(std::vector<Connection>* conns, uint64_t now);
  void Serve(Connection& c);
  int fd_ = -1;
  int stop_fd_ = -1;
  uint16_t port_ = 0;
  std::function<std::string()> render_;
  std::thread thread_;
};

// Writes `text` to DIR/engramd.prom through a temporary file and rename, so node-exporter
// never reads half a file.
absl::Status WriteTextfile(const std::string& dir, const std::string& text);

}  // namespace engram::metrics
