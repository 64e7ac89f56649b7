// engram-ranks: decode latency under load. N client processes (one per engine rank) each gather
// their rank's rows of both Engram layers every T ms on a common clock, through engramd and, side
// by side, with the same gather engine in each process and with a plain io_uring loop in each
// process; per-step p50/p99/p99.9 per rank, aggregate rows/s and CPU per row; a mixed case runs
// one prefill process next to the decode ranks. With --prefetch-flood N, one decode rank alone
// and then beside N processes that send PREFETCH entries as fast as engramd answers them.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/common/engramd_process.h"
#include "bench/common/row_ids.h"
#include "bench/gather/gather_methods.h"
#include "engram/engram.h"
#include "engram/protocol.h"
#include "gather/gather_engine.h"
#include "tables/table.h"
#include "testkit/gather_test_util.h"
#include "testkit/synthetic.h"

namespace engram::bench {
namespace {

constexpr uint32_t kLayers[2] = {1, 14};
constexpr uint64_t kPrefillRows = 98304;
constexpr int kMaxRanks = 64;
constexpr uint64_t kSeed = 3;  // of the synthetic tables

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

void SleepUntil(uint64_t ns) {
  const timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

uint64_t SelfCpuNs() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1'000'000'000ull +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000ull;
}

// utime + stime of every thread of `pid`, from /proc/PID/stat.
uint64_t ProcessCpuNs(pid_t pid) {
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

struct Config {
  std::string engramd, dir, layout = "checkpoint", trace, methods_arg;
  std::string tier = "storage";  // the daemon's --default-tier
  uint64_t rows = 1'000'000;
  std::vector<int> ranks = {1, 4, 8, 16};
  uint32_t tp = 4;
  uint64_t step_rows = 1152;
  double period_ms = 10;
  uint32_t steps = 200;
  double zipf_s = 1.0;
  double miss = 0.05;
  uint32_t client_spin_us = 0;  // 0: the client library's adaptive default
  uint32_t piece_rows = 144;    // the pieces method: rows per request
  std::vector<std::string> daemon_args;
  bool smoke = false;
  int prefetch_flood = 0;  // >0: only the pair of cases with and without that many floods
  // One engramd per entry, started with that engine.poll_mode ("on:N" adds engine.poll_cores
  // N), every method through engramd run against each side by side; empty: one engramd.
  std::vector<std::string> poll_modes;
  // engramd's emulated device for O_DIRECT reads (engine.emulate_read_*; 0: off).
  uint64_t emulate_latency_us = 0, emulate_iops = 0;
};

// One engramd the matrix runs against: its label in the table ("" when it is the only one).
struct Daemon {
  std::string label;
  std::string sock;
  pid_t pid = -1;
};

// One case of the matrix.
struct Case {
  std::string name;
  int ranks = 1;
  double period_ms = 10;  // 0: back to back
  std::string dist = "uniform";
  double evict = 0;      // fraction of each step's rows evicted before the step
  bool prefill = false;  // one more process gathers 98,304-row batches back to back
  int flooders = 0;      // processes that prefetch 4 x 8,192 rows per call, back to back
};

// What the rank processes report, in memory shared with the parent.
struct SharedResults {
  std::atomic<int> ready{0};
  std::atomic<uint64_t> start_ns{0};
  std::atomic<int> decode_done{0};
  std::atomic<int> failures{0};
  uint64_t cpu_ns[kMaxRanks + 1];
  // How late each rank's timer woke it for its steps (not counted in the latencies).
  uint64_t wake_late_sum_ns[kMaxRanks + 1];
  uint64_t wake_late_max_ns[kMaxRanks + 1];
  uint64_t prefill_batches = 0;
  uint64_t prefill_ns_sum = 0;
  uint64_t prefill_max_ns = 0;
  std::atomic<uint64_t> flood_rows{0};     // rows the flood processes' prefetches queued
  std::atomic<uint64_t> flood_refused{0};  // their calls refused (the session's bound)
  char error[256];
  // lat[rank * steps + step], ns; followed by the prefill latencies.
  uint64_t lat[1];
};

// The rows a trace file holds: steps[i][layer index] = ids. One line per step, groups
// `LAYER:ID,ID,...` separated by blanks; lines starting with '#' are comments.
using Trace = std::vector<std::array<std::vector<uint64_t>, 2>>;

absl::StatusOr<Trace> ReadTrace(const std::string& path, uint64_t rows) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace ", path));
  Trace trace;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    std::array<std::vector<uint64_t>, 2> step;
    std::istringstream groups(line);
    std::string g;
    while (groups >> g) {
      const size_t colon = g.find(':');
      uint32_t layer = 0;
      if (colon == std::string::npos || !absl::SimpleAtoi(g.substr(0, colon), &layer) ||
          (layer != kLayers[0] && layer != kLayers[1])) {
        return absl::InvalidArgumentError(absl::StrCat(path, " line ", n, ": '", g.substr(0, 40),
                                                       "' is not LAYER:ID,... with layer 1 or 14"));
      }
      for (absl::string_view id : absl::StrSplit(g.substr(colon + 1), ',', absl::SkipEmpty())) {
        uint64_t v;
        if (!absl::SimpleAtoi(id, &v) || v >= rows) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, " line ", n, ": row id '", id.substr(0, 24), "' is not in [0, ", rows, ")"));
        }
        step[layer == kLayers[0] ? 0 : 1].push_back(v);
      }
    }
    trace.push_back(std::move(step));
  }
  if (trace.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no steps"));
  return trace;
}

// Gathers one step (both layers) for one rank, by one method.
class StepGatherer {
 public:
  virtual ~StepGatherer() = default;
  // ids[l] / dest[l]: buffers the caller fills / reads (in the arena for the daemon).
  virtual uint64_t* ids(int l) = 0;
  virtual uint8_t* dest(int l) = 0;
  virtual bool Gather(const size_t n[2]) = 0;
  std::string error;
};

// Through engramd; with `in_place`, each layer's rows by engram_gather with
// ENGRAM_GATHER_IN_PLACE (copied in the rank's process where the table is resident); with
// `piece_rows`, each layer's rows as requests of at most that many rows, all in flight at once.
class DaemonGatherer final : public StepGatherer {
 public:
  DaemonGatherer(bool in_place, uint32_t piece_rows)
      : in_place_(in_place), piece_rows_(piece_rows) {}
  bool Connect(const std::string& sock, uint64_t cap, const char* name, uint32_t spin_us) {
    engram_connect_options o;
    engram_connect_options_init(&o, sizeof(o));
    o.socket_path = sock.c_str();
    o.data_bytes = 2 * cap * (kRowBytes + 8) + (1 << 20);
    o.client_name = name;
    o.spin_ns = spin_us * 1000;
    if (engram_connect(&o, &s_) != 0) return Fail("connect");
    for (int l = 0; l < 2; ++l) {
      if (engram_alloc(s_, cap * 8, reinterpret_cast<void**>(&ids_[l])) != 0 ||
          engram_alloc(s_, cap * kRowBytes, reinterpret_cast<void**>(&dest_[l])) != 0) {
        return Fail("alloc");
      }
    }
    if (in_place_) {
      // The first in-place gather of a table maps it: done here, before the clock starts.
      const size_t one[2] = {1, 1};
      ids_[0][0] = ids_[1][0] = 0;
      return Gather(one);
    }
    return true;
  }
  ~DaemonGatherer() override {
    if (s_ != nullptr) engram_close(s_);
  }
  uint64_t* ids(int l) override { return ids_[l]; }
  uint8_t* dest(int l) override { return dest_[l]; }
  bool Gather(const size_t n[2]) override {
    if (in_place_) return GatherEach(n);
    tickets_.clear();
    size_t waited = 0;
    for (int l = 0; l < 2; ++l) {
      const size_t piece = piece_rows_ > 0 ? piece_rows_ : std::max<size_t>(n[l], 1);
      for (size_t first = 0; first < n[l]; first += piece) {
        engram_gather_request r{.size = sizeof(r),
                                .table = kLayers[l],
                                .flags = 0,
                                .rows = ids_[l] + first,
                                .num_rows = std::min(piece, n[l] - first),
                                .dest = dest_[l] + first * kRowBytes,
                                .dest_offsets = nullptr};
        uint64_t ticket = 0;
        int rc;
        // Every slot in flight: the oldest request finishes first.
        while ((rc = engram_submit(s_, &r, &ticket)) == -ENOSPC && waited < tickets_.size()) {
          if (engram_wait(s_, tickets_[waited++], -1) != 0) return Fail("wait");
        }
        if (rc != 0) return Fail("submit");
        tickets_.push_back(ticket);
      }
    }
    for (; waited < tickets_.size(); ++waited) {
      if (engram_wait(s_, tickets_[waited], -1) != 0) return Fail("wait");
    }
    return true;
  }

 private:
  bool GatherEach(const size_t n[2]) {
    for (int l = 0; l < 2; ++l) {
      if (n[l] == 0) continue;
      engram_gather_request r{.size = sizeof(r),
                              .table = kLayers[l],
                              .flags = ENGRAM_GATHER_IN_PLACE,
                              .rows = ids_[l],
                              .num_rows = n[l],
                              .dest = dest_[l],
                              .dest_offsets = nullptr};
      if (engram_gather(s_, &r, -1) != 0) return Fail("gather");
    }
    return true;
  }
  bool Fail(const char* what) {
    error = absl::StrCat(what, ": ", engram_last_error());
    return false;
  }
  bool in_place_;
  uint32_t piece_rows_;
  std::vector<uint64_t> tickets_;
  engram_session* s_ = nullptr;
  uint64_t* ids_[2] = {};
  uint8_t* dest_[2] = {};
};

// In-process from the same memory the daemon serves: both tables (of the resident tier) mapped
// read-only into the rank's process, rows copied with engram_table_map_gather (a memcpy each).
class MappedGatherer final : public StepGatherer {
 public:
  MappedGatherer(const std::string& sock, uint64_t cap) {
    for (int l = 0; l < 2; ++l) {
      ids_[l].resize(cap);
      dest_[l].resize(cap * kRowBytes);
    }
    engram_connect_options o;
    engram_connect_options_init(&o, sizeof(o));
    o.socket_path = sock.c_str();
    o.client_name = "engram-ranks mapped";
    engram_session* s = nullptr;
    if (engram_connect(&o, &s) != 0) {
      error = absl::StrCat("connect: ", engram_last_error());
      return;
    }
    for (int l = 0; l < 2 && error.empty(); ++l) {
      if (engram_map_table(s, kLayers[l], &maps_[l]) != 0) {
        error = absl::StrCat("map layer ", kLayers[l], ": ", engram_last_error());
      }
    }
    engram_close(s);  // the mappings outlive the session
  }
  ~MappedGatherer() override {
    for (engram_table_map* m : maps_) engram_unmap_table(m);
  }
  uint64_t* ids(int l) override { return ids_[l].data(); }
  uint8_t* dest(int l) override { return dest_[l].data(); }
  bool Gather(const size_t n[2]) override {
    for (int l = 0; l < 2; ++l) {
      if (n[l] == 0) continue;
      if (engram_table_map_gather(maps_[l], ids_[l].data(), n[l], dest_[l].data()) != 0) {
        error = absl::StrCat("gather: ", engram_last_error());
        return false;
      }
    }
    return true;
  }

 private:
  engram_table_map* maps_[2] = {};
  std::vector<uint64_t> ids_[2];
  std::vector<uint8_t> dest_[2];
};

// In-process: the gather engine (defaults) or a plain io_uring loop, in the rank's own process.
class LocalGatherer final : public StepGatherer {
 public:
  LocalGatherer(const std::string& method, const std::vector<const Table*>& tables, uint64_t cap)
      : tables_(tables) {
    for (int l = 0; l < 2; ++l) {
      ids_[l].resize(cap);
      dest_[l].resize(cap * kRowBytes);
    }
    if (method == "engine") {
      method_ = MakeEngineMethod("engine", {});
    } else {
      method_ = MakeUringOnlyMethod();
    }
    for (const Table* t : tables_) {
      if (absl::Status s = method_->Attach(*t); !s.ok()) error = s.ToString();
    }
  }
  uint64_t* ids(int l) override { return ids_[l].data(); }
  uint8_t* dest(int l) override { return dest_[l].data(); }
  bool Gather(const size_t n[2]) override {
    for (int l = 0; l < 2; ++l) {
      if (n[l] == 0) continue;
      absl::Status s =
          method_->Gather(*tables_[l], std::span(ids_[l].data(), n[l]), dest_[l].data());
      if (!s.ok()) {
        error = s.ToString();
        return false;
      }
    }
    return true;
  }

 private:
  std::vector<const Table*> tables_;
  std::unique_ptr<GatherMethod> method_;
  std::vector<uint64_t> ids_[2];
  std::vector<uint8_t> dest_[2];
};

struct Env {
  const Config* cfg;
  std::vector<const Table*> tables;  // layer 1, layer 14
  std::string sock;
  const Trace* trace = nullptr;
  uint64_t seed = 0;
};

// Drops the pages of `n` rows of `table` from the page cache.
void EvictRows(const Table& table, const uint64_t* rows, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    for (const RowPart& p : table.parts()) {
      const uint64_t off = p.FileOffset(rows[i]) & ~uint64_t{4095};
      posix_fadvise(table.files()[p.file].fd, off, 4096, POSIX_FADV_DONTNEED);
    }
  }
}

// The methods whose clients talk to engramd.
bool ThroughDaemon(const std::string& method) {
  return method == "daemon" || method == "inplace" || method == "pieces";
}

std::unique_ptr<StepGatherer> MakeGatherer(const Env& env, const std::string& method, uint64_t cap,
                                           const char* name) {
  if (ThroughDaemon(method)) {
    auto d = std::make_unique<DaemonGatherer>(method == "inplace",
                                              method == "pieces" ? env.cfg->piece_rows : 0);
    d->Connect(env.sock, cap, name, env.cfg->client_spin_us);
    return d;
  }
  if (method == "mapped") return std::make_unique<MappedGatherer>(env.sock, cap);
  return std::make_unique<LocalGatherer>(method, env.tables, cap);
}

// The body of one decode rank's process.
int RankMain(const Env& env, const Case& c, const std::string& method, int rank,
             SharedResults* out) {
  const Config& cfg = *env.cfg;
  auto g = MakeGatherer(env, method, cfg.step_rows * 2, "engram-ranks");
  auto fail = [&](const std::string& why) {
    if (out->failures.fetch_add(1) == 0) {
      snprintf(out->error, sizeof(out->error), "rank %d (%s): %s", rank, method.c_str(),
               why.c_str());
    }
    out->ready.fetch_add(1);
    return 1;
  };
  if (!g->error.empty()) return fail(g->error);
  // Each rank reads its own TP slice of every table.
  std::vector<RowIdSource> src;
  for (int l = 0; l < 2; ++l) {
    const Table& t = *env.tables[l];
    const uint64_t slice = t.num_rows() / cfg.tp;
    src.emplace_back(c.dist, (rank % cfg.tp) * slice, slice, cfg.zipf_s,
                     env.seed * 1000 + rank * 2 + l);
  }
  std::mt19937_64 coin(env.seed + rank);
  std::uniform_real_distribution<double> unit(0, 1);
  out->ready.fetch_add(1);
  uint64_t start;
  while ((start = out->start_ns.load()) == 0) usleep(200);
  SleepUntil(start);  // every case starts on the common clock, back to back ones too
  const uint64_t period = static_cast<uint64_t>(c.period_ms * 1e6);
  const uint64_t cpu0 = SelfCpuNs();
  std::vector<uint64_t> evict;
  for (uint32_t step = 0; step < cfg.steps; ++step) {
    size_t n[2];
    for (int l = 0; l < 2; ++l) {
      if (env.trace != nullptr) {
        const auto& ids = (*env.trace)[(rank * env.trace->size() / std::max(1, c.ranks) + step) %
                                       env.trace->size()][l];
        n[l] = std::min<size_t>(ids.size(), cfg.step_rows * 2);
        std::copy(ids.begin(), ids.begin() + n[l], g->ids(l));
      } else {
        n[l] = cfg.step_rows;
        src[l].Fill(g->ids(l), n[l]);
      }
      if (c.evict > 0) {
        evict.clear();
        for (size_t i = 0; i < n[l]; ++i) {
          if (unit(coin) < c.evict) evict.push_back(g->ids(l)[i]);
        }
        EvictRows(*env.tables[l], evict.data(), evict.size());
      }
    }
    const uint64_t scheduled = start + step * period;
    // Latency counts from the scheduled start when the rank could not start on time (its last
    // step overran: that wait counts), else from when its timer woke it. An engine submits a
    // step when it is ready, not from a timer, so the timer's own lateness (tens to hundreds of
    // µs on a VM) is left out and reported beside the table instead.
    uint64_t t0 = NowNs();
    if (period > 0 && t0 <= scheduled) {
      SleepUntil(scheduled);
      t0 = NowNs();
      out->wake_late_sum_ns[rank] += t0 - scheduled;
      out->wake_late_max_ns[rank] = std::max(out->wake_late_max_ns[rank], t0 - scheduled);
    } else if (period > 0) {
      t0 = scheduled;
    }
    if (!g->Gather(n)) return fail(g->error);
    out->lat[rank * cfg.steps + step] = NowNs() - t0;
  }
  out->cpu_ns[rank] = SelfCpuNs() - cpu0;
  // The last step's bytes against the synthetic rows.
  for (int l = 0; l < 2; ++l) {
    std::vector<uint64_t> ids(g->ids(l), g->ids(l) + cfg.step_rows);
    if (env.trace == nullptr &&
        testing::FirstMismatch(kSeed, *env.tables[l], ids, g->dest(l)) != -1) {
      return fail(absl::StrCat("wrong bytes in layer ", kLayers[l]));
    }
  }
  out->decode_done.fetch_add(1);
  return 0;
}

// The prefill process of the mixed case: 98,304-row batches of layer 14 from rank 0's slice, back
// to back until every decode rank is done.
int PrefillMain(const Env& env, const Case& c, const std::string& method, SharedResults* out) {
  const Config& cfg = *env.cfg;
  // The antagonist is the same for every method through engramd: whole 98,304-row requests.
  auto g = MakeGatherer(env, method == "pieces" ? "daemon" : method, kPrefillRows,
                        "engram-ranks prefill");
  const int slot = c.ranks - 1;
  auto fail = [&](const std::string& why) {
    if (out->failures.fetch_add(1) == 0) {
      snprintf(out->error, sizeof(out->error), "prefill (%s): %s", method.c_str(), why.c_str());
    }
    out->ready.fetch_add(1);
    return 1;
  };
  if (!g->error.empty()) return fail(g->error);
  const Table& t = *env.tables[1];
  RowIdSource src(c.dist, 0, t.num_rows() / cfg.tp, cfg.zipf_s, env.seed * 77);
  out->ready.fetch_add(1);
  uint64_t start;
  while ((start = out->start_ns.load()) == 0) usleep(200);
  SleepUntil(start);
  const uint64_t cpu0 = SelfCpuNs();
  const int decoders = c.ranks - 1;
  while (out->decode_done.load() < decoders && out->failures.load() == 0) {
    src.Fill(g->ids(1), kPrefillRows);
    const size_t n[2] = {0, kPrefillRows};
    const uint64_t t0 = NowNs();
    if (!g->Gather(n)) return fail(g->error);
    const uint64_t ns = NowNs() - t0;
    out->prefill_batches++;
    out->prefill_ns_sum += ns;
    out->prefill_max_ns = std::max(out->prefill_max_ns, ns);
  }
  out->cpu_ns[slot] = SelfCpuNs() - cpu0;
  return 0;
}

// A flood process: a session that prefetches 4 x 8,192 rows of layer 14 per call, back to back,
// until every decode rank is done (engramd only; the other methods run no daemon).
int FloodMain(const Env& env, int decoders, int index, SharedResults* out) {
  engram_connect_options o;
  engram_connect_options_init(&o, sizeof(o));
  o.socket_path = env.sock.c_str();
  o.client_name = "engram-ranks flood";
  o.data_bytes = 4 << 20;
  engram_session* s = nullptr;
  if (engram_connect(&o, &s) != 0) return 1;
  const Table& t = *env.tables[1];
  std::vector<uint64_t> rows(4 * ENGRAM_PREFETCH_MAX_ROWS);
  std::mt19937_64 rng(env.seed * 1000 + index);
  for (uint64_t& r : rows) r = rng() % t.num_rows();
  while (out->start_ns.load() == 0) usleep(200);
  while (out->decode_done.load() < decoders && out->failures.load() == 0) {
    uint64_t queued = 0;
    const int rc = engram_prefetch(s, 14, rows.data(), rows.size(), 0, &queued);
    if (rc == -ENOSPC) out->flood_refused.fetch_add(1);
    out->flood_rows.fetch_add(queued);
  }
  engram_close(s);
  return 0;
}

uint64_t Quantile(std::vector<uint64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

struct CaseResult {
  bool ok = true;
  std::string error;
  std::vector<uint64_t> p50, p99, p999;  // per decode rank, ns
  uint64_t all_p50 = 0, all_p99 = 0, all_p999 = 0;
  double rows_per_s = 0;
  double server_cpu_us_per_row = 0;  // the daemon's, or the rank processes' for in-process
  double client_cpu_us_per_row = 0;  // the rank processes' (daemon method only)
  uint64_t prefill_batches = 0;
  double prefill_mean_ms = 0, prefill_max_ms = 0;
  uint64_t flood_rows = 0, flood_refused = 0;
  double wake_late_mean_us = 0, wake_late_max_us = 0;  // the ranks' timers (paced cases)
  uint64_t wall_ns = 0;
};

// Reads every table file once so that the case starts warm.
void WarmTables(const std::vector<const Table*>& tables) {
  std::vector<uint8_t> buf(1 << 20);
  for (const Table* t : tables) {
    for (const TableFile& f : t->files()) {
      for (uint64_t off = 0; off < f.size; off += buf.size()) {
        if (pread(f.fd, buf.data(), buf.size(), off) <= 0) break;
      }
    }
  }
}

// Each decoding rank's step latencies and all of them together, from the shared results.
void TakeLatencies(const SharedResults& out, int decoders, uint64_t steps, CaseResult* r) {
  std::vector<uint64_t> all;
  for (int i = 0; i < decoders; ++i) {
    std::vector<uint64_t> v(out.lat + i * steps, out.lat + (i + 1) * steps);
    r->p50.push_back(Quantile(v, 0.5));
    r->p99.push_back(Quantile(v, 0.99));
    r->p999.push_back(Quantile(v, 0.999));
    all.insert(all.end(), v.begin(), v.end());
  }
  r->all_p50 = Quantile(all, 0.5);
  r->all_p99 = Quantile(all, 0.99);
  r->all_p999 = Quantile(all, 0.999);
}

CaseResult RunCase(const Env& env, const Case& c, const std::string& method, pid_t daemon) {
  const Config& cfg = *env.cfg;
  const int decoders = c.prefill ? c.ranks - 1 : c.ranks;
  const size_t bytes = sizeof(SharedResults) + sizeof(uint64_t) * (c.ranks * cfg.steps + 1);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CaseResult r;
  if (mem == MAP_FAILED) {
    r.ok = false;
    r.error = "mmap of the results area failed";
    return r;
  }
  auto* out = new (mem) SharedResults();
  WarmTables(env.tables);
  std::vector<pid_t> kids;
  for (int i = 0; i < c.ranks; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      const bool is_prefill = c.prefill && i == decoders;
      _exit(is_prefill ? PrefillMain(env, c, method, out) : RankMain(env, c, method, i, out));
    }
    kids.push_back(pid);
  }
  std::vector<pid_t> floods;
  for (int i = 0; ThroughDaemon(method) && i < c.flooders; ++i) {
    const pid_t pid = fork();
    if (pid == 0) _exit(FloodMain(env, decoders, i, out));
    floods.push_back(pid);
  }
  while (out->ready.load() < c.ranks) usleep(1000);
  const uint64_t daemon_cpu0 = daemon > 0 ? ProcessCpuNs(daemon) : 0;
  const uint64_t start = NowNs() + 20'000'000;
  out->start_ns.store(start);
  for (pid_t k : kids) {
    int status = 0;
    waitpid(k, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) r.ok = false;
  }
  r.wall_ns = NowNs() - start;
  for (pid_t f : floods) waitpid(f, nullptr, 0);
  r.flood_rows = out->flood_rows.load();
  r.flood_refused = out->flood_refused.load();
  const uint64_t daemon_cpu = daemon > 0 ? ProcessCpuNs(daemon) - daemon_cpu0 : 0;
  if (!r.ok || out->failures.load() > 0) {
    r.ok = false;
    r.error = out->error;
  }
  TakeLatencies(*out, decoders, cfg.steps, &r);
  const double decode_rows = static_cast<double>(decoders) * cfg.steps * cfg.step_rows * 2;
  const double rows = decode_rows + static_cast<double>(out->prefill_batches) * kPrefillRows;
  r.rows_per_s = rows / (r.wall_ns / 1e9);
  uint64_t rank_cpu = 0;
  for (int i = 0; i < c.ranks; ++i) rank_cpu += out->cpu_ns[i];
  if (ThroughDaemon(method)) {
    r.server_cpu_us_per_row = daemon_cpu / 1e3 / rows;
    r.client_cpu_us_per_row = rank_cpu / 1e3 / rows;
  } else {
    r.server_cpu_us_per_row = rank_cpu / 1e3 / rows;
  }
  uint64_t late_sum = 0, late_max = 0;
  for (int i = 0; i < c.ranks; ++i) {
    late_sum += out->wake_late_sum_ns[i];
    late_max = std::max(late_max, out->wake_late_max_ns[i]);
  }
  r.wake_late_mean_us = late_sum / 1e3 / (double(c.ranks) * cfg.steps);
  r.wake_late_max_us = late_max / 1e3;
  r.prefill_batches = out->prefill_batches;
  if (out->prefill_batches > 0) {
    r.prefill_mean_ms = out->prefill_ns_sum / 1e6 / out->prefill_batches;
    r.prefill_max_ms = out->prefill_max_ns / 1e6;
  }
  munmap(mem, bytes);
  return r;
}

// The cases of one run: paced warm uniform and Zipf, paced with evicted rows, back to back, and
// the mixed case, for every rank count; with a trace, the trace's steps instead of the ids.
std::vector<Case> Matrix(const Config& cfg) {
  std::vector<Case> cases;
  const std::string first = cfg.trace.empty() ? "uniform" : "trace";
  if (cfg.prefetch_flood > 0) {
    Case alone{"1 rank, no flood", 1, cfg.period_ms, first};
    Case flooded = alone;
    flooded.name = absl::StrCat("1 rank + ", cfg.prefetch_flood, " prefetch floods");
    flooded.flooders = cfg.prefetch_flood;
    return {alone, flooded};
  }
  for (int n : cfg.ranks) cases.push_back({"warm " + first, n, cfg.period_ms, first});
  if (cfg.trace.empty()) {
    for (int n : cfg.ranks) cases.push_back({"warm zipf", n, cfg.period_ms, "zipf"});
  }
  // Evicting page-cache pages makes misses only for tables served from storage.
  if (cfg.miss > 0 && cfg.tier == "storage") {
    for (int n : cfg.ranks) {
      cases.push_back({absl::StrFormat("%s, %.0f%% evicted", first, cfg.miss * 100), n,
                       cfg.period_ms, first, cfg.miss});
    }
  }
  if (cfg.period_ms > 0) {
    cases.push_back({"back to back " + first, cfg.ranks.front(), 0, first});
    if (cfg.ranks.size() > 1) {
      cases.push_back({"back to back " + first, cfg.ranks[cfg.ranks.size() / 2], 0, first});
    }
  }
  const int mixed = std::max(2, std::min(8, cfg.ranks.back()));
  cases.push_back(
      {absl::StrCat("mixed ", mixed - 1, " + 1 prefill"), mixed, cfg.period_ms, first, 0, true});
  return cases;
}

void PrintHeader(const Config& cfg, const std::vector<std::string>& args) {
  utsname u{};
  uname(&u);
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, cpu = "?";
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  printf("# engram-ranks\nmachine: %s, %ld online CPUs, Linux %s\n", cpu.c_str(),
         sysconf(_SC_NPROCESSORS_ONLN), u.release);
  printf("tables: synthetic %s, layers 1 and 14 x %" PRIu64
         " rows, in %s; rank r reads TP%u "
         "slice r mod %u\n",
         cfg.layout.c_str(), cfg.rows, cfg.dir.c_str(), cfg.tp, cfg.tp);
  printf("step: %" PRIu64
         " rows of each layer (two requests in flight), %u steps per rank, "
         "every %.1f ms on a common clock; latency from the submission to both layers' rows "
         "in place, or from the scheduled start when the rank's last step overran it (the ranks' "
         "own timer lateness is printed beside each paced case, not counted); client spin: %s\n",
         cfg.step_rows, cfg.steps, cfg.period_ms,
         cfg.client_spin_us ? absl::StrCat(cfg.client_spin_us, " µs").c_str() : "library default");
  printf(
      "methods: daemon = engramd with its defaults and one client process per rank; inplace = "
      "the same clients' engram_gather with ENGRAM_GATHER_IN_PLACE, one layer after the other "
      "(resident tables copied in the client, others gathered by engramd); pieces = the same "
      "clients, each layer's rows as requests of %u rows, all in flight together (the prefill "
      "process as for daemon); mapped = "
      "the daemon's resident tables mapped into each rank process, rows copied there; engine = "
      "the gather engine (defaults) inside each rank process; uring = a plain io_uring loop "
      "(one ring, one read per row part) inside each rank process\nengramd:",
      cfg.piece_rows);
  for (size_t i = 1; i < args.size(); ++i) printf(" %s", args[i].c_str());
  printf("\n\n");
}

// ref_p99: the worst rank's p99 of the reference method (mapped for resident tables, else the
// in-process engine); 0 when it did not run.
void PrintCase(const Case& c, const std::string& method, const CaseResult& r, double ref_p99) {
  auto us = [](uint64_t ns) { return ns / 1e3; };
  const uint64_t worst99 = r.p99.empty() ? 0 : *std::max_element(r.p99.begin(), r.p99.end());
  const uint64_t worst999 = r.p999.empty() ? 0 : *std::max_element(r.p999.begin(), r.p999.end());
  const std::string period = c.period_ms > 0 ? absl::StrFormat("%g ms", c.period_ms) : "b2b";
  printf(
      "| %-26s | %2d | %6s | %-11s | %8.1f | %8.1f | %8.1f | %8.1f | %5.2fx | %6.2f M | "
      "%6.3f | %6.3f |",
      c.name.c_str(), c.ranks, period.c_str(), method.c_str(), us(r.all_p50), us(r.all_p99),
      us(worst99), us(worst999), ref_p99 > 0 ? worst99 / ref_p99 : 0.0, r.rows_per_s / 1e6,
      r.server_cpu_us_per_row, r.client_cpu_us_per_row);
  if (c.prefill) {
    printf(" prefill: %" PRIu64 " x 98,304 rows, mean %.1f ms, max %.1f ms |", r.prefill_batches,
           r.prefill_mean_ms, r.prefill_max_ms);
  }
  if (c.flooders > 0) {
    printf(" floods: %" PRIu64 " rows queued, %" PRIu64 " calls refused |", r.flood_rows,
           r.flood_refused);
  }
  if (c.period_ms > 0) {
    printf(" rank timers late %.0f µs mean, %.0f max |", r.wake_late_mean_us, r.wake_late_max_us);
  }
  if (!r.ok) printf(" FAILED: %s", r.error.c_str());
  printf("\n");
  if (ThroughDaemon(method.substr(0, method.find('/'))) && r.p99.size() > 1) {
    printf("|   per rank p50/p99/p99.9 µs:");
    for (size_t i = 0; i < r.p99.size(); ++i) {
      printf(" %.0f/%.0f/%.0f", us(r.p50[i]), us(r.p99[i]), us(r.p999[i]));
    }
    printf(" |\n");
  }
  fflush(stdout);
}

// Opens the benchmark's tables, writing them first when they are missing; `args` gets the
// engramd arguments that serve them.
absl::Status PrepareTables(const Config& cfg, std::vector<std::unique_ptr<Table>>* tables,
                           std::vector<std::string>* args) {
  const std::string tag = absl::StrCat(cfg.rows);
  if (cfg.layout == "packed") {
    for (uint32_t layer : kLayers) {
      const std::string path = absl::StrCat(cfg.dir, "/packed-", layer, "-", tag, ".engram");
      auto t = testing::OpenOne(path, layer);
      if (!t.ok()) {
        fprintf(stderr, "writing %s...\n", path.c_str());
        if (absl::Status s = testing::WriteSyntheticPacked(path, layer, cfg.rows, kSeed); !s.ok()) {
          return s;
        }
        t = testing::OpenOne(path, layer);
      }
      if (!t.ok()) return t.status();
      args->insert(args->end(), {"--table", path});
      tables->push_back(std::move(*t));
    }
    return absl::OkStatus();
  }
  if (cfg.layout != "checkpoint") {
    return absl::InvalidArgumentError(
        absl::StrCat("--layout must be checkpoint or packed, not '", cfg.layout, "'"));
  }
  const std::string model = absl::StrCat(cfg.dir, "/model-", tag);
  auto opened = OpenTables(model, {});
  if (!opened.ok() || opened->size() != 2) {
    fprintf(stderr, "writing a synthetic checkpoint of 2 x %" PRIu64 " rows in %s...\n", cfg.rows,
            model.c_str());
    std::error_code ec;
    std::filesystem::remove_all(model, ec);
    absl::Status s = WriteSyntheticCheckpoint(
        {.out_dir = model, .rows = cfg.rows, .seed = kSeed, .layers = {1, 14}});
    if (!s.ok()) return s;
    opened = OpenTables(model, {});
  }
  if (!opened.ok()) return opened.status();
  *tables = std::move(*opened);
  std::sort(tables->begin(), tables->end(),
            [](const auto& a, const auto& b) { return a->layer_id() < b->layer_id(); });
  args->insert(args->end(), {"--model", model});
  return absl::OkStatus();
}

// Waits until both tables are resident: engram_map_table answers -EAGAIN while one loads.
absl::Status WaitResident(const std::string& sock) {
  engram_connect_options o;
  engram_connect_options_init(&o, sizeof(o));
  o.socket_path = sock.c_str();
  o.client_name = "engram-ranks";
  engram_session* s = nullptr;
  if (engram_connect(&o, &s) != 0) {
    return absl::UnavailableError(absl::StrCat("connect: ", engram_last_error()));
  }
  absl::Status status = absl::DeadlineExceededError("the tables did not load within 600 s");
  for (int i = 0; i < 60000; ++i) {
    int loaded = 0;
    for (uint32_t layer : kLayers) {
      engram_table_map* m = nullptr;
      const int rc = engram_map_table(s, layer, &m);
      if (rc == 0) ++loaded;
      engram_unmap_table(m);
      if (rc != 0 && rc != -EAGAIN) {
        status = absl::FailedPreconditionError(
            absl::StrCat("map layer ", layer, ": ", engram_last_error()));
        i = 60000;
        break;
      }
    }
    if (loaded == 2) {
      status = absl::OkStatus();
      break;
    }
    usleep(10000);
  }
  engram_close(s);
  return status;
}

// Fills in engramd's path and a temporary work directory when the options left them out;
// false (after saying why) when the directory cannot be made.
bool ResolveDefaults(Config& cfg, bool* temp_dir) {
  if (cfg.engramd.empty()) {
    cfg.engramd = EngramdPath(
        (std::filesystem::canonical("/proc/self/exe").parent_path() / "../../daemon/engramd")
            .string());
  }
  *temp_dir = cfg.dir.empty();
  if (*temp_dir) {
    char tmpl[] = "/var/tmp/engram-ranks-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      perror("mkdtemp");
      return false;
    }
    cfg.dir = tmpl;
  }
  std::filesystem::create_directories(cfg.dir);
  return true;
}

// The methods to run, checked against the tier and the other options; nullopt after saying
// what is wrong.
std::optional<std::vector<std::string>> CheckedMethods(Config& cfg) {
  if (cfg.tier != "storage" && cfg.tier != "resident" && cfg.tier != "cache") {
    fprintf(stderr, "--tier: '%s' is not storage, resident or cache\n", cfg.tier.c_str());
    return std::nullopt;
  }
  if (cfg.methods_arg.empty()) {
    cfg.methods_arg =
        cfg.tier == "resident" ? "daemon,inplace,mapped,engine" : "daemon,engine,uring";
  }
  std::vector<std::string> methods = absl::StrSplit(cfg.methods_arg, ',', absl::SkipEmpty());
  for (const std::string& m : methods) {
    if (!ThroughDaemon(m) && m != "engine" && m != "uring" && m != "mapped") {
      fprintf(stderr,
              "--methods: unknown method '%s' (daemon, inplace, pieces, mapped, engine, uring)\n",
              m.c_str());
      return std::nullopt;
    }
    if (m == "pieces" && cfg.piece_rows == 0) {
      fprintf(stderr, "--piece-rows must be positive for the pieces method\n");
      return std::nullopt;
    }
    if (m == "mapped" && cfg.tier != "resident") {
      fprintf(stderr,
              "--methods: 'mapped' reads the daemon's resident tables: add --tier resident\n");
      return std::nullopt;
    }
  }
  for (int n : cfg.ranks) {
    if (n < 1 || n > kMaxRanks) {
      fprintf(stderr, "--ranks: %d is not in [1, %d]\n", n, kMaxRanks);
      return std::nullopt;
    }
  }
  return methods;
}

// Starts engramd serving the tables (args holds the table arguments already) and waits for the
// resident tier to load; -1 after saying why.
pid_t StartDaemon(const Config& cfg, const std::string& sock, std::vector<std::string> args) {
  args.insert(args.end(), {"--socket", sock, "--log-level", "warning", "--max-clients", "256",
                           "--default-tier", cfg.tier});
  if (cfg.emulate_latency_us != 0 || cfg.emulate_iops != 0) {
    args.insert(args.end(), {"--emulate-read-latency-us", absl::StrCat(cfg.emulate_latency_us),
                             "--emulate-read-iops", absl::StrCat(cfg.emulate_iops)});
  }
  args.insert(args.end(), cfg.daemon_args.begin(), cfg.daemon_args.end());
  if (cfg.poll_modes.empty()) {
    PrintHeader(cfg, args);
  } else {
    printf("engramd:");
    for (size_t i = 1; i < args.size(); ++i) printf(" %s", args[i].c_str());
    printf("\n");
  }
  const pid_t daemon = StartEngramd(args, sock);
  if (daemon < 0) return -1;
  if (cfg.tier == "resident") {
    if (absl::Status s = WaitResident(sock); !s.ok()) {
      fprintf(stderr, "%s\n", s.ToString().c_str());
      kill(daemon, SIGTERM);
      waitpid(daemon, nullptr, 0);
      return -1;
    }
  }
  return daemon;
}

// Stops every daemon; the first nonzero exit status (-1: killed by a signal), else 0.
int StopDaemons(const std::vector<Daemon>& daemons) {
  int first = 0;
  for (const Daemon& d : daemons) kill(d.pid, SIGTERM);
  for (const Daemon& d : daemons) {
    int status = 0;
    waitpid(d.pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (first == 0) first = code;
  }
  return first;
}

// engramd's arguments for a --poll-modes entry ("off", "auto", "on", "on:N"); nullopt after
// saying what is wrong.
std::optional<std::vector<std::string>> PollModeArgs(const std::string& entry) {
  const std::vector<std::string> parts = absl::StrSplit(entry, ':');
  uint32_t cores = 0;
  if (parts.size() > 2 || (parts[0] != "off" && parts[0] != "on" && parts[0] != "auto") ||
      (parts.size() == 2 && (parts[0] != "on" || !absl::SimpleAtoi(parts[1], &cores)))) {
    fprintf(stderr, "--poll-modes: '%s' is not off, auto, on or on:CORES\n", entry.c_str());
    return std::nullopt;
  }
  std::vector<std::string> args = {"--poll-mode", parts[0]};
  if (parts.size() == 2) args.insert(args.end(), {"--poll-cores", parts[1]});
  return args;
}

// Starts one engramd, or one per --poll-modes entry; empty after saying why one did not start
// (those started are stopped).
std::vector<Daemon> StartDaemons(const Config& cfg, const std::vector<std::string>& args) {
  std::vector<Daemon> daemons;
  if (cfg.poll_modes.empty()) {
    Daemon d{"", cfg.dir + "/engramd.sock"};
    d.pid = StartDaemon(cfg, d.sock, args);
    if (d.pid > 0) daemons.push_back(d);
    return daemons;
  }
  PrintHeader(cfg, args);
  for (size_t i = 0; i < cfg.poll_modes.size(); ++i) {
    std::optional<std::vector<std::string>> mode = PollModeArgs(cfg.poll_modes[i]);
    Daemon d{cfg.poll_modes[i], absl::StrCat(cfg.dir, "/engramd-", i, ".sock")};
    if (mode) {
      std::vector<std::string> with = args;
      with.insert(with.end(), mode->begin(), mode->end());
      d.pid = StartDaemon(cfg, d.sock, with);
    }
    if (d.pid <= 0) {
      StopDaemons(daemons);
      return {};
    }
    daemons.push_back(d);
  }
  printf("\n");
  return daemons;
}

// Runs every case of the matrix with every method (through every engramd) and prints the table;
// returns the failures.
int RunMatrix(Env& env, const std::vector<std::string>& methods,
              const std::vector<Daemon>& daemons) {
  const std::string reference =
      std::find(methods.begin(), methods.end(), "mapped") != methods.end() ? "mapped" : "engine";
  printf(
      "| case | N | period | method | p50 µs | p99 µs | worst rank p99 | worst rank p99.9 | "
      "vs %s | rows/s | server CPU µs/row | client CPU µs/row |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      reference.c_str());
  int failures = 0;
  for (const Case& c : Matrix(*env.cfg)) {
    std::vector<std::pair<std::string, CaseResult>> results;
    double ref_p99 = 0;
    env.seed = 17 + c.ranks;  // every method of a case gathers the same ids
    for (const std::string& m : methods) {
      for (const Daemon& d : daemons) {
        if (!ThroughDaemon(m) && &d != &daemons.front()) break;
        env.sock = d.sock;
        CaseResult r = RunCase(env, c, m, ThroughDaemon(m) ? d.pid : -1);
        failures += !r.ok;
        if (m == reference && !r.p99.empty()) {
          ref_p99 = *std::max_element(r.p99.begin(), r.p99.end());
        }
        const bool labelled = ThroughDaemon(m) && !d.label.empty();
        results.emplace_back(labelled ? absl::StrCat(m, "/", d.label) : m, std::move(r));
      }
    }
    for (const auto& [m, r] : results) PrintCase(c, m, r, ref_p99);
  }
  return failures;
}

int Run(Config& cfg) {
  bool temp_dir = false;
  if (!ResolveDefaults(cfg, &temp_dir)) return 1;
  const std::optional<std::vector<std::string>> methods = CheckedMethods(cfg);
  if (!methods) return 2;
  std::vector<std::unique_ptr<Table>> owned;
  std::vector<std::string> args = {cfg.engramd};
  if (absl::Status s = PrepareTables(cfg, &owned, &args); !s.ok()) {
    fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  Env env{.cfg = &cfg, .tables = {owned[0].get(), owned[1].get()}};
  Trace trace;
  if (!cfg.trace.empty()) {
    auto t = ReadTrace(cfg.trace, std::min(owned[0]->num_rows(), owned[1]->num_rows()));
    if (!t.ok()) {
      fprintf(stderr, "%s\n", t.status().ToString().c_str());
      return 2;
    }
    trace = std::move(*t);
    env.trace = &trace;
  }
  const std::vector<Daemon> daemons = StartDaemons(cfg, args);
  if (daemons.empty()) return 1;
  const uint64_t t0 = NowNs();
  const int failures = RunMatrix(env, *methods, daemons);
  const int stopped = StopDaemons(daemons);
  printf("\n%s in %.0f s; engramd exit status %d\n", failures ? "FAILURES" : "every case ran",
         (NowNs() - t0) / 1e9, stopped);
  owned.clear();
  if (temp_dir) std::filesystem::remove_all(cfg.dir);
  return failures == 0 && stopped == 0 ? 0 : 1;
}

void AddOptions(CLI::App& app, Config& cfg) {
  app.add_option("--engramd", cfg.engramd, "engramd binary (default: $ENGRAMD or the build's)");
  app.add_option("--dir", cfg.dir, "where the tables are written and reused (default: temporary)");
  app.add_option("--rows", cfg.rows, "rows per table")->capture_default_str();
  app.add_option("--layout", cfg.layout, "checkpoint or packed")->capture_default_str();
  app.add_option("--ranks", cfg.ranks, "client processes per case")->delimiter(',');
  app.add_option("--tp", cfg.tp, "rank r reads slice r mod tp of every table")
      ->capture_default_str();
  app.add_option("--step-rows", cfg.step_rows, "rows per layer per step")->capture_default_str();
  app.add_option("--period-ms", cfg.period_ms, "one step every this many ms (0: back to back)")
      ->capture_default_str();
  app.add_option("--steps", cfg.steps, "steps per rank and case")->capture_default_str();
  app.add_option("--zipf-s", cfg.zipf_s, "Zipf exponent")->capture_default_str();
  app.add_option("--miss", cfg.miss,
                 "fraction of each step's rows evicted before the step in the miss cases (0: no "
                 "miss cases)")
      ->capture_default_str();
  app.add_option("--trace", cfg.trace,
                 "row ids per step from a text file: one line per step, LAYER:ID,ID,... groups");
  app.add_option("--tier", cfg.tier,
                 "the daemon's tier for both tables: storage, resident (adds the inplace and "
                 "mapped methods: the same memory read in each rank's process) or cache (give it "
                 "a size with "
                 "--daemon-arg=--cache-bytes=...)")
      ->capture_default_str();
  app.add_option("--methods", cfg.methods_arg,
                 "daemon, inplace, pieces, mapped, engine, uring (default: daemon,engine,uring; "
                 "with --tier resident daemon,inplace,mapped,engine)");
  app.add_option("--piece-rows", cfg.piece_rows,
                 "the pieces method: rows per request (each layer's step in pieces)")
      ->capture_default_str();
  app.add_option("--daemon-arg", cfg.daemon_args, "extra engramd argument (repeatable)");
  app.add_option("--client-spin-us", cfg.client_spin_us,
                 "how long a client spins for its completion before sleeping (0: the library's "
                 "adaptive default)");
  app.add_option("--poll-modes", cfg.poll_modes,
                 "one engramd per engine.poll_mode listed (off, auto, on, on:CORES), each method "
                 "through engramd run against each side by side")
      ->delimiter(',');
  app.add_option("--emulate-read-latency-us", cfg.emulate_latency_us,
                 "engramd holds every O_DIRECT read (cache-tier misses) to at least this latency "
                 "(benchmarking only; a DGX Spark NVMe: 286)");
  app.add_option("--emulate-read-iops", cfg.emulate_iops,
                 "engramd completes O_DIRECT reads no faster than this many 4 KiB reads/s "
                 "(benchmarking only; a DGX Spark NVMe: 112000)");
  app.add_flag("--smoke", cfg.smoke, "a tiny run that only checks that the benchmark works");
  app.add_option("--prefetch-flood", cfg.prefetch_flood,
                 "run only one decode rank alone and beside this many processes that prefetch "
                 "as fast as engramd answers (0: the usual matrix)")
      ->check(CLI::Range(0, 64));
}

}  // namespace
}  // namespace engram::bench

int main(int argc, char** argv) {
  engram::bench::Config cfg;
  CLI::App app{"engram-ranks: per-rank decode latency with many client processes"};
  engram::bench::AddOptions(app, cfg);
  CLI11_PARSE(app, argc, argv);
  if (cfg.smoke) {
    cfg.rows = 20000;
    cfg.ranks = {1, 2};
    cfg.steps = 5;
    cfg.step_rows = 64;
    cfg.period_ms = 2;
  }
  if (cfg.steps == 0 || cfg.step_rows == 0 || cfg.tp == 0 || cfg.ranks.empty()) {
    fprintf(stderr, "--steps, --step-rows, --tp and --ranks must be positive\n");
    return 2;
  }
  return engram::bench::Run(cfg);
}
