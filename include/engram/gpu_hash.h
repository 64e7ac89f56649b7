/* engram/gpu_hash.h: DeepSeek-V4.1 Engram row ids computed on the GPU from token ids.
 *
 * The same hash as engram/hash.h (compressed vocabulary, per-layer odd multipliers, XOR mix over
 * n-grams of orders 2..N, modulo per-head primes, plus head offsets), bit-exact with it, for
 * engines that sample tokens on the GPU and must not copy them back to the host to hash them
 * (asynchronous decode scheduling learns a step's token one step late on the host). Every input
 * and output lives in device memory, so a hash call can be captured into a CUDA graph once and
 * replayed step after step with new tokens written into the same buffers.
 *
 * Implemented by libengram_kernels_cuda (HIP: compile-checked only), which takes the parameters
 * from a host engram_hasher (libengram_client) once, at creation.
 *
 * Conventions: those of engram/gpu.h. Functions return 0 or a negative errno and never print;
 * engram_last_error() names what was wrong. Streams are passed as integers.
 *
 * Example: a decode step of S sequences of 1 + k tokens, TP rank 1 of 4, layer 14, captured.
 *
 *   engram_gpu_hasher* g;
 *   engram_gpu_hasher_create(host_hasher, &g);                 // once, outside capture
 *   struct engram_gpu_hash_args a;
 *   engram_gpu_hash_args_init(&a, sizeof a);
 *   a.layer = 14; a.head_begin = hb; a.head_end = he;
 *   a.tokens = d_tokens; a.n_tokens = S * (1 + k);             // device buffers, fixed
 *   a.seq_starts = d_starts; a.n_seqs = S;                     // [0, 1+k, 2(1+k), ...]
 *   a.history = d_history;                                     // S x (N-1) ids before each
 *   a.rows = d_rows; a.error_count = d_errors;
 *   engram_gpu_hash(g, &a, stream);                            // inside stream capture
 */
#ifndef ENGRAM_GPU_HASH_H_
#define ENGRAM_GPU_HASH_H_

#include <stddef.h>
#include <stdint.h>

#include "engram/hash.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct engram_gpu_hasher engram_gpu_hasher;

/* Copies every layer's hash parameters (multipliers, head primes and offsets) and, when the host
 * hasher has one, the compressed vocabulary (4 bytes per tokenizer id, ~0.5 MiB for
 * DeepSeek-V4.1) into device memory of the calling thread's current device. The host hasher
 * may be closed afterwards. Returns 0, -EINVAL, -ENOMEM, -ENODEV or -EIO. Not capturable (it
 * allocates); call it once before capture. */
ENGRAM_API int engram_gpu_hasher_create(const engram_hasher* hasher,
                                        engram_gpu_hasher** ret_gpu_hasher);

/* Frees the device memory; the caller makes sure no queued hash still reads it. NULL is a
 * no-op. Returns 0 or -EIO. */
ENGRAM_API int engram_gpu_hasher_destroy(engram_gpu_hasher* gpu_hasher);

/* The arguments of one hash call. Every pointer is a device pointer (device memory or
 * registered host memory); the values they point to are read when the kernel runs, not when
 * it is queued, so a captured graph hashes whatever the buffers hold at each replay. */
struct engram_gpu_hash_args {
  size_t size; /* engram_gpu_hash_args_init sets it; see engram.h's size policy */
  union {
    uint32_t layer;                                   /* the Engram layer, e.g. 14 */
    uint32_t layer_id ENGRAM_DEPRECATED("use layer"); /* older name of `layer` */
  };
  uint32_t flags;      /* ENGRAM_HASH_COMPRESSED_IDS: tokens and history are compressed ids */
  uint32_t head_begin; /* heads [head_begin, head_end) of the layer, e.g. a TP rank's */
  uint32_t head_end;
  const int32_t* tokens;     /* n_tokens ids, the sequences' new tokens back to back */
  uint32_t n_tokens;         /* fixed at launch: the grid covers n_tokens x heads */
  uint32_t n_seqs;           /* fixed at launch */
  const int32_t* seq_starts; /* n_seqs + 1 offsets into tokens: sequence s owns tokens
                                [seq_starts[s], seq_starts[s + 1]); seq_starts[n_seqs] must be
                                n_tokens, and a token outside every sequence is an error */
  const int32_t* history;    /* NULL (every sequence starts here), or n_seqs x (N - 1) ids:
                                the ids right before each sequence's first new token, oldest
                                first; an entry < 0 means "before the start" (the pad id) and
                                must not come after a non-negative one */
  uint64_t* rows;            /* n_tokens x (head_end - head_begin): rows[t * heads + h] is the
                                absolute row of head head_begin + h for token t */
  uint32_t* error_count;     /* NULL, or a device counter incremented once per token whose id
                                (or history id) is out of range or that no sequence holds; such
                                a token's rows are written as UINT64_MAX, which engramd refuses
                                as OUT_OF_RANGE rather than serving a wrong row */
};
ENGRAM_ASSERT_SIZE(struct engram_gpu_hash_args, 72);

/* Zero-fills the caller's struct of `size` bytes (sizeof *args; the defaults: no flags, no
 * heads yet) and sets args->size = size. Writes nothing for a NULL struct or a size out of
 * bounds (engram.h, convention 3). */
ENGRAM_API void engram_gpu_hash_args_init(struct engram_gpu_hash_args* args, size_t size);

/* Queues the hash on stream. Checks on the host what it can, the struct first (engram.h,
 * conventions 3-4: a smaller struct's missing fields are 0, a larger one's must be), then
 * flags, NULL pointers, the layer and the head range; ids are checked on the device
 * (error_count). Returns 0, -E2BIG (a field this library does not know is set),
 * -ENOENT (not an Engram layer of the hasher), -EINVAL, or -EIO/-ENODEV (launch refused).
 * Capturable into a CUDA graph. */
ENGRAM_API int engram_gpu_hash(const engram_gpu_hasher* gpu_hasher,
                               const struct engram_gpu_hash_args* args, uintptr_t stream);

/* The most calls engram_gpu_hash_layers takes at once. */
#define ENGRAM_GPU_HASH_MAX_CALLS 8

/* Queues n hash calls (1..ENGRAM_GPU_HASH_MAX_CALLS; args[i] as engram_gpu_hash takes it, e.g.
 * one per Engram layer of a step) as one kernel launch, so that a step's layers are hashed side
 * by side instead of one launch after another. Every call is checked before anything is queued;
 * a failure names the call ("call 1: ..."). Each call's rows are exactly those engram_gpu_hash
 * would write. Returns what engram_gpu_hash returns. Capturable into a CUDA graph. */
ENGRAM_API int engram_gpu_hash_layers(const engram_gpu_hasher* gpu_hasher,
                                      const struct engram_gpu_hash_args* const* args, uint32_t n,
                                      uintptr_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ENGRAM_GPU_HASH_H_ */
