// engramd's memory report: PSI and cgroup files (v2 and the legacy v1 controller) read from fake
// trees, the drop-in a budget turns into, the budget mismatch warning, the rate-limited
// throttling notice, and the [memory] budget key.
#include "daemon/ops/cgroup_memory.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_format.h"
#include "daemon/ops/config_file.h"

namespace engram {
namespace {

namespace fs = std::filesystem;

// A fake root with /proc and /sys/fs/cgroup files; removed on destruction.
struct FakeRoot {
  std::string dir;
  FakeRoot() {
    char tmpl[] = "/tmp/engram-cgroup-test-XXXXXX";
    dir = mkdtemp(tmpl);
  }
  ~FakeRoot() { fs::remove_all(dir); }
  void Write(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(dir + path).parent_path());
    std::ofstream(dir + path) << text;
  }
};

constexpr char kPsi[] =
    "some avg10=1.50 avg60=0.25 avg300=0.00 total=1234567\n"
    "full avg10=0.50 avg60=0.00 avg300=0.00 total=7654\n";

TEST_CASE("PSI lines parse; malformed ones are refused") {
  std::optional<MemoryPressure> p = ParseMemoryPressure(kPsi);
  REQUIRE(p);
  CHECK(p->some.avg10 == Approx(1.5));
  CHECK(p->some.avg60 == Approx(0.25));
  CHECK(p->some.total_us == 1234567);
  REQUIRE(p->full);
  CHECK(p->full->total_us == 7654);
  CHECK_FALSE(ParseMemoryPressure(""));
  CHECK_FALSE(ParseMemoryPressure("some avg10=x avg60=0 avg300=0 total=1\n"));
  CHECK_FALSE(ParseMemoryPressure("full avg10=0.00 avg60=0.00 avg300=0.00 total=1\n"));
}

TEST_CASE("a cgroup v2 memory controller is read with its limits, events and pressure") {
  FakeRoot r;
  r.Write("/proc/self/cgroup", "0::/system.slice/engramd.service\n");
  r.Write("/proc/pressure/memory", kPsi);
  const std::string cg = "/sys/fs/cgroup/system.slice/engramd.service";
  r.Write("/sys/fs/cgroup/cgroup.controllers", "cpu memory io\n");
  r.Write(cg + "/memory.current", "1048576\n");
  r.Write(cg + "/memory.max", "25769803776\n");
  r.Write(cg + "/memory.high", "max\n");
  r.Write(cg + "/memory.peak", "2097152\n");
  r.Write(cg + "/memory.events", "low 0\nhigh 7\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n");
  r.Write(cg + "/memory.pressure", kPsi);
  MemoryReport m = ReadMemoryReport(r.dir);
  CHECK(m.cgroup.version == 2);
  CHECK(m.cgroup.path == r.dir + cg);
  CHECK(m.cgroup.current == 1048576);
  CHECK(m.cgroup.max == uint64_t{25769803776});
  CHECK_FALSE(m.cgroup.high);
  CHECK(m.cgroup.peak == uint64_t{2097152});
  CHECK(m.cgroup.high_events == 7);
  CHECK(m.cgroup.max_events == 3);
  CHECK(m.cgroup.oom_kills == 1);
  REQUIRE(m.cgroup.pressure);
  CHECK(m.cgroup.pressure->some.avg10 == Approx(1.5));
  REQUIRE(m.system);
  const MemoryPlan plan = *PlanMemory({.budget = 24ull << 30,
                                       .process = 1ull << 30,
                                       .buffers = 1ull << 30,
                                       .arena_limit = 2ull << 30});
  nlohmann::json j = MemoryReportJson(m, plan);
  CHECK(j["max_bytes"] == 25769803776ull);
  CHECK(j["high_bytes"].is_null());
  CHECK(j["budget_bytes"] == 24ull << 30);
  CHECK(j["split"]["arenas_bytes"] == 2ull << 30);
  CHECK(j["split"]["store_bytes"] == plan.store);
  CHECK(j["split"]["unreclaimable_bytes"] == plan.unreclaimable());
  CHECK(j["pressure"]["some"]["avg10"] == Approx(1.5));
  metrics::Exposition e;
  AppendMemoryMetrics(e, m, plan);
  const std::string text = e.Text();
  CHECK(text.find("engram_memory_budget_split_bytes{piece=\"arenas\"} 2147483648\n") !=
        std::string::npos);
  CHECK(text.find("engram_memory_cgroup_current_bytes 1048576\n") != std::string::npos);
  CHECK(text.find("engram_memory_cgroup_high_bytes +Inf\n") != std::string::npos);
  CHECK(text.find("engram_memory_cgroup_high_events_total 7\n") != std::string::npos);
  // PSI's percent becomes a ratio: 1.50 % is 0.015.
  CHECK(text.find("engram_memory_cgroup_pressure_some_ratio 0.015\n") != std::string::npos);
  CHECK(text.find("avg10") == std::string::npos);
  // The budget comes once: the whole, and its split (the row store's share is piece="store").
  CHECK(text.find("engram_memory_budget_bytes 25769803776\n") != std::string::npos);
  CHECK(text.find(absl::StrFormat("engram_memory_budget_split_bytes{piece=\"store\"} %u\n",
                                  plan.store)) != std::string::npos);
}

TEST_CASE("the legacy v1 memory controller is read where the unified hierarchy has none") {
  FakeRoot r;
  r.Write("/proc/self/cgroup", "4:memory:/engram\n1:cpu:/\n0::/\n");
  r.Write("/sys/fs/cgroup/unified/cgroup.procs", "");
  const std::string cg = "/sys/fs/cgroup/memory/engram";
  r.Write(cg + "/memory.usage_in_bytes", "4096\n");
  r.Write(cg + "/memory.limit_in_bytes", "9223372036854771712\n");  // unlimited
  r.Write(cg + "/memory.max_usage_in_bytes", "8192\n");
  r.Write(cg + "/memory.failcnt", "5\n");
  r.Write(cg + "/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n");
  MemoryReport m = ReadMemoryReport(r.dir);
  CHECK(m.cgroup.version == 1);
  CHECK(m.cgroup.current == 4096);
  CHECK_FALSE(m.cgroup.max);
  CHECK(m.cgroup.peak == uint64_t{8192});
  CHECK(m.cgroup.max_events == 5);
  CHECK(m.cgroup.oom_kills == 2);
  CHECK_FALSE(m.system);  // no PSI file in this tree
  CHECK(BudgetMismatch(m.cgroup, 1 << 30)->find("allows unlimited memory") != std::string::npos);
  CHECK_FALSE(BudgetMismatch(m.cgroup, 0));
  m.cgroup.max = 1 << 30;
  CHECK_FALSE(BudgetMismatch(m.cgroup, 1 << 30));
  // A cgroup smaller than the budget would OOM-kill engramd before it reaches the budget.
  m.cgroup.max = 1 << 29;
  const std::optional<std::string> smaller = BudgetMismatch(m.cgroup, 1 << 30);
  REQUIRE(smaller);
  CHECK(smaller->find("allows only") != std::string::npos);
  CHECK(smaller->find("OOM-killed") != std::string::npos);
}

TEST_CASE("no memory cgroup: only the budget and system pressure are reported") {
  FakeRoot r;
  r.Write("/proc/self/cgroup", "0::/\n");
  r.Write("/proc/pressure/memory", kPsi);
  MemoryReport m = ReadMemoryReport(r.dir);
  CHECK(m.cgroup.version == 0);
  CHECK(MemoryReportJson(m, MemoryPlan{})["cgroup_version"] == 0);
  CHECK_FALSE(MemoryReportJson(m, MemoryPlan{}).contains("split"));
  CHECK(BudgetMismatch(m.cgroup, 1 << 30)->find("no memory cgroup") != std::string::npos);
}

TEST_CASE("the drop-in caps the unit at the budget, reclaiming above what cannot be reclaimed") {
  const MemoryPlan plan = *PlanMemory({.budget = 24ull << 30,
                                       .process = 1ull << 30,
                                       .buffers = 1ull << 30,
                                       .arena_limit = 16ull << 30});
  const std::string d = MemoryDropIn(plan);
  CHECK(d.find("[Service]\n") != std::string::npos);
  CHECK(d.find("\nMemoryMax=25769803776\n") != std::string::npos);
  CHECK(d.find("\nMemoryHigh=" + std::to_string(plan.unreclaimable()) + "\n") != std::string::npos);
  // Everything but the page cache's share is below MemoryHigh.
  CHECK(plan.unreclaimable() == plan.process + plan.buffers + plan.arenas + plan.store);
  CHECK(d.find("process 1.00 GiB + buffers 1.00 GiB + arenas 6.00 GiB") != std::string::npos);
  const std::string none = MemoryDropIn(MemoryPlan{});
  CHECK(none.find("\nMemoryMax=infinity\n") != std::string::npos);
  CHECK(none.find("\nMemoryHigh=infinity\n") != std::string::npos);
}

TEST_CASE("MemTotal is read from /proc/meminfo") {
  FakeRoot r;
  r.Write("/proc/meminfo", "MemTotal:       24684316 kB\nMemFree:         1000 kB\n");
  CHECK(ReadMemTotal(r.dir) == uint64_t{24684316} * 1024);
  FakeRoot empty;
  CHECK_FALSE(ReadMemTotal(empty.dir));
}

}  // namespace
}  // namespace engram
