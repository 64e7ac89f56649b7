// The rows of Settings() (config_file.h): one constant table per section of the configuration
// file, each row all there is to know about one setting, and the checks the rows name.
#include <array>
#include <cstdlib>
#include <initializer_list>
#include <iterator>
#include <span>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "daemon/ops/config_file.h"
#include "daemon/server/hot_set.h"
#include "engram/protocol.h"

namespace engram {

absl::Status CheckTierEntry(const std::string& v) {
  const size_t eq = v.find('=');
  uint32_t layer = 0;
  if (eq == std::string::npos || !absl::SimpleAtoi(v.substr(0, eq), &layer) ||
      !ParseTier(v.substr(eq + 1))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s' is not LAYER=storage, LAYER=resident or LAYER=cache", v));
  }
  return absl::OkStatus();
}

namespace {

using C = ServerConfig;
using S = DaemonSettings;
using Kind = Setting::Kind;
constexpr Setting::Applies kRestart = Setting::Applies::kRestart;
constexpr Setting::Applies kServer = Setting::Applies::kServer;
constexpr Setting::Applies kLog = Setting::Applies::kLog;
constexpr Setting::Applies kTextfile = Setting::Applies::kTextfile;

absl::Status OneOf(const std::string& v, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed) {
    if (v == a) return absl::OkStatus();
  }
  std::string list;
  for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  return absl::InvalidArgumentError(absl::StrFormat("'%s' is not one of %s", v, list));
}

absl::Status AbsolutePath(const std::string& v, bool may_be_empty) {
  if ((v.empty() && may_be_empty) || (!v.empty() && v[0] == '/')) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat("'%s' is not an absolute path", v));
}

absl::Status CheckFileMode(const std::string& v) {
  char* end = nullptr;
  const unsigned long mode = strtoul(v.c_str(), &end, 8);
  if (v.empty() || *end != '\0' || mode > 07777) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s' is not an octal file mode such as \"0660\"", v));
  }
  return absl::OkStatus();
}

absl::Status CheckLoopback(const std::string& v) {
  if (v != "127.0.0.1" && v != "::1" && v != "localhost") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' is not a loopback address (127.0.0.1, ::1 or localhost); the metrics port is never "
        "exposed beyond the node",
        v));
  }
  return absl::OkStatus();
}

// "error, warning, notice, info or debug", from log::kLevelNames.
std::string LevelList() {
  std::string out;
  const size_t n = std::size(log::kLevelNames);
  for (size_t i = 0; i < n; ++i) {
    out += (i == 0 ? "" : i + 1 == n ? " or " : ", ") + std::string(log::kLevelNames[i].name);
  }
  return out;
}

absl::Status CheckLevel(const std::string& v) {
  if (log::ParseLevel(v)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat("'%s' is not one of %s", v, LevelList()));
}

// log.level's help, "Least important messages logged: error, ... or debug", spelled from
// log::kLevelNames at compile time so that its row stays constant data.
constexpr auto kLevelHelp = [] {
  std::array<char, 96> out{};
  size_t at = 0;
  auto put = [&](const char* text) {
    while (*text != '\0') out[at++] = *text++;
  };
  put("Least important messages logged: ");
  const size_t n = std::size(log::kLevelNames);
  for (size_t i = 0; i < n; ++i) {
    put(i == 0 ? "" : i + 1 == n ? " or " : ", ");
    put(log::kLevelNames[i].name);
  }
  return out;
}();

constexpr Setting kTablesRows[] = {
    {.key = "tables.models",
     .flag = "--model",
     .help = "Checkpoint directory; every Engram table in it is served",
     .kind = Kind::kStrings,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->models; },
     .example = "/srv/engram/model"},
    {.key = "tables.files",
     .flag = "--table",
     .help = "A packed table file (or a checkpoint directory)",
     .kind = Kind::kStrings,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->tables; },
     .example = "/srv/engram/layer-14.engram"},
    {.key = "tables.rows",
     .flag = "--rows",
     .help = "Per-rank copy: the rows A:B the sources hold (others are refused)",
     .kind = Kind::kString,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->rows; },
     .check = [](const std::string& v) -> absl::Status {
       if (v.empty()) return absl::OkStatus();
       absl::StatusOr<RowRange> r = ParseRowRange(v);
       return r.ok() ? absl::OkStatus() : r.status();
     },
     .example = "0:1000000"},
    {.key = "tables.layers",
     .flag = "--layers",
     .help = "Serve only these layer ids (empty: all)",
     .kind = Kind::kIds,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->layers; },
     .max = UINT32_MAX,
     .flag_separator = ",",
     .item = "layer id"},
    {.key = "tables.check_holes",
     .flag = "--no-check-holes",
     .help = "Do not check sparse copies for holes in the rows they claim",
     .kind = Kind::kBool,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->check_holes; }},
    {.key = "tables.read_mode",
     .flag = "--read-mode",
     .help = "buffered (page cache, RWF_NOWAIT fast path) or direct (O_DIRECT, for tables much "
             "larger than RAM)",
     .kind = Kind::kString,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->read_mode; },
     .check =
         [](const std::string& v) {
           return OneOf(v, {"buffered", "direct"});
         },
     .example = "direct"},
    {.key = "tables.tier",
     .flag = "--default-tier",
     .help = "Tier of the tables tables.tiers does not name: storage, resident or cache "
             "(docs/row-store.md)",
     .kind = Kind::kString,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->default_tier; },
     .check =
         [](const std::string& v) {
           return OneOf(v, {"storage", "resident", "cache"});
         },
     .example = "resident"},
    {.key = "tables.tiers",
     .flag = "--tier",
     .help = "A table's tier, LAYER=storage|resident|cache (repeatable)",
     .kind = Kind::kStrings,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->tiers; },
     .check = CheckTierEntry,
     .example = "14=resident"},
};

constexpr Setting kMemoryRows[] = {
    {.key = "memory.budget",
     .flag = "--memory-budget",
     .help = "Bytes engramd may hold in all: its process, buffers, client arenas, page cache and "
             "the row store (0: unbounded); the service's memory limits derive from it",
     .kind = Kind::kBytesOrZero,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->store.budget_bytes; },
     .example = "1G"},
    {.key = "memory.cache",
     .flag = "--cache-bytes",
     .help = "Size of the row cache (0: what the budget leaves)",
     .kind = Kind::kBytesOrZero,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->store.cache_bytes; }},
    {.key = "memory.pressure",
     .flag = "--no-memory-pressure",
     .help = "Do not shrink the row cache under memory pressure (PSI)",
     .kind = Kind::kBool,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->store.pressure; }},
    {.key = "memory.pressure_file",
     .flag = "--pressure-file",
     .help = "PSI file the row cache follows, a regular file (empty: the cgroup's "
             "memory.pressure, else /proc/pressure/memory)",
     .kind = Kind::kString,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->store.pressure_file; },
     .path = true,
     .example = "/sys/fs/cgroup/engram.slice/memory.pressure"},
    {.key = "memory.pressure_interval_ms",
     .flag = "--pressure-interval",
     .help = "Milliseconds between two samples of memory pressure (10..60000)",
     .kind = Kind::kUint32,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->store.pressure_interval_ms; },
     .min = 10,
     .max = 60000},
    {.key = "memory.huge_pages",
     .flag = "--no-huge-pages",
     .help =
         "Do not put resident tables on huge pages (the kernel's default size: 2 MiB on x86-64, "
         "512 MiB on a 64 KiB-page arm64 kernel) even where the kernel has them to give",
     .kind = Kind::kBool,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->store.huge_pages; }},
    {.key = "memory.load_at_start",
     .flag = "--no-load-at-start",
     .help = "Do not load resident tables at start; `engramctl load` does (storage serves until "
             "then)",
     .kind = Kind::kBool,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->store.load_at_start; }},
    {.key = "memory.load_rate",
     .flag = "--load-rate",
     .help = "Bytes per second a resident table's load may read (0: no limit), so that loading "
             "beside serving leaves the disk to the misses",
     .kind = Kind::kBytesOrZero,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->store.load_rate_bytes_per_s; }},
};

// [memory]'s row cache: its hot set on disk and its misses' device reads.
constexpr Setting kHotSetRows[] = {
    {.key = "memory.hot_set_path",
     .flag = "--hot-set-path",
     .help = "File the row cache's hot set (row ids) is written to, periodically and at stop, "
             "and warmed from in the background after a start that did not keep the cache "
             "(empty: none); a regular file that is absent or a hot set, never replaced otherwise",
     .kind = Kind::kString,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->hot_set_path; },
     .path = true,
     .example = "/var/lib/engramd/hot-set"},
    {.key = "memory.hot_set_interval_seconds",
     .flag = "--hot-set-interval",
     .help = "Seconds between writes of the hot set (0: only at stop)",
     .kind = Kind::kUint32,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->hot_set_interval_s; },
     .max = 86400},
    {.key = "memory.hot_set_rows",
     .flag = "",
     .help = "Rows the hot set keeps at most (8 bytes each)",
     .kind = Kind::kUint64,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->hot_set_rows; },
     .min = 1,
     .max = kMaxHotSetRows},
    {.key = "memory.miss_depth",
     .flag = "--miss-depth",
     .help = "Device reads of cache-tier misses in flight past which prefill and prefetch "
             "misses wait (decode steps' go at once, first); about the queue depth at which "
             "the device reaches its read rate",
     .kind = Kind::kUint32,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->store.miss_depth; },
     .min = 1,
     .max = 4096},
    {.key = "memory.miss_shed_ms",
     .flag = "--miss-shed-ms",
     .help = "How far behind the device may fall (ms of reads ahead, at its measured rate), "
             "and how long a prefetch or admission read may wait, before such reads are shed, "
             "so that decode and prefill misses keep their latency (0: never shed)",
     .kind = Kind::kUint32,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->store.miss_shed_ms; },
     .max = 600'000},
    {.key = "memory.admit_rows",
     .flag = "--admit-rows",
     .help = "Rows admission prefetches may pin in the row cache, all sessions together (0: a "
             "quarter of the cache's rows; never more than half)",
     .kind = Kind::kUint64,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->store.admit_rows; },
     .max = uint64_t{1} << 32},
    {.key = "memory.admit_session_rows",
     .flag = "--admit-session-rows",
     .help = "Rows one session's admission prefetches may pin at once (a PREFETCH with "
             "ENGRAM_SQE_PIN past it is refused: RESOURCE_EXHAUSTED)",
     .kind = Kind::kUint64,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->store.admit_session_rows; },
     .min = 1,
     .max = uint64_t{1} << 32},
    {.key = "memory.admit_ttl_ms",
     .flag = "--admit-ttl-ms",
     .help = "The longest an admission keeps its rows pinned unreleased (a request asking for "
             "longer gets this)",
     .kind = Kind::kUint32,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->store.admit_ttl_ms; },
     .min = 1,
     .max = 3'600'000},
};

constexpr Setting kSocketRows[] = {
    {.key = "socket.path",
     .flag = "--socket",
     .help = "Unix socket to listen on",
     .kind = Kind::kString,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->socket_path; },
     .check = [](const std::string& v) { return AbsolutePath(v, false); },
     .path = true,
     .example = "/run/engramd-b/engramd.sock"},
    {.key = "socket.mode",
     .flag = "--socket-mode",
     .help = "File mode of the socket (octal)",
     .kind = Kind::kString,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->socket_mode; },
     .check = CheckFileMode,
     .example = "0600"},
    {.key = "socket.group",
     .flag = "--socket-group",
     .help = "Group owning the socket (empty: the daemon's group)",
     .kind = Kind::kString,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->socket_group; },
     .example = "engram"},
};

// Who may connect and who administers: read at each handshake and control request.
constexpr Setting kAccessRows[] = {
    {.key = "access.allow_users",
     .flag = "--allow-uid",
     .help = "User (name or uid) allowed to connect besides root and engramd's own uid, "
             "which always are; repeatable",
     .kind = Kind::kStrings,
     .applies = kServer,
     .field = [](S* s) -> void* { return &s->allow_users; },
     .server_field = [](C* c) -> void* { return &c->allow_uids; },
     .example = "root"},
    {.key = "access.allow_groups",
     .flag = "--allow-gid",
     .help = "Group (name or gid) whose members may connect (root and engramd's own uid "
             "always may); repeatable",
     .kind = Kind::kStrings,
     .applies = kServer,
     .field = [](S* s) -> void* { return &s->allow_groups; },
     .server_field = [](C* c) -> void* { return &c->allow_gids; },
     .example = "root"},
    {.key = "access.admin_uids",
     .flag = "--admin-uid",
     .help = "uid that may also run warm and evict (root and engramd's own uid always may); "
             "repeatable",
     .kind = Kind::kIds,
     .applies = kServer,
     .server_field = [](C* c) -> void* { return &c->admin_uids; },
     .max = kMaxId,
     .item = "uid"},
    {.key = "access.admin_gids",
     .flag = "--admin-gid",
     .help = "gid whose members may run warm and evict; repeatable",
     .kind = Kind::kIds,
     .applies = kServer,
     .server_field = [](C* c) -> void* { return &c->admin_gids; },
     .max = kMaxId,
     .item = "gid"},
};

// The bounds of Limits; the live ones are read at the handshake, on the control thread.
constexpr Setting kLimitsRows[] = {
    {.key = "limits.max_clients",
     .flag = "--max-clients",
     .help = "Sessions at once",
     .kind = Kind::kUint32,
     .applies = kServer,
     .server_field = [](C* c) -> void* { return &c->limits.max_clients; },
     .min = 1,
     .max = 65536},
    {.key = "limits.max_inflight",
     .flag = "--max-inflight",
     .help = "Requests in flight per session",
     .kind = Kind::kUint32,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->limits.max_inflight; },
     .min = 1,
     .max = ENGRAM_MAX_SLOTS},
    {.key = "limits.max_rows_per_request",
     .flag = "--max-rows-per-request",
     .help = "Rows in one request",
     .kind = Kind::kUint64,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->limits.max_rows_per_request; },
     .min = 1,
     .max = uint64_t{1} << 32},
    {.key = "limits.max_arena_bytes",
     .flag = "--max-arena-bytes",
     .help = "Data region of one session (bytes; K/M/G suffixes)",
     .kind = Kind::kBytes,
     .applies = kServer,
     .server_field = [](C* c) -> void* { return &c->limits.max_arena_bytes; }},
    {.key = "limits.max_total_arena_bytes",
     .flag = "--max-total-arena-bytes",
     .help = "Arenas of all sessions together",
     .kind = Kind::kBytes,
     .applies = kServer,
     .server_field = [](C* c) -> void* { return &c->limits.max_total_arena_bytes; }},
    {.key = "limits.default_data_bytes",
     .flag = "",
     .help = "Data region of a session whose client asks for the default (0)",
     .kind = Kind::kBytes,
     .applies = kServer,
     .server_field = [](C* c) -> void* { return &c->limits.default_data_bytes; }},
    {.key = "limits.default_slots",
     .flag = "",
     .help = "Request slots of a session whose client asks for the default",
     .kind = Kind::kUint32,
     .applies = kServer,
     .server_field = [](C* c) -> void* { return &c->limits.default_slots; },
     .min = 1,
     .max = ENGRAM_MAX_SLOTS},
    {.key = "limits.prefetch_queue_rows",
     .flag = "--prefetch-queue-rows",
     .help = "Rows queued for prefetch, all sessions together (a full queue drops its oldest "
             "rows, counted; 0: prefetch off)",
     .kind = Kind::kUint64,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->limits.prefetch_queue_rows; },
     .max = uint64_t{1} << 28},
    {.key = "limits.prefetch_session_rows",
     .flag = "--prefetch-session-rows",
     .help = "Rows one session may have waiting for prefetch, from submission until they are "
             "worked on or dropped (a PREFETCH past it is refused: RESOURCE_EXHAUSTED)",
     .kind = Kind::kUint64,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->limits.prefetch_session_rows; },
     .min = 1,
     .max = uint64_t{1} << 28},
    {.key = "limits.max_device_sessions",
     .flag = "--max-device-sessions",
     .help = "Sessions that may submit from a device (ENGRAM_CONNECT_DEVICE_SUBMIT) at once; "
             "only administrators may open one (0: none)",
     .kind = Kind::kUint32,
     .applies = kServer,
     .server_field = [](C* c) -> void* { return &c->limits.max_device_sessions; },
     .max = 65536},
};

constexpr Setting kEngineRows[] = {
    {.key = "engine.workers",
     .flag = "--workers",
     .help = "Gather workers (0: one per CPU)",
     .kind = Kind::kUint32,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->workers; },
     .max = 1024},
    {.key = "engine.request_threads",
     .flag = "--request-threads",
     .help = "Requests gathered at the same time (0: half the CPUs, 2 to 32); requests larger "
             "than a decode step run on a separate pool of half as many",
     .kind = Kind::kUint32,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->request_threads; },
     .max = 1024},
    {.key = "engine.poll_spin_min_us",
     .flag = "--poll-spin-min-us",
     .help = "Shortest polling spell before sleeping",
     .kind = Kind::kUint64,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->spin_min_us; },
     .max = 10'000'000},
    {.key = "engine.poll_spin_max_us",
     .flag = "--poll-spin-max-us",
     .help = "Longest polling spell before sleeping",
     .kind = Kind::kUint64,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->spin_max_us; },
     .max = 10'000'000},
    {.key = "engine.pace",
     .flag = "--pace",
     .help = "Wake the poller and two request threads ahead of regularly paced requests (spins "
             "CPU)",
     .kind = Kind::kBool,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->poll.pace; }},
    {.key = "engine.poll_mode",
     .flag = "--poll-mode",
     .help = "Polling mode: while clients are active, the poller and engine.poll_cores - 1 "
             "request threads spin instead of sleeping (spins CPU): on, off, or auto (on from "
             "16 CPUs up)",
     .kind = Kind::kString,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->poll_mode; },
     .check =
         [](const std::string& v) {
           return OneOf(v, {"auto", "on", "off"});
         },
     .example = "on"},
    {.key = "engine.poll_cores",
     .flag = "--poll-cores",
     .help = "Cores that spin in polling mode, the poller's included (0: an eighth of the CPUs, "
             "at least 2)",
     .kind = Kind::kUint32,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->poll_cores; },
     .max = 1024},
    {.key = "engine.poll_idle_ms",
     .flag = "--poll-idle-ms",
     .help = "Polling mode: clients are active until this long after the last request",
     .kind = Kind::kUint32,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->poll_idle_ms; },
     .min = 1,
     .max = 60'000},
};

// Benchmarking and the polling thread's own gathers.
constexpr Setting kEngineTestRows[] = {
    {.key = "engine.emulate_read_latency_us",
     .flag = "--emulate-read-latency-us",
     .help = "BENCHMARKING ONLY: every O_DIRECT read (row cache misses, tables.read_mode = "
             "direct) completes no sooner than this after it was issued (0: off)",
     .kind = Kind::kUint64,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->emulate_read_latency_us; },
     .max = 10'000'000},
    {.key = "engine.emulate_read_iops",
     .flag = "--emulate-read-iops",
     .help = "BENCHMARKING ONLY: O_DIRECT reads, all threads together, complete no faster than "
             "this many 4 KiB reads per second (0: off)",
     .kind = Kind::kUint64,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->emulate_read_iops; },
     .max = 100'000'000},
    {.key = "engine.inline_rows",
     .flag = "--inline-rows",
     .help = "Gather requests of up to this many rows on the polling thread",
     .kind = Kind::kUint64,
     .applies = kRestart,
     .server_field = [](C* c) -> void* { return &c->poll.inline_rows; },
     .max = uint64_t{1} << 32},
};

constexpr Setting kLogAndMetricsRows[] = {
    {.key = "log.level",
     .flag = "--log-level",
     .help = kLevelHelp.data(),
     .kind = Kind::kString,
     .applies = kLog,
     .field = [](S* s) -> void* { return &s->log_level; },
     .check = CheckLevel,
     .example = "debug"},
    {.key = "metrics.http_port",
     .flag = "--metrics-port",
     .help = "Serve Prometheus metrics on this loopback TCP port (0: off)",
     .kind = Kind::kUint32,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->metrics.http_port; },
     .max = 65535},
    {.key = "metrics.http_address",
     .flag = "",
     .help = "Loopback address of the metrics port",
     .kind = Kind::kString,
     .applies = kRestart,
     .field = [](S* s) -> void* { return &s->metrics.http_address; },
     .check = CheckLoopback,
     .example = "::1"},
    {.key = "metrics.textfile_dir",
     .flag = "--metrics-textfile-dir",
     .help = "Write engramd.prom for node-exporter's textfile collector into this directory",
     .kind = Kind::kString,
     .applies = kTextfile,
     .field = [](S* s) -> void* { return &s->metrics.textfile_dir; },
     .check = [](const std::string& v) { return AbsolutePath(v, true); },
     .path = true,
     .example = "/var/lib/prometheus/node-exporter"},
    {.key = "metrics.textfile_interval_seconds",
     .flag = "",
     .help = "Seconds between textfile writes",
     .kind = Kind::kUint32,
     .applies = kTextfile,
     .field = [](S* s) -> void* { return &s->metrics.textfile_interval_s; },
     .min = 1,
     .max = 3600},
};

// The sections in the order of docs/operations.md.
constexpr std::span<const Setting> kSections[] = {
    kTablesRows, kMemoryRows, kHotSetRows,     kSocketRows,        kAccessRows,
    kLimitsRows, kEngineRows, kEngineTestRows, kLogAndMetricsRows,
};

}  // namespace

const std::vector<Setting>& Settings() {
  static const auto* all = [] {
    auto* rows = new std::vector<Setting>;
    for (std::span<const Setting> section : kSections) {
      rows->insert(rows->end(), section.begin(), section.end());
    }
    return rows;
  }();
  return *all;
}

}  // namespace engram
