// systemd notifications, the watchdog ping and the metrics textfile (watchdog.h).
#include "daemon/ops/watchdog.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "base/escape.h"
#include "base/log.h"
#include "daemon/ops/metrics.h"
#include "daemon/ops/notify.h"

namespace engram {

std::string Watchdog::StatusLine() const {
  return absl::StrFormat("Serving %u table(s) to %u client(s) on %s", server_.tables().size(),
                         server_.Sessions().size(), EscapeBytes(server_.config().socket_path));
}

void Watchdog::Start() {
  watchdog_ns_ = notify::WatchdogUsec() * 1000;
  last_status_ = StatusLine();
  notify::Send("READY=1\nSTATUS=" + last_status_);
  last_ping_ns_ = NowNs();
  notify::Send("WATCHDOG=1");
  Tick();
}

int Watchdog::WaitMs() const {
  int64_t ms = -1;
  auto lower = [&](int64_t v) { ms = ms < 0 ? v : std::min(ms, v); };
  if (watchdog_ns_ != 0) lower(std::max<int64_t>(1, watchdog_ns_ / 4 / 1'000'000));
  if (!textfile_dir_.empty()) lower(int64_t{textfile_interval_s_} * 1000);
  lower(2000);  // STATUS= stays current within two seconds
  return static_cast<int>(ms);
}

void Watchdog::Ping(uint64_t now) {
  // The poller is the part that can wedge (a stuck ring, a blocked engine): ping only while it
  // has run recently. An idle poller sleeps up to a second between passes, so a pass within two
  // seconds (or half the watchdog interval, when that is longer) counts as alive.
  const uint64_t beat = server_.poller_heartbeat_ns();
  if (now - std::min(now, beat) < std::max<uint64_t>(watchdog_ns_ / 2, 2'000'000'000)) {
    notify::Send("WATCHDOG=1");
    last_ping_ns_ = now;
    poller_stall_reported_ = false;
  } else if (!poller_stall_reported_) {
    log::Error("the request poller has not run for {} ms; withholding the watchdog ping",
               (now - beat) / 1'000'000);
    poller_stall_reported_ = true;
  }
}

void Watchdog::Tick() {
  const uint64_t now = NowNs();
  if (watchdog_ns_ != 0 && now - last_ping_ns_ >= watchdog_ns_ / 2) Ping(now);
  if (std::optional<std::string> line = memory_watch_.Check(ReadMemoryReport(), now)) {
    log::Warning("{}", *line);
  }
  const std::string status = StatusLine();
  if (status != last_status_) {
    notify::Send("STATUS=" + status);
    last_status_ = status;
  }
  if (!textfile_dir_.empty() &&
      now - last_textfile_ns_ >= uint64_t{textfile_interval_s_} * 1'000'000'000) {
    WriteTextfile();
  }
}

void Watchdog::WriteTextfile() {
  if (textfile_dir_.empty()) return;
  last_textfile_ns_ = NowNs();
  const double now_unix_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string text =
      render_metrics_() + metrics::TextfileFreshness(now_unix_s, textfile_interval_s_);
  if (absl::Status st = metrics::WriteTextfile(textfile_dir_, text); !st.ok()) {
    log::Warning("{}", std::string(st.message()));
  }
}

void Watchdog::set_textfile(const std::string& dir, uint32_t interval_s) {
  if (!textfile_dir_.empty() && textfile_dir_ != dir) {
    if (absl::Status st = metrics::RemoveTextfile(textfile_dir_); !st.ok()) {
      log::Warning("{}", std::string(st.message()));
    }
  }
  textfile_dir_ = dir;
  textfile_interval_s_ = interval_s;
}

void Watchdog::Reloading() { notify::Send("RELOADING=1\nSTATUS=Reloading the configuration"); }

void Watchdog::Reloaded() { notify::Send("READY=1\nSTATUS=" + StatusLine()); }

void Watchdog::Stopping() { notify::Send("STOPPING=1\nSTATUS=Finishing requests in flight"); }

}  // namespace engram
