// Cross-process publish/consume ordering of the shared-memory arena, under stress: a forked
// client process and the daemon's own Arena and Session code pass requests and completions
// through the submission ring, the status slots and the completion ring as fast as they can,
// each side checking that the bytes the other wrote before publishing are all there, and then
// one request at a time with both sides sleeping (doorbell, completion futex) between any two.
// On a weakly ordered CPU (aarch64) a missing release or acquire on either side shows up here as
// a torn payload, a missing fence as a wake-up lost for seconds. Under qemu-user guest threads run on the host's (x86) ordering, so there it
// checks the protocol only; on Arm hardware it checks the barriers too.
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "daemon/server/arena.h"
#include "daemon/server/session.h"
#include "engram/protocol.h"
#include "protocol/codec.h"

namespace engram {
namespace {

constexpr uint32_t kSlots = 16;
constexpr uint64_t kChunkBytes = 4096;  // per slot: request payload, then the reply
constexpr uint64_t kPayloadWords = kChunkBytes / 2 / sizeof(uint64_t);

template <typename T>
std::atomic_ref<T> Shared(T& word) {
  return std::atomic_ref<T>(word);
}

// The words a request with this ticket carries (client -> daemon) and gets back (daemon -> client).
uint64_t RequestWord(uint64_t ticket, uint64_t i) { return ticket * 0x9E3779B97F4A7C15ull + i; }
uint64_t ReplyWord(uint64_t ticket, uint64_t i) { return ~RequestWord(ticket, i) ^ (i << 32); }

uint64_t Requests() {
  const char* env = std::getenv("ENGRAM_ORDERING_REQUESTS");
  return env != nullptr ? std::strtoull(env, nullptr, 10) : 200000;
}

// The client side, as client/submit.cc does it: payload, then the SQE, then sq_tail (release);
// completion seen through the slot's ticket (acquire), then the reply and the status read.
// Returns 0, or the number of the check that failed.
int RunClient(uint8_t* base, uint64_t requests) {
  auto* h = reinterpret_cast<engram_arena_header*>(base);
  auto* sq = reinterpret_cast<engram_sqe*>(base + h->sq_offset);
  auto* status = reinterpret_cast<engram_request_status*>(base + h->status_offset);
  uint8_t* data = base + h->data_offset;
  uint64_t generation[kSlots] = {};
  bool busy[kSlots] = {};
  uint64_t ticket_of[kSlots] = {};
  uint32_t tail = 0;
  uint64_t submitted = 0, completed = 0;
  while (completed < requests) {
    for (uint32_t slot = 0; slot < kSlots; ++slot) {
      if (busy[slot]) {
        const uint64_t t = ticket_of[slot];
        if (Shared(status[slot].ticket).load(std::memory_order_acquire) != t) continue;
        if (status[slot].code != ENGRAM_STATUS_OK) return 1;
        if (status[slot].rows != (t >> 16) % 97) return 2;
        char expected[32];
        const int len = std::snprintf(expected, sizeof expected, "%016lx", (unsigned long)t);
        if (status[slot].message_bytes != static_cast<uint32_t>(len) ||
            std::memcmp(status[slot].message, expected, len) != 0) {
          return 3;
        }
        const auto* reply =
            reinterpret_cast<const uint64_t*>(data + slot * kChunkBytes + kChunkBytes / 2);
        for (uint64_t i = 0; i < kPayloadWords; ++i) {
          if (reply[i] != ReplyWord(t, i)) return 4;
        }
        busy[slot] = false;
        ++completed;
      }
      if (!busy[slot] && submitted < requests) {
        const uint64_t t = (++generation[slot] << 16) | slot;
        auto* payload = reinterpret_cast<uint64_t*>(data + slot * kChunkBytes);
        for (uint64_t i = 0; i < kPayloadWords; ++i) payload[i] = RequestWord(t, i);
        engram_sqe e{};
        e.ticket = t;
        e.opcode = ENGRAM_OP_GATHER;
        e.num_rows = (t >> 16) % 97;
        e.rows_offset = slot * kChunkBytes;
        sq[tail % kSlots] = e;
        Shared(h->sq_tail).store(++tail, std::memory_order_release);
        busy[slot] = true;
        ticket_of[slot] = t;
        ++submitted;
      }
    }
  }
  return 0;
}

TEST_CASE("ring publish/consume pairs hold across processes under stress") {
  protocol::ArenaLayout layout;
  REQUIRE(protocol::ComputeArenaLayout(kSlots, kSlots * kChunkBytes, &layout));
  absl::StatusOr<std::unique_ptr<Arena>> arena = Arena::Create(layout, 1, 1 << 20);
  REQUIRE(arena.ok());
  const uint64_t requests = Requests();

  // The client maps the memfd on its own, as a real client does after the handshake.
  const int memfd = (*arena)->fd();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    void* map = mmap(nullptr, layout.arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (map == MAP_FAILED) _exit(100);
    _exit(RunClient(static_cast<uint8_t*>(map), requests));
  }

  int sockets[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) == 0);
  close(sockets[1]);
  Session session(1, sockets[0], std::move(*arena), eventfd(0, EFD_CLOEXEC), PeerInfo{}, "stress");
  uint8_t* data = session.arena().data();
  uint64_t served = 0, torn = 0, garbage_rings = 0;
  engram_sqe batch[kSlots];
  while (served < requests && torn == 0 && garbage_rings == 0) {
    bool garbage = false;
    const uint32_t n = session.TakeSubmissions(batch, kSlots, &garbage);
    garbage_rings += garbage;
    for (uint32_t k = 0; k < n; ++k) {
      const engram_sqe& e = batch[k];
      const uint32_t slot = e.ticket & 0xFFFF;
      const auto* payload = reinterpret_cast<const uint64_t*>(data + e.rows_offset);
      for (uint64_t i = 0; i < kPayloadWords; ++i) {
        if (payload[i] != RequestWord(e.ticket, i)) ++torn;
      }
      if (e.num_rows != (e.ticket >> 16) % 97 || e.opcode != ENGRAM_OP_GATHER) ++torn;
      auto* reply = reinterpret_cast<uint64_t*>(data + slot * kChunkBytes + kChunkBytes / 2);
      for (uint64_t i = 0; i < kPayloadWords; ++i) reply[i] = ReplyWord(e.ticket, i);
      char message[32];
      std::snprintf(message, sizeof message, "%016lx", static_cast<unsigned long>(e.ticket));
      session.Complete(e.ticket, slot, ENGRAM_STATUS_OK, message, e.num_rows, 1);
      ++served;
    }
  }
  if (torn != 0 || garbage_rings != 0) kill(child, SIGKILL);
  int wstatus = 0;
  REQUIRE(waitpid(child, &wstatus, 0) == child);
  INFO("requests " << requests << ", served " << served);
  CHECK(torn == 0);  // the daemon saw a request before all of its bytes
  CHECK(garbage_rings == 0);
  REQUIRE(WIFEXITED(wstatus));
  // 1-4: the client saw a completion before its status or reply bytes; 100: mmap failed.
  CHECK(WEXITSTATUS(wstatus) == 0);
  CHECK(served == requests);
  std::printf("arena ordering: %lu requests through %u slots between two processes\n",
              static_cast<unsigned long>(requests), kSlots);
}

// Longer than any wake-up can take, even under TCG: a sleeper still asleep after it was lost.
constexpr int kLostWakeupMs = 10'000;

// One request at a time, so that both sides go to sleep between any two: the client as
// client/submit.cc and client/wait.cc do it (sq_tail, full fence, NEED_WAKEUP -> doorbell; then
// client_waiters up, completions read, ticket re-checked, FUTEX_WAIT on completions). Returns
// 0, 5 when a futex wait timed out (a lost wake-up), 6 for a wrong reply, 7 for a doorbell error.
int RunSleepyClient(uint8_t* base, int doorbell, uint64_t requests) {
  auto* h = reinterpret_cast<engram_arena_header*>(base);
  auto* sq = reinterpret_cast<engram_sqe*>(base + h->sq_offset);
  auto* status = reinterpret_cast<engram_request_status*>(base + h->status_offset);
  uint8_t* data = base + h->data_offset;
  auto* word = reinterpret_cast<uint32_t*>(&h->completions);
  for (uint64_t r = 1; r <= requests; ++r) {
    const uint32_t slot = r % kSlots;
    const uint64_t t = (r << 16) | slot;
    auto* payload = reinterpret_cast<uint64_t*>(data + slot * kChunkBytes);
    for (uint64_t i = 0; i < kPayloadWords; ++i) payload[i] = RequestWord(t, i);
    engram_sqe e{};
    e.ticket = t;
    e.opcode = ENGRAM_OP_GATHER;
    e.num_rows = r % 97;
    e.rows_offset = slot * kChunkBytes;
    sq[(r - 1) % kSlots] = e;
    Shared(h->sq_tail).store(static_cast<uint32_t>(r), std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if ((Shared(h->sq_flags).load(std::memory_order_relaxed) & ENGRAM_SQ_NEED_WAKEUP) != 0) {
      const uint64_t one = 1;
      if (write(doorbell, &one, sizeof one) != sizeof one) return 7;
    }
    while (Shared(status[slot].ticket).load(std::memory_order_acquire) != t) {
      Shared(h->client_waiters).fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = Shared(*word).load(std::memory_order_seq_cst);
      if (Shared(status[slot].ticket).load(std::memory_order_acquire) != t) {
        timespec ts{.tv_sec = kLostWakeupMs / 1000, .tv_nsec = 0};
        if (syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, nullptr, 0) != 0 &&
            errno == ETIMEDOUT) {
          return 5;
        }
      }
      Shared(h->client_waiters).fetch_sub(1, std::memory_order_seq_cst);
    }
    const auto* reply =
        reinterpret_cast<const uint64_t*>(data + slot * kChunkBytes + kChunkBytes / 2);
    for (uint64_t i = 0; i < kPayloadWords; ++i) {
      if (reply[i] != ReplyWord(t, i)) return 6;
    }
  }
  return 0;
}

// The poller's way to sleep (daemon/server/poller.cc): NEED_WAKEUP raised, the ring looked at
// once more, then the doorbell. Returns false if the doorbell stayed silent: a lost wake-up.
bool SleepOnDoorbell(Session& session) {
  session.SetNeedWakeup(true);
  bool woke = true;
  if (!session.HasSubmissions()) {
    pollfd p{.fd = session.doorbell_fd(), .events = POLLIN, .revents = 0};
    woke = poll(&p, 1, kLostWakeupMs) == 1;
    uint64_t count;
    if (woke) woke = read(session.doorbell_fd(), &count, sizeof count) == sizeof count;
  }
  session.SetNeedWakeup(false);
  return woke;
}

TEST_CASE("neither side's sleep loses a wake-up: doorbell and completion futex under stress") {
  protocol::ArenaLayout layout;
  REQUIRE(protocol::ComputeArenaLayout(kSlots, kSlots * kChunkBytes, &layout));
  absl::StatusOr<std::unique_ptr<Arena>> arena = Arena::Create(layout, 1, 1 << 20);
  REQUIRE(arena.ok());
  const uint64_t requests = Requests() / 10;
  const int doorbell = eventfd(0, EFD_CLOEXEC);
  REQUIRE(doorbell >= 0);
  const int memfd = (*arena)->fd();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    void* map = mmap(nullptr, layout.arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (map == MAP_FAILED) _exit(100);
    _exit(RunSleepyClient(static_cast<uint8_t*>(map), doorbell, requests));
  }
  int sockets[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) == 0);
  close(sockets[1]);
  Session session(1, sockets[0], std::move(*arena), doorbell, PeerInfo{}, "sleepy");
  uint8_t* data = session.arena().data();
  uint64_t served = 0, torn = 0, lost = 0, sleeps = 0;
  engram_sqe batch[kSlots];
  while (served < requests && torn == 0 && lost == 0) {
    bool garbage = false;
    const uint32_t n = session.TakeSubmissions(batch, kSlots, &garbage);
    torn += garbage;
    if (n == 0) {
      lost += !SleepOnDoorbell(session);
      ++sleeps;
    }
    for (uint32_t k = 0; k < n; ++k) {
      const engram_sqe& e = batch[k];
      const uint32_t slot = e.ticket & 0xFFFF;
      const auto* payload = reinterpret_cast<const uint64_t*>(data + e.rows_offset);
      for (uint64_t i = 0; i < kPayloadWords; ++i) torn += payload[i] != RequestWord(e.ticket, i);
      auto* reply = reinterpret_cast<uint64_t*>(data + slot * kChunkBytes + kChunkBytes / 2);
      for (uint64_t i = 0; i < kPayloadWords; ++i) reply[i] = ReplyWord(e.ticket, i);
      session.Complete(e.ticket, slot, ENGRAM_STATUS_OK, nullptr, e.num_rows, 1);
      ++served;
    }
  }
  if (torn != 0 || lost != 0) kill(child, SIGKILL);
  int wstatus = 0;
  REQUIRE(waitpid(child, &wstatus, 0) == child);
  INFO("requests " << requests << ", served " << served << ", poller sleeps " << sleeps);
  CHECK(torn == 0);
  CHECK(lost == 0);  // the poller slept through a submission whose client saw no NEED_WAKEUP
  REQUIRE(WIFEXITED(wstatus));
  // 5: the client slept through its completion; 6: a reply torn; 7: doorbell; 100: mmap.
  CHECK(WEXITSTATUS(wstatus) == 0);
  CHECK(served == requests);
  CHECK(sleeps > 0);  // the sleeping paths ran at all
  std::printf("arena wake-ups: %lu requests one at a time, the poller slept %lu times\n",
              static_cast<unsigned long>(requests), static_cast<unsigned long>(sleeps));
}

}  // namespace
}  // namespace engram
