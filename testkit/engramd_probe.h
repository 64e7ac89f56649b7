// Whether engramd serves on a Unix socket, for tests and benchmarks alike (no test framework:
// benchmarks include it too).
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "engram/protocol.h"

namespace engram::testing {

// Does engramd serve on `socket` right now? While it starts, its socket already accepts and
// answers every HELLO with UNAVAILABLE ("engramd is starting: ..."). The probe sends a HELLO of
// a protocol version no daemon speaks: a starting engramd answers UNAVAILABLE, a serving one
// refuses the version; neither makes a session.
inline bool SocketAnswers(const std::string& socket_path) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_path.c_str());
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

}  // namespace engram::testing
