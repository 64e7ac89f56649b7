// engramd's settings from their sources: the configuration file (config_file.h), the command-line
// flags over it (one per row of Settings() that has a flag), and their resolution into the server
// configuration (users and groups looked up, text parsed, [memory] budget split); and SIGHUP's
// re-read of the same sources, which makes the live settings of it the ones in force (reload.h).
//
//   CLI::App app{"engramd: ..."};
//   ConfigSources sources{.app = &app, .argc = argc, .argv = argv};
//   sources.config_path = FindConfigPath(argc, argv, &sources.config_given);
//   DaemonSettings settings;
//   LoadConfig(sources.config_path, sources.config_given, &settings, &files);
//   AddSettingFlags(app, &settings);  // then parse: the flags override the file
//   absl::Status s = ResolveSettings(sources.config_path, &settings);
//   control->SetReloader([&] { return ReloadSettings(sources, &settings); });
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/ops/config_file.h"
#include "daemon/ops/reload.h"
#include "store/memory_budget.h"

namespace CLI {
class App;
}  // namespace CLI

namespace engram {

// Where the settings came from: the command line and the configuration file it names, kept for
// SIGHUP, which reads the file again and applies the same flags over it.
struct ConfigSources {
  CLI::App* app = nullptr;  // with AddSettingFlags' flags, parsed once already
  int argc = 0;
  char** argv = nullptr;
  std::string config_path = kDefaultConfigPath;
  bool config_given = false;  // --config named it: the file must exist
};

// --config PATH from the command line, found before the flags are parsed: the file is read
// first, so that the flags, parsed into the same settings, override it.
std::string FindConfigPath(int argc, char** argv, bool* ret_given);

// One flag per setting of Settings() that has one, writing into *settings; --help shows each
// with the value it has before the flags (the default, or the configuration file's), and says
// which a SIGHUP applies live. A value a setting refuses is a CLI::ValidationError.
void AddSettingFlags(CLI::App& app, DaemonSettings* settings);

// How [memory] budget is split under these settings, checked against the machine's memory.
absl::StatusOr<MemoryPlan> MemoryPlanFor(const DaemonSettings& settings);

// Turns the settings into the server configuration (settings->server: sources, socket mode,
// allowed uids and gids, memory plan, polling) and the row store's tiers. `config_path` is named
// when nothing is given to serve.
absl::Status ResolveSettings(const std::string& config_path, DaemonSettings* settings);

// The files the settings name that engramd opens besides the tables, looked at as engramd will
// open them (never blocking, never following a link where it writes, reading a few bytes):
// memory.pressure_file (when memory.pressure is on) must be a regular file, and
// memory.hot_set_path and its temporary neighbour PATH.tmp must each be absent or a hot set,
// since engramd replaces them. FailedPrecondition naming the setting, the path and what it is
// otherwise. --check-config and a start both run it before serving, so they refuse alike; what a
// start only warns of (a PSI file that holds no PSI, a damaged hot set) is not refused here.
absl::Status CheckPathSettings(const DaemonSettings& settings);

// SIGHUP: reads the files, applies the same flags over them and, if the result is valid, makes
// the live settings of it the ones in force (*settings, resolved). The other settings keep their
// running values, so that one changed stays named as needing a restart however many reloads
// come between. On an error *settings is untouched.
absl::StatusOr<ReloadedConfig> ReloadSettings(const ConfigSources& sources,
                                              DaemonSettings* settings);

}  // namespace engram
