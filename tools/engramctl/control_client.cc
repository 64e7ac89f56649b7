// engramctl's control connection to engramd (control_client.h).
#include "tools/engramctl/control_client.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "cli/command_line.h"
#include "engram/engram.h"
#include "protocol/codec.h"

namespace engramctl {
namespace {

// Receives one message and at most one passed descriptor, waiting at most timeout_ms.
bool Receive(int fd, int timeout_ms, std::vector<uint8_t>* ret_bytes, int* ret_fd,
             std::string* ret_why) {
  pollfd p{.fd = fd, .events = POLLIN};
  int ready;
  do {
    ready = poll(&p, 1, timeout_ms);
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0) {
    *ret_why = ready == 0 ? absl::StrFormat("no reply within %g s (--timeout)", timeout_ms / 1e3)
                          : strerror(errno);
    return false;
  }
  ret_bytes->resize(ENGRAM_MSG_MAX_BYTES);
  int nfds = 0;
  const ssize_t n =
      engram::protocol::ReceiveMessage(fd, ret_bytes->data(), ret_bytes->size(), ret_fd, 1, &nfds);
  if (n <= 0) {
    *ret_why = n == 0 ? "the daemon closed the connection" : strerror(static_cast<int>(-n));
    return false;
  }
  if (nfds == 0) *ret_fd = -1;
  ret_bytes->resize(static_cast<size_t>(n));
  return true;
}

// A reply that did not fit in a message: its text is in the memfd the daemon passed.
std::string ReadPassedReply(int memfd) {
  std::string body;
  struct stat st;
  if (fstat(memfd, &st) == 0 && st.st_size > 0) {
    body.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < body.size()) {
      const ssize_t n =
          pread(memfd, body.data() + done, body.size() - done, static_cast<off_t>(done));
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    body.resize(done);
  }
  return body;
}

// What an ERROR reply to `command` means for engramctl's caller.
ControlError DaemonRefusal(const std::vector<uint8_t>& bytes, const std::string& command,
                           const std::string& socket_path) {
  engram::protocol::CodecError error;
  engram::protocol::DecodeError(bytes.data(), bytes.size(), &error);
  const bool old = error.code == ENGRAM_STATUS_UNIMPLEMENTED;
  if (error.code == ENGRAM_STATUS_PERMISSION_DENIED) {
    return {kExitNotPermitted,
            absl::StrFormat("engramd on %s: permission denied: %s", socket_path, error.message)};
  }
  return {kExitFailed, old ? absl::StrFormat("engramd on %s does not serve '%s' (an older daemon? "
                                             "upgrade it): %s",
                                             socket_path, command, error.message)
                           : absl::StrFormat("engramd on %s: %s", socket_path, error.message)};
}

}  // namespace

std::string DefaultSocket() {
  const char* env = getenv("ENGRAM_SOCKET");
  return env != nullptr && env[0] != '\0' ? env : ENGRAM_DEFAULT_SOCKET;
}

void AddCommonOptions(CLI::App* command, CommonOptions* options) {
  command->add_option("--socket", options->socket, "engramd's socket ($ENGRAM_SOCKET)")
      ->capture_default_str();
  command
      ->add_option("--timeout", options->timeout_s,
                   absl::StrFormat("Give up waiting on the socket after SECONDS (%g to %g)",
                                   kMinTimeoutSeconds, kMaxTimeoutSeconds))
      ->type_name("SECONDS")
      ->capture_default_str()
      ->check(engram::cli::Seconds(kMinTimeoutSeconds, kMaxTimeoutSeconds));
  command->add_flag("--json", options->json, "Machine-readable output (with schema_version)");
}

int Report(const ControlError& error, bool json) {
  if (json) {
    nlohmann::json j = {
        {"schema_version", 1}, {"error", error.message}, {"exit_code", error.exit_code}};
    if (!error.starting.empty()) {
      j["state"] = "starting";
      j["starting"] = error.starting;
    }
    printf("%s\n", j.dump(2).c_str());
  } else {
    fprintf(stderr, "engramctl: %s\n", error.message.c_str());
  }
  return error.exit_code;
}

// What a failed connect(2) (errno `err`) to engramd's socket means for the operator.
ControlError ConnectError(int err, const std::string& socket_path, double timeout_s) {
  if (err == EAGAIN || err == EWOULDBLOCK) {
    return {kExitUnknown, absl::StrFormat("connecting to %s: no answer within %g s (--timeout); "
                                          "engramd may be overloaded or stopped",
                                          socket_path, timeout_s)};
  }
  if (err == ENOENT || err == ECONNREFUSED) {
    return {kExitNotRunning,
            absl::StrFormat("engramd is not running on %s (%s); check `systemctl status engramd` "
                            "and `journalctl -u engramd`, or pass --socket",
                            socket_path, strerror(err))};
  }
  if (err == EACCES || err == EPERM) {
    return {kExitUnknown, absl::StrFormat("no permission to connect to %s; join the socket's "
                                          "group (usually 'engram') or run as its owner",
                                          socket_path)};
  }
  return {kExitUnknown, absl::StrFormat("cannot connect to %s: %s", socket_path, strerror(err))};
}

std::unique_ptr<ControlClient> ControlClient::Connect(const std::string& socket_path,
                                                      double timeout_s, ControlError* ret_error) {
  std::unique_ptr<ControlClient> c(new ControlClient());
  c->socket_path_ = socket_path;
  c->timeout_ms_ = static_cast<int>(std::ceil(timeout_s * 1e3));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    *ret_error = {kExitUnknown, absl::StrFormat("socket path '%s' is not usable", socket_path)};
    return nullptr;
  }
  memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  c->fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  // A Unix socket's connect (when the listener's backlog is full) and send wait at most
  // SO_SNDTIMEO; they then fail with EAGAIN.
  const timeval send_timeout{.tv_sec = c->timeout_ms_ / 1000,
                             .tv_usec = c->timeout_ms_ % 1000 * 1000};
  if (c->fd_ >= 0) {
    setsockopt(c->fd_, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
  }
  if (c->fd_ < 0 || connect(c->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    *ret_error = ConnectError(errno, socket_path, timeout_s);
    return nullptr;
  }
  // The smallest session: one slot and one page of data. Control requests need no arena.
  engram_msg_hello hello{};
  engram::protocol::FillHeader(&hello.header, ENGRAM_MSG_HELLO, sizeof(hello), 0);
  hello.version_major = ENGRAM_PROTOCOL_MAJOR;
  hello.version_minor = ENGRAM_PROTOCOL_MINOR;
  hello.slots = 1;
  hello.data_bytes = 4096;
  hello.features = ENGRAM_FEATURES_V1_0;
  hello.pid = static_cast<uint32_t>(getpid());
  snprintf(hello.client_name, sizeof(hello.client_name), "engramctl");
  if (send(c->fd_, &hello, sizeof(hello), MSG_NOSIGNAL) != sizeof(hello)) {
    *ret_error = {kExitUnknown,
                  absl::StrFormat("sending HELLO to %s: %s", socket_path, strerror(errno))};
    return nullptr;
  }
  std::vector<uint8_t> bytes;
  int passed = -1;
  std::string why;
  if (!Receive(c->fd_, c->timeout_ms_, &bytes, &passed, &why)) {
    *ret_error = {kExitUnknown, absl::StrFormat("handshake with %s: %s", socket_path, why)};
    return nullptr;
  }
  if (passed >= 0) close(passed);  // the arena; the doorbell (second fd) was closed by Receive
  engram_msg_welcome welcome;
  engram::protocol::CodecError error;
  if (!engram::protocol::DecodeWelcome(bytes.data(), bytes.size(), &welcome, &error)) {
    // engramd answers "engramd is starting: STEP; retry when it serves" until it serves.
    constexpr std::string_view kStarting = "engramd is starting: ";
    if (error.code == ENGRAM_STATUS_UNAVAILABLE && error.message.rfind(kStarting, 0) == 0) {
      std::string step = error.message.substr(kStarting.size());
      step = step.substr(0, step.find("; retry"));
      *ret_error = {
          kExitNotRunning,
          absl::StrFormat("engramd on %s is starting, not serving yet: %s", socket_path, step),
          step};
      return nullptr;
    }
    // A peer the daemon does not admit at all stays "cannot tell" (4), as when the socket's
    // file mode keeps it out.
    *ret_error = {kExitUnknown, absl::StrFormat("engramd on %s refused engramctl: %s", socket_path,
                                                error.message)};
    return nullptr;
  }
  return c;
}

ControlClient::~ControlClient() {
  if (fd_ >= 0) close(fd_);
}

bool ControlClient::Call(const std::string& command, const nlohmann::json& args,
                         nlohmann::json* ret_reply, ControlError* ret_error) {
  nlohmann::json request = args.is_object() ? args : nlohmann::json::object();
  request["command"] = command;
  const std::string text = request.dump();
  const uint32_t id = next_request_++;
  std::vector<uint8_t> out(sizeof(engram_msg_header) + text.size());
  engram_msg_header h;
  engram::protocol::FillHeader(&h, ENGRAM_MSG_CONTROL, static_cast<uint32_t>(out.size()), id);
  memcpy(out.data(), &h, sizeof(h));
  memcpy(out.data() + sizeof(h), text.data(), text.size());
  if (send(fd_, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size())) {
    *ret_error = {kExitUnknown, absl::StrFormat("sending '%s' to %s: %s", command, socket_path_,
                                                strerror(errno))};
    return false;
  }
  while (true) {
    std::vector<uint8_t> bytes;
    int passed = -1;
    std::string why;
    if (!Receive(fd_, timeout_ms_, &bytes, &passed, &why)) {
      *ret_error = {kExitUnknown, absl::StrFormat("waiting for the reply to '%s' from %s: %s",
                                                  command, socket_path_, why)};
      return false;
    }
    engram_msg_header reply;
    engram::protocol::CodecError error;
    if (!engram::protocol::DecodeHeader(bytes.data(), bytes.size(), &reply, &error)) {
      if (passed >= 0) close(passed);
      *ret_error = {kExitUnknown,
                    absl::StrFormat("bad reply from %s: %s", socket_path_, error.message)};
      return false;
    }
    // A stale reply is skipped; an error about a message the daemon could not read carries
    // request id 0.
    if (reply.request_id != id && !(reply.request_id == 0 && reply.type == ENGRAM_MSG_ERROR)) {
      if (passed >= 0) close(passed);
      continue;
    }
    if (reply.type == ENGRAM_MSG_ERROR) {
      *ret_error = DaemonRefusal(bytes, command, socket_path_);
      return false;
    }
    if (reply.type != ENGRAM_MSG_CONTROL_REPLY) {
      if (passed >= 0) close(passed);
      *ret_error = {kExitUnknown,
                    absl::StrFormat("unexpected reply type %u from %s", reply.type, socket_path_)};
      return false;
    }
    std::string body(reinterpret_cast<const char*>(bytes.data()) + sizeof(reply),
                     bytes.size() - sizeof(reply));
    if (passed >= 0) {  // the reply did not fit in a message: it is in the memfd
      body = ReadPassedReply(passed);
      close(passed);
    }
    *ret_reply = nlohmann::json::parse(body, nullptr, false);
    if (ret_reply->is_discarded() || !ret_reply->is_object()) {
      *ret_error = {kExitUnknown,
                    absl::StrFormat("engramd on %s sent a reply that is not JSON", socket_path_)};
      return false;
    }
    return true;
  }
}

std::string Duration(uint64_t ns) {
  if (ns == 0) return "-";
  if (ns == UINT64_MAX) return ">585y";
  if (ns < 1'000) return absl::StrFormat("%u ns", ns);
  if (ns < 1'000'000) return absl::StrFormat("%.1f µs", double(ns) / 1e3);
  if (ns < 1'000'000'000) return absl::StrFormat("%.1f ms", double(ns) / 1e6);
  return absl::StrFormat("%.2f s", double(ns) / 1e9);
}

}  // namespace engramctl
