// systemd integration without libsystemd: the sd_notify datagram protocol (READY, STATUS,
// WATCHDOG, EXTEND_TIMEOUT_USEC, FDSTORE with an fd attached) and passed fds (LISTEN_FDS and
// LISTEN_FDNAMES: socket activation and the file-descriptor store), both plain environment and
// socket conventions documented in sd_notify(3) and sd_listen_fds(3). Implemented here
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

// Sends `state` with one file descriptor attached (SCM_RIGHTS), as sd_pid_notify_with_fds does:
// "FDSTORE=1\nFDNAME=NAME" asks systemd to keep `fd` in the unit's file-descriptor store and to
// pass it back (named NAME in $LISTEN_FDNAMES) when the service starts again.
bool SendWithFd(const std::string& state, int fd);

// A file descriptor passed at start, with its name from $LISTEN_FDNAMES ("" when none was given;
// systemd names a socket unit's fds after the unit unless FileDescriptorName= says otherwise,
// and stored fds by their FDNAME=).
struct NamedFd {
  int fd = -1;
  std::string name;
};

// File descriptors passed by systemd ($LISTEN_FDS from fd 3, checked against $LISTEN_PID: the
// sockets of socket activation and the fds of the file-descriptor store together), with their
// names. The variables are removed so that children do not inherit them; the fds are marked
// close-on-exec.
std::vector<NamedFd> ListenFdsWithNames();

// File descriptors passed by socket activation ($LISTEN_FDS from fd 3, checked against
// $LISTEN_PID). The variables are removed so that children do not inherit them; the fds are
// marked close-on-exec.
std::vector<int> ListenFds();

}  // namespace engram::notify
