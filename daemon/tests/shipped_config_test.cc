// The configuration file the packages install (systemd/engramd.toml) names every key of the
// settings table, no other, and shows each key's default unless its line says "default ...".
#include <toml++/toml.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "daemon/ops/config_file.h"

namespace engram {
namespace {

std::string ShippedPath() {
  const char* path = getenv("ENGRAMD_EXAMPLE_TOML");
  INFO("ENGRAMD_EXAMPLE_TOML names systemd/engramd.toml (set by meson test)");
  REQUIRE(path != nullptr);
  return path;
}

// "section.key" -> the line it is on.
std::map<std::string, uint32_t> KeysAndLines(const std::string& path) {
  const toml::table doc = toml::parse_file(path);
  std::map<std::string, uint32_t> keys;
  for (const auto& [section, node] : doc) {
    const toml::table* table = node.as_table();
    INFO("top-level key '" << section.str() << "' is not a [section]");
    REQUIRE(table != nullptr);
    for (const auto& [key, value] : *table) {
      keys[std::string(section.str()) + "." + std::string(key.str())] = value.source().begin.line;
    }
  }
  return keys;
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST_CASE("the shipped engramd.toml names every setting and no other") {
  const std::map<std::string, uint32_t> keys = KeysAndLines(ShippedPath());
  std::vector<std::string> shipped;
  for (const auto& [key, line] : keys) shipped.push_back(key);
  const std::vector<std::string> all = ConfigKeys();
  std::vector<std::string> missing, unknown;
  const std::set<std::string> shipped_set(shipped.begin(), shipped.end());
  const std::set<std::string> all_set(all.begin(), all.end());
  for (const std::string& k : all) {
    if (!shipped_set.count(k)) missing.push_back(k);
  }
  for (const std::string& k : shipped) {
    if (!all_set.count(k)) unknown.push_back(k);
  }
  INFO("keys of Settings() missing from systemd/engramd.toml: "
       << Catch::Detail::stringify(missing));
  INFO("keys in systemd/engramd.toml that Settings() does not have: "
       << Catch::Detail::stringify(unknown));
  CHECK(missing.empty());
  CHECK(unknown.empty());
}

TEST_CASE("the shipped engramd.toml shows the defaults, or says which it changes") {
  const std::string path = ShippedPath();
  DaemonSettings applied;
  const absl::Status st = ApplyConfigFile(path, &applied);
  INFO(st.ToString());
  REQUIRE(st.ok());
  const std::map<std::string, uint32_t> keys = KeysAndLines(path);
  const std::vector<std::string> lines = Lines(path);
  int changed = 0;
  for (const Setting& setting : Settings()) {
    const auto it = keys.find(setting.key);
    if (it == keys.end()) continue;  // the test above names it
    if (setting.Text(applied) == setting.DefaultText()) continue;
    ++changed;
    REQUIRE(it->second >= 1);
    REQUIRE(it->second <= lines.size());
    const std::string& line = lines[it->second - 1];
    INFO(path << ":" << it->second << ": '" << setting.key << "' is " << setting.Text(applied)
              << ", not the default " << setting.DefaultText()
              << ", so its comment must say '# default " << setting.DefaultText() << "'");
    CHECK(line.find("# default " + setting.DefaultText()) != std::string::npos);
  }
  // The packaged file lets the engram group in (socket.group, access.allow_groups) and keeps the
  // row cache's hot set in the unit's state directory (memory.hot_set_path).
  CHECK(changed == 3);
}

}  // namespace
}  // namespace engram
