/* The GPU side of engram as a C ABI: registering shared memory with the GPU runtime, the
 * dequantise-and-scatter kernel and stream-side waits on the daemon's completion counter.
 *
 * Two libraries implement this header:
 *   - libengram_client: engram_gpu_register / _device_ptr / _unregister. It links
 *     no GPU runtime: it finds libcudart or libamdhip64 at run time (the one already loaded in
 *     the process first), so one client library serves CUDA hosts, ROCm hosts and hosts with
 *     no GPU at all.
 *   - libengram_kernels_cuda (or _hip): engram_dequant_scatter, the stream waits. Built only
 *     where nvcc (hipcc) exists. It links libengram_client, where its errors are recorded.
 *
 * Conventions (those of engram/engram.h, and):
 *   1. Functions return 0 or a negative errno; they never print. After a failure,
 *      engram_last_error() (engram/engram.h) returns a message for the calling thread naming
 *      what was wrong, for both libraries (the kernel library links libengram_client);
 *      engram_gpu_last_error() and engram_kernels_last_error() are deprecated names for it.
 *   2. Out-parameters are named ret_*, come last and are left untouched on failure.
 *   3. Streams, graphs and graph nodes are passed as integers (uintptr_t of cudaStream_t /
 *      hipStream_t, cudaGraphExec_t, cudaGraphNode_t), so Python (ctypes, torch's
 *      stream.cuda_stream) and C++ callers need no GPU headers. 0 is the legacy default stream.
 *   4. Every pointer handed to a kernel-side function is a device pointer: device memory, or
 *      host memory that engram_gpu_register mapped (use engram_gpu_device_ptr).
 *   5. Thread safety: every function may be called from any thread; a registration must not be
 *      used after engram_gpu_unregister returned.
 *
 * Example (one decode step, rows read straight from the registered arena):
 *   engram_gpu_registration* reg;
 *   if (engram_gpu_register(arena, arena_len, &reg) < 0) log(engram_last_error());
 *   const void* rows_d = engram_gpu_device_ptr(reg, arena_rows);
 *   const void* done_d = engram_gpu_device_ptr(reg, completion_counter);
 *   engram_stream_wait_value64(stream, done_d, ticket, NULL);       // GPU waits, host doesn't
 *   engram_dequant_scatter(rows_d, n, map_d, tokens, heads, out_d, NULL, 0, NULL, stream);
 *
 * docs/gpu.md describes the row format, the index-map contract and the CUDA graph protocol.
 */
#ifndef ENGRAM_GPU_H_
#define ENGRAM_GPU_H_

#include <stddef.h>
#include <stdint.h>

#include "engram/abi.h"
#include "engram/row.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One gathered row (engram/row.h): 256 FP8 E4M3 values, then 8 E8M0 scales. The _GPU_ names are
 * the older spellings of ENGRAM_ROW_BYTES and ENGRAM_ROW_VALUES. */
#define ENGRAM_GPU_ROW_BYTES ENGRAM_ROW_BYTES
#define ENGRAM_GPU_ROW_VALUES ENGRAM_ROW_VALUES
/* bf16 bit pattern written for a NaN input (e4m3 0x7F/0xFF, or scale byte 255) and for a slot
 * whose index is out of range. */
#define ENGRAM_GPU_BF16_NAN 0x7FC0

/* ---- Registration (libengram_client) ---------------------------------------------------- */

typedef struct engram_gpu_registration engram_gpu_registration;

enum engram_gpu_runtime {
  ENGRAM_GPU_RUNTIME_CUDA = 1,
  ENGRAM_GPU_RUNTIME_HIP = 2,
};

/* Registers [addr, addr + len) as pinned, device-mapped, portable host memory with the GPU
 * runtime of this process (cudaHostRegister / hipHostRegister) so that kernels and stream
 * waits can use it through engram_gpu_device_ptr. Typically the client arena's mapping: the
 * row data region and the completion words.
 * Returns 0, or:
 *   -EINVAL   addr is NULL or len is 0;
 *   -ENOSYS   no CUDA or HIP runtime library could be loaded (nothing was changed);
 *   -ENODEV   the runtime loaded but sees no GPU (nothing was changed);
 *   -EEXIST   part of the range is already registered;
 *   -ENOMEM   the runtime could not pin the range;
 *   -EIO      any other runtime error (the message names it).
 * Registering pins the pages: on a 1 GiB range it takes tens of milliseconds; do it once.
 * A read-only mapping (a resident table's, engram_table_map_open) is registered read-only. Where
 * the driver refuses that too, the device's pageable memory access serves if it has one (nothing
 * pinned, the host address is the device address); otherwise the error (-EINVAL) says to gather
 * the rows into the registered arena instead.
 * Unified memory: where the CUDA device reads pageable host memory through the host's page
 * tables (cudaDevAttrPageableMemoryAccessUsesHostPageTables; GB10 / DGX Spark, GH200), nothing is
 * pinned: the registration only records the range, engram_gpu_device_ptr returns the host
 * address itself and engram_gpu_unregister unpins nothing. $ENGRAM_GPU_PIN=1 pins anyway. */
ENGRAM_API int engram_gpu_register(void* addr, size_t len, engram_gpu_registration** ret_reg);

/* The device address of host_addr, which must lie inside the registered range; NULL if it
 * does not. Offsets carry over: device(addr + k) == device(addr) + k. */
ENGRAM_API void* engram_gpu_device_ptr(const engram_gpu_registration* reg, const void* host_addr);

/* Which runtime the registration went through (enum engram_gpu_runtime). */
ENGRAM_API int engram_gpu_registration_runtime(const engram_gpu_registration* reg);

/* Unpins the range and frees reg (also when the runtime reports an error, which is returned as
 * -EIO). The caller must make sure no queued GPU work still reads the range. NULL is a no-op. */
ENGRAM_API int engram_gpu_unregister(engram_gpu_registration* reg);

/* Deprecated: engram_last_error() under its older name. */
ENGRAM_API ENGRAM_DEPRECATED("use engram_last_error") const char* engram_gpu_last_error(void);

/* ---- Row caches read in place by the GPU (libengram_client; since ENGRAM_0.7) ---------- */

typedef struct engram_table_map engram_table_map;

/* What a kernel needs to look rows up in the daemon's row cache (a cache-tier table's map,
 * engram_table_map_open_any, info.kind ENGRAM_TABLE_MAP_ROW_CACHE), as device addresses. The
 * layout words are the region's (docs/row-store.md), fixed for its life: a captured graph may
 * keep them. */
struct engram_gpu_row_cache {
  size_t size;             /* sizeof(struct engram_gpu_row_cache) */
  const void* cache;       /* device address of the region's first byte */
  uint32_t layer;          /* the table's Engram layer (part of every key) */
  uint32_t bucket_count;   /* a power of two */
  uint64_t buckets_offset; /* from cache: bucket_count 32-bit words, slot + 1 or 0 */
  uint64_t slots_offset;   /* from cache: max_slots slots of slot_bytes */
  uint32_t max_slots;
  uint32_t slot_bytes;    /* 288 */
  uint64_t covered_begin; /* the table's row ids: others are bad (NaN, counted) */
  uint64_t covered_end;
  /* 0, or a page size: a slot that straddles a multiple of it is then a miss. Written 0 by
   * engram_table_map_gpu_cache: a slot left half in a page a pinned registration kept and half
   * in a new one fails its row check (docs/gpu.md, "Row cache hits on the GPU"). */
  uint32_t guard_page_bytes;
  uint32_t reserved;
};
ENGRAM_ASSERT_SIZE(struct engram_gpu_row_cache, 72);

/* Fills *ret_cache (set ret_cache->size first) for a row cache map whose whole mapping
 * (info.base, info.map_bytes) reg registered. -EINVAL: not a row cache map (a resident table:
 * engram_dequant_gather reads it), or reg does not cover the mapping. -EOPNOTSUPP: the region's
 * slots carry no row checks (an engramd older than this library wrote it): gather through the
 * arena instead. */
ENGRAM_API int engram_table_map_gpu_cache(const engram_table_map* map,
                                          const engram_gpu_registration* reg,
                                          struct engram_gpu_row_cache* ret_cache);

/* A row cache hit a kernel recorded for the cache's policy: the row's key ((layer + 1) << 40 |
 * row) and the slot it was read from (the layout of the protocol's touch entries). */
struct engram_gpu_cache_hit {
  uint64_t key;
  uint32_t slot;
  uint32_t reserved;
};
ENGRAM_ASSERT_SIZE(struct engram_gpu_cache_hit, 16);

/* Reports hits read in place (by a kernel, copied back by the host) to the daemon through the
 * session's touch page, as engram_gather's in-place path reports its own: hit_rows rows and
 * all_hit_gathers gathers needing no request are added to the table's statistics, and each of
 * the n hits (NULL when n is 0) counts as a use of its slot in the cache's policy (a hit whose
 * slot was rewritten since is ignored by the daemon). Hits past the ring's room are counted as
 * dropped. -EINVAL for a map that is not a row cache. Thread-safe. */
ENGRAM_API int engram_table_map_report_hits(const engram_table_map* map, uint64_t hit_rows,
                                            uint64_t all_hit_gathers,
                                            const struct engram_gpu_cache_hit* hits, size_t n);

/* ---- Kernels (libengram_kernels_cuda / libengram_kernels_hip) --------------------------- */

/* Dequantises gathered rows to bf16 and scatters them into out, laid out [tokens, heads, 256]:
 * slot s = token * heads + head receives the row index_map[s] of rows, as
 * value[i] = e4m3(row[i]) * 2^(row[256 + i / 32] - 127), rounded to nearest-even bf16
 * (subnormals kept; overflow gives +-inf; any NaN input gives ENGRAM_GPU_BF16_NAN).
 *   rows       num_rows * 264 bytes, 8-byte aligned: device memory or registered host memory.
 *   index_map  tokens * heads int32 entries in device memory. index_map[s] < 0 means "no row"
 *              (padding): the slot is written with +0.0. index_map[s] >= num_rows is a caller
 *              bug: the slot is written with NaN and, if bad_index_count is not NULL, the
 *              device counter *bad_index_count is incremented once per such slot.
 *   out        tokens * heads * 256 bf16 values (16-byte aligned device memory).
 *   staging    NULL: the kernel reads rows in place (zero-copy when rows is mapped host
 *              memory). Otherwise a device buffer of staging_bytes >= num_rows * 264: rows are
 *              first copied into it with one cudaMemcpyAsync on the stream, and the kernel reads
 *              the copy.
 *   stream     cudaStream_t / hipStream_t as an integer; the work is queued, not waited for.
 * Returns 0; -EINVAL for a bad argument; -ENODEV/-EIO if the runtime refused the copy or the
 * launch (engram_last_error() names the call and the runtime's error). Capturable into a
 * CUDA graph. */
ENGRAM_API int engram_dequant_scatter(const void* rows, uint32_t num_rows, const int32_t* index_map,
                                      uint32_t tokens, uint32_t heads, void* out, void* staging,
                                      size_t staging_bytes, uint32_t* bad_index_count,
                                      uintptr_t stream);

/* The same dequantisation, reading rows in place from a table mapped for the GPU (a resident
 * table's read-only mapping, registered with engram_gpu_register) by their absolute row ids:
 * slot s = token * heads + head receives row row_ids[s], found at
 * table + (row_ids[s] - row_begin) * 264. A row id outside [row_begin, row_begin + num_rows)
 * (e.g. UINT64_MAX, what engram_gpu_hash writes for a bad token id) is written as NaN and, if
 * bad_index_count is not NULL, counted. No request reaches the daemon: the GPU reads the rows
 * over the bus, which suits decode-sized batches (random 264-byte reads over PCIe are bound by
 * the number of requests; docs/gpu.md). Returns 0, -EINVAL, -ENODEV/-EIO. Capturable. */
ENGRAM_API int engram_dequant_gather(const void* table, uint64_t row_begin, uint64_t num_rows,
                                     const uint64_t* row_ids, uint32_t tokens, uint32_t heads,
                                     void* out, uint32_t* bad_index_count, uintptr_t stream);

/* Where engram_dequant_cache_gather lists the slots it did not fill, all device pointers.
 * Each array holds tokens * heads entries. */
struct engram_gpu_cache_misses {
  size_t size;     /* sizeof(struct engram_gpu_cache_misses) */
  uint64_t* rows;  /* miss i's row id (for engram_gpu_queue_cache_gather: inside the session's
                      data region, which the daemon reads it from) */
  uint32_t* slots; /* miss i's output slot, token * heads + head */
  uint32_t* count; /* device memory: the misses (the call zeroes it first) */
  /* Optional (NULL): hits whose slot's use count had not saturated, for
   * engram_table_map_report_hits, with their number in *hit_count (zeroed first); and
   * *hit_total, a running count of hits the call only adds to. */
  struct engram_gpu_cache_hit* hits;
  uint32_t* hit_count;
  uint64_t* hit_total;
};
ENGRAM_ASSERT_SIZE(struct engram_gpu_cache_misses, 56);

/* engram_dequant_gather's dequantisation, reading rows from the daemon's row cache in place
 * (cache from engram_table_map_gpu_cache): slot s looks row_ids[s] up in the cache's index (the
 * CPU's hash and linear probing) and, if a slot holds it, reads the slot's key, row and row
 * check with relaxed system-scope loads and dequantises the row into out when the check matches
 * the key and the row read (docs/gpu.md, "Row cache hits on the GPU"). A row not found, or whose
 * slot was being or got rewritten during the read, is a miss: the slot of out is left as it was
 * and (row id, slot) appended to the misses list, never the bytes read. A row
 * id outside the table's [covered_begin, covered_end) is written as NaN and counted in
 * *bad_index_count (if not NULL), as engram_dequant_gather does. Capturable (the counters are
 * zeroed by a memset node). Returns 0, -EINVAL, -ENODEV/-EIO. */
ENGRAM_API int engram_dequant_cache_gather(const struct engram_gpu_row_cache* cache,
                                           const uint64_t* row_ids, uint32_t tokens, uint32_t heads,
                                           void* out, const struct engram_gpu_cache_misses* misses,
                                           uint32_t* bad_index_count, uintptr_t stream);

/* Makes the stream wait, on the GPU, until the 64-bit word at addr (device pointer, e.g. the
 * registered completion counter) reaches value: (int64_t)(*addr - value) >= 0. Nothing on the
 * host waits. Uses cuStreamWaitValue64 (hipStreamWaitValue64); where the device lacks 64-bit
 * stream memory operations, it waits on the low 32 bits with the same cyclic comparison,
 * which is exact while the counter moves less than 2^31 ahead of value.
 * If the stream is being captured into a graph and ret_node is not NULL, *ret_node receives the
 * captured wait node (cudaGraphNode_t), whose value engram_graph_set_wait_value64 changes per
 * replay; otherwise *ret_node is set to 0. Returns 0, -EINVAL, -ENOTSUP (the driver has no
 * stream memory operations) or -EIO. */
ENGRAM_API int engram_stream_wait_value64(uintptr_t stream, const void* addr, uint64_t value,
                                          uintptr_t* ret_node);

/* Changes the value that a captured wait node (from engram_stream_wait_value64) waits for in
 * the instantiated graph graph_exec, for launches queued after this call (launches already
 * queued keep their value). Host-side only: no synchronisation. CUDA only; -ENOTSUP on HIP. */
ENGRAM_API int engram_graph_set_wait_value64(uintptr_t graph_exec, uintptr_t node, uint64_t value);

/* The graph-friendly wait that needs no per-replay host call into the GPU runtime: a one-thread
 * kernel reads step = *step_counter (device memory), waits until the 64-bit counter at
 * `counter` reaches tickets[step % ring], then stores step + 1. The caller writes the ticket of
 * step k into tickets[k % ring] (registered host memory) before launching step k, and never
 * runs more than `ring` steps ahead of the GPU. The waiting kernel holds one thread block of
 * one multiprocessor while it polls. Returns 0, -EINVAL or -EIO. */
ENGRAM_API int engram_stream_wait_ticket(uintptr_t stream, const void* counter,
                                         const uint64_t* tickets, uint32_t ring,
                                         uint32_t* step_counter);

/* Deprecated: engram_last_error() under its older name (the kernel library's failures are
 * recorded there, with every other). */
ENGRAM_API ENGRAM_DEPRECATED("use engram_last_error") const char* engram_kernels_last_error(void);

/* "cuda" or "hip": which runtime this kernel library was built for. */
ENGRAM_API const char* engram_kernels_backend(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ENGRAM_GPU_H_ */
