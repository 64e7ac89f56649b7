// What one admitted client can make the node pay through its session: polling mode's spinning
// cores held on by no-op requests on a clock, and node-wide statistics forged through its touch
// page. Each case checks that the cost stays the client's own while well-behaved clients keep
// what they had.
#include <catch2/catch.hpp>
#include <chrono>
#include <cinttypes>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/chaos/chaos_util.h"

namespace engram::testing {
namespace {

using nlohmann::json;

json Control(const std::string& socket, const std::string& request) {
  RawSession admin(socket, "cost-admin");
  REQUIRE(admin.fd() >= 0);
  const std::string reply = admin.Control(request);
  INFO(request << " -> " << reply);
  REQUIRE(reply.rfind("ERROR", 0) != 0);
  return json::parse(reply);
}

// CPU time (user + system) of process `pid` so far, in clock ticks (/proc/<pid>/stat).
uint64_t CpuTicks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // Fields after the command (which may hold spaces) start after its closing parenthesis:
  // state is field 3, utime 14 and stime 15.
  std::istringstream rest(text.substr(text.rfind(')') + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return utime + stime;
}

// The share of one core `pid` used while `body` ran.
template <typename Body>
double CoresUsedDuring(pid_t pid, Body body) {
  const uint64_t ticks0 = CpuTicks(pid);
  const auto t0 = std::chrono::steady_clock::now();
  body();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return double(CpuTicks(pid) - ticks0) / double(sysconf(_SC_CLK_TCK)) / seconds;
}

engram_session* Open(const LoggedDaemon& d, const char* name) {
  engram_connect_options o = d.Options();
  o.client_name = name;
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  return s;
}

// Seconds the poller and the request threads have spun finding no work (wall time, counted
// as it passes, so a loaded machine that preempts the spinning threads does not hide it).
double SpinSeconds(const std::string& socket) {
  const json poll = Control(socket, R"({"command":"status"})")["poll"];
  return poll["poller_spin_seconds"].get<double>() +
         poll["request_threads_spin_seconds"].get<double>();
}

TEST_CASE("no-op requests on a clock do not hold polling mode's cores", "[chaos]") {
  LoggedDaemon d("poll-noop", Checkpoint(), {"--poll-mode", "on", "--poll-cores", "2"});
  REQUIRE(d.alive());
  engram_session* s = Open(d, "noop-clock");
  // One no-op every 190 ms, inside the 200 ms polling mode holds its cores after a request.
  const double spin0 = SpinSeconds(d.socket());
  const double noop_cores = CoresUsedDuring(d.pid(), [&] {
    for (int i = 0; i < 16; ++i) {
      uint64_t ticket = 0;
      REQUIRE(engram_submit_nop(s, &ticket) == 0);
      REQUIRE(engram_wait(s, ticket, 5'000'000'000) == 0);
      usleep(190'000);
    }
  });
  const double noop_spin = SpinSeconds(d.socket()) - spin0;
  INFO("while a client sent no-ops for 3 s engramd used "
       << noop_cores * 100 << " % of a core and spun " << noop_spin << " s");
  CHECK(noop_cores < 0.2);
  CHECK(noop_spin < 0.3);
  CHECK(Control(d.socket(), R"({"command":"status"})")["poll"]["holding"] == false);
  // A client whose requests gather rows is still served by spinning cores: the daemon holds
  // them, and spins, while it gathers.
  uint64_t* rows = nullptr;
  uint8_t* out = nullptr;
  REQUIRE(engram_alloc(s, 8 * 8, reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, 8 * kRowBytes, reinterpret_cast<void**>(&out)) == 0);
  bool held = false;
  const double spin1 = SpinSeconds(d.socket());
  for (int i = 0; i < 40; ++i) {
    FillRows(rows, 8, kRows, i + 1);
    engram_gather_request r{
        .size = sizeof(r), .layer = 14, .rows = rows, .num_rows = 8, .dest = out};
    REQUIRE(engram_gather(s, &r, 5'000'000'000) == 0);
    REQUIRE(FirstBadRow(14, rows, 8, out) == -1);
    if (i == 20) held = Control(d.socket(), R"({"command":"status"})")["poll"]["holding"];
    usleep(20'000);
  }
  const double gather_spin = SpinSeconds(d.socket()) - spin1;
  INFO("while a client gathered for about 1 s engramd spun " << gather_spin << " s");
  CHECK(held);
  CHECK(gather_spin > 0.5);
  engram_session_close(s);
  CHECK(d.alive());
}

// This process's mappings of the touch page memfd, in the order the kernel lists them.
std::vector<uintptr_t> TouchPages() {
  std::vector<uintptr_t> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("memfd:engram-cache-touch") == std::string::npos) continue;
    uintptr_t begin = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR, &begin) == 1) out.push_back(begin);
  }
  return out;
}

// Gathers rows of layer 1 in place (the row cache), so that the session maps its touch page.
void GatherInPlace(engram_session* s, uint64_t seed) {
  uint64_t* rows = nullptr;
  uint8_t* out = nullptr;
  REQUIRE(engram_alloc(s, 64 * 8, reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, 64 * kRowBytes, reinterpret_cast<void**>(&out)) == 0);
  FillRows(rows, 64, 1500, seed);
  engram_gather_request r{.size = sizeof(r),
                          .layer = 1,
                          .flags = ENGRAM_GATHER_IN_PLACE,
                          .rows = rows,
                          .num_rows = 64,
                          .dest = out};
  REQUIRE(engram_gather(s, &r, 10'000'000'000) == 0);
  REQUIRE(FirstBadRow(1, rows, 64, out) == -1);
}

// Writes `value` into every table's counters of the touch page mapped at `page`.
void Forge(uintptr_t page, uint64_t value) {
  auto* header = reinterpret_cast<engram_cache_touch_page*>(page);
  auto* counters = reinterpret_cast<engram_cache_touch_counters*>(page + header->counters_offset);
  for (uint32_t t = 0; t < header->tables; ++t) {
    counters[t].requests = value;
    counters[t].rows = value;
  }
}

uint64_t ClampsOf(const json& clients, const std::string& name) {
  for (const json& c : clients) {
    if (c.value("name", "") == name) return c["touch_reports_clamped"];
  }
  FAIL("no client named " << name << " in " << clients.dump());
  return 0;
}

TEST_CASE("forged touch page counters are clamped, counted, named once and never wrap", "[chaos]") {
  LoggedDaemon d("forged-touch", Checkpoint(), {"--tier", "1=cache", "--cache-bytes", "1M"});
  REQUIRE(d.alive());
  engram_session* a = Open(d, "forger-a");
  GatherInPlace(a, 1);
  const std::vector<uintptr_t> before_b = TouchPages();
  REQUIRE(before_b.size() == 1);
  const uint64_t hits0 = Control(d.socket(), R"({"command":"status"})")["store"]["cache"]["hits"];
  // 2^63 rows read in place, as session A tells it: counted no further than it could have read
  // (256 GiB/s of rows for the seconds it has been open, ~1e9 rows a second).
  Forge(before_b[0], uint64_t{1} << 63);
  const uint64_t hits1 = Control(d.socket(), R"({"command":"status"})")["store"]["cache"]["hits"];
  INFO("cache hits " << hits0 << " -> " << hits1);
  CHECK(hits1 >= hits0);
  CHECK(hits1 < (uint64_t{1} << 40));
  // A second session's 2^63 does not wrap the node's totals back.
  engram_session* b = Open(d, "forger-b");
  GatherInPlace(b, 2);
  std::vector<uintptr_t> pages = TouchPages();
  REQUIRE(pages.size() == 2);
  const uintptr_t page_b = pages[0] == before_b[0] ? pages[1] : pages[0];
  Forge(page_b, uint64_t{1} << 63);
  // And again on A's page, after a wrap back to zero: growth from a base the client set.
  Forge(before_b[0], 0);
  (void)Control(d.socket(), R"({"command":"status"})");
  Forge(before_b[0], uint64_t{1} << 63);
  const json status = Control(d.socket(), R"({"command":"status"})");
  const uint64_t hits2 = status["store"]["cache"]["hits"];
  INFO("cache hits " << hits1 << " -> " << hits2);
  CHECK(hits2 >= hits1);
  CHECK(hits2 < (uint64_t{1} << 41));
  // Counted per session, and named once each in the log.
  const json clients = Control(d.socket(), R"({"command":"clients"})")["clients"];
  CHECK(ClampsOf(clients, "forger-a") >= 2);
  CHECK(ClampsOf(clients, "forger-b") >= 1);
  const std::string log = d.Log();
  INFO(log);
  size_t named_a = 0, named_b = 0;
  for (size_t at = log.find("read in place of table"); at != std::string::npos;
       at = log.find("read in place of table", at + 1)) {
    const std::string line = log.substr(log.rfind('\n', at) + 1, at - log.rfind('\n', at));
    named_a += line.find("'forger-a'") != std::string::npos ? 1 : 0;
    named_b += line.find("'forger-b'") != std::string::npos ? 1 : 0;
  }
  CHECK(named_a == 1);
  CHECK(named_b == 1);
  engram_session_close(a);
  engram_session_close(b);
  CHECK(d.alive());
}

}  // namespace
}  // namespace engram::testing
