// engram-ranks' driver for one case: a process per decode rank (and the prefill and flood
// processes a case asks for) started on a common clock, each step timed, the results gathered
// from shared memory into latencies, rows/s and CPU per row.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <new>
#include <random>

#include "absl/strings/str_cat.h"
#include "bench/common/clocks.h"
#include "bench/common/row_ids.h"
#include "bench/common/stats.h"
#include "bench/daemon/ranks.h"
#include "bench/daemon/ranks_gatherers.h"
#include "engram/engram.h"
#include "engram/protocol.h"
#include "testkit/gather_test_util.h"

namespace engram::bench::ranks {
namespace {

// Copies a rank's rows of trace step `step` of case `c` into the gatherer's id buffers; n[l]:
// how many of layer l.
void FillFromTrace(const Env& env, const Case& c, int rank, uint32_t step, StepGatherer* g,
                   size_t n[2]) {
  const StepTrace& trace = *env.trace;
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
  if (engram_session_open(&o, &s) != 0) return 1;
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
  engram_session_close(s);
  return 0;
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

// Rows/s and CPU per row, the ranks' timer lateness and the prefill's batches, from the shared
// results of a case that ran r->wall_ns; `daemon_cpu`: engramd's CPU over it, ns.
void TakeRates(const SharedResults& out, const Config& cfg, const Case& c,
               const std::string& method, uint64_t daemon_cpu, CaseResult* r) {
  const int decoders = c.prefill ? c.ranks - 1 : c.ranks;
  const uint32_t steps = StepsOf(cfg, c);
  const double decode_rows = static_cast<double>(decoders) * steps * cfg.step_rows * 2;
  const double rows = decode_rows + static_cast<double>(out.prefill_batches) * kPrefillRows;
  r->rows_per_s = rows / (r->wall_ns / 1e9);
  uint64_t rank_cpu = 0;
  for (int i = 0; i < c.ranks; ++i) rank_cpu += out.cpu_ns[i];
  if (ThroughDaemon(method)) {
    r->server_cpu_us_per_row = daemon_cpu / 1e3 / rows;
    r->client_cpu_us_per_row = rank_cpu / 1e3 / rows;
  } else {
    r->server_cpu_us_per_row = rank_cpu / 1e3 / rows;
  }
  uint64_t late_sum = 0, late_max = 0;
  for (int i = 0; i < c.ranks; ++i) {
    late_sum += out.wake_late_sum_ns[i];
    late_max = std::max(late_max, out.wake_late_max_ns[i]);
  }
  r->wake_late_mean_us = late_sum / 1e3 / (double(c.ranks) * steps);
  r->wake_late_max_us = late_max / 1e3;
  r->prefill_batches = out.prefill_batches;
  if (out.prefill_batches > 0) {
    r->prefill_mean_ms = out.prefill_ns_sum / 1e6 / out.prefill_batches;
    r->prefill_max_ms = out.prefill_max_ns / 1e6;
  }
}

}  // namespace

CaseResult RunCase(const Env& env, const Case& c, const std::string& method, pid_t daemon,
                   const During& during) {
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
  TakeRates(*out, cfg, c, method, daemon_cpu, &r);
  munmap(mem, bytes);
  return r;
}

}  // namespace engram::bench::ranks
