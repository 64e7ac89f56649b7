// The split of [memory] budget, and MemoryBudget's reservations against the row store's share.
#include "store/memory_budget.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace engram {
namespace {

// The least the row store's share may be: a share of 0 would read as "unbounded".
constexpr uint64_t kMinStoreShare = uint64_t{1} << 20;

std::string Mib(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30)) return absl::StrFormat("%.2f GiB", double(bytes) / (1 << 30));
  return absl::StrFormat("%.1f MiB", double(bytes) / (1 << 20));
}

}  // namespace

absl::StatusOr<MemoryPlan> PlanMemory(const MemoryNeeds& needs) {
  if (needs.budget == 0) return MemoryPlan{};
  if (needs.mem_total != 0 && needs.budget > needs.mem_total) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "[memory] budget %s (%u bytes) is more than this machine's memory, MemTotal %s (%u "
        "bytes): the cgroup's limit would never be reached and engramd could take memory the "
        "GPU and the system need; lower it",
        Mib(needs.budget), needs.budget, Mib(needs.mem_total), needs.mem_total));
  }
  MemoryPlan plan;
  plan.budget = needs.budget;
  plan.process = needs.process;
  plan.buffers = needs.buffers;
  plan.arenas = std::min(needs.arena_limit, needs.budget / kArenaShareDivisor);
  plan.page_cache = needs.budget / kPageCacheDivisor;
  const uint64_t others = plan.process + plan.buffers + plan.arenas + plan.page_cache;
  if (others + kMinStoreShare > needs.budget) {
    // The smallest budget whose shares leave the process, the buffers and 1 MiB of store room.
    const uint64_t fixed = plan.process + plan.buffers + kMinStoreShare;
    const uint64_t least = fixed * kArenaShareDivisor * kPageCacheDivisor /
                               ((kArenaShareDivisor - 1) * kPageCacheDivisor - kArenaShareDivisor) +
                           1;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "[memory] budget %s cannot hold what engramd needs besides the row store: process %s + "
        "buffers %s + arenas %s + page cache %s = %s, and the row store needs at least 1 MiB; "
        "raise [memory] budget to at least %s, or lower engine.workers, engine.request_threads "
        "or limits.max_rows_per_request",
        Mib(needs.budget), Mib(plan.process), Mib(plan.buffers), Mib(plan.arenas),
        Mib(plan.page_cache), Mib(others), Mib(least)));
  }
  plan.store = needs.budget - others;
  return plan;
}

std::string DescribeMemoryPlan(const MemoryPlan& plan) {
  if (!plan.bounded()) return "budget unbounded";
  return absl::StrFormat(
      "process %s + buffers %s + arenas %s + page cache %s + row store %s = budget %s",
      Mib(plan.process), Mib(plan.buffers), Mib(plan.arenas), Mib(plan.page_cache), Mib(plan.store),
      Mib(plan.budget));
}

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
