// engram-miss-overload: a decode step's misses while a prefill and an admission flood compete
// for the device, side by side with the same decode steps alone.
//
//   engram-miss-overload --dir /nvme/tmp --rows 1000000 --seconds 5 --rounds 2
//
// One paged table (one 4 KiB page a row) in --dir, served from the cache tier (O_DIRECT misses)
// with a row cache of --cache-mib. A decode thread gathers --decode-rows random rows every
// --step-ms (a decode step's rows of one table: nearly all miss; the fraction is reported) and
// times each gather. Phases, alternated within each round so that all see the same device:
//   alone      the decode steps only;
//   prefill    plus --prefill-threads threads each gathering --prefill-rows random rows back to
//              back (prefill chunks, the miss queue's prefill class; several ranks' at once
//              ask more of the device than it reads);
//   flood      plus a thread admitting --admit-rows random rows at a time (RowStore::Prefetch
//              with an admission: the admission class, pinned, released once read) back to back.
// Before the phases, one-row gathers of fresh rows measure what one device read costs here.
// Reports per phase the decode step's p50/p99 and its ratio to alone, the decode pieces' wait in
// the miss queue, the prefill's and admissions' rows a second, the admission rows shed, and the
// queue's demand against the device's rate. The target: a flooded decode step's misses wait in
// the queue at most one device read at p99 (they wait for no lower-class piece); the step itself
// shares the device with at most the lower-class reads already there, reported beside it.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "base/clock.h"
#include "base/metric_sink.h"
#include "bench/common/row_ids.h"
#include "bench/common/stats.h"
#include "bench/store/paged_cache_store.h"
#include "gather/miss_queue.h"
#include "store/admissions.h"

namespace engram {
namespace {

using bench::DistinctRows;
using bench::PagedCacheStore;
using bench::Quantile;

struct Options {
  std::string dir = "/var/tmp";
  uint64_t rows = 1'000'000, decode_rows = 256, prefill_rows = 32768, admit_rows = 16384;
  uint64_t cache_mib = 64, rounds = 2, seed = 1;
  double seconds = 5, step_ms = 20;
  uint32_t workers = 0, depth = 64, shed_ms = 1000, prefill_threads = 1;
};

enum class Load { kAlone, kPrefill, kFlood };
constexpr Load kLoads[] = {Load::kAlone, Load::kPrefill, Load::kFlood};
const char* LoadName(Load l) {
  return l == Load::kAlone ? "alone" : l == Load::kPrefill ? "prefill" : "flood";
}

// What one phase measured.
struct PhaseResult {
  std::vector<uint64_t> step_ns;  // decode gathers
  uint64_t decode_rows = 0, decode_misses = 0;
  std::array<uint64_t, 64> decode_wait{};  // the decode class's piece waits in the queue
  uint64_t prefill_rows = 0, admit_rows = 0, admit_fetched = 0, admit_shed = 0;
  double seconds = 0, max_load = 0, max_backlog_s = 0;
};

class Runner {
 public:
  Runner(const Options& o, PagedCacheStore& b) : o_(o), b_(b), store_(b.store.get()) {}

  // p50 of one-row gathers of rows the cache does not hold: one device read and the miss path.
  absl::StatusOr<uint64_t> OneReadNs(std::mt19937_64& rng) {
    std::vector<uint64_t> ns;
    std::vector<uint8_t> dest(kRowBytes);
    for (int i = 0; i < 200; ++i) {
      const uint64_t row = rng() % o_.rows;
      if (store_->cache()->Contains(b_.table()->layer_id(), row)) continue;
      const uint64_t t0 = NowNs();
      if (absl::Status s =
              store_->Gather({.table = b_.table(), .rows = {&row, 1}, .dest = dest.data()});
          !s.ok()) {
        return s;
      }
      ns.push_back(NowNs() - t0);
    }
    return Quantile(ns, 0.5);
  }

  absl::StatusOr<PhaseResult> Run(Load load, uint64_t seed) {
    PhaseResult r;
    stop_ = false;
    failed_ = absl::OkStatus();
    const MissQueue* q = store_->miss_queue();
    const MissQueueStats before = q->Stats();
    std::vector<std::thread> threads;
    std::vector<uint64_t> prefill_rows(o_.prefill_threads, 0);
    if (load != Load::kAlone) {
      for (uint32_t i = 0; i < o_.prefill_threads; ++i) {
        threads.emplace_back([&, i] { Prefill(seed + 1 + 100 * i, prefill_rows[i]); });
      }
    }
    if (load == Load::kFlood) threads.emplace_back([&] { Admit(seed + 2, r); });
    const uint64_t t0 = NowNs();
    Decode(seed, r, q);
    r.seconds = double(NowNs() - t0) / 1e9;
    stop_ = true;
    for (std::thread& t : threads) t.join();
    if (!failed_.ok()) return failed_;
    for (uint64_t n : prefill_rows) r.prefill_rows += n;
    const MissQueueStats after = q->Stats();
    const MissClassStats& d0 = before.classes[int(MissClass::kDecode)];
    const MissClassStats& d1 = after.classes[int(MissClass::kDecode)];
    for (size_t i = 0; i < r.decode_wait.size(); ++i) {
      r.decode_wait[i] = d1.wait_buckets[i] - d0.wait_buckets[i];
    }
    const int a = int(MissClass::kAdmission);
    r.admit_shed = after.classes[a].shed_reads + after.classes[a].dropped_reads -
                   before.classes[a].shed_reads - before.classes[a].dropped_reads;
    return r;
  }

 private:
  // Decode steps every --step-ms for --seconds; samples the queue's load between steps.
  void Decode(uint64_t seed, PhaseResult& r, const MissQueue* q) {
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> dest(o_.decode_rows * kRowBytes);
    const uint64_t step_ns = uint64_t(o_.step_ms * 1e6);
    const uint64_t end = NowNs() + uint64_t(o_.seconds * 1e9);
    const uint32_t layer = b_.table()->layer_id();
    for (uint64_t next = NowNs(); next < end; next += step_ns) {
      const std::vector<uint64_t> rows = DistinctRows(rng, o_.rows, o_.decode_rows);
      for (uint64_t row : rows) r.decode_misses += store_->cache()->Contains(layer, row) ? 0 : 1;
      r.decode_rows += rows.size();
      const uint64_t t0 = NowNs();
      if (absl::Status s = store_->Gather({.table = b_.table(), .rows = rows, .dest = dest.data()});
          !s.ok()) {
        Fail(s);
        return;
      }
      r.step_ns.push_back(NowNs() - t0);
      const MissQueueStats s = q->Stats();
      r.max_load = std::max(r.max_load, s.load);
      r.max_backlog_s = std::max(r.max_backlog_s, s.backlog_s);
      const uint64_t now = NowNs();
      if (next + step_ns > now)
        std::this_thread::sleep_for(std::chrono::nanoseconds(next + step_ns - now));
    }
  }

  void Prefill(uint64_t seed, uint64_t& rows_read) {
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> dest(o_.prefill_rows * kRowBytes);
    while (!stop_) {
      const std::vector<uint64_t> rows = DistinctRows(rng, o_.rows, o_.prefill_rows);
      if (absl::Status s = store_->Gather({.table = b_.table(), .rows = rows, .dest = dest.data()});
          !s.ok()) {
        return Fail(s);
      }
      rows_read += rows.size();
    }
  }

  void Admit(uint64_t seed, PhaseResult& r) {
    std::mt19937_64 rng(seed);
    Admissions* admissions = store_->admissions();
    for (uint64_t id = 1; !stop_; ++id) {
      const std::vector<uint64_t> rows = DistinctRows(rng, o_.rows, o_.admit_rows);
      auto a = admissions->Reserve(/*owner=*/1, id, /*ttl_ns=*/0, rows.size(), NowNs());
      if (!a.ok()) return Fail(a.status());
      PrefetchOutcome outcome;
      absl::Status s = store_->Prefetch(b_.table(), rows, &outcome, a->get());
      admissions->Release(1, id);
      if (!s.ok()) return Fail(s);
      r.admit_rows += rows.size();
      r.admit_fetched += outcome.fetched;
    }
  }

  void Fail(const absl::Status& s) {
    std::lock_guard lock(mu_);
    if (failed_.ok()) failed_ = s;
    stop_ = true;
  }

  const Options& o_;
  PagedCacheStore& b_;
  RowStore* const store_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  absl::Status failed_;
};

void Merge(const PhaseResult& from, PhaseResult& to) {
  to.step_ns.insert(to.step_ns.end(), from.step_ns.begin(), from.step_ns.end());
  to.decode_rows += from.decode_rows;
  to.decode_misses += from.decode_misses;
  for (size_t i = 0; i < to.decode_wait.size(); ++i) to.decode_wait[i] += from.decode_wait[i];
  to.prefill_rows += from.prefill_rows;
  to.admit_rows += from.admit_rows;
  to.admit_fetched += from.admit_fetched;
  to.admit_shed += from.admit_shed;
  to.seconds += from.seconds;
  to.max_load = std::max(to.max_load, from.max_load);
  to.max_backlog_s = std::max(to.max_backlog_s, from.max_backlog_s);
}

void Report(const std::array<PhaseResult, 3>& all, uint64_t one_read_ns) {
  const double alone_p50 = Quantile(all[0].step_ns, 0.5),
               alone_p99 = Quantile(all[0].step_ns, 0.99);
  std::printf("\none device read (one-row gather of a missed row, p50): %.1f us\n",
              double(one_read_ns) / 1e3);
  std::printf("%-8s %6s %7s %11s %11s %9s %9s %13s %13s %11s %11s %10s %8s\n", "phase", "steps",
              "miss %", "step p50 us", "step p99 us", "p50 x", "p99 x", "wait p99 us",
              "prefill r/s", "admit r/s", "admit shed", "max load", "backlog");
  for (size_t i = 0; i < all.size(); ++i) {
    const PhaseResult& r = all[i];
    const double p50 = Quantile(r.step_ns, 0.5), p99 = Quantile(r.step_ns, 0.99);
    const uint64_t wait99 = Log2QuantileNs(r.decode_wait, 0.99);
    std::printf(
        "%-8s %6zu %7.1f %11.1f %11.1f %9.2f %9.2f %13.1f %13.0f %11.0f %11lu %10.2f %7.2fs\n",
        LoadName(kLoads[i]), r.step_ns.size(),
        100.0 * double(r.decode_misses) / double(std::max<uint64_t>(1, r.decode_rows)), p50 / 1e3,
        p99 / 1e3, p50 / alone_p50, p99 / alone_p99, double(wait99) / 1e3,
        double(r.prefill_rows) / r.seconds, double(r.admit_rows) / r.seconds, r.admit_shed,
        r.max_load, r.max_backlog_s);
  }
  // The target is the queue's: a decode step's misses wait for no lower-class piece. The step
  // itself also shares the device (and here the CPU) with the reads already in flight.
  const uint64_t flood_wait99 = Log2QuantileNs(all[2].decode_wait, 0.99);
  std::printf(
      "flooded decode pieces' queue wait p99 <= %.1f us (target: at most one device read, "
      "%.1f us): %s\n",
      double(flood_wait99) / 1e3, double(one_read_ns) / 1e3,
      flood_wait99 <= one_read_ns ? "met" : "missed");
  std::printf("flooded decode step p99 - alone p99: %.1f us (%.1f device reads)\n",
              (Quantile(all[2].step_ns, 0.99) - alone_p99) / 1e3,
              (Quantile(all[2].step_ns, 0.99) - alone_p99) / double(one_read_ns));
}

int Main(int argc, char** argv) {
  CLI::App app{
      "A decode step's misses beside a prefill and an admission flood, against the same steps "
      "alone (engramd's miss queue on a paged cache-tier table)",
      "engram-miss-overload"};
  Options o;
  app.add_option("--dir", o.dir, "Where the paged table is written (the device to measure)")
      ->capture_default_str();
  app.add_option("--rows", o.rows, "Rows of the table")->capture_default_str();
  app.add_option("--decode-rows", o.decode_rows, "Rows of a decode step")->capture_default_str();
  app.add_option("--step-ms", o.step_ms, "Milliseconds between decode steps")
      ->capture_default_str();
  app.add_option("--prefill-rows", o.prefill_rows,
                 "Rows of a prefill gather (more than 16,384: the prefill class)")
      ->capture_default_str();
  app.add_option("--prefill-threads", o.prefill_threads,
                 "Prefills at once (several ranks' chunks: enough of them outrun the device)")
      ->capture_default_str();
  app.add_option("--admit-rows", o.admit_rows, "Rows of an admission")->capture_default_str();
  app.add_option("--cache-mib", o.cache_mib, "Row cache size")->capture_default_str();
  app.add_option("--seconds", o.seconds, "Seconds a phase")->capture_default_str();
  app.add_option("--rounds", o.rounds, "Rounds of (alone, prefill, flood)")->capture_default_str();
  app.add_option("--workers", o.workers, "Gather engine workers (0: online CPUs, as engramd)")
      ->capture_default_str();
  app.add_option("--depth", o.depth, "[memory] miss_depth")->capture_default_str();
  app.add_option("--shed-ms", o.shed_ms, "[memory] miss_shed_ms (0: never shed)")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Row ids' random seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.decode_rows == 0 || o.decode_rows > 4096 || o.prefill_rows <= 16384 ||
      o.rows < 4 * std::max({o.decode_rows, o.prefill_rows, o.admit_rows}) || o.rounds == 0 ||
      o.seconds <= 0 || o.step_ms <= 0 || o.prefill_threads == 0) {
    std::fprintf(stderr,
                 "engram-miss-overload: --decode-rows must be 1..4096, --prefill-rows over "
                 "16384, --rows at least 4x the largest of them, --rounds, --seconds, "
                 "--step-ms and --prefill-threads positive\n");
    return 2;
  }
  PagedCacheStore b;
  StoreConfig config;
  config.cache_bytes = o.cache_mib << 20;
  config.miss_depth = o.depth;
  config.miss_shed_ms = o.shed_ms;
  config.admit_session_rows = o.admit_rows;
  if (absl::Status s = b.Open(o.dir, "engram-miss-overload", o.rows, o.workers, config); !s.ok()) {
    std::fprintf(stderr, "engram-miss-overload: %s\n", s.ToString().c_str());
    return 1;
  }
  Runner runner(o, b);
  std::mt19937_64 rng(o.seed);
  auto one_read = runner.OneReadNs(rng);
  if (!one_read.ok()) {
    std::fprintf(stderr, "engram-miss-overload: %s\n", one_read.status().ToString().c_str());
    return 1;
  }
  std::array<PhaseResult, 3> all;
  for (uint64_t round = 0; round < o.rounds; ++round) {
    for (size_t i = 0; i < all.size(); ++i) {
      auto r = runner.Run(kLoads[i], o.seed * 1000 + round * 10 + i);
      if (!r.ok()) {
        std::fprintf(stderr, "engram-miss-overload: %s: %s\n", LoadName(kLoads[i]),
                     r.status().ToString().c_str());
        return 1;
      }
      std::printf(
          "round %lu %-8s decode p50 %.1f us p99 %.1f us, prefill %lu rows, admitted %lu "
          "rows (%lu shed)\n",
          round, LoadName(kLoads[i]), Quantile(r->step_ns, 0.5) / 1e3,
          Quantile(r->step_ns, 0.99) / 1e3, r->prefill_rows, r->admit_rows, r->admit_shed);
      Merge(*r, all[i]);
    }
  }
  Report(all, *one_read);
  return 0;
}

}  // namespace
}  // namespace engram

int main(int argc, char** argv) { return engram::Main(argc, argv); }
