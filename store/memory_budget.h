// MemoryBudget: the one cap on the bytes the row store holds ([memory] budget): resident tables
// and the row cache reserve from it before they allocate, so the store never grows past it.
//
//   engram::MemoryBudget budget(64ull << 30);            // 0 = unbounded
//   if (auto s = budget.Reserve(bytes, "resident layer 14"); !s.ok()) { /* names both sizes */ }
//   ...
//   budget.Give(bytes);
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace engram {

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
