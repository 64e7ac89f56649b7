// Parsing helpers for engramd's configuration (see server_config.h).
#include "daemon/server/server_config.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/page_size.h"
#include "daemon/server/request_pool.h"
#include "gather/gather_engine.h"
#include "store/row_store.h"

namespace engram {

namespace {

// The process at rest: code and data of engramd and its libraries, the heap, the tables' index.
constexpr uint64_t kProcessBaseBytes = uint64_t{24} << 20;
// Each thread: its stack and what it keeps in its malloc arena between requests.
constexpr uint64_t kThreadBytes = uint64_t{256} << 10;
// A request thread's bookkeeping per row of its largest request: the gather plan (unique rows,
// reads, iovecs) and the pending reads.
constexpr uint64_t kPlanBytesPerRow = 160;
// Threads beside the gather workers and request threads: main, control, poller, prefetcher,
// resident loader, pressure monitor; and the engine's blocking pool (16, started only when a read
// must block).
constexpr uint64_t kOtherThreads = 6 + 16;
// The O_DIRECT bounce area of a thread is at least one run.
constexpr uint64_t kMinBounceBytes = uint64_t{256} << 10;

bool Listed(const std::vector<uid_t>& uids, const std::vector<gid_t>& gids, uid_t uid, gid_t gid,
            const std::vector<gid_t>& groups) {
  if (std::find(uids.begin(), uids.end(), uid) != uids.end()) return true;
  if (std::find(gids.begin(), gids.end(), gid) != gids.end()) return true;
  for (gid_t g : groups) {
    if (std::find(gids.begin(), gids.end(), g) != gids.end()) return true;
  }
  return false;
}

// "root (engramd's own uid)" or "root, uid 998 (engramd's own)", then the listed ids.
std::string DescribeAlwaysAnd(uid_t own_uid, const std::vector<uid_t>& uids,
                              const std::vector<gid_t>& gids) {
  std::string out = own_uid == 0 ? "root (engramd's own uid)"
                                 : absl::StrFormat("root, uid %u (engramd's own)", own_uid);
  if (!uids.empty()) out += ", uids " + absl::StrJoin(uids, ",");
  if (!gids.empty()) out += ", members of gids " + absl::StrJoin(gids, ",");
  return out;
}

}  // namespace

uint32_t DirectBounceBytes(uint64_t budget) {
  const uint64_t engine_default = GatherEngineOptions{}.direct_bounce_bytes;
  if (budget == 0) return static_cast<uint32_t>(engine_default);
  // The bounce buffer holds O_DIRECT runs: a multiple of the device's unit, not of the page.
  const uint64_t share = RoundDownTo(budget / 256, kDirectIoAlignBytes);
  return static_cast<uint32_t>(std::clamp(share, kMinBounceBytes, engine_default));
}

MemoryNeeds MemoryNeedsOf(const ServerConfig& config, uint64_t budget, uint64_t mem_total) {
  const uint32_t cpus = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t workers = config.workers != 0 ? config.workers : cpus;
  const uint64_t requests =
      config.request_threads != 0 ? config.request_threads : DefaultRequestThreads(cpus);
  // The pool of small requests, the pool of large ones (half as many), and the prefetcher: each
  // gathers as a calling thread, with a miss buffer and bookkeeping for a whole request.
  const uint64_t callers = requests + std::max<uint64_t>(1, requests / 2) + 1;
  const uint64_t bounce = DirectBounceBytes(budget);
  MemoryNeeds needs;
  needs.budget = budget;
  needs.mem_total = mem_total;
  needs.process = kProcessBaseBytes + (workers + callers + kOtherThreads) * kThreadBytes +
                  callers * config.limits.max_rows_per_request * kPlanBytesPerRow +
                  budget / 512;  // page tables of what is mapped: 8 bytes per 4 KiB page
  // An O_DIRECT bounce area per gather worker, calling thread and the poller (inline gathers);
  // a miss buffer per calling thread.
  needs.buffers = (workers + callers + 1) * bounce + callers * RowStore::kMissBufferBytes;
  needs.arena_limit = config.limits.max_total_arena_bytes;
  return needs;
}

bool IsAdmitted(const ServerConfig& config, uid_t own_uid, uid_t uid, gid_t gid,
                const std::vector<gid_t>& groups) {
  if (uid == 0 || uid == own_uid) return true;
  return Listed(config.allow_uids, config.allow_gids, uid, gid, groups);
}

std::string DescribeAdmitted(const ServerConfig& config, uid_t own_uid) {
  return DescribeAlwaysAnd(own_uid, config.allow_uids, config.allow_gids);
}

std::vector<uid_t> AlwaysAndListed(uid_t own_uid, std::vector<uid_t> uids) {
  uids.push_back(0);
  uids.push_back(own_uid);
  std::sort(uids.begin(), uids.end());
  uids.erase(std::unique(uids.begin(), uids.end()), uids.end());
  return uids;
}

bool IsAdministrator(const ServerConfig& config, uid_t own_uid, uid_t uid, gid_t gid,
                     const std::vector<gid_t>& groups) {
  if (uid == 0 || uid == own_uid) return true;
  return Listed(config.admin_uids, config.admin_gids, uid, gid, groups);
}

std::string DescribeAdministrators(const ServerConfig& config, uid_t own_uid) {
  return DescribeAlwaysAnd(own_uid, config.admin_uids, config.admin_gids);
}

absl::StatusOr<PollMode> ParsePollMode(const std::string& text) {
  if (text == "auto") return PollMode::kAuto;
  if (text == "on") return PollMode::kOn;
  if (text == "off") return PollMode::kOff;
  return absl::InvalidArgumentError(absl::StrFormat("poll mode '%s' is not auto, on or off", text));
}

uint32_t PollCores(PollMode mode, uint32_t cores, uint32_t cpus) {
  if (mode == PollMode::kOff || (mode == PollMode::kAuto && cpus < kAutoPollMinCpus)) return 0;
  return cores != 0 ? cores : std::max<uint32_t>(2, cpus / 8);
}

}  // namespace engram
