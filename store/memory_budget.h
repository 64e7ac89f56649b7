// How `[memory] budget` is split between what engramd holds (MemoryPlan), and MemoryBudget, the
// cap on the row store's share of it: resident tables and the row cache reserve from it before
// they allocate, so the store never grows past it.
//
//   absl::StatusOr<engram::MemoryPlan> plan = engram::PlanMemory(
//       {.budget = 16ull << 30, .process = p, .buffers = b, .arena_limit = 16ull << 30});
//   engram::MemoryBudget budget(plan->store);           // 0 = unbounded
//   if (auto s = budget.Reserve(bytes, "resident layer 14"); !s.ok()) { /* names both sizes */ }
//   ...
//   budget.Give(bytes);
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace engram {

// What engramd holds besides the row store, each piece bounded by its configuration, and the
// machine it runs on: the input of PlanMemory.
struct MemoryNeeds {
  uint64_t budget = 0;       // [memory] budget; 0: unbounded
  uint64_t process = 0;      // the process itself: code, heap, thread stacks, request bookkeeping
  uint64_t buffers = 0;      // the threads' miss, prefetch and O_DIRECT buffers
  uint64_t arena_limit = 0;  // limits.max_total_arena_bytes: the arenas' own bound
  uint64_t mem_total = 0;    // the machine's memory (MemTotal); 0: unknown
};

// `[memory] budget` split into what engramd holds (docs/row-store.md, "Memory accounting"). The
// pieces add up to the budget; every one is bounded by its own mechanism: the process allowance
// by the configuration it is computed from, the buffers by their per-thread size, the arenas by
// the handshake (a session whose arena does not fit is refused), the page cache by reclaim
// (MemoryHigh is `unreclaimable()`), the row store by MemoryBudget.
struct MemoryPlan {
  uint64_t budget = 0;      // 0: unbounded (no plan; every piece below is 0)
  uint64_t process = 0;     // fixed allowance for the process
  uint64_t buffers = 0;     // miss, prefetch and O_DIRECT buffers of every thread
  uint64_t arenas = 0;      // client arenas (memfds engramd creates), all sessions together
  uint64_t page_cache = 0;  // reclaimable page cache above MemoryHigh
  uint64_t store = 0;       // resident tables and the row cache: what the rest leave

  bool bounded() const { return budget != 0; }
  // Everything but the page cache: what engramd may hold that reclaim cannot take back
  // (anonymous memory and shared memory, with no swap). MemoryHigh.
  uint64_t unreclaimable() const { return budget - page_cache; }
  bool operator==(const MemoryPlan&) const = default;
};

// The arenas' share of a budget is a quarter of it, or limits.max_total_arena_bytes if that is
// smaller; the page cache's is a tenth.
inline constexpr uint64_t kArenaShareDivisor = 4;
inline constexpr uint64_t kPageCacheDivisor = 10;

// Splits needs.budget: the arenas' and the page cache's shares, the process and buffers as given,
// and the rest to the row store. InvalidArgument when the budget exceeds the machine's memory,
// ResourceExhausted when the pieces besides the store do not fit; both messages give every piece.
// An unbounded budget gives the empty plan.
absl::StatusOr<MemoryPlan> PlanMemory(const MemoryNeeds& needs);

// "process 40.0 MiB + buffers 28.0 MiB + arenas 24.0 MiB + page cache 9.6 MiB + row store
// 3.4 MiB = budget 96.0 MiB"
std::string DescribeMemoryPlan(const MemoryPlan& plan);

class MemoryBudget {
 public:
  // `budget_bytes` 0 means unbounded.
  explicit MemoryBudget(uint64_t budget_bytes) : budget_(budget_bytes) {}

  uint64_t budget() const { return budget_; }
  bool bounded() const { return budget_ != 0; }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  // Bytes that may still be reserved (UINT64_MAX when unbounded).
  uint64_t available() const;

  // Takes `bytes` from the budget, or ResourceExhausted naming `what`, the request, what is in
  // use and the budget. Thread-safe.
  absl::Status Reserve(uint64_t bytes, const std::string& what);
  // Returns bytes taken with Reserve.
  void Give(uint64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

 private:
  const uint64_t budget_;
  std::atomic<uint64_t> used_{0};
};

}  // namespace engram
