// engram-ranks: decode latency under load. N client processes (one per engine rank) each gather
// their rank's rows of both Engram layers every T ms on a common clock, through engramd and, side
// by side, with the same gather engine in each process and with a plain io_uring loop in each
// process; per-step p50/p99/p99.9 per rank, aggregate rows/s and CPU per row; a mixed case runs
// one prefill process next to the decode ranks. With --prefetch-flood N, one decode rank alone
// and then beside N processes that send PREFETCH entries as fast as engramd answers them. With
// --steady and --timeline-s (--tier cache, --trace), the row cache's targets instead: a steady
// state with part of the trace's rows cached against all of them cached plus one device read,
// decode alone and beside a prefill, the all-hit cache read in place against a resident table,
// and a cold start's p99 and hit rate per window (bench/README.md, "DGX Spark targets").
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
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <unordered_set>
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
#include "nlohmann/json.hpp"
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
  // The cache tier's targets instead of the matrix (RunCacheTargets; --tier cache, --trace):
  // --steady, and a cold start's timeline of --timeline-s seconds in --window-s windows.
  bool steady = false;
  double cache_fraction = 0.5;  // the part cache holds this fraction of the trace's rows
  double warm_passes = 1;       // passes over the trace before the timed steps
  double timeline_s = 0, window_s = 5;
  uint32_t read_samples = 2000;  // O_DIRECT reads that measure one device read
  std::string engramctl;
};

bool CacheTargetsMode(const Config& cfg) { return cfg.steady || cfg.timeline_s > 0; }

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
  double evict = 0;             // fraction of each step's rows evicted before the step
  bool prefill = false;         // one more process gathers 98,304-row batches back to back
  int flooders = 0;             // processes that prefetch 4 x 8,192 rows per call, back to back
  uint32_t steps = 0;           // steps per rank (0: --steps)
  uint32_t trace_offset = 0;    // each rank starts this many steps into its share of the trace
  bool warm_page_cache = true;  // read every table file into the page cache first
  bool prefault = false;  // each rank gathers its steps once, untimed, before the clock (trace)
};

uint32_t StepsOf(const Config& cfg, const Case& c) { return c.steps != 0 ? c.steps : cfg.steps; }

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

// Copies a rank's rows of trace step `step` of case `c` into the gatherer's id buffers; n[l]:
// how many of layer l.
void FillFromTrace(const Env& env, const Case& c, int rank, uint32_t step, StepGatherer* g,
                   size_t n[2]) {
  const Trace& trace = *env.trace;
  for (int l = 0; l < 2; ++l) {
    const auto& ids = trace[(rank * trace.size() / std::max(1, c.ranks) + c.trace_offset + step) %
                            trace.size()][l];
    n[l] = std::min<size_t>(ids.size(), env.cfg->step_rows * 2);
    std::copy(ids.begin(), ids.begin() + n[l], g->ids(l));
  }
}

// Waits for a paced step's scheduled start; returns the time its latency counts from: the
// scheduled start when the rank could not start on time (its last step overran: that wait
// counts), else when its timer woke it. An engine submits a step when it is ready, not from a
// timer, so the timer's own lateness (tens to hundreds of µs on a VM) is left out and reported
// beside the table instead.
uint64_t WaitForStep(uint64_t scheduled, uint64_t period, int rank, SharedResults* out) {
  uint64_t t0 = NowNs();
  if (period > 0 && t0 <= scheduled) {
    SleepUntil(scheduled);
    t0 = NowNs();
    out->wake_late_sum_ns[rank] += t0 - scheduled;
    out->wake_late_max_ns[rank] = std::max(out->wake_late_max_ns[rank], t0 - scheduled);
  } else if (period > 0) {
    t0 = scheduled;
  }
  return t0;
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
  const uint32_t steps = StepsOf(cfg, c);
  // Untimed, before the clock: the case's steps once, so that the pages its rows lie on are
  // mapped in this process (a fresh process's first touch of a page faults).
  for (uint32_t step = 0; c.prefault && env.trace != nullptr && step < steps; ++step) {
    size_t n[2];
    FillFromTrace(env, c, rank, step, g.get(), n);
    if (!g->Gather(n)) return fail(g->error);
  }
  out->ready.fetch_add(1);
  uint64_t start;
  while ((start = out->start_ns.load()) == 0) usleep(200);
  SleepUntil(start);  // every case starts on the common clock, back to back ones too
  const uint64_t period = static_cast<uint64_t>(c.period_ms * 1e6);
  const uint64_t cpu0 = SelfCpuNs();
  std::vector<uint64_t> evict;
  for (uint32_t step = 0; step < steps; ++step) {
    size_t n[2];
    if (env.trace != nullptr) FillFromTrace(env, c, rank, step, g.get(), n);
    for (int l = 0; l < 2; ++l) {
      if (env.trace == nullptr) {
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
    const uint64_t t0 = WaitForStep(start + step * period, period, rank, out);
    if (!g->Gather(n)) return fail(g->error);
    out->lat[rank * steps + step] = NowNs() - t0;
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
  std::vector<uint64_t> lat;  // every decode step's latency, ns: lat[rank * steps + step]
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
  r->lat = std::move(all);
}

// Runs in the parent once a case's ranks are started (arguments: the common start,
// CLOCK_MONOTONIC ns, and the ranks' shared results) and before their exits are collected.
using During = std::function<void(uint64_t, const SharedResults&)>;

// `during`: see During.
CaseResult RunCase(const Env& env, const Case& c, const std::string& method, pid_t daemon,
                   const During& during = nullptr) {
  const Config& cfg = *env.cfg;
  const int decoders = c.prefill ? c.ranks - 1 : c.ranks;
  const uint32_t steps = StepsOf(cfg, c);
  const size_t bytes = sizeof(SharedResults) + sizeof(uint64_t) * (c.ranks * steps + 1);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CaseResult r;
  if (mem == MAP_FAILED) {
    r.ok = false;
    r.error = "mmap of the results area failed";
    return r;
  }
  auto* out = new (mem) SharedResults();
  if (c.warm_page_cache) WarmTables(env.tables);
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
  if (during) during(start, *out);
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
  TakeLatencies(*out, decoders, steps, &r);
  const double decode_rows = static_cast<double>(decoders) * steps * cfg.step_rows * 2;
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
  r.wake_late_mean_us = late_sum / 1e3 / (double(c.ranks) * steps);
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
  if (CacheTargetsMode(cfg)) {
    if (cfg.tier != "cache" || cfg.trace.empty()) {
      fprintf(stderr,
              "--steady and --timeline-s measure the cache tier on a trace: add --tier "
              "cache and --trace FILE\n");
      return std::nullopt;
    }
    for (const std::string& a : cfg.daemon_args) {
      if (a.rfind("--cache-bytes", 0) == 0 || a.rfind("--default-tier", 0) == 0) {
        fprintf(stderr,
                "--daemon-arg=%s: --steady and --timeline-s size the cache and pick the "
                "tier themselves\n",
                a.c_str());
        return std::nullopt;
      }
    }
    if (!(cfg.cache_fraction > 0 && cfg.cache_fraction < 1) || !(cfg.warm_passes > 0) ||
        !(cfg.window_s > 0) || cfg.period_ms <= 0 || cfg.read_samples == 0) {
      fprintf(stderr,
              "--cache-fraction must be in (0, 1); --warm-passes, --window-s, "
              "--period-ms and --read-samples positive\n");
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

// Starts engramd serving the tables (args holds the table arguments already) with `tier` as its
// default tier (empty: --tier) and waits for the resident tier to load; -1 after saying why.
pid_t StartDaemon(const Config& cfg, const std::string& sock, std::vector<std::string> args,
                  std::string tier = "") {
  if (tier.empty()) tier = cfg.tier;
  args.insert(args.end(), {"--socket", sock, "--log-level", "warning", "--max-clients", "256",
                           "--default-tier", tier});
  if (cfg.emulate_latency_us != 0 || cfg.emulate_iops != 0) {
    args.insert(args.end(), {"--emulate-read-latency-us", absl::StrCat(cfg.emulate_latency_us),
                             "--emulate-read-iops", absl::StrCat(cfg.emulate_iops)});
  }
  args.insert(args.end(), cfg.daemon_args.begin(), cfg.daemon_args.end());
  if (cfg.poll_modes.empty() && !CacheTargetsMode(cfg)) {
    PrintHeader(cfg, args);
  } else {
    printf("engramd:");
    for (size_t i = 1; i < args.size(); ++i) printf(" %s", args[i].c_str());
    printf("\n");
  }
  const pid_t daemon = StartEngramd(args, sock);
  if (daemon < 0) return -1;
  if (tier == "resident") {
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

// ---- The cache tier's targets (--steady, --timeline-s): a steady state with part of the rows
// cached against the same ids all cached plus one device read, a prefill beside the steady
// decode ranks, the client's in-place reads of an all-hit cache against a resident table's, and
// a cold start's timeline.

// engramctl: --engramctl, else $ENGRAMCTL, else beside engramd (a bundle's bin/), else the build
// tree's.
std::string EngramctlPath(const Config& cfg) {
  if (!cfg.engramctl.empty()) return cfg.engramctl;
  if (const char* env = getenv("ENGRAMCTL"); env != nullptr && env[0] != '\0') return env;
  const std::filesystem::path dir = std::filesystem::path(cfg.engramd).parent_path();
  if (std::filesystem::exists(dir / "engramctl")) return (dir / "engramctl").string();
  return (dir / "../tools/engramctl/engramctl").string();
}

// The row cache's counters, from `engramctl status --json` (in-place hits folded in).
struct CacheCounters {
  uint64_t hits = 0, misses = 0, used_rows = 0, capacity_rows = 0;
};

absl::StatusOr<CacheCounters> ReadCacheCounters(const Config& cfg, const std::string& sock) {
  const std::string line =
      absl::StrCat(EngramctlPath(cfg), " status --json --socket ", sock, " 2>&1");
  FILE* p = popen(line.c_str(), "r");
  if (p == nullptr) return absl::InternalError(absl::StrCat("cannot run `", line, "`"));
  std::string text;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) text.append(buf, n);
  const int rc = pclose(p);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (rc != 0 || j.is_discarded() || !j.contains("store") || !j["store"].contains("cache")) {
    return absl::UnavailableError(absl::StrCat("`", line, "` gave no row cache counters (set ",
                                               "--engramctl): ", text.substr(0, 200)));
  }
  const nlohmann::json& c = j["store"]["cache"];
  return CacheCounters{c.value("hits", uint64_t{0}), c.value("misses", uint64_t{0}),
                       c.value("used_rows", uint64_t{0}), c.value("capacity_rows", uint64_t{0})};
}

// Hit rate between two counter readings (-1: no lookups).
double HitRate(const CacheCounters& a, const CacheCounters& b) {
  const uint64_t hits = b.hits - a.hits, lookups = hits + (b.misses - a.misses);
  return lookups == 0 ? -1 : double(hits) / double(lookups);
}

// One O_DIRECT 4 KiB read at queue depth 1, random pages of the largest table file: the device's
// latency for one row as engramd's misses read it.
struct OneRead {
  uint64_t p50 = 0, p99 = 0;
  uint32_t reads = 0;
  std::string file;
};

absl::StatusOr<OneRead> MeasureOneRead(const std::vector<const Table*>& tables, uint32_t reads) {
  const TableFile* f = nullptr;
  for (const Table* t : tables) {
    for (const TableFile& tf : t->files()) {
      if (f == nullptr || tf.size > f->size) f = &tf;
    }
  }
  if (f == nullptr || f->size < 4096) return absl::FailedPreconditionError("no table file");
  const int fd = open(f->path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "open ", f->path, " with O_DIRECT: ", strerror(errno), " (--dir must be on a device)"));
  }
  void* raw = nullptr;
  if (posix_memalign(&raw, 4096, 4096) != 0) raw = nullptr;
  std::unique_ptr<void, decltype(&free)> buf(raw, &free);
  OneRead r{.reads = reads, .file = f->path};
  std::mt19937_64 rng(99);
  std::vector<uint64_t> ns;
  for (uint32_t i = 0; i < reads && buf != nullptr; ++i) {
    const uint64_t off = rng() % (f->size / 4096) * 4096;
    const uint64_t t0 = NowNs();
    if (pread(fd, buf.get(), 4096, static_cast<off_t>(off)) != 4096) {
      const std::string why = strerror(errno);
      close(fd);
      return absl::DataLossError(
          absl::StrCat("O_DIRECT read of ", f->path, " at ", off, ": ", why));
    }
    ns.push_back(NowNs() - t0);
  }
  close(fd);
  if (buf == nullptr) return absl::ResourceExhaustedError("no aligned buffer");
  r.p50 = Quantile(ns, 0.5);
  r.p99 = Quantile(ns, 0.99);
  return r;
}

// Distinct (layer, row) pairs the trace reads: the rows a cache holding all of them holds.
uint64_t DistinctRows(const Trace& trace) {
  std::unordered_set<uint64_t> keys;
  for (const auto& step : trace) {
    for (int l = 0; l < 2; ++l) {
      for (uint64_t id : step[l]) keys.insert(uint64_t(l) << 56 | id);
    }
  }
  return keys.size();
}

// Pages of the table files in the page cache (mincore), after dropping them when `drop`.
uint64_t TablePagesCached(const std::vector<const Table*>& tables, bool drop, uint64_t* ret_pages) {
  uint64_t cached = 0, pages = 0;
  const long page = sysconf(_SC_PAGESIZE);
  for (const Table* t : tables) {
    for (const TableFile& f : t->files()) {
      if (drop) posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
      void* m = mmap(nullptr, f.size, PROT_READ, MAP_SHARED, f.fd, 0);
      if (m == MAP_FAILED) continue;
      std::vector<unsigned char> vec((f.size + page - 1) / page);
      if (mincore(m, f.size, vec.data()) == 0) {
        for (unsigned char v : vec) cached += v & 1;
      }
      pages += vec.size();
      munmap(m, f.size);
    }
  }
  *ret_pages = pages;
  return cached;
}

// A case run against one engramd with the row cache's hit rate over it.
struct CountedCase {
  CaseResult r;
  double hit_rate = -1;
  uint64_t lookups = 0;
};

CountedCase RunCounted(Env& env, const Case& c, const std::string& method, const Daemon& d,
                       const During& during = nullptr) {
  env.sock = d.sock;
  CountedCase out;
  const auto before = ReadCacheCounters(*env.cfg, d.sock);
  out.r = RunCase(env, c, method, d.pid, during);
  const auto after = ReadCacheCounters(*env.cfg, d.sock);
  if (!before.ok() || !after.ok()) {
    out.r.ok = false;
    out.r.error = (before.ok() ? after.status() : before.status()).ToString();
    return out;
  }
  out.hit_rate = HitRate(*before, *after);
  out.lookups = (after->hits - before->hits) + (after->misses - before->misses);
  return out;
}

// Starts one engramd of the cache-targets run: `tier` by default, a row cache of `cache_bytes`
// (0: none); prints its label and command line.
Daemon StartLabelled(const Config& cfg, const std::string& label, const std::string& tier,
                     uint64_t cache_bytes, std::vector<std::string> args) {
  if (cache_bytes != 0) args.insert(args.end(), {"--cache-bytes", absl::StrCat(cache_bytes)});
  Daemon d{label, absl::StrCat(cfg.dir, "/engramd-", label.substr(0, label.find(' ')), ".sock")};
  printf("%s, ", label.c_str());  // StartDaemon prints the command line after it
  d.pid = StartDaemon(cfg, d.sock, args, tier);
  fflush(stdout);
  return d;
}

// An engramd whose row cache holds `rows` rows (within 2 %): the cache's bookkeeping per slot
// depends on its size (store/row_cache.cc), so the size is found by starting it, reading the
// capacity engramctl reports and starting it again with the bytes scaled (at most 4 starts).
// pid -1 after saying why.
Daemon StartSizedCache(const Config& cfg, const std::string& label, uint64_t rows,
                       const std::vector<std::string>& args) {
  uint64_t bytes = rows * 400 + (64 << 10);
  for (int attempt = 0;; ++attempt) {
    Daemon d = StartLabelled(cfg, label, "cache", bytes, args);
    if (d.pid <= 0) return d;
    const auto c = ReadCacheCounters(cfg, d.sock);
    if (!c.ok() || c->capacity_rows == 0) {
      fprintf(stderr, "%s: %s\n", label.c_str(),
              c.ok() ? "the row cache reports no capacity" : c.status().ToString().c_str());
      StopDaemons({d});
      return Daemon{label, d.sock, -1};
    }
    const double off = double(c->capacity_rows) / double(rows);
    if ((off > 0.98 && off < 1.02) || attempt == 3) {
      printf("engramd (%s): the row cache holds %" PRIu64 " rows (%.3f of the %" PRIu64
             " wanted)\n",
             label.c_str(), c->capacity_rows, off, rows);
      return d;
    }
    StopDaemons({d});
    bytes = static_cast<uint64_t>(double(bytes) / off) + 4096;
  }
}

// One target's verdict as a line of its own, which bench/spark-targets.sh reads:
// `target (X) WHAT | measured M | limit L | met|missed|not measured | DETAIL`; `ok` false: the
// cases behind it failed (not measured).
void PrintTarget(const char* target, const std::string& what, double measured,
                 const std::string& limit, bool ok, bool met, const std::string& detail) {
  printf("target (%s) %s | measured %.3f | limit %s | %s | %s\n", target, what.c_str(), measured,
         limit.c_str(),
         !ok   ? "not measured"
         : met ? "met"
               : "missed",
         detail.c_str());
  fflush(stdout);
}

// The back-to-back warm-up of `ranks` ranks (`--warm-passes` passes over the trace, shared
// among them) and the paced case that follows it on the trace's next steps.
std::pair<Case, Case> WarmAndTimed(const Config& cfg, const Trace& trace, int ranks,
                                   const std::string& name) {
  Case warm{"warm-up " + name, ranks, 0, "trace"};
  warm.steps = std::max<uint32_t>(
      1, static_cast<uint32_t>(std::ceil(cfg.warm_passes * trace.size() / ranks)));
  warm.warm_page_cache = false;
  Case timed{name, ranks, cfg.period_ms, "trace"};
  timed.trace_offset = warm.steps;
  timed.warm_page_cache = false;
  return {warm, timed};
}

void PrintWarmUp(const Case& w, const CountedCase& r) {
  printf("|   %s: %u steps a rank back to back in %.1f s, hit rate %.3f over %" PRIu64
         " lookups%s |\n",
         w.name.c_str(), w.steps, r.r.wall_ns / 1e9, r.hit_rate, r.lookups,
         r.r.ok ? "" : (" FAILED: " + r.r.error).c_str());
}

void PrintCounted(const Case& c, const std::string& method, const CountedCase& r, double ref) {
  PrintCase(c, method, r.r, ref);
  printf("|   row cache hit rate in the timed window: %.3f over %" PRIu64 " lookups |\n",
         r.hit_rate, r.lookups);
  fflush(stdout);
}

const char* kTargetsTableHead =
    "| case | N | period | method | p50 µs | p99 µs | worst rank p99 | worst rank p99.9 | "
    "vs ref | rows/s | server CPU µs/row | client CPU µs/row |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|\n";

// What the steady-state part measured, per rank count (index into cfg.ranks).
struct SteadyResults {
  std::vector<CountedCase> all_hit, half, cache_in_place;
  std::vector<uint64_t> steady_p99;
};

int RunAllHit(Env& env, const std::vector<std::string>& args, uint64_t distinct,
              SteadyResults* res) {
  const Config& cfg = *env.cfg;
  const Daemon d = StartSizedCache(cfg, "all-hit cache", distinct + distinct / 20 + 64, args);
  if (d.pid <= 0) return 1;
  int failures = 0;
  printf("\n%s", kTargetsTableHead);
  for (size_t i = 0; i < cfg.ranks.size(); ++i) {
    auto [warm, timed] = WarmAndTimed(cfg, *env.trace, cfg.ranks[i], "all hits");
    if (i == 0) {  // one pass fills a cache that holds every row; later counts start warm
      const CountedCase w = RunCounted(env, warm, "daemon", d);
      failures += !w.r.ok;
      PrintWarmUp(warm, w);
    }
    timed.prefault = true;  // all hits either way: the ranks' first touches left out
    res->all_hit.push_back(RunCounted(env, timed, "daemon", d));
    PrintCounted(timed, "daemon", res->all_hit.back(), 0);
    timed.name = "all hits, in place";
    res->cache_in_place.push_back(RunCounted(env, timed, "inplace", d));
    PrintCounted(timed, "inplace", res->cache_in_place.back(), 0);
    failures += !res->all_hit.back().r.ok + !res->cache_in_place.back().r.ok;
  }
  failures += StopDaemons({d}) != 0;
  return failures;
}

int RunHalf(Env& env, const std::vector<std::string>& args, uint64_t half_rows, const OneRead& read,
            SteadyResults* res) {
  const Config& cfg = *env.cfg;
  const Daemon d = StartSizedCache(cfg, "part cache", half_rows, args);
  if (d.pid <= 0) return 1;
  int failures = 0;
  printf("\n%s", kTargetsTableHead);
  uint32_t offset = 0;
  for (size_t i = 0; i < cfg.ranks.size(); ++i) {
    const int n = cfg.ranks[i];
    auto [warm, timed] = WarmAndTimed(cfg, *env.trace, n, "steady, part cached");
    const CountedCase w = RunCounted(env, warm, "daemon", d);
    PrintWarmUp(warm, w);
    res->half.push_back(RunCounted(env, timed, "daemon", d));
    const CountedCase& h = res->half.back();
    const CountedCase& a = res->all_hit[i];
    const double ref = double(a.r.all_p99 + read.p99);
    PrintCounted(timed, "daemon", h, ref);
    res->steady_p99.push_back(h.r.all_p99);
    failures += !w.r.ok + !h.r.ok;
    const double ratio = h.r.ok && a.r.ok ? h.r.all_p99 / ref : 0;
    PrintTarget("b", absl::StrCat("steady state, N=", n), ratio, "2x", ratio > 0, ratio <= 2,
                absl::StrFormat("decode p99 %.1f µs at hit rate %.3f / (all-hit p99 %.1f µs at "
                                "hit rate %.3f + one read p99 %.1f µs)",
                                h.r.all_p99 / 1e3, h.hit_rate, a.r.all_p99 / 1e3, a.hit_rate,
                                read.p99 / 1e3));
    offset = timed.trace_offset + StepsOf(cfg, timed);
  }
  // (c): decode alone, then the same decode ranks beside a prefill, on the same cache.
  const int mixed = std::max(2, std::min(8, cfg.ranks.back()));
  Case alone{absl::StrCat("steady, ", mixed - 1, " decode alone"), mixed - 1, cfg.period_ms,
             "trace"};
  alone.trace_offset = offset;
  alone.warm_page_cache = false;
  Case beside = alone;
  beside.name = absl::StrCat("steady, mixed ", mixed - 1, " + 1 prefill");
  beside.ranks = mixed;
  beside.prefill = true;
  const CountedCase ra = RunCounted(env, alone, "daemon", d);
  PrintCounted(alone, "daemon", ra, 0);
  const CountedCase rb = RunCounted(env, beside, "daemon", d);
  PrintCounted(beside, "daemon", rb, double(ra.r.all_p99));
  failures += !ra.r.ok + !rb.r.ok;
  const double ratio =
      ra.r.ok && rb.r.ok && ra.r.all_p99 > 0 ? double(rb.r.all_p99) / double(ra.r.all_p99) : 0;
  PrintTarget("c", absl::StrCat("mixed ", mixed - 1, " + 1 prefill"), ratio, "1.5x", ratio > 0,
              ratio <= 1.5,
              absl::StrFormat("decode p99 %.1f µs beside the prefill (hit rate %.3f) / %.1f µs "
                              "alone (hit rate %.3f)",
                              rb.r.all_p99 / 1e3, rb.hit_rate, ra.r.all_p99 / 1e3, ra.hit_rate));
  failures += StopDaemons({d}) != 0;
  return failures;
}

// The resident table read in place on the same ids as the all-hit cache's in-place case.
int RunResidentInPlace(Env& env, const std::vector<std::string>& args, SteadyResults* res) {
  const Config& cfg = *env.cfg;
  const Daemon d = StartLabelled(cfg, "resident", "resident", 0, args);
  if (d.pid <= 0) return 1;
  int failures = 0;
  printf("\n%s", kTargetsTableHead);
  for (size_t i = 0; i < cfg.ranks.size(); ++i) {
    Case timed = WarmAndTimed(cfg, *env.trace, cfg.ranks[i], "resident, in place").second;
    timed.prefault = true;  // as the all-hit cache's in-place case
    env.sock = d.sock;
    const CaseResult r = RunCase(env, timed, "inplace", d.pid);
    const CaseResult& c = res->cache_in_place[i].r;
    PrintCase(timed, "inplace", r, 0);
    failures += !r.ok;
    const bool ok = r.ok && c.ok && r.all_p50 > 0 && r.all_p99 > 0;
    printf(
        "in place, N=%d | p50 ratio %.3f | p99 ratio %.3f | cache all hits p50/p99 %.1f / %.1f "
        "µs (hit rate %.3f) | resident p50/p99 %.1f / %.1f µs\n",
        cfg.ranks[i], ok ? double(c.all_p50) / r.all_p50 : 0,
        ok ? double(c.all_p99) / r.all_p99 : 0, c.all_p50 / 1e3, c.all_p99 / 1e3,
        res->cache_in_place[i].hit_rate, r.all_p50 / 1e3, r.all_p99 / 1e3);
  }
  failures += StopDaemons({d}) != 0;
  return failures;
}

// Counter readings every --window-s from the common start until the decode ranks are done (a
// reading that fails leaves its window's hit rate out).
struct Sampler {
  const Config* cfg;
  const std::string* sock;
  int decoders;
  std::vector<std::optional<CacheCounters>> samples;  // samples[k]: k windows after the start
  void operator()(uint64_t start, const SharedResults& out) {
    const uint64_t window = static_cast<uint64_t>(cfg->window_s * 1e9);
    for (uint64_t k = 0;; ++k) {
      SleepUntil(start + k * window);
      auto c = ReadCacheCounters(*cfg, *sock);
      samples.push_back(c.ok() ? std::optional(*c) : std::nullopt);
      if (out.decode_done.load() + out.failures.load() >= decoders) return;
    }
  }
};

// Per window of the cold start: p50, p99 and the hit rate; the window from which on every p99
// is within 2x of `steady_p99`.
int PrintTimeline(const Config& cfg, const CaseResult& r, const Sampler& s, uint32_t steps,
                  uint64_t steady_p99, const char* steady_from) {
  const uint64_t window = static_cast<uint64_t>(cfg.window_s * 1e9);
  const uint64_t period = static_cast<uint64_t>(cfg.period_ms * 1e6);
  std::vector<std::vector<uint64_t>> by_window;
  for (size_t i = 0; i < r.lat.size(); ++i) {
    const uint64_t done = (i % steps) * period + r.lat[i];  // the step's end, ns after the start
    const size_t w = done / window;
    if (by_window.size() <= w) by_window.resize(w + 1);
    by_window[w].push_back(r.lat[i]);
  }
  printf(
      "\n| window s | steps ended | p50 µs | p99 µs | hit rate | p99 / steady p99 |\n"
      "|---|---|---|---|---|---|\n");
  std::vector<uint64_t> p99(by_window.size());
  for (size_t w = 0; w < by_window.size(); ++w) {
    p99[w] = by_window[w].empty() ? UINT64_MAX : Quantile(by_window[w], 0.99);
    double hit = -1;
    if (w + 1 < s.samples.size() && s.samples[w] && s.samples[w + 1]) {
      hit = HitRate(*s.samples[w], *s.samples[w + 1]);
    }
    printf("| %g-%g | %zu | %.1f | %.1f | %.3f | %.2f |\n", w * cfg.window_s,
           (w + 1) * cfg.window_s, by_window[w].size(), Quantile(by_window[w], 0.5) / 1e3,
           p99[w] == UINT64_MAX ? 0 : p99[w] / 1e3, hit,
           p99[w] == UINT64_MAX ? 0 : double(p99[w]) / steady_p99);
  }
  size_t from = p99.size();
  while (from > 0 && p99[from - 1] <= 2 * steady_p99) --from;
  const double at = from * cfg.window_s;
  const bool recovered = from < p99.size();
  printf("steady p99 %.1f µs (%s); every window's p99 within 2x of it from %s\n", steady_p99 / 1e3,
         steady_from,
         recovered ? absl::StrFormat("%.0f s on", at).c_str() : "no window on (not recovered)");
  PrintTarget("e", absl::StrCat("cold start, N=", r.p99.size()),
              recovered ? at : p99.size() * cfg.window_s, "60 s", r.ok, recovered && at <= 60,
              absl::StrFormat("seconds until every %g s window's p99 is within 2x of the steady "
                              "p99 %.1f µs (%s)%s",
                              cfg.window_s, steady_p99 / 1e3, steady_from,
                              recovered ? "" : "; not recovered within the timeline"));
  return 0;
}

// (e): a fresh engramd with an empty cache of the steady state's size, the table files' pages
// dropped from the page cache, the ranks paced for --timeline-s.
int RunTimeline(Env& env, const std::vector<std::string>& args, uint64_t cache_rows,
                uint64_t steady_p99) {
  const Config& cfg = *env.cfg;
  uint64_t pages = 0;
  const uint64_t cached = TablePagesCached(env.tables, true, &pages);
  printf("\ncold start: table files' pages in the page cache after POSIX_FADV_DONTNEED: %" PRIu64
         " of %" PRIu64 " (mincore)\n",
         cached, pages);
  const Daemon d = StartSizedCache(cfg, "cold cache", cache_rows, args);
  if (d.pid <= 0) return 1;
  const auto empty = ReadCacheCounters(cfg, d.sock);
  if (!empty.ok() || empty->used_rows != 0 || empty->hits + empty->misses != 0) {
    fprintf(stderr, "cold start: the row cache is not empty at the start: %s\n",
            empty.ok() ? absl::StrCat(empty->used_rows, " rows held").c_str()
                       : empty.status().ToString().c_str());
    StopDaemons({d});
    return 1;
  }
  printf("cold start: the row cache holds %" PRIu64 " rows of %" PRIu64
         " before the first step (engramctl status)\n",
         empty->used_rows, empty->capacity_rows);
  const int n = cfg.ranks.back();
  Case c{"cold start", n, cfg.period_ms, "trace"};
  c.steps = std::max<uint32_t>(1, static_cast<uint32_t>(cfg.timeline_s * 1e3 / cfg.period_ms));
  c.warm_page_cache = false;
  env.sock = d.sock;
  Sampler s{.cfg = &cfg, .sock = &d.sock, .decoders = n, .samples = {}};
  const uint64_t end_ns = static_cast<uint64_t>(c.steps * cfg.period_ms * 1e6);
  const CaseResult r = RunCase(env, c, "daemon", d.pid, std::ref(s));
  printf("%s", kTargetsTableHead);
  PrintCase(c, "daemon", r, 0);
  int failures = !r.ok;
  uint64_t steady = steady_p99;
  const char* from = "the steady state above";
  if (steady == 0 && r.lat.size() >= 3) {  // the last three windows' steps
    std::vector<uint64_t> tail;
    const uint64_t period = static_cast<uint64_t>(cfg.period_ms * 1e6);
    const uint64_t window = static_cast<uint64_t>(cfg.window_s * 1e9);
    for (size_t i = 0; i < r.lat.size(); ++i) {
      if ((i % c.steps) * period + 3 * window >= end_ns) tail.push_back(r.lat[i]);
    }
    steady = Quantile(tail, 0.99);
    from = "the last three windows";
  }
  if (r.ok) PrintTimeline(cfg, r, s, c.steps, std::max<uint64_t>(steady, 1), from);
  failures += StopDaemons({d}) != 0;
  return failures;
}

int RunCacheTargets(Env& env, const std::vector<std::string>& args) {
  const Config& cfg = *env.cfg;
  const uint64_t distinct = DistinctRows(*env.trace);
  const uint64_t part_rows =
      std::max<uint64_t>(1, static_cast<uint64_t>(cfg.cache_fraction * double(distinct)));
  PrintHeader(cfg, args);
  printf("trace: %zu steps, %" PRIu64 " distinct rows of both layers; part cache: %" PRIu64
         " rows (%.0f %%), all-hit cache: every one; warm-up: %.2f passes over the trace shared "
         "among the ranks, back to back, before each rank count's timed steps (which continue "
         "the trace where the warm-up stopped); p99 over every decode step of every rank\n",
         env.trace->size(), distinct, part_rows, cfg.cache_fraction * 100, cfg.warm_passes);
  const auto read = MeasureOneRead(env.tables, cfg.read_samples);
  if (!read.ok()) {
    fprintf(stderr, "one device read: %s\n", read.status().ToString().c_str());
    return 1;
  }
  OneRead one = *read;
  printf(
      "one device read: O_DIRECT 4 KiB at queue depth 1, %u random pages of %s: p50 %.1f µs, "
      "p99 %.1f µs\n",
      one.reads, one.file.c_str(), one.p50 / 1e3, one.p99 / 1e3);
  if (cfg.emulate_latency_us * 1000 > one.p99) {
    one.p50 = std::max<uint64_t>(one.p50, cfg.emulate_latency_us * 1000);
    one.p99 = cfg.emulate_latency_us * 1000;
    printf("one device read: engramd's emulated latency %" PRIu64 " µs is taken instead\n",
           cfg.emulate_latency_us);
  }
  fflush(stdout);
  int failures = 0;
  SteadyResults res;
  if (cfg.steady) {
    failures += RunAllHit(env, args, distinct, &res);
    if (res.all_hit.size() != cfg.ranks.size()) return failures + 1;
    failures += RunHalf(env, args, part_rows, one, &res);
    failures += RunResidentInPlace(env, args, &res);
  }
  if (cfg.timeline_s > 0) {
    failures +=
        RunTimeline(env, args, part_rows, res.steady_p99.empty() ? 0 : res.steady_p99.back());
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
  if (CacheTargetsMode(cfg)) {
    const uint64_t t0 = NowNs();
    const int failures = RunCacheTargets(env, args);
    printf("\n%s in %.0f s\n", failures ? "FAILURES" : "every case ran", (NowNs() - t0) / 1e9);
    owned.clear();
    if (temp_dir) std::filesystem::remove_all(cfg.dir);
    return failures == 0 ? 0 : 1;
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
  app.add_flag("--steady", cfg.steady,
               "instead of the matrix (--tier cache --trace FILE): for each --ranks count, the "
               "trace's ids with a cache holding --cache-fraction of the trace's rows, warmed by "
               "the workload, against the same ids with every row cached plus one O_DIRECT read "
               "(measured here); then decode alone and beside a prefill on that cache; then the "
               "all-hit cache read in place against a resident table read in place");
  app.add_option("--cache-fraction", cfg.cache_fraction,
                 "--steady, --timeline-s: the part cache holds this fraction of the distinct rows "
                 "the trace reads")
      ->capture_default_str();
  app.add_option("--warm-passes", cfg.warm_passes,
                 "--steady: passes over the trace (shared among the ranks, back to back) that "
                 "warm the cache before each rank count's timed steps")
      ->capture_default_str();
  app.add_option("--timeline-s", cfg.timeline_s,
                 "(--tier cache --trace FILE) a cold start: a fresh engramd with an empty cache "
                 "of the part cache's size, the last --ranks count paced for this many seconds, "
                 "p50/p99 and hit rate per --window-s window and when every window's p99 came "
                 "within 2x of the steady state's (0: no timeline)")
      ->capture_default_str();
  app.add_option("--window-s", cfg.window_s, "--timeline-s: seconds a window")
      ->capture_default_str();
  app.add_option("--read-samples", cfg.read_samples,
                 "--steady, --timeline-s: O_DIRECT 4 KiB reads at queue depth 1 that measure one "
                 "device read")
      ->capture_default_str();
  app.add_option("--engramctl", cfg.engramctl,
                 "engramctl binary for the row cache's counters (default: $ENGRAMCTL, beside "
                 "engramd, or the build's)");
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
