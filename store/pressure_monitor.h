// PressureMonitor: gives row cache memory back to the system under memory pressure and takes it
// again when the pressure is gone. It samples PSI (the daemon's cgroup memory.pressure, else
// /proc/pressure/memory): the share of wall time some task stalled on memory over the last
// interval. Above a threshold the cache shrinks by a step; after enough calm intervals it grows
// back by a step towards its configured size. Every change is reported through `notice`.
//
//   engram::PressureMonitor monitor(cache, {}, [](const std::string& line) { log::Notice(...); });
//   monitor.Start();   // a thread; Stop() or the destructor joins it
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "store/row_cache.h"

namespace engram {

// One line of a PSI file: the share of time stalled, and the cumulative stall.
struct PressureStall {
  double avg10 = 0;  // percent over the last 10 s
  double avg60 = 0;
  uint64_t total_us = 0;
};
struct MemoryPressure {
  PressureStall some;
  std::optional<PressureStall> full;  // absent in the system-wide file of old kernels
};

// Parses the text of a PSI file ("some avg10=1.00 avg60=0.50 avg300=0.10 total=123\nfull ...");
// nullopt when there is no well-formed "some" line. The row cache's pressure response and the
// daemon's memory report read PSI through this one parser.
std::optional<MemoryPressure> ParseMemoryPressure(const std::string& text);

// The memory.pressure file of this process's cgroup (v2) if it can be read, else
// /proc/pressure/memory if it can, else NotFound naming both.
absl::StatusOr<std::string> FindMemoryPressureFile();

inline constexpr char kPressureFileSetting[] = "memory.pressure_file";

// Whether `path`, named by memory.pressure_file, reads as a PSI file, opened as every sample
// opens it: without blocking, at most a PSI file's size read, symbolic links followed.
// FailedPrecondition naming the setting, the path and what it is when it is no regular file (a
// FIFO, a device such as /dev/zero, a directory): a configuration to refuse. NotFound when it is
// missing or holds something else than PSI: the cache then keeps its size.
absl::Status CheckPressureFile(const std::string& path);

struct PressureOptions {
  // PSI file to sample; empty: FindMemoryPressureFile().
  std::string path;
  uint64_t interval_ns = 1'000'000'000;
  // Shrink when "some" stall time exceeds this share of the interval.
  double shrink_above = 0.05;
  // Share of the current capacity given back per pressured interval.
  double shrink_step = 0.25;
  // Never shrink below this share of the configured capacity.
  double floor_fraction = 0.0625;
  // Calm intervals (stall below shrink_above / 4) before growing, and the share of the
  // configured capacity taken back per calm interval after that.
  uint32_t calm_intervals = 5;
  double grow_step = 0.125;
};

class PressureMonitor {
 public:
  using Notice = std::function<void(const std::string& line)>;

  // `target_slots` is the capacity the cache returns to when calm (its configured size).
  PressureMonitor(RowCache* cache, uint64_t target_slots, PressureOptions options, Notice notice);
  ~PressureMonitor();

  // Resolves the PSI file (options.path, or FindMemoryPressureFile()) and starts sampling;
  // NotFound when there is no PSI to read, or options.path cannot be read as one, and
  // FailedPrecondition when options.path is no regular file (CheckPressureFile); the cache then
  // keeps its size, and the caller reports it.
  absl::Status Start();
  void Stop();

  // One sample at `now_ns` (the thread calls it every interval; tests call it directly).
  // Returns the stall share measured, or nothing for the first sample or an unreadable file.
  std::optional<double> Tick(uint64_t now_ns);
  const std::string& path() const { return options_.path; }

 private:
  void Run();

  RowCache* const cache_;
  const uint64_t target_slots_;
  PressureOptions options_;
  Notice notice_;
  std::optional<MemoryPressure> last_;
  uint64_t last_ns_ = 0;
  uint32_t calm_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace engram
