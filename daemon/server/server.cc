// The engramd server's life and its control thread: creation, the control loop and its events,
// shutdown, the watch on the table files, and the replies to a session's messages (server.h).
#include "daemon/server/server.h"

#include <errno.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/clock.h"
#include "daemon/server/server_internal.h"

namespace engram {
namespace {

// How often the table files are re-stat'ed (TableWatch::Recheck) besides leases and inotify.
constexpr uint64_t kRecheckNs = 1'000'000'000;

// A tier as engram_wire_table carries it (ENGRAM_TABLE_TIER_*).
uint32_t WireTier(Tier tier) {
  switch (tier) {
    case Tier::kStorage:
      return ENGRAM_TABLE_TIER_STORAGE;
    case Tier::kResident:
      return ENGRAM_TABLE_TIER_RESIDENT;
    case Tier::kCache:
      return ENGRAM_TABLE_TIER_CACHE;
  }
  return ENGRAM_TABLE_TIER_UNKNOWN;
}

}  // namespace

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
  listen_fd_.Reset();
  socket_claim_.reset();  // removes the path only if it is still the socket bound
  for (int fd : pending_.TakeAll()) close(fd);
  // The epoll, eventfd and signalfd descriptors close with their UniqueFd members.
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

absl::StatusOr<ResidentLoadStatus> Server::ResidentLoad(uint32_t layer, LoadAction action) const {
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
  // The path goes now, if it is still ours, and with it the claim: a new engramd waiting to
  // start on the path binds while this one drains.
  socket_claim_.reset();
  for (int fd : pending_.TakeAll()) close(fd);
  draining_.store(true);
  Kick();
  poller_.join();
  hot_set_warmer_.reset();    // queues no more
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
  for (const auto& [fd, tag] :
       {std::pair{watch_->lease_fd(), kTagLease}, std::pair{watch_->inotify_fd(), kTagInotify}}) {
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

void Server::Disconnect(const std::shared_ptr<Session>& session, const char* why) {
  log::Write(SessionLogPriority(*session),
             fmt::format("{} {}; {} request(s) in flight finish first", session->Describe(), why,
                         session->inflight.load()));
  session->set_closing();
  control_->SessionClosed(*session);  // before it leaves the list: the metrics keep its counts
  epoll_ctl(control_epoll_.get(), EPOLL_CTL_DEL, session->socket_fd(), nullptr);
  epoll_ctl(poller_epoll_.get(), EPOLL_CTL_DEL, session->doorbell_fd(), nullptr);
  total_arena_bytes_ -= session->arena().bytes();
  // Its requests' pins go: on the intake thread, after the entries it handed over there.
  if (store_ != nullptr && store_->admissions() != nullptr) {
    prefetcher_->Post([this, id = session->id()] { store_->admissions()->ReleaseOwner(id); });
  }
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
    w.tier = WireTier(store_ != nullptr ? store_->TierOf(&t) : Tier::kStorage);
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

}  // namespace engram
