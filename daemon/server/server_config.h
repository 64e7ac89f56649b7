// What engramd is told to do: tables to serve, the socket, who may connect, limits and polling.
// The settings table of daemon/ops/config_file.h fills it from the configuration file and the
// flags; the member initialisers below are the defaults it documents.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "store/memory_budget.h"
#include "tables/table.h"

namespace engram {

// Every bound a client can push on. Going past one is an error the client sees
// (ResourceExhausted), never a crash.
struct Limits {
  uint32_t max_clients = 64;                            // sessions at once
  uint32_t max_inflight = 256;                          // requests in flight per session
  uint64_t max_rows_per_request = 131072;               // rows in one request
  uint64_t max_arena_bytes = uint64_t{1} << 30;         // data region of one session
  uint64_t max_total_arena_bytes = uint64_t{16} << 30;  // all sessions together
  uint64_t default_data_bytes = uint64_t{64} << 20;     // when the client asks for 0
  uint32_t default_slots = 64;                          // when the client asks for 0
  uint64_t prefetch_queue_rows = 262144;   // rows queued for prefetch, all sessions (0: off)
  uint64_t prefetch_session_rows = 32768;  // rows of one session waiting for prefetch
  uint32_t max_device_sessions = 2;        // sessions submitting from a device at once (0: none)
  bool operator==(const Limits&) const = default;
};

// How the poller waits for submissions.
struct PollOptions {
  // The poller spins over the submission rings this long after the last work before it sleeps;
  // the spell adapts between min and max to how soon work arrived after the last sleep.
  uint64_t spin_min_ns = 20'000;
  uint64_t spin_max_ns = 500'000;
  // Requests of at most this many rows are gathered on the polling thread itself (saves a
  // hand-off to a gather worker; larger ones would stall other sessions).
  uint64_t inline_rows = 0;
  // Learn the period of regular bursts of requests (decode steps on a clock) and be awake,
  // spinning, from shortly before the next one is due (daemon/server/pace.h). Off by default:
  // measured, it cut a lone engine's p50 but not its p99, at three times the daemon's CPU.
  bool pace = false;
  // Polling mode: while clients are active (a request reached the poller within hold_idle_ns),
  // the poller and hold_cores - 1 request threads spin instead of sleeping, so that no request
  // of a paced step waits for a sleeping thread's wake-up; when the clients go quiet they sleep
  // as without it. 0: off. engramd sets it from engine.poll_mode and engine.poll_cores
  // (PollCores).
  uint32_t hold_cores = 0;
  uint64_t hold_idle_ns = 200'000'000;
  bool operator==(const PollOptions&) const = default;
};

// One source of tables: a checkpoint directory or a packed table file.
struct TableSource {
  std::string path;
  std::optional<RowRange> rows;  // per-rank copy: the rows it holds
  bool operator==(const TableSource&) const = default;
};

struct ServerConfig {
  std::vector<TableSource> sources;
  std::vector<uint32_t> layers;  // serve only these layers (empty: all found)
  bool check_holes = true;

  std::string socket_path = "/run/engramd/engramd.sock";
  uint32_t socket_mode = 0660;
  std::string socket_group;  // empty: the daemon's group
  // A listening socket passed by systemd socket activation (-1: bind socket_path). The
  // socket unit owns its path, so it is neither created nor removed.
  int listen_fd = -1;
  // Peers allowed by SO_PEERCRED besides root and the daemon's own uid, which always are
  // (IsAdmitted): these uids, and members of these groups.
  std::vector<uid_t> allow_uids;
  std::vector<gid_t> allow_gids;
  // Peers who may run the control requests that change what every client sees (warm, evict;
  // control.cc keeps the list), besides root and the daemon's own uid, which always may: they
  // can signal or trace the daemon anyway. Matched against the peer's uid and its primary and
  // supplementary groups as the kernel recorded them at connect time.
  std::vector<uid_t> admin_uids;
  std::vector<gid_t> admin_gids;

  Limits limits;
  PollOptions poll;
  uint32_t workers = 0;  // gather workers (0: online CPUs)
  // Threads that run requests, each as the gather engine's calling thread (requests gathered
  // at the same time; the engine shares its workers between them). 0: DefaultRequestThreads().
  uint32_t request_threads = 0;
  uint64_t handshake_timeout_ns = 5'000'000'000;
  uint64_t drain_timeout_ns = 60'000'000'000;  // longest wait for in-flight I/O at shutdown
  // [memory] budget: what engramd.service may use, page cache included (0: unbounded). systemd
  // enforces it (`engramd --memory-dropin`); engramd reports against it (cgroup_memory.h).
  uint64_t memory_budget = 0;
  // How memory_budget is split (MemoryNeedsOf, PlanMemory), fixed at start: the arenas' share
  // bounds the handshake, the store's the row store.
  MemoryPlan memory_plan;
  // Tables served from storage are read with O_DIRECT (engine.read_mode = direct): there is no
  // page cache for a prefetch to warm. Set from engine.read_mode.
  bool storage_read_direct = false;
  // The row cache's hot set on disk (daemon/server/hot_set.h): where ("" none), how often it is
  // written (seconds; 0: only at stop) and how many rows it keeps at most.
  std::string hot_set_path;
  uint32_t hot_set_interval_s = 300;
  uint64_t hot_set_rows = uint64_t{1} << 20;
  // A SIGHUP checks that the server took every live setting (reload.h).
  bool operator==(const ServerConfig&) const = default;
};

// What engramd holds besides the row store under `config`, as PlanMemory needs it: the process
// (a base, each thread, page tables, and each request thread's bookkeeping for the largest
// request), the threads' O_DIRECT, miss and prefetch buffers, and the arenas' own bound.
// `budget` is [memory] budget, `mem_total` the machine's memory (0: unknown).
MemoryNeeds MemoryNeedsOf(const ServerConfig& config, uint64_t budget, uint64_t mem_total);

// The gather engine's O_DIRECT bounce area per thread under `budget`: the engine's default
// (4 MiB) unless the budget is small, then 1/256 of it, at least 256 KiB.
uint32_t DirectBounceBytes(uint64_t budget);

// engine.poll_mode as engramd reads it.
enum class PollMode { kAuto, kOn, kOff };

// PollMode from its setting's text ("auto", "on", "off"); InvalidArgument names the value.
absl::StatusOr<PollMode> ParsePollMode(const std::string& text);

// The cores that spin while clients are active (PollOptions::hold_cores) on a machine of `cpus`
// online CPUs: `cores` when set (on or auto), else one in eight of the CPUs, at least 2 (the
// poller and one request thread); auto polls only from kAutoPollMinCpus CPUs up, where those
// cores are at most an eighth of the machine, and leaves smaller machines to sleep (their
// cores are needed by the ranks and the gather workers). off: 0.
inline constexpr uint32_t kAutoPollMinCpus = 16;
uint32_t PollCores(PollMode mode, uint32_t cores, uint32_t cpus);

// The largest uid or gid a configuration may name: (uid_t)-1 means "no id" to the kernel.
inline constexpr uint32_t kMaxId = UINT32_MAX - 1;

// May a peer with `uid`, primary group `gid` and supplementary `groups` connect to a daemon
// running as `own_uid`? Root and `own_uid` always may, whatever the allow lists say; so do the
// uids in allow_uids and the members of allow_gids.
bool IsAdmitted(const ServerConfig& config, uid_t own_uid, uid_t uid, gid_t gid,
                const std::vector<gid_t>& groups);

// Who may connect, for people: "root, uid 998 (engramd's own), uids 1000, members of gids 27".
std::string DescribeAdmitted(const ServerConfig& config, uid_t own_uid);

// `uids` with root and `own_uid` added, sorted, each once: the uids a list admits in effect.
std::vector<uid_t> AlwaysAndListed(uid_t own_uid, std::vector<uid_t> uids);

// Is a peer with `uid`, primary group `gid` and supplementary `groups` an administrator of a
// daemon running as `own_uid`? Root and `own_uid` always are.
bool IsAdministrator(const ServerConfig& config, uid_t own_uid, uid_t uid, gid_t gid,
                     const std::vector<gid_t>& groups);

// The administrators for people: "root, uid 998 (engramd's own), uids 1000,1001, members of
// gids 27".
std::string DescribeAdministrators(const ServerConfig& config, uid_t own_uid);

}  // namespace engram
