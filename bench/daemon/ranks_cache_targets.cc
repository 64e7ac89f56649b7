// engram-ranks' cases for the row cache's targets (--steady, --timeline-s; bench/README.md,
// "DGX Spark targets"): a steady state with part of the rows cached against the same ids all
// cached plus one device read, a prefill beside the steady decode ranks, the client's in-place
// reads of an all-hit cache against a resident table's, and a cold start's timeline.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/common/clocks.h"
#include "bench/common/stats.h"
#include "bench/daemon/ranks.h"

namespace engram::bench::ranks {
namespace {

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

// The back-to-back warm-up of `ranks` ranks (`--warm-passes` passes over the trace, shared
// among them) and the paced case that follows it on the trace's next steps.
std::pair<Case, Case> WarmAndTimed(const Config& cfg, const StepTrace& trace, int ranks,
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

}  // namespace

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

}  // namespace engram::bench::ranks
