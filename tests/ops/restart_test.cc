// A manual restart on one socket path: engramd stopped with SIGTERM while the next one starts at
// once on the same path. The new daemon must end up reachable, whatever the old one does on its
// way out, and a start beside a serving engramd is refused, naming it.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <string>

#include "testkit/daemon_test_util.h"

namespace engram::testing {
namespace {

// Whether a client session opens on `d`'s socket (HELLO answered with WELCOME).
bool SessionOpens(const Daemon& d) {
  engram_connect_options o = d.Options();
  engram_session* s = nullptr;
  if (engram_session_open(&o, &s) != 0) return false;
  engram_session_close(s);
  return true;
}

TEST_CASE("a daemon stopping while the next starts on its path leaves it the socket", "[ops]") {
  for (int round = 0; round < 5; ++round) {
    INFO("round " << round);
    auto old_daemon = std::make_unique<Daemon>(std::vector<std::string>{}, "restart");
    REQUIRE(old_daemon->alive());
    REQUIRE(SessionOpens(*old_daemon));
    // The restart: SIGTERM to the old one and the new one started at once, without waiting.
    REQUIRE(kill(old_daemon->pid(), SIGTERM) == 0);
    Daemon next({}, "restart");
    REQUIRE(next.alive());
    const int status = old_daemon->Stop(SIGTERM);  // waits until it has exited
    CHECK(WIFEXITED(status));
    old_daemon.reset();
    // Whatever the old one removed on its way out, the new one is reachable on the path (once
    // it has bound: it may have waited for the old one to let the path go).
    bool reachable = false;
    for (int i = 0; i < 1000 && !reachable && next.alive(); ++i) {
      reachable = SessionOpens(next);
      if (!reachable) usleep(10'000);
    }
    CHECK(next.alive());
    CHECK(reachable);
    struct stat st;
    CHECK(lstat(next.socket().c_str(), &st) == 0);
    CHECK(S_ISSOCK(st.st_mode));
  }
}

TEST_CASE("a start beside a serving engramd is refused, naming its pid", "[ops]") {
  Daemon serving({}, "serving");
  REQUIRE(serving.alive());
  const auto [code, out] = RunCommand(EngramdPath() + " --model " + Checkpoint() + " --socket " +
                                      serving.socket() + " --workers 2 2>&1");
  INFO(out);
  CHECK(code != 0);
  CHECK(out.find("another engramd (pid " + std::to_string(serving.pid()) + ") is serving") !=
        std::string::npos);
  // The refused start left the serving daemon's socket in place.
  CHECK(SessionOpens(serving));
}

}  // namespace
}  // namespace engram::testing
