// Starting engramd for a benchmark: the binary ($ENGRAMD, or the build tree's) with the
// benchmark's arguments, as a child that dies with the benchmark, and waiting until its socket
// answers; a session on it; stopping it.
//
//   engram::bench::EngramdProcess daemon(model, dir + "/bench.sock", {"--tier", "1=cache"});
//   if (!daemon.ok()) return 1;                       // why is printed
//   engram_connect_options co;
//   engram_connect_options_init(&co, sizeof(co));
//   co.data_bytes = 64 << 20;
//   engram_session* s = daemon.Connect(co);           // null: engram_last_error() says why
//   ...                                               // ~EngramdProcess: SIGTERM, then waits
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "engram/engram.h"
#include "engram/protocol.h"
#include "testkit/engramd_probe.h"

namespace engram::bench {

// $ENGRAMD, else `fallback` (the binary's place in the build tree).
inline std::string EngramdPath(const std::string& fallback) {
  const char* env = std::getenv("ENGRAMD");
  return env != nullptr && env[0] != '\0' ? env : fallback;
}

using engram::testing::SocketAnswers;  // testkit/engramd_probe.h

// Starts args[0] with `args` and waits up to `timeout_ms` for `socket` to answer. The child is
// killed if the benchmark dies. Returns its pid, or -1 with a message naming the binary when it
// could not be started, exited first, or never answered.
inline pid_t StartEngramd(std::vector<std::string> args, const std::string& socket,
                          int timeout_ms = 30'000) {
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    fprintf(stderr, "exec %s: %s (set ENGRAMD)\n", argv[0], strerror(errno));
    _exit(127);
  }
  for (int waited = 0; !SocketAnswers(socket); waited += 10) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      fprintf(stderr, "engramd (%s) exited with status %d before it answered on %s\n",
              args[0].c_str(), WIFEXITED(status) ? WEXITSTATUS(status) : -1, socket.c_str());
      return -1;
    }
    if (waited >= timeout_ms) {
      fprintf(stderr, "engramd (%s) did not answer on %s within %d ms\n", args[0].c_str(),
              socket.c_str(), timeout_ms);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return -1;
    }
    usleep(10'000);
  }
  return pid;
}

// The command line a benchmark serves a model with: the binary (EngramdPath), the model folder,
// the socket and the log at warning level, then the benchmark's own `flags` (tiers, cache size,
// limits).
inline std::vector<std::string> EngramdCommand(const std::string& model, const std::string& socket,
                                               const std::vector<std::string>& flags) {
  std::vector<std::string> args = {EngramdPath("build/daemon/engramd"),
                                   "--model",
                                   model,
                                   "--socket",
                                   socket,
                                   "--log-level",
                                   "warning"};
  args.insert(args.end(), flags.begin(), flags.end());
  return args;
}

// engram_table_map_open of `layer`, asked again every 20 ms for up to `timeout_ms` while the
// table is still loading (-EAGAIN): 0, or the last -errno (engram_last_error() says why).
inline int MapTableWhenLoaded(engram_session* s, uint32_t layer, engram_table_map** ret_map,
                              int timeout_ms = 60'000) {
  int rc = engram_table_map_open(s, layer, ret_map);
  for (int waited = 0; rc == -EAGAIN && waited < timeout_ms; waited += 20) {
    usleep(20'000);
    rc = engram_table_map_open(s, layer, ret_map);
  }
  return rc;
}

// engramd serving a model for a benchmark (EngramdCommand, StartEngramd), stopped with SIGTERM
// and waited for when it goes out of scope or at Stop().
class EngramdProcess {
 public:
  // Starts engramd and waits up to `timeout_ms` for it to serve; ok() is false (with the reason
  // printed) when it did not.
  EngramdProcess(const std::string& model, std::string socket,
                 const std::vector<std::string>& flags, int timeout_ms = 30'000)
      : socket_(std::move(socket)),
        pid_(StartEngramd(EngramdCommand(model, socket_, flags), socket_, timeout_ms)) {}
  ~EngramdProcess() { Stop(); }
  EngramdProcess(const EngramdProcess&) = delete;
  EngramdProcess& operator=(const EngramdProcess&) = delete;

  bool ok() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }

  // A session on the socket with `options` (socket_path is set here), trying again every 20 ms
  // for up to `timeout_ms` while engramd refuses it. Null when it never connected:
  // engram_last_error() says why.
  engram_session* Connect(engram_connect_options options, int timeout_ms = 10'000) const {
    options.socket_path = socket_.c_str();
    engram_session* s = nullptr;
    for (int waited = 0; engram_session_open(&options, &s) != 0 && waited < timeout_ms;
         waited += 20) {
      usleep(20'000);
    }
    return s;
  }

  // SIGTERM, then waits for it to exit: its wait status (0 when it was not running).
  int Stop() {
    int status = 0;
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
    return status;
  }

 private:
  std::string socket_;
  pid_t pid_;
};

}  // namespace engram::bench
