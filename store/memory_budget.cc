// MemoryBudget: reservations against the row store's byte cap.
#include "store/memory_budget.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace engram {

uint64_t MemoryBudget::available() const {
  if (budget_ == 0) return std::numeric_limits<uint64_t>::max();
  uint64_t u = used();
  return u >= budget_ ? 0 : budget_ - u;
}

absl::Status MemoryBudget::Reserve(uint64_t bytes, const std::string& what) {
  uint64_t cur = used_.load(std::memory_order_relaxed);
  do {
    if (budget_ != 0 && (cur + bytes < cur || cur + bytes > budget_)) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " needs ", bytes, " bytes but the memory budget has ", budget_ - cur,
                       " of ", budget_, " left ([memory] budget)"));
    }
  } while (!used_.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  return absl::OkStatus();
}

}  // namespace engram
