// engramd's start as clients see it (daemon/ops/starting_gate.h): the socket and the metrics port
// answer from the first second with the step in progress, through the client library, engramctl
// and /healthz, and the socket is handed over with the connections waiting on it.
#include "daemon/ops/starting_gate.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "daemon/server/server.h"
#include "testkit/daemon_test_util.h"

namespace engram::testing {
namespace {

uint16_t FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::string HttpGet(uint16_t port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
  REQUIRE(send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[8192];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST_CASE("while engramd starts, clients, engramctl and /healthz hear the step", "[ops]") {
  ServerConfig config;
  config.socket_path = TestDir() + "/gate.sock";
  MetricsOptions metrics;
  metrics.http_port = FreePort();
  absl::StatusOr<BoundSocket> bound = BindClientSocket(config);
  REQUIRE(bound.ok());
  auto gate = StartingGate::Open(std::move(bound->fd), std::move(bound->claim), metrics, "9.9.9");
  REQUIRE(gate.ok());
  const std::string step = "building the row store: row cache up to 48.00 GiB";
  (*gate)->Step(step);

  engram_connect_options o;
  engram_connect_options_init(&o, sizeof(o));
  o.socket_path = config.socket_path.c_str();
  engram_session* s = nullptr;
  CHECK(engram_session_open(&o, &s) == -ENOTCONN);
  const std::string error = engram_last_error();
  CHECK(error.find("engramd is starting: " + step + " (") != std::string::npos);
  CHECK(error.find("retry when it serves") != std::string::npos);
  CHECK_FALSE(SocketAnswers(config.socket_path));

  auto [code, out] = RunCommand(Engramctl() + " status --json --socket " + config.socket_path);
  CHECK(code == 3);
  const nlohmann::json j = nlohmann::json::parse(out);
  CHECK(j["state"] == "starting");
  CHECK(j["starting"].get<std::string>().rfind(step + " (", 0) == 0);
  CHECK(j["exit_code"] == 3);
  auto [text_code, text] =
      RunCommand(Engramctl() + " status --socket " + config.socket_path + " 2>&1");
  CHECK(text_code == 3);
  CHECK(text.find("is starting, not serving yet: " + step) != std::string::npos);

  const std::string health = HttpGet(static_cast<uint16_t>(metrics.http_port), "/healthz");
  CHECK(health.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0) == 0);
  CHECK(health.find("engramd is starting: " + step) != std::string::npos);
  const std::string scrape = HttpGet(static_cast<uint16_t>(metrics.http_port), "/metrics");
  CHECK(scrape.find("\nengram_up 0\n") != std::string::npos);
  CHECK(scrape.find("engram_build_info{version=\"9.9.9\"") != std::string::npos);
  CHECK(scrape.find("\nprocess_open_fds ") != std::string::npos);

  // Handed over: a client that connects now waits in the backlog for the server, unanswered.
  const int listen_fd = (*gate)->TakeSocket();
  REQUIRE(listen_fd >= 0);
  int client = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", config.socket_path.c_str());
  CHECK(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  pollfd p{.fd = client, .events = POLLIN};
  CHECK(poll(&p, 1, 300) == 0);
  const int accepted = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  CHECK(accepted >= 0);
  close(accepted);
  close(client);
  close(listen_fd);
  // The gate bound the path: it unlinks it when it goes.
  gate->reset();
  CHECK_FALSE(std::filesystem::exists(config.socket_path));
}

TEST_CASE("a SIGTERM while engramd starts is kept for the end of the step", "[ops]") {
  // As engramd does before it opens the gate: the signals are read through signalfds.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  REQUIRE(pthread_sigmask(SIG_BLOCK, &mask, nullptr) == 0);
  ServerConfig config;
  config.socket_path = TestDir() + "/gate-term.sock";
  absl::StatusOr<BoundSocket> bound = BindClientSocket(config);
  REQUIRE(bound.ok());
  auto gate =
      StartingGate::Open(std::move(bound->fd), std::move(bound->claim), MetricsOptions{}, "9.9.9");
  REQUIRE(gate.ok());
  CHECK_FALSE((*gate)->stop_requested());
  REQUIRE(kill(getpid(), SIGTERM) == 0);
  for (int i = 0; i < 300 && !(*gate)->stop_requested(); ++i) usleep(10'000);
  CHECK((*gate)->stop_requested());
  // Taken over, the gate reads no more signals: a later one stays pending for the server.
  close((*gate)->TakeSocket());
  REQUIRE(kill(getpid(), SIGINT) == 0);
  sigset_t pending;
  sigpending(&pending);
  CHECK(sigismember(&pending, SIGINT) == 1);
  timespec none{};
  CHECK(sigtimedwait(&mask, nullptr, &none) == SIGINT);  // taken, so that it does not linger
}

TEST_CASE("a socket systemd passed is left to its backlog and its path kept", "[ops]") {
  ServerConfig config;
  config.socket_path = TestDir() + "/gate-activated.sock";
  absl::StatusOr<BoundSocket> listening = BindClientSocket(config);  // as systemd would bind it
  REQUIRE(listening.ok());
  auto gate =
      StartingGate::Open(std::move(listening->fd), /*claim=*/nullptr, MetricsOptions{}, "9.9.9");
  REQUIRE(gate.ok());
  (*gate)->Step("opening the tables");
  // Not answered: the client waits in the backlog for the server, as socket activation means.
  int client = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", config.socket_path.c_str());
  REQUIRE(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  pollfd p{.fd = client, .events = POLLIN};
  CHECK(poll(&p, 1, 300) == 0);
  close(client);
  // The path belongs to systemd's socket unit: the gate leaves it when it goes.
  gate->reset();
  CHECK(std::filesystem::exists(config.socket_path));
  unlink(config.socket_path.c_str());
}

// A socket listening at `path`, bound without a claim (as another process would bind it).
UniqueFd ListenAt(const std::string& path) {
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  REQUIRE(bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(fd.get(), 8) == 0);
  return fd;
}

TEST_CASE("a released claim removes the socket path only while it is still the socket bound",
          "[ops]") {
  ServerConfig config;
  config.socket_path = TestDir() + "/claim-own.sock";
  absl::StatusOr<BoundSocket> bound = BindClientSocket(config);
  REQUIRE(bound.ok());
  REQUIRE(bound->claim != nullptr);
  // Someone else's socket took the path meanwhile: releasing the claim leaves it.
  bound->fd.Reset();
  REQUIRE(unlink(config.socket_path.c_str()) == 0);
  UniqueFd other = ListenAt(config.socket_path);
  bound->claim.reset();
  CHECK(SocketClaim::Answers(config.socket_path));
  // Its own socket still at the path goes with the claim.
  other.Reset();
  unlink(config.socket_path.c_str());
  absl::StatusOr<BoundSocket> again = BindClientSocket(config);
  REQUIRE(again.ok());
  again->claim.reset();
  CHECK_FALSE(std::filesystem::exists(config.socket_path));
}

TEST_CASE("a claim held by a serving daemon refuses a start; a stopping one's is waited for",
          "[ops]") {
  ServerConfig config;
  config.socket_path = TestDir() + "/claim-wait.sock";
  absl::StatusOr<BoundSocket> first = BindClientSocket(config);
  REQUIRE(first.ok());
  const std::string pid = "pid " + std::to_string(getpid());
  // It goes on answering: refused (after the 2 s a daemon told to stop has to stop answering),
  // naming the holder's pid.
  absl::StatusOr<std::unique_ptr<SocketClaim>> serving =
      SocketClaim::Take(config.socket_path, 60'000'000'000);
  REQUIRE_FALSE(serving.ok());
  CHECK(serving.status().code() == absl::StatusCode::kAlreadyExists);
  CHECK(serving.status().message().find(pid) != std::string::npos);
  // Stopping (no longer listening, the path and the claim still held): waited for, up to a
  // bound, then named.
  first->fd.Reset();
  absl::StatusOr<std::unique_ptr<SocketClaim>> stopping =
      SocketClaim::Take(config.socket_path, 100'000'000);
  REQUIRE_FALSE(stopping.ok());
  CHECK(stopping.status().code() == absl::StatusCode::kUnavailable);
  CHECK(stopping.status().message().find(pid) != std::string::npos);
  CHECK(stopping.status().message().find(".lock") != std::string::npos);
  // The stopping daemon lets go while the next start waits: that start binds, and the path it
  // bound is still there after the old claim went.
  std::thread release([&] {
    usleep(200'000);
    first->claim.reset();
  });
  absl::StatusOr<BoundSocket> next = BindClientSocket(config);
  release.join();
  REQUIRE(next.ok());
  CHECK(SocketClaim::Answers(config.socket_path));
}

}  // namespace
}  // namespace engram::testing
