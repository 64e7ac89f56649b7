/* libengram_client: gather DeepSeek-V4.1 Engram rows from a running engramd.
 *
 * A session owns a shared-memory arena whose data region receives the rows. Row ids and
 * destinations live in that region too, so a request crosses no socket and no copy:
 *
 *   engram_session* s;
 *   if (engram_session_open(NULL, &s) < 0) { fprintf(stderr, "%s\n", engram_last_error()); ... }
 *   uint64_t* rows; uint8_t* out;
 *   engram_alloc(s, n * sizeof(uint64_t), (void**)&rows);
 *   engram_alloc(s, n * ENGRAM_ROW_BYTES, (void**)&out);
 *   ... fill rows[0..n) ...
 *   struct engram_gather_request req = {.size = sizeof(req), .layer = 14,
 *                                       .rows = rows, .num_rows = n, .dest = out};
 *   uint64_t ticket;
 *   engram_submit(s, &req, &ticket);
 *   ... other work ...
 *   int rc = engram_wait(s, ticket, -1);   // out[i * 264 ...] holds row rows[i]
 *   engram_session_close(s);
 *
 * Conventions of the engramd C ABI (every header of include/engram/; libengram_client and
 * libengram_kernels_* alike):
 *  1. Handles are opaque; every function that can fail returns 0 or a negative errno.
 *  2. A struct that crosses the ABI starts with `size_t size`, set by the caller to
 *     sizeof(struct ...) as its header declares it, so that structs grow at their end without
 *     new function names. *_init(ptr, sizeof *ptr) functions fill one with the defaults and set
 *     its size. Every header pins each struct's size with ENGRAM_STATIC_ASSERT.
 *  3. A size field must lie in [sizeof(size_t), ENGRAM_MAX_STRUCT_BYTES] (4096): anything else
 *     is refused with -EINVAL before a byte past the field is read or written (a *_init
 *     function then writes nothing).
 *  4. Input structs (options, requests, arguments): a caller compiled against an older, smaller
 *     struct is served as if the fields it lacks held their defaults (0 unless the field says
 *     otherwise). A larger struct (a newer header) is accepted when every byte past the end of
 *     the struct this library knows is zero, and refused with -E2BIG otherwise, the message
 *     naming the struct and the first byte set: a field the library does not know would be
 *     ignored silently.
 *  5. Output structs (engram_table_info, engram_session_stats, engram_hasher_info, ...): the
 *     library fills the fields that fit in the caller's size and zeroes the bytes past the end
 *     of its own struct, so fields unknown to this library read 0; the caller's size field is
 *     left as it was. In an array of structs (input or output) the first element's size is the
 *     stride and every element must carry it.
 *  6. Out-parameters are named ret_*, come last, and are untouched on failure.
 *  7. After a failure, engram_last_error() gives a message naming what was wrong (the socket,
 *     the table, the row, the limit, the struct). One message per thread for both libraries:
 *     sessions, hashing, GPU registration and the kernels. engram_hash_last_error,
 *     engram_gpu_last_error and engram_kernels_last_error are deprecated names for it. The
 *     libraries never print or log.
 *  8. Lifecycle names: a handle type is engram_<noun>, and the calls that begin and end it are
 *     engram_<noun>_open / engram_<noun>_close when it stands for something that exists without
 *     it (a session with the daemon, a model's hash tables, a daemon's resident table mapped
 *     here), and engram_<noun>_create / engram_<noun>_destroy when the call builds the object
 *     (device memory: the GPU hasher, the GPU queue). Ranges of memory keep the verbs of what is
 *     done to them: engram_alloc / engram_free, engram_gpu_register / engram_gpu_unregister.
 *     The older spellings (engram_connect, engram_close, engram_map_table, engram_unmap_table)
 *     stay exported as aliases, marked ENGRAM_DEPRECATED (engram/abi.h): a new use warns.
 *  9. A table is identified by its Engram layer id (1 and 14 for DeepSeek-V4.1), called `layer`
 *     in every parameter and field. Fields once named `table` or `layer_id` keep that name as an
 *     alias in an anonymous union, marked ENGRAM_DEPRECATED: the layout is unchanged.
 * 10. Each function states its thread-safety.
 * 11. Exported symbols carry a version node per release (client/libengram_client.map,
 *     kernels/libengram_kernels.map); a changed signature keeps its old version for binaries
 *     linked before the change.
 *
 * Errors map to the daemon's status codes as follows:
 *   -EINVAL        InvalidArgument: a bad argument or request
 *   -ENOENT        NotFound: no such table
 *   -ERANGE        OutOfRange: a row past the table or outside the rows this copy holds
 *   -ENOSPC        ResourceExhausted: a limit was hit (clients, requests in flight, rows per
 *                  request, arena bytes, data region full)
 *   -EACCES        PermissionDenied: this uid/gid may not connect
 *   -EPROTO        FailedPrecondition: protocol version mismatch, or a corrupt arena
 *   -E2BIG         a struct from a newer header sets fields this library does not know
 *   -ECONNREFUSED  Unavailable: no daemon listens on the socket
 *   -ENOTCONN      Unavailable: the session was lost (daemon stopped or died); connect again
 *   -ETIMEDOUT     the wait timed out; the ticket is still in flight
 *   -EAGAIN        (engram_poll) not complete yet
 *   -EIO           Internal / DataLoss: the daemon failed to read the rows
 */
#ifndef ENGRAM_ENGRAM_H_
#define ENGRAM_ENGRAM_H_

/* errno.h: the functions return the negative errno values listed above, which a caller
 * compares with the E* names (rc == -ENOTCONN) without an include of its own. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

/* ENGRAM_API, ENGRAM_ASSERT_SIZE, ENGRAM_MAX_STRUCT_BYTES. */
#include "engram/abi.h"
/* engram_hasher and struct engram_hash_seq, for engram_submit_tokens(). */
#include "engram/hash.h"
/* ENGRAM_ROW_BYTES (264) and enum engram_table_layout. */
#include "engram/row.h"
/* ENGRAM_SESSION_COUNTERS, the fields of struct engram_session_stats. */
#include "engram/session_stats.h"
/* ENGRAM_VERSION (the headers' release) and engram_version() (the library's). */
#include "engram/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ENGRAM_DEFAULT_SOCKET "/run/engramd/engramd.sock"

typedef struct engram_session engram_session;

/* ---- connecting ------------------------------------------------------------------------ */

struct engram_connect_options {
  size_t size;             /* sizeof(struct engram_connect_options) */
  const char* socket_path; /* NULL: $ENGRAM_SOCKET, else ENGRAM_DEFAULT_SOCKET */
  uint64_t data_bytes;     /* data region size; 0: the daemon's default (limits.default_data_bytes,
                              64 MiB unless configured) */
  uint32_t slots;          /* requests in flight at once; 0: the daemon's default
                              (limits.default_slots, 64 unless configured) */
  uint32_t spin_ns;        /* how long engram_wait spins before sleeping; 0: adaptive, at
                              least 50 µs and up to the service time the session's recent
                              requests predict for this one (at most 2 ms); a wait predicted
                              longer than 400 µs sleeps until 150 µs before its predicted
                              end and spins from there */
  const char* client_name; /* shown in statistics; NULL: the program name */
  int64_t timeout_ns;      /* connect + handshake timeout; 0: 5 s */
  uint32_t flags;          /* ENGRAM_CONNECT_* */
  uint32_t reserved;       /* 0 */
};
ENGRAM_ASSERT_SIZE(struct engram_connect_options, 56);

/* engram_connect_options.flags */
/* The session's requests come from a GPU kernel (engram/gpu_submit.h), not from this process:
 * the daemon keeps polling its ring (it cannot be woken by a device), and engram_submit* on it
 * fail with -EBUSY. -EOPNOTSUPP at connect if the daemon does not offer it. Such a session's
 * engram_gather goes through the daemon (and fails with -EBUSY) unless a request asks for
 * ENGRAM_GATHER_IN_PLACE. */
#define ENGRAM_CONNECT_DEVICE_SUBMIT (1u << 0)
/* The session's engram_gather and engram_gather_tokens go through the daemon unless a request
 * asks for ENGRAM_GATHER_IN_PLACE: the in-place path is not the session's default. The
 * environment variable ENGRAM_IN_PLACE=0 does the same for every session of the process
 * (ENGRAM_IN_PLACE=1 or unset: the in-place default; any other value fails engram_session_open
 * with -EINVAL). Since ENGRAM_0.6; an older library refuses the flag (-EINVAL, "unknown
 * flags"). */
#define ENGRAM_CONNECT_GATHER_VIA_DAEMON (1u << 1)

/* Fills the caller's struct of `size` bytes (sizeof *ret_options) with the defaults and sets
 * its size field; writes nothing (and sets engram_last_error()) for a NULL struct or a size
 * outside [sizeof(size_t), ENGRAM_MAX_STRUCT_BYTES]. Thread-safe. */
ENGRAM_API void engram_connect_options_init(struct engram_connect_options* ret_options,
                                            size_t size);

/* Connects to engramd and maps the session's arena. `options` may be NULL for the defaults.
 * After a -ENOTCONN from any call (daemon restarted), call this again for a new session.
 * Thread-safe. (Since ENGRAM_0.6; engram_connect is its deprecated older name.) */
ENGRAM_API int engram_session_open(const struct engram_connect_options* options,
                                   engram_session** ret_session);

/* Closes the session: unmaps the arena (every pointer into it becomes invalid) and abandons
 * tickets in flight (the daemon finishes them into its own mapping). NULL is a no-op.
 * Not thread-safe with other calls on the same session. (Since ENGRAM_0.6; engram_close is its
 * deprecated older name.) */
ENGRAM_API void engram_session_close(engram_session* session);

/* Deprecated: the names of engram_session_open and engram_session_close before ENGRAM_0.6. */
ENGRAM_API ENGRAM_DEPRECATED("use engram_session_open") int engram_connect(
    const struct engram_connect_options* options, engram_session** ret_session);
ENGRAM_API ENGRAM_DEPRECATED("use engram_session_close") void engram_close(engram_session* session);

/* The message of the calling thread's last failed call into libengram_client or
 * libengram_kernels_* (the one last-error call of both); "" if none. Valid until that thread's
 * next call into either library. Thread-safe (per-thread). */
ENGRAM_API const char* engram_last_error(void);

/* For libengram_kernels_* of the same build only, not for applications: records `message` as
 * the calling thread's last error, where engram_last_error() finds it. Exported in the
 * ENGRAM_PRIVATE version node, which may change in any release. */
ENGRAM_API void engram_internal_set_last_error(const char* message);

/* Where a device producer finds a session's rings: host addresses inside the arena (register
 * the arena, engram_arena(), and translate them with engram_gpu_device_ptr). */
struct engram_device_ring {
  size_t size;                          /* sizeof(struct engram_device_ring), set by caller */
  struct engram_arena_header* header;   /* sq_tail, daemon_state, completions */
  struct engram_sqe* sq;                /* slots entries */
  struct engram_request_status* status; /* slots entries */
  uint8_t* data;                        /* the data region; SQE offsets are relative to it */
  uint64_t data_bytes;
  uint32_t slots;
  uint32_t reserved;
};
ENGRAM_ASSERT_SIZE(struct engram_device_ring, 56);

/* Fills *ret_ring (an output struct: set ret_ring->size first) for a session connected with
 * ENGRAM_CONNECT_DEVICE_SUBMIT. Returns 0, -EINVAL (NULL, a size out of bounds) or -EPERM (the
 * session submits from the host). Thread-safe. */
ENGRAM_API int engram_device_ring(engram_session* session, struct engram_device_ring* ret_ring);
/* Bytes per gathered row, ENGRAM_ROW_BYTES (engram/row.h): for callers that cannot include a
 * header (Python). Thread-safe. */
ENGRAM_API uint32_t engram_row_bytes(void);

/* ---- the data region ------------------------------------------------------------------- */

/* The data region: rows, row ids and destination offsets must lie inside it. Its start is
 * 4096-byte aligned (register it with the GPU runtime as a whole). Thread-safe. */
ENGRAM_API int engram_data_region(engram_session* session, void** ret_base, uint64_t* ret_bytes);

/* Allocates `bytes` (rounded up to 4096, aligned to 4096) from the data region. -ENOSPC when
 * no free range is large enough. Thread-safe. */
ENGRAM_API int engram_alloc(engram_session* session, uint64_t bytes, void** ret_ptr);

/* Returns an allocation to the data region. -EINVAL if `ptr` is not one. Thread-safe. */
ENGRAM_API int engram_free(engram_session* session, void* ptr);

/* ---- gathering ------------------------------------------------------------------------- */

struct engram_gather_request {
  size_t size; /* sizeof(struct engram_gather_request) */
  union {
    uint32_t layer; /* the table's Engram layer id (1, 14 for DeepSeek-V4.1) */
    uint32_t table ENGRAM_DEPRECATED("use layer"); /* older name of `layer` */
  };
  uint32_t flags;       /* 0, ENGRAM_GATHER_IN_PLACE or ENGRAM_GATHER_VIA_DAEMON */
  const uint64_t* rows; /* num_rows row ids, in the data region, 8-byte aligned */
  uint64_t num_rows;
  void* dest;                   /* in the data region: row i lands at dest + i * 264, or ... */
  const uint64_t* dest_offsets; /* ... at dest + dest_offsets[i] when not NULL (in the data
                                   region, 8-byte aligned) */
};
ENGRAM_ASSERT_SIZE(struct engram_gather_request, 48);

/* engram_gather_request.flags. engram_gather reads rows in place wherever this process can map
 * the table (since ENGRAM_0.6; before it only with ENGRAM_GATHER_IN_PLACE):
 *
 * A table resident in the daemon's row store (docs/row-store.md): engram_gather copies the rows
 * on the calling thread from a read-only mapping of the table (engram_table_map_open) instead of
 * asking the daemon: no round trip, no thread of the daemon woken. The first call for a table
 * maps it (a control round trip and the page tables of the whole table: a few ms per GiB with
 * 4 KiB pages), and the mapping stays until engram_session_close.
 * A table of the cache tier (protocol 1.4 on both sides): the first call maps the daemon's row
 * cache read-only (no page tables filled); each call copies the rows the cache holds on the
 * calling thread, each checked against its slot's version (a row evicted or rewritten during the
 * copy is not taken), and sends the others to the daemon as one request into the same
 * destinations, waited for up to `timeout_ns`. A call whose rows are all cached makes no request.
 * The rows copied here are counted in rows_in_place and, through the session's touch page, in the
 * daemon's table and cache statistics as if it had served them (docs/row-store.md, "Reading the
 * row cache in place").
 * The daemon gathers the request as before for a table of the storage tier, when the daemon
 * cannot hand out mappings (protocol < 1.3) or refuses the mapping, and for a table still
 * loading (its mapping is asked for again at most every 100 ms). The request is checked as the
 * daemon checks it, with the same errors and messages. Rows read in place are counted in
 * engram_session_stats.rows_in_place, not in the daemon's per-session requests and rows.
 *
 * ENGRAM_GATHER_VIA_DAEMON sends the request to the daemon whatever the table (for measuring the
 * daemon, or to have its per-session counters see the request); ENGRAM_GATHER_IN_PLACE takes the
 * in-place path even on a session connected with ENGRAM_CONNECT_GATHER_VIA_DAEMON (or under
 * ENGRAM_IN_PLACE=0). Without either, the session's default decides: in place unless the session
 * was opened with ENGRAM_CONNECT_GATHER_VIA_DAEMON, under ENGRAM_IN_PLACE=0, or with
 * ENGRAM_CONNECT_DEVICE_SUBMIT. Both flags at once: -EINVAL. engram_submit accepts both and
 * leaves the request to the daemon (its completion belongs to the daemon). An older library
 * refuses a flag it does not know (-EINVAL, "unknown request flags"): ENGRAM_GATHER_VIA_DAEMON
 * before ENGRAM_0.6, ENGRAM_GATHER_IN_PLACE before ENGRAM_0.4 (from ENGRAM_0.6 on it only
 * matters on a session whose default is the daemon). */
#define ENGRAM_GATHER_IN_PLACE 0x1u
#define ENGRAM_GATHER_VIA_DAEMON 0x2u

/* Submits a gather; on success *ret_ticket identifies it. The row ids and offsets are read by
 * the daemon after this returns: leave them alone until the ticket completes. -ENOSPC when every
 * slot is in flight. Thread-safe. */
ENGRAM_API int engram_submit(engram_session* session, const struct engram_gather_request* request,
                             uint64_t* ret_ticket);

/* Submits an empty request that completes at once (round-trip measurement). Thread-safe. */
ENGRAM_API int engram_submit_nop(engram_session* session, uint64_t* ret_ticket);

/* Waits until the ticket completes or `timeout_ns` passes (negative: no limit; 0: do not wait).
 * Returns 0 when the rows are in place, the request's error (see the table above; the daemon's
 * message via engram_last_error()), or -ETIMEDOUT with the ticket still in flight. Any result
 * but -ETIMEDOUT consumes the ticket. Thread-safe; one thread per ticket. */
ENGRAM_API int engram_wait(engram_session* session, uint64_t ticket, int64_t timeout_ns);

/* engram_wait with no waiting: -EAGAIN while in flight. Never makes a syscall unless the
 * session is found lost. Thread-safe; one thread per ticket. */
ENGRAM_API int engram_poll(engram_session* session, uint64_t ticket);

/* engram_submit + engram_wait. On -ETIMEDOUT the request is abandoned (its slot stays busy
 * until it completes). Thread-safe. */
ENGRAM_API int engram_gather(engram_session* session, const struct engram_gather_request* request,
                             int64_t timeout_ns);

/* The session's completion counter: a 64-bit word in the arena, 8-byte aligned, that the
 * daemon increments once per completed request and that never decreases. Meant for device-side
 * waits (cuStreamWaitValue64 after registering the arena). A CPU thread that polls it must use
 * an acquire load (__atomic_load_n(counter, __ATOMIC_ACQUIRE)) before reading the rows: on Arm
 * a plain volatile read does not order them. Thread-safe. */
ENGRAM_API int engram_completion_counter(engram_session* session,
                                         const volatile uint64_t** ret_counter);

/* The arena mapping as a whole (header, rings, data region): for registering the counter and
 * the data region with a GPU runtime in one call. Thread-safe. */
ENGRAM_API int engram_arena(engram_session* session, void** ret_base, uint64_t* ret_bytes);

/* ---- tables and statistics ------------------------------------------------------------- */

/* Older names of enum engram_table_layout's values (engram/row.h). */
#define ENGRAM_TABLE_CHECKPOINT ENGRAM_LAYOUT_CHECKPOINT
#define ENGRAM_TABLE_PACKED ENGRAM_LAYOUT_PACKED

struct engram_table_info {
  size_t size; /* set by the caller to sizeof(struct engram_table_info) */
  union {
    uint32_t layer;                                   /* Engram layer id */
    uint32_t layer_id ENGRAM_DEPRECATED("use layer"); /* older name of `layer` */
  };
  uint32_t row_bytes;     /* 264 */
  uint64_t num_rows;      /* of the whole logical table */
  uint64_t covered_begin; /* rows this daemon serves: [covered_begin, covered_end) */
  uint64_t covered_end;
  uint32_t layout; /* enum engram_table_layout */
  uint32_t files;
  uint64_t data_bytes;
  /* Added after data_bytes (a caller's older, shorter struct is filled up to data_bytes):
   * where the daemon serves the table's rows from, enum engram_table_tier (engram/row.h), as
   * engramctl names it; ENGRAM_TABLE_TIER_UNKNOWN from a daemon that does not say. */
  uint32_t tier;
  uint32_t reserved;
};
ENGRAM_ASSERT_SIZE(struct engram_table_info, 64);

/* Lists the tables the daemon serves, ordered by layer id. Writes up to `capacity` entries and
 * sets *ret_count to the number of tables (which may exceed capacity). With capacity > 0, set
 * ret_tables[0].size (the array's stride) and the size of every entry to sizeof(struct
 * engram_table_info). Thread-safe (control messages on one session are serialised). */
ENGRAM_API int engram_list_tables(engram_session* session, struct engram_table_info* ret_tables,
                                  size_t capacity, size_t* ret_count);

/* The session's statistics: session_id, then one uint64_t per entry of ENGRAM_SESSION_COUNTERS
 * (engram/session_stats.h: the fields, in order, and what each counts). */
struct engram_session_stats {
  size_t size; /* set by the caller to sizeof(struct engram_session_stats) */
  uint64_t session_id;
  ENGRAM_SESSION_COUNTERS(ENGRAM_SESSION_STATS_FIELD_)
};
ENGRAM_ASSERT_SIZE(struct engram_session_stats, 120);

/* Reads the session's statistics from the daemon. Set ret_stats->size first. Thread-safe. */
ENGRAM_API int engram_get_session_stats(engram_session* session,
                                        struct engram_session_stats* ret_stats);

/* The name and one-line description of field `index` of struct engram_session_stats after
 * `size` (0: session_id, then the counters in order), for bindings that cannot read
 * engram/session_stats.h; the strings are static. -ERANGE past the last field. Thread-safe.
 * Since ENGRAM_0.6. */
ENGRAM_API int engram_session_stats_field(size_t index, const char** ret_name,
                                          const char** ret_help);

/* ---- resident tables read in place (since ENGRAM_0.4) ------------------------------------ */

/* A resident table (docs/row-store.md) mapped read-only into this process: rows are read with a
 * memcpy, with no request to the daemon. The memory is the daemon's sealed memfd: nobody can
 * change, shrink or grow it, and the mapping stays valid until engram_table_map_close, even if the
 * daemon or the session goes away. But its rows are only good while the daemon stands behind
 * them: once the daemon withdraws the table (a file it was loaded from changed, or the daemon
 * is stopping) or the daemon is gone (stopped, killed, restarted), engram_table_map_gather
 * fails and engram_table_map_check says so. engram_gpu_register registers it for a GPU to read
 * in place (engram_dequant_gather, engram/gpu.h); a GPU cannot ask, so the host calls
 * engram_table_map_check before a launch and after the kernel finished (docs/gpu.md). */
typedef struct engram_table_map engram_table_map;

struct engram_table_map_info {
  size_t size; /* set by the caller to sizeof(struct engram_table_map_info) */
  union {
    uint32_t layer;                                   /* Engram layer id */
    uint32_t layer_id ENGRAM_DEPRECATED("use layer"); /* older name of `layer` */
  };
  uint32_t row_bytes;     /* 264 */
  uint64_t covered_begin; /* row r (covered_begin <= r < covered_end) is at */
  uint64_t covered_end;   /* base + (r - covered_begin) * row_bytes */
  const void* base;
  uint64_t map_bytes;
  /* Since ENGRAM_0.7 (a caller's older, shorter struct is filled up to map_bytes):
   * ENGRAM_TABLE_MAP_RESIDENT, or ENGRAM_TABLE_MAP_ROW_CACHE, where base and map_bytes are the
   * daemon's row cache (shared by every cache-tier table; its layout is docs/row-store.md's),
   * rows are found through its index, not at base + (r - covered_begin) * row_bytes, and
   * [covered_begin, covered_end) are the row ids the table has. */
  uint32_t kind;
  uint32_t reserved;
};
ENGRAM_ASSERT_SIZE(struct engram_table_map_info, 56);
#define ENGRAM_TABLE_MAP_RESIDENT 0u
#define ENGRAM_TABLE_MAP_ROW_CACHE 1u

/* Maps the table of `layer` read-only. -EOPNOTSUPP when the table is not of the resident tier,
 * -EAGAIN while it is still loading, -ENOENT when no table of that layer is served;
 * engram_last_error() says which. Thread-safe (control messages on one session
 * are serialised). (Since ENGRAM_0.6; engram_map_table is its deprecated older name.) */
ENGRAM_API int engram_table_map_open(engram_session* session, uint32_t layer,
                                     engram_table_map** ret_map);
/* engram_table_map_open, and for a table of the cache tier the daemon's row cache (info.kind
 * ENGRAM_TABLE_MAP_ROW_CACHE), whose hits a GPU reads in place (engram_table_map_gpu_cache and
 * engram_dequant_cache_gather, engram/gpu.h; docs/gpu.md). A call of its own so that a caller
 * of engram_table_map_open, which may not know info.kind, never takes a row cache for a table.
 * -EOPNOTSUPP when the table is of neither tier (read from storage on every gather), otherwise
 * as engram_table_map_open. Since ENGRAM_0.7. */
ENGRAM_API int engram_table_map_open_any(engram_session* session, uint32_t layer,
                                         engram_table_map** ret_map);
/* Describes a map (an output struct: set ret_info->size first). Thread-safe. */
ENGRAM_API int engram_get_table_map_info(const engram_table_map* map,
                                         struct engram_table_map_info* ret_info);
/* CPU gather: copies rows[i] to dest + i * 264 for i < num_rows. -ERANGE naming the first row
 * outside the table, before anything is copied. A row cache's map (ENGRAM_TABLE_MAP_ROW_CACHE)
 * is refused with -EOPNOTSUPP, dest untouched: it may miss any row, which this call could not
 * report; engram_gather with ENGRAM_GATHER_IN_PLACE copies its hits and fetches the rest. -ESTALE
 * (withdrawn) or -ENOTCONN (daemon gone) as engram_table_map_check, checked before and after the
 * copy: after a failure, dest holds nothing to use. Thread-safe (reads only). */
ENGRAM_API int engram_table_map_gather(const engram_table_map* map, const uint64_t* rows,
                                       uint64_t num_rows, void* dest);
/* Whether the map's rows may be read now (since ENGRAM_0.6): 0; -ESTALE when the daemon
 * withdrew the table (a file it was loaded from changed, or the daemon is stopping: a gather
 * through the daemon names the file); -ENOTCONN when the daemon is gone (stopped or died, a
 * restart included). Both are for good: map the table again from a new session. Two loads from
 * shared memory, no syscall. Thread-safe. */
ENGRAM_API int engram_table_map_check(const engram_table_map* map);
/* Unmaps (null: no-op). No other call may use the map at the same time or after. (Since
 * ENGRAM_0.6; engram_unmap_table is its deprecated older name.) */
ENGRAM_API void engram_table_map_close(engram_table_map* map);

/* Deprecated: the names of engram_table_map_open and engram_table_map_close before ENGRAM_0.6. */
ENGRAM_API ENGRAM_DEPRECATED("use engram_table_map_open") int engram_map_table(
    engram_session* session, uint32_t layer, engram_table_map** ret_map);
ENGRAM_API ENGRAM_DEPRECATED("use engram_table_map_close") void engram_unmap_table(
    engram_table_map* map);

/* ---- prefetch (since ENGRAM_0.5, protocol 1.2) ------------------------------------------ */

/* Tells the daemon that rows of `layer`'s table will probably be gathered soon (the rows of
 * speculative decoding's draft tokens, of the next prefill chunk), so that it brings them into its
 * row cache or the page cache in the background, after the gathers in flight. Returns as soon as
 * the daemon has checked the row ids and queued them: it never waits for I/O (one round trip
 * through the arena; ENGRAM_PREFETCH_MAX_ROWS (engram/protocol.h, 8,192) rows an entry, more take
 * one entry each). `rows` may lie anywhere; ids outside the data region are copied into it (a
 * buffer of up to 64 KiB, freed before return). *ret_queued (may be NULL) is set to the rows queued
 * (all of them unless they exceed the daemon's whole prefetch queue; a full queue drops its oldest
 * rows for new ones, which its statistics count). A later gather of a prefetched row is an ordinary
 * gather (a row cache hit if it arrived). `flags`: 0. Errors: -EOPNOTSUPP when the daemon predates
 * prefetch (protocol < 1.2); -ENOENT no table of that layer; -ERANGE a row outside the table
 * (engram_last_error() names the table, the row and its index; nothing of that entry is queued);
 * -ENOSPC every slot is busy, the data region has no room for the ids, or the session already has
 * the daemon's limits.prefetch_session_rows rows waiting to be prefetched (the message says which);
 * -EBUSY on a device-submit session; -ENOTCONN. Thread-safe. */
ENGRAM_API int engram_prefetch(engram_session* session, uint32_t layer, const uint64_t* rows,
                               uint64_t num_rows, uint32_t flags, uint64_t* ret_queued);

/* ---- admission prefetch (since ENGRAM_0.8, protocol 1.6) --------------------------------- */

/* Tells the daemon that request `request_id` (any id this session chooses, unique among its
 * requests) will gather `rows` of `layer`'s table in its prefill: call it when the engine admits
 * the request, once per table (more calls add rows to the same request). The daemon reads the
 * rows its row cache lacks after every gather and hint (the lowest priority; docs/row-store.md,
 * "Admission") and pins each row there, read now or held before, so that no eviction takes it
 * until engram_admit_done(request_id), `ttl_ns` (0, or more than the daemon's
 * memory.admit_ttl_ms: that) or the session's end. Returns as soon as the ids are checked and the
 * pins reserved, never after I/O, with *ret_queued (may be NULL) the rows queued. Rows of a table
 * not in the row cache's tier are prefetched as engram_prefetch does and not pinned. Errors as
 * engram_prefetch's, and: -ENOSPC when the pins would pass the session's
 * memory.admit_session_rows or the daemon's memory.admit_rows (engram_last_error() says which;
 * nothing of that entry of ENGRAM_PREFETCH_MAX_ROWS rows is queued, earlier entries stay);
 * -EOPNOTSUPP when the daemon predates admissions (protocol < 1.6). Thread-safe. */
ENGRAM_API int engram_admit(engram_session* session, uint64_t request_id, uint32_t layer,
                            const uint64_t* rows, uint64_t num_rows, uint64_t ttl_ns,
                            uint64_t* ret_queued);
/* Request `request_id` is done with its admitted rows (its prefill gathered them, or it was
 * cancelled): the daemon unpins them, and its rows still queued are not read. *ret_found (may be
 * NULL) is 1 when the request had an admission, 0 when it had none (never made, released already
 * or expired). Errors: -EOPNOTSUPP (protocol < 1.6), -ENOSPC every slot is busy, -ENOTCONN.
 * Thread-safe. */
ENGRAM_API int engram_admit_done(engram_session* session, uint64_t request_id, int* ret_found);

/* Protocol version this library speaks. Thread-safe. */
ENGRAM_API void engram_protocol_version(uint32_t* ret_major, uint32_t* ret_minor);

/* ---- hashing and gathering in one call (since ENGRAM_0.3) -------------------------------- */

/* A gather whose row ids are hashed from token ids (engram/hash.h) straight into the data
 * region and then submitted as they lie there: the ids are never copied. For every token of
 * seqs, in order, and every selected head h, row id rows[t * heads + (h - first head)] is
 * gathered to dest + (t * heads + (h - first head)) * 264, so dest holds the rows as
 * [positions][heads][264].
 *
 * Heads: tp_size != 0 selects the heads of tensor-parallel rank tp_rank
 * (engram_hasher_rank_heads; head_begin and head_end must then be 0); otherwise
 * [head_begin, head_end), where 0, 0 means every head of the layer. */
struct engram_token_request {
  size_t size; /* sizeof(struct engram_token_request) */
  union {
    uint32_t layer; /* Engram layer id (1, 14 for DeepSeek-V4.1); the hasher's and the table's */
    uint32_t table ENGRAM_DEPRECATED("use layer"); /* older name of `layer` */
  };
  uint32_t flags; /* ENGRAM_HASH_COMPRESSED_IDS: tokens and history are compressed ids */
  const struct engram_hash_seq* seqs; /* sequences (any memory): new tokens and history */
  size_t n_seqs;
  uint32_t head_begin; /* heads [head_begin, head_end); 0, 0: all */
  uint32_t head_end;
  uint32_t tp_size; /* != 0: the heads of rank tp_rank of tp_size instead */
  uint32_t tp_rank;
  uint64_t* rows;    /* in the data region, 8-byte aligned: receives positions * heads row ids */
  uint64_t rows_cap; /* entries rows can hold */
  void* dest;        /* in the data region: positions * heads * 264 bytes */
};
ENGRAM_ASSERT_SIZE(struct engram_token_request, 72);

/* Hashes the request's tokens into request->rows with `hasher` (engram_hash) and submits the
 * gather of those rows into request->dest; on success *ret_ticket identifies it (wait as for
 * engram_submit) and, if not NULL, *ret_num_rows is positions * heads. Nothing is submitted
 * when hashing fails; the ids are checked before anything is written. Leave rows alone until
 * the ticket completes. Errors: those of engram_hash (-ENOENT: the hasher knows no such layer;
 * -EINVAL: an id outside the vocabulary, a bad head range or struct size; -ENOSPC: rows_cap
 * too small; -EOPNOTSUPP: tokenizer ids without a compressed vocabulary) and those of
 * engram_submit; engram_last_error() names what was wrong either way. Thread-safe (the hasher
 * may be shared by any number of threads and sessions). */
ENGRAM_API int engram_submit_tokens(engram_session* session, const engram_hasher* hasher,
                                    const struct engram_token_request* request,
                                    uint64_t* ret_ticket, uint64_t* ret_num_rows);

/* engram_submit_tokens + engram_wait, except that the rows are gathered as engram_gather
 * gathers a request without flags (since ENGRAM_0.6): in place where the session's default is the
 * in-place path and the table can be mapped, through the daemon otherwise. On -ETIMEDOUT the
 * request is abandoned (its slot stays busy until it completes). Thread-safe. */
ENGRAM_API int engram_gather_tokens(engram_session* session, const engram_hasher* hasher,
                                    const struct engram_token_request* request, int64_t timeout_ns);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ENGRAM_ENGRAM_H_ */
