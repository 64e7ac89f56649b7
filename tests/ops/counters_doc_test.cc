// docs/operations.md's metrics table against the counter lists: every metric a list declares
// (engram/session_stats.h, protocol/store_counters.h) is named in it, so a counter added to a
// list fails here until the table says what it is.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engram/session_stats.h"
#include "protocol/store_counters.h"

namespace {

// The "## Metrics" section of docs/operations.md.
std::string MetricsSection() {
  const char* path = getenv("ENGRAMD_OPERATIONS_MD");
  INFO("ENGRAMD_OPERATIONS_MD names docs/operations.md (set by meson test)");
  REQUIRE(path != nullptr);
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const size_t begin = text.find("\n## Metrics\n");
  REQUIRE(begin != std::string::npos);
  return text.substr(begin, text.find("\n## ", begin + 1) - begin);
}

// The family of a metric spec: "name" or "name{key=value}".
std::string Family(const char* spec) {
  const std::string s = spec;
  return s.substr(0, s.find('{'));
}

}  // namespace

TEST_CASE("docs/operations.md names the metric of every counter in the lists") {
  std::vector<std::string> metrics;
#define SESSION_(field, origin, type, metric, help) metrics.push_back(Family(metric));
  ENGRAM_SESSION_COUNTERS(SESSION_)
  ENGRAM_SESSION_DAEMON_COUNTERS(SESSION_)
#undef SESSION_
#define CACHE_(field, json_key, type, metric, help) metrics.push_back(metric);
  ENGRAM_ROW_CACHE_COUNTERS(CACHE_)
#undef CACHE_
#define TABLE_(field, json_key, tiers, type, metric, help) metrics.push_back(metric);
  ENGRAM_STORE_TABLE_COUNTERS(TABLE_)
#undef TABLE_
#define MISS_(field, json_key, type, metric, help) metrics.push_back(metric);
  ENGRAM_MISS_CLASS_COUNTERS(MISS_)
#undef MISS_
  const std::string section = MetricsSection();
  size_t named = 0;
  for (const std::string& m : metrics) {
    if (m.empty()) continue;  // a counter without a metric of its own
    INFO(m);
    CHECK(section.find("`" + m + "`") != std::string::npos);
    ++named;
  }
  CHECK(named >= 20);
}
