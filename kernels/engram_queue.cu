// The GPU half of include/engram/gpu_submit.h: kernels that publish gather requests into a
// session's arena and wait for their completion, without a host thread. The protocol is in
// docs/gpu.md ("Requests from the GPU"). One source for nvcc and hipcc (see gpu_compat.h).
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>

#include "engram/engram.h"
#include "engram/gpu_submit.h"
#include "engram/protocol.h"
#include "kernels/cache_device.h"
#include "kernels/dequant_device.h"
#include "kernels/gpu_compat.h"
#include "kernels/kernel_errors.h"
#include "kernels/piece_plan.h"

using engram::kernels::Fail;
using engram::kernels::FailRuntime;

namespace {

// Requests one engram_gpu_queue_gather call publishes; they travel as kernel parameters.
constexpr uint32_t kMaxRequests = 32;
constexpr uint64_t kDefaultTimeoutNs = 2'000'000'000;
using engram::kernels::kPieceAlign;
using engram::kernels::kPieceRowsMultiple;

// What a submission entry needs, fixed when the call is queued (offsets into the data region).
struct DeviceRequest {
  uint32_t table;
  uint64_t num_rows;
  uint64_t rows_offset;
  uint64_t dest_offset;
};

struct DeviceRequests {
  DeviceRequest r[kMaxRequests];
  uint32_t n;
};

// What the fused kernel dequantises from one request: its rows' device address in the data
// region, the slots that read them, and the pieces (entries) the request went out as.
struct DeviceDequant {
  const int32_t* index_map;
  uint16_t* out;
  uint32_t* bad_index_count;
  const uint8_t* rows;
  uint64_t slots;        // tokens x heads
  uint64_t first_block;  // the first block of the fused grid that works on this request
  uint32_t num_rows;
  uint32_t first_piece;  // entry index of the request's first piece
};

struct DeviceDequants {
  DeviceDequant d[kMaxRequests];
  uint32_t n;
  uint32_t piece_rows;
};

// The fused kernel: block 0 polls the pieces; the others dequantise, one warp per slot. Small
// blocks spread the rows' reads over many SMs, as the dequantise kernel's do.
constexpr uint32_t kFusedThreads = 256;
constexpr uint32_t kFusedSlotsPerBlock = kFusedThreads / engram::kernels::kThreadsPerSlot;
static_assert(kFusedThreads >= kMaxRequests, "block 0's lanes poll one piece each");

// The queue's state in device memory: the steps completed (the tickets of the step in flight
// derive from it: Ticket below), advanced by the wait kernels.
struct QueueState {
  uint64_t step;
  // The fused kernel's words. ready[p] holds piece p's ticket once block 0 saw it complete;
  // abandoned holds the step's first ticket once block 0 gave up on the step (tickets are new
  // every step, so neither needs resetting).
  uint64_t ready[kMaxRequests];
  uint64_t abandoned;
  uint32_t blocks_done;  // blocks finished this step (the last one resets it)
  int32_t failure;       // the step's first failure, until the last block reports it
  uint32_t misses_ok;    // the cache step's fetched misses may be scattered (no failure)
};

// Device addresses of the session's rings.
struct DeviceRing {
  engram_arena_header* header;
  engram_sqe* sq;
  engram_request_status* status;
  uint32_t slots;
};

__device__ __forceinline__ void StoreSystem64(uint64_t* p, uint64_t v) {
  *reinterpret_cast<volatile uint64_t*>(p) = v;
}

// Request i's ticket in the step after `step` steps: every step's tickets are new, so a late
// completion of an earlier step can never be taken for this one's.
__device__ __forceinline__ uint64_t Ticket(uint64_t step, uint32_t i) {
  return ((step + 1) << 16) | i;
}

// Publishes the step's requests: entries first, a system-scope fence, then the tail (the
// daemon reads the tail with acquire, then the entries). Slot i carries request i. One thread.
// Launched after-prior (unless ENGRAM_GPU_QUEUE_NO_OVERLAP): it is in place while the kernel
// that writes the row ids finishes, and awaits that kernel (and through it the previous step's
// wait kernel, which advanced the step) before it touches anything.
__global__ void SubmitKernel(DeviceRing ring, QueueState* state, DeviceRequests reqs,
                             volatile int32_t* error) {
  ENGRAM_GPU_AWAIT_PRIOR_GRID();
  if (*error != 0) return;  // a failed queue submits nothing until the host recovers it
  const uint64_t step = state->step;
  volatile uint32_t* tail_word = &ring.header->sq_tail;
  const uint32_t tail = *tail_word;
  for (uint32_t i = 0; i < reqs.n; ++i) {
    const uint64_t ticket = Ticket(step, i);
    engram_sqe* e = &ring.sq[(tail + i) % ring.slots];
    StoreSystem64(&e->ticket, ticket);
    auto* words = reinterpret_cast<volatile uint32_t*>(&e->opcode);  // opcode, flags
    words[0] = ENGRAM_OP_GATHER;  // opcode (low half) and flags 0 (high half)
    *reinterpret_cast<volatile uint32_t*>(&e->table) = reqs.r[i].table;
    StoreSystem64(&e->num_rows, reqs.r[i].num_rows);
    StoreSystem64(&e->rows_offset, reqs.r[i].rows_offset);
    StoreSystem64(&e->dest_offset, reqs.r[i].dest_offset);
    StoreSystem64(&e->dest_offsets_offset, 0);
    StoreSystem64(&e->reserved[0], 0);
    StoreSystem64(&e->reserved[1], 0);
  }
  __threadfence_system();      // the entries (and the row ids kernels wrote before) are visible...
  *tail_word = tail + reqs.n;  // ...before the daemon can see the new tail
  __threadfence_system();
}

// Waits until every request of the step completed (its status slot holds its ticket; the
// daemon stores the ticket last, with release), the daemon stopped, or the deadline passed.
// Records the first failure in *error. Always advances the step. One thread. An ordinary
// launch: it starts while the daemon serves the requests, so an earlier start would gain
// nothing. It releases the kernel behind it at once (a dequantise kernel, launched after-prior,
// which awaits this one before it reads the rows).
__device__ void AwaitRequests(const DeviceRing& ring, QueueState* state, uint32_t n,
                              uint64_t timeout_ns, volatile int32_t* error) {
  if (*error != 0) {  // a failed queue submitted nothing
    state->step += 1;
    return;
  }
  int32_t failure = 0;
  bool abandoned = false;  // the daemon is gone or late: stop waiting for the rest
  const uint64_t start = ENGRAM_GPU_NOW_NS();
  const uint64_t step = state->step;
  for (uint32_t i = 0; i < n && !abandoned; ++i) {
    volatile engram_request_status* st = &ring.status[i];
    while (true) {
      if (st->ticket == Ticket(step, i)) {
        __threadfence_system();  // acquire: the code and the rows come after the ticket
        // A request's own failure is recorded, but every other request is still awaited, so
        // that none is in flight when the engine clears the word and goes on.
        if (st->code != ENGRAM_STATUS_OK && failure == 0) failure = st->code;
        break;
      }
      if (reinterpret_cast<volatile uint32_t*>(&ring.header->daemon_state)[0] !=
          ENGRAM_DAEMON_SERVING) {
        failure = ENGRAM_STATUS_UNAVAILABLE;
        abandoned = true;
        break;
      }
      if (ENGRAM_GPU_NOW_NS() - start > timeout_ns) {
        failure = ENGRAM_STATUS_DEADLINE_EXCEEDED;
        abandoned = true;
        break;
      }
      ENGRAM_GPU_PAUSE();
    }
  }
  if (failure > 0) {
    *error = failure;
    __threadfence_system();
  }
  state->step = step + 1;
}

__global__ void WaitKernel(DeviceRing ring, QueueState* state, uint32_t n, uint64_t timeout_ns,
                           volatile int32_t* error) {
  ENGRAM_GPU_RELEASE_DEPENDENTS();
  AwaitRequests(ring, state, n, timeout_ns, error);
}

// The pieces of `misses` rows, at most piece_rows each.
__device__ __forceinline__ uint32_t MissPieces(uint32_t misses, uint32_t piece_rows) {
  return (misses + piece_rows - 1) / piece_rows;
}

// The cache step's submission: the misses the lookup kernel counted (*count, device memory)
// published as pieces of the layer's gather, row ids from rows_offset, rows to dest_offset of
// the data region. No miss: nothing. One thread, as SubmitKernel.
__global__ void SubmitMissesKernel(DeviceRing ring, QueueState* state, uint32_t table,
                                   uint64_t rows_offset, uint64_t dest_offset, uint32_t piece_rows,
                                   const uint32_t* count, volatile int32_t* error) {
  ENGRAM_GPU_AWAIT_PRIOR_GRID();
  if (*error != 0) return;
  const uint32_t misses = *count;
  const uint32_t pieces = MissPieces(misses, piece_rows);
  if (pieces == 0) return;
  const uint64_t step = state->step;
  volatile uint32_t* tail_word = &ring.header->sq_tail;
  const uint32_t tail = *tail_word;
  for (uint32_t i = 0; i < pieces; ++i) {
    engram_sqe* e = &ring.sq[(tail + i) % ring.slots];
    const uint64_t first = uint64_t{i} * piece_rows;
    StoreSystem64(&e->ticket, Ticket(step, i));
    reinterpret_cast<volatile uint32_t*>(&e->opcode)[0] = ENGRAM_OP_GATHER;
    *reinterpret_cast<volatile uint32_t*>(&e->table) = table;
    StoreSystem64(&e->num_rows, misses - first < piece_rows ? misses - first : piece_rows);
    StoreSystem64(&e->rows_offset, rows_offset + first * 8);
    StoreSystem64(&e->dest_offset, dest_offset + first * ENGRAM_ROW_BYTES);
    StoreSystem64(&e->dest_offsets_offset, 0);
    StoreSystem64(&e->reserved[0], 0);
    StoreSystem64(&e->reserved[1], 0);
  }
  __threadfence_system();  // the entries and the miss list are visible before the tail
  *tail_word = tail + pieces;
  __threadfence_system();
}

// Waits for the pieces SubmitMissesKernel published (none: no wait) and advances the step.
__global__ void WaitMissesKernel(DeviceRing ring, QueueState* state, const uint32_t* count,
                                 uint32_t piece_rows, uint64_t timeout_ns,
                                 volatile int32_t* error) {
  ENGRAM_GPU_RELEASE_DEPENDENTS();
  AwaitRequests(ring, state, MissPieces(*count, piece_rows), timeout_ns, error);
  state->misses_ok = *error == 0;  // device memory: the scatter's blocks read this, not the host
}

// Dequantises fetched miss i (rows[i * 264], the data region) into out's slot slots[i], one
// warp per miss; warps past *count do nothing. Launched after-prior behind WaitMissesKernel.
__global__ void __launch_bounds__(kFusedThreads)
    ScatterMissesKernel(const QueueState* state, const uint8_t* rows, const uint32_t* slots,
                        const uint32_t* count, uint16_t* out) {
  ENGRAM_GPU_AWAIT_PRIOR_GRID();
  if (state->misses_ok == 0) return;  // a failed or skipped step: its misses are not written
  const uint32_t lane = threadIdx.x % engram::kernels::kThreadsPerSlot;
  const uint64_t miss =
      uint64_t{blockIdx.x} * kFusedSlotsPerBlock + threadIdx.x / engram::kernels::kThreadsPerSlot;
  if (miss >= *count) return;
  engram::kernels::DequantSlot(rows + miss * ENGRAM_ROW_BYTES, false, lane,
                               out + uint64_t{slots[miss]} * ENGRAM_ROW_VALUES, nullptr);
}

// Block 0 of the fused kernel: piece p is watched by lane p / kWarps of warp p % kWarps, so
// that pieces landing together are seen and fenced side by side rather than one poll round
// after another. Each waits for its piece as WaitKernel waits for a request (its status slot
// holds its ticket, the daemon stopped, or the deadline passed) and marks it in device memory:
// ready[p] = its ticket, after the system-scope acquire, so that a block that sees the flag
// and acquires sees the rows. Only this block polls host memory.
__device__ void PollPieces(const DeviceRing& ring, QueueState* state, uint32_t pieces,
                           uint64_t step, uint64_t timeout_ns) {
  constexpr uint32_t kWarps = kFusedThreads / engram::kernels::kThreadsPerSlot;
  const uint32_t warp = threadIdx.x / engram::kernels::kThreadsPerSlot;
  const uint32_t piece = (threadIdx.x % engram::kernels::kThreadsPerSlot) * kWarps + warp;
  if (piece >= pieces) return;
  volatile engram_request_status* st = &ring.status[piece];
  const uint64_t expected = Ticket(step, piece);
  const uint64_t start = ENGRAM_GPU_NOW_NS();
  int32_t abandoned = 0;
  while (true) {
    if (st->ticket == expected) {
      ENGRAM_GPU_ACQUIRE_SYSTEM();  // the code and the rows come after the ticket
      const int32_t code = st->code;
      if (code != ENGRAM_STATUS_OK) atomicCAS(&state->failure, 0, code);
      *reinterpret_cast<volatile uint64_t*>(&state->ready[piece]) = expected;
      return;
    }
    if (reinterpret_cast<volatile uint32_t*>(&ring.header->daemon_state)[0] !=
        ENGRAM_DAEMON_SERVING) {
      abandoned = ENGRAM_STATUS_UNAVAILABLE;
    } else if (ENGRAM_GPU_NOW_NS() - start > timeout_ns) {
      abandoned = ENGRAM_STATUS_DEADLINE_EXCEEDED;
    }
    if (abandoned != 0) {
      atomicCAS(&state->failure, 0, abandoned);
      __threadfence();
      *reinterpret_cast<volatile uint64_t*>(&state->abandoned) = Ticket(step, 0);
      return;
    }
    ENGRAM_GPU_PAUSE();
  }
}

// A dequantising block's wait for piece p: the flag block 0 sets, until block 0 abandons the
// step (and records why) or the deadline passes (recorded here too, so that a step whose block
// 0 ran late cannot end unflagged). True once the piece's rows are visible.
// The blocks never look at host memory themselves: reads of one host cache line by every block
// at once are served one after another, and such a burst (tried as a fallback look at the
// status slot every 50 us) held up the link for ~70 us each time. A decode step's grid is
// resident at once and blocks are dispatched in index order, so block 0's poll is running; if
// it were not, every block would still give up at the deadline.
__device__ bool AwaitPiece(QueueState* state, uint32_t piece, uint64_t step, uint64_t timeout_ns) {
  const uint64_t expected = Ticket(step, piece);
  const uint64_t start = ENGRAM_GPU_NOW_NS();
  const volatile uint64_t* ready = &state->ready[piece];
  const volatile uint64_t* abandoned = &state->abandoned;
  while (*ready != expected) {
    if (*abandoned == Ticket(step, 0)) return false;
    if (ENGRAM_GPU_NOW_NS() - start > timeout_ns) {
      atomicCAS(&state->failure, 0, ENGRAM_STATUS_DEADLINE_EXCEEDED);
      return false;
    }
    ENGRAM_GPU_PAUSE_SHORT();
  }
  // Acquire at device scope: block 0 set the flag after its own system-scope acquire of the
  // daemon's release, so the rows are visible here by causality.
  __threadfence();
  return true;
}

// Runs after SubmitKernel published the step's pieces. Block 0 polls them (PollPieces); every
// other block waits for the pieces its slots read, one lane of warp 0 per piece, and
// dequantises them, one warp per slot: the barrier hands warp 0's acquire to the other warps.
// While the error word is set (nothing was published), nothing is awaited or written. The
// last block to finish records the step's failure in *error and advances the step; until then
// every block reads the same state->step. An ordinary launch, once SubmitKernel has finished:
// launched after-prior, so that its blocks were in place while the pieces were published, it
// had the requests reach the daemon 150-185 us later (measured on the H200, whether or not
// block 0 polled the host before the submit kernel was done), and its launch is hidden behind
// the daemon's service time anyway. (A version that published from block 0 of this kernel, saving
// the submit kernel's launch, was as late, ~150 us.)
__global__ void __launch_bounds__(kFusedThreads)
    WaitDequantKernel(DeviceRing ring, QueueState* state, uint32_t pieces, DeviceDequants dq,
                      uint64_t timeout_ns, volatile int32_t* error) {
  __shared__ uint32_t need;     // bit p: this block waits for piece p
  __shared__ uint32_t invalid;  // the rows are not valid: skipped step or abandoned wait
  const uint32_t warp = threadIdx.x / engram::kernels::kThreadsPerSlot;
  const uint32_t lane = threadIdx.x % engram::kernels::kThreadsPerSlot;
  const uint64_t step = state->step;
  if (blockIdx.x == 0) {
    if (*error == 0) PollPieces(ring, state, pieces, step, timeout_ns);
  } else {
    if (threadIdx.x == 0) {
      need = 0;
      invalid = *error != 0;
    }
    uint32_t d = 0;
    while (d + 1 < dq.n && blockIdx.x >= dq.d[d + 1].first_block) ++d;
    const DeviceDequant& dd = dq.d[d];
    const uint64_t slot = (blockIdx.x - dd.first_block) * kFusedSlotsPerBlock + warp;
    const bool has_slot = slot < dd.slots;
    const int32_t index = has_slot ? dd.index_map[slot] : -1;
    const bool in_range = index >= 0 && static_cast<uint32_t>(index) < dd.num_rows;
    __syncthreads();
    if (in_range && lane == 0) {
      atomicOr(&need, 1u << (dd.first_piece + static_cast<uint32_t>(index) / dq.piece_rows));
    }
    __syncthreads();
    if (warp == 0 && invalid == 0 && lane < pieces && (need >> lane & 1u) != 0 &&
        !AwaitPiece(state, lane, step, timeout_ns)) {
      invalid = 1;
    }
    __syncthreads();
    if (has_slot && invalid == 0) {
      const uint8_t* row = in_range ? dd.rows + uint64_t(index) * ENGRAM_ROW_BYTES : nullptr;
      engram::kernels::DequantSlot(row, index < 0, lane, dd.out + slot * ENGRAM_ROW_VALUES,
                                   dd.bad_index_count);
    }
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(&state->blocks_done, 1u) != gridDim.x - 1) return;
  __threadfence();  // every block's failure is in state->failure
  const int32_t failure = atomicExch(&state->failure, 0);
  if (failure > 0 && *error == 0) {
    *error = failure;
    __threadfence_system();
  }
  state->blocks_done = 0;
  state->step += 1;
}

}  // namespace

struct engram_gpu_queue {
  DeviceRing ring{};
  uint8_t* host_data = nullptr;          // the data region, host addresses
  const uint8_t* device_data = nullptr;  // the same, device addresses (null: not registered)
  uint64_t data_bytes = 0;
  QueueState* state = nullptr;    // device memory
  int32_t* error_host = nullptr;  // pinned, mapped
  int32_t* error_device = nullptr;
  uint64_t timeout_ns = kDefaultTimeoutNs;
  bool overlap = true;  // launch the kernels after-prior (not ENGRAM_GPU_QUEUE_NO_OVERLAP)
};

namespace {

int DeviceAddresses(engram_session* session, const engram_gpu_registration* reg,
                    engram_gpu_queue* q) {
  struct engram_device_ring ring {};
  ring.size = sizeof(ring);
  if (int rc = engram_device_ring(session, &ring); rc < 0) {
    return Fail(-rc, "engram_gpu_queue_create: %s", engram_last_error());
  }
  q->ring.header = static_cast<engram_arena_header*>(engram_gpu_device_ptr(reg, ring.header));
  q->ring.sq = static_cast<engram_sqe*>(engram_gpu_device_ptr(reg, ring.sq));
  q->ring.status = static_cast<engram_request_status*>(engram_gpu_device_ptr(reg, ring.status));
  q->ring.slots = ring.slots;
  q->host_data = ring.data;
  q->device_data = static_cast<const uint8_t*>(engram_gpu_device_ptr(reg, ring.data));
  q->data_bytes = ring.data_bytes;
  if (q->ring.header == nullptr || q->ring.sq == nullptr || q->ring.status == nullptr) {
    return Fail(EINVAL,
                "engram_gpu_queue_create: the registration does not cover the arena's "
                "header and rings (register the whole engram_arena())");
  }
  return 0;
}

// Reads the n requests of a call named `what` (an array of size-prefixed structs) and checks
// what needs no queue. Before the queue is looked at, so that what the caller passed is checked
// first (and without a GPU).
int ReadRequests(const char* what, const engram_gpu_request* theirs, uint32_t n,
                 engram_gpu_request* ret_requests) {
  if (theirs == nullptr || n == 0) return Fail(EINVAL, "%s: NULL argument or no request", what);
  if (n > kMaxRequests) {
    return Fail(EINVAL, "%s: %u requests; at most %u per call", what, n, kMaxRequests);
  }
  if (int rc = engram::kernels::ReadArray(what, "engram_gpu_request", theirs, n, ret_requests);
      rc < 0) {
    return rc;
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (ret_requests[i].flags != 0) {
      return Fail(EINVAL, "%s: request %u has flags 0x%x (0 expected)", what, i,
                  ret_requests[i].flags);
    }
  }
  return 0;
}

// Checks request i (read by ReadRequests) against the queue's data region and returns its
// offsets there.
int CheckRequest(const engram_gpu_queue& q, const engram_gpu_request& r, uint32_t i,
                 const char* what, DeviceRequest* ret) {
  const uint8_t* data = q.host_data;
  const auto* rows = reinterpret_cast<const uint8_t*>(r.rows);
  const uint64_t row_bytes = r.num_rows * 8, dest_bytes = r.num_rows * ENGRAM_ROW_BYTES;
  if (r.num_rows == 0 || r.num_rows > q.data_bytes || rows < data || r.dest < data ||
      static_cast<uint64_t>(rows - data) + row_bytes > q.data_bytes ||
      static_cast<uint64_t>(r.dest - data) + dest_bytes > q.data_bytes) {
    return Fail(EINVAL,
                "%s: request %u (table %u, %llu rows): row ids and destination must lie inside "
                "the session's data region",
                what, i, r.layer, static_cast<unsigned long long>(r.num_rows));
  }
  *ret = {r.layer, r.num_rows, static_cast<uint64_t>(rows - data),
          static_cast<uint64_t>(r.dest - data)};
  return 0;
}

// Reads the n dequantisations of the fused call (an array of size-prefixed structs) and checks
// what needs no queue, as ReadRequests does.
int ReadDequants(const char* what, const engram_gpu_dequant* theirs, uint32_t n,
                 engram_gpu_dequant* ret_dequants) {
  if (theirs == nullptr) return Fail(EINVAL, "%s: NULL dequants", what);
  if (int rc = engram::kernels::ReadArray(what, "engram_gpu_dequant", theirs, n, ret_dequants);
      rc < 0) {
    return rc;
  }
  for (uint32_t i = 0; i < n; ++i) {
    const engram_gpu_dequant& d = ret_dequants[i];
    if (d.index_map == nullptr || d.out == nullptr || d.tokens == 0 || d.heads == 0) {
      return Fail(EINVAL,
                  "%s: dequant %u: index_map (%p) and out (%p) must be set and tokens (%u) x "
                  "heads (%u) must not be 0",
                  what, i, static_cast<const void*>(d.index_map), d.out, d.tokens, d.heads);
    }
    if (reinterpret_cast<uintptr_t>(d.out) % 16 != 0) {
      return Fail(EINVAL, "%s: dequant %u: out %p is not 16-byte aligned", what, i, d.out);
    }
  }
  return 0;
}

// Checks what the fused call dequantises from request i (whose offsets `whole` holds).
int CheckDequant(const engram_gpu_request& r, const DeviceRequest& whole, uint32_t i,
                 const char* what) {
  if (whole.num_rows > uint64_t{INT32_MAX}) {
    return Fail(EINVAL, "%s: request %u has %llu rows, past the int32 index map's range", what, i,
                static_cast<unsigned long long>(whole.num_rows));
  }
  if (whole.dest_offset % kPieceAlign != 0) {
    return Fail(EINVAL, "%s: request %u: destination %p is not %u-byte aligned", what, i,
                static_cast<const void*>(r.dest), kPieceAlign);
  }
  return 0;
}

// The queue's options (NULL: the defaults), checked before anything else of the call.
int ReadQueueOptions(const engram_gpu_queue_options* opts, engram_gpu_queue_options* ret) {
  *ret = engram_gpu_queue_options{};
  if (opts == nullptr) return 0;
  if (int rc = engram::kernels::ReadStruct("engram_gpu_queue_create", "engram_gpu_queue_options",
                                           opts, ret);
      rc < 0) {
    return rc;
  }
  if ((ret->flags & ~uint32_t{ENGRAM_GPU_QUEUE_NO_OVERLAP}) != 0) {
    return Fail(EINVAL, "engram_gpu_queue_create: unknown option flags 0x%x", ret->flags);
  }
  return 0;
}

// The offsets in the data region of the cache step's miss list (device address `rows`) and
// fetched rows (`dest`), each with room for `slots` entries.
int MissOffsets(const engram_gpu_queue& q, const uint64_t* rows, const void* dest, uint64_t slots,
                const char* what, uint64_t* ret_rows, uint64_t* ret_dest) {
  const auto* data = q.device_data;
  const auto* r = reinterpret_cast<const uint8_t*>(rows);
  const auto* d = static_cast<const uint8_t*>(dest);
  if (data == nullptr || r < data || d < data ||
      static_cast<uint64_t>(r - data) + slots * 8 > q.data_bytes ||
      static_cast<uint64_t>(d - data) + slots * ENGRAM_ROW_BYTES > q.data_bytes ||
      (r - data) % 8 != 0 || (d - data) % 8 != 0) {
    return Fail(EINVAL,
                "%s: misses.rows (%p, %llu ids) and miss_dest (%p, %llu rows) must be 8-byte "
                "aligned device addresses inside the session's registered data region",
                what, static_cast<const void*>(rows), static_cast<unsigned long long>(slots), dest,
                static_cast<unsigned long long>(slots));
  }
  *ret_rows = static_cast<uint64_t>(r - data);
  *ret_dest = static_cast<uint64_t>(d - data);
  return 0;
}

int EnsureCacheKernels() {
  static std::once_flag once;
  static gpuError_t loaded = gpuSuccess;
  std::call_once(once, [] {
    loaded = PreloadKernel(SubmitMissesKernel);
    if (loaded == gpuSuccess) loaded = PreloadKernel(WaitMissesKernel);
    if (loaded == gpuSuccess) loaded = PreloadKernel(ScatterMissesKernel);
  });
  return loaded == gpuSuccess ? 0 : FailRuntime("loading the queue's cache step kernels", loaded);
}

}  // namespace

extern "C" {

void engram_gpu_queue_options_init(struct engram_gpu_queue_options* opts, size_t size) {
  engram::kernels::InitStruct("engram_gpu_queue_options_init", "engram_gpu_queue_options",
                              engram_gpu_queue_options{}, opts, size);
}

int engram_gpu_queue_create(engram_session* session, const engram_gpu_registration* reg,
                            const struct engram_gpu_queue_options* opts,
                            engram_gpu_queue** ret_queue) {
  engram_gpu_queue_options o;
  if (int rc = ReadQueueOptions(opts, &o); rc < 0) return rc;
  if (session == nullptr || reg == nullptr || ret_queue == nullptr) {
    return Fail(EINVAL, "engram_gpu_queue_create: NULL argument");
  }
  gpuError_t loaded = PreloadKernel(SubmitKernel);
  if (loaded == gpuSuccess) loaded = PreloadKernel(WaitKernel);
  if (loaded == gpuSuccess) loaded = PreloadKernel(WaitDequantKernel);
  if (loaded != gpuSuccess) {
    return FailRuntime("engram_gpu_queue_create: loading the queue kernels", loaded);
  }
  // The cache step's too, so that its first call may be captured.
  if (int rc = EnsureCacheKernels(); rc < 0) return rc;
  if (int rc = engram::kernels::PreloadCacheLookup(); rc < 0) return rc;
  auto* q = new (std::nothrow) engram_gpu_queue;
  if (q == nullptr) return Fail(ENOMEM, "engram_gpu_queue_create: out of memory");
  if (o.timeout_ns != 0) q->timeout_ns = o.timeout_ns;
  q->overlap = (o.flags & ENGRAM_GPU_QUEUE_NO_OVERLAP) == 0;
  if (int rc = DeviceAddresses(session, reg, q); rc < 0) {
    delete q;
    return rc;
  }
  gpuError_t st = gpuMalloc(reinterpret_cast<void**>(&q->state), sizeof(QueueState));
  if (st == gpuSuccess) st = gpuMemset(q->state, 0, sizeof(QueueState));
  if (st == gpuSuccess) {
    st = gpuHostAlloc(reinterpret_cast<void**>(&q->error_host), sizeof(int32_t),
                      gpuHostAllocMapped | gpuHostAllocPortable);
  }
  if (st == gpuSuccess) {
    *q->error_host = 0;
    st = gpuHostGetDevicePointer(reinterpret_cast<void**>(&q->error_device), q->error_host, 0);
  }
  if (st != gpuSuccess) {
    engram_gpu_queue_destroy(q);
    return FailRuntime("engram_gpu_queue_create", st);
  }
  *ret_queue = q;
  return 0;
}

int engram_gpu_queue_destroy(engram_gpu_queue* queue) {
  if (queue == nullptr) return 0;
  gpuError_t st = gpuSuccess;
  if (queue->state != nullptr) st = gpuFree(queue->state);
  if (queue->error_host != nullptr) {
    const gpuError_t st2 = gpuFreeHost(queue->error_host);
    if (st == gpuSuccess) st = st2;
  }
  delete queue;
  return st == gpuSuccess ? 0 : FailRuntime("engram_gpu_queue_destroy", st);
}

int engram_gpu_queue_gather(engram_gpu_queue* queue, const struct engram_gpu_request* requests,
                            uint32_t n, uintptr_t stream) {
  constexpr const char* kWhat = "engram_gpu_queue_gather";
  engram_gpu_request r[kMaxRequests];
  if (int rc = ReadRequests(kWhat, requests, n, r); rc < 0) return rc;
  if (queue == nullptr) return Fail(EINVAL, "%s: NULL queue", kWhat);
  if (n > queue->ring.slots) {
    return Fail(EINVAL, "%s: %u requests; at most the session's %u slots", kWhat, n,
                queue->ring.slots);
  }
  DeviceRequests reqs{};
  reqs.n = n;
  for (uint32_t i = 0; i < n; ++i) {
    if (int rc = CheckRequest(*queue, r[i], i, kWhat, &reqs.r[i]); rc < 0) return rc;
  }
  auto s = reinterpret_cast<gpuStream_t>(stream);
  gpuError_t st = LaunchAfterPrior(queue->overlap, SubmitKernel, 1, 1, 0, s, queue->ring,
                                   queue->state, reqs, queue->error_device);
  if (st == gpuSuccess) {
    st = LaunchAfterPrior(false, WaitKernel, 1, 1, 0, s, queue->ring, queue->state, n,
                          queue->timeout_ns, queue->error_device);
  }
  return st == gpuSuccess ? 0 : FailRuntime("engram_gpu_queue_gather launch", st);
}

int engram_gpu_queue_gather_dequant(engram_gpu_queue* queue,
                                    const struct engram_gpu_request* requests,
                                    const struct engram_gpu_dequant* dequants, uint32_t n,
                                    uint32_t piece_rows, uintptr_t stream) {
  constexpr const char* kWhat = "engram_gpu_queue_gather_dequant";
  engram_gpu_request r[kMaxRequests];
  engram_gpu_dequant dequant[kMaxRequests];
  if (int rc = ReadRequests(kWhat, requests, n, r); rc < 0) return rc;
  if (int rc = ReadDequants(kWhat, dequants, n, dequant); rc < 0) return rc;
  if (queue == nullptr) return Fail(EINVAL, "%s: NULL queue", kWhat);
  const uint32_t max_pieces = std::min(kMaxRequests, queue->ring.slots);
  if (piece_rows == 0) {
    uint64_t rows[kMaxRequests];
    for (uint32_t i = 0; i < n; ++i) rows[i] = r[i].num_rows;
    piece_rows = engram::kernels::DefaultPieceRows(rows, n, max_pieces);
  }
  if (piece_rows % kPieceRowsMultiple != 0) {
    return Fail(EINVAL,
                "%s: piece_rows %u is not a multiple of %u (every piece must start on a "
                "128-byte boundary of its destination)",
                kWhat, piece_rows, kPieceRowsMultiple);
  }
  if (queue->device_data == nullptr) {
    return Fail(EINVAL,
                "%s: the queue's registration does not cover the session's data region, where "
                "the kernel reads the rows (register the whole engram_arena())",
                kWhat);
  }
  DeviceRequests reqs{};
  DeviceDequants dq{};
  dq.n = n;
  dq.piece_rows = piece_rows;
  uint64_t blocks = 1;  // block 0 polls
  for (uint32_t i = 0; i < n; ++i) {
    DeviceRequest whole;
    if (int rc = CheckRequest(*queue, r[i], i, kWhat, &whole); rc < 0) return rc;
    if (int rc = CheckDequant(r[i], whole, i, kWhat); rc < 0) return rc;
    const uint64_t count = (whole.num_rows + piece_rows - 1) / piece_rows;
    if (reqs.n + count > max_pieces) {
      return Fail(EINVAL,
                  "%s: request %u (table %u, %llu rows) needs pieces %u to %llu of %u rows; a "
                  "call holds at most %u pieces (%u per call, the session's %u slots): raise "
                  "piece_rows or split the call",
                  kWhat, i, whole.table, static_cast<unsigned long long>(whole.num_rows), reqs.n,
                  static_cast<unsigned long long>(reqs.n + count - 1), piece_rows, max_pieces,
                  kMaxRequests, queue->ring.slots);
    }
    const engram_gpu_dequant& d = dequant[i];
    const uint64_t slots = uint64_t{d.tokens} * d.heads;
    dq.d[i] = {d.index_map,
               static_cast<uint16_t*>(d.out),
               d.bad_index_count,
               queue->device_data + whole.dest_offset,
               slots,
               blocks,
               static_cast<uint32_t>(whole.num_rows),
               reqs.n};
    for (uint64_t first = 0; first < whole.num_rows; first += piece_rows) {
      reqs.r[reqs.n++] = {whole.table, std::min<uint64_t>(piece_rows, whole.num_rows - first),
                          whole.rows_offset + first * 8,
                          whole.dest_offset + first * ENGRAM_ROW_BYTES};
    }
    blocks += (slots + kFusedSlotsPerBlock - 1) / kFusedSlotsPerBlock;
  }
  if (blocks > uint64_t{INT32_MAX}) {
    return Fail(EINVAL, "%s: %llu output slots in all; at most %llu per call", kWhat,
                static_cast<unsigned long long>((blocks - 1) * kFusedSlotsPerBlock),
                static_cast<unsigned long long>(uint64_t{INT32_MAX} * kFusedSlotsPerBlock));
  }
  auto s = reinterpret_cast<gpuStream_t>(stream);
  gpuError_t st = LaunchAfterPrior(queue->overlap, SubmitKernel, 1, 1, 0, s, queue->ring,
                                   queue->state, reqs, queue->error_device);
  if (st == gpuSuccess) {
    st = LaunchAfterPrior(false, WaitDequantKernel, static_cast<unsigned>(blocks), kFusedThreads, 0,
                          s, queue->ring, queue->state, reqs.n, dq, queue->timeout_ns,
                          queue->error_device);
  }
  return st == gpuSuccess ? 0 : FailRuntime("engram_gpu_queue_gather_dequant launch", st);
}

int engram_gpu_queue_cache_gather(engram_gpu_queue* queue, const struct engram_gpu_row_cache* cache,
                                  const uint64_t* row_ids, uint32_t tokens, uint32_t heads,
                                  void* out, const struct engram_gpu_cache_misses* misses,
                                  void* miss_dest, uint32_t* bad_index_count, uintptr_t stream) {
  constexpr const char* kWhat = "engram_gpu_queue_cache_gather";
  engram::kernels::DeviceRowCache c;
  engram::kernels::DeviceMisses m;
  if (int rc = engram::kernels::ReadRowCache(kWhat, cache, &c); rc < 0) return rc;
  if (int rc = engram::kernels::ReadMisses(kWhat, misses, &m); rc < 0) return rc;
  const uint64_t slots = uint64_t{tokens} * heads;
  if (queue == nullptr || row_ids == nullptr || out == nullptr || miss_dest == nullptr ||
      slots == 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    return Fail(EINVAL,
                "%s: queue, row_ids, out (16-byte aligned) and miss_dest must be set and tokens "
                "(%u) x heads (%u) not 0",
                kWhat, tokens, heads);
  }
  uint64_t rows_offset = 0, dest_offset = 0;
  if (int rc = MissOffsets(*queue, m.rows, miss_dest, slots, kWhat, &rows_offset, &dest_offset);
      rc < 0) {
    return rc;
  }
  const uint32_t max_pieces = std::min(kMaxRequests, queue->ring.slots);
  uint64_t piece_rows =
      std::max<uint64_t>(ENGRAM_GPU_PIECE_ROWS_DEFAULT, (slots + max_pieces - 1) / max_pieces);
  piece_rows = (piece_rows + kPieceRowsMultiple - 1) / kPieceRowsMultiple * kPieceRowsMultiple;
  if (int rc = EnsureCacheKernels(); rc < 0) return rc;
  auto s = reinterpret_cast<gpuStream_t>(stream);
  auto* o = static_cast<uint16_t*>(out);
  if (int rc =
          engram::kernels::LaunchCacheLookup(kWhat, c, row_ids, slots, o, m, bad_index_count, s);
      rc < 0) {
    return rc;
  }
  const auto pieces = static_cast<uint32_t>(piece_rows);
  gpuError_t st = LaunchAfterPrior(false, SubmitMissesKernel, 1, 1, 0, s, queue->ring, queue->state,
                                   c.layer, rows_offset, dest_offset, pieces,
                                   static_cast<const uint32_t*>(m.count), queue->error_device);
  if (st == gpuSuccess) {
    st = LaunchAfterPrior(false, WaitMissesKernel, 1, 1, 0, s, queue->ring, queue->state,
                          static_cast<const uint32_t*>(m.count), pieces, queue->timeout_ns,
                          queue->error_device);
  }
  if (st == gpuSuccess) {
    const auto blocks =
        static_cast<unsigned>((slots + kFusedSlotsPerBlock - 1) / kFusedSlotsPerBlock);
    st = LaunchAfterPrior(true, ScatterMissesKernel, blocks, kFusedThreads, 0, s,
                          static_cast<const QueueState*>(queue->state),
                          queue->device_data + dest_offset, static_cast<const uint32_t*>(m.slots),
                          static_cast<const uint32_t*>(m.count), o);
  }
  return st == gpuSuccess ? 0 : FailRuntime("engram_gpu_queue_cache_gather launch", st);
}

volatile int32_t* engram_gpu_queue_error(engram_gpu_queue* queue) {
  return queue != nullptr ? queue->error_host : nullptr;
}

int engram_gpu_queue_steps(engram_gpu_queue* queue, uint64_t* ret_steps) {
  if (queue == nullptr || ret_steps == nullptr) {
    return Fail(EINVAL, "engram_gpu_queue_steps: NULL argument");
  }
  uint64_t steps = 0;
  const gpuError_t st =
      gpuMemcpy(&steps, &queue->state->step, sizeof(steps), gpuMemcpyDeviceToHost);
  if (st != gpuSuccess) return FailRuntime("engram_gpu_queue_steps", st);
  *ret_steps = steps;
  return 0;
}

}  // extern "C"
