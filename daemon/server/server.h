// The engramd server: listens on the Unix socket, runs the handshake, hands each session a sealed
// arena, polls the submission rings and runs the requests on the gather engine.
//
//   auto server = engram::Server::Create(
//       config, std::move(tables), std::move(engine),
//       [](ServerView* view) { return std::make_unique<Control>(view); });  // daemon/ops
//   absl::Status s = (*server)->Run();  // until SIGTERM/SIGINT or Stop(): drains, then returns
#pragma once

#include <sys/epoll.h>
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/unique_fd.h"
#include "daemon/server/control_handler.h"
#include "daemon/server/hot_set.h"
#include "daemon/server/pending_handshakes.h"
#include "daemon/server/prefetcher.h"
#include "daemon/server/request_pool.h"
#include "daemon/server/server_config.h"
#include "daemon/server/server_view.h"
#include "daemon/server/session.h"
#include "daemon/server/socket_claim.h"
#include "daemon/server/table_state.h"
#include "gather/gather_engine.h"
#include "protocol/codec.h"
#include "store/row_store.h"
#include "tables/table.h"
#include "tables/table_watch.h"

namespace engram {

// A client socket engramd bound, and its claim on the path (socket_claim.h): whoever holds the
// claim removes the path when it goes, if the path is still this socket.
struct BoundSocket {
  UniqueFd fd;
  std::unique_ptr<SocketClaim> claim;
};

// Binds and listens on config.socket_path (socket.mode, socket.group) under a SocketClaim,
// waiting for an engramd still stopping there and clearing a stale socket a dead daemon left;
// refuses a path that is not a socket or where another engramd answers. What Server::Create does
// without socket activation; engramd's start calls it first, so that the socket answers while
// the tables open (daemon/ops/starting_gate.h), then hands socket and claim over.
absl::StatusOr<BoundSocket> BindClientSocket(const ServerConfig& config);

// What BindClientSocket refuses, looked at without making or binding anything: the
// path's length, socket.group naming no group, a socket directory that is missing and cannot be
// made, another engramd serving on the path (SocketClaim::Check), a path that is not a socket.
// BindClientSocket runs it first, so --check-config, which runs it alone, refuses alike, in the
// same words. May take 2 s while something answers on the path (it may be stopping).
absl::Status CheckClientSocket(const ServerConfig& config);

class Server : public ServerView {
 public:
  // The control plane (control requests, metrics, systemd notifications, reloads) over the
  // server's view: operations' handler, made by engramd's main (daemon/ops/control.h).
  using MakeControl = std::function<std::unique_ptr<ControlHandler>(ServerView* view)>;
  // Binds the socket (refusing to take over one that a live engramd answers on). The tables
  // must already be registered with the engine.
  static absl::StatusOr<std::unique_ptr<Server>> Create(const ServerConfig& config,
                                                        std::vector<std::unique_ptr<Table>> tables,
                                                        std::unique_ptr<GatherEngine> engine,
                                                        const MakeControl& make_control);
  ~Server();

  // Serves until SIGTERM or SIGINT arrives (they must be blocked in every thread; Run reads
  // them through a signalfd) or Stop() is called; then stops accepting, finishes the requests
  // in flight, tells every client and returns.
  absl::Status Run();
  // Asks Run() to stop. Thread-safe, async-signal-safe.
  void Stop();
  // Serves the tables through a row store (resident and cached tiers); before Run().
  void SetRowStore(std::unique_ptr<RowStore> store) { store_ = std::move(store); }
  // The row cache's hot set (hot_set.h): the keeper writes it while serving and once more at
  // stop (before the store goes); the warmer (null: none) queues its rows for the prefetcher
  // once it runs. After SetRowStore, before Run.
  void SetHotSet(std::unique_ptr<HotSetKeeper> keeper, std::unique_ptr<HotSetWarmer> warmer) {
    hot_set_keeper_ = std::move(keeper);
    hot_set_warmer_ = std::move(warmer);
  }
  const RowStore* row_store() const { return store_.get(); }
  // The claim on the socket path engramd bound before the server was made (config.listen_fd):
  // released, removing the path if still this socket, as the server stops listening. Before
  // Run().
  void SetSocketClaim(std::unique_ptr<SocketClaim> claim) { socket_claim_ = std::move(claim); }

  // ServerView: what the operator side sees.
  const ServerConfig& config() const override { return config_; }
  void ApplyLiveSettings(const std::function<void(ServerConfig*)>& apply) override;
  uid_t own_uid() const override { return own_uid_; }
  uint64_t start_ns() const override { return start_ns_; }
  bool draining() const override { return draining_.load(); }
  uint64_t requests_in_flight() const override { return inflight_total_.load(); }
  uint64_t total_arena_bytes() const override { return total_arena_bytes_.load(); }
  uint64_t poller_heartbeat_ns() const override {
    return poller_heartbeat_ns_.load(std::memory_order_relaxed);
  }
  uint64_t pace_windows() const override { return pace_windows_.load(); }
  uint64_t pace_windows_caught() const override { return pace_windows_caught_.load(); }
  bool poll_holding() const override {
    return NowNs() < poll_hold_until_.load(std::memory_order_relaxed);
  }
  uint64_t poller_spin_ns() const override { return poller_spin_ns_.load(); }
  uint64_t request_threads_spin_ns() const override {
    return requests_->spin_ns() + large_requests_->spin_ns();
  }
  std::span<const std::unique_ptr<Table>> tables() const override { return tables_; }
  absl::Status TableHealth(size_t index) const override;
  std::vector<TableGatherStats> EngineStats() const override { return engine_->Stats(); }
  void AddStoreControlFields(const std::string& command, nlohmann::json* out) const override {
    if (store_ != nullptr) store_->AddControlFields(command, out);
    if (prefetcher_ != nullptr) prefetcher_->AddControlFields(command, out);
  }
  void AddStoreMetrics(MetricSink* e) const override {
    if (store_ != nullptr) store_->AddMetrics(e);
    if (prefetcher_ != nullptr) prefetcher_->AddMetrics(e);
  }
  // The prefetch queue and its thread (null until Run() starts them).
  Prefetcher* prefetcher() { return prefetcher_.get(); }
  std::vector<std::shared_ptr<Session>> Sessions() const override;
  absl::StatusOr<ResidentLoadStatus> ResidentLoad(uint32_t layer, LoadAction action) const override;

 private:
  Server();
  absl::Status Bind();  // server_socket.cc
  // One event of the control loop; true when it asks the daemon to stop.
  bool HandleControlEvent(const epoll_event& event);
  absl::Status Shutdown();
  // The poller (poller.cc): PollerLoop takes these steps over the state of one poller thread.
  struct PollerState;
  void PollerLoop();
  void RefreshPollerSessions(PollerState& st);
  uint32_t DrainAllSessions(PollerState& st);
  void CountBurst(PollerState& st, uint64_t now, uint32_t row_work);
  bool SpinThroughPaceWindow(PollerState& st, uint64_t now);
  bool KeepSpinning(PollerState& st, uint64_t now);
  void EndSpin(PollerState& st, uint64_t now);
  void SleepOnDoorbells(PollerState& st, uint64_t now);
  bool ReadDoorbells(PollerState& st, int events);
  uint32_t DrainSession(const std::shared_ptr<Session>& session, engram_sqe* scratch,
                        uint32_t* ret_row_work);
  // Polling mode: a request that gathered rows keeps the poller and hold_cores - 1 request
  // threads spinning until hold_idle_ns from `now`. Only such a request does: an empty, no-op,
  // refused or failed request, or a prefetch, costs its sender its own request, never the
  // node's cores. Any thread.
  void HoldPolling(uint64_t now);
  // Dispatch (dispatch.cc): admits, decodes, runs and finishes one submission.
  void Dispatch(const std::shared_ptr<Session>& session, const engram_sqe& sqe);
  // PREFETCH: the poller checks the session's bound and hands the entry over (PostPrefetch);
  // the prefetcher's intake thread decodes it, queues its rows and completes it (CheckPrefetch).
  void PostPrefetch(const std::shared_ptr<Session>& session, const engram_sqe& sqe, uint64_t start);
  protocol::RequestContext RequestContextOf(Session& session) const;
  void CheckPrefetch(const std::shared_ptr<Session>& session, const engram_sqe& sqe, uint64_t start,
                     uint64_t claimed);
  // Decodes and runs one submission on the calling thread. `admitted_rows` != 0: Admit() ran
  // already for that many rows.
  void Execute(const std::shared_ptr<Session>& session, const engram_sqe& sqe, uint64_t start,
               uint64_t admitted_rows);
  // Takes a place for a request of `rows` rows within the session's limits (in flight, row
  // budget); false when it completed the request with the refusal.
  bool Admit(Session& session, uint64_t ticket, uint32_t slot, uint64_t rows, uint64_t start);
  void Finish(Session& session, uint64_t ticket, uint32_t slot, absl::Status status, uint64_t rows,
              uint64_t admitted_rows, uint64_t start, bool rows_written = true);
  uint64_t RowBudget(Session& session) const;
  void Unanswerable(Session& session, const std::string& message, uint64_t start);
  // The handshake (handshake.cc): a connection accepted, checked and given its session.
  void Accept();
  void Handshake(int fd);
  // The session a HELLO may have under the limits, or the refusal (code, message).
  bool GrantArena(const engram_msg_hello& hello, protocol::ArenaLayout* ret_layout,
                  int32_t* ret_code, std::string* ret_message) const;
  // ENGRAM_FEATURE_DEVICE_SUBMIT for the peer of `fd`: administrators only, at most
  // limits.max_device_sessions at once; else the refusal (code, message naming the client).
  bool GrantDeviceSubmit(int fd, const engram_msg_hello& hello, const PeerInfo& peer,
                         int32_t* ret_code, std::string* ret_message) const;
  void HandleMessage(const std::shared_ptr<Session>& session);
  void Disconnect(const std::shared_ptr<Session>& session, const char* why);
  // After a reload (live_settings.cc): sessions whose peer the allow lists no longer admit are
  // stopped and closed, each logged naming its client.
  void CloseSessionsNoLongerAdmitted();
  void Refuse(int fd, int32_t code, const std::string& message);
  void DropPending(int fd, const char* why);
  bool PeerAllowed(int fd, PeerInfo* ret_peer, std::string* ret_why);
  void SendTables(Session& session, uint32_t request_id);
  void SendStats(Session& session, uint32_t request_id);
  // MAP_TABLE (table_map.cc): a resident table's sealed memfd, or an error naming why not.
  void SendRowCacheMap(Session& session, const engram_msg_header& header, const Table& table,
                       size_t index);
  void SendTableMap(Session& session, const engram_msg_header& header, const uint8_t* message);
  void SendResidentMap(Session& session, const engram_msg_header& header, const Table& table,
                       const ResidentTable& resident, size_t index);
  // The session's touch page (made and handed to the row store on first use), or why there is
  // none.
  absl::StatusOr<int> TouchPageFd(Session& session);
  void SendError(Session& session, int32_t code, const std::string& message, uint32_t request_id);
  absl::Status Gather(const GatherBatch& batch) {
    return store_ != nullptr ? store_->Gather(batch) : engine_->Gather(batch);
  }
  void PublishSessions();
  void Kick();
  void WatchTables();
  void ReportTableChanges(const std::vector<std::string>& messages);

  ServerConfig config_;
  std::vector<std::unique_ptr<Table>> tables_;
  std::vector<protocol::TableBounds> bounds_;
  // Before the threads' owners below: they close after every thread that could use them stopped.
  UniqueFd listen_fd_;
  std::unique_ptr<SocketClaim> socket_claim_;  // null: a socket systemd passed
  UniqueFd control_epoll_;
  UniqueFd poller_epoll_;
  UniqueFd kick_fd_;  // wakes the poller: session list changed or shutdown
  UniqueFd stop_fd_;  // Stop()
  UniqueFd signal_fd_;

  // Set by Run(): which tables' files changed. Before engine_ and requests_, so that it outlives
  // every request thread that checks it.
  std::unique_ptr<TableWatch> watch_;
  uint64_t last_recheck_ns_ = 0;
  // Set by Run(): what clients reading resident tables in place check (table_state.h); null
  // when the kernel refused it, and then MAP_TABLE is refused. Control thread only, but its
  // words are read by clients at any time.
  std::unique_ptr<TableStatePage> table_states_;
  std::string table_states_error_;
  std::unique_ptr<GatherEngine> engine_;
  std::unique_ptr<RowStore> store_;               // null: every table from storage
  std::unique_ptr<Prefetcher> prefetcher_;        // after store_ and watch_: stops before them
  std::unique_ptr<HotSetKeeper> hot_set_keeper_;  // after store_: writes before it goes
  std::unique_ptr<HotSetWarmer> hot_set_warmer_;  // after prefetcher_: stops before it
  std::unique_ptr<RequestPool> requests_;        // after engine_ and store_: its threads stop first
  std::unique_ptr<RequestPool> large_requests_;  // requests larger than a decode step

  // Control thread only.
  std::unordered_map<int, std::shared_ptr<Session>> by_fd_;
  PendingHandshakes pending_;  // accepted, no HELLO yet; bounded apart from the sessions
  uint64_t next_session_id_ = 1;
  std::atomic<uint64_t> total_arena_bytes_{0};  // written by the control thread, read by metrics

  // Shared with the poller: the session list, republished on every change.
  mutable std::mutex sessions_mutex_;
  std::vector<std::shared_ptr<Session>> sessions_;
  std::atomic<uint64_t> sessions_generation_{0};

  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> inflight_total_{0};  // requests handed to the engine, all sessions
  // Shutdown waits here for inflight_total_ to reach 0; the last request to finish while
  // draining_ is set notifies it.
  std::mutex drain_mutex_;
  std::condition_variable drained_;
  std::thread poller_;
  uid_t own_uid_ = 0;
  log::RateLimit garbage_log_{5};
  log::RateLimit handshake_log_{5};  // refused and dropped handshakes, all peers together
  uint64_t start_ns_ = 0;
  std::atomic<uint64_t> poller_heartbeat_ns_{0};  // the poller's last pass (watchdog)
  std::atomic<uint64_t> pace_windows_{0};         // windows spun through ahead of a burst
  std::atomic<uint64_t> pace_windows_caught_{0};  // ... that the burst came in
  std::atomic<uint64_t> poller_spin_ns_{0};       // the poller's passes that found no work
  std::atomic<uint64_t> poll_hold_until_{0};      // polling mode holds cores until then
  std::unique_ptr<ControlHandler> control_;       // first member torn down (~Server)
};

}  // namespace engram
