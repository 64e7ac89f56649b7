// The clocks a benchmark reads besides base/clock.h's NowNs (CLOCK_MONOTONIC, ns): sleeping until
// a deadline on that clock, and the CPU time this process, this thread or another process used.
#pragma once

#include <dirent.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "base/clock.h"

namespace engram::bench {

// Sleeps until NowNs() reaches `ns` (returns at once when it has), through signals.
inline void SleepUntil(uint64_t ns) {
  const timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

// User + system CPU of this process, every thread (getrusage), ns.
inline uint64_t SelfCpuNs() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1'000'000'000ull +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000ull;
}

// CPU of the calling thread (CLOCK_THREAD_CPUTIME_ID), ns.
inline uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

// utime + stime of every thread of `pid`, from /proc/PID/stat, ns. Counted in clock ticks
// (1/CLK_TCK s): for a case that runs seconds. 0 when the process is gone.
inline uint64_t ProcessCpuNs(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string f;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stoull(f);
    if (i == 15) stime = std::stoull(f);
  }
  return (utime + stime) * (1'000'000'000ull / sysconf(_SC_CLK_TCK));
}

// Time every thread of `pid` ran on a CPU so far, from /proc/PID/task/*/schedstat, ns: fine
// enough to charge a single step of a millisecond. 0 when the process is gone.
inline uint64_t ProcessRunNs(pid_t pid) {
  uint64_t total = 0;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(dir + "/" + e->d_name + "/schedstat");
    uint64_t ns = 0;
    if (f >> ns) total += ns;
  }
  closedir(d);
  return total;
}

}  // namespace engram::bench
