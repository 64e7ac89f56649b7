// engramd's log: one line per event on stderr. Under journald a "<N>" syslog priority prefix,
// which journald turns into the record's level (and stamps); anywhere else (a terminal, a file)
// an ISO-8601 UTC timestamp and the level's name. Only the daemon's own code logs; libraries
// return statuses.
#pragma once

#include <fmt/core.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace engram::log {

enum Priority : int { kError = 3, kWarning = 4, kNotice = 5, kInfo = 6, kDebug = 7 };

// The level names of log.level and --log-level, most important first: the only place they are
// spelled (the configuration's check, its help and SetLogLevel read this table).
struct LevelName {
  const char* name;
  Priority priority;
};
inline constexpr LevelName kLevelNames[] = {{"error", kError},
                                            {"warning", kWarning},
                                            {"notice", kNotice},
                                            {"info", kInfo},
                                            {"debug", kDebug}};

// The priority a level name stands for; nullopt for a name kLevelNames does not have.
inline std::optional<Priority> ParseLevel(std::string_view name) {
  for (const LevelName& l : kLevelNames) {
    if (name == l.name) return l.priority;
  }
  return std::nullopt;
}

// Lines at a priority above this (less important) are dropped. Set at startup and on SIGHUP.
inline std::atomic<int> g_max_priority{kInfo};

// Sets g_max_priority from a level name; false, and nothing changed, for an unknown name.
inline bool SetLogLevel(std::string_view name) {
  const std::optional<Priority> priority = ParseLevel(name);
  if (!priority) return false;
  g_max_priority.store(*priority, std::memory_order_relaxed);
  return true;
}

// Whether stderr is the journal: systemd sets JOURNAL_STREAM to "DEVICE:INODE" of the stream it
// connected, which a child that redirected stderr (2>file, a pipe) no longer has.
inline bool StreamIsJournal(const char* journal_stream, int fd) {
  unsigned long long device = 0, inode = 0;
  if (journal_stream == nullptr || sscanf(journal_stream, "%llu:%llu", &device, &inode) != 2) {
    return false;
  }
  struct stat st {};
  return fstat(fd, &st) == 0 && st.st_dev == device && st.st_ino == inode;
}

// Decided once, at the first line: stderr does not change under a running daemon.
inline bool StderrIsJournal() {
  static const bool journal = StreamIsJournal(getenv("JOURNAL_STREAM"), STDERR_FILENO);
  return journal;
}

// The start of a line: "<6>" for journald, "2026-12-07T02:50:01.123Z info: " anywhere else.
inline std::string LinePrefix(Priority priority, bool journal, const timespec& now) {
  if (journal) return fmt::format("<{}>", static_cast<int>(priority));
  const char* level = "debug";
  for (const LevelName& l : kLevelNames) {
    if (l.priority == priority) level = l.name;
  }
  tm utc{};
  gmtime_r(&now.tv_sec, &utc);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z {}: ", utc.tm_year + 1900,
                     utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                     now.tv_nsec / 1'000'000, level);
}

// One event is one line: a control character inside `line` (a newline in a name that was not
// escaped, say) is written as "\xNN", so no text can start a line of its own, with its own
// "<N>" priority, in the journal.
inline void Write(Priority priority, const std::string& line) {
  if (priority > g_max_priority.load(std::memory_order_relaxed)) return;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  std::string out = LinePrefix(priority, StderrIsJournal(), now);
  out.reserve(out.size() + line.size() + 1);
  for (const char c : line) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b == 0x7F) {
      out += fmt::format("\\x{:02x}", b);
    } else {
      out += c;
    }
  }
  out += '\n';
  fwrite(out.data(), 1, out.size(), stderr);  // stderr is unbuffered: one write per line
}

template <typename... Args>
void Error(fmt::format_string<Args...> format, Args&&... args) {
  Write(kError, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void Warning(fmt::format_string<Args...> format, Args&&... args) {
  Write(kWarning, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void Notice(fmt::format_string<Args...> format, Args&&... args) {
  Write(kNotice, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void Info(fmt::format_string<Args...> format, Args&&... args) {
  Write(kInfo, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void Debug(fmt::format_string<Args...> format, Args&&... args) {
  if (g_max_priority.load(std::memory_order_relaxed) < kDebug) return;
  Write(kDebug, fmt::format(format, std::forward<Args>(args)...));
}

// Lets through at most `per_second` events per second; counts the rest so that the next line
// that passes can say how many were suppressed. Thread-safe.
class RateLimit {
 public:
  explicit RateLimit(uint32_t per_second) : per_second_(per_second) {}
  // Returns true if this event may be logged; *ret_suppressed is how many were dropped since the
  // last event that passed.
  bool Allow(uint64_t now_ns, uint64_t* ret_suppressed);

 private:
  const uint32_t per_second_;
  std::atomic<uint64_t> window_start_{0};
  std::atomic<uint32_t> in_window_{0};
  std::atomic<uint64_t> suppressed_{0};
};

inline bool RateLimit::Allow(uint64_t now_ns, uint64_t* ret_suppressed) {
  uint64_t start = window_start_.load(std::memory_order_relaxed);
  if (now_ns - start >= 1'000'000'000 &&
      window_start_.compare_exchange_strong(start, now_ns, std::memory_order_relaxed)) {
    in_window_.store(0, std::memory_order_relaxed);
  }
  if (in_window_.fetch_add(1, std::memory_order_relaxed) >= per_second_) {
    suppressed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  *ret_suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
  return true;
}

}  // namespace engram::log
