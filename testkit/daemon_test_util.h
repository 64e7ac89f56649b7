// Helpers for the engramd integration tests: a synthetic checkpoint written once per test binary,
// engramd started as a child process on a private socket, engramctl run against it, and row
// checks against SyntheticRow.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engram/engram.h"
#include "engram/protocol.h"
#include "nlohmann/json.hpp"
#include "tables/table.h"
#include "testkit/engramd_probe.h"
#include "testkit/synthetic.h"

namespace engram::testing {

// Starts `args` (the program first) as uid and gid `id` with no supplementary groups, its stderr
// into `log_fd`, killed when the test dies; returns the child's pid (-1 if fork failed). The
// child exits 126 when it cannot drop to `id`, 127 when exec fails.
inline pid_t SpawnAsUser(uid_t id, std::vector<std::string> args, int log_fd) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  dup2(log_fd, STDERR_FILENO);
  if (setgroups(0, nullptr) != 0 || setresgid(id, id, id) != 0 || setresuid(id, id, id) != 0) {
    _exit(126);
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // after setresuid, which clears it
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  _exit(127);
}

inline constexpr uint64_t kSeed = 20261130;
inline constexpr uint64_t kRows = 20000;

// A private directory, removed with everything in it at exit.
inline const std::string& TestDir() {
  static std::string dir = [] {
    char tmpl[] = "/tmp/engramd-test-XXXXXX";
    std::string d = mkdtemp(tmpl);
    static std::string cleanup = d;
    atexit([] { std::filesystem::remove_all(cleanup); });
    return d;
  }();
  return dir;
}

// The synthetic checkpoint (layers 1 and 14, kRows rows each), written on first use.
inline const std::string& Checkpoint() {
  static std::string dir = [] {
    std::string d = TestDir() + "/model";
    SynthOptions o{.out_dir = d, .rows = kRows, .seed = kSeed};
    absl::Status s = WriteSyntheticCheckpoint(o);
    if (!s.ok()) {
      fprintf(stderr, "cannot write the synthetic checkpoint: %s\n", s.ToString().c_str());
      abort();
    }
    return d;
  }();
  return dir;
}

inline std::string EngramdPath() {
  const char* p = getenv("ENGRAMD");
  return p != nullptr ? p : "daemon/engramd";
}

// The exit status tools/sanitize.sh gives a process in which ASan, LSan, UBSan or TSan
// reported (exitcode=66 in its *SAN_OPTIONS).
inline constexpr int kSanitizerExitStatus = 66;

inline bool SanitizerReported(int wait_status) {
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == kSanitizerExitStatus;
}

// A daemon that a test stopped and that exited with a sanitizer report ends the test binary
// with the same exit status, wherever the test stopped it (a destructor, possibly at exit,
// cannot fail a test case). _exit, not abort: Catch2's handler for SIGABRT is not
// async-signal-safe, which ThreadSanitizer reports as a second problem.
[[noreturn]] inline void ExitForSanitizerReport(const std::string& log_tail) {
  fprintf(stderr, "engramd exited with a sanitizer report (exit status %d)%s\n%s\n",
          kSanitizerExitStatus,
          log_tail.empty() ? ": see above" : "; its log ends:", log_tail.c_str());
  std::error_code ignored;
  std::filesystem::remove_all(TestDir(), ignored);
  _exit(kSanitizerExitStatus);
}

// engramd as a child process. Stopped (SIGTERM, then SIGKILL) on destruction.
class Daemon {
 public:
  // Serves `model` (default: the synthetic Checkpoint()) on TestDir()/name.sock.
  explicit Daemon(std::vector<std::string> extra_args = {}, std::string name = "main",
                  std::string model = "")
      : socket_(TestDir() + "/" + name + ".sock"),
        model_(std::move(model)),
        extra_(std::move(extra_args)) {
    Start();
  }
  // Stops it with SIGTERM (SIGKILL after 5 s), so that a sanitizer build runs its exit-time
  // checks; a sanitizer report (its stderr is the test's) ends the test binary.
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      for (int i = 0; i < 500 && waitpid(pid_, &status, WNOHANG) == 0; ++i) usleep(10000);
      if (waitpid(pid_, &status, WNOHANG) == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
      }
      if (SanitizerReported(status)) ExitForSanitizerReport("");
    }
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  void Start() {
    const std::string model = model_.empty() ? Checkpoint() : model_;
    std::vector<std::string> args = {EngramdPath(), "--model", model,         "--socket", socket_,
                                     "--workers",   "2",       "--log-level", "warning"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = fork();
    if (pid_ == 0) {
      // A test that dies without running its destructors must not leave engramd behind: it
      // would hold the test runner's output pipes open and stall the whole suite.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
      _exit(127);
    }
    for (int i = 0; i < 1000; ++i) {
      if (SocketAnswers(socket_)) return;
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        fprintf(stderr, "engramd exited during startup (status %d)\n", status);
        return;
      }
      usleep(10000);
    }
  }

  // Sends `sig` and returns the wait status.
  int Stop(int sig = SIGTERM) {
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    if (SanitizerReported(status)) ExitForSanitizerReport("");
    return status;
  }
  bool alive() const { return pid_ > 0 && kill(pid_, 0) == 0; }
  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }

  engram_connect_options Options(uint64_t data_bytes = 0, uint32_t slots = 0) const {
    engram_connect_options o;
    engram_connect_options_init(&o, sizeof(o));
    o.socket_path = socket_.c_str();
    o.data_bytes = data_bytes;
    o.slots = slots;
    return o;
  }

 private:
  std::string socket_;
  std::string model_;  // empty: Checkpoint()
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
};

// engramctl: ENGRAMCTL (the tests' meson.build sets it), else the build tree's.
inline std::string Engramctl() {
  const char* p = getenv("ENGRAMCTL");
  return p != nullptr ? p : "tools/engramctl/engramctl";
}

// Runs a shell command line; returns its exit status (-1 if it did not exit) and its standard
// output (add " 2>&1" to the line for standard error too).
inline std::pair<int, std::string> RunCommand(const std::string& line) {
  FILE* p = popen(line.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Runs `engramctl COMMAND --json` against `d` and returns its parsed reply. The test case fails
// (showing the command line and the output) unless engramctl exits with status 0.
inline nlohmann::json Ctl(const Daemon& d, const std::string& command) {
  const std::string line = Engramctl() + " " + command + " --json --socket " + d.socket();
  const auto [code, out] = RunCommand(line);
  INFO(line << ": " << out);
  REQUIRE(code == 0);
  return nlohmann::json::parse(out);
}

// Index of the first row of `out` (rows[i] at out + i * 264) that differs from the checkpoint,
// or -1 when every byte matches.
inline int64_t FirstBadRow(uint32_t layer, const uint64_t* rows, uint64_t n, const uint8_t* out,
                           const uint64_t* dest_offsets = nullptr) {
  uint8_t expect[kRowBytes];
  for (uint64_t i = 0; i < n; ++i) {
    SyntheticRow(kSeed, layer, rows[i], expect);
    const uint8_t* got = out + (dest_offsets != nullptr ? dest_offsets[i] : i * kRowBytes);
    if (memcmp(expect, got, kRowBytes) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

// Deterministic pseudo-random rows in [0, limit).
inline void FillRows(uint64_t* rows, uint64_t n, uint64_t limit, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rows[i] = x % limit;
  }
}

// Gathers `ids` of `layer` twice each, `batch` rows a request, from a session of its own (host
// submit), so that a cache-tier engramd admits them and counts them used.
inline void WarmRows(const Daemon& d, uint32_t layer, const std::vector<uint64_t>& ids,
                     uint64_t batch) {
  engram_connect_options o = d.Options(batch * (8 + ENGRAM_ROW_BYTES) + (1 << 20), 8);
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  uint64_t* rows = nullptr;
  uint8_t* dest = nullptr;
  REQUIRE(engram_alloc(s, batch * 8, reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, batch * ENGRAM_ROW_BYTES, reinterpret_cast<void**>(&dest)) == 0);
  for (size_t at = 0; at < ids.size(); at += batch) {
    const uint64_t n = std::min<uint64_t>(batch, ids.size() - at);
    std::copy_n(ids.begin() + at, n, rows);
    engram_gather_request r{
        .size = sizeof(r), .layer = layer, .rows = rows, .num_rows = n, .dest = dest};
    INFO(engram_last_error());
    for (int twice = 0; twice < 2; ++twice) REQUIRE(engram_gather(s, &r, 10'000'000'000) == 0);
  }
  engram_session_close(s);
}

}  // namespace engram::testing
