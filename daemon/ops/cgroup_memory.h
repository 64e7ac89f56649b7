// engramd's memory as the kernel accounts it: its own memory cgroup (what is charged, page cache
// included, against the MemoryHigh=/MemoryMax= that systemd derived from `[memory] budget`, and
// how the budget is split),
// memory pressure (PSI) of the cgroup and of the system, and whether the kernel is throttling
// it. On a unified-memory machine (DGX Spark) every byte here is a byte the GPU does not have.
//
//   MemoryReport r = ReadMemoryReport();
//   if (std::optional<std::string> line = watch.Check(r, NowNs())) log::Warning("{}", *line);
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "daemon/ops/metrics.h"
#include "store/memory_budget.h"     // MemoryPlan
#include "store/pressure_monitor.h"  // PSI: MemoryPressure, ParseMemoryPressure

namespace engram {

// One line of a PSI file: the share of time some (or all) tasks stalled on memory.
struct CgroupMemory {
  int version = 0;       // 2 (unified) or 1 (legacy memory controller); 0: none found
  std::string path;      // the cgroup's directory, e.g. /sys/fs/cgroup/system.slice/engramd.service
  uint64_t current = 0;  // bytes charged, page cache and shared memory included
  std::optional<uint64_t> max, high;  // absent: unlimited; v1 has no high
  std::optional<uint64_t> peak;       // highest current seen (memory.peak, Linux 5.19+)
  uint64_t high_events = 0;           // allocations throttled and reclaimed at memory.high (v2)
  uint64_t max_events = 0;            // allocations that hit memory.max (v1: failcnt)
  uint64_t oom_kills = 0;
  std::optional<MemoryPressure> pressure;  // the cgroup's own (v2 memory.pressure)
};

struct MemoryReport {
  CgroupMemory cgroup;
  std::optional<MemoryPressure> system;  // /proc/pressure/memory
};

// Reads this process's memory cgroup and PSI. `root` is prepended to /proc and /sys paths (tests
// point it at a fake tree). Never fails: what cannot be read is left out.
MemoryReport ReadMemoryReport(const std::string& root = "");

// The machine's memory (MemTotal of /proc/meminfo under `root`), or nullopt if unreadable.
std::optional<uint64_t> ReadMemTotal(const std::string& root = "");

// The systemd drop-in that bounds engramd.service to `plan`'s budget (unbounded: none):
// MemoryMax= is the budget, MemoryHigh= what engramd may hold that cannot be reclaimed
// (plan.unreclaimable()), so that reclaim and throttling above it only ever take page cache.
std::string MemoryDropIn(const MemoryPlan& plan);

// A warning when the cgroup's memory.max does not match the configured budget (the drop-in is
// missing or stale, or the cgroup is smaller than the budget, which the kernel would enforce by
// OOM-killing engramd); nullopt when they match or no budget is set and no cgroup found.
std::optional<std::string> BudgetMismatch(const CgroupMemory& cgroup, uint64_t budget);

// `engramctl status`'s "memory" object and the engram_memory_* metrics.
// With a budget, "split" gives the plan's pieces (each "<piece>_bytes").
nlohmann::json MemoryReportJson(const MemoryReport& r, const MemoryPlan& plan);
void AppendMemoryMetrics(metrics::Exposition& e, const MemoryReport& r, const MemoryPlan& plan);

// Says when the kernel throttled or limited engramd's cgroup since the previous call (memory.high
// reclaim, memory.max hits, OOM kills), at most once per `interval_ns`; the lines it held back are
// counted in the next one.
class MemoryThrottleWatch {
 public:
  explicit MemoryThrottleWatch(uint64_t interval_ns = 60'000'000'000) : interval_ns_(interval_ns) {}
  std::optional<std::string> Check(const MemoryReport& r, uint64_t now_ns);

 private:
  uint64_t interval_ns_;
  bool primed_ = false;
  uint64_t high_events_ = 0, max_events_ = 0, oom_kills_ = 0;  // at the last line (or start)
  uint64_t last_line_ns_ = 0;
  bool logged_ = false;
};

}  // namespace engram
