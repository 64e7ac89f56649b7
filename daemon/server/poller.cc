// The poller: one thread that spins over every session's submission ring, sleeps on their
// doorbells when idle, paces itself to regular bursts, and hands what it finds to Dispatch.
#include <errno.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include "base/clock.h"
#include "daemon/server/pace.h"
#include "daemon/server/server.h"
#include "daemon/server/server_internal.h"

namespace engram {
namespace {

// A device cannot ring a doorbell, so while a device-submitting session is open the poller
// spins; once none of them has submitted for kDeviceIdleNs it sleeps instead, in timed sleeps
// of kDeviceNapMinNs growing to kDeviceNapMaxNs, and spins again at the next submission. The
// first submission after such an idle spell waits at most kDeviceNapMaxNs (plus the thread's
// 10 us timer slack) longer than it would on a spinning poller (docs/gpu.md).
constexpr uint64_t kDeviceIdleNs = 50'000'000;
constexpr uint64_t kDeviceNapMinNs = 50'000;
constexpr uint64_t kDeviceNapMaxNs = 1'000'000;

// epoll_wait until `deadline_ns` (NowNs()) at the latest, to the microsecond where the kernel
// has epoll_pwait2 (Linux 5.11), else rounded down to the millisecond.
int EpollWaitUntil(int epoll_fd, epoll_event* events, int max_events, uint64_t deadline_ns) {
  static std::atomic<bool> no_pwait2{false};
  const uint64_t now = NowNs();
  const uint64_t left = deadline_ns > now ? deadline_ns - now : 0;
  if (!no_pwait2.load(std::memory_order_relaxed)) {
    const timespec ts{.tv_sec = time_t(left / 1'000'000'000),
                      .tv_nsec = long(left % 1'000'000'000)};
    const int n = epoll_pwait2(epoll_fd, events, max_events, &ts, nullptr);
    if (n >= 0 || errno != ENOSYS) return n;
    no_pwait2.store(true, std::memory_order_relaxed);
  }
  return epoll_wait(epoll_fd, events, max_events, int(left / 1'000'000));
}

}  // namespace

// What one poller thread keeps from pass to pass.
struct Server::PollerState {
  std::vector<std::shared_ptr<Session>> snapshot;  // the sessions it polls
  uint64_t generation = ~uint64_t{0};              // sessions_generation_ of the snapshot
  engram_sqe scratch[32];
  epoll_event events[64];
  uint64_t spin_ns = 0;    // the adaptive spell of spinning after the last work
  uint64_t last_work = 0;  // the last pass that found work, or the last wake-up
  size_t device_sessions = 0;
  uint64_t last_device_work = 0;  // a device-submitting session's last submission
  uint64_t device_nap_ns = kDeviceNapMinNs;
  // Paced work (pace.h).
  PacePredictor pace;
  std::optional<PacePredictor::SpinWindow> window;  // of the next expected burst
  uint64_t last_busy = 0;        // the last pass that found entries asking for rows
  uint64_t pace_spin_until = 0;  // spinning through a predicted window until then
  uint32_t burst_requests = 0, last_burst_requests = 0;
  uint32_t row_work = 0;            // entries of the last pass that asked for rows
  uint64_t timer_late_ns = 50'000;  // how late this thread's timed sleeps end, on average
  uint64_t spin_since = 0;          // the first of the passes since the last work found none
};

void Server::PollerLoop() {
  PollerState st;
  const PollOptions& poll = config_.poll;
  st.spin_ns = poll.spin_min_ns;
  st.last_work = NowNs();
  // Paced work (pace.h): when the bursts of requests are regular, sleep only until shortly
  // before the next is due, then spin (with up to two request threads) until it comes or its
  // window closes. Timers of this thread fire within 10 µs, not 50.
  prctl(PR_SET_TIMERSLACK, 10'000UL, 0, 0, 0);
  while (true) {
    RefreshPollerSessions(st);
    const bool draining = draining_.load(std::memory_order_acquire);
    const uint32_t work = DrainAllSessions(st);
    if (draining) {
      if (work == 0) break;  // the final sweep found the rings empty
      continue;
    }
    const uint64_t now = NowNs();
    poller_heartbeat_ns_.store(now, std::memory_order_relaxed);
    if (work != 0) {
      EndSpin(st, now);
      CountBurst(st, now, st.row_work);
      continue;
    }
    if (st.spin_since == 0) {
      st.spin_since = now;
    } else if (now - st.spin_since >= 1'000'000) {
      EndSpin(st, now);  // counted as it passes, so that a long spell shows
      st.spin_since = now;
    }
    if (KeepSpinning(st, now)) {
      CpuRelax();
      continue;
    }
    if (SpinThroughPaceWindow(st, now)) continue;
    EndSpin(st, now);
    SleepOnDoorbells(st, now);
  }
  for (const auto& s : st.snapshot) s->SetNeedWakeup(true);  // nobody polls any more
}

// Takes a new snapshot of the sessions when the set changed.
void Server::RefreshPollerSessions(PollerState& st) {
  if (st.generation == sessions_generation_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(sessions_mutex_);
  st.snapshot = sessions_;
  st.generation = sessions_generation_.load(std::memory_order_acquire);
  const size_t before = st.device_sessions;
  st.device_sessions = std::count_if(st.snapshot.begin(), st.snapshot.end(),
                                     [](const auto& s) { return s->device_submit(); });
  if (st.device_sessions > before) st.last_device_work = NowNs();  // a new one starts awake
}

// One pass over every open session's ring; the requests (and garbage tails) it found, and in
// st.row_work those of them that ask for rows.
uint32_t Server::DrainAllSessions(PollerState& st) {
  uint32_t work = 0;
  st.row_work = 0;
  for (const auto& s : st.snapshot) {
    if (s->closing()) continue;
    const uint32_t n = DrainSession(s, st.scratch, &st.row_work);
    if (n != 0 && s->device_submit()) {
      st.last_device_work = NowNs();
      st.device_nap_ns = kDeviceNapMinNs;
    }
    work += n;
  }
  return work;
}

// Whether the poller spins on after a pass that found no work: within its adaptive spell, a
// pace window, while a device-submitting session is awake, or in polling mode while clients
// are active (a request gathered rows within hold_idle_ns: HoldPolling).
bool Server::KeepSpinning(PollerState& st, uint64_t now) {
  const PollOptions& poll = config_.poll;
  const bool device_awake = st.device_sessions > 0 && now - st.last_device_work < kDeviceIdleNs;
  const bool held = poll.hold_cores != 0 && !st.snapshot.empty() &&
                    now < poll_hold_until_.load(std::memory_order_relaxed);
  return now - st.last_work < st.spin_ns || now < st.pace_spin_until || device_awake || held;
}

void Server::HoldPolling(uint64_t now) {
  const PollOptions& poll = config_.poll;
  if (poll.hold_cores == 0) return;
  const uint64_t before =
      poll_hold_until_.exchange(now + poll.hold_idle_ns, std::memory_order_relaxed);
  requests_->Hold(poll.hold_cores - 1, now + poll.hold_idle_ns);
  // A hold that starts finds the poller perhaps asleep (the request ran longer than its spell):
  // woken, it spins from here on instead of at the next doorbell.
  if (before <= now) Kick();
}

// The passes since st.spin_since found nothing: count them as the poller's spin.
void Server::EndSpin(PollerState& st, uint64_t now) {
  if (st.spin_since == 0) return;
  poller_spin_ns_.fetch_add(now - st.spin_since, std::memory_order_relaxed);
  st.spin_since = 0;
}

// A pass found work: the first after an idle gap starts a burst the pace predictor learns from.
// Only entries that ask for rows count: empty and no-op entries teach the pace nothing, so a
// client sending them on a clock gets no spin windows ahead of them.
void Server::CountBurst(PollerState& st, uint64_t now, uint32_t row_work) {
  st.last_work = now;
  if (row_work == 0) return;
  if (config_.poll.pace && now - st.last_busy >= st.pace.options().idle_gap_ns) {
    st.pace.OnBurst(now);
    st.last_burst_requests = st.burst_requests;
    st.burst_requests = 0;
    if (now < st.pace_spin_until) {
      pace_windows_caught_.fetch_add(1, std::memory_order_relaxed);
      requests_->EndPrewake();
    }
    st.pace_spin_until = 0;
  }
  st.burst_requests += row_work;
  st.last_busy = now;
}

// True when the window of the next expected burst is open, or closer than a timed sleep could
// wake for: the poller spins through it, with request threads.
bool Server::SpinThroughPaceWindow(PollerState& st, uint64_t now) {
  st.window.reset();
  if (config_.poll.pace) st.window = st.pace.Window(now);
  if (!st.window || now + st.timer_late_ns < st.window->wake_ns || now >= st.window->until_ns) {
    return false;
  }
  st.pace_spin_until = st.window->until_ns;
  pace_windows_.fetch_add(1, std::memory_order_relaxed);
  // At most two request threads: every thread spinning here takes a core from the ranks
  // and the gather workers (waking every worker that helped, and a request thread per
  // request, made a 1-rank step from storage 2-3x slower on the 16-core host).
  requests_->Prewake(std::clamp<uint32_t>(st.last_burst_requests, 1, 2), st.window->until_ns);
  return true;
}

// Going to sleep: ask clients to ring, then look once more (a client that published just
// before seeing the flag is picked up here instead of waiting for its doorbell), then sleep in
// epoll_wait on the doorbells and adapt the spell of spinning to how soon work came.
void Server::SleepOnDoorbells(PollerState& st, uint64_t now) {
  const PollOptions& poll = config_.poll;
  for (const auto& s : st.snapshot) s->SetNeedWakeup(true);
  bool pending = false;
  for (const auto& s : st.snapshot) pending |= !s->closing() && s->HasSubmissions();
  if (!pending && !draining_.load() &&
      st.generation == sessions_generation_.load(std::memory_order_acquire)) {
    // Sleep for at most a second, or until the next expected burst's window opens (minus
    // how late this thread's timed wake-ups come, so that it is spinning when it opens).
    const bool timed = st.window && st.window->wake_ns > now + st.timer_late_ns;
    uint64_t deadline = timed ? st.window->wake_ns - st.timer_late_ns : now + 1'000'000'000;
    if (st.device_sessions > 0) {
      // Idle device sessions: look at their rings again after a nap.
      deadline = std::min(deadline, now + st.device_nap_ns);
      st.device_nap_ns = std::min(kDeviceNapMaxNs, st.device_nap_ns * 2);
    }
    const int n = EpollWaitUntil(poller_epoll_.get(), st.events, 64, deadline);
    const uint64_t woke = NowNs();
    if (timed && n == 0 && woke >= deadline) {
      st.timer_late_ns =
          std::min<uint64_t>((7 * st.timer_late_ns + (woke - deadline)) / 8, 1'000'000);
    }
    const bool rang = ReadDoorbells(st, n);
    // Adapt the spell: work that came soon after we slept would have been caught by a longer
    // spin; long idle gaps shorten it again.
    const uint64_t gap = woke - now;
    if (rang && gap < poll.spin_max_ns) {
      st.spin_ns = std::min(poll.spin_max_ns, std::max(st.spin_ns * 2, gap * 2));
    } else {
      st.spin_ns = std::max(poll.spin_min_ns, st.spin_ns / 2);
    }
  }
  for (const auto& s : st.snapshot) s->SetNeedWakeup(false);
  st.last_work = NowNs();
}

// Clears the doorbells (and the kick) that epoll_wait returned; true when a client rang.
bool Server::ReadDoorbells(PollerState& st, int events) {
  bool rang = false;
  for (int i = 0; i < events; ++i) {
    const uint64_t tag = st.events[i].data.u64;
    uint64_t count = 0;
    if (tag == kTagKick) {
      ssize_t ignored = read(kick_fd_.get(), &count, sizeof(count));
      (void)ignored;
      continue;
    }
    for (const auto& s : st.snapshot) {
      if (s->id() == tag) {
        if (read(s->doorbell_fd(), &count, sizeof(count)) == sizeof(count)) {
          s->counters.doorbells.fetch_add(count, std::memory_order_relaxed);
          rang = true;
        }
        break;
      }
    }
  }
  return rang;
}

uint32_t Server::DrainSession(const std::shared_ptr<Session>& session, engram_sqe* scratch,
                              uint32_t* ret_row_work) {
  bool garbage = false;
  const uint32_t n = session->TakeSubmissions(scratch, 32, &garbage);
  if (garbage) {
    uint64_t suppressed = 0;
    if (garbage_log_.Allow(NowNs(), &suppressed)) {
      log::Warning(
          "{} wrote a submission ring tail beyond its {} slots; skipped ({} similar "
          "messages suppressed)",
          session->Describe(), session->arena().layout().slots, suppressed);
    }
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (scratch[i].opcode != ENGRAM_OP_NOP && scratch[i].num_rows != 0) ++*ret_row_work;
    Dispatch(session, scratch[i]);
  }
  return n + (garbage ? 1 : 0);
}

}  // namespace engram
