// A session with engramd as libengram_client holds it (struct engram_session), and the helpers
// that more than one part of the library uses on it. Internal to libengram_client.
#pragma once

#include <stddef.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/unique_fd.h"
#include "base/unique_mapping.h"
#include "client/table_map.h"
#include "engram/engram.h"
#include "engram/protocol.h"

namespace engram::client {

// A wait's spin before it sleeps, where the options fix none.
constexpr uint32_t kDefaultSpinNs = 50'000;

}  // namespace engram::client

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
  uint32_t spin_ns = engram::client::kDefaultSpinNs;
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

namespace engram::client {

// The errno of a status code from the daemon (ENGRAM_STATUS_*), 0 for OK.
int ErrnoForCode(int32_t code);

// The clock's now, signed, for deadlines that may lie in the past.
inline int64_t SignedNowNs() { return static_cast<int64_t>(engram::NowNs()); }

// A word of the arena, which the daemon reads and writes from its own process.
template <typename T>
std::atomic_ref<T> Shared(T& word) {
  return std::atomic_ref<T>(word);
}

// Records and returns -ENOTCONN: the session was lost.
int LostError(engram_session* s);

// True once the session is known lost, from memory alone (no syscall).
inline bool CheckLostCheap(engram_session* s) {
  return s->lost.load(std::memory_order_relaxed) ||
         Shared(s->header->daemon_state).load(std::memory_order_relaxed) != ENGRAM_DAEMON_SERVING;
}

// Sends one message on the session's socket (0, or -errno; -EIO for a short send).
int SendAll(int fd, const void* data, size_t size);

// Sends a control request with an empty body and receives the reply into `reply`.
int ControlExchange(engram_session* s, uint16_t type, uint16_t expected_reply,
                    std::vector<uint8_t>* reply);

// Whether [p, p + bytes) lies in the session's data region; *ret_offset gets p's offset there.
inline bool InData(const engram_session* s, const void* p, uint64_t bytes, uint64_t* ret_offset) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (b < s->data || b > s->data + s->data_bytes) return false;
  const uint64_t off = static_cast<uint64_t>(b - s->data);
  if (bytes > s->data_bytes - off) return false;
  *ret_offset = off;
  return true;
}

// Pushes one entry onto the submission ring and rings the doorbell if the poller sleeps.
int Push(engram_session* s, engram_sqe sqe, uint64_t* ret_ticket);

// engram_wait; *ret_rows (if not null) gets the rows the completion reported.
int WaitFor(engram_session* s, uint64_t ticket, int64_t timeout_ns, uint64_t* ret_rows);

// engram_gather of a checked submission entry: in place where `in_place` and the table can be
// read here, else (or when the table was withdrawn meanwhile) through the daemon.
int GatherNow(engram_session* s, const engram_sqe& sqe, bool in_place, int64_t timeout_ns);

// The daemon's table list, as the wire gives it.
int FetchTables(engram_session* s, std::vector<engram_wire_table>* ret_tables);

// engram_table_map_open; `row_cache`: a cache-tier table's row cache mapping is wanted too
// (engram_gather's in-place path), else such a table is refused as not resident.
int OpenTableMap(engram_session* s, uint32_t layer, bool row_cache, engram_table_map** ret_map);

}  // namespace engram::client
