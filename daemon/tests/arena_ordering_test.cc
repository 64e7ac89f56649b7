// Cross-process publish/consume ordering of the shared-memory arena, under stress: a forked
// client process and the daemon's own Arena and Session code pass requests and completions
// through the submission ring, the status slots and the completion ring as fast as they can,
// each side checking that the bytes the other wrote before publishing are all there. On a
// weakly ordered CPU (aarch64) a missing release or acquire on either side shows up here as a
// torn payload. Under qemu-user guest threads run on the host's (x86) ordering, so there it
// checks the protocol only; on Arm hardware it checks the barriers too.
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
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

}  // namespace
}  // namespace engram
