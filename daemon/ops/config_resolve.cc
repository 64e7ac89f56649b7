// engramd's settings from the configuration file and its flags, resolved (config_resolve.h).
#include "daemon/ops/config_resolve.h"

#include <grp.h>
#include <pwd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "cli/command_line.h"
#include "daemon/ops/cgroup_memory.h"
#include "daemon/server/hot_set.h"
#include "store/pressure_monitor.h"
#include "tables/table.h"

namespace engram {
namespace {

absl::StatusOr<uid_t> ResolveUser(const std::string& text) {
  uint32_t id;
  if (absl::SimpleAtoi(text, &id)) return static_cast<uid_t>(id);
  passwd* p = getpwnam(text.c_str());
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrFormat("no user '%s'", text));
  return p->pw_uid;
}

absl::StatusOr<gid_t> ResolveGroup(const std::string& text) {
  uint32_t id;
  if (absl::SimpleAtoi(text, &id)) return static_cast<gid_t>(id);
  group* g = getgrnam(text.c_str());
  if (g == nullptr) return absl::InvalidArgumentError(absl::StrFormat("no group '%s'", text));
  return g->gr_gid;
}

}  // namespace

std::string FindConfigPath(int argc, char** argv, bool* ret_given) {
  std::string path = kDefaultConfigPath;
  *ret_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      path = argv[i + 1];
      *ret_given = true;
    } else if (a.rfind("--config=", 0) == 0) {
      path = a.substr(9);
      *ret_given = true;
    }
  }
  return path;
}

void AddSettingFlags(CLI::App& app, DaemonSettings* settings) {
  using Kind = Setting::Kind;
  for (const Setting& setting : Settings()) {
    if (setting.flag[0] == '\0') continue;
    const Setting* st = &setting;
    auto apply = [st, settings](const std::string& given) {
      std::string text = given;
      if (st->path && !text.empty() && text[0] != '/') {
        text = std::filesystem::current_path().string() + "/" + text;
      }
      if (absl::Status s = st->ApplyText(text, settings); !s.ok()) {
        throw CLI::ValidationError(st->flag, std::string(s.message()));
      }
    };
    const char* metavar = setting.kind == Kind::kBytes || setting.kind == Kind::kBytesOrZero
                              ? "SIZE"
                          : setting.kind == Kind::kUint32 || setting.kind == Kind::kUint64 ? "N"
                          : setting.kind == Kind::kIds                                     ? "ID"
                                                                                           : "TEXT";
    // A setting a SIGHUP applies says so (reload.h); the others need a restart.
    const std::string help = std::string(setting.help) + (setting.live() ? " [SIGHUP: live]" : "");
    std::string shown = setting.Text(*settings);
    if (shown.size() >= 2 && shown.front() == '"') shown = shown.substr(1, shown.size() - 2);
    if (setting.kind == Kind::kBool) {
      app.add_flag_callback(
          setting.flag, [apply] { apply(""); }, help);
    } else if (setting.kind == Kind::kStrings || setting.kind == Kind::kIds) {
      CLI::Option* o = app.add_option_function<std::vector<std::string>>(
          setting.flag,
          [st, settings, apply](const std::vector<std::string>& values) {
            st->ClearList(settings);  // the flag's list replaces the file's
            for (const std::string& v : values) apply(v);
          },
          help);
      o->type_name(metavar);
      if (setting.kind == Kind::kIds) o->check(cli::Integer(setting.min, setting.max));
      if (setting.flag_separator[0] != '\0') o->delimiter(setting.flag_separator[0]);
      if (shown != "[]") o->default_str(shown);
    } else {
      CLI::Option* o = app.add_option_function<std::string>(setting.flag, apply, help);
      o->type_name(metavar);
      // Checked on the text, so that a negative or misspelt number is named with its bounds.
      if (setting.kind == Kind::kUint32 || setting.kind == Kind::kUint64) {
        o->check(cli::Integer(setting.min, setting.max));
      }
      if (!shown.empty()) o->default_str(shown);
    }
  }
}

absl::StatusOr<MemoryPlan> MemoryPlanFor(const DaemonSettings& settings) {
  return PlanMemory(
      MemoryNeedsOf(settings.server, settings.store.budget_bytes, ReadMemTotal().value_or(0)));
}

absl::Status ResolveSettings(const std::string& config_path, DaemonSettings* settings) {
  ServerConfig& config = settings->server;
  config.storage_read_direct = settings->read_mode == "direct";
  if (settings->models.empty() && settings->tables.empty()) {
    return absl::InvalidArgumentError(
        "nothing to serve: give --model DIR or --table PATH, or tables.models / tables.files in " +
        config_path);
  }
  std::optional<RowRange> rows;
  if (!settings->rows.empty()) {
    absl::StatusOr<RowRange> r = ParseRowRange(settings->rows);
    if (!r.ok()) return r.status();
    rows = *r;
  }
  config.sources.clear();
  for (const auto& m : settings->models) config.sources.push_back({.path = m, .rows = rows});
  for (const auto& t : settings->tables) config.sources.push_back({.path = t, .rows = rows});
  // Checked when it was set: an octal mode of at most 07777.
  config.socket_mode = static_cast<uint32_t>(strtoul(settings->socket_mode.c_str(), nullptr, 8));
  config.allow_uids.clear();
  config.allow_gids.clear();
  for (const auto& u : settings->allow_users) {
    absl::StatusOr<uid_t> uid = ResolveUser(u);
    if (!uid.ok()) return uid.status();
    config.allow_uids.push_back(*uid);
  }
  for (const auto& g : settings->allow_groups) {
    absl::StatusOr<gid_t> gid = ResolveGroup(g);
    if (!gid.ok()) return gid.status();
    config.allow_gids.push_back(*gid);
  }
  config.memory_budget = settings->store.budget_bytes;  // the cgroup's side of [memory] budget
  absl::StatusOr<MemoryPlan> plan = MemoryPlanFor(*settings);
  if (!plan.ok()) return plan.status();
  config.memory_plan = *plan;
  settings->store.others_bytes = plan->budget - plan->store;
  config.poll.spin_min_ns = settings->spin_min_us * 1000;
  config.poll.spin_max_ns = std::max(settings->spin_max_us, settings->spin_min_us) * 1000;
  absl::StatusOr<PollMode> poll_mode = ParsePollMode(settings->poll_mode);
  if (!poll_mode.ok()) return poll_mode.status();
  config.poll.hold_cores =
      PollCores(*poll_mode, settings->poll_cores, std::thread::hardware_concurrency());
  config.poll.hold_idle_ns = uint64_t{settings->poll_idle_ms} * 1'000'000;
  return ApplyTiers(settings);
}

absl::Status CheckPathSettings(const DaemonSettings& settings) {
  const StoreConfig& store = settings.store;
  if (store.pressure && !store.pressure_file.empty()) {
    // Only the wrong kind of file is refused; one that holds no PSI leaves the cache at its size,
    // with a notice, as it always has.
    if (absl::Status s = CheckPressureFile(store.pressure_file); absl::IsFailedPrecondition(s)) {
      return s;
    }
  }
  if (!settings.server.hot_set_path.empty()) {
    // A file that cannot be looked at (permissions) is named in a warning at each write instead.
    if (absl::Status s = CheckHotSetPath(settings.server.hot_set_path);
        absl::IsFailedPrecondition(s)) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ReloadedConfig> ReloadSettings(const ConfigSources& sources,
                                              DaemonSettings* settings) {
  DaemonSettings loaded;
  std::vector<std::string> files;
  if (absl::Status s = LoadConfig(sources.config_path, sources.config_given, &loaded, &files);
      !s.ok()) {
    return s;
  }
  const DaemonSettings running = *settings;
  *settings = loaded;  // the flags write into *settings
  sources.app->clear();
  absl::Status status;
  try {
    sources.app->parse(sources.argc, sources.argv);
    status = ResolveSettings(sources.config_path, settings);
  } catch (const CLI::ParseError& e) {
    status = absl::InvalidArgumentError(e.what());
  }
  const DaemonSettings fresh = *settings;
  *settings = running;
  if (!status.ok()) return status;
  DaemonSettings next = TakeLiveSettings(running, fresh);
  if (absl::Status s = ResolveSettings(sources.config_path, &next); !s.ok()) return s;
  *settings = next;
  return ReloadedConfig{.settings = std::move(next), .report = CompareSettings(running, fresh)};
}

}  // namespace engram
