// engramd's configuration file: defaults from an empty file, every section applied, drop-ins in
// name order, and refusals that name the file, the line and the key.
#include "daemon/ops/config_file.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace engram {
namespace {

std::string Dir() {
  static std::string dir = [] {
    char tmpl[] = "/tmp/engramd-config-test-XXXXXX";
    std::string d = mkdtemp(tmpl);
    static std::string cleanup = d;
    atexit([] { std::filesystem::remove_all(cleanup); });
    return d;
  }();
  return dir;
}

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = Dir() + "/" + name;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
  return path;
}

absl::Status Apply(const std::string& text, DaemonSettings* s) {
  static int n = 0;
  return ApplyConfigFile(Write("t" + std::to_string(n++) + ".toml", text), s);
}

TEST_CASE("an empty file keeps every default") {
  DaemonSettings s;
  REQUIRE(Apply("", &s).ok());
  const DaemonSettings d;
  CHECK(s.server.socket_path == "/run/engramd/engramd.sock");
  CHECK(s.server.limits.max_clients == d.server.limits.max_clients);
  CHECK(s.server.limits.max_arena_bytes == uint64_t{1} << 30);
  CHECK(s.log_level == "info");
  CHECK(s.metrics.http_port == 0);
  CHECK(s.models.empty());
  CHECK(s.server.admin_uids.empty());  // root and the daemon's own uid only
  CHECK(s.server.admin_gids.empty());
}

TEST_CASE("every section is applied") {
  DaemonSettings s;
  absl::Status st = Apply(R"(
[tables]
models = ["/m/a", "/m/b"]
files = ["/t/x.engram"]
rows = "100:200"
layers = [1, 14]
check_holes = false
read_mode = "direct"
[socket]
path = "/tmp/x.sock"
mode = "0600"
group = "engram"
[access]
allow_users = ["root", "1000"]
allow_groups = ["engram"]
admin_uids = [0, 1000, 4294967294]
admin_gids = [27]
[limits]
max_clients = 3
max_inflight = 16
max_rows_per_request = 4096
max_arena_bytes = "2G"
max_total_arena_bytes = 1048576
default_data_bytes = "8M"
default_slots = 8
[engine]
workers = 4
request_threads = 3
poll_spin_min_us = 5
poll_spin_max_us = 50
inline_rows = 16
[log]
level = "debug"
[metrics]
http_port = 9436
http_address = "::1"
textfile_dir = "/var/lib/node"
textfile_interval_seconds = 30
)",
                          &s);
  REQUIRE(st.ok());
  CHECK(s.models == std::vector<std::string>{"/m/a", "/m/b"});
  CHECK(s.tables == std::vector<std::string>{"/t/x.engram"});
  CHECK(s.rows == "100:200");
  CHECK(s.server.layers == std::vector<uint32_t>{1, 14});
  CHECK_FALSE(s.server.check_holes);
  CHECK(s.read_mode == "direct");
  CHECK(s.server.socket_path == "/tmp/x.sock");
  CHECK(s.socket_mode == "0600");
  CHECK(s.server.socket_group == "engram");
  CHECK(s.allow_users == std::vector<std::string>{"root", "1000"});
  CHECK(s.allow_groups == std::vector<std::string>{"engram"});
  CHECK(s.server.admin_uids == std::vector<uid_t>{0, 1000, 4294967294u});
  CHECK(s.server.admin_gids == std::vector<gid_t>{27});
  CHECK(s.server.limits.max_clients == 3);
  CHECK(s.server.limits.max_inflight == 16);
  CHECK(s.server.limits.max_rows_per_request == 4096);
  CHECK(s.server.limits.max_arena_bytes == uint64_t{2} << 30);
  CHECK(s.server.limits.max_total_arena_bytes == 1048576);
  CHECK(s.server.limits.default_data_bytes == uint64_t{8} << 20);
  CHECK(s.server.limits.default_slots == 8);
  CHECK(s.server.workers == 4);
  CHECK(s.server.request_threads == 3);
  CHECK(s.spin_min_us == 5);
  CHECK(s.spin_max_us == 50);
  CHECK(s.server.poll.inline_rows == 16);
  CHECK(s.log_level == "debug");
  CHECK(s.metrics.http_port == 9436);
  CHECK(s.metrics.http_address == "::1");
  CHECK(s.metrics.textfile_dir == "/var/lib/node");
  CHECK(s.metrics.textfile_interval_s == 30);
}

// The refusal of `text`, which must name the file, `line` and `key`.
void CheckRefused(const std::string& text, int line, const std::string& key,
                  const std::string& why) {
  DaemonSettings s;
  const std::string path = Write("bad.toml", text);
  absl::Status st = ApplyConfigFile(path, &s);
  INFO(text << " → " << st.ToString());
  REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
  const std::string m(st.message());
  CHECK(m.find(path + ":" + std::to_string(line) + ":") == 0);
  if (!key.empty()) CHECK(m.find("'" + key + "'") != std::string::npos);
  CHECK(m.find(why) != std::string::npos);
}

TEST_CASE("unknown keys and bad values are refused with file, line and key") {
  CheckRefused("[limits]\nmax_clientz = 3\n", 2, "limits.max_clientz", "unknown key");
  CheckRefused("frobnicate = true\n", 1, "frobnicate", "unknown key");
  CheckRefused("[nosuch]\nx = 1\n", 2, "nosuch.x", "unknown key");
  CheckRefused("[limits]\nmax_clients = \"many\"\n", 2, "limits.max_clients", "integer");
  CheckRefused("[limits]\nmax_clients = 0\n", 2, "limits.max_clients", "outside");
  CheckRefused("[limits]\nmax_clients = -4\n", 2, "limits.max_clients", "outside");
  CheckRefused("[limits]\n\nmax_arena_bytes = \"12Q\"\n", 3, "limits.max_arena_bytes", "byte size");
  CheckRefused("[log]\nlevel = \"loud\"\n", 2, "log.level", "not one of");
  CheckRefused("[tables]\nread_mode = \"mmap\"\n", 2, "tables.read_mode", "not one of");
  CheckRefused("[tables]\nrows = \"9:3\"\n", 2, "tables.rows", "empty");
  CheckRefused("[tables]\nmodels = \"/m\"\n", 2, "tables.models", "array of strings");
  CheckRefused("[tables]\nlayers = [1, \"x\"]\n", 2, "tables.layers", "layer ids");
  CheckRefused("[socket]\nmode = \"0999\"\n", 2, "socket.mode", "octal");
  CheckRefused("[socket]\npath = \"relative.sock\"\n", 2, "socket.path", "absolute");
  CheckRefused("[metrics]\nhttp_address = \"0.0.0.0\"\n", 2, "metrics.http_address", "loopback");
  CheckRefused("[metrics]\nhttp_port = 70000\n", 2, "metrics.http_port", "outside");
  CheckRefused("[tables]\ncheck_holes = 1\n", 2, "tables.check_holes", "true or false");
  CheckRefused("[access]\nadmin_uids = [-1]\n", 2, "access.admin_uids", "-1, is not a uid");
  CheckRefused("[access]\n\nadmin_uids = [1000, \"alice\"]\n", 3, "access.admin_uids",
               "element 1, 'alice', is not a uid");
  CheckRefused("[access]\nadmin_uids = [1.5]\n", 2, "access.admin_uids", "is not a uid");
  CheckRefused("[access]\nadmin_uids = [4294967295]\n", 2, "access.admin_uids",
               "4294967295, is not a uid");
  CheckRefused("[access]\nadmin_uids = 1000\n", 2, "access.admin_uids", "array of uids");
  CheckRefused("[access]\nadmin_gids = [true]\n", 2, "access.admin_gids", "is not a gid");
  CheckRefused("[access]\nadmin_users = [0]\n", 2, "access.admin_users", "unknown key");
  // Syntax errors name the file and line too.
  CheckRefused("[limits\nmax_clients = 3\n", 1, "", "");
}

TEST_CASE("drop-ins apply after the main file in name order") {
  const std::string main =
      Write("main/engramd.toml", "[limits]\nmax_clients = 5\n[log]\nlevel = \"warning\"\n");
  Write("main/engramd.toml.d/20-late.toml", "[limits]\nmax_clients = 20\n");
  Write("main/engramd.toml.d/10-early.toml", "[limits]\nmax_clients = 10\nmax_inflight = 7\n");
  Write("main/engramd.toml.d/ignored.conf", "this is not toml\n");
  DaemonSettings s;
  std::vector<std::string> files;
  REQUIRE(LoadConfig(main, true, &s, &files).ok());
  CHECK(s.server.limits.max_clients == 20);
  CHECK(s.server.limits.max_inflight == 7);
  CHECK(s.log_level == "warning");
  REQUIRE(files.size() == 3);
  CHECK(files[1].find("10-early.toml") != std::string::npos);
  CHECK(files[2].find("20-late.toml") != std::string::npos);

  // A bad drop-in is named.
  Write("main/engramd.toml.d/30-bad.toml", "[limits]\nmax_inflight = 0\n");
  DaemonSettings t;
  files.clear();
  absl::Status st = LoadConfig(main, true, &t, &files);
  CHECK(std::string(st.message()).find("30-bad.toml:2: key 'limits.max_inflight'") !=
        std::string::npos);
}

TEST_CASE("a missing file is fine only when it is the default") {
  DaemonSettings s;
  std::vector<std::string> files;
  CHECK(LoadConfig(Dir() + "/absent.toml", false, &s, &files).ok());
  CHECK(files.empty());
  absl::Status st = LoadConfig(Dir() + "/absent.toml", true, &s, &files);
  CHECK(st.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(st.message()).find("absent.toml") != std::string::npos);
}

TEST_CASE("byte sizes") {
  CHECK(*ParseByteSize("4096") == 4096);
  CHECK(*ParseByteSize("64K") == 65536);
  CHECK(*ParseByteSize("1g") == uint64_t{1} << 30);
  CHECK(*ParseByteSize("2T") == uint64_t{2} << 40);
  CHECK_FALSE(ParseByteSize("").ok());
  CHECK_FALSE(ParseByteSize("G").ok());
  CHECK_FALSE(ParseByteSize("1.5G").ok());
  CHECK_FALSE(ParseByteSize("99999999999T").ok());
}

}  // namespace
}  // namespace engram

namespace engram {
namespace {

TEST_CASE("the example /etc/engramd/engramd.toml parses") {
  const char* path = getenv("ENGRAMD_EXAMPLE_TOML");
  INFO("ENGRAMD_EXAMPLE_TOML names systemd/engramd.toml (set by meson test)");
  REQUIRE(path != nullptr);
  DaemonSettings s;
  absl::Status st = ApplyConfigFile(path, &s);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(s.allow_groups == std::vector<std::string>{"engram"});
  CHECK(s.server.socket_group == "engram");
  CHECK(s.server.admin_uids.empty());
  CHECK(s.server.admin_gids.empty());
  const DaemonSettings d;
  CHECK(s.server.limits.max_clients == d.server.limits.max_clients);
  CHECK(s.server.limits.max_total_arena_bytes == d.server.limits.max_total_arena_bytes);
  CHECK(s.log_level == d.log_level);
}

}  // namespace
}  // namespace engram

TEST_CASE(
    "docs/operations.md lists every setting with its default, flag and SIGHUP column, and no "
    "other") {
  const char* path = getenv("ENGRAMD_OPERATIONS_MD");
  INFO("ENGRAMD_OPERATIONS_MD names docs/operations.md (set by meson test)");
  REQUIRE(path != nullptr);
  std::ifstream in(path);
  REQUIRE(in.good());
  // The rows "| `key` | `default` (notes) | `--flag` or — | live or restart |" of the
  // configuration file's settings table: the table under the header below, up to its end (the
  // section's other tables, such as what a start checks, are not settings).
  std::vector<std::string> documented;
  bool in_table = false;
  for (std::string line; std::getline(in, line);) {
    if (line == "| Key | Default | Flag | Live on SIGHUP |") {
      REQUIRE(documented.empty());  // one settings table
      in_table = true;
      continue;
    }
    if (line.rfind("|", 0) != 0) in_table = false;
    if (!in_table || line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    for (size_t at = 1, bar; (bar = line.find(" | ", at)) != std::string::npos; at = bar + 3) {
      cells.push_back(line.substr(at == 1 ? 2 : at, bar - (at == 1 ? 2 : at)));
    }
    REQUIRE(cells.size() >= 3);
    // The last cell, "live" or "restart" (with a note), ends the line with " |".
    REQUIRE(line.size() > 3);
    REQUIRE(line.compare(line.size() - 2, 2, " |") == 0);
    const size_t last = line.rfind(" | ", line.size() - 3) + 3;
    const std::string reload = line.substr(last, line.size() - 2 - last);
    const std::string key = cells[0].substr(1, cells[0].size() - 2);
    documented.push_back(key);
    const auto& all = engram::Settings();
    auto it = std::find_if(all.begin(), all.end(),
                           [&](const engram::Setting& s) { return key == s.key; });
    if (it == all.end()) continue;  // the key comparison below reports it
    INFO(line);
    CHECK(cells[1].rfind("`" + it->DefaultText() + "`", 0) == 0);
    if (it->flag[0] == '\0') {
      CHECK(cells[2] == "—");
    } else {
      CHECK(cells[2].rfind(std::string("`") + it->flag, 0) == 0);
    }
    // The SIGHUP column says what the table says.
    const std::string word = reload.substr(0, reload.find(' '));
    CHECK(word == (it->live() ? "live" : "restart"));
  }
  std::sort(documented.begin(), documented.end());
  CHECK(documented == engram::ConfigKeys());
}
