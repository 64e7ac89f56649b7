// The GPU half of include/engram/gpu_submit.h: kernels that publish gather requests into a
// session's arena and wait for their completion, without a host thread. The protocol is in
// docs/gpu.md ("Requests from the GPU"). One source for nvcc and hipcc (see gpu_compat.h).
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "engram/engram.h"
#include "engram/gpu_submit.h"
#include "engram/protocol.h"
#include "kernels/gpu_compat.h"
#include "kernels/kernel_errors.h"

using engram::kernels::Fail;
using engram::kernels::FailRuntime;

namespace {

// Requests one engram_gpu_queue_gather call publishes; they travel as kernel parameters.
constexpr uint32_t kMaxRequests = 32;
constexpr uint64_t kDefaultTimeoutNs = 2'000'000'000;

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

// The queue's state in device memory: the steps completed, and the tickets of the step in
// flight (written by the submit kernel, read by the wait kernel on the same stream).
struct QueueState {
  uint64_t step;
  uint64_t expected[kMaxRequests];
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

// Publishes the step's requests: entries first, a system-scope fence, then the tail (the
// daemon reads the tail with acquire, then the entries). Slot i carries request i with the
// ticket ((step + 1) << 16) | i, so every step's tickets are new and a late completion of an
// earlier step can never be taken for this one's.
__global__ void SubmitKernel(DeviceRing ring, QueueState* state, DeviceRequests reqs,
                             volatile int32_t* error) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (*error != 0) return;  // a failed queue submits nothing until the host recovers it
  const uint64_t step = state->step;
  volatile uint32_t* tail_word = &ring.header->sq_tail;
  const uint32_t tail = *tail_word;
  for (uint32_t i = 0; i < reqs.n; ++i) {
    const uint64_t ticket = ((step + 1) << 16) | i;
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
    state->expected[i] = ticket;
  }
  __threadfence_system();      // the entries (and the row ids kernels wrote before) are visible...
  *tail_word = tail + reqs.n;  // ...before the daemon can see the new tail
  __threadfence_system();
}

// Waits until every request of the step completed (its status slot holds its ticket; the
// daemon stores the ticket last, with release), the daemon stopped, or the deadline passed.
// Records the first failure in *error. Always advances the step.
__global__ void WaitKernel(DeviceRing ring, QueueState* state, uint32_t n, uint64_t timeout_ns,
                           volatile int32_t* error) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (*error != 0) {  // a failed queue submitted nothing
    state->step += 1;
    return;
  }
  int32_t failure = 0;
  bool abandoned = false;  // the daemon is gone or late: stop waiting for the rest
  const uint64_t start = ENGRAM_GPU_NOW_NS();
  for (uint32_t i = 0; i < n && !abandoned; ++i) {
    volatile engram_request_status* st = &ring.status[i];
    while (true) {
      if (st->ticket == state->expected[i]) {
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
  state->step += 1;
}

}  // namespace

struct engram_gpu_queue {
  DeviceRing ring{};
  uint8_t* host_data = nullptr;  // the data region, host addresses
  uint64_t data_bytes = 0;
  QueueState* state = nullptr;    // device memory
  int32_t* error_host = nullptr;  // pinned, mapped
  int32_t* error_device = nullptr;
  uint64_t timeout_ns = kDefaultTimeoutNs;
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
  q->data_bytes = ring.data_bytes;
  if (q->ring.header == nullptr || q->ring.sq == nullptr || q->ring.status == nullptr) {
    return Fail(EINVAL,
                "engram_gpu_queue_create: the registration does not cover the arena's "
                "header and rings (register the whole engram_arena())");
  }
  return 0;
}

}  // namespace

extern "C" {

void engram_gpu_queue_options_init(struct engram_gpu_queue_options* opts, size_t size) {
  if (opts == nullptr) return;
  std::memset(opts, 0, std::min(size, sizeof(*opts)));
  if (size >= sizeof(opts->size)) opts->size = size;
}

int engram_gpu_queue_create(engram_session* session, const engram_gpu_registration* reg,
                            const struct engram_gpu_queue_options* opts,
                            engram_gpu_queue** ret_queue) {
  if (session == nullptr || reg == nullptr || ret_queue == nullptr) {
    return Fail(EINVAL, "engram_gpu_queue_create: NULL argument");
  }
  engram_gpu_queue_options o{};
  if (opts != nullptr) {
    if (opts->size < sizeof(o.size) || opts->size > sizeof(o)) {
      return Fail(EINVAL,
                  "engram_gpu_queue_create: options size %zu is not a size of "
                  "engram_gpu_queue_options (up to %zu)",
                  opts->size, sizeof(o));
    }
    std::memcpy(&o, opts, opts->size);
  }
  gpuError_t loaded = PreloadKernel(SubmitKernel);
  if (loaded == gpuSuccess) loaded = PreloadKernel(WaitKernel);
  if (loaded != gpuSuccess) {
    return FailRuntime("engram_gpu_queue_create: loading the queue kernels", loaded);
  }
  auto* q = new (std::nothrow) engram_gpu_queue;
  if (q == nullptr) return Fail(ENOMEM, "engram_gpu_queue_create: out of memory");
  if (o.timeout_ns != 0) q->timeout_ns = o.timeout_ns;
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
  if (queue == nullptr || requests == nullptr || n == 0) {
    return Fail(EINVAL, "engram_gpu_queue_gather: NULL argument or no request");
  }
  if (n > kMaxRequests || n > queue->ring.slots) {
    return Fail(EINVAL,
                "engram_gpu_queue_gather: %u requests; at most %u per call and the "
                "session's %u slots",
                n, kMaxRequests, queue->ring.slots);
  }
  DeviceRequests reqs{};
  reqs.n = n;
  const uint8_t* data = queue->host_data;
  for (uint32_t i = 0; i < n; ++i) {
    const engram_gpu_request& r = requests[i];
    if (r.size != sizeof(engram_gpu_request) || r.flags != 0) {
      return Fail(EINVAL,
                  "engram_gpu_queue_gather: request %u has size %zu (expected %zu) or "
                  "flags 0x%x",
                  i, r.size, sizeof(engram_gpu_request), r.flags);
    }
    const auto* rows = reinterpret_cast<const uint8_t*>(r.rows);
    const uint64_t row_bytes = r.num_rows * 8, dest_bytes = r.num_rows * ENGRAM_ROW_BYTES;
    if (r.num_rows == 0 || rows < data || r.dest < data ||
        static_cast<uint64_t>(rows - data) + row_bytes > queue->data_bytes ||
        static_cast<uint64_t>(r.dest - data) + dest_bytes > queue->data_bytes) {
      return Fail(EINVAL,
                  "engram_gpu_queue_gather: request %u (table %u, %llu rows): row ids "
                  "and destination must lie inside the session's data region",
                  i, r.table, static_cast<unsigned long long>(r.num_rows));
    }
    reqs.r[i] = {r.table, r.num_rows, static_cast<uint64_t>(rows - data),
                 static_cast<uint64_t>(r.dest - data)};
  }
  auto s = reinterpret_cast<gpuStream_t>(stream);
  SubmitKernel<<<1, 32, 0, s>>>(queue->ring, queue->state, reqs, queue->error_device);
  WaitKernel<<<1, 32, 0, s>>>(queue->ring, queue->state, n, queue->timeout_ns, queue->error_device);
  const gpuError_t st = gpuGetLastError();
  return st == gpuSuccess ? 0 : FailRuntime("engram_gpu_queue_gather launch", st);
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
