// engram-bench: compares, in one run over the same files and row ids, the ways of gathering
// Engram rows: mmap + memcpy, the recipe's blocking preadv pool, serial RWF_NOWAIT with the misses
// to that pool, io_uring only, and the gather engine; for decode- and prefill-sized batches,
// warm / half-resident / cold page cache, uniform and Zipf row ids, both table layouts.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/common/row_ids.h"
#include "bench/gather/batch_residency.h"
#include "bench/gather/gather_methods.h"
#include "testkit/gather_test_util.h"

namespace engram::bench {
namespace {

constexpr uint32_t kLayer = 14;

struct Config {
  std::string dir = "/var/tmp/engram-bench";
  uint64_t rows = 8'000'000;
  uint64_t seed = 42;
  std::vector<uint64_t> batches = {1152, 98304};
  std::vector<std::string> layouts = {"checkpoint", "packed"};
  std::vector<std::string> states = {"warm", "half", "cold"};
  std::vector<std::string> dists = {"uniform", "zipf"};
  std::vector<std::string> methods = {"mmap", "pool", "nowait", "uring", "engine"};
  double zipf_s = 1.0;
  double budget_s = 0.4;  // timed seconds per (case, method) for warm batches
  int max_iters = 30;
  int cold_iters = 3;      // per (case, method) for cold / half batches of up to 8192 rows
  int big_cold_iters = 1;  // for larger cold / half batches
  std::string csv;
  std::string md;
  bool smoke = false;
  uint32_t split_reads = 0;  // 0: the engine's default
};

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t CpuNs() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1'000'000'000ull +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000ull;
}

uint64_t Faults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt + ru.ru_majflt;
}

std::string ReadFirstLine(const std::string& path, const std::string& key = "") {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (key.empty() || line.rfind(key, 0) == 0) return line;
  }
  return "";
}

void PrintMachine(const Config& c) {
  utsname u{};
  uname(&u);
  struct sysinfo si {};
  sysinfo(&si);
  struct statfs fs {};
  statfs(c.dir.c_str(), &fs);
  std::string cpu = ReadFirstLine("/proc/cpuinfo", "model name");
  if (auto p = cpu.find(':'); p != std::string::npos) cpu = cpu.substr(p + 2);
  std::printf("# engram-bench\n");
  std::printf("machine: %s, %u online CPUs, %.1f GiB RAM, Linux %s\n", cpu.c_str(),
              std::thread::hardware_concurrency(), si.totalram * double(si.mem_unit) / (1 << 30),
              u.release);
  std::printf("files: %s (filesystem magic 0x%lx), %lu rows per table (%.2f GB per layout)\n",
              c.dir.c_str(), static_cast<unsigned long>(fs.f_type),
              static_cast<unsigned long>(c.rows), c.rows * 264.0 / 1e9);
  std::printf("batches: %s; states: %s; ids: %s (zipf s=%.2f); layouts: %s\n",
              absl::StrJoin(c.batches, ", ").c_str(), absl::StrJoin(c.states, ", ").c_str(),
              absl::StrJoin(c.dists, ", ").c_str(), c.zipf_s,
              absl::StrJoin(c.layouts, ", ").c_str());
  std::printf(
      "methods: (1) mmap+memcpy, (2) preadv pool 32 threads x 16-row tasks, (3) serial "
      "preadv2(RWF_NOWAIT) + misses to (2), (4) io_uring only (one ring, depth 256), (5) "
      "gather engine (%u workers)\n",
      std::thread::hardware_concurrency());
  std::printf(
      "cold = posix_fadvise(DONTNEED) on the table files before each timed batch; half "
      "= cold, then every other unique row of the batch read back\n\n");
}

absl::StatusOr<std::unique_ptr<Table>> PrepareTable(const Config& c, const std::string& layout) {
  std::filesystem::create_directories(c.dir);
  const std::string tag = absl::StrCat(c.rows, "-", c.seed);
  const std::string path = layout == "packed" ? absl::StrCat(c.dir, "/packed-", tag, ".engram")
                                              : absl::StrCat(c.dir, "/ckpt-", tag);
  auto table = testing::OpenOne(path, kLayer);
  // Reuse files only if they still hold what SyntheticRow computes (its generator may change).
  if (table.ok()) {
    const std::vector<uint64_t> probe = {0, c.rows / 2, c.rows - 1};
    std::vector<uint8_t> got(probe.size() * kRowBytes);
    for (size_t i = 0; i < probe.size(); ++i) {
      if (!ReadRowBlocking(**table, probe[i], got.data() + i * kRowBytes).ok()) {
        table = absl::DataLossError("unreadable");
      }
    }
    if (table.ok() && testing::FirstMismatch(c.seed, **table, probe, got.data()) != -1) {
      table = absl::DataLossError(absl::StrCat(path, " holds rows of another generator"));
    }
  }
  if (!table.ok()) {
    std::fprintf(stderr, "writing %s (%s layout, %.2f GB)...\n", path.c_str(), layout.c_str(),
                 c.rows * 264.0 / 1e9);
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    absl::Status s =
        layout == "packed"
            ? testing::WriteSyntheticPacked(path, kLayer, c.rows, c.seed)
            : WriteSyntheticCheckpoint(
                  {.out_dir = path, .rows = c.rows, .seed = c.seed, .layers = {kLayer}});
    if (!s.ok()) return s;
    table = testing::OpenOne(path, kLayer);
  }
  return table;
}

// Reads each given row's parts once so its pages are resident.
void TouchRows(const Table& t, const std::vector<uint64_t>& rows) {
  uint8_t buf[kRowBytes];
  for (uint64_t r : rows) {
    for (const RowPart& p : t.parts()) {
      if (pread(t.files()[p.file].fd, buf, p.bytes, p.FileOffset(r)) < 0) break;
    }
  }
}

struct Result {
  std::string layout, state, dist, method;
  uint64_t batch = 0;
  int iters = 0;
  double us_per_row = 0, cpu_us_per_row = 0, syscalls_per_row = 0, faults_per_row = 0;
  double p50_ms = 0, p99_ms = 0, rows_per_s = 0, ratio = 0;
  double resident = 0;
  // Measured share of the batch's pages resident when a timed cold / half batch started.
  double resident_min = 1.0, resident_max = 0.0;
};

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * v.size())) - 1);
  return v[i];
}

// The gather methods engram-bench knows, by the name --methods gives them.
std::unique_ptr<GatherMethod> MakeMethod(const Config& c, const std::string& m) {
  auto eo = [&](GatherEngineOptions o) {
    if (c.split_reads > 0) o.split_reads = c.split_reads;
    return o;
  };
  // O_DIRECT page runs into each thread's bounce area, registered with its ring (fixed
  // buffers) or not.
  auto direct = [&](bool fixed) {
    GatherEngineOptions o = eo({});
    o.register_direct_buffers = fixed;
    return MakeEngineMethod(fixed ? "engine O_DIRECT (fixed buffers)" : "engine O_DIRECT (plain)",
                            o, {.mode = ReadMode::kDirect});
  };
  const std::pair<const char*, std::function<std::unique_ptr<GatherMethod>()>> kMethods[] = {
      {"mmap", [] { return MakeMmapMethod(); }},
      {"pool", [] { return MakeRecipePoolMethod(); }},
      {"nowait", [] { return MakeNowaitPoolMethod(); }},
      {"uring", [] { return MakeUringOnlyMethod(); }},
      {"engine", [&] { return MakeEngineMethod("gather engine", eo({})); }},
      {"engine-serial",
       [&] {
         return MakeEngineMethod("engine (serial NOWAIT)",
                                 eo({.nowait_pass = NowaitPass::kSerial}));
       }},
      {"engine-nonowait",
       [&] {
         return MakeEngineMethod("engine (no NOWAIT)", eo({.nowait_pass = NowaitPass::kOff}));
       }},
      {"engine-1w", [&] { return MakeEngineMethod("engine (1 worker)", eo({.workers = 1})); }},
      {"engine-direct", [&] { return direct(true); }},
      {"engine-direct-plain", [&] { return direct(false); }},
  };
  for (const auto& [name, make] : kMethods) {
    if (m == name) return make();
  }
  std::fprintf(stderr,
               "unknown method '%s' (mmap, pool, nowait, uring, engine, "
               "engine-serial, engine-nonowait, engine-1w, engine-direct, "
               "engine-direct-plain)\n",
               m.c_str());
  return nullptr;
}

// One table of the report: a layout, batch size, row-id distribution and page-cache state.
struct Case {
  const Table& t;
  std::string layout, dist, state;
  uint64_t batch;
  std::vector<uint64_t> rows;    // the batch's row ids
  std::vector<uint64_t> unique;  // the same, sorted and without repeats
  std::vector<uint64_t> half;    // every other unique row: what a half case reads back
  std::vector<uint8_t> dest;     // where the rows go; one buffer for every state and method
};

// Every method starts a cold or half case from the same measured residency: all methods let
// go of their mappings (a mapped page survives POSIX_FADV_DONTNEED), the files are evicted until
// none of the batch's pages is resident, half the rows are read back, and what is resident then
// is measured and recorded in r. False when the case cannot be made cold or m cannot attach.
bool PrepareCold(const Case& k, std::vector<std::unique_ptr<GatherMethod>>& methods,
                 GatherMethod& m, Result& r) {
  if (k.state == "warm") return true;
  for (auto& other : methods) other->Detach();
  BatchResidency before;
  for (int attempt = 0; attempt < 5; ++attempt) {
    testing::Evict(k.t);
    before = MeasureBatchResidency(k.t, k.unique);
    if (before.resident == 0) break;
  }
  if (before.resident != 0) {
    std::fprintf(stderr,
                 "%s: %lu of the batch's %lu pages stayed resident after eviction; "
                 "this case is not cold\n",
                 m.name().c_str(), static_cast<unsigned long>(before.resident),
                 static_cast<unsigned long>(before.pages));
    return false;
  }
  if (k.state == "half") TouchRows(k.t, k.half);
  const BatchResidency start = MeasureBatchResidency(k.t, k.unique);
  r.resident_min = std::min(r.resident_min, start.fraction());
  r.resident_max = std::max(r.resident_max, start.fraction());
  return m.Attach(k.t).ok();
}

// Times method m on the case; nullopt when it produced no timing. Failures are counted.
std::optional<Result> TimeMethod(const Config& c, Case& k,
                                 std::vector<std::unique_ptr<GatherMethod>>& methods,
                                 GatherMethod& m, int* failures) {
  Result r{k.layout, k.state, k.dist, m.name(), k.batch};
  r.resident = k.state == "warm" ? 1.0 : k.state == "half" ? 0.5 : 0.0;
  if (k.state == "warm") r.resident_min = r.resident_max = 1.0;
  std::vector<uint8_t>& dest = k.dest;
  if (absl::Status s = m.Attach(k.t); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", m.name().c_str(), s.ToString().c_str());
    ++*failures;
    return std::nullopt;
  }
  if (k.state == "warm") {
    TouchRows(k.t, k.unique);
    (void)m.Gather(k.t, k.rows, dest.data());  // maps the pages for mmap, primes stats
  }
  const int iters_cap = k.state == "warm" ? c.max_iters
                        : k.batch <= 8192 ? c.cold_iters
                                          : c.big_cold_iters;
  std::vector<double> lat_ms;
  uint64_t wall = 0, cpu = 0, calls = 0, faults = 0;
  for (int it = 0; it < iters_cap; ++it) {
    if (!PrepareCold(k, methods, m, r)) {
      ++*failures;
      break;
    }
    const uint64_t sys0 = m.syscalls(), f0 = Faults(), c0 = CpuNs(), t0 = NowNs();
    absl::Status s = m.Gather(k.t, k.rows, dest.data());
    const uint64_t t1 = NowNs(), c1 = CpuNs(), f1 = Faults(), sys1 = m.syscalls();
    if (!s.ok()) {
      std::fprintf(stderr, "%s failed: %s\n", m.name().c_str(), s.ToString().c_str());
      ++*failures;
      break;
    }
    wall += t1 - t0;
    cpu += c1 - c0;
    calls += sys1 - sys0;
    faults += f1 - f0;
    lat_ms.push_back((t1 - t0) / 1e6);
    if (k.state == "warm" && wall > c.budget_s * 1e9 && it >= 2) break;
  }
  if (lat_ms.empty()) return std::nullopt;
  if (int64_t bad = testing::FirstMismatch(c.seed, k.t, k.rows, dest.data()); bad >= 0) {
    std::fprintf(stderr, "%s returned wrong bytes for row %lu (batch index %ld)\n",
                 m.name().c_str(), static_cast<unsigned long>(k.rows[bad]), static_cast<long>(bad));
    ++*failures;
  }
  const double n = static_cast<double>(lat_ms.size()) * k.batch;
  r.iters = lat_ms.size();
  r.us_per_row = wall / 1e3 / n;
  r.cpu_us_per_row = cpu / 1e3 / n;
  r.syscalls_per_row = calls / n;
  r.faults_per_row = faults / n;
  r.p50_ms = Percentile(lat_ms, 0.5);
  r.p99_ms = Percentile(lat_ms, 0.99);
  r.rows_per_s = 1e6 / r.us_per_row;
  return r;
}

// Prints one case's table, each method against mmap+memcpy, and appends it to results.
void ReportCase(const Case& k, std::vector<Result>& group, std::vector<Result>& results) {
  double base = 0;
  for (auto& r : group) {
    if (r.method == "mmap+memcpy") base = r.us_per_row;
  }
  std::printf("## %s, %lu rows, %s ids, %s\n", k.layout.c_str(),
              static_cast<unsigned long>(k.batch), k.dist.c_str(), k.state.c_str());
  std::printf(
      "| method | rows/s | us/row | CPU-us/row | syscalls/row | faults/row | "
      "p50 ms | p99 ms | vs mmap | iters | resident at start |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto& r : group) {
    r.ratio = base > 0 ? r.us_per_row / base : 0;
    std::printf(
        "| %s | %.3g | %.3f | %.3f | %.2f | %.2f | %.3f | %.3f | %.2fx | %d | "
        "%.1f-%.1f %% |\n",
        r.method.c_str(), r.rows_per_s, r.us_per_row, r.cpu_us_per_row, r.syscalls_per_row,
        r.faults_per_row, r.p50_ms, r.p99_ms, r.ratio, r.iters, 100 * r.resident_min,
        100 * r.resident_max);
    results.push_back(r);
  }
  std::printf("\n");
  std::fflush(stdout);
}

// Every batch size, distribution and state of one table; returns the failed method runs.
int RunTable(const Config& c, const Table& t, const std::string& layout,
             std::vector<std::unique_ptr<GatherMethod>>& methods, std::vector<Result>& results) {
  int failures = 0;
  for (uint64_t batch : c.batches) {
    for (const std::string& dist : c.dists) {
      Case k{t, layout, dist, "", batch, MakeRows(dist, batch, c.rows, c.zipf_s, c.seed ^ batch)};
      k.unique = k.rows;
      std::sort(k.unique.begin(), k.unique.end());
      k.unique.erase(std::unique(k.unique.begin(), k.unique.end()), k.unique.end());
      for (size_t i = 0; i < k.unique.size(); i += 2) k.half.push_back(k.unique[i]);
      k.dest.resize(batch * kRowBytes);
      for (const std::string& state : c.states) {
        k.state = state;
        std::vector<Result> group;
        for (auto& m : methods) {
          if (auto r = TimeMethod(c, k, methods, *m, &failures)) group.push_back(*r);
        }
        ReportCase(k, group, results);
      }
    }
  }
  return failures;
}

void WriteCsv(const std::string& path, const std::vector<Result>& results) {
  std::ofstream out(path);
  out << "layout,batch,dist,state,resident,method,us_per_row,cpu_us_per_row,syscalls_per_row,"
         "faults_per_row,p50_ms,p99_ms,rows_per_s,ratio_to_mmap,iters,resident_min,resident_"
         "max\n";
  for (const auto& r : results) {
    out << absl::StrFormat(
        "%s,%d,%s,%s,%.2f,\"%s\",%.4f,%.4f,%.3f,%.3f,%.4f,%.4f,%.0f,%.3f,%d,%.4f,%.4f\n", r.layout,
        r.batch, r.dist, r.state, r.resident, r.method, r.us_per_row, r.cpu_us_per_row,
        r.syscalls_per_row, r.faults_per_row, r.p50_ms, r.p99_ms, r.rows_per_s, r.ratio, r.iters,
        r.resident_min, r.resident_max);
  }
}

int Run(const Config& c) {
  std::error_code ec;
  std::filesystem::create_directories(c.dir, ec);
  PrintMachine(c);
  std::vector<std::unique_ptr<GatherMethod>> methods;
  for (const std::string& m : c.methods) {
    methods.push_back(MakeMethod(c, m));
    if (methods.back() == nullptr) return 2;
  }
  std::vector<Result> results;
  std::vector<std::unique_ptr<Table>> tables;
  int failures = 0;
  for (const std::string& layout : c.layouts) {
    auto table = PrepareTable(c, layout);
    if (!table.ok()) {
      std::fprintf(stderr, "cannot prepare the %s table: %s\n", layout.c_str(),
                   table.status().ToString().c_str());
      return 1;
    }
    // Tables stay open for the whole run: the engine keeps every table it was given.
    tables.push_back(std::move(*table));
    failures += RunTable(c, *tables.back(), layout, methods, results);
    for (auto& m : methods) m->Detach();
  }
  if (!c.csv.empty()) WriteCsv(c.csv, results);
  if (failures > 0) {
    std::fprintf(stderr, "%d method runs failed\n", failures);
    return 1;
  }
  return 0;
}

void AddOptions(CLI::App& app, Config& c) {
  app.add_option("--dir", c.dir, "where the synthetic tables are written (and reused)");
  app.add_option("--rows", c.rows, "rows per table");
  app.add_option("--seed", c.seed, "synthetic table and row-id seed");
  app.add_option("--batches", c.batches, "rows per batch")->delimiter(',');
  app.add_option("--layouts", c.layouts, "checkpoint, packed")->delimiter(',');
  app.add_option("--states", c.states, "warm, half, cold")->delimiter(',');
  app.add_option("--dists", c.dists, "uniform, zipf")->delimiter(',');
  app.add_option("--methods", c.methods,
                 "mmap, pool, nowait, uring, engine (extra: engine-serial, engine-nonowait, "
                 "engine-1w, engine-direct, engine-direct-plain)")
      ->delimiter(',');
  app.add_option("--zipf-s", c.zipf_s, "Zipf exponent");
  app.add_option("--budget", c.budget_s, "timed seconds per warm case and method");
  app.add_option("--cold-iters", c.cold_iters, "iterations of cold / half batches <= 8192 rows");
  app.add_option("--big-cold-iters", c.big_cold_iters, "iterations of larger cold / half batches");
  app.add_option("--csv", c.csv, "also write the results as CSV here");
  app.add_option("--split-reads", c.split_reads, "engine option split_reads (0: default)");
  app.add_flag("--smoke", c.smoke, "tiny tables and batches: checks that every method runs");
}

}  // namespace
}  // namespace engram::bench

int main(int argc, char** argv) {
  engram::bench::Config c;
  CLI::App app{"engram-bench: gather methods compared side by side on one set of files and ids"};
  engram::bench::AddOptions(app, c);
  CLI11_PARSE(app, argc, argv);
  if (c.smoke) {
    c.rows = 20000;
    c.batches = {64, 700};
    c.budget_s = 0.01;
    c.max_iters = 2;
    c.cold_iters = 1;
  }
  if (c.rows == 0 || c.batches.empty()) {
    std::fprintf(stderr, "--rows and --batches must be non-empty\n");
    return 2;
  }
  return engram::bench::Run(c);
}
