// Reaping completions: engram_poll and engram_wait (spin, then sleep on the arena's futex while
// watching for the daemon's end), and the completion counter a caller may watch itself.
#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "base/clock.h"
#include "client/last_error.h"
#include "client/session.h"
#include "engram/engram.h"
#include "engram/protocol.h"
#include "protocol/codec.h"

namespace {

namespace proto = engram::protocol;
using engram::client::CheckLostCheap;
using engram::client::ErrnoForCode;
using engram::client::LostError;
using engram::client::SetError;
using engram::client::Shared;
using engram::client::WaitFor;

// Adaptive spinning (spin_ns = 0) spins up to the service time predicted from the session's
// recent requests, within these bounds.
constexpr int64_t kAdaptiveSpinMaxNs = 2'000'000;
// A wait predicted longer than kNapMinNs sleeps until kNapMarginNs before the predicted end and
// spins from there: spinning through a long request takes a core from the daemon and the other
// ranks of the node for the whole request, to save one wake-up at its end.
constexpr int64_t kNapMinNs = 400'000;
constexpr int64_t kNapMarginNs = 150'000;
// While sleeping, a waiter wakes this often to check that the daemon is still there.
constexpr int64_t kLivenessCheckNs = 20'000'000;

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

namespace engram::client {

// engram_wait; *ret_rows (if not null) gets the rows the completion reported.
int WaitFor(engram_session* s, uint64_t ticket, int64_t timeout_ns, uint64_t* ret_rows) {
  if (s == nullptr) return SetError(-EINVAL, "NULL session");
  if (int rc = CheckTicket(s, ticket); rc < 0) return rc;
  if (Done(s, ticket)) return Consume(s, ticket, ret_rows);
  const int64_t start = SignedNowNs();
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
      if (!Done(s, ticket)) FutexWait(word, seen, nap_until - SignedNowNs());
      waiters.fetch_sub(1, std::memory_order_seq_cst);
      spin_from = SignedNowNs();
      spin_ns = std::max<int64_t>(spin_ns, 2 * kNapMarginNs);
    } else {
      spin_ns =
          std::max<int64_t>(spin_ns, std::min<int64_t>(kAdaptiveSpinMaxNs, predicted * 5 / 4));
    }
  }
  const int64_t spin_until = spin_from + std::min<int64_t>(spin_ns, deadline - spin_from);
  for (uint32_t i = 1;; ++i) {
    if (Done(s, ticket)) return Consume(s, ticket, ret_rows);
    if ((i & 63) == 0) {
      if (CheckLostCheap(s)) break;
      if (SignedNowNs() >= spin_until) break;
    }
    engram::CpuRelax();
  }
  while (true) {
    if (Done(s, ticket)) return Consume(s, ticket, ret_rows);
    if (CheckLostCheap(s)) return LostError(s);
    const int64_t now = SignedNowNs();
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

}  // namespace engram::client

extern "C" {

int engram_poll(engram_session* s, uint64_t ticket) {
  if (s == nullptr) return SetError(-EINVAL, "NULL session");
  if (int rc = CheckTicket(s, ticket); rc < 0) return rc;
  if (Done(s, ticket)) return Consume(s, ticket);
  if (CheckLostCheap(s)) return LostError(s);
  return SetError(-EAGAIN, "ticket 0x%llx is still in flight",
                  static_cast<unsigned long long>(ticket));
}

int engram_wait(engram_session* s, uint64_t ticket, int64_t timeout_ns) {
  return WaitFor(s, ticket, timeout_ns, nullptr);
}

int engram_completion_counter(engram_session* s, const volatile uint64_t** ret_counter) {
  if (s == nullptr || ret_counter == nullptr) {
    return SetError(-EINVAL, "NULL argument to engram_completion_counter");
  }
  *ret_counter = &s->header->completions;
  return 0;
}

}  // extern "C"
