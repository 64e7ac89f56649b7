// Requests onto the session's submission ring: gathers (engram_submit, engram_gather), no-ops and
// prefetches; and the ring handed whole to a device producer (engram_device_ring).
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "client/abi_struct.h"
#include "client/last_error.h"
#include "client/session.h"
#include "engram/engram.h"
#include "engram/protocol.h"

namespace {

using engram::client::GatherNow;
using engram::client::InData;
using engram::client::Push;
using engram::client::ReadStruct;
using engram::client::SetError;
using engram::client::WaitFor;
using engram::client::WriteStruct;

}  // namespace

namespace engram::client {

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

}  // namespace engram::client

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

// One PREFETCH entry (`entry` with its rows) of at most ENGRAM_PREFETCH_MAX_ROWS rows whose ids
// lie in the data region at `rows_offset`: submitted, then waited for (the daemon completes it
// once the ids are checked and queued, never after I/O). `first` is the index of its first row
// in the caller's array, for the error message.
int PrefetchChunk(engram_session* s, const engram_sqe& entry, uint64_t rows_offset, uint64_t n,
                  uint64_t first, uint64_t* ret_queued) {
  engram_sqe sqe = entry;
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

// engram_prefetch and engram_admit: the rows in PREFETCH entries like `entry`.
int PrefetchRows(engram_session* s, const engram_sqe& entry, const uint64_t* rows,
                 uint64_t num_rows, uint64_t* ret_queued) {
  const uint32_t layer = entry.table;
  uint64_t queued = 0;
  uint64_t offset = 0;
  // Ids that already lie in the data region go as they are; others are copied there, a chunk
  // at a time, into one buffer this call holds.
  const bool in_data =
      num_rows <= s->data_bytes / 8 && InData(s, rows, num_rows * 8, &offset) && offset % 8 == 0;
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
    rc = PrefetchChunk(s, entry, chunk_offset, n, first, &queued);
  }
  if (staging != nullptr) {
    // The ids stay until a chunk completes: a chunk lost in flight keeps its buffer.
    if (rc != -ENOTCONN && rc != -ETIMEDOUT) engram_free(s, staging);
  }
  if (rc < 0) return rc;
  if (ret_queued != nullptr) *ret_queued = queued;
  return 0;
}

int NeedAdmit(engram_session* s) {
  if (s->welcome.features & ENGRAM_FEATURE_ADMIT) return 0;
  return SetError(-EOPNOTSUPP,
                  "engramd at %s (protocol %u.%u) does not take admission prefetches (protocol "
                  "1.6 does); upgrade it",
                  s->socket_path.c_str(), s->welcome.version_major, s->welcome.version_minor);
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
  engram_sqe entry{};
  entry.opcode = ENGRAM_OP_PREFETCH;
  entry.table = layer;
  return PrefetchRows(s, entry, rows, num_rows, ret_queued);
}

int engram_admit(engram_session* s, uint64_t request_id, uint32_t layer, const uint64_t* rows,
                 uint64_t num_rows, uint64_t ttl_ns, uint64_t* ret_queued) {
  if (s == nullptr || (rows == nullptr && num_rows != 0)) {
    return SetError(-EINVAL, "engram_admit needs a session and the row ids");
  }
  if (int rc = NeedAdmit(s); rc < 0) return rc;
  engram_sqe entry{};
  entry.opcode = ENGRAM_OP_PREFETCH;
  entry.flags = ENGRAM_SQE_PIN;
  entry.table = layer;
  entry.reserved[0] = request_id;
  entry.reserved[1] = ttl_ns;
  return PrefetchRows(s, entry, rows, num_rows, ret_queued);
}

int engram_admit_done(engram_session* s, uint64_t request_id, int* ret_found) {
  if (s == nullptr) return SetError(-EINVAL, "engram_admit_done needs a session");
  if (int rc = NeedAdmit(s); rc < 0) return rc;
  engram_sqe sqe{};
  sqe.opcode = ENGRAM_OP_ADMIT_DONE;
  sqe.reserved[0] = request_id;
  uint64_t ticket;
  if (int rc = Push(s, sqe, &ticket); rc < 0) return rc;
  uint64_t found = 0;
  if (int rc = WaitFor(s, ticket, -1, &found); rc < 0) return rc;
  if (ret_found != nullptr) *ret_found = found != 0;
  return 0;
}

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

int engram_submit_nop(engram_session* s, uint64_t* ret_ticket) {
  if (s == nullptr || ret_ticket == nullptr) {
    return SetError(-EINVAL, "engram_submit_nop needs a session and ret_ticket");
  }
  engram_sqe sqe{};
  sqe.opcode = ENGRAM_OP_NOP;
  return Push(s, sqe, ret_ticket);
}

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

}  // extern "C"
