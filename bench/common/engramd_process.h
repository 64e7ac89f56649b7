// Starting engramd for a benchmark: the binary ($ENGRAMD, or the build tree's) with the
// benchmark's arguments, as a child that dies with the benchmark, and waiting until its socket
// answers.
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
#include <vector>

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

}  // namespace engram::bench
