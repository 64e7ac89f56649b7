// engramctl and the operator interfaces against a real engramd: every command in human and
// --json form, exit codes when no daemon answers, warm/evict against page-cache residency, rows
// as served, the metrics scraped over HTTP and parsed back, sd_notify messages observed through
// a test NOTIFY_SOCKET, SIGHUP reloads, and --check-config and a start refusing alike.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

#include "absl/strings/str_format.h"
#include "engram/protocol.h"
#include "testkit/daemon_test_util.h"

namespace engram::testing {
namespace {

using nlohmann::json;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

// Runs a shell command line, capturing stdout and stderr.
Result Sh(const std::string& command) {
  const std::string err_path = TestDir() + "/stderr.txt";
  FILE* p = popen((command + " 2>" + err_path).c_str(), "r");
  Result r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream f(err_path);
  std::stringstream ss;
  ss << f.rdbuf();
  r.err = ss.str();
  return r;
}

// The NOTIFY_SOCKET the daemon reports to.
struct NotifySocket {
  int fd = -1;
  std::string path;
  NotifySocket() {
    path = TestDir() + "/notify.sock";
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) abort();
  }
  // Messages received within `ms`, until one contains `until`.
  std::vector<std::string> Read(int ms, const std::string& until) {
    std::vector<std::string> got;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{.fd = fd, .events = POLLIN};
      if (poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) continue;
      got.emplace_back(buf, static_cast<size_t>(n));
      if (got.back().find(until) != std::string::npos) break;
    }
    return got;
  }
};

uint16_t FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::string ConfigPath() { return TestDir() + "/engramd.toml"; }

void WriteConfig(uint32_t max_clients, const std::string& level) {
  std::ofstream(ConfigPath()) << "[limits]\nmax_clients = " << max_clients << "\n[log]\nlevel = \""
                              << level << "\"\n";
}

// Everything the tests share: the notify socket bound before the daemon starts, so the first
// messages are seen; the daemon with a configuration file and the metrics port.
struct Fixture {
  NotifySocket notify;
  uint16_t port = FreePort();
  std::unique_ptr<Daemon> daemon;
  std::vector<std::string> startup;
  Fixture() {
    WriteConfig(32, "warning");
    setenv("NOTIFY_SOCKET", notify.path.c_str(), 1);
    setenv("WATCHDOG_USEC", "1000000", 1);
    daemon = std::make_unique<Daemon>(
        std::vector<std::string>{"--config", ConfigPath(), "--metrics-port", std::to_string(port)});
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    startup = notify.Read(5000, "READY=1");
  }
};
Fixture& F() {
  // A function-local static, so that it is destroyed at exit and engramd is stopped: a daemon
  // left running keeps the test runner's output pipes open and the runner waits on them.
  static Fixture f;
  return f;
}

std::string Ctl(const std::string& args) {
  return Engramctl() + " " + args + " --socket " + F().daemon->socket();
}

json Json(const std::string& args) {
  Result r = Sh(Ctl(args + " --json"));
  INFO(args << ": " << r.err);
  REQUIRE(r.code == 0);
  json j = json::parse(r.out);
  REQUIRE(j["schema_version"] == 1);
  return j;
}

TEST_CASE("systemd hears EXTEND_TIMEOUT_USEC, READY, STATUS and watchdog pings") {
  Fixture& f = F();
  REQUIRE(f.daemon->alive());
  bool extend = false, ready = false;
  for (const std::string& m : f.startup) {
    extend |= m.find("EXTEND_TIMEOUT_USEC=") != std::string::npos;
    if (m.find("READY=1") != std::string::npos) {
      ready = true;
      CHECK(m.find("STATUS=Serving 2 table(s) to 0 client(s)") != std::string::npos);
    }
  }
  CHECK(extend);
  CHECK(ready);
  // WATCHDOG_USEC=1 s: pings at least every half second.
  std::vector<std::string> later = f.notify.Read(2000, "WATCHDOG=1");
  REQUIRE_FALSE(later.empty());
  CHECK(later.back() == "WATCHDOG=1");
  // STATUS= follows the clients connected.
  engram_connect_options o = f.daemon->Options();
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  std::vector<std::string> status = f.notify.Read(4000, "to 1 client(s)");
  REQUIRE_FALSE(status.empty());
  CHECK(status.back().find("STATUS=Serving 2 table(s) to 1 client(s)") != std::string::npos);
  engram_session_close(s);
}

TEST_CASE("engramctl status, human and JSON") {
  Result r = Sh(Ctl("status"));
  CHECK(r.code == 0);
  CHECK(r.out.find("engramd serving on " + F().daemon->socket()) != std::string::npos);
  CHECK(r.out.find("tables 2") != std::string::npos);
  json j = Json("status");
  CHECK(j["state"] == "serving");
  CHECK(j["tables"] == 2);
  CHECK(j["pid"] == F().daemon->pid());
  CHECK(j["max_clients"] == 32);
  CHECK(j["watchdog_usec"] == 1000000);
}

TEST_CASE("engramctl global options go before or after the subcommand") {
  const std::string sock = F().daemon->socket();
  for (const std::string& args :
       {"--socket " + sock + " status --json", "--json --socket " + sock + " status",
        "--socket=" + sock + " --json status", "status --json --socket " + sock,
        "--json status --socket=" + sock}) {
    INFO(args);
    Result r = Sh(Engramctl() + " " + args);
    REQUIRE(r.code == 0);
    CHECK(json::parse(r.out)["socket"] == sock);
  }
  for (const std::string& args :
       {"--socket " + sock + " tables --no-residency", "tables --no-residency --socket " + sock}) {
    INFO(args);
    Result r = Sh(Engramctl() + " " + args);
    CHECK(r.code == 0);
    CHECK(r.out.find("LAYER") != std::string::npos);
  }
  // Mistakes are named in the order typed, wherever they stand.
  for (const std::string& args : {"--socket " + sock + " --first status --second",
                                  "status --first --socket " + sock + " --second",
                                  std::string("--json --first hash --second")}) {
    INFO(args);
    Result r = Sh(Engramctl() + " " + args);
    CHECK(r.code != 0);
    CHECK(r.err.find("not expected: --first --second") != std::string::npos);
  }
  Result r = Sh(Engramctl() + " --json status --socket");
  CHECK(r.code != 0);
  CHECK(r.err.find("--socket") != std::string::npos);
}

// A `timeout` prefix that lets a watching engramctl run `seconds` after it has started and
// answered once: the start is timed on this machine (an emulated one starts a program in
// seconds).
std::string WatchFor(double seconds) {
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(Sh(Ctl("status")).code == 0);
  const double one_call =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return absl::StrFormat("timeout --preserve-status -s INT %.2f ", seconds + 2 * one_call);
}

TEST_CASE("engramctl status --watch repeats with an interval") {
  Result r = Sh(WatchFor(1.4) + Ctl("status --json -i 0.3"));
  INFO(r.err);
  CHECK(r.code == 0);
  std::istringstream lines(r.out);
  std::string line;
  int n = 0, with_interval = 0;
  while (std::getline(lines, line)) {
    json j = json::parse(line);
    ++n;
    with_interval += j.contains("interval_seconds") ? 1 : 0;
  }
  CHECK(n >= 3);
  CHECK(with_interval == n - 1);
}

TEST_CASE("engramctl tables lists both layers with residency") {
  Result r = Sh(Ctl("tables"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("LAYER") != std::string::npos);
  CHECK(r.out.find("checkpoint") != std::string::npos);
  json j = Json("tables");
  REQUIRE(j["tables"].size() == 2);
  CHECK(j["tables"][0]["layer"] == 1);
  CHECK(j["tables"][1]["layer"] == 14);
  for (const json& t : j["tables"]) {
    CHECK(t["rows"] == kRows);
    CHECK(t["row_bytes"] == 264);
    CHECK(t["data_bytes"] == kRows * 264);
    CHECK(t["resident_fraction"].get<double>() >= 0.0);
    CHECK(t["resident_fraction"].get<double>() <= 1.0);
    CHECK((t["residency_method"] == "cachestat" || t["residency_method"] == "mincore"));
    CHECK(t["recently_evicted_bytes"].get<uint64_t>() <= kRows * 264);
    CHECK_FALSE(t["files"].empty());
  }
}

double Residency(uint32_t layer) {
  const json tables = Json("tables");  // kept alive for the loop
  for (const json& t : tables["tables"]) {
    if (t["layer"] == layer) return t["resident_fraction"];
  }
  FAIL("no layer " << layer);
  return -1;
}

TEST_CASE("engramctl evict and warm move the table through the page cache") {
  struct statfs fs;
  statfs(TestDir().c_str(), &fs);
  const bool tmpfs = fs.f_type == 0x01021994;  // TMPFS_MAGIC: pages cannot be dropped
  json e = Json("evict 14");
  CHECK(e["bytes"].get<uint64_t>() >= kRows * 264);
  if (!tmpfs) CHECK(Residency(14) < 0.5);
  json w = Json("warm 14 --rows 0:10000");
  CHECK(w["cancelled"] == false);
  CHECK(w["begin"] == 0);
  CHECK(w["done_to"] == 10000);
  CHECK(w["bytes"].get<uint64_t>() >= 10000 * 264);
  w = Json("warm 14");
  CHECK(w["done_to"] == kRows);
  // A proactive reclaimer (DAMON pageout runs on some hosts) may take a page back between the
  // warm and the residency scan; a second warm settles that, a warm that does nothing does not.
  double resident = Residency(14);
  for (int again = 0; again < 3 && resident < 0.999; ++again) {
    Json("warm 14");
    resident = Residency(14);
  }
  CHECK(resident >= 0.999);
  Result human = Sh(Ctl("warm 14 --rows 5:10"));
  CHECK(human.code == 0);
  CHECK(human.out.find("warmed layer 14 rows [5, 10)") != std::string::npos);
  Result bad = Sh(Ctl("warm 14 --rows 0:99999999"));
  CHECK(bad.code == 1);
  CHECK(bad.err.find("not inside the rows") != std::string::npos);
  Result missing = Sh(Ctl("warm 7"));
  CHECK(missing.code == 1);
  CHECK(missing.err.find("no table for layer 7") != std::string::npos);
}

TEST_CASE("engramctl rows prints and writes rows as served") {
  json j = Json("rows 14 3 77 3");
  REQUIRE(j["rows"].size() == 3);
  uint8_t expect[kRowBytes];
  const uint64_t ids[] = {3, 77, 3};
  for (int i = 0; i < 3; ++i) {
    SyntheticRow(kSeed, 14, ids[i], expect);
    std::string hex;
    for (uint8_t b : expect) hex += absl::StrFormat("%02x", b);
    CHECK(j["rows"][i]["row"] == ids[i]);
    CHECK(j["rows"][i]["hex"] == hex);
  }
  const std::string out = TestDir() + "/rows.bin";
  Result w = Sh(Ctl("rows 1 19999 0 --out " + out));
  REQUIRE(w.code == 0);
  std::ifstream f(out, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() == 2 * kRowBytes);
  SyntheticRow(kSeed, 1, 19999, expect);
  CHECK(memcmp(bytes.data(), expect, kRowBytes) == 0);
  json d = Json("rows 14 5 --dequant");
  REQUIRE(d["rows"][0]["values"].size() == 256);
  Result human = Sh(Ctl("rows 14 5"));
  CHECK(human.out.find("layer 14 row 5:") != std::string::npos);
  Result oob = Sh(Ctl("rows 14 20000"));
  CHECK(oob.code == 1);
  CHECK(oob.err.find("20000") != std::string::npos);
}

// Gathers `n` rows of layer 14 (each twice) through a session named `name`, left open.
engram_session* GatherSome(uint64_t n, const char* name = "ops-test") {
  engram_connect_options o = F().daemon->Options();
  o.client_name = name;
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  void* ids;
  void* dest;
  REQUIRE(engram_alloc(s, 2 * n * 8, &ids) == 0);
  REQUIRE(engram_alloc(s, 2 * n * kRowBytes, &dest) == 0);
  auto* rows = static_cast<uint64_t*>(ids);
  for (uint64_t i = 0; i < n; ++i) rows[i] = rows[n + i] = i * 7 % kRows;
  engram_gather_request r{
      .size = sizeof(r), .layer = 14, .rows = rows, .num_rows = 2 * n, .dest = dest};
  REQUIRE(engram_gather(s, &r, 10'000'000'000) == 0);
  return s;
}

// Status JSON of the engramd on `socket`.
json StatusOf(const std::string& socket) {
  Result r = Sh(Engramctl() + " status --json --socket " + socket);
  REQUIRE(r.code == 0);
  return json::parse(r.out);
}

TEST_CASE("with engine.pace, paced requests get the poller awake ahead of them") {
  Daemon d({"--pace"}, "paced");
  REQUIRE(d.alive());
  engram_connect_options o = d.Options();
  o.client_name = "ops-paced";
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  void* ids;
  void* dest;
  REQUIRE(engram_alloc(s, 64 * 8, &ids) == 0);
  REQUIRE(engram_alloc(s, 64 * kRowBytes, &dest) == 0);
  auto* rows = static_cast<uint64_t*>(ids);
  for (uint64_t i = 0; i < 64; ++i) rows[i] = i * 31 % kRows;
  // One small step every 50 ms on a clock, as a decode loop submits: after a few steps the
  // poller predicts the next and spins through a window around it. (50 ms: a loaded 2-core
  // test machine wakes this loop several ms late at times; the pace tolerates 6 ms at 50.)
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < 80; ++step) {
    std::this_thread::sleep_until(start + std::chrono::milliseconds(50 * step));
    engram_gather_request r{
        .size = sizeof(r), .layer = 14, .rows = rows, .num_rows = 64, .dest = dest};
    REQUIRE(engram_gather(s, &r, 10'000'000'000) == 0);
  }
  engram_session_close(s);
  const json pace = StatusOf(d.socket())["pace"];
  const uint64_t windows = pace["windows"], caught = pace["caught"];
  INFO("windows " << windows << ", caught " << caught);
  // The wiring: the poller predicted the steps and spun through windows ahead of them. Whether
  // the steps then land inside the windows depends on how punctually this machine wakes the
  // client and the poller (a loaded 2-core VM: often not); engram-ranks measures that. Even the
  // prediction needs runs of punctual steps, which a 2-core VM running builds beside the tests
  // gives only now and then: one window in 80 steps shows the wiring.
  CHECK(windows >= 1);
  CHECK(caught <= windows);
  // Off (the default), nothing is predicted.
  CHECK(Json("status")["pace"]["windows"] == 0);
  const std::string metrics = Json("metrics")["text"];
  CHECK(metrics.find("engram_poller_pace_windows_total 0") != std::string::npos);
}

TEST_CASE("engramctl stats and clients show a client's gathers") {
  engram_session* s = GatherSome(500);
  json j = Json("stats");
  bool table_seen = false;
  for (const json& t : j["tables"]) {
    if (t["layer"] != 14) continue;
    table_seen = true;
    CHECK(t["rows_requested"].get<uint64_t>() >= 1000);
    CHECK(t["dedup_saved_rows"].get<uint64_t>() >= 500);
    CHECK(t["batches"].get<uint64_t>() >= 1);
    CHECK(t["errors"] == 0);
    CHECK(t.value("ring_failures", uint64_t{99}) == 0);
    CHECK(t.value("ring_resets", uint64_t{99}) == 0);
    CHECK(t.value("fixed_reads", uint64_t{99}) == 0);  // buffered table: no O_DIRECT reads
  }
  CHECK(table_seen);
  bool client_seen = false;
  for (const json& c : j["clients"]) {
    if (c["name"] != "ops-test") continue;
    client_seen = true;
    CHECK(c["rows"] == 1000);
    CHECK(c["requests_ok"] == 1);
    CHECK(c["pid"] == getpid());
    CHECK(c["latency_p50_ns"].get<uint64_t>() > 0);
  }
  CHECK(client_seen);
  Result human = Sh(Ctl("stats"));
  CHECK(human.code == 0);
  CHECK(human.out.find("de-dup saved") != std::string::npos);
  CHECK(human.out.find("session") != std::string::npos);
  CHECK(human.out.find("'ops-test'") != std::string::npos);
  json c = Json("clients");
  bool listed = false;
  for (const json& e : c["clients"]) listed |= e["name"] == "ops-test" && e["pid"] == getpid();
  CHECK(listed);
  Result ch = Sh(Ctl("clients"));
  CHECK(ch.out.find("ops-test") != std::string::npos);
  engram_session_close(s);
}

// Characters (UTF-8 code points) of each line of `text` that is wider than `columns`.
std::vector<std::string> WiderThan(const std::string& text, size_t columns) {
  std::vector<std::string> wide;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto chars = std::count_if(line.begin(), line.end(), [](char c) {
      return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    });
    if (static_cast<size_t>(chars) > columns) wide.push_back(line);
  }
  return wide;
}

// Waits until the shared daemon serves at most `n` sessions: it ends a closed session's
// resources on its own thread, which a slow machine (an emulated arm64 kernel) runs late, and
// the cases that open two dozen sessions must not find the ones before them still counted
// against limits.max_clients.
void WaitForSessionsAtMost(uint64_t n) {
  uint64_t now = 0;
  for (int i = 0; i < 3000; ++i) {
    now = Json("status")["clients"].get<uint64_t>();
    if (now <= n) return;
    usleep(10'000);
  }
  FAIL("the daemon still serves " << now << " sessions after 30 s, expected at most " << n);
}

// Sessions a case opened, closed when it ends, failed checks included: one left open would count
// against limits.max_clients in the cases after it.
struct OpenSessions {
  std::vector<engram_session*> all;
  OpenSessions() = default;
  OpenSessions(const OpenSessions&) = delete;
  OpenSessions& operator=(const OpenSessions&) = delete;
  ~OpenSessions() {
    for (engram_session* s : all) engram_session_close(s);
  }
};

// A session named `name` (at most 31 bytes), left open.
engram_session* Open(const std::string& name) {
  engram_connect_options o = F().daemon->Options();
  o.client_name = name.c_str();
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  return s;
}

TEST_CASE("engramctl tables and clients fit 80 columns; -o wide shows every column in full") {
  const std::string name(31, 'w');
  engram_session* s = Open(name);
  for (const char* command : {"tables", "clients"}) {
    INFO(command);
    Result r = Sh(Ctl(command));
    REQUIRE(r.code == 0);
    CHECK(WiderThan(r.out, 80).empty());
  }
  Result tables = Sh(Ctl("tables"));
  CHECK(tables.out.find("LAYER") != std::string::npos);
  CHECK(tables.out.find(" MiB") != std::string::npos);     // the size, human-formatted
  CHECK(tables.out.find("B rows)") == std::string::npos);  // the row size is wide's
  Result wide_tables = Sh(Ctl("tables -o wide"));
  REQUIRE(wide_tables.code == 0);
  CHECK(wide_tables.out.find("(264 B rows)") != std::string::npos);
  Result clients = Sh(Ctl("clients"));
  // Whether the name is cut depends on the other columns' widths (pids, uids); how a column
  // gives way is ops_cli_usage's.
  CHECK(clients.out.find("SLOTS") == std::string::npos);
  CHECK(clients.out.find(name.substr(0, 8)) != std::string::npos);
  Result wide_clients = Sh(Ctl("clients --output=wide"));
  REQUIRE(wide_clients.code == 0);
  CHECK(wide_clients.out.find("SLOTS") != std::string::npos);
  CHECK(wide_clients.out.find(name) != std::string::npos);
  engram_session_close(s);
}

TEST_CASE("engramctl stats --watch fits a 24-row terminal, busiest sessions first") {
  // One name for all: the metrics give each client name its own series, up to a cap, and the
  // shared daemon's later cases count on names of their own getting theirs.
  WaitForSessionsAtMost(1);
  OpenSessions sessions;
  for (int i = 0; i < 24; ++i) sessions.all.push_back(Open("idle"));
  sessions.all.push_back(GatherSome(300));
  Result r = Sh(WatchFor(1.5) + Ctl("stats -i 0.3"));
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(WiderThan(r.out, 80).empty());
  // Frames follow one another (stdout is no terminal): each starts with the title.
  std::vector<std::vector<std::string>> frames;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("engramd stats: ", 0) == 0) frames.emplace_back();
    REQUIRE_FALSE(frames.empty());
    frames.back().push_back(line);
  }
  REQUIRE(frames.size() >= 3);
  for (const auto& frame : frames) {
    INFO(r.out);
    CHECK(frame.size() <= 24);
    CHECK(frame[1].find("ROWS/S") != std::string::npos);
    CHECK(frame.back().find("more sessions (engramctl clients)") != std::string::npos);
  }
  // Sessions at the same rate (here none gathers while watched) rank by rows served: the one
  // that gathered comes first, before the idle ones the daemon lists before it.
  for (const auto& frame : frames) {
    REQUIRE(frame.size() > 6);
    const auto header = std::find_if(frame.begin(), frame.end(), [](const std::string& l) {
      return l.rfind("SESSION", 0) == 0 || l.rfind(" SESSION", 0) == 0;
    });
    REQUIRE(header + 1 < frame.end());
    CHECK((header + 1)->find("ops-test") != std::string::npos);
  }
  CHECK(frames[0][2].find(" - ") != std::string::npos);  // no rates before a second reply
}

// The counters of engram/session_stats.h as the daemon reports them: every entry but those the
// client library counts, then the daemon's own.
struct ListedCounter {
  std::string field;
  std::string metric;  // "" for none; may end in {key=value}
};
std::vector<ListedCounter> DaemonSessionCounters() {
  std::vector<ListedCounter> out;
#define LISTED_(field, origin, type, metric, help) \
  if (std::string_view(#origin) != "LIBRARY") out.push_back({#field, metric});
  ENGRAM_SESSION_COUNTERS(LISTED_)
  ENGRAM_SESSION_DAEMON_COUNTERS(LISTED_)
#undef LISTED_
  return out;
}

// The sample a metric spec "name" or "name{key=value}" makes for the client `labels` name.
std::string SamplePrefix(const std::string& spec, const std::string& labels) {
  const size_t brace = spec.find('{');
  if (brace == std::string::npos) return spec + "{" + labels;
  const std::string label = spec.substr(brace + 1, spec.size() - brace - 2);
  const size_t eq = label.find('=');
  return spec.substr(0, brace) + "{" + labels + "," + label.substr(0, eq) + "=\"" +
         label.substr(eq + 1) + "\"";
}

TEST_CASE("every session counter of the list shows in stats, clients, metrics and engramctl") {
  engram_session* s = GatherSome(50);
  engram_session_stats st{.size = sizeof(st)};
  REQUIRE(engram_get_session_stats(s, &st) == 0);
  const json id = st.session_id;
  auto entry = [&](const json& reply) {
    for (const json& c : reply["clients"]) {
      if (c["session"] == id) return c;
    }
    FAIL("session " << id << " missing from " << reply.dump());
    return json();
  };
  const json stats = entry(Json("stats")), clients = entry(Json("clients"));
  const std::string metrics = Json("metrics")["text"];
  const std::string text = Sh(Ctl("stats")).out;
  const size_t at = text.find("session " + id.dump() + " '");
  REQUIRE(at != std::string::npos);
  const std::string block = text.substr(at, text.find("\nsession ", at + 1) - at);
  const std::string labels = "client=\"ops-test\"";
  for (const ListedCounter& c : DaemonSessionCounters()) {
    INFO(c.field);
    CHECK(stats.contains(c.field));
    CHECK(clients.contains(c.field));
    if (!c.metric.empty()) CHECK(metrics.find(SamplePrefix(c.metric, labels)) != std::string::npos);
    std::string label = c.field;
    if (label.size() > 3 && label.compare(label.size() - 3, 3, "_ns") == 0) {
      label.resize(label.size() - 3);
    }
    std::replace(label.begin(), label.end(), '_', ' ');
    CHECK(block.find(label + " ") != std::string::npos);
  }
  CHECK(stats["requests_ok"] == 1);
  CHECK(stats["rows"] == 100);
  engram_session_close(s);
}

TEST_CASE("the library names each field of engram_session_stats, as the list declares them") {
  std::vector<std::string> listed = {"session_id"};
#define LISTED_(field, origin, type, metric, help) listed.push_back(#field);
  ENGRAM_SESSION_COUNTERS(LISTED_)
#undef LISTED_
  CHECK(sizeof(engram_session_stats) == sizeof(size_t) + 8 * listed.size());
  std::vector<std::string> named;
  const char *name = nullptr, *help = nullptr;
  while (engram_session_stats_field(named.size(), &name, &help) == 0) {
    INFO(name);
    CHECK(strlen(help) > 10);
    named.push_back(name);
    REQUIRE(named.size() < 1000);
  }
  CHECK(engram_session_stats_field(named.size(), &name, &help) == -ERANGE);
  CHECK(std::string(engram_last_error()).find("no field") != std::string::npos);
  CHECK(named == listed);
  CHECK(engram_session_stats_field(0, nullptr, &help) == -EINVAL);
}

// A parsed exposition: sample name with labels → value, and family → type.
struct Scrape {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;
};

Scrape Parse(const std::string& text) {
  Scrape s;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      s.types[name] = type;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    REQUIRE(space != std::string::npos);
    const std::string key = line.substr(0, space);
    s.samples[key] = std::stod(line.substr(space + 1));
    const std::string name = key.substr(0, key.find('{'));
    bool typed = s.types.count(name) != 0;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sfx = suffix;
      if (name.size() > sfx.size() &&
          name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0) {
        typed |= s.types.count(name.substr(0, name.size() - sfx.size())) != 0;
      }
    }
    INFO(line);
    CHECK(typed);  // every sample follows its family's TYPE line
  }
  return s;
}

std::string HttpGet(uint16_t port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
  REQUIRE(send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[8192];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST_CASE("the metrics scrape parses back with Prometheus conventions") {
  engram_session* s = GatherSome(100, "ops-scrape");
  const std::string http = HttpGet(F().port, "/metrics");
  REQUIRE(http.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(http.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  Scrape m = Parse(http.substr(http.find("\r\n\r\n") + 4));
  CHECK(m.samples.at("engram_up") == 1);
  CHECK(m.samples.at("engram_tables") == 2);
  CHECK(m.samples.at("engram_table_rows{table=\"14\"}") == kRows);
  CHECK(m.samples.at("engram_gather_rows_total{table=\"14\"}") >= 200);
  CHECK(m.samples.at("engram_gather_ring_failures_total{table=\"14\"}") == 0);
  CHECK(m.types.at("engram_gather_fixed_reads_total") == "counter");
  for (const auto& [name, type] : m.types) {
    INFO(name << " " << type);
    CHECK((name.rfind("engram_", 0) == 0 || name.rfind("process_", 0) == 0));
    if (type == "counter") CHECK(name.size() > 6);
    if (type == "counter") CHECK(name.compare(name.size() - 6, 6, "_total") == 0);
    if (type == "histogram") CHECK(name.compare(name.size() - 8, 8, "_seconds") == 0);
  }
  // Histogram buckets are cumulative and end in +Inf = _count.
  double last = -1;
  for (const auto& [key, value] : m.samples) {
    if (key.rfind("engram_gather_batch_duration_seconds_bucket{table=\"14\"", 0) != 0) continue;
    CHECK(value >= 0);
    last = std::max(last, value);
  }
  CHECK(m.samples.at("engram_gather_batch_duration_seconds_bucket{table=\"14\",le=\"+Inf\"}") ==
        m.samples.at("engram_gather_batch_duration_seconds_count{table=\"14\"}"));
  CHECK(last == m.samples.at("engram_gather_batch_duration_seconds_count{table=\"14\"}"));
  bool client_rows = false;
  for (const auto& [key, value] : m.samples) {
    if (key == "engram_client_rows_total{client=\"ops-scrape\"}" && value == 200) {
      client_rows = true;
    }
  }
  CHECK(client_rows);
  // The client histogram's _sum is the request's exact service time, which the daemon also
  // wrote into the request's status in the arena.
  void* base = nullptr;
  uint64_t arena_bytes = 0;
  REQUIRE(engram_arena(s, &base, &arena_bytes) == 0);
  const auto* header = static_cast<const engram_arena_header*>(base);
  const auto* status = reinterpret_cast<const engram_request_status*>(
      static_cast<const uint8_t*>(base) + header->status_offset);
  uint64_t service_ns = 0;
  for (uint32_t i = 0; i < header->slots; ++i) {
    if (status[i].rows == 200) service_ns = status[i].service_ns;
  }
  REQUIRE(service_ns > 0);
  const std::string labels = "{client=\"ops-scrape\"}";
  CHECK(m.samples.at("engram_client_request_duration_seconds_count" + labels) == 1);
  CHECK(m.samples.at("engram_client_request_duration_seconds_sum" + labels) ==
        Approx(double(service_ns) / 1e9).epsilon(1e-6));
  // engramctl metrics serves the same families over the socket.
  Result r = Sh(Ctl("metrics"));
  REQUIRE(r.code == 0);
  Scrape viasocket = Parse(r.out);
  for (const auto& [name, type] : m.types) CHECK(viasocket.types[name] == type);
  CHECK(Json("metrics")["text"].get<std::string>().find("engram_up 1") != std::string::npos);
  CHECK(HttpGet(F().port, "/other").rfind("HTTP/1.1 404", 0) == 0);
  engram_session_close(s);
}

// The sample of `family` with exactly `labels` ("" for none), or -1 when absent.
double Sample(const Scrape& m, const std::string& family, const std::string& labels) {
  const auto it = m.samples.find(family + (labels.empty() ? "" : "{" + labels + "}"));
  return it == m.samples.end() ? -1 : it->second;
}

Scrape ScrapeOf(const std::string& socket) {
  Result r = Sh(Engramctl() + " metrics --socket " + socket);
  REQUIRE(r.code == 0);
  return Parse(r.out);
}

TEST_CASE("per-client series are one set per client name, kept across sessions and reconnects") {
  const std::string agg = "client=\"ops-agg\"";
  engram_session* a = GatherSome(10, "ops-agg");
  engram_session* b = GatherSome(10, "ops-agg");
  Scrape m = ScrapeOf(F().daemon->socket());
  CHECK(Sample(m, "engram_client_rows_total", agg) == 40);
  CHECK(Sample(m, "engram_client_requests_in_flight", agg) == 0);
  CHECK(Sample(m, "engram_client_request_duration_seconds_count", agg) == 2);
  // 10 edges a factor of 4 apart, 4.096 µs to 1.07 s, then +Inf.
  int buckets = 0;
  for (const auto& [key, value] : m.samples) {
    buckets += key.rfind("engram_client_request_duration_seconds_bucket{" + agg + ",le=", 0) == 0;
  }
  CHECK(buckets == 11);
  CHECK(Sample(m, "engram_client_request_duration_seconds_bucket", agg + ",le=\"4.096e-06\"") >= 0);
  CHECK(Sample(m, "engram_client_request_duration_seconds_bucket", agg + ",le=\"1.073741824\"") ==
        2);
  // A session that ends leaves its counts in its name's series; a reconnect adds to them.
  engram_session_close(a);
  engram_session_close(b);
  engram_session* c = GatherSome(10, "ops-agg");
  m = ScrapeOf(F().daemon->socket());
  CHECK(Sample(m, "engram_client_rows_total", agg) == 60);
  CHECK(Sample(m, "engram_client_requests_total", agg + ",result=\"ok\"") == 3);
  CHECK(Sample(m, "engram_client_request_duration_seconds_count", agg) == 3);
  // No per-session label: the sessions are in engramctl clients.
  const std::string text = Json("metrics")["text"];
  CHECK(text.find("session=") == std::string::npos);
  int sessions = 0;
  const json clients = Json("clients");  // kept alive for the loop
  for (const json& e : clients["clients"]) sessions += e["name"] == "ops-agg" ? 1 : 0;
  CHECK(sessions == 1);
  engram_session_close(c);
}

TEST_CASE("client slots go to the clients connected now, the rest under client=\"other\"") {
  Daemon d({}, "names");
  REQUIRE(d.alive());
  std::vector<engram_session*> sessions;
  for (int i = 0; i < 40; ++i) {
    engram_connect_options o = d.Options();
    const std::string name = absl::StrFormat("name-%02d", i);
    o.client_name = name.c_str();
    engram_session* s = nullptr;
    const int rc = engram_session_open(&o, &s);
    INFO("session " << i << ": " << engram_last_error());
    REQUIRE(rc == 0);
    sessions.push_back(s);
  }
  Scrape m = ScrapeOf(d.socket());
  std::set<std::string> clients;
  for (const auto& [key, value] : m.samples) {
    if (key.rfind("engram_client_requests_in_flight{", 0) == 0) clients.insert(key);
  }
  // 32 names of their own (those of the sessions that connected first), and the rest,
  // engramctl's included, as one.
  CHECK(clients.size() == 33);
  CHECK(Sample(m, "engram_client_requests_in_flight", "client=\"name-00\"") == 0);
  CHECK(Sample(m, "engram_client_requests_in_flight", "client=\"name-31\"") == 0);
  CHECK(Sample(m, "engram_client_requests_in_flight", "client=\"name-32\"") == -1);
  CHECK(Sample(m, "engram_client_requests_in_flight", "client=\"other\"") == 0);
  for (engram_session* s : sessions) engram_session_close(s);
  // Once they have gone, a client that connects takes the slot of a name that is no longer
  // connected (the one idle longest) instead of being added up under "other".
  for (int i = 0; i < 500 && Sample(ScrapeOf(d.socket()), "engram_clients", "") > 1; ++i) {
    usleep(10000);
  }
  engram_connect_options o = d.Options();
  o.client_name = "late-engine";
  engram_session* late = nullptr;
  REQUIRE(engram_session_open(&o, &late) == 0);
  m = ScrapeOf(d.socket());
  CHECK(Sample(m, "engram_client_requests_in_flight", "client=\"late-engine\"") == 0);
  clients.clear();
  int idle_names = 0;
  for (const auto& [key, value] : m.samples) {
    if (key.rfind("engram_client_requests_in_flight{", 0) != 0) continue;
    clients.insert(key);
    idle_names += key.find("client=\"name-") != std::string::npos ? 1 : 0;
  }
  CHECK(clients.size() == 33);  // still bounded: 32 names and "other"
  CHECK(idle_names == 30);      // two gave their slots: to engramctl's and to late-engine
  engram_session_close(late);
}

TEST_CASE("process_* metrics describe engramd's own process") {
  Scrape m = Parse(Json("metrics")["text"]);
  CHECK(m.types.at("process_cpu_seconds_total") == "counter");
  CHECK(m.samples.at("process_cpu_seconds_total") >= 0);
  CHECK(m.samples.at("process_resident_memory_bytes") > 1 << 20);
  CHECK(m.samples.at("process_virtual_memory_bytes") >=
        m.samples.at("process_resident_memory_bytes"));
  // engramd holds its sockets, epoll and event fds, table files: more than a handful.
  CHECK(m.samples.at("process_open_fds") > 5);
  CHECK(m.samples.at("process_max_fds") > m.samples.at("process_open_fds"));
  const double now = double(std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  const double started = m.samples.at("process_start_time_seconds");
  CHECK(started <= now + 1);
  CHECK(started > now - 3600);
  // Ratios are 0-1, the budget comes once.
  for (const auto& [name, type] : m.types) {
    INFO(name);
    CHECK(name.find("avg10") == std::string::npos);
    CHECK(name.find("percent") == std::string::npos);
    CHECK(name != "engram_store_budget_bytes");
  }
}

TEST_CASE("/healthz on the metrics port says ok while engramd serves") {
  const std::string http = HttpGet(F().port, "/healthz");
  CHECK(http.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(http.substr(http.find("\r\n\r\n") + 4) == "ok\n");
  CHECK(HttpGet(F().port, "/healthz?verbose=1").rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
}

TEST_CASE("the metrics textfile says engram_up 0 once engramd stops") {
  const std::string dir = TestDir() + "/textfile";
  std::filesystem::create_directories(dir);
  Daemon d({"--metrics-textfile-dir", dir}, "textfile");
  REQUIRE(d.alive());
  const std::string prom = dir + "/engramd.prom";
  auto read = [&] {
    std::ifstream f(prom);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  for (int i = 0; i < 300 && read().find("engram_up 1\n") == std::string::npos; ++i) usleep(10000);
  CHECK(read().find("engram_up 1\n") != std::string::npos);
  const int status = d.Stop(SIGTERM);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const std::string last = read();
  CHECK(last.find("engram_up 0\n") != std::string::npos);
  CHECK(last.find("engram_up 1\n") == std::string::npos);
  CHECK(last.find("\nengram_textfile_written_timestamp_seconds ") != std::string::npos);
}

TEST_CASE("a textfile that SIGHUP switches off is removed, not left saying engram_up 1") {
  const std::string dir = TestDir() + "/textfile-off";
  std::filesystem::create_directories(dir);
  const std::string config = TestDir() + "/textfile-off.toml";
  std::ofstream(config) << "[metrics]\ntextfile_dir = \"" << dir << "\"\n";
  Daemon d({"--config", config}, "textfile-off");
  REQUIRE(d.alive());
  const std::string prom = dir + "/engramd.prom";
  for (int i = 0; i < 300 && !std::filesystem::exists(prom); ++i) usleep(10000);
  REQUIRE(std::filesystem::exists(prom));
  std::ofstream(config) << "[metrics]\n";
  kill(d.pid(), SIGHUP);
  for (int i = 0; i < 500 && std::filesystem::exists(prom); ++i) usleep(10000);
  CHECK_FALSE(std::filesystem::exists(prom));
}

// This machine's MemTotal in bytes.
uint64_t MemTotal() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  while (f >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024;
    f.ignore(1 << 10, '\n');
  }
  FAIL("no MemTotal in /proc/meminfo");
  return 0;
}

TEST_CASE("a budget or a row cache larger than the machine is refused with the numbers") {
  const uint64_t twice = 2 * MemTotal();
  const std::string base = " --model " + Checkpoint() + " --socket " + TestDir() + "/big.sock";
  Result budget =
      Sh(EngramdPath() + base + " --memory-budget " + std::to_string(twice) + " --check-config");
  CHECK(budget.code == 1);
  CHECK(budget.err.find(std::to_string(twice) + " bytes") != std::string::npos);
  CHECK(budget.err.find(std::to_string(MemTotal()) + " bytes") != std::string::npos);
  // No budget: the row cache's size alone is checked against the machine.
  Result cache = Sh(EngramdPath() + base + " --tier 1=cache --cache-bytes " +
                    std::to_string(twice) + " --check-config");
  CHECK(cache.code == 1);
  CHECK(cache.err.find("row cache [memory] cache") != std::string::npos);
  CHECK(cache.err.find(std::to_string(twice) + " bytes") != std::string::npos);
  CHECK(cache.err.find("MemTotal") != std::string::npos);
  Result started = Sh("timeout 20 " + EngramdPath() + base + " --tier 1=cache --cache-bytes " +
                      std::to_string(twice));
  CHECK(started.code == 1);
  CHECK(started.err.find("row cache [memory] cache") != std::string::npos);
}

TEST_CASE("the start log names the version, pid, steps and one summary when serving starts") {
  const uint16_t port = FreePort();
  const std::string args = " --model " + Checkpoint() + " --socket " + TestDir() +
                           "/summary.sock --workers 2 --tier 14=resident --tier 1=cache "
                           "--cache-bytes 1M --log-level info --metrics-port " +
                           std::to_string(port);
  // Serves for a few seconds, then `timeout` stops it with SIGTERM.
  Result r = Sh("timeout 5 " + EngramdPath() + args);
  INFO(r.err);
  CHECK(r.err.find(absl::StrFormat("starting, pid ")) != std::string::npos);
  CHECK(r.err.find("opening and validating 1 table source(s)") != std::string::npos);
  CHECK(r.err.find("building the row store: row cache up to 0.00 GiB, 1 resident table(s)") !=
        std::string::npos);
  const size_t at = r.err.find(" serving, pid ");
  REQUIRE(at != std::string::npos);
  const std::string summary = r.err.substr(at, r.err.find('\n', at) - at);
  for (const char* part : {"s after start", "2 table(s): layer 1 cache, layer 14 resident (",
                           "row cache ", "memory budget unbounded", "2 gather worker(s)",
                           "request thread(s)", "huge pages ", "metrics on port"}) {
    INFO(part);
    CHECK(summary.find(part) != std::string::npos);
  }
  CHECK(r.err.find("engramd stopped") != std::string::npos);
}

TEST_CASE("a reply too long for one message comes in a sealed memfd, whole") {
  // 24 client names' histograms and counters, with long names, make the exposition longer than
  // one message.
  WaitForSessionsAtMost(1);
  OpenSessions sessions;
  for (int i = 0; i < 24; ++i) {
    engram_connect_options o = F().daemon->Options();
    const std::string name = absl::StrFormat("bulk-%02d-%s", i, std::string(22, 'x'));
    o.client_name = name.c_str();
    engram_session* s = nullptr;
    const int rc = engram_session_open(&o, &s);
    INFO("session " << i << ": " << engram_last_error());
    REQUIRE(rc == 0);
    sessions.all.push_back(s);
  }
  Result r = Sh(Ctl("metrics"));
  REQUIRE(r.code == 0);
  CHECK(r.out.size() > ENGRAM_MSG_MAX_BYTES);
  Scrape m = Parse(r.out);
  for (int i = 0; i < 24; ++i) {
    bool seen = false;
    for (const auto& [key, value] : m.samples) {
      const std::string family = absl::StrFormat("engram_client_rows_total{client=\"bulk-%02d-%s\"",
                                                 i, std::string(22, 'x'));
      seen |= key.rfind(family, 0) == 0;
    }
    CHECK(seen);
  }
  CHECK(m.samples.at("engram_up") == 1);
}

TEST_CASE("SIGHUP applies what can change live and says what needs a restart") {
  Fixture& f = F();
  f.notify.Read(300, "no message contains this");  // drain the queue
  WriteConfig(40, "info");
  kill(f.daemon->pid(), SIGHUP);
  std::vector<std::string> m = f.notify.Read(3000, "READY=1");
  bool reloading = false, ready = false;
  for (const auto& x : m) {
    reloading |= x.find("RELOADING=1") != std::string::npos;
    ready |= x.find("READY=1") != std::string::npos;
  }
  CHECK(reloading);
  CHECK(ready);
  json j = Json("status");
  CHECK(j["max_clients"] == 40);
  // The test daemon runs with --log-level warning: the flag wins over the file's "info".
  CHECK(j["log_level"] == "warning");
  // A refused file keeps the running configuration.
  std::ofstream(ConfigPath()) << "[limits]\nmax_clients = \"lots\"\n";
  kill(f.daemon->pid(), SIGHUP);
  f.notify.Read(3000, "READY=1");
  CHECK(Json("status")["max_clients"] == 40);
  WriteConfig(32, "warning");
}

TEST_CASE("engramctl exit codes when no daemon answers") {
  const std::string gone = TestDir() + "/gone.sock";
  Result r = Sh(Engramctl() + " status --socket " + gone);
  CHECK(r.code == 3);
  CHECK(r.err.find(gone) != std::string::npos);
  CHECK(r.err.find("journalctl") != std::string::npos);
  r = Sh(Engramctl() + " status --json --socket " + gone);
  CHECK(r.code == 3);
  CHECK(json::parse(r.out)["exit_code"] == 3);
  for (const char* cmd : {"tables", "stats", "clients", "metrics", "warm 14", "evict 14"}) {
    INFO(cmd);
    CHECK(Sh(Engramctl() + " " + cmd + " --socket " + gone).code == 3);
  }
  CHECK(Sh(Engramctl() + " rows 14 1 --socket " + gone).code == 3);
  // Something that accepts but is not engramd: unknown state, exit 4.
  const std::string odd = TestDir() + "/odd.sock";
  int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", odd.c_str());
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(fd, 4) == 0);
  std::thread closer([fd] {
    int c = accept(fd, nullptr, nullptr);
    char buf[256];
    recv(c, buf, sizeof(buf), 0);
    close(c);
  });
  r = Sh(Engramctl() + " status --socket " + odd);
  closer.join();
  close(fd);
  CHECK(r.code == 4);
  CHECK(r.err.find(odd) != std::string::npos);
}

TEST_CASE("engramd --check-config validates the files and the tables without serving") {
  const std::string good = TestDir() + "/check.toml";
  std::ofstream(good) << "[tables]\nmodels = [\"" << Checkpoint()
                      << "\"]\n[limits]\nmax_clients = 4\n";
  // A socket of its own: the default path's directory may not be this user's to make.
  const std::string socket = " --socket " + TestDir() + "/check.sock";
  Result r = Sh(EngramdPath() + " --config " + good + socket + " --check-config");
  CHECK(r.code == 0);
  CHECK(r.out.find("configuration OK") != std::string::npos);
  CHECK(r.out.find("layer 14") != std::string::npos);
  const std::string bad = TestDir() + "/check-bad.toml";
  std::ofstream(bad) << "[tables]\nmodels = [\"" << Checkpoint()
                     << "\"]\n\n[limits]\nmax_clients = 4\nspeed = 9\n";
  r = Sh(EngramdPath() + " --config " + bad + " --check-config");
  CHECK(r.code == 1);
  CHECK(r.err.find(bad + ":6: unknown key 'limits.speed'") != std::string::npos);
  // Not under journald: a timestamp and the level's name, no syslog priority prefix.
  CHECK(std::regex_search(
      r.err, std::regex("^\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z error: ")));
  const std::string missing_table = TestDir() + "/check-missing.toml";
  std::ofstream(missing_table) << "[tables]\nfiles = [\"" << TestDir() << "/nope.engram\"]\n";
  r = Sh(EngramdPath() + " --config " + missing_table + " --check-config");
  CHECK(r.code == 1);
  CHECK(r.err.find("nope.engram") != std::string::npos);
  // A flag overrides the file.
  r = Sh(EngramdPath() + " --config " + good + socket + " --layers 14 --check-config");
  CHECK(r.code == 0);
  CHECK(r.out.find("layer 1 ") == std::string::npos);
}

TEST_CASE("a start refuses what --check-config refuses, with the same message") {
  // A tier for a layer no table holds: the row store's check, which both paths run.
  const std::string args = " --model " + Checkpoint() + " --socket " + TestDir() +
                           "/tier.sock --workers 2 --tier 99=resident";
  const std::string says = "a tier is set for layer 99";
  Result checked = Sh(EngramdPath() + args + " --check-config");
  CHECK(checked.code == 1);
  CHECK(checked.err.find(says) != std::string::npos);
  // A start that served instead would run until `timeout` stops it (exit 124).
  Result started = Sh("timeout 20 " + EngramdPath() + args);
  CHECK(started.code == 1);
  CHECK(started.err.find(says) != std::string::npos);
  CHECK(started.err.substr(started.err.find("engramd: ")) ==
        checked.err.substr(checked.err.find("engramd: ")));
}

}  // namespace
}  // namespace engram::testing
