// One clock and spin hint for engramd and its client library: monotonic nanoseconds, the unit
// of time inside engramd.
#pragma once

#include <time.h>

#include <cstdint>

namespace engram {

inline uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

// Tells the core that this thread is spinning on shared memory (frees pipeline resources for the
// sibling hyperthread; no-op where the architecture has no hint).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace engram
