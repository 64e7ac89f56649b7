// Reading engramd's memory cgroup and PSI, the systemd drop-in for a budget, and throttling
// notices (cgroup_memory.h).
#include "daemon/ops/cgroup_memory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace engram {
namespace {

// A v1 limit this high is no limit (the kernel reports PAGE_COUNTER_MAX pages).
constexpr uint64_t kV1Unlimited = uint64_t{1} << 62;

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<uint64_t> ReadNumber(const std::string& path) {
  std::optional<std::string> text = ReadFile(path);
  uint64_t v = 0;
  if (!text || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &v)) return std::nullopt;
  return v;
}

// memory.max / memory.high: a number, or "max" (unlimited, returned as nullopt).
std::optional<uint64_t> ReadLimit(const std::string& path) { return ReadNumber(path); }

// "key value" lines (memory.events, memory.oom_control): the value of `key`, 0 if absent.
uint64_t KeyedValue(const std::optional<std::string>& text, absl::string_view key) {
  if (!text) return 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(line, ' ');
    uint64_t v = 0;
    if (kv.first == key && absl::SimpleAtoi(kv.second, &v)) return v;
  }
  return 0;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// This process's cgroup path in the hierarchy named by `controller` ("" for the unified one).
std::optional<std::string> OwnCgroup(const std::string& root, absl::string_view controller) {
  std::optional<std::string> text = ReadFile(root + "/proc/self/cgroup");
  if (!text) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (controller.empty()
            ? f[0] == "0" && f[1].empty()
            : absl::StrContains(absl::StrCat(",", f[1], ","), absl::StrCat(",", controller, ","))) {
      return std::string(f[2]);
    }
  }
  return std::nullopt;
}

void ReadV2(const std::string& dir, CgroupMemory* m) {
  m->version = 2;
  m->path = dir;
  m->current = ReadNumber(dir + "/memory.current").value_or(0);
  m->max = ReadLimit(dir + "/memory.max");
  m->high = ReadLimit(dir + "/memory.high");
  m->peak = ReadNumber(dir + "/memory.peak");
  const std::optional<std::string> events = ReadFile(dir + "/memory.events");
  m->high_events = KeyedValue(events, "high");
  m->max_events = KeyedValue(events, "max");
  m->oom_kills = KeyedValue(events, "oom_kill");
  if (std::optional<std::string> p = ReadFile(dir + "/memory.pressure")) {
    m->pressure = ParseMemoryPressure(*p);
  }
}

void ReadV1(const std::string& dir, CgroupMemory* m) {
  m->version = 1;
  m->path = dir;
  m->current = ReadNumber(dir + "/memory.usage_in_bytes").value_or(0);
  m->max = ReadNumber(dir + "/memory.limit_in_bytes");
  if (m->max && *m->max >= kV1Unlimited) m->max.reset();
  m->peak = ReadNumber(dir + "/memory.max_usage_in_bytes");
  m->max_events = ReadNumber(dir + "/memory.failcnt").value_or(0);
  m->oom_kills = KeyedValue(ReadFile(dir + "/memory.oom_control"), "oom_kill");
}

std::string Gib(uint64_t bytes) {
  return absl::StrFormat("%.2f GiB", double(bytes) / double(uint64_t{1} << 30));
}

nlohmann::json StallJson(const PressureStall& s) {
  return {{"avg10", s.avg10}, {"avg60", s.avg60}, {"total_us", s.total_us}};
}

nlohmann::json PressureJson(const std::optional<MemoryPressure>& p) {
  if (!p) return nullptr;
  nlohmann::json j = {{"some", StallJson(p->some)}};
  j["full"] = p->full ? StallJson(*p->full) : nlohmann::json(nullptr);
  return j;
}

}  // namespace

MemoryReport ReadMemoryReport(const std::string& root) {
  MemoryReport r;
  if (std::optional<std::string> p = ReadFile(root + "/proc/pressure/memory")) {
    r.system = ParseMemoryPressure(*p);
  }
  // The unified hierarchy, where it has the memory controller (pure v2 at /sys/fs/cgroup, or the
  // hybrid layout's /sys/fs/cgroup/unified); else the legacy memory controller.
  const std::string fs = root + "/sys/fs/cgroup";
  const std::string unified = Exists(fs + "/cgroup.controllers") ? fs : fs + "/unified";
  if (std::optional<std::string> path = OwnCgroup(root, "")) {
    const std::string dir = *path == "/" ? unified : unified + *path;
    if (Exists(dir + "/memory.current")) {
      ReadV2(dir, &r.cgroup);
      return r;
    }
  }
  if (std::optional<std::string> path = OwnCgroup(root, "memory")) {
    const std::string dir = fs + "/memory" + (*path == "/" ? "" : *path);
    if (Exists(dir + "/memory.usage_in_bytes")) ReadV1(dir, &r.cgroup);
  }
  return r;
}

std::optional<uint64_t> ReadMemTotal(const std::string& root) {
  std::optional<std::string> text = ReadFile(root + "/proc/meminfo");
  if (!text) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemTotal:")) continue;
    line = absl::StripAsciiWhitespace(line);
    uint64_t kib = 0;
    if (absl::ConsumeSuffix(&line, "kB") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib)) {
      return kib * 1024;
    }
  }
  return std::nullopt;
}

std::string MemoryDropIn(const MemoryPlan& plan) {
  std::string out =
      "# engramd.service memory bound, written by `engramd --memory-dropin` from [memory] "
      "budget.\n"
      "# Install as /etc/systemd/system/engramd.service.d/memory-budget.conf, then\n"
      "# `systemctl daemon-reload && systemctl restart engramd`.\n"
      "[Service]\n"
      "MemoryAccounting=yes\n";
  if (!plan.bounded()) {
    return out + "# budget 0: unbounded\nMemoryHigh=infinity\nMemoryMax=infinity\n";
  }
  return out + absl::StrFormat(
                   "# budget %u bytes: %s.\n"
                   "# MemoryHigh is all but the page cache's share: what engramd may hold that\n"
                   "# cannot be reclaimed (no swap), so reclaim above it only takes page cache.\n"
                   "MemoryHigh=%u\nMemoryMax=%u\nMemorySwapMax=0\n",
                   plan.budget, DescribeMemoryPlan(plan), plan.unreclaimable(), plan.budget);
}

std::optional<std::string> BudgetMismatch(const CgroupMemory& cgroup, uint64_t budget) {
  if (cgroup.version == 0) {
    if (budget == 0) return std::nullopt;
    return absl::StrFormat(
        "memory.budget is %s but no memory cgroup of engramd was found: nothing bounds it "
        "(run it from engramd.service with the drop-in of `engramd --memory-dropin`)",
        Gib(budget));
  }
  if (budget == 0 || (cgroup.max && *cgroup.max == budget)) return std::nullopt;
  if (cgroup.max && *cgroup.max < budget) {
    return absl::StrFormat(
        "memory.budget is %s (%u bytes) but engramd's cgroup %s allows only %s (%u bytes): "
        "engramd plans to hold up to the budget and would be OOM-killed before it gets there; "
        "lower memory.budget to %u or install the drop-in that `engramd --memory-dropin` "
        "prints",
        Gib(budget), budget, cgroup.path, Gib(*cgroup.max), *cgroup.max, *cgroup.max);
  }
  return absl::StrFormat(
      "memory.budget is %s but engramd's cgroup %s allows %s: install the drop-in that "
      "`engramd --memory-dropin` prints, then `systemctl daemon-reload && systemctl restart "
      "engramd`",
      Gib(budget), cgroup.path, cgroup.max ? Gib(*cgroup.max) : "unlimited memory");
}

nlohmann::json MemoryReportJson(const MemoryReport& r, const MemoryPlan& plan) {
  const CgroupMemory& c = r.cgroup;
  nlohmann::json j = {{"budget_bytes", plan.budget}, {"cgroup_version", c.version}};
  if (plan.bounded()) {
    j["split"] = {{"process_bytes", plan.process}, {"buffers_bytes", plan.buffers},
                  {"arenas_bytes", plan.arenas},   {"page_cache_bytes", plan.page_cache},
                  {"store_bytes", plan.store},     {"unreclaimable_bytes", plan.unreclaimable()}};
  }
  if (c.version != 0) {
    j["cgroup"] = c.path;
    j["current_bytes"] = c.current;
    j["max_bytes"] = c.max ? nlohmann::json(*c.max) : nlohmann::json(nullptr);
    j["high_bytes"] = c.high ? nlohmann::json(*c.high) : nlohmann::json(nullptr);
    j["peak_bytes"] = c.peak ? nlohmann::json(*c.peak) : nlohmann::json(nullptr);
    j["high_events"] = c.high_events;
    j["max_events"] = c.max_events;
    j["oom_kills"] = c.oom_kills;
    j["pressure"] = PressureJson(c.pressure);
  }
  j["system_pressure"] = PressureJson(r.system);
  return j;
}

void AppendMemoryMetrics(metrics::Exposition& e, const MemoryReport& r, const MemoryPlan& plan) {
  e.Gauge("engram_memory_budget_bytes", "The configured memory.budget (0: unbounded)", {},
          double(plan.budget));
  if (plan.bounded()) {
    const std::pair<const char*, uint64_t> pieces[] = {{"process", plan.process},
                                                       {"buffers", plan.buffers},
                                                       {"arenas", plan.arenas},
                                                       {"page_cache", plan.page_cache},
                                                       {"store", plan.store}};
    for (const auto& [piece, bytes] : pieces) {
      e.Gauge("engram_memory_budget_split_bytes", "memory.budget's share for each piece",
              {{"piece", piece}}, double(bytes));
    }
  }
  const CgroupMemory& c = r.cgroup;
  if (c.version != 0) {
    e.Gauge("engram_memory_cgroup_current_bytes",
            "Memory charged to engramd's cgroup, page cache included", {}, double(c.current));
    // Unlimited is +Inf, as Prometheus writes it.
    const double inf = std::numeric_limits<double>::infinity();
    e.Gauge("engram_memory_cgroup_max_bytes", "The cgroup's memory.max (+Inf: unlimited)", {},
            c.max ? double(*c.max) : inf);
    if (c.version == 2) {
      e.Gauge("engram_memory_cgroup_high_bytes", "The cgroup's memory.high (+Inf: unlimited)", {},
              c.high ? double(*c.high) : inf);
    }
    e.Counter("engram_memory_cgroup_high_events_total",
              "Times the cgroup was throttled and reclaimed at memory.high", {},
              double(c.high_events));
    e.Counter("engram_memory_cgroup_max_events_total", "Times the cgroup's usage hit memory.max",
              {}, double(c.max_events));
    e.Counter("engram_memory_cgroup_oom_kills_total", "OOM kills inside the cgroup", {},
              double(c.oom_kills));
    if (c.pressure) {
      // PSI gives a percent; metrics give ratios (0-1).
      e.Gauge("engram_memory_cgroup_pressure_some_ratio",
              "Share (0-1) of the last 10 s some of the cgroup's tasks stalled on memory", {},
              c.pressure->some.avg10 / 100);
      e.Counter("engram_memory_cgroup_pressure_some_seconds_total",
                "Time some of the cgroup's tasks stalled on memory", {},
                double(c.pressure->some.total_us) / 1e6);
    }
  }
  if (r.system) {
    e.Gauge("engram_memory_system_pressure_some_ratio",
            "Share (0-1) of the last 10 s some tasks of the system stalled on memory", {},
            r.system->some.avg10 / 100);
    e.Counter("engram_memory_system_pressure_some_seconds_total",
              "Time some tasks of the system stalled on memory", {},
              double(r.system->some.total_us) / 1e6);
  }
}

std::optional<std::string> MemoryThrottleWatch::Check(const MemoryReport& r, uint64_t now_ns) {
  const CgroupMemory& c = r.cgroup;
  if (c.version == 0) return std::nullopt;
  if (!primed_) {  // what happened before engramd started is not news
    primed_ = true;
    high_events_ = c.high_events;
    max_events_ = c.max_events;
    oom_kills_ = c.oom_kills;
    return std::nullopt;
  }
  const uint64_t high = c.high_events - std::min(c.high_events, high_events_);
  const uint64_t max = c.max_events - std::min(c.max_events, max_events_);
  const uint64_t oom = c.oom_kills - std::min(c.oom_kills, oom_kills_);
  if (high + max + oom == 0) return std::nullopt;
  if (logged_ && now_ns - last_line_ns_ < interval_ns_) return std::nullopt;  // counted later
  logged_ = true;
  last_line_ns_ = now_ns;
  high_events_ = c.high_events;
  max_events_ = c.max_events;
  oom_kills_ = c.oom_kills;
  std::string line = absl::StrFormat(
      "memory: engramd's cgroup %s is being throttled: %u reclaims at memory.high%s, %u hits "
      "of memory.max%s, %u OOM kills since the last notice; %s charged",
      c.path, high, c.high ? absl::StrCat(" (", Gib(*c.high), ")") : "", max,
      c.max ? absl::StrCat(" (", Gib(*c.max), ")") : "", oom, Gib(c.current));
  if (c.pressure) {
    absl::StrAppendFormat(&line, "; memory pressure some avg10 %.2f%%", c.pressure->some.avg10);
  }
  absl::StrAppend(&line,
                  ". Page cache of the tables is reclaimed and re-read from disk: raise "
                  "[memory] budget if the GPU can spare it");
  return line;
}

}  // namespace engram
