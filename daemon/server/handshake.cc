// A client's connection up to its session: accepting it, checking the peer, the HELLO, the
// arena and device-submit grants within the limits, and the WELCOME that hands the arena over.
#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "base/escape.h"
#include "daemon/server/server.h"
#include "daemon/server/server_internal.h"

namespace engram {

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
    log::Debug("accepted a connection on {} from pid {}, uid {}", config_.socket_path, cred.pid,
               cred.uid);
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
  welcome.features = hello.features & ENGRAM_FEATURES_V1_6;
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
  session->set_admit((welcome.features & ENGRAM_FEATURE_ADMIT) != 0);
  total_arena_bytes_ += layout.arena_bytes;
  by_fd_[fd] = session;
  epoll_event ev{.events = EPOLLIN, .data = {.u64 = id}};
  epoll_ctl(poller_epoll_.get(), EPOLL_CTL_ADD, doorbell, &ev);
  PublishSessions();
  log::Write(SessionLogPriority(*session),
             fmt::format("{} connected: {} slots, {} data bytes", session->Describe(), layout.slots,
                         layout.data_bytes));
}

}  // namespace engram
