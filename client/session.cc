// Opening and closing a session with engramd: the socket, the HELLO/WELCOME handshake and the
// mapping of the arena it hands over; and the session's control exchanges over that socket.
#include "client/session.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "client/abi_struct.h"
#include "client/last_error.h"
#include "engram/engram.h"
#include "engram/protocol.h"
#include "protocol/codec.h"

namespace {

namespace proto = engram::protocol;
using engram::client::ErrnoForCode;
using engram::client::kDefaultSpinNs;
using engram::client::ReadStruct;
using engram::client::SendAll;
using engram::client::SetError;
using engram::client::Shared;

constexpr int64_t kDefaultTimeoutNs = 5'000'000'000;

const char* ProgramName() {
  return program_invocation_short_name != nullptr ? program_invocation_short_name : "client";
}

int SetSocketTimeout(int fd, int64_t timeout_ns) {
  timeval tv{.tv_sec = static_cast<time_t>(timeout_ns / 1'000'000'000),
             .tv_usec = static_cast<suseconds_t>((timeout_ns % 1'000'000'000) / 1000)};
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0) {
    return -errno;
  }
  return 0;
}

}  // namespace

namespace engram::client {

int ErrnoForCode(int32_t code) {
  switch (code) {
    case ENGRAM_STATUS_OK:
      return 0;
    case ENGRAM_STATUS_INVALID_ARGUMENT:
      return -EINVAL;
    case ENGRAM_STATUS_NOT_FOUND:
      return -ENOENT;
    case ENGRAM_STATUS_OUT_OF_RANGE:
      return -ERANGE;
    case ENGRAM_STATUS_RESOURCE_EXHAUSTED:
      return -ENOSPC;
    case ENGRAM_STATUS_PERMISSION_DENIED:
      return -EACCES;
    case ENGRAM_STATUS_FAILED_PRECONDITION:
      return -EPROTO;
    case ENGRAM_STATUS_UNAVAILABLE:
    case ENGRAM_STATUS_CANCELLED:
    case ENGRAM_STATUS_ABORTED:
      return -ENOTCONN;
    case ENGRAM_STATUS_DEADLINE_EXCEEDED:
      return -ETIMEDOUT;
    case ENGRAM_STATUS_UNIMPLEMENTED:
      return -EOPNOTSUPP;
    default:
      return -EIO;
  }
}

int LostError(engram_session* s) {
  return SetError(-ENOTCONN,
                  "engramd session on %s was lost (the daemon stopped or died); connect again",
                  s->socket_path.c_str());
}

int SendAll(int fd, const void* data, size_t size) {
  ssize_t n;
  do {
    n = send(fd, data, size, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return -errno;
  if (static_cast<size_t>(n) != size) return -EIO;
  return 0;
}

// Sends a control request with an empty body and receives the reply into `reply`.
int ControlExchange(engram_session* s, uint16_t type, uint16_t expected_reply,
                    std::vector<uint8_t>* reply) {
  if (s->lost.load()) return LostError(s);
  std::lock_guard<std::mutex> lock(s->control_mutex);
  engram_msg_header request;
  const uint32_t id = s->next_request_id++;
  proto::FillHeader(&request, type, sizeof(request), id);
  if (SendAll(s->socket.get(), &request, sizeof(request)) < 0) {
    s->lost.store(true);
    return LostError(s);
  }
  reply->resize(ENGRAM_MSG_MAX_BYTES);
  ssize_t n =
      proto::ReceiveMessage(s->socket.get(), reply->data(), reply->size(), nullptr, 0, nullptr);
  if (n == 0 || n == -ECONNRESET || n == -EPIPE) {
    s->lost.store(true);
    return LostError(s);
  }
  if (n < 0) {
    return SetError(static_cast<int>(n), "no reply from engramd on %s: %s", s->socket_path.c_str(),
                    strerror(static_cast<int>(-n)));
  }
  reply->resize(static_cast<size_t>(n));
  engram_msg_header header;
  proto::CodecError error;
  if (!proto::DecodeHeader(reply->data(), reply->size(), &header, &error)) {
    return SetError(-EPROTO, "bad reply from engramd on %s: %s", s->socket_path.c_str(),
                    error.message.c_str());
  }
  if (header.type == ENGRAM_MSG_ERROR) {
    proto::DecodeError(reply->data(), reply->size(), &error);
    return SetError(ErrnoForCode(error.code), "engramd: %s", error.message.c_str());
  }
  if (header.type != expected_reply || header.request_id != id) {
    return SetError(-EPROTO, "engramd on %s answered with message type %u (id %u), expected %u",
                    s->socket_path.c_str(), header.type, header.request_id, id);
  }
  return 0;
}

}  // namespace engram::client

extern "C" {

void engram_connect_options_init(struct engram_connect_options* ret_options, size_t size) {
  engram_connect_options defaults{};
  defaults.size = sizeof(defaults);
  engram::client::InitStruct("engram_connect_options", defaults, ret_options, size);
}

}  // extern "C"

namespace {

// The socket to connect to: the options', else $ENGRAM_SOCKET, else the default.
int SocketAddress(const char* option, sockaddr_un* ret_addr, std::string* ret_path) {
  std::string path;
  if (option != nullptr) {
    path = option;
  } else if (const char* env = getenv("ENGRAM_SOCKET"); env != nullptr && env[0] != '\0') {
    path = env;
  } else {
    path = ENGRAM_DEFAULT_SOCKET;
  }
  *ret_addr = sockaddr_un{};
  ret_addr->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(ret_addr->sun_path)) {
    return SetError(-EINVAL, "socket path '%s' is empty or longer than %zu bytes", path.c_str(),
                    sizeof(ret_addr->sun_path) - 1);
  }
  memcpy(ret_addr->sun_path, path.c_str(), path.size() + 1);
  *ret_path = std::move(path);
  return 0;
}

int ConnectSocket(engram_session* s, const sockaddr_un& addr, int64_t timeout_ns) {
  s->socket.Reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!s->socket.valid()) {
    return SetError(-errno, "socket(AF_UNIX, SOCK_SEQPACKET): %s", strerror(errno));
  }
  SetSocketTimeout(s->socket.get(), timeout_ns);
  if (connect(s->socket.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) < 0) {
    const int e = errno;
    if (e == EACCES || e == EPERM) {
      return SetError(-EACCES,
                      "cannot connect to engramd at %s: %s (the socket's mode and group decide "
                      "who may connect)",
                      s->socket_path.c_str(), strerror(e));
    }
    return SetError(-ECONNREFUSED, "cannot connect to engramd at %s: %s (is it running?)",
                    s->socket_path.c_str(), strerror(e));
  }
  return 0;
}

// HELLO, then WELCOME with its two fds: the arena memfd (*ret_memfd) and the doorbell.
int Handshake(engram_session* s, const engram_connect_options& o, int64_t timeout_ns,
              engram::UniqueFd* ret_memfd) {
  const char* path = s->socket_path.c_str();
  engram_msg_hello hello{};
  proto::FillHeader(&hello.header, ENGRAM_MSG_HELLO, sizeof(hello), 0);
  hello.version_major = ENGRAM_PROTOCOL_MAJOR;
  hello.version_minor = ENGRAM_PROTOCOL_MINOR;
  // 0 asks for the daemon's defaults (its limits.default_data_bytes and default_slots).
  hello.slots = o.slots;
  hello.features = ENGRAM_FEATURES_V1_0 | ENGRAM_FEATURE_PREFETCH | ENGRAM_FEATURE_TABLE_STATE |
                   ENGRAM_FEATURE_ROW_CACHE_MAP | ENGRAM_FEATURE_RESIDENT_TOUCH |
                   ENGRAM_FEATURE_ADMIT;
  if (o.flags & ENGRAM_CONNECT_DEVICE_SUBMIT) hello.features |= ENGRAM_FEATURE_DEVICE_SUBMIT;
  hello.data_bytes = o.data_bytes;
  hello.pid = static_cast<uint32_t>(getpid());
  snprintf(hello.client_name, sizeof(hello.client_name), "%s",
           o.client_name != nullptr ? o.client_name : ProgramName());
  if (int rc = SendAll(s->socket.get(), &hello, sizeof(hello)); rc < 0) {
    return SetError(-ECONNREFUSED, "cannot send HELLO to engramd at %s: %s", path, strerror(-rc));
  }
  std::vector<uint8_t> buffer(ENGRAM_MSG_MAX_BYTES);
  int fds[2] = {-1, -1};
  int nfds = 0;
  const ssize_t n =
      proto::ReceiveMessage(s->socket.get(), buffer.data(), buffer.size(), fds, 2, &nfds);
  engram::UniqueFd memfd(nfds > 0 ? fds[0] : -1);
  engram::UniqueFd doorbell(nfds > 1 ? fds[1] : -1);
  if (n == -EAGAIN) {
    return SetError(-ETIMEDOUT, "engramd at %s did not answer HELLO within %lld ms", path,
                    static_cast<long long>(timeout_ns / 1'000'000));
  }
  if (n <= 0) {
    return SetError(-ECONNREFUSED, "engramd at %s closed the connection during the handshake%s%s",
                    path, n < 0 ? ": " : "", n < 0 ? strerror(static_cast<int>(-n)) : "");
  }
  proto::CodecError error;
  if (!proto::DecodeWelcome(buffer.data(), static_cast<size_t>(n), &s->welcome, &error)) {
    return SetError(ErrnoForCode(error.code), "engramd at %s refused the session: %s", path,
                    error.message.c_str());
  }
  if (nfds != 2) {
    return SetError(-EPROTO, "engramd at %s sent %d file descriptors with WELCOME, expected 2",
                    path, nfds);
  }
  s->doorbell = std::move(doorbell);
  *ret_memfd = std::move(memfd);
  return 0;
}

// Maps the arena memfd and checks its header against WELCOME.
int MapArena(engram_session* s, const engram::UniqueFd& memfd) {
  const char* path = s->socket_path.c_str();
  const uint64_t bytes = s->welcome.arena_bytes;
  struct stat st;
  if (fstat(memfd.get(), &st) < 0) {
    return SetError(-errno, "cannot stat the arena from engramd at %s: %s", path, strerror(errno));
  }
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    return SetError(-EPROTO, "arena from engramd at %s is %lld bytes, WELCOME says %llu", path,
                    static_cast<long long>(st.st_size), static_cast<unsigned long long>(bytes));
  }
  // The arena must be sealed against shrinking and growing (and the seals themselves sealed):
  // an arena someone could shrink under the mapping would make any access SIGBUS this process.
  constexpr int kArenaSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  const int seals = fcntl(memfd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & kArenaSeals) != kArenaSeals) {
    return SetError(-EPROTO,
                    "arena from engramd at %s is not sealed against resizing (seals 0x%x, need "
                    "0x%x)",
                    path, seals < 0 ? 0 : seals, kArenaSeals);
  }
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  if (map == MAP_FAILED) {
    return SetError(-errno, "cannot map the %llu-byte arena: %s",
                    static_cast<unsigned long long>(bytes), strerror(errno));
  }
  s->arena_mapping.Reset(map, bytes);
  s->arena = static_cast<uint8_t*>(map);
  s->arena_bytes = bytes;
  s->header = reinterpret_cast<engram_arena_header*>(s->arena);
  proto::CodecError error;
  if (!proto::CheckArenaHeader(*s->header, s->arena_bytes, &error) ||
      s->header->slots != s->welcome.slots || s->header->data_bytes != s->welcome.data_bytes) {
    return SetError(
        -EPROTO, "arena from engramd at %s is unusable: %s", path,
        error.message.empty() ? "header disagrees with WELCOME" : error.message.c_str());
  }
  s->slots = s->header->slots;
  s->sq = reinterpret_cast<engram_sqe*>(s->arena + s->header->sq_offset);
  s->cq = reinterpret_cast<engram_cqe*>(s->arena + s->header->cq_offset);
  s->status = reinterpret_cast<engram_request_status*>(s->arena + s->header->status_offset);
  s->data = s->arena + s->header->data_offset;
  s->data_bytes = s->header->data_bytes;
  s->sq_tail = Shared(s->header->sq_tail).load();
  s->generation.assign(s->slots, 0);
  s->slot_busy.assign(s->slots, 0);
  s->slot_rows.assign(s->slots, 0);
  for (uint32_t i = s->slots; i > 0; --i) s->free_slots.push_back(i - 1);
  s->free_ranges[0] = s->data_bytes;
  return 0;
}

// ENGRAM_IN_PLACE: "0" makes the daemon every session's default path for engram_gather; "1", ""
// or unset leave the in-place path the default.
int InPlaceFromEnvironment(bool* ret_in_place) {
  const char* value = getenv("ENGRAM_IN_PLACE");
  if (value == nullptr || value[0] == '\0' || strcmp(value, "1") == 0) {
    *ret_in_place = true;
  } else if (strcmp(value, "0") == 0) {
    *ret_in_place = false;
  } else {
    return SetError(
        -EINVAL, "ENGRAM_IN_PLACE is \"%.64s\": expected 0 (gather through engramd) or 1", value);
  }
  return 0;
}

// A session asked for with ENGRAM_CONNECT_DEVICE_SUBMIT hands its ring to a device producer,
// if the daemon granted the feature.
int TakeDeviceSubmit(engram_session* s, const engram_connect_options& o) {
  if (!(o.flags & ENGRAM_CONNECT_DEVICE_SUBMIT)) return 0;
  if (!(s->welcome.features & ENGRAM_FEATURE_DEVICE_SUBMIT)) {
    return SetError(-EOPNOTSUPP,
                    "engramd at %s (protocol %u.%u) does not accept submissions from a device; "
                    "upgrade it or submit from the host",
                    s->socket_path.c_str(), s->welcome.version_major, s->welcome.version_minor);
  }
  s->device_submit = true;
  return 0;
}

}  // namespace

extern "C" {

int engram_session_open(const struct engram_connect_options* options,
                        engram_session** ret_session) {
  struct engram_connect_options o;
  engram_connect_options_init(&o, sizeof(o));
  if (options != nullptr) {
    if (int rc = ReadStruct("engram_connect_options", options, &o); rc < 0) return rc;
  }
  if (ret_session == nullptr) return SetError(-EINVAL, "ret_session is NULL");
  if (o.slots > ENGRAM_MAX_SLOTS) {
    return SetError(-EINVAL, "%u slots asked, at most %u", o.slots, ENGRAM_MAX_SLOTS);
  }
  constexpr uint32_t kConnectFlags =
      ENGRAM_CONNECT_DEVICE_SUBMIT | ENGRAM_CONNECT_GATHER_VIA_DAEMON;
  if ((o.flags & ~kConnectFlags) != 0 || o.reserved != 0) {
    return SetError(-EINVAL, "engram_connect_options: unknown flags 0x%x or reserved field set",
                    o.flags);
  }
  bool in_place_env = true;
  if (int rc = InPlaceFromEnvironment(&in_place_env); rc < 0) return rc;
  const int64_t timeout_ns = o.timeout_ns > 0 ? o.timeout_ns : kDefaultTimeoutNs;
  auto s = std::make_unique<engram_session>();
  s->gather_in_place =
      in_place_env &&
      (o.flags & (ENGRAM_CONNECT_GATHER_VIA_DAEMON | ENGRAM_CONNECT_DEVICE_SUBMIT)) == 0;
  sockaddr_un addr;
  if (int rc = SocketAddress(o.socket_path, &addr, &s->socket_path); rc < 0) return rc;
  s->spin_ns = o.spin_ns != 0 ? o.spin_ns : kDefaultSpinNs;
  s->adaptive_spin = o.spin_ns == 0;
  engram::UniqueFd memfd;
  if (int rc = ConnectSocket(s.get(), addr, timeout_ns); rc < 0) return rc;
  if (int rc = Handshake(s.get(), o, timeout_ns, &memfd); rc < 0) return rc;
  if (int rc = MapArena(s.get(), memfd); rc < 0) return rc;
  if (int rc = TakeDeviceSubmit(s.get(), o); rc < 0) return rc;
  // Control exchanges after the handshake wait as long as a handshake may.
  *ret_session = s.release();
  return 0;
}

void engram_session_close(engram_session* session) { delete session; }

}  // extern "C"
