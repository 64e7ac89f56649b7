// engramd's settings from their sources (daemon/ops/config_resolve.h): the flags override the
// configuration file at start and again at every SIGHUP re-read, a live setting the file changes
// is taken, and a re-read that fails leaves the settings in force untouched.
#include "daemon/ops/config_resolve.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace engram {
namespace {

std::string WriteConfig(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

TEST_CASE("--config is found before the flags are parsed", "[ops]") {
  char prog[] = "engramd", flag[] = "--config", path[] = "/etc/x.toml", eq[] = "--config=/y.toml";
  bool given = true;
  char* none[] = {prog};
  CHECK(FindConfigPath(1, none, &given) == kDefaultConfigPath);
  CHECK_FALSE(given);
  char* split[] = {prog, flag, path};
  CHECK(FindConfigPath(3, split, &given) == "/etc/x.toml");
  CHECK(given);
  char* joined[] = {prog, eq};
  CHECK(FindConfigPath(2, joined, &given) == "/y.toml");
  CHECK(given);
}

TEST_CASE("the flags override the file at start and at every re-read", "[ops]") {
  const std::string dir = std::filesystem::temp_directory_path().string() + "/config_resolve_" +
                          std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string path = WriteConfig(dir + "/engramd.toml",
                                       "[tables]\nmodels = [\"/srv/model\"]\n"
                                       "[limits]\nmax_clients = 10\nmax_arena_bytes = \"64M\"\n");
  char prog[] = "engramd", flag[] = "--max-clients", value[] = "20";
  char* argv[] = {prog, flag, value};
  CLI::App app;
  ConfigSources sources{
      .app = &app, .argc = 3, .argv = argv, .config_path = path, .config_given = true};
  DaemonSettings settings;
  std::vector<std::string> files;
  REQUIRE(LoadConfig(path, true, &settings, &files).ok());
  AddSettingFlags(app, &settings);
  app.parse(sources.argc, sources.argv);
  REQUIRE(ResolveSettings(path, &settings).ok());
  CHECK(settings.server.limits.max_clients == 20);
  CHECK(settings.server.limits.max_arena_bytes == uint64_t{64} << 20);
  REQUIRE(settings.server.sources.size() == 1);
  CHECK(settings.server.sources[0].path == "/srv/model");

  // The file changes both: the flag still wins, the other live setting is taken.
  WriteConfig(path,
              "[tables]\nmodels = [\"/srv/model\"]\n"
              "[limits]\nmax_clients = 30\nmax_arena_bytes = \"32M\"\n");
  absl::StatusOr<ReloadedConfig> reloaded = ReloadSettings(sources, &settings);
  REQUIRE(reloaded.ok());
  CHECK(settings.server.limits.max_clients == 20);
  CHECK(settings.server.limits.max_arena_bytes == uint64_t{32} << 20);
  CHECK(reloaded->settings.server.limits.max_arena_bytes == uint64_t{32} << 20);
  REQUIRE(reloaded->report.changed.size() == 1);
  CHECK(reloaded->report.changed[0].rfind("limits.max_arena_bytes ", 0) == 0);
  CHECK(reloaded->report.restart.empty());

  // A file that no longer parses: refused, naming it, and nothing in force changes.
  WriteConfig(path, "[limits]\nmax_clients = \"many\"\n");
  reloaded = ReloadSettings(sources, &settings);
  CHECK(absl::IsInvalidArgument(reloaded.status()));
  CHECK(std::string(reloaded.status().message()).find(path) != std::string::npos);
  CHECK(settings.server.limits.max_clients == 20);
  CHECK(settings.server.limits.max_arena_bytes == uint64_t{32} << 20);
  std::filesystem::remove_all(dir);
}

TEST_CASE("nothing to serve is refused naming the configuration file", "[ops]") {
  DaemonSettings settings;
  const absl::Status s = ResolveSettings("/etc/engramd/engramd.toml", &settings);
  CHECK(absl::IsInvalidArgument(s));
  CHECK(std::string(s.message()).find("nothing to serve") != std::string::npos);
  CHECK(std::string(s.message()).find("/etc/engramd/engramd.toml") != std::string::npos);
}

}  // namespace
}  // namespace engram
