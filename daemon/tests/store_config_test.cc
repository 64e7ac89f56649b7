// The row store's configuration keys: [tables] tier and tiers, [memory] budget, cache,
// pressure, huge_pages, load_at_start and load_rate, with refusals naming the file, line and
// key; and which of them a SIGHUP names as needing a restart.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/ops/config_file.h"
#include "daemon/ops/reload.h"
#include "testkit/table_test_util.h"

namespace engram {
namespace {

using Catch::Matchers::Contains;

absl::Status Apply(const std::string& text, DaemonSettings* s) {
  static testing::TempDir dir;
  static int n = 0;
  const std::string path = dir / ("t" + std::to_string(n++) + ".toml");
  std::ofstream(path) << text;
  return ApplyConfigFile(path, s);
}

TEST_CASE("the store keys default to storage and no budget", "[config]") {
  DaemonSettings s;
  REQUIRE(Apply("", &s).ok());
  REQUIRE(s.store.default_tier == Tier::kStorage);
  REQUIRE(s.store.tiers.empty());
  REQUIRE(s.store.budget_bytes == 0);
  REQUIRE(s.store.cache_bytes == 0);
  REQUIRE(s.store.pressure);
}

TEST_CASE("tiers, budget and cache are read", "[config]") {
  DaemonSettings s;
  REQUIRE(Apply("[tables]\ntier = \"cache\"\ntiers = [\"14=resident\", \"1=storage\"]\n"
                "[memory]\nbudget = \"96G\"\ncache = 1073741824\npressure = false\n"
                "huge_pages = false\n",
                &s)
              .ok());
  REQUIRE(s.store.default_tier == Tier::kCache);
  REQUIRE(s.store.TierOf(14) == Tier::kResident);
  REQUIRE(s.store.TierOf(1) == Tier::kStorage);
  REQUIRE(s.store.TierOf(7) == Tier::kCache);
  REQUIRE(s.store.budget_bytes == 96ull << 30);
  REQUIRE(s.store.cache_bytes == 1ull << 30);
  REQUIRE_FALSE(s.store.pressure);
  REQUIRE_FALSE(s.store.huge_pages);
  REQUIRE(s.store.load_at_start);
  REQUIRE(s.store.load_rate_bytes_per_s == 0);
  REQUIRE(Apply("[memory]\nload_at_start = false\nload_rate = \"200M\"\n", &s).ok());
  REQUIRE_FALSE(s.store.load_at_start);
  REQUIRE(s.store.load_rate_bytes_per_s == 200ull << 20);
  REQUIRE(Apply("[memory]\nbudget = 0\ncache = \"0\"\n", &s).ok());
  REQUIRE(s.store.budget_bytes == 0);
  REQUIRE(s.store.cache_bytes == 0);
}

TEST_CASE("bad store values are refused naming the key", "[config]") {
  struct Bad {
    const char* text;
    const char* says;
  };
  for (const Bad& b : {Bad{"[tables]\ntier = \"ram\"\n", "key 'tables.tier'"},
                       Bad{"[tables]\ntiers = [\"14=ram\"]\n", "'14=ram' is not LAYER="},
                       Bad{"[tables]\ntiers = [\"x=cache\"]\n", "'x=cache' is not LAYER="},
                       Bad{"[tables]\ntiers = \"cache\"\n", "key 'tables.tiers'"},
                       Bad{"[memory]\nbudget = \"lots\"\n", "key 'memory.budget'"},
                       Bad{"[memory]\nbudget = -1\n", "negative"},
                       Bad{"[memory]\nswap = 1\n", "unknown key 'memory.swap'"}}) {
    DaemonSettings s;
    absl::Status st = Apply(b.text, &s);
    INFO(b.text << " -> " << st.ToString());
    REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(st.message()), Contains(b.says) && Contains(".toml:"));
  }
}

TEST_CASE("a SIGHUP names every changed store key as needing a restart", "[config]") {
  DaemonSettings running;
  REQUIRE(Apply("[tables]\ntiers = [\"14=resident\"]\n[memory]\ncache = \"1G\"\n", &running).ok());
  REQUIRE(CompareSettings(running, running).restart.empty());
  DaemonSettings next = running;
  REQUIRE(Apply("[tables]\ntier = \"cache\"\ntiers = [\"14=storage\"]\n[memory]\ncache = \"2G\"\n"
                "pressure = false\nhuge_pages = false\nload_at_start = false\n"
                "load_rate = \"1M\"\n",
                &next)
              .ok());
  const ReloadReport report = CompareSettings(running, next);
  CHECK(report.changed.empty());
  std::vector<std::string> keys;
  for (const std::string& entry : report.restart) keys.push_back(entry.substr(0, entry.find(' ')));
  CHECK(keys == std::vector<std::string>{"tables.tier", "tables.tiers", "memory.cache",
                                         "memory.pressure", "memory.huge_pages",
                                         "memory.load_at_start", "memory.load_rate"});
  CHECK(report.restart[0] == "tables.tier \"storage\" -> \"cache\"");
}

}  // namespace
}  // namespace engram
