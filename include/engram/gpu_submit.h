/* engram/gpu_submit.h: gather requests submitted and awaited by the GPU itself.
 *
 * A decode step whose row ids are computed on the GPU (engram/gpu_hash.h) should not hand them
 * to a host thread to submit: the stream would wait on that thread. A GPU queue lets kernels on
 * the stream publish the step's gather requests into the session's arena, wait for their
 * completion, and go on to dequantise the rows, with no host call per step: the whole step is
 * captured into a CUDA graph once and replayed. The protocol (memory ordering, who writes which
 * word, ticket recycling, what happens when the daemon is gone) is in docs/gpu.md, "Requests from
 * the GPU".
 *
 * Implemented by libengram_kernels_cuda (HIP: compile-checked only). Conventions: those of
 * engram/gpu.h (0 or a negative errno, engram_last_error(), streams as integers).
 *
 * Example: one captured step (hash into the arena, gather, dequantise).
 *
 *   engram_connect_options o; engram_connect_options_init(&o, sizeof o);
 *   o.flags = ENGRAM_CONNECT_DEVICE_SUBMIT;
 *   engram_session_open(&o, &s);                         // the ring now belongs to the GPU
 *   engram_arena(s, &arena, &arena_bytes);
 *   engram_gpu_register(arena, arena_bytes, &reg);       // header, rings and data, once
 *   engram_gpu_queue_create(s, reg, NULL, &q);
 *   engram_alloc(s, n * 8, &ids); engram_alloc(s, n * 264, &rows);
 *   struct engram_gpu_request r = {.size = sizeof r, .layer = 14, .rows = ids, .num_rows = n,
 *                                  .dest = rows};
 *   cudaStreamBeginCapture(stream, ...);
 *   engram_gpu_hash(gh, &args_writing_into(device_ptr(ids)), stream);
 *   engram_gpu_queue_gather(q, &r, 1, stream);           // submit + wait, on the GPU
 *   engram_dequant_scatter(device_ptr(rows), n, map, tokens, heads, out, NULL, 0, NULL, stream);
 *   // or, pipelined, the last two in one: engram_gpu_queue_gather_dequant(q, &r, &d, 1, 0, stream)
 *   cudaStreamEndCapture(stream, &graph);
 *   ... replay the graph every step; after a step, *engram_gpu_queue_error(q) != 0 means its
 *   rows are not valid (see the recovery in docs/gpu.md).
 */
#ifndef ENGRAM_GPU_SUBMIT_H_
#define ENGRAM_GPU_SUBMIT_H_

#include <stddef.h>
#include <stdint.h>

#include "engram/engram.h"
#include "engram/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct engram_gpu_queue engram_gpu_queue;

struct engram_gpu_queue_options {
  size_t size;         /* engram_gpu_queue_options_init sets it */
  uint64_t timeout_ns; /* how long a device wait may take before it gives up and flags the
                          step DEADLINE_EXCEEDED; 0: 2 s */
  uint32_t flags;      /* ENGRAM_GPU_QUEUE_* */
};
ENGRAM_ASSERT_SIZE(struct engram_gpu_queue_options, 24);
/* Launch each of the queue's kernels only once the kernel ahead of it on the stream has
 * finished. By default (CUDA, compute capability 9.0 or later) the submit kernel is a
 * programmatic dependent launch, in place while the kernel that writes the row ids finishes
 * (docs/gpu.md, "Requests from the GPU", overlapped launches). For comparison, or a driver that
 * mishandles such launches. */
#define ENGRAM_GPU_QUEUE_NO_OVERLAP (1u << 0)

/* Fills the caller's struct of `size` bytes (sizeof *opts) with the defaults and sets its size
 * field; writes nothing for a NULL struct or a size out of bounds (engram.h, convention 3). */
ENGRAM_API void engram_gpu_queue_options_init(struct engram_gpu_queue_options* opts, size_t size);

/* A queue over a session connected with ENGRAM_CONNECT_DEVICE_SUBMIT whose whole arena
 * (engram_arena) is registered as reg. Allocates the queue's device state and a pinned error
 * word. Not capturable; call it once. Returns 0, -EINVAL, -EPERM (the session submits from the
 * host), -E2BIG (opts sets a field this library does not know), -ENOMEM or -EIO. opts is
 * checked first, before the session and the GPU runtime (engram.h, conventions 3-4). */
ENGRAM_API int engram_gpu_queue_create(engram_session* session, const engram_gpu_registration* reg,
                                       const struct engram_gpu_queue_options* opts,
                                       engram_gpu_queue** ret_queue);

/* Frees the queue; the caller makes sure no queued work still uses it. NULL is a no-op. */
ENGRAM_API int engram_gpu_queue_destroy(engram_gpu_queue* queue);

/* One gather, as engram_submit takes it, but published by the GPU. rows and dest are host
 * addresses inside the session's data region (engram_alloc); their offsets are fixed when the
 * call is queued, their contents are read when the request runs. */
struct engram_gpu_request {
  size_t size; /* sizeof(struct engram_gpu_request) */
  union {
    uint32_t layer;                                /* the table's Engram layer id */
    uint32_t table ENGRAM_DEPRECATED("use layer"); /* older name of `layer` */
  };
  uint32_t flags;       /* 0 */
  const uint64_t* rows; /* num_rows row ids (written by a kernel before the gather runs) */
  uint64_t num_rows;
  uint8_t* dest; /* num_rows x 264 bytes */
};
ENGRAM_ASSERT_SIZE(struct engram_gpu_request, 40);

/* Queues on stream: a kernel that publishes the n requests into the session's submission ring
 * (system-scope fences, then the tail), then a kernel that waits until the daemon completed all
 * of them, the deadline passed, or the daemon stopped. Work queued after it on the stream sees
 * the rows. n must be at most the session's slots. On any failure the wait records a status
 * code (enum engram_status_code) in the queue's error word and lets the stream go on.
 * Capturable: replays reuse the same slots with fresh tickets. requests is an array of
 * size-prefixed structs (engram.h, convention 5: the first one's size is the stride), read
 * before the queue is looked at. Returns 0, -EINVAL, -E2BIG or -EIO. */
ENGRAM_API int engram_gpu_queue_gather(engram_gpu_queue* queue,
                                       const struct engram_gpu_request* requests, uint32_t n,
                                       uintptr_t stream);

/* What to dequantise from one request's rows, as engram_dequant_scatter takes it: slot s of
 * [tokens, heads] takes row index_map[s] of the request (negative: padding, written as +0.0; at
 * or past the request's num_rows: NaN, counted in *bad_index_count). */
struct engram_gpu_dequant {
  size_t size;              /* sizeof(struct engram_gpu_dequant) */
  const int32_t* index_map; /* device pointer, tokens x heads entries */
  uint32_t tokens;
  uint32_t heads;
  void* out;                 /* device pointer: bf16 [tokens, heads, 256], 16-byte aligned */
  uint32_t* bad_index_count; /* device pointer, or NULL */
};
ENGRAM_ASSERT_SIZE(struct engram_gpu_dequant, 40);

/* Rows per piece when engram_gpu_queue_gather_dequant is given piece_rows 0: 8 pieces for a
 * 1,152-row step of two layers, one per request thread of a 16-core host (docs/gpu.md). */
#define ENGRAM_GPU_PIECE_ROWS_DEFAULT 144u

/* engram_gpu_queue_gather and the dequantisation of every request's rows in one pipelined
 * step. Each request is published as pieces of at most piece_rows rows (a multiple of 16; 0:
 * ENGRAM_GPU_PIECE_ROWS_DEFAULT, or more where the pieces would not fit the limit below), which
 * the daemon serves side by side on its request threads; one kernel then waits for the pieces
 * and dequantises each slot (dequants[i] for requests[i]) as soon as the piece holding its row
 * has landed, so the first rows are converted while the rest are still being gathered, and
 * nothing is launched between the last row landing and the output. Every piece is awaited
 * before the kernel ends, whether or not a slot reads it. The pieces of one call must fit the
 * session's slots and 32 entries (connect with 32 slots); each destination must be 128-byte
 * aligned (engram_alloc's are) and the data region registered, since the kernel reads the rows
 * there. Failures are recorded in the error word exactly as engram_gpu_queue_gather records
 * them; a failed step's outputs are not valid (a step skipped because the word was already set
 * writes none). Capturable. requests and dequants are arrays of size-prefixed structs, each
 * with its own stride, read as engram_gpu_queue_gather reads requests. Returns 0, -EINVAL,
 * -E2BIG or -EIO. */
ENGRAM_API int engram_gpu_queue_gather_dequant(engram_gpu_queue* queue,
                                               const struct engram_gpu_request* requests,
                                               const struct engram_gpu_dequant* dequants,
                                               uint32_t n, uint32_t piece_rows, uintptr_t stream);

/* A decode step of a cache-tier table in one capturable call (since ENGRAM_KERNELS_0.7):
 * engram_dequant_cache_gather (the hits dequantised into out straight from the row cache, the
 * misses listed in *misses), then a kernel that reads the number of misses from device memory
 * and publishes them as gather requests of the layer (pieces of at most
 * ENGRAM_GPU_PIECE_ROWS_DEFAULT rows, or more where tokens x heads would need more pieces than
 * the session's slots and 32), a kernel that waits for them, and one that dequantises the
 * fetched rows into their slots of out. With no miss nothing is published and nothing awaited.
 * misses->rows and miss_dest (tokens x heads x 264 bytes) are device addresses inside the
 * session's data region (engram_alloc, registered), where the daemon reads the row ids and
 * writes the rows. Failures are recorded in the error word as engram_gpu_queue_gather records
 * them (a failed step's misses are not written). Returns 0, -EINVAL, -ENODEV or -EIO. */
ENGRAM_API int engram_gpu_queue_cache_gather(
    engram_gpu_queue* queue, const struct engram_gpu_row_cache* cache, const uint64_t* row_ids,
    uint32_t tokens, uint32_t heads, void* out, const struct engram_gpu_cache_misses* misses,
    void* miss_dest, uint32_t* bad_index_count, uintptr_t stream);

/* The queue's error word, in pinned host memory: 0 while every step so far succeeded, else the
 * status code of the first failure (DEADLINE_EXCEEDED for a timeout, UNAVAILABLE when the daemon
 * stopped, the request's own code otherwise). The host reads it after a step; it stays set
 * until the host writes 0. */
ENGRAM_API volatile int32_t* engram_gpu_queue_error(engram_gpu_queue* queue);

/* Steps the queue has completed (read after synchronising the stream): a device counter copied
 * back. Returns 0 or -EIO. */
ENGRAM_API int engram_gpu_queue_steps(engram_gpu_queue* queue, uint64_t* ret_steps);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ENGRAM_GPU_SUBMIT_H_ */
