// The client socket and metrics port while engramd starts (starting_gate.h).
#include "daemon/ops/starting_gate.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "base/escape.h"
#include "base/log.h"
#include "daemon/ops/notify.h"
#include "daemon/ops/start_checks.h"
#include "engram/protocol.h"
#include "protocol/codec.h"

namespace engram {
namespace {

// A step that lasts is logged again this often.
constexpr uint64_t kProgressLogNs = 10'000'000'000;
// How long the gate waits for a client's HELLO before it answers anyway: a client sends it right
// after connecting, and one that does not only delays the next answer by this much.
constexpr int kHelloWaitMs = 200;

}  // namespace

absl::StatusOr<std::unique_ptr<StartingGate>> StartingGate::Open(UniqueFd listen_fd,
                                                                 std::unique_ptr<SocketClaim> claim,
                                                                 const MetricsOptions& metrics,
                                                                 const std::string& version) {
  std::unique_ptr<StartingGate> gate(new StartingGate());
  gate->version_ = version;
  gate->start_ns_ = gate->step_ns_ = gate->logged_ns_ = NowNs();
  gate->listen_fd_ = std::move(listen_fd);
  // Under socket activation (no path bound) connections wait in the socket's backlog, as
  // systemd means them to, until the server accepts them (Server::Bind checks the socket's
  // type); the gate only logs and reports the steps.
  gate->answer_ = claim != nullptr;
  gate->claim_ = std::move(claim);
  gate->stop_fd_.Reset(eventfd(0, EFD_CLOEXEC));
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  gate->signal_fd_.Reset(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!gate->listen_fd_.valid() || !gate->stop_fd_.valid()) {
    return absl::InternalError(absl::StrFormat("starting: %s", strerror(errno)));
  }
  if (metrics.http_port != 0) {
    StartingGate* g = gate.get();
    auto l = metrics::HttpListener::Start(
        metrics.http_address, static_cast<uint16_t>(metrics.http_port),
        [g] { return g->StartingMetrics(); },
        [g] { return metrics::Health{.ok = false, .reason = g->Message()}; });
    if (l.ok()) {
      gate->http_ = std::move(*l);
      log::Info("metrics on http://{}:{}/metrics (/healthz: 503 until engramd serves)",
                metrics.http_address, gate->http_->port());
    } else {
      log::Warning("{}", WithoutMetricsPort(l.status()));
    }
  }
  gate->thread_ = std::thread([g = gate.get()] { g->Loop(); });
  return gate;
}

StartingGate::~StartingGate() {
  close(TakeSocket());
  claim_.reset();  // after the socket closed: the path goes if it is still this socket
}

int StartingGate::TakeSocket() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    ssize_t ignored = write(stop_fd_.get(), &one, sizeof(one));
    (void)ignored;
    thread_.join();
  }
  signal_fd_.Reset();  // from here on the server's signalfd reads them
  return listen_fd_.Release();
}

void StartingGate::Step(const std::string& what) {
  const uint64_t now = NowNs();
  {
    std::lock_guard lock(mu_);
    step_ = what;
    step_ns_ = logged_ns_ = now;
  }
  log::Info("starting ({:.1f} s): {}", Elapsed(), what);
  notify::Send(absl::StrFormat("EXTEND_TIMEOUT_USEC=%u\nSTATUS=Starting: %s",
                               uint64_t{300} * 1'000'000, EscapeBytes(what)));
}

double StartingGate::Elapsed() const { return double(NowNs() - start_ns_) / 1e9; }

std::string StartingGate::Message() const {
  std::lock_guard lock(mu_);
  return absl::StrFormat("engramd is starting: %s (%.0f s); retry when it serves", step_,
                         double(NowNs() - step_ns_) / 1e9);
}

std::string StartingGate::StartingMetrics() const {
  metrics::Exposition e;
  e.Gauge("engram_up", "1 while engramd serves", {}, 0);
  e.Gauge("engram_build_info", "engramd version and protocol",
          {{"version", version_},
           {"protocol", absl::StrFormat("%u.%u", ENGRAM_PROTOCOL_MAJOR, ENGRAM_PROTOCOL_MINOR)}},
          1);
  metrics::AppendProcessMetrics(e);
  return e.Text();
}

void StartingGate::LogProgress(uint64_t now) {
  std::string step;
  uint64_t since = 0;
  {
    std::lock_guard lock(mu_);
    if (now - logged_ns_ < kProgressLogNs) return;
    logged_ns_ = now;
    step = step_;
    since = now - step_ns_;
  }
  log::Notice("still starting ({:.0f} s): {} for {:.0f} s", Elapsed(), step, double(since) / 1e9);
}

void StartingGate::Loop() {
  while (true) {
    pollfd fds[3] = {{.fd = answer_ ? listen_fd_.get() : -1, .events = POLLIN},
                     {.fd = stop_fd_.get(), .events = POLLIN},
                     {.fd = signal_fd_.get(), .events = POLLIN}};
    if (poll(fds, 3, 1000) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    if (signalfd_siginfo info{};
        fds[2].revents != 0 && read(signal_fd_.get(), &info, sizeof(info)) == sizeof(info)) {
      std::lock_guard lock(mu_);
      log::Notice("received {} while starting; stopping once '{}' ends", strsignal(info.ssi_signo),
                  step_);
      stop_signal_.store(static_cast<int>(info.ssi_signo));
    }
    LogProgress(NowNs());
    if (fds[0].revents == 0) continue;
    const int fd = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) Answer(fd);
  }
}

void StartingGate::Answer(int fd) {
  // The reply follows the HELLO, so that the client, which sends first, finds it.
  pollfd p{.fd = fd, .events = POLLIN};
  uint32_t request_id = 0;
  if (poll(&p, 1, kHelloWaitMs) > 0) {
    uint8_t buf[ENGRAM_MSG_MAX_BYTES];
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    engram_msg_header header;
    protocol::CodecError ignored;
    if (n > 0 && protocol::DecodeHeader(buf, static_cast<size_t>(n), &header, &ignored)) {
      request_id = header.request_id;
    }
  }
  const std::vector<uint8_t> e =
      protocol::EncodeError(ENGRAM_STATUS_UNAVAILABLE, Message(), request_id);
  send(fd, e.data(), e.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  close(fd);
}

}  // namespace engram
