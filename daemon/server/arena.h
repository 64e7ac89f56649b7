// A session's shared-memory arena on the daemon side: a sealed memfd laid out as
// include/engram/protocol.h describes, mapped here for as long as the session has I/O in flight;
// and what sessions may hold, all together, against their bounds.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "base/unique_mapping.h"
#include "engram/protocol.h"
#include "protocol/codec.h"
#include "store/memory_budget.h"

namespace engram {

// What a session with this arena may make engramd hold: the arena (a memfd engramd creates and
// writes, charged to its cgroup) and the bookkeeping of the requests it may queue (16 bytes per
// row in flight: a session may have its data region's bytes / 8 rows in flight, and at least
// one request of `max_rows_per_request` rows).
uint64_t SessionMemoryBytes(const protocol::ArenaLayout& layout, uint64_t max_rows_per_request);

// Why a new session is refused, or nullopt when it fits: `arena_total`, the arena bytes of all
// sessions with it, against `limit` (limits.max_total_arena_bytes); and with a budget,
// `session_total`, their SessionMemoryBytes, against the arenas' share of it in `plan`. The text
// goes to the client: it names the bound, the numbers and what to change.
std::optional<std::string> ArenaRefusal(uint64_t arena_total, uint64_t session_total,
                                        uint64_t limit, const MemoryPlan& plan);

class Arena {
 public:
  // Creates, sizes, initialises, maps and seals the memfd (F_SEAL_SHRINK | F_SEAL_GROW |
  // F_SEAL_SEAL: the client can neither truncate it under the daemon nor undo the seals).
  static absl::StatusOr<std::unique_ptr<Arena>> Create(const protocol::ArenaLayout& layout,
                                                       uint64_t session_id,
                                                       uint64_t max_rows_per_request);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // The memfd to pass to the client. Owned by the Arena.
  int fd() const { return fd_.get(); }
  const protocol::ArenaLayout& layout() const { return layout_; }
  engram_arena_header* header() const { return reinterpret_cast<engram_arena_header*>(base_); }
  engram_sqe* sq() const { return reinterpret_cast<engram_sqe*>(base_ + layout_.sq_offset); }
  engram_cqe* cq() const { return reinterpret_cast<engram_cqe*>(base_ + layout_.cq_offset); }
  engram_request_status* status() const {
    return reinterpret_cast<engram_request_status*>(base_ + layout_.status_offset);
  }
  uint8_t* data() const { return base_ + layout_.data_offset; }
  uint64_t data_bytes() const { return layout_.data_bytes; }
  uint64_t bytes() const { return layout_.arena_bytes; }

  // Drops the memfd (after it was sent); the mapping stays.
  void CloseFd() { fd_.Reset(); }

 private:
  Arena() = default;
  UniqueFd fd_;
  UniqueMapping mapping_;
  uint8_t* base_ = nullptr;  // mapping_'s start
  protocol::ArenaLayout layout_;
};

}  // namespace engram
