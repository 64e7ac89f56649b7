// Helpers for the chaos tests: engramd with its log captured, raw protocol clients that say
// exactly the bytes a test wants, control requests, and the daemon's memory and fds.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engram/protocol.h"
#include "testkit/daemon_test_util.h"

namespace engram::testing {

// A private copy of the synthetic checkpoint, which a test may damage.
inline std::string CopyCheckpoint(const std::string& name) {
  const std::string dir = TestDir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::copy(Checkpoint(), dir);
  return dir;
}

// engramd's stderr, captured by starting it with 2> into a file (see StartLogged).
inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// engramd as a child with stderr going to `log_path`; stopped with SIGTERM on destruction.
class LoggedDaemon {
 public:
  LoggedDaemon(const std::string& name, const std::string& model, std::vector<std::string> extra)
      : socket_(TestDir() + "/" + name + ".sock"), log_(TestDir() + "/" + name + ".log") {
    std::vector<std::string> args = {EngramdPath(), "--model",     model, "--socket",
                                     socket_,       "--workers",   "2",   "--log-level",
                                     "info"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    // Up to 30 s: on a loaded 2-core machine, start-up after a kill can take a while.
    for (int i = 0; i < 3000 && !SocketAnswers(socket_) && alive(); ++i) usleep(10000);
  }
  // Stops it with SIGTERM (SIGKILL after 10 s), so that a sanitizer build runs its exit-time
  // checks (leaks); a sanitizer report (kSanitizerExitStatus) ends the test binary with the
  // log's tail printed.
  ~LoggedDaemon() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 1000 && waitpid(pid_, &status, WNOHANG) == 0; ++i) usleep(10'000);
    if (waitpid(pid_, &status, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
    if (SanitizerReported(status)) {
      const std::string log = Log();
      ExitForSanitizerReport(log.substr(log.size() > 8000 ? log.size() - 8000 : 0));
    }
  }
  bool alive() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }
  std::string Log() const { return ReadFile(log_); }
  engram_connect_options Options() const {
    engram_connect_options o;
    engram_connect_options_init(&o, sizeof(o));
    o.socket_path = socket_.c_str();
    o.data_bytes = 4 << 20;
    return o;
  }

 private:
  std::string socket_;
  std::string log_;
  pid_t pid_ = -1;
};

inline int ConnectRaw(const std::string& socket_path) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline engram_msg_hello MakeHello(const std::string& name) {
  engram_msg_hello hello{};
  hello.header = {.magic = ENGRAM_MSG_MAGIC,
                  .type = ENGRAM_MSG_HELLO,
                  .reserved = 0,
                  .bytes = sizeof(hello),
                  .request_id = 1};
  hello.version_major = ENGRAM_PROTOCOL_MAJOR;
  hello.data_bytes = 1 << 20;
  memcpy(hello.client_name, name.data(), std::min(name.size(), sizeof(hello.client_name) - 1));
  return hello;
}

// Receives one message; closes any fds that came with it. Returns its bytes ("" on EOF/error
// or after `timeout_ms`). A memfd that came with it is read instead (large control replies).
inline std::string RecvMessage(int fd, int timeout_ms = 5000) {
  pollfd p{.fd = fd, .events = POLLIN};
  if (poll(&p, 1, timeout_ms) <= 0) return "";
  std::vector<char> buf(ENGRAM_MSG_MAX_BYTES);
  iovec iov{buf.data(), buf.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  if (n <= 0) return "";
  std::string body(buf.data(), static_cast<size_t>(n));
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int passed;
      memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      engram_msg_header h;
      memcpy(&h, body.data(), sizeof(h));
      if (h.type == ENGRAM_MSG_CONTROL_REPLY) {
        struct stat st;
        fstat(passed, &st);
        std::string text(static_cast<size_t>(st.st_size), '\0');
        (void)!pread(passed, text.data(), text.size(), 0);
        body = body.substr(0, sizeof(h)) + text;
      }
      close(passed);
    }
  }
  return body;
}

// A raw session: HELLO with `name` (any bytes), WELCOME received (its fds closed at once).
// fd() < 0 when the daemon did not welcome it.
class RawSession {
 public:
  RawSession(const std::string& socket_path, const std::string& name) {
    fd_ = ConnectRaw(socket_path);
    if (fd_ < 0) return;
    engram_msg_hello hello = MakeHello(name);
    send(fd_, &hello, sizeof(hello), MSG_NOSIGNAL);
    const std::string welcome = RecvMessage(fd_);
    engram_msg_header h{};
    if (welcome.size() >= sizeof(h)) memcpy(&h, welcome.data(), sizeof(h));
    if (h.type != ENGRAM_MSG_WELCOME) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~RawSession() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }
  // Sends a control request; returns the reply body (JSON), or "ERROR: message".
  std::string Control(const std::string& json) {
    std::string msg(sizeof(engram_msg_header), '\0');
    engram_msg_header h{.magic = ENGRAM_MSG_MAGIC,
                        .type = ENGRAM_MSG_CONTROL,
                        .reserved = 0,
                        .bytes = static_cast<uint32_t>(sizeof(h) + json.size()),
                        .request_id = 7};
    memcpy(msg.data(), &h, sizeof(h));
    msg += json;
    if (send(fd_, msg.data(), msg.size(), MSG_NOSIGNAL) < 0) return "ERROR: send failed";
    const std::string reply = RecvMessage(fd_);
    if (reply.size() < sizeof(h)) return "ERROR: no reply";
    memcpy(&h, reply.data(), sizeof(h));
    if (h.type == ENGRAM_MSG_ERROR) {
      engram_msg_error e;
      memcpy(&e, reply.data(), sizeof(e));
      return "ERROR: " + reply.substr(sizeof(e), e.message_bytes);
    }
    return reply.substr(sizeof(h));
  }

 private:
  int fd_ = -1;
};

// The daemon's resident memory (kB) and open fds.
inline uint64_t RssKb(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}
inline std::string FdList(pid_t pid) {
  std::string out;
  for (const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    std::error_code ec;
    out += e.path().filename().string() + "->" +
           std::filesystem::read_symlink(e.path(), ec).string() + " ";
  }
  return out;
}
inline size_t OpenFds(pid_t pid) {
  size_t n = 0;
  for (const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

}  // namespace engram::testing
