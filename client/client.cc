// libengram_client: the C ABI of include/engram/engram.h over an engramd session (a socket for
// the handshake and control messages, a shared-memory arena for requests and rows).
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/abi_struct.h"
#include "client/last_error.h"
#include "client/table_map.h"
#include "engram/engram.h"
#include "engram/protocol.h"
#include "base/clock.h"
#include "protocol/codec.h"
#include "base/unique_fd.h"
#include "base/unique_mapping.h"

namespace {

namespace proto = engram::protocol;
using engram::client::ReadStruct;
using engram::client::SetError;
using engram::client::WriteStruct;

constexpr uint32_t kDefaultSpinNs = 50'000;
// Adaptive spinning (spin_ns = 0) spins up to the service time predicted from the session's
// recent requests, within these bounds.
constexpr int64_t kAdaptiveSpinMaxNs = 2'000'000;
// A wait predicted longer than kNapMinNs sleeps until kNapMarginNs before the predicted end and
// spins from there: spinning through a long request takes a core from the daemon and the other
// ranks of the node for the whole request, to save one wake-up at its end.
constexpr int64_t kNapMinNs = 400'000;
constexpr int64_t kNapMarginNs = 150'000;
constexpr int64_t kDefaultTimeoutNs = 5'000'000'000;
// While sleeping, a waiter wakes this often to check that the daemon is still there.
constexpr int64_t kLivenessCheckNs = 20'000'000;

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

// Signed, for deadlines that may lie in the past.
int64_t NowNs() { return static_cast<int64_t>(engram::NowNs()); }

template <typename T>
std::atomic_ref<T> Shared(T& word) {
  return std::atomic_ref<T>(word);
}

const char* ProgramName() {
  return program_invocation_short_name != nullptr ? program_invocation_short_name : "client";
}

}  // namespace

struct engram_session {
  engram::UniqueFd socket;
  engram::UniqueFd doorbell;
  engram::UniqueMapping arena_mapping;
  uint8_t* arena = nullptr;  // arena_mapping's start
  uint64_t arena_bytes = 0;
  engram_arena_header* header = nullptr;
  engram_sqe* sq = nullptr;
  engram_cqe* cq = nullptr;
  engram_request_status* status = nullptr;
  uint8_t* data = nullptr;
  uint64_t data_bytes = 0;
  uint32_t slots = 0;
  uint32_t spin_ns = kDefaultSpinNs;
  bool adaptive_spin = true;
  // Daemon service time per row, an exponentially weighted average in ns × 16 (0: none yet).
  std::atomic<uint64_t> ns_per_row_x16{0};
  std::string socket_path;
  engram_msg_welcome welcome{};

  // Submission side: slot allocation and the ring tail belong to this process only.
  std::mutex submit_mutex;
  std::vector<uint64_t> generation;  // per slot
  std::vector<uint32_t> free_slots;
  std::vector<uint8_t> slot_busy;
  std::vector<uint64_t> slot_rows;  // rows of the request in flight in each slot
  uint32_t sq_tail = 0;
  bool device_submit = false;  // the ring belongs to a device producer (engram_device_ring)
  // engram_gather's path for a request without ENGRAM_GATHER_IN_PLACE / _VIA_DAEMON.
  bool gather_in_place = true;

  std::mutex control_mutex;  // one control exchange at a time
  uint32_t next_request_id = 1;

  std::mutex alloc_mutex;
  std::map<uint64_t, uint64_t> free_ranges;  // offset → bytes
  std::map<uint64_t, uint64_t> allocations;  // offset → bytes

  std::atomic<bool> lost{false};
  // The LIBRARY counters of engram_session_stats (engram/session_stats.h).
  struct LibraryCounters {
#define ENGRAM_LIBRARY_ATOMIC_(field, origin, type, metric, help) \
  ENGRAM_SESSION_LIBRARY_##origin(std::atomic<uint64_t> field{0};)
    ENGRAM_SESSION_COUNTERS(ENGRAM_LIBRARY_ATOMIC_)
#undef ENGRAM_LIBRARY_ATOMIC_
  };
  LibraryCounters counters;

  // engram_gather's in-place path: the tables asked for so far, by layer. The mappings stay until
  // the session is closed.
  std::mutex in_place_mutex;
  std::map<uint32_t, engram::client::InPlaceTable> in_place;
  // The touch page's ring has one producer: the gathers of every thread take turns.
  std::mutex touch_mutex;
};

namespace {

bool CheckLostCheap(engram_session* s) {
  return s->lost.load(std::memory_order_relaxed) ||
         Shared(s->header->daemon_state).load(std::memory_order_relaxed) != ENGRAM_DAEMON_SERVING;
}

int LostError(engram_session* s) {
  return SetError(-ENOTCONN,
                  "engramd session on %s was lost (the daemon stopped or died); connect again",
                  s->socket_path.c_str());
}

// True once the daemon closed the session: its state word says so or the socket hung up.
// Makes a syscall only when the state word does not already tell.
bool CheckLost(engram_session* s) {
  if (s->lost.load(std::memory_order_relaxed)) return true;
  if (Shared(s->header->daemon_state).load(std::memory_order_acquire) != ENGRAM_DAEMON_SERVING) {
    s->lost.store(true);
    return true;
  }
  pollfd pfd{.fd = s->socket.get(), .events = POLLIN | POLLRDHUP, .revents = 0};
  if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0) {
    s->lost.store(true);
    return true;
  }
  return false;
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

bool InData(const engram_session* s, const void* p, uint64_t bytes, uint64_t* ret_offset) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (b < s->data || b > s->data + s->data_bytes) return false;
  const uint64_t off = static_cast<uint64_t>(b - s->data);
  if (bytes > s->data_bytes - off) return false;
  *ret_offset = off;
  return true;
}

// Pushes one entry onto the submission ring and rings the doorbell if the poller sleeps.
int Push(engram_session* s, engram_sqe sqe, uint64_t* ret_ticket) {
  if (CheckLostCheap(s)) return LostError(s);
  if (s->device_submit) {
    return SetError(-EBUSY,
                    "this session's submission ring belongs to a GPU producer "
                    "(connected with ENGRAM_CONNECT_DEVICE_SUBMIT): submit from the device");
  }
  std::lock_guard<std::mutex> lock(s->submit_mutex);
  if (s->free_slots.empty()) {
    return SetError(-ENOSPC,
                    "all %u request slots of this session are in flight (wait on a ticket first, "
                    "or connect with more slots)",
                    s->slots);
  }
  const uint32_t slot = s->free_slots.back();
  s->free_slots.pop_back();
  s->slot_busy[slot] = 1;
  // Only gathers teach the adaptive spin how long the daemon takes per row.
  s->slot_rows[slot] = sqe.opcode == ENGRAM_OP_GATHER ? sqe.num_rows : 0;
  const uint64_t ticket = (++s->generation[slot] << 16) | slot;
  sqe.ticket = ticket;
  const uint32_t tail = s->sq_tail;
  s->sq[tail % s->slots] = sqe;
  s->sq_tail = tail + 1;
  Shared(s->header->sq_tail).store(tail + 1, std::memory_order_seq_cst);
  // Pairs with the poller's store of NEED_WAKEUP followed by its re-read of sq_tail.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if ((Shared(s->header->sq_flags).load(std::memory_order_relaxed) & ENGRAM_SQ_NEED_WAKEUP) != 0) {
    const uint64_t one = 1;
    ssize_t ignored = write(s->doorbell.get(), &one, sizeof(one));
    (void)ignored;
  }
  *ret_ticket = ticket;
  return 0;
}

// Consumes a completed ticket: frees its slot and returns its outcome (and, if ret_rows is not
// null, the rows its completion reported).
int Consume(engram_session* s, uint64_t ticket, uint64_t* ret_rows = nullptr) {
  const uint32_t slot = ENGRAM_TICKET_SLOT(ticket);
  const engram_request_status& st = s->status[slot];
  const int32_t code = Shared(const_cast<int32_t&>(st.code)).load(std::memory_order_relaxed);
  int rc = 0;
  bool gathered = false;
  {
    std::lock_guard<std::mutex> lock(s->submit_mutex);
    gathered = s->slot_rows[slot] != 0;
  }
  if (code != ENGRAM_STATUS_OK) {
    char message[ENGRAM_STATUS_MESSAGE_BYTES + 1];
    uint32_t len = st.message_bytes;
    if (len > ENGRAM_STATUS_MESSAGE_BYTES) len = ENGRAM_STATUS_MESSAGE_BYTES;
    memcpy(message, st.message, len);
    message[len] = '\0';
    rc = SetError(ErrnoForCode(code), "engramd: %s: %s", proto::StatusCodeName(code), message);
  }
  if (ret_rows != nullptr) *ret_rows = st.rows;
  if (code == ENGRAM_STATUS_OK && st.rows != 0 && gathered) {
    // Learn how long the daemon takes per row, for how long the next wait should spin.
    const uint64_t sample = st.service_ns * 16 / st.rows;
    uint64_t old = s->ns_per_row_x16.load(std::memory_order_relaxed);
    s->ns_per_row_x16.store(old == 0 ? sample : (old * 7 + sample) / 8, std::memory_order_relaxed);
  }
  // The completion ring is advisory for this library (the status slot is authoritative):
  // consume what is there so the daemon never counts overflows for us.
  const uint32_t cq_tail = Shared(s->header->cq_tail).load(std::memory_order_acquire);
  std::atomic_ref<uint32_t> head(s->header->cq_head);
  uint32_t old = head.load(std::memory_order_relaxed);
  while (static_cast<int32_t>(cq_tail - old) > 0 &&
         !head.compare_exchange_weak(old, cq_tail, std::memory_order_release)) {
  }
  std::lock_guard<std::mutex> lock(s->submit_mutex);
  s->slot_busy[slot] = 0;
  s->free_slots.push_back(slot);
  return rc;
}

// Checks that `ticket` is one this session handed out and has not consumed.
int CheckTicket(engram_session* s, uint64_t ticket) {
  const uint32_t slot = ENGRAM_TICKET_SLOT(ticket);
  std::lock_guard<std::mutex> lock(s->submit_mutex);
  if (slot >= s->slots || (ticket >> 16) != s->generation[slot] || !s->slot_busy[slot]) {
    return SetError(-EINVAL, "ticket 0x%llx is not in flight on this session",
                    static_cast<unsigned long long>(ticket));
  }
  return 0;
}

inline bool Done(engram_session* s, uint64_t ticket) {
  return Shared(s->status[ENGRAM_TICKET_SLOT(ticket)].ticket).load(std::memory_order_acquire) ==
         ticket;
}

int FutexWait(uint32_t* word, uint32_t expected, int64_t timeout_ns) {
  timespec ts{.tv_sec = static_cast<time_t>(timeout_ns / 1'000'000'000),
              .tv_nsec = static_cast<long>(timeout_ns % 1'000'000'000)};
  // Shared (not FUTEX_PRIVATE): the daemon wakes it from another process.
  return static_cast<int>(syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0));
}

}  // namespace

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
                   ENGRAM_FEATURE_ROW_CACHE_MAP | ENGRAM_FEATURE_RESIDENT_TOUCH;
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
    return SetError(-EINVAL,
                    "ENGRAM_IN_PLACE is \"%.64s\": expected 0 (gather through engramd) or 1",
                    value);
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
  s->gather_in_place = in_place_env && (o.flags & (ENGRAM_CONNECT_GATHER_VIA_DAEMON |
                                                   ENGRAM_CONNECT_DEVICE_SUBMIT)) == 0;
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

// The deprecated names (engram.h, convention 8).
int engram_connect(const struct engram_connect_options* options, engram_session** ret_session) {
  return engram_session_open(options, ret_session);
}
void engram_close(engram_session* session) { engram_session_close(session); }

uint32_t engram_row_bytes(void) { return ENGRAM_ROW_BYTES; }

int engram_device_ring(engram_session* s, struct engram_device_ring* ret_ring) {
  if (s == nullptr || ret_ring == nullptr) {
    return SetError(-EINVAL, "engram_device_ring needs a session and ret_ring");
  }
  if (!s->device_submit) {
    return SetError(-EPERM,
                    "this session submits from the host; connect with "
                    "ENGRAM_CONNECT_DEVICE_SUBMIT to hand its ring to a device");
  }
  struct engram_device_ring ring {};
  ring.size = sizeof(ring);
  ring.header = s->header;
  ring.sq = s->sq;
  ring.status = s->status;
  ring.data = s->data;
  ring.data_bytes = s->data_bytes;
  ring.slots = s->slots;
  return WriteStruct("engram_device_ring", ring, ret_ring);
}

int engram_data_region(engram_session* s, void** ret_base, uint64_t* ret_bytes) {
  if (s == nullptr || ret_base == nullptr || ret_bytes == nullptr) {
    return SetError(-EINVAL, "NULL argument to engram_data_region");
  }
  *ret_base = s->data;
  *ret_bytes = s->data_bytes;
  return 0;
}

int engram_arena(engram_session* s, void** ret_base, uint64_t* ret_bytes) {
  if (s == nullptr || ret_base == nullptr || ret_bytes == nullptr) {
    return SetError(-EINVAL, "NULL argument to engram_arena");
  }
  *ret_base = s->arena;
  *ret_bytes = s->arena_bytes;
  return 0;
}

int engram_alloc(engram_session* s, uint64_t bytes, void** ret_ptr) {
  if (s == nullptr || ret_ptr == nullptr || bytes == 0) {
    return SetError(-EINVAL, "engram_alloc needs a session, a size above 0 and ret_ptr");
  }
  if (bytes > s->data_bytes) {
    return SetError(-ENOSPC, "%llu bytes asked from a %llu-byte data region",
                    static_cast<unsigned long long>(bytes),
                    static_cast<unsigned long long>(s->data_bytes));
  }
  const uint64_t size = (bytes + ENGRAM_ARENA_ALIGN - 1) / ENGRAM_ARENA_ALIGN * ENGRAM_ARENA_ALIGN;
  std::lock_guard<std::mutex> lock(s->alloc_mutex);
  for (auto it = s->free_ranges.begin(); it != s->free_ranges.end(); ++it) {
    if (it->second < size) continue;
    const uint64_t offset = it->first;
    const uint64_t left = it->second - size;
    s->free_ranges.erase(it);
    if (left != 0) s->free_ranges[offset + size] = left;
    s->allocations[offset] = size;
    *ret_ptr = s->data + offset;
    return 0;
  }
  uint64_t largest = 0;
  for (const auto& [offset, free] : s->free_ranges) largest = free > largest ? free : largest;
  return SetError(-ENOSPC,
                  "no free range of %llu bytes in the %llu-byte data region (largest free: %llu); "
                  "free buffers or connect with a larger data_bytes",
                  static_cast<unsigned long long>(size),
                  static_cast<unsigned long long>(s->data_bytes),
                  static_cast<unsigned long long>(largest));
}

int engram_free(engram_session* s, void* ptr) {
  if (s == nullptr) return SetError(-EINVAL, "NULL session");
  uint64_t offset;
  if (!InData(s, ptr, 0, &offset)) {
    return SetError(-EINVAL, "%p is not in this session's data region", ptr);
  }
  std::lock_guard<std::mutex> lock(s->alloc_mutex);
  auto it = s->allocations.find(offset);
  if (it == s->allocations.end()) {
    return SetError(-EINVAL, "%p is not an allocation of this session", ptr);
  }
  uint64_t begin = offset;
  uint64_t size = it->second;
  s->allocations.erase(it);
  auto next = s->free_ranges.lower_bound(begin);
  if (next != s->free_ranges.end() && next->first == begin + size) {
    size += next->second;
    next = s->free_ranges.erase(next);
  }
  if (next != s->free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      size += prev->second;
      s->free_ranges.erase(prev);
    }
  }
  s->free_ranges[begin] = size;
  return 0;
}

}  // extern "C"

namespace {

// The submission entry of a gather request, its addresses checked against the data region;
// *ret_flags gets the request's flags.
int GatherSqe(engram_session* s, const struct engram_gather_request* theirs, engram_sqe* ret_sqe,
              uint32_t* ret_flags) {
  engram_gather_request r{};
  if (int rc = ReadStruct("engram_gather_request", theirs, &r); rc < 0) return rc;
  const engram_gather_request* request = &r;
  constexpr uint32_t kPathFlags = ENGRAM_GATHER_IN_PLACE | ENGRAM_GATHER_VIA_DAEMON;
  if ((request->flags & ~kPathFlags) != 0) {
    return SetError(-EINVAL, "unknown request flags 0x%x", request->flags);
  }
  if ((request->flags & kPathFlags) == kPathFlags) {
    return SetError(-EINVAL,
                    "request flags 0x%x ask for both ENGRAM_GATHER_IN_PLACE and "
                    "ENGRAM_GATHER_VIA_DAEMON; give one",
                    request->flags);
  }
  *ret_flags = request->flags;
  const uint64_t n = request->num_rows;
  engram_sqe& sqe = *ret_sqe;
  sqe = engram_sqe{};
  sqe.opcode = ENGRAM_OP_GATHER;
  sqe.table = request->layer;
  sqe.num_rows = n;
  if (n > s->data_bytes / 8 || !InData(s, request->rows, n * 8, &sqe.rows_offset) ||
      sqe.rows_offset % 8 != 0) {
    return SetError(-EINVAL,
                    "the %llu row ids must lie in the session's data region, 8-byte aligned "
                    "(allocate them with engram_alloc)",
                    static_cast<unsigned long long>(n));
  }
  if (request->dest_offsets != nullptr) {
    sqe.flags = ENGRAM_SQE_DEST_OFFSETS;
    if (!InData(s, request->dest, 0, &sqe.dest_offset) ||
        !InData(s, request->dest_offsets, n * 8, &sqe.dest_offsets_offset) ||
        sqe.dest_offsets_offset % 8 != 0) {
      return SetError(-EINVAL,
                      "the destination and its %llu offsets must lie in the session's data "
                      "region (offsets 8-byte aligned)",
                      static_cast<unsigned long long>(n));
    }
  } else if (n > s->data_bytes / ENGRAM_ROW_BYTES ||
             !InData(s, request->dest, n * ENGRAM_ROW_BYTES, &sqe.dest_offset)) {
    return SetError(-EINVAL,
                    "the destination of %llu rows (%llu bytes) must lie in the session's data "
                    "region",
                    static_cast<unsigned long long>(n),
                    static_cast<unsigned long long>(n * ENGRAM_ROW_BYTES));
  }
  return 0;
}

int FetchTables(engram_session* s, std::vector<engram_wire_table>* ret_tables);
int OpenTableMap(engram_session* s, uint32_t layer, bool row_cache, engram_table_map** ret_map);

// How often a table that could not be mapped yet (still loading) is asked for again.
constexpr int64_t kInPlaceRetryNs = 100'000'000;

// The table engram_gather reads `layer` from in place, or null when the daemon is to gather it:
// the table is not resident, still loading, or its mapping failed (asked again later). The
// first call for a table maps it; the mutex is held meanwhile, so concurrent first calls map
// it once.
const engram::client::InPlaceTable* InPlaceFor(engram_session* s, uint32_t layer) {
  std::lock_guard<std::mutex> lock(s->in_place_mutex);
  engram::client::InPlaceTable& t = s->in_place[layer];
  // A withdrawn table is gathered by the daemon (which names the changed file); its mapping
  // stays until the session closes, as another thread may be reading it.
  if (t.map != nullptr) return &t;
  if (t.never || NowNs() < t.retry_at_ns) return nullptr;
  // A daemon that cannot hand out mappings is not asked for every table.
  if (!(s->welcome.features & ENGRAM_FEATURE_TABLE_STATE)) {
    t.never = true;
    return nullptr;
  }
  // The asking is the library's own business: when it ends in the daemon gathering instead, the
  // thread's last error stays what it was, not the refusal of a mapping nobody asked for.
  const std::string last_error = engram::client::LastError();
  std::vector<engram_wire_table> tables;
  const engram_wire_table* wire = nullptr;
  if (FetchTables(s, &tables) == 0) {
    for (const engram_wire_table& w : tables) {
      if (w.layer_id == layer) wire = &w;
    }
  }
  engram_table_map* map = nullptr;
  const int rc = wire != nullptr ? OpenTableMap(s, layer, /*row_cache=*/true, &map) : -ENOENT;
  if (rc == 0) {
    t.map = map;
    t.bounds = {.layer_id = layer,
                .num_rows = wire->num_rows,
                .covered_begin = map->covered_begin,
                .covered_end = map->covered_end};
    return &t;
  }
  // Not resident, refused because its file changed (-EIO: DATA_LOSS), or no such table (the
  // daemon's answer to the request names it): for good.
  t.never = rc == -EOPNOTSUPP || rc == -EIO || (wire == nullptr && tables.size() != 0);
  t.retry_at_ns = NowNs() + kInPlaceRetryNs;
  engram::client::SetErrorMessage(0, last_error);
  return nullptr;
}

// Checks a request for a table read in place as the daemon checks requests (the same decoder,
// so the same errors), as slot 0 of a one-slot context: it never enters the ring.
int DecodeInPlace(engram_session* s, const engram::client::InPlaceTable& table, engram_sqe sqe,
                  proto::DecodedRequest* ret_request) {
  sqe.ticket = uint64_t{1} << 16;
  const proto::RequestContext context{.slots = 1,
                                      .max_rows = s->welcome.max_rows_per_request,
                                      .data = s->data,
                                      .data_bytes = s->data_bytes,
                                      .tables = {&table.bounds, 1}};
  bool slot_valid = false;
  proto::CodecError error;
  if (!proto::DecodeRequest(sqe, context, ret_request, &slot_valid, &error)) {
    return SetError(ErrnoForCode(error.code), "engramd (table %u read in place): %s: %s", sqe.table,
                    proto::StatusCodeName(error.code), error.message.c_str());
  }
  return 0;
}

// engram_gather of a request for a table read in place: checked as the daemon checks requests
// (the same decoder, so the same errors), then copied on this thread. -ESTALE when the table
// was withdrawn before or during the copy: the caller asks the daemon instead.
int GatherInPlace(engram_session* s, const engram::client::InPlaceTable& table, engram_sqe sqe) {
  proto::DecodedRequest request;
  if (int rc = DecodeInPlace(s, table, sqe, &request); rc < 0) return rc;
  if (int rc = engram::client::CopyInPlace(table, request, s->data); rc < 0) {
    // The daemon died (the kernel marked the table state page): the session is lost too.
    if (rc == -ENOTCONN) s->lost.store(true);
    return rc == -ENOTCONN ? LostError(s) : rc;
  }
  s->counters.rows_in_place.fetch_add(request.rows.size(), std::memory_order_relaxed);
  engram::client::ReportResident(*table.map, request.rows.size());
  return 0;
}

// GatherInPlace for a table of the cache tier: the hits are copied here, the misses go to the
// daemon as one request into the same destination slots (it reads them and admits them to the
// cache as it would have). -ESTALE as GatherInPlace's (nothing was sent).
int GatherCachedInPlace(engram_session* s, const engram::client::InPlaceTable& table,
                        engram_sqe sqe, int64_t timeout_ns) {
  proto::DecodedRequest request;
  if (int rc = DecodeInPlace(s, table, sqe, &request); rc < 0) return rc;
  thread_local engram::client::CachedCopy copy;
  if (int rc = engram::client::CopyCached(table, request, s->data, &copy); rc < 0) {
    if (rc == -ENOTCONN) s->lost.store(true);
    return rc == -ENOTCONN ? LostError(s) : rc;
  }
  const uint64_t misses = copy.miss_rows.size();
  // The misses' ids and offsets go into the data region, where the daemon reads requests.
  uint8_t* scratch = nullptr;
  if (misses != 0 &&
      engram_alloc(s, misses * 16, reinterpret_cast<void**>(&scratch)) < 0) {
    // No room for them: the daemon gathers the whole request (the hits again too).
    uint64_t ticket;
    if (int rc = Push(s, sqe, &ticket); rc < 0) return rc;
    return engram_wait(s, ticket, timeout_ns);
  }
  {
    std::lock_guard<std::mutex> lock(s->touch_mutex);
    engram::client::ReportCached(*table.map, copy, /*all_hit=*/misses == 0);
  }
  s->counters.rows_in_place.fetch_add(copy.hits, std::memory_order_relaxed);
  if (misses == 0) return 0;
  memcpy(scratch, copy.miss_rows.data(), misses * 8);
  memcpy(scratch + misses * 8, copy.miss_offsets.data(), misses * 8);
  engram_sqe miss{};
  miss.opcode = ENGRAM_OP_GATHER;
  miss.table = sqe.table;
  miss.num_rows = misses;
  miss.flags = ENGRAM_SQE_DEST_OFFSETS;
  miss.rows_offset = static_cast<uint64_t>(scratch - s->data);
  miss.dest_offset = request.dest_offset;
  miss.dest_offsets_offset = miss.rows_offset + misses * 8;
  uint64_t ticket;
  int rc = Push(s, miss, &ticket);
  if (rc == 0) rc = engram_wait(s, ticket, timeout_ns);
  // A request still in flight (timed out, or the session lost) keeps its ids until the end.
  if (rc != -ETIMEDOUT && rc != -ENOTCONN) engram_free(s, scratch);
  return rc;
}

// engram_gather of a checked submission entry: in place where `in_place` and the table can be
// read here, else (or when the table was withdrawn meanwhile) through the daemon.
int GatherNow(engram_session* s, const engram_sqe& sqe, bool in_place, int64_t timeout_ns) {
  if (in_place) {
    if (CheckLostCheap(s)) return LostError(s);
    if (const engram::client::InPlaceTable* t = InPlaceFor(s, sqe.table); t != nullptr) {
      const int rc = t->map->row_cache ? GatherCachedInPlace(s, *t, sqe, timeout_ns)
                                       : GatherInPlace(s, *t, sqe);
      if (rc != -ESTALE) return rc;
    }
  }
  uint64_t ticket;
  if (int rc = Push(s, sqe, &ticket); rc < 0) return rc;
  return engram_wait(s, ticket, timeout_ns);
}

}  // namespace

extern "C" {

int engram_submit(engram_session* s, const struct engram_gather_request* request,
                  uint64_t* ret_ticket) {
  if (s == nullptr || request == nullptr || ret_ticket == nullptr) {
    return SetError(-EINVAL, "engram_submit needs a session, a request and ret_ticket");
  }
  engram_sqe sqe;
  uint32_t flags;
  if (int rc = GatherSqe(s, request, &sqe, &flags); rc < 0) return rc;
  return Push(s, sqe, ret_ticket);
}

}  // extern "C"

namespace {

int WaitFor(engram_session* s, uint64_t ticket, int64_t timeout_ns, uint64_t* ret_rows);

// One PREFETCH entry of at most ENGRAM_PREFETCH_MAX_ROWS rows whose ids lie in the data region
// at `rows_offset`: submitted, then waited for (the daemon completes it once the ids are checked
// and queued, never after I/O). `first` is the index of its first row in the caller's array,
// for the error message.
int PrefetchChunk(engram_session* s, uint32_t table, uint64_t rows_offset, uint64_t n,
                  uint64_t first, uint64_t* ret_queued) {
  engram_sqe sqe{};
  sqe.opcode = ENGRAM_OP_PREFETCH;
  sqe.table = table;
  sqe.num_rows = n;
  sqe.rows_offset = rows_offset;
  uint64_t ticket;
  if (int rc = Push(s, sqe, &ticket); rc < 0) return rc;
  uint64_t queued = 0;
  if (int rc = WaitFor(s, ticket, -1, &queued); rc < 0) {
    if (first == 0) return rc;
    return SetError(rc, "rows [%llu, %llu) of the prefetch: %s",
                    static_cast<unsigned long long>(first),
                    static_cast<unsigned long long>(first + n), engram_last_error());
  }
  *ret_queued += queued;
  return 0;
}

}  // namespace

extern "C" {

int engram_prefetch(engram_session* s, uint32_t layer, const uint64_t* rows, uint64_t num_rows,
                    uint32_t flags, uint64_t* ret_queued) {
  if (s == nullptr || (rows == nullptr && num_rows != 0)) {
    return SetError(-EINVAL, "engram_prefetch needs a session and the row ids");
  }
  if (flags != 0) return SetError(-EINVAL, "table %u: unknown prefetch flags 0x%x", layer, flags);
  if (!(s->welcome.features & ENGRAM_FEATURE_PREFETCH)) {
    return SetError(-EOPNOTSUPP,
                    "engramd at %s (protocol %u.%u) does not take prefetches (protocol 1.2 "
                    "does); upgrade it",
                    s->socket_path.c_str(), s->welcome.version_major, s->welcome.version_minor);
  }
  uint64_t queued = 0;
  uint64_t offset = 0;
  // Ids that already lie in the data region go as they are; others are copied there, a chunk
  // at a time, into one buffer this call holds.
  const bool in_data = num_rows <= s->data_bytes / 8 && InData(s, rows, num_rows * 8, &offset) &&
                       offset % 8 == 0;
  uint64_t* staging = nullptr;
  if (!in_data && num_rows != 0) {
    const uint64_t chunk = std::min<uint64_t>(num_rows, ENGRAM_PREFETCH_MAX_ROWS);
    if (int rc = engram_alloc(s, chunk * 8, reinterpret_cast<void**>(&staging)); rc < 0) {
      return SetError(rc, "table %u: no room for %llu prefetched row ids in the data region: %s",
                      layer, static_cast<unsigned long long>(chunk), engram_last_error());
    }
  }
  int rc = 0;
  for (uint64_t first = 0; first < num_rows && rc == 0; first += ENGRAM_PREFETCH_MAX_ROWS) {
    const uint64_t n = std::min<uint64_t>(num_rows - first, ENGRAM_PREFETCH_MAX_ROWS);
    uint64_t chunk_offset = offset + first * 8;
    if (staging != nullptr) {
      memcpy(staging, rows + first, n * 8);
      InData(s, staging, n * 8, &chunk_offset);
    }
    rc = PrefetchChunk(s, layer, chunk_offset, n, first, &queued);
  }
  if (staging != nullptr) {
    // The ids stay until a chunk completes: a chunk lost in flight keeps its buffer.
    if (rc != -ENOTCONN && rc != -ETIMEDOUT) engram_free(s, staging);
  }
  if (rc < 0) return rc;
  if (ret_queued != nullptr) *ret_queued = queued;
  return 0;
}

int engram_submit_nop(engram_session* s, uint64_t* ret_ticket) {
  if (s == nullptr || ret_ticket == nullptr) {
    return SetError(-EINVAL, "engram_submit_nop needs a session and ret_ticket");
  }
  engram_sqe sqe{};
  sqe.opcode = ENGRAM_OP_NOP;
  return Push(s, sqe, ret_ticket);
}

int engram_poll(engram_session* s, uint64_t ticket) {
  if (s == nullptr) return SetError(-EINVAL, "NULL session");
  if (int rc = CheckTicket(s, ticket); rc < 0) return rc;
  if (Done(s, ticket)) return Consume(s, ticket);
  if (CheckLostCheap(s)) return LostError(s);
  return SetError(-EAGAIN, "ticket 0x%llx is still in flight",
                  static_cast<unsigned long long>(ticket));
}

}  // extern "C"

namespace {

// engram_wait; *ret_rows (if not null) gets the rows the completion reported.
int WaitFor(engram_session* s, uint64_t ticket, int64_t timeout_ns, uint64_t* ret_rows) {
  if (s == nullptr) return SetError(-EINVAL, "NULL session");
  if (int rc = CheckTicket(s, ticket); rc < 0) return rc;
  if (Done(s, ticket)) return Consume(s, ticket, ret_rows);
  const int64_t start = NowNs();
  const int64_t deadline = timeout_ns < 0 ? INT64_MAX : start + timeout_ns;
  std::atomic_ref<uint32_t> waiters(s->header->client_waiters);
  // The low half of the completion counter is the futex word (little-endian).
  uint32_t* word = reinterpret_cast<uint32_t*>(&s->header->completions);
  // Spin first: a round trip through shared memory costs a fraction of a futex wake-up.
  int64_t spin_ns = s->spin_ns;
  int64_t spin_from = start;
  if (s->adaptive_spin) {
    uint64_t rows;
    {
      std::lock_guard<std::mutex> lock(s->submit_mutex);
      rows = s->slot_rows[ENGRAM_TICKET_SLOT(ticket)];
    }
    const int64_t predicted =
        static_cast<int64_t>(rows * s->ns_per_row_x16.load(std::memory_order_relaxed) / 16);
    if (predicted > kNapMinNs && start + predicted - kNapMarginNs < deadline) {
      // Nap through most of a long request (the daemon wakes the futex if it ends sooner).
      const int64_t nap_until = start + predicted - kNapMarginNs;
      waiters.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = Shared(*word).load(std::memory_order_seq_cst);
      if (!Done(s, ticket)) FutexWait(word, seen, nap_until - NowNs());
      waiters.fetch_sub(1, std::memory_order_seq_cst);
      spin_from = NowNs();
      spin_ns = std::max<int64_t>(spin_ns, 2 * kNapMarginNs);
    } else {
      spin_ns = std::max<int64_t>(
          spin_ns, std::min<int64_t>(kAdaptiveSpinMaxNs, predicted * 5 / 4));
    }
  }
  const int64_t spin_until = spin_from + std::min<int64_t>(spin_ns, deadline - spin_from);
  for (uint32_t i = 1;; ++i) {
    if (Done(s, ticket)) return Consume(s, ticket, ret_rows);
    if ((i & 63) == 0) {
      if (CheckLostCheap(s)) break;
      if (NowNs() >= spin_until) break;
    }
    engram::CpuRelax();
  }
  while (true) {
    if (Done(s, ticket)) return Consume(s, ticket, ret_rows);
    if (CheckLostCheap(s)) return LostError(s);
    const int64_t now = NowNs();
    // Only a wait that is about to sleep asks the kernel whether the socket hung up.
    if (now < deadline && CheckLost(s)) return LostError(s);
    if (now >= deadline) {
      return SetError(-ETIMEDOUT, "ticket 0x%llx still in flight after %lld µs",
                      static_cast<unsigned long long>(ticket),
                      static_cast<long long>((now - start) / 1000));
    }
    waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = Shared(*word).load(std::memory_order_seq_cst);
    if (!Done(s, ticket)) {
      s->counters.client_sleeps.fetch_add(1, std::memory_order_relaxed);
      FutexWait(word, seen, std::min(deadline - now, kLivenessCheckNs));
    }
    waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace

extern "C" {

int engram_wait(engram_session* s, uint64_t ticket, int64_t timeout_ns) {
  return WaitFor(s, ticket, timeout_ns, nullptr);
}

int engram_gather(engram_session* s, const struct engram_gather_request* request,
                  int64_t timeout_ns) {
  if (s == nullptr || request == nullptr) {
    return SetError(-EINVAL, "engram_gather needs a session and a request");
  }
  engram_sqe sqe;
  uint32_t flags;
  if (int rc = GatherSqe(s, request, &sqe, &flags); rc < 0) return rc;
  const bool in_place = (flags & ENGRAM_GATHER_IN_PLACE) != 0 ||
                        ((flags & ENGRAM_GATHER_VIA_DAEMON) == 0 && s->gather_in_place);
  return GatherNow(s, sqe, in_place, timeout_ns);
}

}  // extern "C"

namespace {

// The head range of a token request: a TP rank's, an explicit one, or the whole layer.
int TokenHeads(const engram_hasher* hasher, const engram_token_request& r, uint32_t* ret_head_begin,
               uint32_t* ret_head_end) {
  uint32_t head_begin = r.head_begin;
  uint32_t head_end = r.head_end;
  if (r.tp_size != 0) {
    if (r.head_begin != 0 || r.head_end != 0) {
      return SetError(-EINVAL,
                      "table %u: both a head range [%u, %u) and TP rank %u of %u were given; "
                      "give one",
                      r.layer, r.head_begin, r.head_end, r.tp_rank, r.tp_size);
    }
    if (engram_hasher_rank_heads(hasher, r.tp_size, r.tp_rank, &head_begin, &head_end) < 0) {
      return SetError(-EINVAL, "table %u: %s", r.layer, engram_last_error());
    }
  } else if (head_begin == 0 && head_end == 0) {
    engram_hasher_info info{};
    info.size = sizeof(info);
    if (engram_hasher_get_info(hasher, &info) < 0) {
      return SetError(-EINVAL, "table %u: %s", r.layer, engram_last_error());
    }
    head_end = info.heads_per_layer;
  }
  if (head_end <= head_begin) {
    return SetError(-EINVAL, "table %u: empty or reversed head range [%u, %u)", r.layer, head_begin,
                    head_end);
  }
  *ret_head_begin = head_begin;
  *ret_head_end = head_end;
  return 0;
}

// The tokens of a token request's sequences (an array whose first element's size is the
// stride), bounded by what the data region could hold.
int TokenPositions(const engram_session* s, const engram_token_request& r,
                   uint64_t* ret_positions) {
  uint64_t positions = 0;
  size_t stride = 0;
  if (int rc = engram::client::CheckArray("engram_hash_seq", r.seqs, r.n_seqs,
                                          sizeof(engram_hash_seq), &stride);
      rc < 0) {
    return rc;
  }
  for (size_t i = 0; i < r.n_seqs; ++i) {
    engram_hash_seq seq{};
    const void* theirs = engram::client::ArrayElement(r.seqs, stride, i);
    if (int rc = ReadStruct("engram_hash_seq", theirs, &seq); rc < 0) return rc;
    positions += seq.n_tokens;
    if (positions > s->data_bytes) {
      return SetError(-EINVAL, "table %u: more tokens than the %llu-byte data region can hold",
                      r.layer, static_cast<unsigned long long>(s->data_bytes));
    }
  }
  *ret_positions = positions;
  return 0;
}

// The submission entry of a token request, its ids hashed into the data region where the daemon
// (or the in-place path) reads them: the request needs no other copy.
int TokenSqe(engram_session* s, const engram_hasher* hasher,
             const struct engram_token_request* request, engram_sqe* ret_sqe) {
  engram_token_request r{};
  if (int rc = ReadStruct("engram_token_request", request, &r); rc < 0) return rc;
  if ((r.flags & ~ENGRAM_HASH_COMPRESSED_IDS) != 0) {
    return SetError(-EINVAL, "table %u: unknown token request flags 0x%x", r.layer, r.flags);
  }
  if (r.seqs == nullptr && r.n_seqs > 0) {
    return SetError(-EINVAL, "table %u: %zu sequences but seqs is NULL", r.layer, r.n_seqs);
  }
  uint32_t head_begin = 0;
  uint32_t head_end = 0;
  if (int rc = TokenHeads(hasher, r, &head_begin, &head_end); rc < 0) return rc;
  uint64_t positions = 0;
  if (int rc = TokenPositions(s, r, &positions); rc < 0) return rc;
  const uint64_t heads = head_end - head_begin;
  const uint64_t n = positions * heads;  // positions <= data_bytes < 2^40, heads < 2^16
  uint64_t rows_offset = 0;
  uint64_t dest_offset = 0;
  if (r.rows_cap > s->data_bytes / 8 || !InData(s, r.rows, r.rows_cap * 8, &rows_offset) ||
      rows_offset % 8 != 0) {
    return SetError(-EINVAL,
                    "table %u: the row ids (rows_cap %llu) must lie in the session's data "
                    "region, 8-byte aligned (allocate them with engram_alloc)",
                    r.layer, static_cast<unsigned long long>(r.rows_cap));
  }
  if (n > r.rows_cap) {
    return SetError(
        -ENOSPC, "table %u: %llu positions x %llu heads need %llu row ids; rows_cap is %llu",
        r.layer, static_cast<unsigned long long>(positions), static_cast<unsigned long long>(heads),
        static_cast<unsigned long long>(n), static_cast<unsigned long long>(r.rows_cap));
  }
  if (n > s->data_bytes / ENGRAM_ROW_BYTES ||
      !InData(s, r.dest, n * ENGRAM_ROW_BYTES, &dest_offset)) {
    return SetError(-EINVAL,
                    "table %u: the destination of %llu rows (%llu bytes) must lie in the "
                    "session's data region",
                    r.layer, static_cast<unsigned long long>(n),
                    static_cast<unsigned long long>(n * ENGRAM_ROW_BYTES));
  }
  if (int rc = engram_hash(hasher, r.layer, r.seqs, r.n_seqs, head_begin, head_end, r.flags, r.rows,
                           r.rows_cap);
      rc < 0) {
    return SetError(rc, "table %u: %s", r.layer, engram_last_error());
  }
  engram_sqe sqe{};
  sqe.opcode = ENGRAM_OP_GATHER;
  sqe.table = r.layer;
  sqe.num_rows = n;
  sqe.rows_offset = rows_offset;
  sqe.dest_offset = dest_offset;
  *ret_sqe = sqe;
  return 0;
}

}  // namespace

extern "C" {

int engram_submit_tokens(engram_session* s, const engram_hasher* hasher,
                         const struct engram_token_request* request, uint64_t* ret_ticket,
                         uint64_t* ret_num_rows) {
  if (s == nullptr || hasher == nullptr || request == nullptr || ret_ticket == nullptr) {
    return SetError(-EINVAL,
                    "engram_submit_tokens needs a session, a hasher, a request and ret_ticket");
  }
  engram_sqe sqe;
  if (int rc = TokenSqe(s, hasher, request, &sqe); rc < 0) return rc;
  if (int rc = Push(s, sqe, ret_ticket); rc < 0) return rc;
  if (ret_num_rows != nullptr) *ret_num_rows = sqe.num_rows;
  return 0;
}

int engram_gather_tokens(engram_session* s, const engram_hasher* hasher,
                         const struct engram_token_request* request, int64_t timeout_ns) {
  if (s == nullptr || hasher == nullptr || request == nullptr) {
    return SetError(-EINVAL, "engram_gather_tokens needs a session, a hasher and a request");
  }
  engram_sqe sqe;
  if (int rc = TokenSqe(s, hasher, request, &sqe); rc < 0) return rc;
  return GatherNow(s, sqe, s->gather_in_place, timeout_ns);
}

int engram_completion_counter(engram_session* s, const volatile uint64_t** ret_counter) {
  if (s == nullptr || ret_counter == nullptr) {
    return SetError(-EINVAL, "NULL argument to engram_completion_counter");
  }
  *ret_counter = &s->header->completions;
  return 0;
}

}  // extern "C"

namespace {

// The daemon's table list, as the wire gives it.
int FetchTables(engram_session* s, std::vector<engram_wire_table>* ret_tables) {
  std::vector<uint8_t> reply;
  if (int rc = ControlExchange(s, ENGRAM_MSG_LIST_TABLES, ENGRAM_MSG_TABLES, &reply); rc < 0) {
    return rc;
  }
  engram_msg_tables head;
  if (reply.size() < sizeof(head)) return SetError(-EPROTO, "short TABLES reply");
  memcpy(&head, reply.data(), sizeof(head));
  if (head.entry_bytes < sizeof(engram_wire_table) ||
      (reply.size() - sizeof(head)) / head.entry_bytes < head.count) {
    return SetError(-EPROTO, "TABLES reply with %u entries of %u bytes in %zu bytes", head.count,
                    head.entry_bytes, reply.size());
  }
  ret_tables->resize(head.count);
  for (uint32_t i = 0; i < head.count; ++i) {
    memcpy(&(*ret_tables)[i], reply.data() + sizeof(head) + size_t{i} * head.entry_bytes,
           sizeof(engram_wire_table));
  }
  return 0;
}

engram_table_info TableInfo(const engram_wire_table& w) {
  engram_table_info t{};
  t.size = sizeof(t);
  t.layer = w.layer_id;
  t.row_bytes = w.row_bytes;
  t.num_rows = w.num_rows;
  t.covered_begin = w.covered_begin;
  t.covered_end = w.covered_end;
  t.layout = w.layout;
  t.files = w.files;
  t.data_bytes = w.data_bytes;
  return t;
}

}  // namespace

extern "C" {

int engram_list_tables(engram_session* s, struct engram_table_info* ret_tables, size_t capacity,
                       size_t* ret_count) {
  if (s == nullptr || ret_count == nullptr || (capacity != 0 && ret_tables == nullptr)) {
    return SetError(-EINVAL, "engram_list_tables needs a session, ret_count and room");
  }
  size_t stride = 0;
  if (int rc = engram::client::CheckArray("engram_table_info", ret_tables, capacity,
                                          sizeof(engram_table_info), &stride);
      rc < 0) {
    return rc;
  }
  std::vector<engram_wire_table> tables;
  if (int rc = FetchTables(s, &tables); rc < 0) return rc;
  for (size_t i = 0; i < tables.size() && i < capacity; ++i) {
    WriteStruct("engram_table_info", TableInfo(tables[i]),
                engram::client::ArrayElement(static_cast<void*>(ret_tables), stride, i));
  }
  *ret_count = tables.size();
  return 0;
}

int engram_get_session_stats(engram_session* s, struct engram_session_stats* ret_stats) {
  if (s == nullptr || ret_stats == nullptr) {
    return SetError(-EINVAL, "engram_get_session_stats needs a session and ret_stats");
  }
  // Checked before the round trip: a refused struct costs no message to the daemon.
  if (int rc = engram::client::CheckOutput("engram_session_stats", ret_stats,
                                           sizeof(engram_session_stats));
      rc < 0) {
    return rc;
  }
  std::vector<uint8_t> reply;
  if (int rc = ControlExchange(s, ENGRAM_MSG_SESSION_STATS, ENGRAM_MSG_STATS, &reply); rc < 0) {
    return rc;
  }
  engram_msg_stats m;
  if (reply.size() != sizeof(m)) return SetError(-EPROTO, "STATS reply of %zu bytes", reply.size());
  memcpy(&m, reply.data(), sizeof(m));
  struct engram_session_stats out {};
  out.size = sizeof(out);
  out.session_id = m.stats.session_id;
#define ENGRAM_STATS_COPY_(field, origin, type, metric, help)          \
  ENGRAM_SESSION_ON_WIRE_##origin(out.field = m.stats.field;)         \
  ENGRAM_SESSION_LIBRARY_##origin(out.field = s->counters.field.load();)
  ENGRAM_SESSION_COUNTERS(ENGRAM_STATS_COPY_)
#undef ENGRAM_STATS_COPY_
  return WriteStruct("engram_session_stats", out, ret_stats);
}

// The ABI's layout of engram_session_stats (LP64): the list in engram/session_stats.h is only
// ever appended to.
static_assert(sizeof(size_t) != 8 || (offsetof(engram_session_stats, session_id) == 8 &&
                                      offsetof(engram_session_stats, doorbells) == 64 &&
                                      offsetof(engram_session_stats, rows_in_place) == 112),
              "engram_session_stats' fields keep their places");

int engram_session_stats_field(size_t index, const char** ret_name, const char** ret_help) {
  struct Field {
    const char* name;
    const char* help;
  };
  static constexpr Field kFields[] = {
      {"session_id", "The session's id, as engramd numbers sessions"},
#define ENGRAM_STATS_NAME_(field, origin, type, metric, help) {#field, help},
      ENGRAM_SESSION_COUNTERS(ENGRAM_STATS_NAME_)
#undef ENGRAM_STATS_NAME_
  };
  constexpr size_t kCount = sizeof(kFields) / sizeof(kFields[0]);
  static_assert(sizeof(struct engram_session_stats) == sizeof(size_t) + kCount * 8 ||
                    sizeof(size_t) != 8,
                "one uint64_t of engram_session_stats per field named here");
  if (ret_name == nullptr || ret_help == nullptr) {
    return SetError(-EINVAL, "engram_session_stats_field needs ret_name and ret_help");
  }
  if (index >= kCount) {
    return SetError(-ERANGE, "engram_session_stats has %zu fields after size; no field %zu",
                    kCount, index);
  }
  *ret_name = kFields[index].name;
  *ret_help = kFields[index].help;
  return 0;
}

int engram_table_map_open(engram_session* s, uint32_t layer, engram_table_map** ret_map) {
  if (s == nullptr || ret_map == nullptr) {
    return SetError(-EINVAL, "engram_table_map_open needs a session and ret_map");
  }
  return OpenTableMap(s, layer, /*row_cache=*/false, ret_map);
}

// A cache-tier table's map is its row cache (ENGRAM_TABLE_MAP_ROW_CACHE), for a GPU to read. A
// call of its own: callers of engram_table_map_open built before info.kind read every map as
// a resident table.
int engram_table_map_open_any(engram_session* s, uint32_t layer, engram_table_map** ret_map) {
  if (s == nullptr || ret_map == nullptr) {
    return SetError(-EINVAL, "engram_table_map_open_any needs a session and ret_map");
  }
  return OpenTableMap(s, layer, /*row_cache=*/true, ret_map);
}

}  // extern "C"

namespace {

// engram_table_map_open; `row_cache`: a cache-tier table's row cache mapping is wanted too
// (engram_gather's in-place path), else such a table is refused as not resident.
int OpenTableMap(engram_session* s, uint32_t layer, bool row_cache, engram_table_map** ret_map) {
  if (s->lost.load()) return LostError(s);
  if (!(s->welcome.features & ENGRAM_FEATURE_TABLE_STATE)) {
    return SetError(-EOPNOTSUPP,
                    "engramd at %s (protocol %u.%u) cannot tell a client when a mapped table is "
                    "withdrawn (protocol 1.3 can), so its tables are not read in place; upgrade it",
                    s->socket_path.c_str(), s->welcome.version_major, s->welcome.version_minor);
  }
  std::lock_guard<std::mutex> lock(s->control_mutex);
  engram_msg_map_table request{};
  const uint32_t id = s->next_request_id++;
  proto::FillHeader(&request.header, ENGRAM_MSG_MAP_TABLE, sizeof(request), id);
  request.layer_id = layer;
  if (SendAll(s->socket.get(), &request, sizeof(request)) < 0) {
    s->lost.store(true);
    return LostError(s);
  }
  std::vector<uint8_t> reply(ENGRAM_MSG_MAX_BYTES);
  int fds[3] = {-1, -1, -1};
  int nfds = 0;
  const ssize_t n =
      proto::ReceiveMessage(s->socket.get(), reply.data(), reply.size(), fds, 3, &nfds);
  const auto close_fds = [&] {
    for (int i = 0; i < nfds; ++i) close(fds[i]);
  };
  if (n == 0 || n == -ECONNRESET || n == -EPIPE) {
    s->lost.store(true);
    return LostError(s);
  }
  if (n < 0) return SetError(static_cast<int>(n), "no reply from engramd: %s", strerror(-n));
  engram_msg_header header;
  proto::CodecError error;
  if (!proto::DecodeHeader(reply.data(), static_cast<size_t>(n), &header, &error) ||
      header.request_id != id ||
      (header.type != ENGRAM_MSG_ERROR && header.type != ENGRAM_MSG_TABLE_MAPPED)) {
    close_fds();
    return SetError(-EPROTO, "bad reply from engramd to MAP_TABLE for layer %u", layer);
  }
  if (header.type == ENGRAM_MSG_ERROR) {
    close_fds();
    proto::DecodeError(reply.data(), static_cast<size_t>(n), &error);
    // Not -ENOTCONN for "still loading": that means "reconnect" everywhere else.
    const int rc = error.code == ENGRAM_STATUS_FAILED_PRECONDITION ? -EOPNOTSUPP
                   : error.code == ENGRAM_STATUS_UNAVAILABLE       ? -EAGAIN
                                                                   : ErrnoForCode(error.code);
    return SetError(rc, "engramd: %s", error.message.c_str());
  }
  engram_msg_table_mapped m;
  if (static_cast<size_t>(n) != sizeof(m)) {
    close_fds();
    return SetError(-EPROTO, "TABLE_MAPPED reply of %zd bytes with %d descriptors", n, nfds);
  }
  memcpy(&m, reply.data(), sizeof(m));
  const engram::client::MappedTable table{.layer = m.layer_id,
                                          .row_bytes = m.row_bytes,
                                          .covered_begin = m.covered_begin,
                                          .covered_end = m.covered_end,
                                          .map_bytes = m.map_bytes,
                                          .state_index = m.state_index};
  if (m.kind == ENGRAM_TABLE_MAPPED_ROW_CACHE && nfds == 3) {
    if (!row_cache) {
      close_fds();
      return SetError(-EOPNOTSUPP,
                      "layer %u is served from engramd's row cache (the cache tier), not "
                      "resident: only engram_gather reads its rows in place (the hits; the misses "
                      "through engramd)",
                      layer);
    }
    return engram::client::MapRowCache(fds[0], fds[1], fds[2], table, ret_map);
  }
  // With ENGRAM_FEATURE_RESIDENT_TOUCH a resident table comes with the session's touch page.
  const int resident_fds = (s->welcome.features & ENGRAM_FEATURE_RESIDENT_TOUCH) ? 3 : 2;
  if (m.kind != ENGRAM_TABLE_MAPPED_RESIDENT || nfds != resident_fds) {
    close_fds();
    return SetError(-EPROTO, "TABLE_MAPPED reply of kind %u with %d descriptors", m.kind, nfds);
  }
  return engram::client::MapSealedTable(fds[0], fds[1], resident_fds == 3 ? fds[2] : -1, table,
                                        ret_map);
}

}  // namespace

extern "C" {

int engram_map_table(engram_session* s, uint32_t layer, engram_table_map** ret_map) {
  return engram_table_map_open(s, layer, ret_map);
}

void engram_protocol_version(uint32_t* ret_major, uint32_t* ret_minor) {
  if (ret_major != nullptr) *ret_major = ENGRAM_PROTOCOL_MAJOR;
  if (ret_minor != nullptr) *ret_minor = ENGRAM_PROTOCOL_MINOR;
}

}  // extern "C"
