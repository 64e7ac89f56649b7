/* The engramd wire protocol: socket messages and the shared-memory arena layout, as plain C
 * structs with fixed sizes and offsets. docs/protocol.md describes how they are used.
 *
 * Everything here is little-endian, naturally aligned, and free of pointers and locks: a
 * client and the daemon only ever exchange offsets, and a client that dies at any instant
 * leaves nothing behind that another process would wait on.
 */
#ifndef ENGRAM_PROTOCOL_H_
#define ENGRAM_PROTOCOL_H_

#include <stddef.h>
#include <stdint.h>

#include "engram/abi.h" /* ENGRAM_STATIC_ASSERT */
#include "engram/row.h" /* ENGRAM_ROW_BYTES, enum engram_table_layout, engram_table_tier */
#include "engram/session_stats.h" /* ENGRAM_SESSION_COUNTERS */

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the engramd protocol is little-endian; big-endian hosts are not supported"
#endif

/* ---- versions and features ------------------------------------------------------------- */

/* A different major version cannot talk to this one; a newer minor only adds features. */
#define ENGRAM_PROTOCOL_MAJOR 1
#define ENGRAM_PROTOCOL_MINOR 6

/* Feature bits, offered by the client in HELLO and granted by the daemon in WELCOME. */
#define ENGRAM_FEATURE_GATHER (1ull << 0)        /* GATHER submissions in the arena */
#define ENGRAM_FEATURE_DEST_OFFSETS (1ull << 1)  /* per-row destination offsets */
#define ENGRAM_FEATURE_TABLE_LIST (1ull << 2)    /* LIST_TABLES control message */
#define ENGRAM_FEATURE_SESSION_STATS (1ull << 3) /* SESSION_STATS control message */
#define ENGRAM_FEATURE_COUNTER64 (1ull << 4)     /* 64-bit completion counter in the header */
/* Reserved for later minors: daemon-wide statistics, client listing, combined hash-and-gather
 * submissions. A daemon never grants a bit it does not implement. */
#define ENGRAM_FEATURE_DAEMON_STATS (1ull << 5)
#define ENGRAM_FEATURE_CLIENT_LIST (1ull << 6)
#define ENGRAM_FEATURE_HASH_GATHER (1ull << 7)
/* 1.1: submissions published by a device (a GPU kernel) that cannot ring the doorbell. The
 * daemon keeps polling such a session's ring instead of sleeping (docs/gpu.md, "Requests from
 * the GPU"); the client's library stops submitting from the host on it. */
#define ENGRAM_FEATURE_DEVICE_SUBMIT (1ull << 8)
/* 1.2: PREFETCH submissions: row ids the client will probably gather soon, which the daemon
 * brings into its row cache or the page cache in the background (docs/row-store.md). */
#define ENGRAM_FEATURE_PREFETCH (1ull << 9)
/* 1.3: TABLE_MAPPED carries the daemon's table state page with the table's memfd, so that a
 * client reading a resident table in place sees the table withdrawn and the daemon gone
 * (docs/protocol.md, "Reading in place"). A daemon refuses MAP_TABLE to a session without it. */
#define ENGRAM_FEATURE_TABLE_STATE (1ull << 10)
/* 1.4: MAP_TABLE of a table of the cache tier answers with the row cache: TABLE_MAPPED of kind
 * ENGRAM_TABLE_MAPPED_ROW_CACHE carries a read-only descriptor of the daemon's row cache memfd,
 * so that the client copies the rows it holds itself and asks the daemon only for the others
 * (docs/protocol.md, "Reading the row cache in place"). Without it such a MAP_TABLE is refused,
 * as before. */
#define ENGRAM_FEATURE_ROW_CACHE_MAP (1ull << 11)
/* 1.5: TABLE_MAPPED of a resident table carries the session's touch page too (a third fd), where
 * the client counts the rows it reads from the table in place, so that the daemon's statistics
 * count them (docs/protocol.md, "Reading the row cache in place"). Without it a resident
 * TABLE_MAPPED has two fds, as before. */
#define ENGRAM_FEATURE_RESIDENT_TOUCH (1ull << 12)
/* 1.6: admission prefetch: a PREFETCH entry with ENGRAM_SQE_PIN pins the rows it brings into the
 * row cache for one request (reserved[0], the client's id for it) until an ADMIT_DONE entry of
 * that id, its deadline (reserved[1] ns, 0: the daemon's limit) or the session's end
 * (docs/row-store.md, "Admission"). A daemon refuses both to a session without it. */
#define ENGRAM_FEATURE_ADMIT (1ull << 13)
#define ENGRAM_FEATURES_V1_0                                                         \
  (ENGRAM_FEATURE_GATHER | ENGRAM_FEATURE_DEST_OFFSETS | ENGRAM_FEATURE_TABLE_LIST | \
   ENGRAM_FEATURE_SESSION_STATS | ENGRAM_FEATURE_COUNTER64)
#define ENGRAM_FEATURES_V1_1 (ENGRAM_FEATURES_V1_0 | ENGRAM_FEATURE_DEVICE_SUBMIT)
#define ENGRAM_FEATURES_V1_2 (ENGRAM_FEATURES_V1_1 | ENGRAM_FEATURE_PREFETCH)
#define ENGRAM_FEATURES_V1_3 (ENGRAM_FEATURES_V1_2 | ENGRAM_FEATURE_TABLE_STATE)
#define ENGRAM_FEATURES_V1_4 (ENGRAM_FEATURES_V1_3 | ENGRAM_FEATURE_ROW_CACHE_MAP)
#define ENGRAM_FEATURES_V1_5 (ENGRAM_FEATURES_V1_4 | ENGRAM_FEATURE_RESIDENT_TOUCH)
#define ENGRAM_FEATURES_V1_6 (ENGRAM_FEATURES_V1_5 | ENGRAM_FEATURE_ADMIT)

/* ---- status codes ---------------------------------------------------------------------- */

/* The canonical (absl) status codes, as they travel in messages and completion slots. */
enum engram_status_code {
  ENGRAM_STATUS_OK = 0,
  ENGRAM_STATUS_CANCELLED = 1,
  ENGRAM_STATUS_UNKNOWN = 2,
  ENGRAM_STATUS_INVALID_ARGUMENT = 3,
  ENGRAM_STATUS_DEADLINE_EXCEEDED = 4,
  ENGRAM_STATUS_NOT_FOUND = 5,
  ENGRAM_STATUS_ALREADY_EXISTS = 6,
  ENGRAM_STATUS_PERMISSION_DENIED = 7,
  ENGRAM_STATUS_RESOURCE_EXHAUSTED = 8,
  ENGRAM_STATUS_FAILED_PRECONDITION = 9,
  ENGRAM_STATUS_ABORTED = 10,
  ENGRAM_STATUS_OUT_OF_RANGE = 11,
  ENGRAM_STATUS_UNIMPLEMENTED = 12,
  ENGRAM_STATUS_INTERNAL = 13,
  ENGRAM_STATUS_UNAVAILABLE = 14,
  ENGRAM_STATUS_DATA_LOSS = 15,
};

/* ---- socket messages (SOCK_SEQPACKET: one message per datagram) ------------------------ */

#define ENGRAM_MSG_MAGIC 0x4D524745u /* "EGRM" */
#define ENGRAM_MSG_MAX_BYTES 65536u  /* no message is longer */

enum engram_msg_type {
  ENGRAM_MSG_HELLO = 1,         /* client → daemon, first message */
  ENGRAM_MSG_WELCOME = 2,       /* daemon → client, carries the arena memfd and doorbell */
  ENGRAM_MSG_ERROR = 3,         /* daemon → client: a refusal or a failed control request */
  ENGRAM_MSG_LIST_TABLES = 4,   /* client → daemon, empty body */
  ENGRAM_MSG_TABLES = 5,        /* daemon → client */
  ENGRAM_MSG_SESSION_STATS = 6, /* client → daemon, empty body */
  ENGRAM_MSG_STATS = 7,         /* daemon → client */
  /* Operator requests (engramctl, docs/operations.md): a JSON object in, a JSON object out.
   * The reply body is inline, or, when it does not fit in one message, in a sealed memfd sent
   * with the reply (SCM_RIGHTS) and the inline body is empty. */
  ENGRAM_MSG_CONTROL = 8,       /* client → daemon: JSON text {"command": ...} */
  ENGRAM_MSG_CONTROL_REPLY = 9, /* daemon → client: JSON text, or a memfd holding it */
  /* A resident table mapped read-only by the client (docs/row-store.md). */
  ENGRAM_MSG_MAP_TABLE = 10,    /* client → daemon: struct engram_msg_map_table */
  ENGRAM_MSG_TABLE_MAPPED = 11, /* daemon → client: the table's sealed memfd (SCM_RIGHTS) */
  /* 12..31 reserved. */
};

/* Every message starts with this header. `bytes` counts the header and the body. */
struct engram_msg_header {
  uint32_t magic;      /* ENGRAM_MSG_MAGIC */
  uint16_t type;       /* enum engram_msg_type */
  uint16_t reserved;   /* 0 */
  uint32_t bytes;      /* whole message, header included */
  uint32_t request_id; /* echoed in the reply */
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_msg_header) == 16, "msg header size");

/* HELLO. Its layout is frozen across major versions so that a mismatch can be named. */
#define ENGRAM_CLIENT_NAME_BYTES 32
struct engram_msg_hello {
  struct engram_msg_header header;
  uint16_t version_major;
  uint16_t version_minor;
  uint32_t slots;      /* requests the client wants in flight at once (0: daemon default) */
  uint64_t features;   /* ENGRAM_FEATURE_* the client understands */
  uint64_t data_bytes; /* size of the data region it asks for (0: daemon default) */
  uint32_t pid;        /* informational; the daemon trusts SO_PEERCRED */
  uint32_t reserved;
  char client_name[ENGRAM_CLIENT_NAME_BYTES]; /* NUL-padded, for statistics and logs */
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_msg_hello) == 80, "hello size");

/* WELCOME, sent with two file descriptors (SCM_RIGHTS): the sealed arena memfd, then the
 * session's doorbell eventfd. The arena header repeats the layout; the client checks both. */
struct engram_msg_welcome {
  struct engram_msg_header header;
  uint16_t version_major;
  uint16_t version_minor;
  uint32_t slots;
  uint64_t features; /* granted: the intersection of both sides */
  uint64_t session_id;
  uint64_t arena_bytes;
  uint64_t data_bytes;
  uint64_t max_rows_per_request;
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_msg_welcome) == 64, "welcome size");

/* ERROR: a status code and a human-readable message (not NUL-terminated on the wire). */
#define ENGRAM_ERROR_MESSAGE_MAX 1024u
struct engram_msg_error {
  struct engram_msg_header header;
  int32_t code; /* enum engram_status_code */
  uint32_t message_bytes;
  /* followed by message_bytes bytes of text */
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_msg_error) == 24, "error size");

/* TABLES: a count, then that many entries. */
struct engram_wire_table {
  uint32_t layer_id;
  uint32_t row_bytes;
  uint64_t num_rows;      /* rows of the whole logical table */
  uint64_t covered_begin; /* rows this copy serves: [covered_begin, covered_end) */
  uint64_t covered_end;
  uint32_t layout; /* enum engram_table_layout */
  uint32_t files;
  uint64_t data_bytes;
  /* Where the daemon serves the table's rows from: enum engram_table_tier (row.h). A daemon
   * from before this field sends 0 there (ENGRAM_TABLE_TIER_UNKNOWN), as it did in the reserved
   * words it took. */
  uint32_t tier;
  uint32_t reserved0;
  uint64_t reserved;
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_wire_table) == 64, "wire table size");
struct engram_msg_tables {
  struct engram_msg_header header;
  uint32_t count;
  uint32_t entry_bytes; /* sizeof(struct engram_wire_table) of the sender */
  /* followed by count entries */
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_msg_tables) == 24, "tables size");

/* STATS: the counters of one session: session_id, then those of ENGRAM_SESSION_COUNTERS
 * (engram/session_stats.h) that the daemon keeps, in the list's order, then zeros. A counter
 * appended to the list takes the first reserved word, which an older peer sends as 0 and
 * ignores; a sixteenth word would change the message's size (a protocol version). */
struct engram_wire_session_stats {
  uint64_t session_id;
  ENGRAM_SESSION_COUNTERS(ENGRAM_SESSION_WIRE_FIELD_)
  uint64_t reserved[15 - ENGRAM_SESSION_WIRE_COUNTERS];
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_wire_session_stats) == 128, "stats size");
ENGRAM_STATIC_ASSERT(offsetof(struct engram_wire_session_stats, latency_max_ns) == 88,
                     "the counters on the wire keep their places: append to the list");
struct engram_msg_stats {
  struct engram_msg_header header;
  struct engram_wire_session_stats stats;
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_msg_stats) == 144, "msg stats size");

/* MAP_TABLE: asks for the sealed memfd of a resident table. Refused (ERROR) for a table that
 * is not resident, not loaded yet, whose files changed (DATA_LOSS), or when the session lacks
 * ENGRAM_FEATURE_TABLE_STATE. TABLE_MAPPED comes with two fds: the table's memfd (row r of the
 * table is at (r - covered_begin) * row_bytes of it, for covered_begin <= r < covered_end), then
 * the daemon's table state page (struct engram_table_state_page), whose entry `state_index`
 * says whether the table may still be read.
 * 1.4: for a table of the cache tier, a session granted ENGRAM_FEATURE_ROW_CACHE_MAP gets
 * TABLE_MAPPED of kind ENGRAM_TABLE_MAPPED_ROW_CACHE instead: its first fd is a read-only
 * descriptor of the row cache memfd (map_bytes long, laid out as protocol/row_cache_layout.h and
 * docs/row-store.md describe; shared by every cache-tier table), then the table state page, then
 * this session's touch page (struct engram_cache_touch_page, read-write).
 * 1.5: a session granted ENGRAM_FEATURE_RESIDENT_TOUCH gets a resident table's TABLE_MAPPED with
 * a third fd, the same touch page, whose counters of the table count its rows read in place. */
struct engram_msg_map_table {
  struct engram_msg_header header;
  uint32_t layer_id;
  uint32_t reserved; /* 0 */
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_msg_map_table) == 24, "map table size");
struct engram_msg_table_mapped {
  struct engram_msg_header header;
  uint32_t layer_id;
  uint32_t row_bytes;
  uint64_t covered_begin;
  uint64_t covered_end;
  uint64_t map_bytes;   /* size of the memfd, a multiple of its page size */
  uint32_t state_index; /* the table's entry in the table state page */
  uint32_t kind;        /* enum engram_table_mapped_kind (0 before 1.4) */
};
enum engram_table_mapped_kind {
  ENGRAM_TABLE_MAPPED_RESIDENT = 0,  /* the table's own sealed memfd */
  ENGRAM_TABLE_MAPPED_ROW_CACHE = 1, /* the row cache, read-only (1.4) */
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_msg_table_mapped) == 56, "table mapped size");
ENGRAM_STATIC_ASSERT(offsetof(struct engram_msg_table_mapped, state_index) == 48, "state_index");

/* ---- the table state page (1.3) -------------------------------------------------------- */

/* One sealed memfd per daemon, sent with every TABLE_MAPPED and mapped read-only by clients
 * (F_SEAL_FUTURE_WRITE: only the daemon's own mapping writes it). Before each read of a mapped
 * table a client loads `daemon_alive` and the table's `state` (acquire); it reads rows only while
 * the daemon lives and the table is ENGRAM_TABLE_SERVING, and checks both again after the read.
 * docs/protocol.md, "Reading in place", gives the orderings. */
#define ENGRAM_TABLE_STATE_MAGIC 0x54535247u /* "GRST" */
/* The kernel sets this bit in `daemon_alive` when the daemon's thread holding it ends, however
 * the daemon ends (SIGKILL included): the word is a robust futex of that thread
 * (set_robust_list(2)); its low 30 bits are that thread's id while it lives. */
#define ENGRAM_DAEMON_OWNER_DIED 0x40000000u
#define ENGRAM_DAEMON_TID_MASK 0x3FFFFFFFu

/* An entry's state. A table leaves SERVING for good (until engramd restarts). */
enum engram_table_state {
  ENGRAM_TABLE_SERVING = 1,   /* rows may be read */
  ENGRAM_TABLE_WITHDRAWN = 2, /* a file of the table changed, or the daemon is stopping */
};

struct engram_table_state_entry {
  uint32_t layer_id; /* written before the memfd is sent, immutable afterwards */
  uint32_t state;    /* daemon: enum engram_table_state */
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_table_state_entry) == 8, "table state entry size");

struct engram_table_state_page {
  /* line 0: written by the daemon before the memfd is sent, immutable afterwards */
  uint32_t magic; /* ENGRAM_TABLE_STATE_MAGIC */
  uint16_t version_major;
  uint16_t version_minor;
  uint32_t header_bytes; /* 128: entries start here */
  uint32_t entries;      /* struct engram_table_state_entry[entries] follow the header */
  uint64_t page_bytes;   /* size of the memfd */
  uint8_t pad0[40];
  /* line 1 (offset 64): daemon (and the kernel). Non-zero and without ENGRAM_DAEMON_OWNER_DIED
   * while the daemon lives. */
  uint32_t daemon_alive;
  uint8_t pad1[60];
  /* offset 128: struct engram_table_state_entry[entries] */
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_table_state_page) == 128, "table state page size");
ENGRAM_STATIC_ASSERT(offsetof(struct engram_table_state_page, daemon_alive) == 64, "alive");

/* ---- the cache touch page (1.4) -------------------------------------------------------- */

/* One memfd per session that maps the row cache (or, since 1.5, a resident table), sent as
 * TABLE_MAPPED's third fd and mapped read-write by both sides. Its size is fixed by the daemon,
 * so nothing a client writes grows anything. The client reports there what it read in place:
 * per table counters (so that the daemon's statistics count those rows as if it had served
 * them) and, for the row cache, a ring of the slots it hit whose use count had not saturated (the
 * daemon folds them into the slots' use counts before it evicts). docs/protocol.md, "Reading the
 * row cache in place", gives the orderings; the daemon checks every entry it reads. */
#define ENGRAM_CACHE_TOUCH_MAGIC 0x48435445u /* "ETCH" */
#define ENGRAM_CACHE_TOUCH_ENTRIES 4096u     /* ring entries, a power of two */

struct engram_cache_touch_entry {
  uint64_t key;  /* the row's cache key: (layer + 1) << 40 | row */
  uint32_t slot; /* the slot the client found it in */
  uint32_t reserved;
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_cache_touch_entry) == 16, "touch entry size");

/* Per table (entry i is the table of table state page entry i); the client adds, relaxed. */
struct engram_cache_touch_counters {
  uint64_t requests; /* gathers answered wholly in place (no request to the daemon) */
  uint64_t rows;     /* rows copied in place */
  uint64_t reserved[2];
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_cache_touch_counters) == 32, "touch counters size");

struct engram_cache_touch_page {
  /* line 0: written by the daemon before the memfd is sent, immutable afterwards */
  uint32_t magic;      /* ENGRAM_CACHE_TOUCH_MAGIC */
  uint32_t entries;    /* ring entries (ENGRAM_CACHE_TOUCH_ENTRIES) */
  uint64_t page_bytes; /* size of the memfd */
  uint32_t tables;     /* counters entries */
  uint32_t reserved0;
  uint64_t counters_offset; /* struct engram_cache_touch_counters[tables] */
  uint64_t ring_offset;     /* struct engram_cache_touch_entry[entries] */
  uint8_t pad0[24];
  /* line 1 (offset 64): client. Ring entries written; entry i is at i % entries. Release. */
  uint64_t head;
  uint64_t dropped; /* touches the client left out because the ring was full */
  uint8_t pad1[48];
  /* line 2 (offset 128): daemon. Ring entries folded. Release; the client acquires it. */
  uint64_t tail;
  uint8_t pad2[56];
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_cache_touch_page) == 192, "touch page size");
ENGRAM_STATIC_ASSERT(offsetof(struct engram_cache_touch_page, head) == 64, "touch head");
ENGRAM_STATIC_ASSERT(offsetof(struct engram_cache_touch_page, tail) == 128, "touch tail");

/* ---- the arena ------------------------------------------------------------------------- */

#define ENGRAM_ARENA_MAGIC 0x414D5247u /* "GRMA" */
/* ENGRAM_ARENA_ALIGN: the data region's start and allocation unit, for GPU registration and
 * O_DIRECT. A protocol constant, the same on 4, 16 and 64 KiB-page kernels: the arena is mapped
 * whole from offset 0, so no offset in it needs to be a page multiple. */
#define ENGRAM_ARENA_ALIGN 4096u
#define ENGRAM_MAX_SLOTS 4096u /* slots fit in the low 16 bits of a ticket */

/* Daemon state word in the header. */
enum engram_daemon_state { ENGRAM_DAEMON_SERVING = 1, ENGRAM_DAEMON_STOPPED = 2 };
/* sq_flags bits, written by the daemon. */
#define ENGRAM_SQ_NEED_WAKEUP 1u /* the poller sleeps: write 1 to the doorbell eventfd */

/* The header occupies the first 4096 bytes. Each word written by one side sits on its own
 * 64-byte line. Who writes each field is stated; the other side only reads it. */
struct engram_arena_header {
  /* lines 0-1: written by the daemon before the memfd is sent, immutable afterwards */
  uint32_t magic; /* ENGRAM_ARENA_MAGIC */
  uint16_t version_major;
  uint16_t version_minor;
  uint32_t header_bytes; /* 4096 */
  uint32_t slots;        /* request slots = submission ring entries */
  uint32_t cq_entries;   /* completion ring entries (2 × slots) */
  uint32_t reserved0;
  uint64_t arena_bytes;
  uint64_t sq_offset;     /* struct engram_sqe[slots] */
  uint64_t cq_offset;     /* struct engram_cqe[cq_entries] */
  uint64_t status_offset; /* struct engram_request_status[slots] */
  uint64_t data_offset;   /* data region, ENGRAM_ARENA_ALIGN-aligned */
  uint64_t data_bytes;
  uint64_t session_id;
  uint64_t max_rows_per_request;
  uint8_t pad1[40];
  /* line 2 (offset 128): daemon. Completed requests of this session; only grows. A CUDA stream
   * can wait on it (cuStreamWaitValue64); clients futex-wait on its low 32 bits. */
  uint64_t completions;
  uint8_t pad2[56];
  /* line 3 (offset 192): daemon. Submission entries consumed. */
  uint32_t sq_head;
  uint8_t pad3[60];
  /* line 4 (offset 256): client. Submission entries published. */
  uint32_t sq_tail;
  uint8_t pad4[60];
  /* line 5 (offset 320): client. Completion entries consumed. */
  uint32_t cq_head;
  uint8_t pad5[60];
  /* line 6 (offset 384): daemon. Completion entries published; cq_overflow counts those
   * dropped because the ring was full (the status slots still hold every result). */
  uint32_t cq_tail;
  uint32_t cq_overflow;
  uint8_t pad6[56];
  /* line 7 (offset 448): daemon. ENGRAM_SQ_* flags. */
  uint32_t sq_flags;
  uint8_t pad7[60];
  /* line 8 (offset 512): client. Threads sleeping on `completions` (a hint for the daemon's
   * futex wake; a client that dies leaves it high, which only costs spurious wakes). */
  uint32_t client_waiters;
  uint8_t pad8[60];
  /* line 9 (offset 576): daemon. enum engram_daemon_state. */
  uint32_t daemon_state;
  uint8_t pad9[60];
  uint8_t tail_pad[4096 - 640];
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_arena_header) == 4096, "arena header size");
ENGRAM_STATIC_ASSERT(offsetof(struct engram_arena_header, completions) == 128, "completions");
ENGRAM_STATIC_ASSERT(offsetof(struct engram_arena_header, sq_head) == 192, "sq_head");
ENGRAM_STATIC_ASSERT(offsetof(struct engram_arena_header, sq_tail) == 256, "sq_tail");
ENGRAM_STATIC_ASSERT(offsetof(struct engram_arena_header, cq_head) == 320, "cq_head");
ENGRAM_STATIC_ASSERT(offsetof(struct engram_arena_header, cq_tail) == 384, "cq_tail");
ENGRAM_STATIC_ASSERT(offsetof(struct engram_arena_header, sq_flags) == 448, "sq_flags");
ENGRAM_STATIC_ASSERT(offsetof(struct engram_arena_header, client_waiters) == 512, "waiters");
ENGRAM_STATIC_ASSERT(offsetof(struct engram_arena_header, daemon_state) == 576, "state");

/* Submission opcodes and flags. */
enum engram_opcode {
  ENGRAM_OP_NOP = 1,    /* completes at once: measures the round trip */
  ENGRAM_OP_GATHER = 2, /* rows of one table into the data region */
  /* 1.2 (ENGRAM_FEATURE_PREFETCH): rows of one table the client will probably gather soon.
   * table, num_rows and rows_offset as for GATHER; flags, dest_offset and dest_offsets_offset
   * are 0. Completes as soon as the row ids are checked and queued, never after I/O: `rows` of
   * the completion is how many were queued (a full prefetch queue drops its oldest rows, and
   * counts them, to make room). At most ENGRAM_PREFETCH_MAX_ROWS rows an entry. */
  ENGRAM_OP_PREFETCH = 3,
  /* 1.6 (ENGRAM_FEATURE_ADMIT): request reserved[0] of this session is done with the rows its
   * admission pinned (PREFETCH with ENGRAM_SQE_PIN): they are unpinned. Every other field is 0.
   * Completes with `rows` 1 when the request had an admission, 0 when it had none (never made,
   * released already, or expired). */
  ENGRAM_OP_ADMIT_DONE = 4,
};
/* Rows one PREFETCH entry may carry: the daemon checks and queues them on its polling thread,
 * so an entry is kept small (a decode step's drafts fit in one; a prefill chunk takes a few). */
#define ENGRAM_PREFETCH_MAX_ROWS 8192u
#define ENGRAM_SQE_DEST_OFFSETS 1u /* dest_offsets_offset names a per-row offset array */
/* PREFETCH only (1.6, ENGRAM_FEATURE_ADMIT): pin the rows for request reserved[0] (any value the
 * client chooses, unique among its requests) for at most reserved[1] ns (0: the daemon's
 * memory.admit_ttl_ms); the pins are reserved against the daemon's bounds when the entry is
 * checked (RESOURCE_EXHAUSTED past them, nothing queued). */
#define ENGRAM_SQE_PIN 2u

/* A ticket is (generation << 16) | slot, generation >= 1: never 0. */
#define ENGRAM_TICKET_SLOT(t) ((uint32_t)((t)&0xFFFFu))

/* A submission. All offsets are relative to the start of the data region. Rows land at
 * dest_offset + i * 264, or at dest_offset + offsets[i] with ENGRAM_SQE_DEST_OFFSETS. */
struct engram_sqe {
  uint64_t ticket;
  uint16_t opcode; /* enum engram_opcode */
  uint16_t flags;  /* ENGRAM_SQE_* */
  uint32_t table;  /* layer id */
  uint64_t num_rows;
  uint64_t rows_offset;         /* num_rows uint64 row ids, 8-byte aligned */
  uint64_t dest_offset;         /* destination base */
  uint64_t dest_offsets_offset; /* num_rows uint64 byte offsets from dest_offset, 8-aligned */
  uint64_t reserved[2];         /* 0, but for ENGRAM_SQE_PIN and ADMIT_DONE */
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_sqe) == 64, "sqe size");

/* A completion. */
struct engram_cqe {
  uint64_t ticket;
  int32_t code;  /* enum engram_status_code */
  uint32_t rows; /* rows written (saturates at UINT32_MAX) */
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_cqe) == 16, "cqe size");

/* The outcome of the last request of a slot. The daemon writes every other field first and
 * `ticket` last (release); a client that reads its ticket there (acquire) sees the rest. */
#define ENGRAM_STATUS_MESSAGE_BYTES 224u
struct engram_request_status {
  uint64_t ticket;
  int32_t code; /* enum engram_status_code */
  uint32_t message_bytes;
  uint64_t rows;
  uint64_t service_ns; /* from the daemon taking the request to its completion */
  char message[ENGRAM_STATUS_MESSAGE_BYTES];
};
ENGRAM_STATIC_ASSERT(sizeof(struct engram_request_status) == 256, "status size");

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ENGRAM_PROTOCOL_H_ */
