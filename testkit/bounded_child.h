// A call run in a child process under bounds, for tests of code that, when broken, would block
// forever or take memory without end: the child is killed after a few seconds and (outside the
// sanitizers, whose shadow memory needs the address space) limited to 1 GiB of address space; the
// test reads back what the call returned, how the child ended and its peak resident memory.
// No test framework: the child must not fail a test case itself, it returns text.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <functional>
#include <string>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ENGRAM_BOUNDED_CHILD_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define ENGRAM_BOUNDED_CHILD_SANITIZED 1
#endif
#endif

namespace engram::testing {

struct ChildOutcome {
  bool returned = false;  // the call returned (not killed by the alarm, not aborted)
  std::string text;       // what it returned
  uint64_t max_rss_bytes = 0;
  int wait_status = 0;
};

inline constexpr unsigned kChildSeconds = 10;
inline constexpr uint64_t kChildAddressSpace = uint64_t{1} << 30;

// Runs `call` in a forked child killed (SIGALRM) after kChildSeconds, its address space limited
// to kChildAddressSpace where no sanitizer runs.
inline ChildOutcome RunBounded(const std::function<std::string()>& call) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    alarm(kChildSeconds);
#ifndef ENGRAM_BOUNDED_CHILD_SANITIZED
    const rlimit as{.rlim_cur = kChildAddressSpace, .rlim_max = kChildAddressSpace};
    setrlimit(RLIMIT_AS, &as);
#endif
    const std::string text = "returned:" + call();
    for (size_t at = 0; at < text.size();) {
      const ssize_t n = write(p[1], text.data() + at, text.size() - at);
      if (n <= 0) break;
      at += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(p[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = read(p[0], buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  close(p[0]);
  ChildOutcome out;
  rusage usage{};
  wait4(pid, &out.wait_status, 0, &usage);
  out.max_rss_bytes = static_cast<uint64_t>(usage.ru_maxrss) * 1024;
  const std::string mark = "returned:";
  out.returned = WIFEXITED(out.wait_status) && WEXITSTATUS(out.wait_status) == 0 &&
                 got.compare(0, mark.size(), mark) == 0;
  if (out.returned) out.text = got.substr(mark.size());
  return out;
}

}  // namespace engram::testing
