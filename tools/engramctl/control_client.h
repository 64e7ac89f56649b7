// engramctl's connection to engramd for control requests: the handshake with the smallest
// arena the daemon grants, then JSON requests and replies (ENGRAM_MSG_CONTROL). Failures carry
// the exit code `systemctl status` would use and a message naming the socket and what to check.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "tools/engramctl/text_table.h"  // Bytes, for the commands

namespace engramctl {

// Exit codes, as systemctl status uses them; and one for a request only administrators may make.
inline constexpr int kExitRunning = 0;
inline constexpr int kExitFailed = 1;      // the daemon answered with an error
inline constexpr int kExitNotRunning = 3;  // no daemon on the socket, or one still starting
inline constexpr int kExitUnknown = 4;     // cannot tell: no permission, protocol trouble
// The daemon refused the request: the caller is not one of its administrators (warm, evict).
// sysexits.h's EX_NOPERM, so scripts can tell it from a failed request.
inline constexpr int kExitNotPermitted = 77;

struct ControlError {
  int exit_code = kExitFailed;
  std::string message;
  // The daemon is starting and serves nothing yet: the step it is at ("building the row cache
  // (12 s)"); empty otherwise.
  std::string starting;
};

class ControlClient {
 public:
  // Connects and runs the handshake. Connecting, each send and each wait for a reply give up
  // after timeout_s (kExitUnknown: a socket that accepts but never answers). nullptr with
  // *ret_error on failure.
  static std::unique_ptr<ControlClient> Connect(const std::string& socket_path, double timeout_s,
                                                ControlError* ret_error);
  ~ControlClient();
  // Sends {"command": command, ...args} and returns the reply object, or false with *ret_error
  // (the daemon's message for a refused request).
  bool Call(const std::string& command, const nlohmann::json& args, nlohmann::json* ret_reply,
            ControlError* ret_error);
  const std::string& socket_path() const { return socket_path_; }

 private:
  ControlClient() = default;
  int fd_ = -1;
  uint32_t next_request_ = 1;
  int timeout_ms_ = 30'000;
  std::string socket_path_;
};

// The socket engramctl talks to: --socket, else $ENGRAM_SOCKET, else the daemon's default.
std::string DefaultSocket();

// --timeout: how long engramctl waits on the socket (connect, each send, each reply), and its
// bounds.
inline constexpr double kDefaultTimeoutSeconds = 30;
inline constexpr double kMinTimeoutSeconds = 0.1;
inline constexpr double kMaxTimeoutSeconds = 86400;

// Options every daemon command takes.
struct CommonOptions {
  std::string socket = DefaultSocket();
  double timeout_s = kDefaultTimeoutSeconds;
  bool json = false;
};
void AddCommonOptions(CLI::App* command, CommonOptions* options);

// Prints the error (to stderr, or as JSON on stdout with --json) and returns its exit code.
int Report(const ControlError& error, bool json);

// "850 µs", "1.2 ms".
std::string Duration(uint64_t ns);

}  // namespace engramctl
