// The engramd server: socket, handshake, ring polling and request dispatch (see server.h).
#include "daemon/server/server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/escape.h"
#include "daemon/server/pace.h"
#include "base/clock.h"

namespace engram {
namespace {

// epoll data tags of the control loop; session sockets are tagged by their fd (>= 0 … < 2^31).
constexpr uint64_t kTagListen = uint64_t{1} << 40;
constexpr uint64_t kTagStop = kTagListen + 1;
constexpr uint64_t kTagSignal = kTagListen + 2;
constexpr uint64_t kTagLease = kTagListen + 3;
constexpr uint64_t kTagInotify = kTagListen + 4;
// How often the table files are re-stat'ed (TableWatch::Recheck) besides leases and inotify.
constexpr uint64_t kRecheckNs = 1'000'000'000;
// The poller's kick eventfd; session doorbells are tagged by session id (from 1).
constexpr uint64_t kTagKick = 0;

// A device cannot ring a doorbell, so while a device-submitting session is open the poller
// spins; once none of them has submitted for kDeviceIdleNs it sleeps instead, in timed sleeps
// of kDeviceNapMinNs growing to kDeviceNapMaxNs, and spins again at the next submission. The
// first submission after such an idle spell waits at most kDeviceNapMaxNs (plus the thread's
// 10 us timer slack) longer than it would on a spinning poller (docs/gpu.md).
constexpr uint64_t kDeviceIdleNs = 50'000'000;
constexpr uint64_t kDeviceNapMinNs = 50'000;
constexpr uint64_t kDeviceNapMaxNs = 1'000'000;

// Connections that have not sent HELLO yet, per uid and in all (PendingHandshakes). A client
// sends HELLO right after connecting, so only a peer that holds connections open without
// speaking ever gets near these.
constexpr size_t kMaxPendingHandshakes = 256;
constexpr size_t kMaxPendingHandshakesPerUid = 32;

// A client that does not read its replies loses them (SendMessage never blocks): the daemon
// never waits on one.
void SendBytes(int fd, const void* data, size_t size) {
  (void)protocol::SendMessage(fd, data, size, nullptr, 0);
}

}  // namespace

std::vector<gid_t> PeerGroups(int fd) {
  std::vector<gid_t> groups(64);
  while (true) {
    socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      return groups;
    }
    // ERANGE: `len` now holds the size needed (a peer may be in up to 65536 groups).
    if (errno != ERANGE || len / sizeof(gid_t) <= groups.size()) return {};
    groups.resize(len / sizeof(gid_t));
  }
}

Server::Server() : pending_(kMaxPendingHandshakes, kMaxPendingHandshakesPerUid) {}

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const ServerConfig& config,
                                                       std::vector<std::unique_ptr<Table>> tables,
                                                       std::unique_ptr<GatherEngine> engine,
                                                       const MakeControl& make_control) {
  std::unique_ptr<Server> server(new Server());
  server->config_ = config;
  server->own_uid_ = geteuid();
  std::sort(tables.begin(), tables.end(),
            [](const auto& a, const auto& b) { return a->layer_id() < b->layer_id(); });
  server->tables_ = std::move(tables);
  for (const auto& t : server->tables_) {
    server->bounds_.push_back({.layer_id = t->layer_id(),
                               .num_rows = t->num_rows(),
                               .covered_begin = t->covered().begin,
                               .covered_end = t->covered().end});
  }
  server->engine_ = std::move(engine);
  const uint32_t request_threads = config.request_threads != 0
                                       ? config.request_threads
                                       : DefaultRequestThreads(std::thread::hardware_concurrency());
  server->requests_ = std::make_unique<RequestPool>(request_threads, config.poll.spin_min_ns);
  // Requests larger than a decode step (prefill) get their own threads, so that however many of
  // them are in flight, decode steps always find a request thread free.
  server->large_requests_ =
      std::make_unique<RequestPool>(std::max<uint32_t>(1, request_threads / 2), /*spin_ns=*/0);
  server->control_epoll_.Reset(epoll_create1(EPOLL_CLOEXEC));
  server->poller_epoll_.Reset(epoll_create1(EPOLL_CLOEXEC));
  server->kick_fd_.Reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  server->stop_fd_.Reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!server->control_epoll_.valid() || !server->poller_epoll_.valid() ||
      !server->kick_fd_.valid() || !server->stop_fd_.valid()) {
    return absl::InternalError(absl::StrFormat("epoll/eventfd: %s", strerror(errno)));
  }
  epoll_event ev{.events = EPOLLIN, .data = {.u64 = kTagKick}};
  epoll_ctl(server->poller_epoll_.get(), EPOLL_CTL_ADD, server->kick_fd_.get(), &ev);
  ev.data.u64 = kTagStop;
  epoll_ctl(server->control_epoll_.get(), EPOLL_CTL_ADD, server->stop_fd_.get(), &ev);
  if (absl::Status s = server->Bind(); !s.ok()) return s;
  server->start_ns_ = NowNs();
  server->control_ = make_control(server.get());
  return server;
}

Server::~Server() {
  control_.reset();  // its metrics listener reads the sessions and the engine
  if (poller_.joinable()) {
    draining_.store(true);
    Kick();
    poller_.join();
  }
  if (listen_fd_.valid()) {
    listen_fd_.Reset();
    if (config_.listen_fd < 0) unlink(config_.socket_path.c_str());
  }
  for (int fd : pending_.TakeAll()) close(fd);
  // The epoll, eventfd and signalfd descriptors close with their UniqueFd members.
}

namespace {

// Socket activation: systemd bound and listens; check it is the kind of socket we serve.
absl::Status CheckActivatedSocket(int fd) {
  int type = 0;
  socklen_t len = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_SEQPACKET) {
    return absl::FailedPreconditionError(
        "the socket passed by systemd is not a SOCK_SEQPACKET Unix socket "
        "(engramd.socket needs ListenSequentialPacket=)");
  }
  return absl::OkStatus();
}

// Makes the socket's directory if it is missing, and clears a stale socket a dead daemon left
// at `path`; refuses a path that is not a socket or where another engramd answers.
absl::Status PrepareSocketPath(const std::string& path, const sockaddr_un& addr) {
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    struct stat st;
    if (stat(dir.c_str(), &st) < 0 && (errno != ENOENT || mkdir(dir.c_str(), 0755) < 0)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "socket directory '%s' does not exist and cannot be created: %s", dir, strerror(errno)));
    }
  }
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("'%s' exists and is not a socket; refusing to replace it", path));
  }
  UniqueFd probe(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (probe.valid() &&
      connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
    return absl::AlreadyExistsError(
        absl::StrFormat("another engramd is serving on '%s'; stop it first", path));
  }
  unlink(path.c_str());  // a stale socket of a daemon that died
  return absl::OkStatus();
}

// socket.mode and socket.group on the bound socket.
absl::Status SetSocketAccess(const std::string& path, mode_t mode, const std::string& group_name) {
  if (chmod(path.c_str(), mode) < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot set mode %04o on '%s': %s", mode, path, strerror(errno)));
  }
  if (group_name.empty()) return absl::OkStatus();
  group* g = getgrnam(group_name.c_str());
  if (g == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("socket group '%s' does not exist", group_name));
  }
  if (chown(path.c_str(), static_cast<uid_t>(-1), g->gr_gid) < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot give '%s' to group '%s': %s", path, group_name, strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<UniqueFd> BindClientSocket(const ServerConfig& config) {
  const std::string& path = config.socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "socket path '%s' is empty or longer than %d bytes", path, sizeof(addr.sun_path) - 1));
  }
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (absl::Status s = PrepareSocketPath(path, addr); !s.ok()) return s;
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrFormat("socket(AF_UNIX): %s", strerror(errno)));
  }
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot bind '%s': %s", path, strerror(errno)));
  }
  if (absl::Status s = SetSocketAccess(path, config.socket_mode, config.socket_group); !s.ok()) {
    return s;
  }
  if (listen(fd.get(), 128) < 0) {
    return absl::InternalError(absl::StrFormat("listen on '%s': %s", path, strerror(errno)));
  }
  return fd;
}

absl::Status Server::Bind() {
  if (config_.listen_fd >= 0) {
    if (absl::Status s = CheckActivatedSocket(config_.listen_fd); !s.ok()) return s;
    listen_fd_.Reset(config_.listen_fd);
    fcntl(listen_fd_.get(), F_SETFL, fcntl(listen_fd_.get(), F_GETFL) | O_NONBLOCK);
  } else {
    absl::StatusOr<UniqueFd> fd = BindClientSocket(config_);
    if (!fd.ok()) return fd.status();
    listen_fd_ = std::move(*fd);
  }
  epoll_event ev{.events = EPOLLIN, .data = {.u64 = kTagListen}};
  epoll_ctl(control_epoll_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev);
  return absl::OkStatus();
}

void Server::Stop() {
  const uint64_t one = 1;
  ssize_t ignored = write(stop_fd_.get(), &one, sizeof(one));
  (void)ignored;
}

void Server::Kick() {
  const uint64_t one = 1;
  ssize_t ignored = write(kick_fd_.get(), &one, sizeof(one));
  (void)ignored;
}

absl::Status Server::TableHealth(size_t index) const {
  return watch_ != nullptr ? watch_->Check(index) : absl::OkStatus();
}

absl::StatusOr<ResidentLoadStatus> Server::ResidentLoad(uint32_t layer,
                                                        LoadAction action) const {
  if (store_ == nullptr) {
    return absl::FailedPreconditionError(
        "engramd serves every table from storage: no table is of the resident tier ([tables] "
        "tiers, --tier LAYER=resident)");
  }
  switch (action) {
    case LoadAction::kStart:
      return store_->Load(layer);
    case LoadAction::kCancel:
      return store_->CancelLoad(layer);
    case LoadAction::kStatus:
      break;
  }
  return store_->LoadStatus(layer);
}

std::vector<std::shared_ptr<Session>> Server::Sessions() const {
  // Rows read in place count in each session's counters once their touch pages are folded.
  if (store_ != nullptr) store_->FoldTouches();
  std::lock_guard<std::mutex> lock(sessions_mutex_);
  return sessions_;
}

void Server::PublishSessions() {
  {
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    sessions_.clear();
    for (auto& [fd, s] : by_fd_) sessions_.push_back(s);
  }
  sessions_generation_.fetch_add(1, std::memory_order_release);
  Kick();
}

absl::Status Server::Run() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  signal_fd_.Reset(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (signal_fd_.valid()) {
    epoll_event ev{.events = EPOLLIN, .data = {.u64 = kTagSignal}};
    epoll_ctl(control_epoll_.get(), EPOLL_CTL_ADD, signal_fd_.get(), &ev);
  }
  WatchTables();
  if (auto page = TableStatePage::Create(tables_); page.ok()) {
    table_states_ = std::move(*page);
  } else {
    table_states_error_ = std::string(page.status().message());
    log::Notice("resident tables cannot be read in place: {}", table_states_error_);
  }
  prefetcher_ = std::make_unique<Prefetcher>(
      PrefetcherOptions{.queue_rows = config_.limits.prefetch_queue_rows,
                        .storage_readahead = !config_.storage_read_direct},
      tables_, store_.get(),
      [this] { return inflight_total_.load(std::memory_order_relaxed) != 0; },
      [this](size_t index) { return watch_->Check(index); });
  prefetcher_->Start();
  if (hot_set_keeper_ != nullptr) hot_set_keeper_->Start();
  if (hot_set_warmer_ != nullptr) hot_set_warmer_->Start(prefetcher_.get(), tables_, store_.get());
  std::vector<std::string> layers;
  for (const auto& t : tables_) layers.push_back(t->Describe());
  log::Notice("engramd serving {} table(s) on {}: {}", tables_.size(), config_.socket_path,
              absl::StrJoin(layers, "; "));
  poller_heartbeat_ns_.store(NowNs());
  poller_ = std::thread([this] { PollerLoop(); });
  control_->Start();

  bool stopping = false;
  epoll_event events[64];
  while (!stopping) {
    const int wait_ms = control_->WaitMs();
    // Pending handshakes have deadlines to keep; table files are re-checked every second.
    const int cap_ms = pending_.empty() ? static_cast<int>(kRecheckNs / 1'000'000) : 100;
    const int n = epoll_wait(control_epoll_.get(), events, 64,
                             wait_ms < 0 ? cap_ms : std::min(wait_ms, cap_ms));
    if (n < 0 && errno != EINTR) {
      log::Error("epoll_wait: {}", strerror(errno));
      break;
    }
    for (int i = 0; i < n; ++i) stopping |= HandleControlEvent(events[i]);
    control_->Tick();
    const uint64_t now = NowNs();
    if (now - last_recheck_ns_ >= kRecheckNs) {
      ReportTableChanges(watch_->Recheck());
      last_recheck_ns_ = now;
    }
    // Connections that never finished their handshake are dropped.
    for (int fd : pending_.TakeExpired(now)) {
      DropPending(fd, absl::StrFormat("it sent no HELLO within %u ms",
                                      config_.handshake_timeout_ns / 1'000'000)
                          .c_str());
    }
  }
  return Shutdown();
}

bool Server::HandleControlEvent(const epoll_event& event) {
  const uint64_t tag = event.data.u64;
  if (tag == kTagListen) {
    Accept();
  } else if (tag == kTagLease) {
    ReportTableChanges(watch_->OnLeaseBreak());
  } else if (tag == kTagInotify) {
    ReportTableChanges(watch_->OnInotify());
  } else if (tag == kTagStop) {
    log::Notice("stop requested");
    return true;
  } else if (tag == kTagSignal) {
    signalfd_siginfo info{};
    if (read(signal_fd_.get(), &info, sizeof(info)) != sizeof(info)) return false;
    if (info.ssi_signo == SIGHUP) {
      control_->Reload();
    } else if (info.ssi_signo == SIGTERM || info.ssi_signo == SIGINT) {
      log::Notice("received {}; finishing requests in flight", strsignal(info.ssi_signo));
      return true;
    }
  } else {
    const int fd = static_cast<int>(tag);
    if (pending_.Contains(fd)) {
      Handshake(fd);
      return false;
    }
    auto it = by_fd_.find(fd);
    if (it == by_fd_.end()) return false;
    std::shared_ptr<Session> session = it->second;
    if ((event.events & EPOLLIN) != 0) HandleMessage(session);
    if (by_fd_.count(fd) != 0 && (event.events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) != 0) {
      Disconnect(session, "closed its connection");
    }
  }
  return false;
}

absl::Status Server::Shutdown() {
  // No new connections; finish what the rings hold and what is in flight. A resident load
  // stops after its chunk in progress (ResidentTable::Load bounds that).
  control_->Stopping();
  if (store_ != nullptr) store_->StopLoading();
  epoll_ctl(control_epoll_.get(), EPOLL_CTL_DEL, listen_fd_.get(), nullptr);
  listen_fd_.Reset();
  if (config_.listen_fd < 0) unlink(config_.socket_path.c_str());
  for (int fd : pending_.TakeAll()) close(fd);
  draining_.store(true);
  Kick();
  poller_.join();
  hot_set_warmer_.reset();  // queues no more
  prefetcher_->StopIntake();  // the entries the poller handed over are answered first
  absl::Status result = absl::OkStatus();
  {
    std::unique_lock<std::mutex> lock(drain_mutex_);
    if (!drained_.wait_for(lock, std::chrono::nanoseconds(config_.drain_timeout_ns),
                           [this] { return inflight_total_.load() == 0; })) {
      result = absl::DeadlineExceededError(
          absl::StrFormat("%u request(s) still in flight after %u s; exiting without them",
                          inflight_total_.load(), config_.drain_timeout_ns / 1'000'000'000));
    }
  }
  control_->Stopped();  // the last metrics textfile, with engram_up 0
  // Clients reading in place stop with the sessions: every table withdrawn, then the
  // liveness word marked as the thread holding it ends.
  table_states_.reset();
  for (auto& [fd, session] : by_fd_) {
    session->MarkStopped();
    shutdown(fd, SHUT_RDWR);
  }
  by_fd_.clear();
  PublishSessions();
  hot_set_keeper_.reset();  // the hot set written a last time, while the cache is there
  log::Notice("engramd stopped");
  return result;
}

void Server::WatchTables() {
  std::vector<std::string> notes;
  watch_ = TableWatch::Create(tables_, &notes);
  for (const std::string& note : notes) log::Notice("{}", note);
  for (const auto& [fd, tag] : {std::pair{watch_->lease_fd(), kTagLease},
                                std::pair{watch_->inotify_fd(), kTagInotify}}) {
    if (fd < 0) continue;
    epoll_event ev{.events = EPOLLIN, .data = {.u64 = tag}};
    epoll_ctl(control_epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
  }
  last_recheck_ns_ = NowNs();
}

void Server::ReportTableChanges(const std::vector<std::string>& messages) {
  for (const std::string& m : messages) log::Error("{}", m);
  if (messages.empty() || table_states_ == nullptr) return;
  // Clients reading a changed table in place stop with their next read, as gathers do.
  for (size_t i = 0; i < tables_.size(); ++i) {
    if (watch_->Changed(i)) table_states_->Withdraw(i);
  }
}

void Server::Accept() {
  while (true) {
    const int fd = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        uint64_t suppressed = 0;
        if (garbage_log_.Allow(NowNs(), &suppressed)) {
          log::Warning("accept on {}: {}", config_.socket_path, strerror(errno));
        }
      }
      return;
    }
    // Who connected is known now, before any byte is read: each uid's pending connections
    // count against that uid. (A peer that may not connect is refused when its HELLO comes,
    // so that it reads why instead of a reset connection.)
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) cred.uid = ~uid_t{0};
    epoll_event ev{.events = EPOLLIN | EPOLLRDHUP, .data = {.u64 = static_cast<uint64_t>(fd)}};
    epoll_ctl(control_epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
    for (const PendingHandshakes::Dropped& d :
         pending_.Add(fd, cred.uid, NowNs() + config_.handshake_timeout_ns)) {
      DropPending(d.fd, d.uid_bound
                            ? absl::StrFormat("uid %u holds %u connections without HELLO, the "
                                              "limit per uid; the oldest goes",
                                              d.uid, d.uid_pending)
                                  .c_str()
                            : absl::StrFormat("%u connections wait for their HELLO, the limit; "
                                              "the oldest of uid %u (which holds %u) goes",
                                              kMaxPendingHandshakes, d.uid, d.uid_pending)
                                  .c_str());
    }
    Handshake(fd);  // a client sends HELLO right after connecting: it is usually here already
  }
}

void Server::DropPending(int fd, const char* why) {
  uint64_t suppressed = 0;
  if (handshake_log_.Allow(NowNs(), &suppressed)) {
    log::Notice("dropped a connection before its handshake: {} ({} similar messages suppressed)",
                why, suppressed);
  }
  epoll_ctl(control_epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  pending_.Remove(fd);
  close(fd);
}

bool Server::PeerAllowed(int fd, PeerInfo* ret_peer, std::string* ret_why) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
    *ret_why = absl::StrFormat("cannot read the peer's credentials: %s", strerror(errno));
    return false;
  }
  ret_peer->pid = cred.pid;
  ret_peer->uid = cred.uid;
  ret_peer->gid = cred.gid;
  // The groups cost a syscall: only asked for when a group could admit the peer.
  std::vector<gid_t> groups;
  if (!config_.allow_gids.empty()) groups = PeerGroups(fd);
  if (IsAdmitted(config_, own_uid_, cred.uid, cred.gid, groups)) return true;
  *ret_why = absl::StrFormat(
      "uid %u (gid %u, pid %d) may not use engramd; allowed: %s (see --allow-uid/--allow-gid)",
      cred.uid, cred.gid, cred.pid, DescribeAdmitted(config_, own_uid_));
  return false;
}

void Server::Refuse(int fd, int32_t code, const std::string& message) {
  uint64_t suppressed = 0;
  if (handshake_log_.Allow(NowNs(), &suppressed)) {
    log::Notice("refused a client: {} ({} similar messages suppressed)", message, suppressed);
  }
  std::vector<uint8_t> bytes = protocol::EncodeError(code, message, 0);
  SendBytes(fd, bytes.data(), bytes.size());
  epoll_ctl(control_epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  pending_.Remove(fd);
  close(fd);
}

bool Server::GrantArena(const engram_msg_hello& hello, protocol::ArenaLayout* ret_layout,
                        int32_t* ret_code, std::string* ret_message) const {
  const Limits& limits = config_.limits;
  *ret_code = ENGRAM_STATUS_RESOURCE_EXHAUSTED;
  if (by_fd_.size() >= limits.max_clients) {
    *ret_message = absl::StrFormat("engramd already serves %u clients, the limit (--max-clients)",
                                   by_fd_.size());
    return false;
  }
  const uint64_t data_bytes = hello.data_bytes != 0 ? hello.data_bytes : limits.default_data_bytes;
  if (data_bytes > limits.max_arena_bytes) {
    *ret_message = absl::StrFormat(
        "a data region of %u bytes was asked for; the limit is %u bytes per session "
        "(--max-arena-bytes)",
        data_bytes, limits.max_arena_bytes);
    return false;
  }
  uint32_t slots = hello.slots != 0 ? hello.slots : limits.default_slots;
  slots = std::min({slots, limits.max_inflight, uint32_t{ENGRAM_MAX_SLOTS}});
  if (!protocol::ComputeArenaLayout(slots, data_bytes, ret_layout)) {
    *ret_code = ENGRAM_STATUS_INVALID_ARGUMENT;
    *ret_message =
        absl::StrFormat("no arena can have %u slots and %u data bytes", slots, data_bytes);
    return false;
  }
  uint64_t sessions_total = SessionMemoryBytes(*ret_layout, limits.max_rows_per_request);
  for (const auto& [fd, session] : by_fd_) {
    sessions_total += SessionMemoryBytes(session->arena().layout(), limits.max_rows_per_request);
  }
  std::optional<std::string> refusal =
      ArenaRefusal(total_arena_bytes_.load() + ret_layout->arena_bytes, sessions_total,
                   limits.max_total_arena_bytes, config_.memory_plan);
  if (refusal) *ret_message = std::move(*refusal);
  return !refusal;
}

// A session that submits from a device keeps the poller awake (a device cannot ring a doorbell):
// an administrator's privilege, and only so many at once.
bool Server::GrantDeviceSubmit(int fd, const engram_msg_hello& hello, const PeerInfo& peer,
                               int32_t* ret_code, std::string* ret_message) const {
  const std::string who = absl::StrFormat("client '%s' (pid %d, uid %u)",
                                          EscapeBytes(hello.client_name), peer.pid, peer.uid);
  std::vector<gid_t> groups;
  if (!config_.admin_gids.empty()) groups = PeerGroups(fd);
  if (!IsAdministrator(config_, own_uid_, peer.uid, peer.gid, groups)) {
    *ret_code = ENGRAM_STATUS_PERMISSION_DENIED;
    *ret_message = absl::StrFormat(
        "%s asked to submit from a device (ENGRAM_CONNECT_DEVICE_SUBMIT), which keeps a daemon "
        "core polling while it is open; only engramd administrators may (%s; access.admin_uids, "
        "access.admin_gids)",
        who, DescribeAdministrators(config_, own_uid_));
    return false;
  }
  const size_t open = std::count_if(by_fd_.begin(), by_fd_.end(),
                                    [](const auto& e) { return e.second->device_submit(); });
  if (open >= config_.limits.max_device_sessions) {
    *ret_code = ENGRAM_STATUS_RESOURCE_EXHAUSTED;
    *ret_message = absl::StrFormat(
        "%s asked to submit from a device (ENGRAM_CONNECT_DEVICE_SUBMIT); %u such sessions are "
        "open and the limit is %u (limits.max_device_sessions, --max-device-sessions)",
        who, open, config_.limits.max_device_sessions);
    return false;
  }
  return true;
}

void Server::Handshake(int fd) {
  uint8_t buffer[ENGRAM_MSG_MAX_BYTES];
  const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    epoll_ctl(control_epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
    pending_.Remove(fd);
    close(fd);
    return;
  }
  PeerInfo peer;
  std::string why;
  if (!PeerAllowed(fd, &peer, &why)) {
    Refuse(fd, ENGRAM_STATUS_PERMISSION_DENIED, why);
    return;
  }
  engram_msg_hello hello;
  protocol::CodecError error;
  if (!protocol::DecodeHello(buffer, static_cast<size_t>(n), &hello, &error)) {
    Refuse(fd, error.code, error.message);
    return;
  }
  const Limits& limits = config_.limits;
  protocol::ArenaLayout layout;
  int32_t code = 0;
  std::string message;
  if (!GrantArena(hello, &layout, &code, &message) ||
      ((hello.features & ENGRAM_FEATURE_DEVICE_SUBMIT) != 0 &&
       !GrantDeviceSubmit(fd, hello, peer, &code, &message))) {
    Refuse(fd, code, message);
    return;
  }
  const uint64_t id = next_session_id_++;
  absl::StatusOr<std::unique_ptr<Arena>> arena =
      Arena::Create(layout, id, limits.max_rows_per_request);
  if (!arena.ok()) {
    Refuse(fd, static_cast<int32_t>(arena.status().code()), std::string(arena.status().message()));
    return;
  }
  const int doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (doorbell < 0) {
    Refuse(fd, ENGRAM_STATUS_RESOURCE_EXHAUSTED,
           absl::StrFormat("eventfd for the session: %s", strerror(errno)));
    return;
  }
  engram_msg_welcome welcome{};
  protocol::FillHeader(&welcome.header, ENGRAM_MSG_WELCOME, sizeof(welcome),
                       hello.header.request_id);
  welcome.version_major = ENGRAM_PROTOCOL_MAJOR;
  welcome.version_minor = ENGRAM_PROTOCOL_MINOR;
  welcome.slots = layout.slots;
  welcome.features = hello.features & ENGRAM_FEATURES_V1_5;
  welcome.session_id = id;
  welcome.arena_bytes = layout.arena_bytes;
  welcome.data_bytes = layout.data_bytes;
  welcome.max_rows_per_request = limits.max_rows_per_request;
  const int passed[2] = {(*arena)->fd(), doorbell};
  (void)protocol::SendMessage(fd, &welcome, sizeof(welcome), passed, 2);
  (*arena)->CloseFd();
  pending_.Remove(fd);
  auto session = std::make_shared<Session>(id, fd, std::move(*arena), doorbell, peer,
                                           std::string(hello.client_name));
  session->set_device_submit((welcome.features & ENGRAM_FEATURE_DEVICE_SUBMIT) != 0);
  session->set_table_state((welcome.features & ENGRAM_FEATURE_TABLE_STATE) != 0);
  session->set_row_cache_map((welcome.features & ENGRAM_FEATURE_ROW_CACHE_MAP) != 0);
  session->set_resident_touch((welcome.features & ENGRAM_FEATURE_RESIDENT_TOUCH) != 0);
  total_arena_bytes_ += layout.arena_bytes;
  by_fd_[fd] = session;
  epoll_event ev{.events = EPOLLIN, .data = {.u64 = id}};
  epoll_ctl(poller_epoll_.get(), EPOLL_CTL_ADD, doorbell, &ev);
  PublishSessions();
  log::Info("{} connected: {} slots, {} data bytes", session->Describe(), layout.slots,
            layout.data_bytes);
}

void Server::Disconnect(const std::shared_ptr<Session>& session, const char* why) {
  log::Info("{} {}; {} request(s) in flight finish first", session->Describe(), why,
            session->inflight.load());
  session->set_closing();
  control_->SessionClosed(*session);  // before it leaves the list: the metrics keep its counts
  epoll_ctl(control_epoll_.get(), EPOLL_CTL_DEL, session->socket_fd(), nullptr);
  epoll_ctl(poller_epoll_.get(), EPOLL_CTL_DEL, session->doorbell_fd(), nullptr);
  total_arena_bytes_ -= session->arena().bytes();
  by_fd_.erase(session->socket_fd());
  PublishSessions();
  // The socket, doorbell and arena go with the last reference: the poller's snapshot or a
  // request still running on a gather worker.
}

void Server::SendError(Session& session, int32_t code, const std::string& message,
                       uint32_t request_id) {
  std::vector<uint8_t> bytes = protocol::EncodeError(code, message, request_id);
  SendBytes(session.socket_fd(), bytes.data(), bytes.size());
}

void Server::HandleMessage(const std::shared_ptr<Session>& session) {
  uint8_t buffer[ENGRAM_MSG_MAX_BYTES];
  const ssize_t n = recv(session->socket_fd(), buffer, sizeof(buffer), MSG_DONTWAIT | MSG_TRUNC);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    Disconnect(session, n == 0 ? "closed its connection" : "lost its connection");
    return;
  }
  if (static_cast<size_t>(n) > sizeof(buffer)) {
    SendError(*session, ENGRAM_STATUS_INVALID_ARGUMENT,
              absl::StrFormat("message of %d bytes is longer than the %u-byte maximum", n,
                              ENGRAM_MSG_MAX_BYTES),
              0);
    return;
  }
  engram_msg_header header;
  protocol::CodecError error;
  if (!protocol::DecodeHeader(buffer, static_cast<size_t>(n), &header, &error)) {
    SendError(*session, error.code, error.message, 0);
    return;
  }
  if ((header.type == ENGRAM_MSG_LIST_TABLES || header.type == ENGRAM_MSG_SESSION_STATS) &&
      header.bytes != sizeof(engram_msg_header)) {
    SendError(
        *session, ENGRAM_STATUS_INVALID_ARGUMENT,
        absl::StrFormat("message type %u takes no body, got %u bytes", header.type, header.bytes),
        header.request_id);
    return;
  }
  switch (header.type) {
    case ENGRAM_MSG_LIST_TABLES:
      SendTables(*session, header.request_id);
      break;
    case ENGRAM_MSG_SESSION_STATS:
      SendStats(*session, header.request_id);
      break;
    case ENGRAM_MSG_CONTROL:
      control_->Handle(session, header, buffer + sizeof(header), header.bytes - sizeof(header));
      break;
    case ENGRAM_MSG_MAP_TABLE:
      SendTableMap(*session, header, buffer);
      break;
    case ENGRAM_MSG_HELLO:
      SendError(*session, ENGRAM_STATUS_FAILED_PRECONDITION,
                "HELLO on a session that already has its arena", header.request_id);
      break;
    default:
      SendError(*session, ENGRAM_STATUS_UNIMPLEMENTED,
                absl::StrFormat("message type %u is not a request engramd serves", header.type),
                header.request_id);
  }
}

void Server::SendTables(Session& session, uint32_t request_id) {
  std::vector<uint8_t> out(sizeof(engram_msg_tables) + tables_.size() * sizeof(engram_wire_table));
  engram_msg_tables head{};
  protocol::FillHeader(&head.header, ENGRAM_MSG_TABLES, static_cast<uint32_t>(out.size()),
                       request_id);
  head.count = static_cast<uint32_t>(tables_.size());
  head.entry_bytes = sizeof(engram_wire_table);
  memcpy(out.data(), &head, sizeof(head));
  for (size_t i = 0; i < tables_.size(); ++i) {
    const Table& t = *tables_[i];
    engram_wire_table w{};
    w.layer_id = t.layer_id();
    w.row_bytes = t.row_bytes();
    w.num_rows = t.num_rows();
    w.covered_begin = t.covered().begin;
    w.covered_end = t.covered().end;
    w.layout = t.layout() == TableLayout::kPacked ? ENGRAM_LAYOUT_PACKED : ENGRAM_LAYOUT_CHECKPOINT;
    w.files = static_cast<uint32_t>(t.files().size());
    w.data_bytes = t.data_bytes();
    memcpy(out.data() + sizeof(head) + i * sizeof(w), &w, sizeof(w));
  }
  SendBytes(session.socket_fd(), out.data(), out.size());
}

void Server::SendStats(Session& session, uint32_t request_id) {
  engram_msg_stats m{};
  protocol::FillHeader(&m.header, ENGRAM_MSG_STATS, sizeof(m), request_id);
  m.stats = session.Stats();
  SendBytes(session.socket_fd(), &m, sizeof(m));
}

namespace {

// epoll_wait until `deadline_ns` (NowNs()) at the latest, to the microsecond where the kernel
// has epoll_pwait2 (Linux 5.11), else rounded down to the millisecond.
int EpollWaitUntil(int epoll_fd, epoll_event* events, int max_events, uint64_t deadline_ns) {
  static std::atomic<bool> no_pwait2{false};
  const uint64_t now = NowNs();
  const uint64_t left = deadline_ns > now ? deadline_ns - now : 0;
  if (!no_pwait2.load(std::memory_order_relaxed)) {
    const timespec ts{.tv_sec = time_t(left / 1'000'000'000), .tv_nsec = long(left % 1'000'000'000)};
    const int n = epoll_pwait2(epoll_fd, events, max_events, &ts, nullptr);
    if (n >= 0 || errno != ENOSYS) return n;
    no_pwait2.store(true, std::memory_order_relaxed);
  }
  return epoll_wait(epoll_fd, events, max_events, int(left / 1'000'000));
}

}  // namespace

// What one poller thread keeps from pass to pass.
struct Server::PollerState {
  std::vector<std::shared_ptr<Session>> snapshot;  // the sessions it polls
  uint64_t generation = ~uint64_t{0};              // sessions_generation_ of the snapshot
  engram_sqe scratch[32];
  epoll_event events[64];
  uint64_t spin_ns = 0;    // the adaptive spell of spinning after the last work
  uint64_t last_work = 0;  // the last pass that found work, or the last wake-up
  size_t device_sessions = 0;
  uint64_t last_device_work = 0;  // a device-submitting session's last submission
  uint64_t device_nap_ns = kDeviceNapMinNs;
  // Paced work (pace.h).
  PacePredictor pace;
  std::optional<PacePredictor::SpinWindow> window;  // of the next expected burst
  uint64_t last_busy = 0;        // the last pass that found work
  uint64_t pace_spin_until = 0;  // spinning through a predicted window until then
  uint32_t burst_requests = 0, last_burst_requests = 0;
  uint64_t timer_late_ns = 50'000;  // how late this thread's timed sleeps end, on average
  uint64_t spin_since = 0;          // the first of the passes since the last work found none
};

void Server::PollerLoop() {
  PollerState st;
  const PollOptions& poll = config_.poll;
  st.spin_ns = poll.spin_min_ns;
  st.last_work = NowNs();
  // Paced work (pace.h): when the bursts of requests are regular, sleep only until shortly
  // before the next is due, then spin (with up to two request threads) until it comes or its
  // window closes. Timers of this thread fire within 10 µs, not 50.
  prctl(PR_SET_TIMERSLACK, 10'000UL, 0, 0, 0);
  while (true) {
    RefreshPollerSessions(st);
    const bool draining = draining_.load(std::memory_order_acquire);
    const uint32_t work = DrainAllSessions(st);
    if (draining) {
      if (work == 0) break;  // the final sweep found the rings empty
      continue;
    }
    const uint64_t now = NowNs();
    poller_heartbeat_ns_.store(now, std::memory_order_relaxed);
    if (work != 0) {
      EndSpin(st, now);
      CountBurst(st, now, work);
      continue;
    }
    if (st.spin_since == 0) {
      st.spin_since = now;
    } else if (now - st.spin_since >= 1'000'000) {
      EndSpin(st, now);  // counted as it passes, so that a long spell shows
      st.spin_since = now;
    }
    if (KeepSpinning(st, now)) {
      CpuRelax();
      continue;
    }
    if (SpinThroughPaceWindow(st, now)) continue;
    EndSpin(st, now);
    SleepOnDoorbells(st, now);
  }
  for (const auto& s : st.snapshot) s->SetNeedWakeup(true);  // nobody polls any more
}

// Takes a new snapshot of the sessions when the set changed.
void Server::RefreshPollerSessions(PollerState& st) {
  if (st.generation == sessions_generation_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(sessions_mutex_);
  st.snapshot = sessions_;
  st.generation = sessions_generation_.load(std::memory_order_acquire);
  const size_t before = st.device_sessions;
  st.device_sessions = std::count_if(st.snapshot.begin(), st.snapshot.end(),
                                     [](const auto& s) { return s->device_submit(); });
  if (st.device_sessions > before) st.last_device_work = NowNs();  // a new one starts awake
}

// One pass over every open session's ring; the requests (and garbage tails) it found.
uint32_t Server::DrainAllSessions(PollerState& st) {
  uint32_t work = 0;
  for (const auto& s : st.snapshot) {
    if (s->closing()) continue;
    const uint32_t n = DrainSession(s, st.scratch);
    if (n != 0 && s->device_submit()) {
      st.last_device_work = NowNs();
      st.device_nap_ns = kDeviceNapMinNs;
    }
    work += n;
  }
  return work;
}

// Whether the poller spins on after a pass that found no work: within its adaptive spell, a
// pace window, while a device-submitting session is awake, or in polling mode while clients
// are active (a request came within hold_idle_ns).
bool Server::KeepSpinning(PollerState& st, uint64_t now) {
  const PollOptions& poll = config_.poll;
  const bool device_awake =
      st.device_sessions > 0 && now - st.last_device_work < kDeviceIdleNs;
  const bool held =
      poll.hold_cores != 0 && !st.snapshot.empty() && now - st.last_busy < poll.hold_idle_ns;
  return now - st.last_work < st.spin_ns || now < st.pace_spin_until || device_awake || held;
}

// The passes since st.spin_since found nothing: count them as the poller's spin.
void Server::EndSpin(PollerState& st, uint64_t now) {
  if (st.spin_since == 0) return;
  poller_spin_ns_.fetch_add(now - st.spin_since, std::memory_order_relaxed);
  st.spin_since = 0;
}

// A pass found work: the first after an idle gap starts a burst the pace predictor learns from.
void Server::CountBurst(PollerState& st, uint64_t now, uint32_t work) {
  if (config_.poll.pace && now - st.last_busy >= st.pace.options().idle_gap_ns) {
    st.pace.OnBurst(now);
    st.last_burst_requests = st.burst_requests;
    st.burst_requests = 0;
    if (now < st.pace_spin_until) {
      pace_windows_caught_.fetch_add(1, std::memory_order_relaxed);
      requests_->EndPrewake();
    }
    st.pace_spin_until = 0;
  }
  st.burst_requests += work;
  st.last_busy = now;
  // Polling mode: the request threads besides the poller stay awake while requests come.
  if (config_.poll.hold_cores != 0) {
    poll_hold_until_.store(now + config_.poll.hold_idle_ns, std::memory_order_relaxed);
    requests_->Hold(config_.poll.hold_cores - 1, now + config_.poll.hold_idle_ns);
  }
  st.last_work = now;
}

// True when the window of the next expected burst is open, or closer than a timed sleep could
// wake for: the poller spins through it, with request threads.
bool Server::SpinThroughPaceWindow(PollerState& st, uint64_t now) {
  st.window.reset();
  if (config_.poll.pace) st.window = st.pace.Window(now);
  if (!st.window || now + st.timer_late_ns < st.window->wake_ns || now >= st.window->until_ns) {
    return false;
  }
  st.pace_spin_until = st.window->until_ns;
  pace_windows_.fetch_add(1, std::memory_order_relaxed);
  // At most two request threads: every thread spinning here takes a core from the ranks
  // and the gather workers (waking every worker that helped, and a request thread per
  // request, made a 1-rank step from storage 2-3x slower on the 16-core host).
  requests_->Prewake(std::clamp<uint32_t>(st.last_burst_requests, 1, 2), st.window->until_ns);
  return true;
}

// Going to sleep: ask clients to ring, then look once more (a client that published just
// before seeing the flag is picked up here instead of waiting for its doorbell), then sleep in
// epoll_wait on the doorbells and adapt the spell of spinning to how soon work came.
void Server::SleepOnDoorbells(PollerState& st, uint64_t now) {
  const PollOptions& poll = config_.poll;
  for (const auto& s : st.snapshot) s->SetNeedWakeup(true);
  bool pending = false;
  for (const auto& s : st.snapshot) pending |= !s->closing() && s->HasSubmissions();
  if (!pending && !draining_.load() &&
      st.generation == sessions_generation_.load(std::memory_order_acquire)) {
    // Sleep for at most a second, or until the next expected burst's window opens (minus
    // how late this thread's timed wake-ups come, so that it is spinning when it opens).
    const bool timed = st.window && st.window->wake_ns > now + st.timer_late_ns;
    uint64_t deadline = timed ? st.window->wake_ns - st.timer_late_ns : now + 1'000'000'000;
    if (st.device_sessions > 0) {
      // Idle device sessions: look at their rings again after a nap.
      deadline = std::min(deadline, now + st.device_nap_ns);
      st.device_nap_ns = std::min(kDeviceNapMaxNs, st.device_nap_ns * 2);
    }
    const int n = EpollWaitUntil(poller_epoll_.get(), st.events, 64, deadline);
    const uint64_t woke = NowNs();
    if (timed && n == 0 && woke >= deadline) {
      st.timer_late_ns =
          std::min<uint64_t>((7 * st.timer_late_ns + (woke - deadline)) / 8, 1'000'000);
    }
    const bool rang = ReadDoorbells(st, n);
    // Adapt the spell: work that came soon after we slept would have been caught by a longer
    // spin; long idle gaps shorten it again.
    const uint64_t gap = woke - now;
    if (rang && gap < poll.spin_max_ns) {
      st.spin_ns = std::min(poll.spin_max_ns, std::max(st.spin_ns * 2, gap * 2));
    } else {
      st.spin_ns = std::max(poll.spin_min_ns, st.spin_ns / 2);
    }
  }
  for (const auto& s : st.snapshot) s->SetNeedWakeup(false);
  st.last_work = NowNs();
}

// Clears the doorbells (and the kick) that epoll_wait returned; true when a client rang.
bool Server::ReadDoorbells(PollerState& st, int events) {
  bool rang = false;
  for (int i = 0; i < events; ++i) {
    const uint64_t tag = st.events[i].data.u64;
    uint64_t count = 0;
    if (tag == kTagKick) {
      ssize_t ignored = read(kick_fd_.get(), &count, sizeof(count));
      (void)ignored;
      continue;
    }
    for (const auto& s : st.snapshot) {
      if (s->id() == tag) {
        if (read(s->doorbell_fd(), &count, sizeof(count)) == sizeof(count)) {
          s->counters.doorbells.fetch_add(count, std::memory_order_relaxed);
          rang = true;
        }
        break;
      }
    }
  }
  return rang;
}

uint32_t Server::DrainSession(const std::shared_ptr<Session>& session, engram_sqe* scratch) {
  bool garbage = false;
  const uint32_t n = session->TakeSubmissions(scratch, 32, &garbage);
  if (garbage) {
    uint64_t suppressed = 0;
    if (garbage_log_.Allow(NowNs(), &suppressed)) {
      log::Warning(
          "{} wrote a submission ring tail beyond its {} slots; skipped ({} similar "
          "messages suppressed)",
          session->Describe(), session->arena().layout().slots, suppressed);
    }
  }
  for (uint32_t i = 0; i < n; ++i) Dispatch(session, scratch[i]);
  return n + (garbage ? 1 : 0);
}

void Server::Dispatch(const std::shared_ptr<Session>& session, const engram_sqe& sqe) {
  const uint64_t start = NowNs();
  session->counters.requests_submitted.fetch_add(1, std::memory_order_relaxed);
  const uint32_t slot = ENGRAM_TICKET_SLOT(sqe.ticket);
  const uint64_t claimed = std::min<uint64_t>(sqe.num_rows, config_.limits.max_rows_per_request);
  const bool slot_valid = (sqe.ticket >> 16) != 0 && slot < session->arena().layout().slots;
  if (slot_valid && sqe.opcode == ENGRAM_OP_PREFETCH) {
    PostPrefetch(session, sqe, start);
    return;
  }
  if (claimed <= config_.poll.inline_rows || !slot_valid) {
    // Small (or unanswerable): decoding costs the poller little.
    Execute(session, sqe, start, /*admitted_rows=*/0);
    return;
  }
  // A large request is admitted here at O(1) cost and decoded (row ids copied and checked) on a
  // request thread, so that a client sending large requests that fail on their last row
  // cannot stall the poller every other session waits on.
  if (!Admit(*session, sqe.ticket, slot, claimed, start)) return;
  // Requests larger than a decode step have their own pool, so a prefill never queues decode
  // steps behind it.
  RequestPool& pool =
      claimed <= GatherEngineOptions{}.decode_max_rows ? *requests_ : *large_requests_;
  pool.Post(session->id(), [this, session, sqe, start, claimed] {
    Execute(session, sqe, start, claimed);
  });
}

uint64_t Server::RowBudget(Session& session) const {
  // Queued requests keep 16 bytes per row (ids and offsets): a session may have at most as many
  // rows in flight as its data region could hold row ids, and always one request of the largest
  // size, so the bookkeeping of all sessions stays within twice --max-total-arena-bytes.
  return std::max<uint64_t>(session.arena().data_bytes() / sizeof(uint64_t),
                            config_.limits.max_rows_per_request);
}

bool Server::Admit(Session& session, uint64_t ticket, uint32_t slot, uint64_t rows,
                   uint64_t start) {
  std::string why;
  if (session.inflight.load(std::memory_order_relaxed) >= config_.limits.max_inflight) {
    why = absl::StrFormat("%u requests already in flight on this session, the limit "
                          "(--max-inflight)",
                          session.inflight.load());
  } else if (session.rows_in_flight.load(std::memory_order_relaxed) + rows > RowBudget(session)) {
    why = absl::StrFormat(
        "%u rows already in flight on this session and %u more asked for; a session may have "
        "%u rows in flight (its data region's bytes / 8, at least --max-rows-per-request)",
        session.rows_in_flight.load(), rows, RowBudget(session));
  }
  if (!why.empty()) {
    session.Complete(ticket, slot, ENGRAM_STATUS_RESOURCE_EXHAUSTED, why.c_str(), 0,
                     NowNs() - start);
    return false;
  }
  session.inflight.fetch_add(1, std::memory_order_relaxed);
  session.rows_in_flight.fetch_add(rows, std::memory_order_relaxed);
  inflight_total_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void Server::Finish(Session& session, uint64_t ticket, uint32_t slot, absl::Status status,
                    uint64_t rows, uint64_t admitted_rows, uint64_t start, bool rows_written) {
  // The session's counts drop before the completion is published, so a client that reuses the
  // finished request's place at once is not refused for the limit; the daemon-wide count,
  // which shutdown drains on, only after it.
  session.inflight.fetch_sub(1, std::memory_order_relaxed);
  session.rows_in_flight.fetch_sub(admitted_rows, std::memory_order_relaxed);
  session.Complete(ticket, slot, static_cast<int32_t>(status.code()),
                   status.ok() ? nullptr : std::string(status.message()).c_str(),
                   status.ok() ? rows : 0, NowNs() - start, rows_written);
  if (inflight_total_.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
      draining_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(drain_mutex_);  // not lost between check and wait
    drained_.notify_all();
  }
}

// What a session's entries are decoded against: its arena and the daemon's limits and tables.
protocol::RequestContext Server::RequestContextOf(Session& session) const {
  Arena& arena = session.arena();
  return {.slots = arena.layout().slots,
          .max_rows = config_.limits.max_rows_per_request,
          .data = arena.data(),
          .data_bytes = arena.data_bytes(),
          .tables = bounds_};
}

void Server::Execute(const std::shared_ptr<Session>& session, const engram_sqe& sqe,
                     uint64_t start, uint64_t admitted_rows) {
  const protocol::RequestContext context = RequestContextOf(*session);
  protocol::DecodedRequest request;
  bool slot_valid = false;
  protocol::CodecError error;
  if (!protocol::DecodeRequest(sqe, context, &request, &slot_valid, &error)) {
    if (admitted_rows != 0) {
      Finish(*session, request.ticket, request.slot,
             absl::Status(static_cast<absl::StatusCode>(error.code), error.message), 0,
             admitted_rows, start);
    } else if (slot_valid) {
      session->Complete(request.ticket, request.slot, error.code, error.message.c_str(), 0,
                        NowNs() - start);
    } else {
      Unanswerable(*session, error.message, start);
    }
    return;
  }
  if (request.opcode == ENGRAM_OP_NOP || request.rows.empty()) {
    if (admitted_rows != 0) {
      Finish(*session, request.ticket, request.slot, absl::OkStatus(), 0, admitted_rows, start);
    } else {
      session->Complete(request.ticket, request.slot, ENGRAM_STATUS_OK, nullptr, 0,
                        NowNs() - start);
    }
    return;
  }
  if (admitted_rows == 0) {
    if (!Admit(*session, request.ticket, request.slot, request.rows.size(), start)) return;
    admitted_rows = request.rows.size();
  }
  // A table marked changed fails before and, if the mark came while its rows were read,
  // after the gather: bytes that were never validated are not handed over as good.
  absl::Status status = watch_->Check(request.table_index);
  if (status.ok()) {
    status = Gather(GatherBatch{.table = tables_[request.table_index].get(),
                                .rows = request.rows,
                                .dest = session->arena().data() + request.dest_offset,
                                .dest_offsets = request.dest_offsets});
  }
  if (status.ok()) status = watch_->Check(request.table_index);
  Finish(*session, request.ticket, request.slot, std::move(status), request.rows.size(),
         admitted_rows, start);
}

// On the poller: O(1) whatever the entry claims. The session's bound is checked against what the
// entry claims (its rows are only read and checked on the intake thread), and the raw entry is
// handed over.
void Server::PostPrefetch(const std::shared_ptr<Session>& session, const engram_sqe& sqe,
                          uint64_t start) {
  const uint32_t slot = ENGRAM_TICKET_SLOT(sqe.ticket);
  // An entry takes at least one row's place; one over the per-entry limit is refused by its
  // check, with that limit's message.
  const uint64_t claimed =
      sqe.num_rows <= ENGRAM_PREFETCH_MAX_ROWS ? std::max<uint64_t>(1, sqe.num_rows) : 1;
  std::atomic<uint64_t>& waiting = *session->prefetch_rows;
  const uint64_t limit = config_.limits.prefetch_session_rows;
  if (waiting.load(std::memory_order_relaxed) + claimed > limit) {
    session->Complete(
        sqe.ticket, slot, ENGRAM_STATUS_RESOURCE_EXHAUSTED,
        absl::StrFormat("%u rows of this session wait for prefetch and %u more were asked for; "
                        "a session may have %u waiting (limits.prefetch_session_rows)",
                        waiting.load(), claimed, limit)
            .c_str(),
        0, NowNs() - start, /*rows_written=*/false);
    return;
  }
  if (!Admit(*session, sqe.ticket, slot, /*rows=*/0, start)) return;
  waiting.fetch_add(claimed, std::memory_order_relaxed);
  prefetcher_->Post(
      [this, session, sqe, start, claimed] { CheckPrefetch(session, sqe, start, claimed); });
}

// On the prefetcher's intake thread: the entry is decoded (row ids copied and checked), its rows
// queued, and it completes with how many were.
void Server::CheckPrefetch(const std::shared_ptr<Session>& session, const engram_sqe& sqe,
                           uint64_t start, uint64_t claimed) {
  const protocol::RequestContext context = RequestContextOf(*session);
  protocol::DecodedRequest request;
  bool slot_valid = false;
  protocol::CodecError error;
  absl::Status status;
  if (!protocol::DecodeRequest(sqe, context, &request, &slot_valid, &error)) {
    status = absl::Status(static_cast<absl::StatusCode>(error.code), error.message);
  } else if (!request.rows.empty()) {
    // A table whose files changed fails the prefetch as it would fail a gather.
    status = watch_->Check(request.table_index);
  }
  uint64_t queued = 0;
  if (status.ok() && !request.rows.empty()) {
    session->prefetch_rows->fetch_sub(claimed - request.rows.size(), std::memory_order_relaxed);
    queued = prefetcher_->Enqueue(request.table_index, request.rows, session->prefetch_rows);
  } else {
    session->prefetch_rows->fetch_sub(claimed, std::memory_order_relaxed);
  }
  Finish(*session, sqe.ticket, ENGRAM_TICKET_SLOT(sqe.ticket), std::move(status), queued,
         /*admitted_rows=*/0, start, /*rows_written=*/false);
}

void Server::Unanswerable(Session& session, const std::string& message, uint64_t start) {
  session.counters.requests_failed.fetch_add(1, std::memory_order_relaxed);
  session.counters.garbage.fetch_add(1, std::memory_order_relaxed);
  uint64_t suppressed = 0;
  if (garbage_log_.Allow(start, &suppressed)) {
    log::Warning("{}: unanswerable submission: {} ({} similar messages suppressed)",
                 session.Describe(), message, suppressed);
  }
}

}  // namespace engram
