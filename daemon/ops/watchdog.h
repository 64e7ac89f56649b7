// The control loop's periodic work for systemd and node-exporter: READY=/STATUS= notifications,
// the watchdog ping (withheld when the request poller stops making passes, so systemd restarts
// a wedged daemon), and the metrics textfile. Control thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "daemon/ops/cgroup_memory.h"
#include "daemon/ops/config_file.h"
#include "daemon/server/server_view.h"

namespace engram {

class Watchdog {
 public:
  Watchdog(const ServerView& server, std::function<std::string()> render_metrics)
      : server_(server), render_metrics_(std::move(render_metrics)) {}

  // Tells systemd the daemon is ready (with the first STATUS=) and pings once.
  void Start();
  // How long the control loop may sleep (ms; -1 forever) before Tick() has work.
  int WaitMs() const;
  void Tick();
  // RELOADING=1 before a reload; READY=1 with a fresh STATUS= after it.
  void Reloading();
  void Reloaded();
  void Stopping();
  // Writes the metrics textfile now, if one is configured (Tick writes it every interval).
  void WriteTextfile();
  uint64_t interval_ns() const { return watchdog_ns_; }
  // The textfile settings (SIGHUP may change them), and those it writes with. A textfile that
  // is switched off or moved is removed from its old directory: left there, node-exporter would
  // go on exporting its last engram_up 1.
  void set_textfile(const std::string& dir, uint32_t interval_s);
  const std::string& textfile_dir() const { return textfile_dir_; }
  uint32_t textfile_interval_s() const { return textfile_interval_s_; }

 private:
  std::string StatusLine() const;
  void Ping(uint64_t now);

  const ServerView& server_;
  std::function<std::string()> render_metrics_;
  MemoryThrottleWatch memory_watch_;  // throttling of the cgroup: a line a minute at most
  std::string textfile_dir_;
  uint32_t textfile_interval_s_ = 0;
  uint64_t watchdog_ns_ = 0;
  uint64_t last_ping_ns_ = 0;
  uint64_t last_textfile_ns_ = 0;
  std::string last_status_;
  bool poller_stall_reported_ = false;
};

}  // namespace engram
