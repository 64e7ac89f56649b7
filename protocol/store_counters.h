// The row store's counters, declared once: those of the shared row cache (RowCacheStats,
// store/row_cache.h) and those of each table served from memory (TableStoreStats,
// store/row_store.h). The structs' fields, the control replies' JSON
// (store/row_store_report.cc), the Prometheus metrics and engramctl's text are made
// from these lists. They sit here, beside the wire codec, because the JSON keys are shared by
// the daemon and engramctl.
//
//   X(field, json_key, type, metric, help)           row cache
//   X(field, json_key, tiers, type, metric, help)    tables
//   field     the member of the stats struct
//   json_key  its key: in status's "store"."cache" (row cache) or in the table's entry of
//             stats (tables); engramctl prints it with spaces for underscores, one ending in
//             bytes as a size
//   tiers     the tables it is reported for: MEMORY (resident and cache tiers) or RESIDENT
//   type      COUNTER (only grows) or GAUGE
//   metric    the Prometheus family (table counters: labelled by table), in base units: a
//             counter whose json_key ends in _ns counts nanoseconds, and its metric, in seconds,
//             is scaled by StoreMetricScale
//   help      one line: the metric's HELP
//
// To add a counter: add one line to the list of its owner, then count it.
#pragma once

#include <string_view>

// RowCache: one for the daemon, shown in status.
#define ENGRAM_ROW_CACHE_COUNTERS(X)                                                             \
  X(capacity_slots, "capacity_rows", GAUGE, "engram_cache_capacity_rows",                        \
    "Rows the row cache may hold now")                                                           \
  X(max_slots, "max_rows", GAUGE, "engram_cache_max_rows",                                       \
    "Rows the row cache's region has room for (its configured size)")                            \
  X(used_slots, "used_rows", GAUGE, "engram_cache_rows", "Rows in the row cache")                \
  X(bytes, "bytes", GAUGE, "engram_cache_bytes",                                                 \
    "Bytes the row cache accounts for (slots and index)")                                        \
  X(resident_bytes, "resident_bytes", GAUGE, "engram_cache_resident_bytes",                      \
    "Bytes of the row cache holding pages")                                                      \
  X(hits, "hits", COUNTER, "engram_cache_hits_total", "Row cache lookups that hit")              \
  X(misses, "misses", COUNTER, "engram_cache_misses_total", "Row cache lookups that missed")     \
  X(inserts, "inserts", COUNTER, "engram_cache_inserts_total", "Rows admitted to the row cache") \
  X(evictions, "evictions", COUNTER, "engram_cache_evictions_total",                             \
    "Rows evicted from the row cache")                                                           \
  X(ghost_hits, "ghost_hits", COUNTER, "engram_cache_ghost_hits_total",                          \
    "Rows admitted straight to the main queue: evicted recently (the ghost queue)")              \
  X(promotions, "promotions", COUNTER, "engram_cache_promotions_total",                          \
    "Rows moved from the small queue to the main queue")                                         \
  X(prefetch_inserts, "prefetch_inserts", COUNTER, "engram_cache_prefetch_inserts_total",        \
    "Rows admitted by prefetches (counted in inserts too)")                                      \
  X(shrink_skipped_inserts, "shrink_skipped_inserts", COUNTER,                                   \
    "engram_cache_shrink_skipped_inserts_total",                                                 \
    "Rows not admitted because a shrink was under way and no slot below the new size was free")  \
  X(pinned_rows, "pinned_rows", GAUGE, "engram_cache_pinned_rows",                               \
    "Rows of the row cache pinned by admission prefetches")                                      \
  X(pinned_evictions, "pinned_evictions", COUNTER, "engram_cache_pinned_evictions_total",        \
    "Pinned rows evicted because every row of the cache was pinned")

// Per table of the resident or cache tier, shown in stats (RESIDENT ones in tables too).
#define ENGRAM_STORE_TABLE_COUNTERS(X)                                                             \
  X(requests, "store_requests", MEMORY, COUNTER, "engram_store_requests_total",                    \
    "Gathers through the row store")                                                               \
  X(all_hit_requests, "store_all_hit_requests", MEMORY, COUNTER,                                   \
    "engram_store_all_hit_requests_total",                                                         \
    "Gathers answered wholly from memory (no engine, no I/O)")                                     \
  X(rows, "store_rows", MEMORY, COUNTER, "engram_store_rows_total", "Rows asked of the row store") \
  X(hit_rows, "store_hit_rows", MEMORY, COUNTER, "engram_store_hit_rows_total",                    \
    "Rows copied from memory")                                                                     \
  X(prefetch_used_rows, "prefetch_used_rows", MEMORY, COUNTER, "engram_prefetch_used_rows_total",  \
    "Rows a prefetch admitted to the row cache that a gather then hit (each once)")                \
  X(resident_rows_loaded, "resident_rows_loaded", RESIDENT, GAUGE, "engram_store_resident_rows",   \
    "Rows of a resident table in memory")                                                          \
  X(resident_bytes, "resident_memory_bytes", RESIDENT, GAUGE, "engram_store_resident_bytes",       \
    "Memory of a resident table")

// The miss queue of cache-tier misses (gather/miss_queue.h), per class (decode, prefill,
// prefetch, admission): in status's "store"."misses"."classes"."CLASS" and as metrics labelled by
// class.
#define ENGRAM_MISS_CLASS_COUNTERS(X)                                                  \
  X(pending_reads, "pending_reads", GAUGE, "engram_miss_queue_pending_reads",          \
    "Missed rows the requests under way still need read")                              \
  X(waiting_reads, "waiting_reads", GAUGE, "engram_miss_queue_waiting_reads",          \
    "Missed rows queued for the device, not yet started")                              \
  X(in_flight_reads, "in_flight_reads", GAUGE, "engram_miss_queue_in_flight_reads",    \
    "Missed rows being read from the device")                                          \
  X(pieces, "pieces", COUNTER, "engram_miss_queue_pieces_total",                       \
    "Pieces of misses the queue let go to the device")                                 \
  X(reads, "reads", COUNTER, "engram_miss_queue_reads_total",                          \
    "Missed rows the queue let go to the device")                                      \
  X(dropped_reads, "dropped_reads", COUNTER, "engram_miss_queue_dropped_reads_total",  \
    "Prefetch and admission rows dropped because the queue was full")                  \
  X(shed_reads, "shed_reads", COUNTER, "engram_miss_queue_shed_reads_total",           \
    "Prefetch and admission rows shed because the device was behind")                  \
  X(wait_ns, "wait_ns", COUNTER, "engram_miss_queue_wait_seconds_total",               \
    "Time pieces waited in the queue, added up")                                       \
  X(max_wait_ns, "max_wait_ns", GAUGE, "engram_miss_queue_max_wait_seconds",           \
    "The longest one piece waited in the queue")                                       \
  X(max_reads_waited, "max_reads_waited", GAUGE, "engram_miss_queue_max_reads_waited", \
    "The most device reads that completed while one piece waited")

// Admission prefetches (store/admissions.h): in status's "store"."admissions" and as metrics.
#define ENGRAM_ADMISSION_COUNTERS(X)                                                         \
  X(active, "active", GAUGE, "engram_admissions", "Admitted requests whose rows are pinned") \
  X(reserved_rows, "reserved_rows", GAUGE, "engram_admission_reserved_rows",                 \
    "Row pins reserved by admitted requests")                                                \
  X(pinned_rows, "pinned_rows", GAUGE, "engram_admission_pinned_rows",                       \
    "Row pins admitted requests hold")                                                       \
  X(max_rows, "max_rows", GAUGE, "engram_admission_max_rows",                                \
    "Row pins all admitted requests may reserve together, at the cache's present size")      \
  X(admitted_rows, "admitted_rows", COUNTER, "engram_admission_rows_total",                  \
    "Row pins reserved by admissions")                                                       \
  X(refused_rows, "refused_rows", COUNTER, "engram_admission_refused_rows_total",            \
    "Row pins refused at a bound (memory.admit_rows or memory.admit_session_rows)")          \
  X(released, "released", COUNTER, "engram_admission_released_total",                        \
    "Admissions their session released (ADMIT_DONE)")                                        \
  X(expired, "expired", COUNTER, "engram_admission_expired_total",                           \
    "Admissions released because their deadline passed")                                     \
  X(ended, "ended", COUNTER, "engram_admission_ended_total",                                 \
    "Admissions released because their session ended")
// The factor from a counter's value to its metric's: seconds for a json_key ending in "_ns".
constexpr double StoreMetricScale(std::string_view json_key) {
  return json_key.ends_with("_ns") ? 1e-9 : 1.0;
}

// Selector on an entry's type: ENGRAM_STORE_IF_COUNTER_##type(...) expands to its arguments for
// a COUNTER and to nothing for a GAUGE.
#define ENGRAM_STORE_IF_COUNTER_COUNTER(...) __VA_ARGS__
#define ENGRAM_STORE_IF_COUNTER_GAUGE(...)
