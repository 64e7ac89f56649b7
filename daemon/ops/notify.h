// systemd integration without libsystemd: the sd_notify datagram protocol (READY, STATUS,
// WATCHDOG, EXTEND_TIMEOUT_USEC) and socket activation (LISTEN_FDS), both plain environment
// and socket conventions documented in sd_notify(3) and sd_listen_fds(3). Implemented here
// rather than linked: the two protocols take a few dozen lines, and engramd then runs with no
// libsystemd on hosts that lack it (the GPU hosts it is carried to, cross builds).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace engram::notify {

// Sends `state` (newline-separated assignments, e.g. "READY=1\nSTATUS=serving") to the socket
// named by $NOTIFY_SOCKET. Returns false when there is no such socket or sending failed; the
// daemon carries on either way (not running under systemd, or systemd went away).
bool Send(const std::string& state);

// The watchdog interval systemd expects pings within, in microseconds; 0 when the watchdog is
// off or meant for another process ($WATCHDOG_PID).
uint64_t WatchdogUsec();

// File descriptors passed by socket activation ($LISTEN_FDS from fd 3, checked against
// $LISTEN_PID). The variables are removed so that children do not inherit them; the fds are
// marked close-on-exec.
std::vector<int> ListenFds();

}  // namespace engram::notify
