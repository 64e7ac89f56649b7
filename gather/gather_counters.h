// The gather engine's counters, declared once. Each X(field, json_key, metric, help) entry makes
// a field of TableGatherStats and, for reader counters, of the per-thread ReadCounters; the
// engine's atomics, their merge and the stats snapshot are generated from the same lists, and
// ForEachGatherCounter hands every counter to the JSON and Prometheus writers.
//
// To add a counter: add one line to the list its owner fills (batch: counted once per batch by
// the engine; reader: counted by the reader passes on each thread), then count it.
#pragma once

#include <cstdint>

// Counted once per batch by the engine.
#define ENGRAM_GATHER_BATCH_COUNTERS(X)                                                        \
  X(batches, "batches", "engram_gather_batches_total", "Gather batches run")                   \
  X(rows_requested, "rows_requested", "engram_gather_rows_total", "Rows requested by gathers") \
  X(rows_unique, "rows_unique", "engram_gather_unique_rows_total",                             \
    "Rows left after de-duplication")                                                          \
  X(dedup_copies, "dedup_copies", "engram_gather_dedup_copies_total",                          \
    "Slots filled by copying a row read once for the batch")                                   \
  X(nowait_hits, "nowait_hits", "engram_gather_nowait_hits_total",                             \
    "Rows served by the RWF_NOWAIT pass")                                                      \
  X(nowait_eagain, "nowait_eagain", "engram_gather_nowait_misses_total",                       \
    "Rows the RWF_NOWAIT pass left (EAGAIN)")                                                  \
  X(probes, "nowait_probes", "engram_gather_nowait_probes_total",                              \
    "Batches that probed the RWF_NOWAIT pass while it was off")                                \
  X(errors, "errors", "engram_gather_errors_total", "Gathers that failed")                     \
  X(fanout_batches, "fanout_batches", "engram_gather_fanout_batches_total",                    \
    "Batches shared with worker threads")                                                      \
  X(helper_tasks, "helper_tasks", "engram_gather_helper_tasks_total",                          \
    "Workers batches were allowed as helpers (the wake-up tree stops once a batch is done)")

// Counted by the reader passes on each thread and added to the table's totals once per batch.
#define ENGRAM_GATHER_READER_COUNTERS(X)                                                           \
  X(read_calls, "read_calls", "engram_gather_read_calls_total", "Reads issued after merging")      \
  X(syscalls, "syscalls", "engram_gather_syscalls_total",                                          \
    "preadv2, pread and io_uring_enter calls")                                                     \
  X(partial_reads, "partial_reads", "engram_gather_partial_reads_total",                           \
    "Reads that came back short and were resumed")                                                 \
  X(nowait_zero, "nowait_zero", "engram_gather_nowait_zero_total",                                 \
    "RWF_NOWAIT reads that returned 0 before the end of the file (treated as misses)")             \
  X(eintr_retries, "eintr_retries", "engram_gather_eintr_retries_total",                           \
    "Reads retried after EINTR")                                                                   \
  X(uring_reads, "uring_reads", "engram_gather_uring_reads_total",                                 \
    "Residue reads through io_uring")                                                              \
  X(pool_reads, "pool_reads", "engram_gather_pool_reads_total",                                    \
    "Residue reads through the blocking pool")                                                     \
  X(direct_reads, "direct_reads", "engram_gather_direct_reads_total", "O_DIRECT reads")            \
  X(fixed_reads, "fixed_reads", "engram_gather_fixed_reads_total",                                 \
    "O_DIRECT reads into registered buffers")                                                      \
  X(ring_failures, "ring_failures", "engram_gather_ring_failures_total",                           \
    "io_uring_enter failures survived by draining and replacing the ring")                         \
  X(ring_resets, "ring_resets", "engram_gather_ring_resets_total",                                 \
    "io_uring rings replaced after a failure")                                                     \
  X(bytes_read, "bytes_read", "engram_gather_read_bytes_total", "Bytes read from the table files") \
  X(emulated_reads, "emulated_reads", "engram_gather_emulated_reads_total",                        \
    "O_DIRECT reads paced by the emulated device (benchmarking only)")                             \
  X(emulated_holds, "emulated_holds", "engram_gather_emulated_holds_total",                        \
    "Emulated reads the real device answered early, held to their emulated completion")

#define ENGRAM_GATHER_COUNTERS(X) \
  ENGRAM_GATHER_BATCH_COUNTERS(X) \
  ENGRAM_GATHER_READER_COUNTERS(X)

namespace engram {

// What ForEachGatherCounter tells about a counter.
struct GatherCounterInfo {
  const char* field;     // the TableGatherStats field
  const char* json_key;  // its key in `engramctl stats --json`
  const char* metric;    // its Prometheus name (a counter, labelled by table)
  const char* help;
};

}  // namespace engram
