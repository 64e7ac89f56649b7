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

namespace engram::bench {

// $ENGRAMD, else `fallback` (the binary's place in the build tree).
inline std::string EngramdPath(const std::string& fallback) {
  const char* env = std::getenv("ENGRAMD");
  return env != nullptr && env[0] != '\0' ? env : fallback;
}

// Whether engramd serves on the Unix socket `path`: a starting engramd accepts already and
// answers every HELLO with UNAVAILABLE. A HELLO of a protocol version no daemon speaks is refused
// at once either way, without making a session; only a serving one refuses it for the version.
inline bool SocketAnswers(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  engram_msg_hello hello{};
  hello.header.magic = ENGRAM_MSG_MAGIC;
  hello.header.type = ENGRAM_MSG_HELLO;
  hello.header.bytes = sizeof(hello);
  hello.version_major = 0xffff;
  ok = ok && send(fd, &hello, sizeof(hello), MSG_NOSIGNAL) == sizeof(hello);
  pollfd p{.fd = fd, .events = POLLIN};
  uint8_t reply[512];
  const ssize_t n = ok && poll(&p, 1, 5000) == 1 ? recv(fd, reply, sizeof(reply), 0) : -1;
  close(fd);
  engram_msg_error error{};
  if (n < static_cast<ssize_t>(sizeof(error))) return false;
  memcpy(&error, reply, sizeof(error));
  return error.header.type == ENGRAM_MSG_ERROR && error.code != ENGRAM_STATUS_UNAVAILABLE;
}

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
