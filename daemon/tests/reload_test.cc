// SIGHUP against the settings table: every row of Settings(), changed alone to a value derived
// from the row, is either applied live or named as needing a restart, never silently ignored;
// first through the reload comparison, then through a real SIGHUP on a running engramd, where
// the live ones are checked to have reached the server; and every live row changed at once, each
// new value read back from the running engramd (`engramctl config`, and what clients see).
#include "daemon/ops/reload.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "testkit/daemon_test_util.h"

namespace engram::testing {
namespace {

using Kind = Setting::Kind;

template <typename T>
T& Value(const Setting& row, DaemonSettings* s) {
  return *static_cast<T*>(row.At(s));
}

// Sets `row` of *s to a valid value other than the one it holds, derived from the row: a number
// one step inside its bounds, a larger byte size (or the row's example), the other truth value,
// one more id, or the row's example (one more element, for a list).
void ChangeSetting(const Setting& row, DaemonSettings* s) {
  INFO(row.key);
  std::string text;
  switch (row.kind) {
    case Kind::kUint32:
    case Kind::kUint64: {
      const uint64_t v =
          row.kind == Kind::kUint32 ? Value<uint32_t>(row, s) : Value<uint64_t>(row, s);
      text = std::to_string(v < row.max ? v + 1 : v - 1);
      break;
    }
    case Kind::kBytes:
    case Kind::kBytesOrZero:
      // A size with checks of its own (the budget must hold engramd) names one that passes them.
      text = row.example[0] != '\0' ? row.example
                                    : std::to_string(Value<uint64_t>(row, s) + (uint64_t{1} << 20));
      break;
    case Kind::kBool:
      text = Value<bool>(row, s) ? "false" : "true";
      break;
    case Kind::kIds:
      text = std::to_string(row.min + 1);
      break;
    case Kind::kString:
    case Kind::kStrings:
      REQUIRE(row.example[0] != '\0');  // a text setting names a valid value to change to
      text = row.example;
      break;
  }
  const DaemonSettings before = *s;
  REQUIRE(row.ApplyText(text, s).ok());
  REQUIRE_FALSE(row.Same(before, *s));
}

// The settings as a configuration file: every key, with its value in `s`.
std::string ConfigText(const DaemonSettings& s) {
  std::string out;
  for (const Setting& row : Settings()) out += std::string(row.key) + " = " + row.Text(s) + "\n";
  return out;
}

// What the SIGHUP report shows for `row` going from `from` to `to`.
std::string Entry(const Setting& row, const DaemonSettings& from, const DaemonSettings& to) {
  return std::string(row.key) + " " + row.Text(from) + " -> " + row.Text(to);
}

TEST_CASE("every setting changed alone is applied live or named as needing a restart") {
  const DaemonSettings base;
  for (const Setting& row : Settings()) {
    INFO(row.key);
    DaemonSettings changed = base;
    ChangeSetting(row, &changed);
    for (const Setting& other : Settings()) {
      INFO("and " << other.key);
      if (&other != &row) CHECK(other.Same(base, changed));
    }
    // The value is one the configuration file accepts.
    const std::string path = TestDir() + "/changed.toml";
    std::ofstream(path) << ConfigText(changed);
    DaemonSettings from_file;
    const absl::Status read = ApplyConfigFile(path, &from_file);
    INFO(read.ToString());
    REQUIRE(read.ok());
    CHECK(row.Same(from_file, changed));

    const ReloadReport report = CompareSettings(base, changed);
    const std::vector<std::string> entry = {Entry(row, base, changed)};
    CHECK(report.changed == (row.live() ? entry : std::vector<std::string>{}));
    CHECK(report.restart == (row.live() ? std::vector<std::string>{} : entry));
    // In force after the SIGHUP: the new value if live, the running one if not.
    const DaemonSettings next = TakeLiveSettings(base, changed);
    CHECK(row.Same(next, row.live() ? changed : base));
  }
}

TEST_CASE("the SIGHUP report names what changed and what needs a restart") {
  const DaemonSettings base;
  DaemonSettings changed = base;
  changed.read_mode = "direct";
  changed.server.limits.max_clients = 8;
  const ReloadReport report = CompareSettings(base, changed);
  CHECK(ChangedLine(report) == "changed: limits.max_clients 64 -> 8");
  CHECK(RestartLine(report) == "needs a restart: tables.read_mode \"buffered\" -> \"direct\"");
  CHECK(ChangedLine(CompareSettings(base, base)) == "nothing that can change live changed");
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// engramd run with nothing but --config (a flag would override the file), its log in a file.
class ConfiguredDaemon {
 public:
  ConfiguredDaemon(const std::string& config, const std::string& log) : log_(log) {
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      dup2(fd, STDERR_FILENO);
      const std::string engramd = EngramdPath();
      execl(engramd.c_str(), engramd.c_str(), "--config", config.c_str(), nullptr);
      _exit(127);
    }
  }
  ~ConfiguredDaemon() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    if (SanitizerReported(status)) ExitForSanitizerReport(ReadText(log_));
  }
  ConfiguredDaemon(const ConfiguredDaemon&) = delete;
  ConfiguredDaemon& operator=(const ConfiguredDaemon&) = delete;

  // Sends SIGHUP and returns the log lines the reload wrote (up to its "configuration re-read"
  // line, or the refusal); empty if it wrote neither within 10 s.
  std::vector<std::string> Reload() {
    const size_t from = ReadText(log_).size();
    kill(pid_, SIGHUP);
    for (int i = 0; i < 1000; ++i) {
      const std::string text = ReadText(log_).substr(from);
      if (text.find("SIGHUP: configuration re-read") != std::string::npos ||
          text.find("SIGHUP: configuration refused") != std::string::npos) {
        return absl::StrSplit(text, '\n', absl::SkipEmpty());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return {};
  }
  const std::string& log() const { return log_; }

 private:
  std::string log_;
  pid_t pid_ = -1;
};

// The entries of the report line that contains `label` ("changed: ", "needs a restart: ").
std::vector<std::string> Entries(const std::vector<std::string>& lines, const std::string& label) {
  for (const std::string& line : lines) {
    const size_t at = line.find(label);
    if (at != std::string::npos) return absl::StrSplit(line.substr(at + label.size()), "; ");
  }
  return {};
}

bool Has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

TEST_CASE("a SIGHUP on a running engramd reports every setting changed alone", "[daemon]") {
  DaemonSettings base;
  base.models = {Checkpoint()};
  base.server.socket_path = TestDir() + "/reload.sock";
  base.server.workers = 2;
  const std::string config = TestDir() + "/engramd.toml";
  std::ofstream(config) << ConfigText(base);
  ConfiguredDaemon daemon(config, TestDir() + "/engramd.log");
  bool up = false;
  for (int i = 0; i < 1000 && !up; ++i) {
    up = SocketAnswers(base.server.socket_path);
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  INFO(ReadText(daemon.log()));
  REQUIRE(up);
  auto status = [&] {
    return RunCommand(Engramctl() + " status --json --socket " + base.server.socket_path);
  };
  for (const Setting& row : Settings()) {
    INFO(row.key << (row.live() ? " (live)" : " (restart)"));
    DaemonSettings changed = base;
    ChangeSetting(row, &changed);
    std::ofstream(config) << ConfigText(changed);
    const std::vector<std::string> lines = daemon.Reload();
    INFO(absl::StrJoin(lines, "\n"));
    REQUIRE_FALSE(lines.empty());
    const std::string entry = Entry(row, base, changed);
    CHECK(Has(Entries(lines, row.live() ? "changed: " : "needs a restart: "), entry));
    CHECK_FALSE(Has(Entries(lines, row.live() ? "needs a restart: " : "changed: "), entry));
    // The server holds every live setting the reload took (the reload checks it).
    for (const std::string& line : lines) CHECK(line.find("did not take") == std::string::npos);
    // Applied, as a client sees it.
    if (row.key == std::string("limits.max_clients")) {
      const auto [code, out] = status();
      REQUIRE(code == 0);
      CHECK(nlohmann::json::parse(out)["max_clients"] == changed.server.limits.max_clients);
    } else if (row.key == std::string("log.level")) {
      const auto [code, out] = status();
      REQUIRE(code == 0);
      CHECK(nlohmann::json::parse(out)["log_level"] == changed.log_level);
    } else if (row.key == std::string("access.allow_users")) {
      CHECK(status().first == 0);  // the daemon's own uid is admitted whatever the list says
    }
  }
  // Back to the starting file: the last live change is undone, nothing else was taken.
  std::ofstream(config) << ConfigText(base);
  const std::vector<std::string> lines = daemon.Reload();
  INFO(absl::StrJoin(lines, "\n"));
  CHECK(Entries(lines, "needs a restart: ").empty());
  CHECK(status().first == 0);
}

// Sets live `row` of *s to a new value that engramd can apply on this machine: ChangeSetting's,
// except that a path is a fresh directory of the test's, and a list of names the server resolves
// (users, groups) names an id, which resolves to itself.
void ChangeLiveSetting(const Setting& row, DaemonSettings* s) {
  INFO(row.key);
  if (row.path) {
    const std::string dir = TestDir() + "/" + row.key;
    std::filesystem::create_directories(dir);
    REQUIRE(row.ApplyText(dir, s).ok());
  } else if (row.kind == Kind::kStrings && row.server_field != nullptr) {
    row.ClearList(s);
    REQUIRE(row.ApplyText("4242", s).ok());
  } else {
    ChangeSetting(row, s);
  }
}

// The value `engramctl config` shows for `row` when the settings in force are `s`: as the server
// holds it, where it reads one of its own (ids for names, which ChangeLiveSetting wrote as ids).
nlohmann::json ExpectedJson(const Setting& row, DaemonSettings* s) {
  switch (row.kind) {
    case Kind::kUint32:
      return Value<uint32_t>(row, s);
    case Kind::kUint64:
    case Kind::kBytes:
    case Kind::kBytesOrZero:
      return Value<uint64_t>(row, s);
    case Kind::kString:
      return Value<std::string>(row, s);
    case Kind::kBool:
      return Value<bool>(row, s);
    case Kind::kIds:
      return Value<std::vector<uint32_t>>(row, s);
    case Kind::kStrings: {
      if (row.server_field == nullptr) return Value<std::vector<std::string>>(row, s);
      nlohmann::json ids = nlohmann::json::array();
      for (const std::string& name : Value<std::vector<std::string>>(row, s)) {
        uint32_t id = 0;
        REQUIRE(absl::SimpleAtoi(name, &id));
        ids.push_back(id);
      }
      return ids;
    }
  }
  return nullptr;
}

// Sessions of the daemon on `socket` opened until one is refused; the refusal's message in
// *ret_refusal. Each asks for a small arena, so that only the client limit can refuse it.
std::vector<engram_session*> OpenUntilRefused(const std::string& socket, size_t at_most,
                                              std::string* ret_refusal) {
  std::vector<engram_session*> open;
  while (open.size() <= at_most) {
    engram_connect_options o;
    engram_connect_options_init(&o, sizeof(o));
    o.socket_path = socket.c_str();
    o.data_bytes = 1 << 20;
    o.slots = 1;
    engram_session* s = nullptr;
    if (engram_session_open(&o, &s) != 0) {
      *ret_refusal = engram_last_error();
      break;
    }
    open.push_back(s);
  }
  return open;
}

// `engramctl COMMAND --json` against the daemon on `socket`, parsed.
nlohmann::json CtlJson(const std::string& socket, const std::string& command) {
  const auto [code, out] = RunCommand(Engramctl() + " " + command + " --json --socket " + socket);
  INFO(command << ": " << out);
  REQUIRE(code == 0);
  return nlohmann::json::parse(out);
}

// What engramd runs with, from the parts that apply each row (`engramctl config`): every live
// row shows its value in `expected`. A live row whose part cannot say what it holds shows its
// default and fails here.
void CheckRunningSettings(const std::string& socket, DaemonSettings* expected) {
  const nlohmann::json running = CtlJson(socket, "config");
  REQUIRE(running["settings"].size() == Settings().size());
  size_t live = 0;
  for (const nlohmann::json& entry : running["settings"]) {
    const Setting* row = FindSetting(entry["key"]);
    REQUIRE(row != nullptr);
    INFO(row->key);
    CHECK(entry["live"] == row->live());
    if (!row->live()) continue;
    ++live;
    CHECK(entry["value"] == ExpectedJson(*row, expected));
  }
  CHECK(live == size_t(std::count_if(Settings().begin(), Settings().end(),
                                     [](const Setting& row) { return row.live(); })));
}

// The changed live settings as clients and operators see them: status, the textfile written
// into its new directory, a session's default arena, and max_clients sessions but no more.
void CheckAsClientsSee(const std::string& socket, const DaemonSettings& changed) {
  const nlohmann::json status = CtlJson(socket, "status");
  CHECK(status["log_level"] == changed.log_level);
  CHECK(status["max_clients"] == changed.server.limits.max_clients);
  const auto has = [](const nlohmann::json& list, uint32_t id) {
    return std::find(list.begin(), list.end(), id) != list.end();
  };
  CHECK(has(status["access"]["allow_uids"], 4242));
  CHECK(has(status["access"]["allow_gids"], 4242));
  CHECK(has(status["access"]["admin_uids"], changed.server.admin_uids.at(0)));
  CHECK(has(status["access"]["admin_gids"], changed.server.admin_gids.at(0)));
  const std::string prom = changed.metrics.textfile_dir + "/engramd.prom";
  for (int i = 0; i < 1000 && !std::filesystem::exists(prom); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(std::filesystem::exists(prom));
  engram_connect_options o;
  engram_connect_options_init(&o, sizeof(o));
  o.socket_path = socket.c_str();
  engram_session* defaults = nullptr;
  INFO(engram_last_error());
  REQUIRE(engram_session_open(&o, &defaults) == 0);
  const nlohmann::json clients = CtlJson(socket, "clients");
  engram_session_close(defaults);
  bool seen = false;
  for (const nlohmann::json& c : clients["clients"]) {
    if (c["pid"] != getpid()) continue;
    seen = true;
    CHECK(c["data_bytes"] == changed.server.limits.default_data_bytes);
    CHECK(c["slots"] == changed.server.limits.default_slots);
  }
  CHECK(seen);
  // Once the server has let the sessions above go.
  for (int i = 0; i < 500 && CtlJson(socket, "status")["clients"] != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string refusal;
  std::vector<engram_session*> open =
      OpenUntilRefused(socket, changed.server.limits.max_clients, &refusal);
  CHECK(open.size() == changed.server.limits.max_clients);
  CHECK(refusal.find("the limit (--max-clients)") != std::string::npos);
  for (engram_session* s : open) engram_session_close(s);
}

TEST_CASE("a SIGHUP that changes every live setting: each read back from the running engramd",
          "[daemon]") {
  DaemonSettings base;
  base.models = {Checkpoint()};
  base.server.socket_path = TestDir() + "/live.sock";
  base.server.workers = 2;
  const std::string& socket = base.server.socket_path;
  const std::string config = TestDir() + "/live.toml";
  std::ofstream(config) << ConfigText(base);
  ConfiguredDaemon daemon(config, TestDir() + "/live.log");
  bool up = false;
  for (int i = 0; i < 1000 && !up; ++i) {
    up = SocketAnswers(socket);
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  INFO(ReadText(daemon.log()));
  REQUIRE(up);
  CheckRunningSettings(socket, &base);
  // Every live row of the table, each to a value of its own.
  DaemonSettings changed = base;
  size_t live = 0;
  for (const Setting& row : Settings()) {
    if (!row.live()) continue;
    ++live;
    ChangeLiveSetting(row, &changed);
    INFO(row.key);
    REQUIRE_FALSE(row.Same(base, changed));
  }
  std::ofstream(config) << ConfigText(changed);
  const std::vector<std::string> lines = daemon.Reload();
  INFO(absl::StrJoin(lines, "\n"));
  REQUIRE_FALSE(lines.empty());
  CHECK(Entries(lines, "needs a restart: ").empty());
  CHECK(Entries(lines, "changed: ").size() == live);
  CheckRunningSettings(socket, &changed);
  CheckAsClientsSee(socket, changed);
  // The human form: a line per setting and the header, within 80 columns.
  const auto [code, text] = RunCommand(Engramctl() + " config --socket " + socket);
  CHECK(code == 0);
  const std::vector<std::string> shown = absl::StrSplit(text, '\n', absl::SkipEmpty());
  CHECK(shown.size() == Settings().size() + 1);
  for (const std::string& line : shown) CHECK(line.size() <= 80);
  CHECK(text.find("limits.max_clients") != std::string::npos);
  // Back to the starting file: every live row back to its old value.
  std::ofstream(config) << ConfigText(base);
  const std::vector<std::string> back = daemon.Reload();
  INFO(absl::StrJoin(back, "\n"));
  CHECK(Entries(back, "changed: ").size() == live);
  CheckRunningSettings(socket, &base);
}

}  // namespace
}  // namespace engram::testing
