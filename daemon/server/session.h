// One client session on the daemon side: its socket, its arena and doorbell, the requests it
// has in flight and its counters. Completion is published from whichever thread finishes a
// request; the arena stays mapped until the last request of a closed session has finished.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/unique_fd.h"
#include "daemon/server/arena.h"
#include "engram/protocol.h"
#include "store/cache_touch.h"

namespace engram {

// What Session::ForEachCounter tells about a counter.
struct SessionCounterInfo {
  const char* field;   // the engram_session_stats field, and the JSON key
  bool grows;          // type COUNTER (else GAUGE)
  const char* metric;  // Prometheus family, "" for none; may end in {key=value}
  const char* help;
};

struct PeerInfo {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The supplementary groups of the peer of the Unix socket `fd`, as the kernel recorded them when
// the peer connected (SO_PEERGROUPS); empty if they cannot be read.
std::vector<gid_t> PeerGroups(int fd);

// The client name engramctl gives its sessions: one per call, which the control command's own
// line records (daemon/ops/control.cc).
inline constexpr char kControlClientName[] = "engramctl";

class Session {
 public:
  Session(uint64_t id, int socket_fd, std::unique_ptr<Arena> arena, int doorbell_fd,
          const PeerInfo& peer, std::string name);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  // Closes the socket and the doorbell, unmaps the arena. Runs when the last reference (the
  // server's, or a request's still in flight) goes. The touch page (which the row store folds
  // once more) stops counting into this session.
  ~Session() {
    if (touch_page != nullptr) touch_page->Attach({.name = Describe()});
  }

  uint64_t id() const { return id_; }
  int socket_fd() const { return socket_fd_.get(); }
  int doorbell_fd() const { return doorbell_fd_.get(); }
  Arena& arena() { return *arena_; }
  const PeerInfo& peer() const { return peer_; }
  const std::string& name() const { return name_; }
  // "session 7 (pid 123, uid 1000, 'vllm')": for logs and errors.
  std::string Describe() const;

  // Poller side (one thread). Copies up to `max` new submissions into `out` and consumes them
  // from the ring; returns how many. A ring whose tail is garbage (more entries than slots) is
  // skipped entirely and counted: *ret_garbage is set.
  uint32_t TakeSubmissions(engram_sqe* out, uint32_t max, bool* ret_garbage);
  bool HasSubmissions() const;
  // Raising the flag ends with a full fence, so a HasSubmissions() after it cannot miss a
  // submission whose client did not see the flag (docs/protocol.md, "Memory ordering").
  void SetNeedWakeup(bool on);

  // Any thread. Writes the outcome into the slot, queues a completion entry, increments the
  // completion counter and wakes sleeping client threads.
  // `rows_written` false: `rows` were not written into the arena (a prefetch's rows queued) and
  // are not counted as gathered.
  void Complete(uint64_t ticket, uint32_t slot, int32_t code, const char* message, uint64_t rows,
                uint64_t service_ns, bool rows_written = true);

  // Marks the session closed: its ring is no longer read and clients see it stopped.
  void MarkStopped();
  bool closing() const { return closing_.load(std::memory_order_acquire); }
  // Whether the client publishes submissions from a device (ENGRAM_FEATURE_DEVICE_SUBMIT): set
  // once, before the session is published to the poller.
  bool device_submit() const { return device_submit_; }
  void set_device_submit(bool on) { device_submit_ = on; }
  // Whether the client checks the table state page (ENGRAM_FEATURE_TABLE_STATE): only such a
  // client is sent a resident table to read in place. Set once, before the session is published.
  bool table_state() const { return table_state_; }
  void set_table_state(bool on) { table_state_ = on; }
  // Whether a cache-tier table's MAP_TABLE gets the row cache (ENGRAM_FEATURE_ROW_CACHE_MAP).
  // Set once, before the session is published.
  bool row_cache_map() const { return row_cache_map_; }
  void set_row_cache_map(bool on) { row_cache_map_ = on; }
  // Whether a resident table's MAP_TABLE carries the touch page too
  // (ENGRAM_FEATURE_RESIDENT_TOUCH). Set once, before the session is published.
  bool resident_touch() const { return resident_touch_; }
  void set_resident_touch(bool on) { resident_touch_ = on; }
  // Whether its PREFETCH entries may pin rows for a request, and ADMIT_DONE release them
  // (ENGRAM_FEATURE_ADMIT). Set once, before the session is published.
  bool admit() const { return admit_; }
  void set_admit(bool on) { admit_ = on; }
  // The session's touch page, made by its first MAP_TABLE that carries it (control thread
  // only); the row store holds it too, and folds it one last time after the session ends.
  std::shared_ptr<CacheTouchPage> touch_page;
  void set_closing() { closing_.store(true, std::memory_order_release); }

  std::atomic<uint32_t> inflight{0};
  std::atomic<uint64_t> rows_in_flight{0};  // rows of the requests admitted and not finished
  // Rows of this session's PREFETCH entries from hand-over until they leave the prefetch queue
  // (a PrefetchAccount, prefetcher.h; the prefetcher holds it while the rows are queued).
  const std::shared_ptr<std::atomic<uint64_t>> prefetch_rows =
      std::make_shared<std::atomic<uint64_t>>(0);

  // The COUNTED entries of ENGRAM_SESSION_COUNTERS and ENGRAM_SESSION_DAEMON_COUNTERS.
  struct Counters {
#define ENGRAM_SESSION_ATOMIC_(field, origin, type, metric, help) \
  ENGRAM_SESSION_COUNTED_##origin(std::atomic<uint64_t> field{0};)
    ENGRAM_SESSION_COUNTERS(ENGRAM_SESSION_ATOMIC_)
    ENGRAM_SESSION_DAEMON_COUNTERS(ENGRAM_SESSION_ATOMIC_)
#undef ENGRAM_SESSION_ATOMIC_
    std::array<std::atomic<uint64_t>, 64> latency_log2{};  // service time buckets [2^i, 2^i+1)
    std::atomic<uint64_t> latency_sum_ns{0};               // every request's service time added
  };
  Counters counters;
  // The STATS reply: the COUNTED counters read, the COMPUTED ones worked out.
  engram_wire_session_stats Stats() const;
  // Calls fn(info, value) for every counter the daemon reports of this session: those of the
  // STATS reply, then ENGRAM_SESSION_DAEMON_COUNTERS. For the JSON and metrics writers.
  void ForEachCounter(const std::function<void(const SessionCounterInfo&, uint64_t)>& fn) const;

 private:
  const uint64_t id_;
  const UniqueFd socket_fd_;
  std::unique_ptr<Arena> arena_;
  const UniqueFd doorbell_fd_;
  const PeerInfo peer_;
  const std::string name_;
  uint32_t sq_head_ = 0;  // poller-private copy of the consumed position
  std::mutex cq_mutex_;   // daemon-private: completion entries come from several threads
  std::atomic<bool> closing_{false};
  bool device_submit_ = false;
  bool table_state_ = false;
  bool row_cache_map_ = false;
  bool resident_touch_ = false;
  bool admit_ = false;
  // Only its address is used: ThreadSanitizer is told of the order the client keeps between a
  // completion and the submissions that reuse its memory (session.cc, ClientOrder*).
  const char client_order_ = 0;
};

// The level of a session's connected and closed lines: debug for engramctl's sessions, whose
// call is logged as a control command, info for every other client's.
inline log::Priority SessionLogPriority(const Session& session) {
  return session.name() == kControlClientName ? log::kDebug : log::kInfo;
}

}  // namespace engram
