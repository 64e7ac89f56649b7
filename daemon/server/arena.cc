// Creation of a session's sealed memfd arena, and the bounds on all sessions' memory (arena.h).
#include "daemon/server/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace engram {

uint64_t SessionMemoryBytes(const protocol::ArenaLayout& layout, uint64_t max_rows_per_request) {
  const uint64_t rows_in_flight =
      std::max<uint64_t>(layout.data_bytes / sizeof(uint64_t), max_rows_per_request);
  return layout.arena_bytes + rows_in_flight * 2 * sizeof(uint64_t);
}

std::optional<std::string> ArenaRefusal(uint64_t arena_total, uint64_t session_total,
                                        uint64_t limit, const MemoryPlan& plan) {
  if (arena_total > limit) {
    return absl::StrFormat(
        "arenas of all sessions would reach %u bytes; the limit is %u (--max-total-arena-bytes)",
        arena_total, limit);
  }
  if (plan.bounded() && session_total > plan.arenas) {
    return absl::StrFormat(
        "the sessions' arenas and the requests they may queue would take %u bytes; the arenas' "
        "share of memory.budget is %u bytes (%s): ask for a smaller data region, close a "
        "session, or raise memory.budget on the daemon",
        session_total, plan.arenas, DescribeMemoryPlan(plan));
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::Create(const protocol::ArenaLayout& layout,
                                                     uint64_t session_id,
                                                     uint64_t max_rows_per_request) {
  std::unique_ptr<Arena> arena(new Arena());
  arena->layout_ = layout;
  const std::string name = absl::StrFormat("engram-session-%u", session_id);
  arena->fd_.Reset(memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!arena->fd_.valid()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("memfd_create for session %u: %s", session_id, strerror(errno)));
  }
  if (ftruncate(arena->fd(), static_cast<off_t>(layout.arena_bytes)) < 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("sizing the arena of session %u to %u bytes: %s", session_id,
                        layout.arena_bytes, strerror(errno)));
  }
  void* map = mmap(nullptr, layout.arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, arena->fd(), 0);
  if (map == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("mapping the %u-byte arena of session %u: %s", layout.arena_bytes,
                        session_id, strerror(errno)));
  }
  arena->mapping_.Reset(map, layout.arena_bytes);
  arena->base_ = static_cast<uint8_t*>(map);
  if (fcntl(arena->fd(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
    return absl::InternalError(
        absl::StrFormat("sealing the arena of session %u: %s", session_id, strerror(errno)));
  }
  // A fresh memfd reads as zeros: only the header needs writing.
  engram_arena_header* h = arena->header();
  h->magic = ENGRAM_ARENA_MAGIC;
  h->version_major = ENGRAM_PROTOCOL_MAJOR;
  h->version_minor = ENGRAM_PROTOCOL_MINOR;
  h->header_bytes = sizeof(engram_arena_header);
  h->slots = layout.slots;
  h->cq_entries = layout.cq_entries;
  h->arena_bytes = layout.arena_bytes;
  h->sq_offset = layout.sq_offset;
  h->cq_offset = layout.cq_offset;
  h->status_offset = layout.status_offset;
  h->data_offset = layout.data_offset;
  h->data_bytes = layout.data_bytes;
  h->session_id = session_id;
  h->max_rows_per_request = max_rows_per_request;
  h->daemon_state = ENGRAM_DAEMON_SERVING;
  return arena;
}

}  // namespace engram
