/* The counters of one session, declared once. Each entry of ENGRAM_SESSION_COUNTERS makes a
 * uint64_t field of struct engram_session_stats (engram.h) and, as its origin says, of the STATS
 * reply (struct engram_wire_session_stats, protocol.h); engramd's per-session counters, the
 * control replies' JSON, the Prometheus metrics and engramctl's text are made from the same
 * list, and the Python package reads it from the library (engram_session_stats_field).
 *
 *   X(field, origin, type, metric, help)
 *   field   the member of engram_session_stats and its key in `engramctl stats --json`;
 *           engramctl prints it with spaces for underscores, a name ending in _ns as a
 *           duration and one ending in bytes as a size
 *   origin  COUNTED   engramd counts it in the session (an atomic it adds to); sent in STATS
 *           COMPUTED  engramd works it out when asked (Session::Stats); sent in STATS
 *           LIBRARY   this process's client library counts it; never on the wire
 *   type    COUNTER (only grows) or GAUGE
 *   metric  the Prometheus family, labelled by client and session; "" for none; a trailing
 *           {key=value} adds that label (families shared by several counters)
 *   help    one line: the metric's HELP and the field's documentation
 *
 * To add a counter: append one line (never insert or remove one: the struct's layout is ABI),
 * then count it. At most 15 counters travel on the wire (protocol.h says why). A counter
 * that only operators need goes into ENGRAM_SESSION_DAEMON_COUNTERS instead.
 */
#ifndef ENGRAM_SESSION_STATS_H_
#define ENGRAM_SESSION_STATS_H_

/* clang-format off */
#define ENGRAM_SESSION_COUNTERS(X)                                                              \
  X(requests_submitted, COUNTED, COUNTER, "",                                                  \
    "Requests taken from the submission ring")                                                  \
  X(requests_ok, COUNTED, COUNTER, "engram_client_requests_total{result=ok}",                  \
    "Requests a client submitted, by result")                                                   \
  X(requests_failed, COUNTED, COUNTER, "engram_client_requests_total{result=failed}",          \
    "Requests a client submitted, by result")                                                   \
  X(rows, COUNTED, COUNTER, "engram_client_rows_total",                                        \
    "Rows gathered for a client (requests that succeeded)")                                     \
  X(bytes, COUNTED, COUNTER, "engram_client_bytes_total",                                      \
    "Bytes written into a client's arena")                                                      \
  X(inflight, COMPUTED, GAUGE, "engram_client_requests_in_flight",                             \
    "Requests of a client in flight")                                                           \
  X(doorbells, COUNTED, COUNTER, "engram_client_doorbells_total",                              \
    "Times a client woke the poller")                                                           \
  X(cq_overflows, COMPUTED, COUNTER, "engram_client_cq_overflows_total",                       \
    "Completions not queued because a client's completion ring was full")                       \
  X(latency_p50_ns, COMPUTED, GAUGE, "",                                                       \
    "Median service time in the daemon (upper edge of its power-of-two bucket)")                \
  X(latency_p99_ns, COMPUTED, GAUGE, "",                                                       \
    "99th percentile of the service time in the daemon (upper edge of its bucket)")             \
  X(latency_max_ns, COMPUTED, GAUGE, "",                                                       \
    "Longest service time in the daemon (upper edge of its bucket)")                            \
  X(client_sleeps, LIBRARY, COUNTER, "",                                                       \
    "Times engram_wait went to sleep on the futex (this process)")                              \
  X(rows_in_place, LIBRARY, COUNTER, "",                                                       \
    "Rows this process's engram_gather copied from resident tables or the row cache itself "    \
    "(engram_gather's in-place path), not counted in rows")

/* Counters of a session that only engramd reports (control replies, metrics), in the same shape
 * (origin COUNTED): not in engram_session_stats, not on the wire. */
#define ENGRAM_SESSION_DAEMON_COUNTERS(X)                                                      \
  X(garbage, COUNTED, COUNTER, "engram_client_unreadable_submissions_total",                   \
    "Submissions the daemon could not read (a corrupt ring or entry), counted as failed too")   \
  X(cache_rows_in_place, COUNTED, COUNTER, "engram_client_cache_rows_in_place_total",          \
    "Rows of cache-tier tables the client copied from the row cache itself "                   \
    "(engram_gather's in-place path), as its touch page reported them")                         \
  X(resident_rows_in_place, COUNTED, COUNTER, "engram_client_resident_rows_in_place_total",    \
    "Rows of resident tables the client copied from its own mapping "                          \
    "(engram_gather's in-place path), as its touch page reported them")                         \
  X(touch_reports_clamped, COUNTED, COUNTER, "engram_client_touch_reports_clamped_total",      \
    "Counters of a client's touch page that grew past what it could have read in place, "      \
    "clamped")
/* clang-format on */

/* Selectors on an entry's origin: ENGRAM_SESSION_<WHICH>_##origin(...) expands to its
 * arguments for the counters WHICH names and to nothing for the others. */
#define ENGRAM_SESSION_COUNTED_COUNTED(...) __VA_ARGS__
#define ENGRAM_SESSION_COUNTED_COMPUTED(...)
#define ENGRAM_SESSION_COUNTED_LIBRARY(...)
#define ENGRAM_SESSION_ON_WIRE_COUNTED(...) __VA_ARGS__
#define ENGRAM_SESSION_ON_WIRE_COMPUTED(...) __VA_ARGS__
#define ENGRAM_SESSION_ON_WIRE_LIBRARY(...)
#define ENGRAM_SESSION_LIBRARY_COUNTED(...)
#define ENGRAM_SESSION_LIBRARY_COMPUTED(...)
#define ENGRAM_SESSION_LIBRARY_LIBRARY(...) __VA_ARGS__

/* A uint64_t member per counter (struct engram_session_stats). */
#define ENGRAM_SESSION_STATS_FIELD_(field, origin, type, metric, help) uint64_t field;
/* Only the counters sent in STATS (struct engram_wire_session_stats), and their number. */
#define ENGRAM_SESSION_WIRE_FIELD_(field, origin, type, metric, help) \
  ENGRAM_SESSION_ON_WIRE_##origin(uint64_t field;)
#define ENGRAM_SESSION_WIRE_ONE_(field, origin, type, metric, help) \
  ENGRAM_SESSION_ON_WIRE_##origin(+1)
#define ENGRAM_SESSION_WIRE_COUNTERS (0 ENGRAM_SESSION_COUNTERS(ENGRAM_SESSION_WIRE_ONE_))

#endif /* ENGRAM_SESSION_STATS_H_ */
