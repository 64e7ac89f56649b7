// Daemon-side session: ring consumption and completion publishing (see session.h).
#include "daemon/server/session.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>

#include "absl/base/config.h"
#include "absl/strings/str_format.h"
#include "base/escape.h"

#if defined(ABSL_HAVE_THREAD_SANITIZER)  // gcc's and clang's ways of saying so
#include <sanitizer/tsan_interface.h>
#endif

namespace engram {
namespace {

template <typename T>
std::atomic_ref<T> Shared(T& word) {
  return std::atomic_ref<T>(word);
}

// ThreadSanitizer sees this process only. Two request threads that use the same arena memory
// one after the other (a status slot, rows of the data region a client reuses) are ordered
// through the client: the daemon publishes a completion (release), the client sees it
// (acquire), reuses the memory for a new request and publishes that (release of sq_tail), and
// the poller takes it (acquire). TSan cannot see the client's half, so without these two calls
// it reports every such reuse as a race between the two request threads. They tell it of that
// order, per session, and of nothing else: what was done before a completion was published
// comes before what is done for the submissions taken after it.
#if defined(ABSL_HAVE_THREAD_SANITIZER)
void ClientOrderRelease(const char* order) { __tsan_release(const_cast<char*>(order)); }
void ClientOrderAcquire(const char* order) { __tsan_acquire(const_cast<char*>(order)); }
#else
void ClientOrderRelease(const char*) {}
void ClientOrderAcquire(const char*) {}
#endif

uint64_t Percentile(const std::array<std::atomic<uint64_t>, 64>& buckets, double q) {
  uint64_t total = 0;
  for (const auto& b : buckets) total += b.load(std::memory_order_relaxed);
  if (total == 0) return 0;
  const uint64_t rank = static_cast<uint64_t>(q * static_cast<double>(total - 1)) + 1;
  uint64_t seen = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    seen += buckets[i].load(std::memory_order_relaxed);
    if (seen >= rank) return i >= 63 ? UINT64_MAX : (uint64_t{2} << i);  // bucket's upper bound
  }
  return UINT64_MAX;
}

}  // namespace

Session::Session(uint64_t id, int socket_fd, std::unique_ptr<Arena> arena, int doorbell_fd,
                 const PeerInfo& peer, std::string name)
    : id_(id),
      socket_fd_(socket_fd),
      arena_(std::move(arena)),
      doorbell_fd_(doorbell_fd),
      peer_(peer),
      name_(std::move(name)) {}

std::string Session::Describe() const {
  return absl::StrFormat("session %u (pid %d, uid %u, '%s')", id_, peer_.pid, peer_.uid,
                         EscapeBytes(name_));
}

bool Session::HasSubmissions() const {
  return Shared(arena_->header()->sq_tail).load(std::memory_order_acquire) != sq_head_;
}

void Session::SetNeedWakeup(bool on) {
  Shared(arena_->header()->sq_flags)
      .store(on ? ENGRAM_SQ_NEED_WAKEUP : 0u, std::memory_order_seq_cst);
  // The flag's store must be ordered before the poller's next load of sq_tail (a store then a
  // load of another word: what no release/acquire pair orders; Arm's LDAPR, which compilers emit
  // for acquire loads on Armv8.3 and later, may pass a store-release). The client mirrors it:
  // its sq_tail store, a full fence, then its load of the flag; with both fences one side sees
  // the other's store, so a submission is never left unseen while the poller sleeps.
  if (on) std::atomic_thread_fence(std::memory_order_seq_cst);
}

uint32_t Session::TakeSubmissions(engram_sqe* out, uint32_t max, bool* ret_garbage) {
  *ret_garbage = false;
  engram_arena_header* h = arena_->header();
  const uint32_t tail = Shared(h->sq_tail).load(std::memory_order_acquire);
  const uint32_t pending = tail - sq_head_;
  if (pending == 0) return 0;
  const uint32_t slots = arena_->layout().slots;
  if (pending > slots) {
    // The client wrote a tail that no correct client can: skip everything up to it.
    *ret_garbage = true;
    counters.garbage.fetch_add(1, std::memory_order_relaxed);
    sq_head_ = tail;
    Shared(h->sq_head).store(sq_head_, std::memory_order_release);
    return 0;
  }
  const uint32_t n = pending < max ? pending : max;
  ClientOrderAcquire(&client_order_);
  const engram_sqe* sq = arena_->sq();
  for (uint32_t i = 0; i < n; ++i) {
    // A copy: from here on only the daemon's own bytes are looked at.
    memcpy(&out[i], &sq[(sq_head_ + i) % slots], sizeof(engram_sqe));
  }
  sq_head_ += n;
  Shared(h->sq_head).store(sq_head_, std::memory_order_release);
  return n;
}

void Session::Complete(uint64_t ticket, uint32_t slot, int32_t code, const char* message,
                       uint64_t rows, uint64_t service_ns, bool rows_written) {
  // Counted before the completion is published: a client that sees its request done and then
  // asks for statistics finds the request in them.
  if (code == ENGRAM_STATUS_OK) {
    counters.requests_ok.fetch_add(1, std::memory_order_relaxed);
    if (rows_written) {
      counters.rows.fetch_add(rows, std::memory_order_relaxed);
      counters.bytes.fetch_add(rows * ENGRAM_ROW_BYTES, std::memory_order_relaxed);
    }
  } else {
    counters.requests_failed.fetch_add(1, std::memory_order_relaxed);
  }
  const int bucket = service_ns == 0 ? 0 : 63 - __builtin_clzll(service_ns);
  counters.latency_log2[bucket].fetch_add(1, std::memory_order_relaxed);
  counters.latency_sum_ns.fetch_add(service_ns, std::memory_order_relaxed);
  engram_arena_header* h = arena_->header();
  engram_request_status& st = arena_->status()[slot];
  // Every field is stored through atomic_ref: the slot lies in memory the client shares, and a
  // client that reuses a slot still in flight (broken or hostile) has two request threads
  // complete it at once, which plain stores would make a data race inside the daemon.
  Shared(st.code).store(code, std::memory_order_relaxed);
  Shared(st.rows).store(rows, std::memory_order_relaxed);
  Shared(st.service_ns).store(service_ns, std::memory_order_relaxed);
  size_t len = 0;
  if (message != nullptr) {
    len = strnlen(message, ENGRAM_STATUS_MESSAGE_BYTES);
    for (size_t i = 0; i < len; ++i) {
      Shared(st.message[i]).store(message[i], std::memory_order_relaxed);
    }
  }
  Shared(st.message_bytes).store(static_cast<uint32_t>(len), std::memory_order_relaxed);
  ClientOrderRelease(&client_order_);
  Shared(st.ticket).store(ticket, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(cq_mutex_);
    const uint32_t entries = arena_->layout().cq_entries;
    const uint32_t tail = Shared(h->cq_tail).load(std::memory_order_relaxed);
    const uint32_t head = Shared(h->cq_head).load(std::memory_order_acquire);
    if (tail - head < entries) {
      engram_cqe& e = arena_->cq()[tail % entries];
      e.ticket = ticket;
      e.code = code;
      e.rows = rows > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(rows);
      Shared(h->cq_tail).store(tail + 1, std::memory_order_release);
    } else {
      Shared(h->cq_overflow).fetch_add(1, std::memory_order_relaxed);
    }
  }
  Shared(h->completions).fetch_add(1, std::memory_order_seq_cst);
  if (Shared(h->client_waiters).load(std::memory_order_seq_cst) != 0) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h->completions), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
  }
}

void Session::MarkStopped() {
  set_closing();
  engram_arena_header* h = arena_->header();
  Shared(h->daemon_state).store(ENGRAM_DAEMON_STOPPED, std::memory_order_seq_cst);
  // Wake every sleeper without touching the counter (it counts completions only; a device
  // waiting on it must not be released by a shutdown). A thread that was about to sleep finds
  // the state word at its next liveness check.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h->completions), FUTEX_WAKE, INT_MAX, nullptr,
          nullptr, 0);
}

engram_wire_session_stats Session::Stats() const {
  engram_wire_session_stats s{};
  s.session_id = id_;
#define ENGRAM_SESSION_LOAD_(field, origin, type, metric, help) \
  ENGRAM_SESSION_COUNTED_##origin(s.field = counters.field.load();)
  ENGRAM_SESSION_COUNTERS(ENGRAM_SESSION_LOAD_)
#undef ENGRAM_SESSION_LOAD_
  // The COMPUTED counters.
  s.inflight = inflight.load();
  s.cq_overflows = Shared(arena_->header()->cq_overflow).load(std::memory_order_relaxed);
  s.latency_p50_ns = Percentile(counters.latency_log2, 0.50);
  s.latency_p99_ns = Percentile(counters.latency_log2, 0.99);
  uint64_t max = 0;
  for (size_t i = 0; i < counters.latency_log2.size(); ++i) {
    if (counters.latency_log2[i].load() != 0) max = i >= 63 ? UINT64_MAX : (uint64_t{2} << i);
  }
  s.latency_max_ns = max;
  return s;
}

void Session::ForEachCounter(
    const std::function<void(const SessionCounterInfo&, uint64_t)>& fn) const {
  const engram_wire_session_stats w = Stats();
#define ENGRAM_SESSION_GROWS_COUNTER true
#define ENGRAM_SESSION_GROWS_GAUGE false
#define ENGRAM_SESSION_INFO_(field, type, metric, help) \
  SessionCounterInfo{#field, ENGRAM_SESSION_GROWS_##type, metric, help}
#define ENGRAM_SESSION_WIRE_(field, origin, type, metric, help) \
  ENGRAM_SESSION_ON_WIRE_##origin(fn(ENGRAM_SESSION_INFO_(field, type, metric, help), w.field);)
#define ENGRAM_SESSION_OWN_(field, origin, type, metric, help) \
  fn(ENGRAM_SESSION_INFO_(field, type, metric, help), counters.field.load());
  ENGRAM_SESSION_COUNTERS(ENGRAM_SESSION_WIRE_)
  ENGRAM_SESSION_DAEMON_COUNTERS(ENGRAM_SESSION_OWN_)
#undef ENGRAM_SESSION_OWN_
#undef ENGRAM_SESSION_WIRE_
#undef ENGRAM_SESSION_INFO_
#undef ENGRAM_SESSION_GROWS_GAUGE
#undef ENGRAM_SESSION_GROWS_COUNTER
}

}  // namespace engram
