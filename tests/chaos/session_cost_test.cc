// What one admitted client can make the node pay through its session: polling mode's spinning
// cores held on by no-op requests on a clock. Each case checks that the cost stays the client's own while well-behaved clients keep
// what they had.
#include <catch2/catch.hpp>
#include <chrono>
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

}  // namespace
}  // namespace engram::testing
