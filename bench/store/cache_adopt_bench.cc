// engram-cache-adopt: what proving a kept row cache costs a restart. A full cache of --cache-mib
// over a paged table of --rows rows is handed over (its memfd, as systemd keeps it) and taken
// over three ways, in alternating rounds:
//   sample   RowCache::Adopt (identity, rebuild, check words) and 64 sampled rows compared with
//            the file: the check a restart made before every row was proven;
//   proven   RowStore::Create with the memfd, as engramd starts: Adopt, then every row held read
//            from the file through the gather engine (O_DIRECT) and compared (ProveRows);
//   cold     RowStore::Create without it, then the same rows read from the file into the cache:
//            what a start without the kept cache reads to be as warm (the hot set's warm).
// Reports each one's median wall time and the ratios proven / sample and proven / cold.
//
//   engram-cache-adopt --dir /var/tmp --rows 600000 --cache-mib 64 --rounds 3
#include <fcntl.h>
#include <stdlib.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "base/clock.h"
#include "bench/common/stats.h"
#include "gather/gather_engine.h"
#include "store/cache_handoff.h"
#include "store/row_store.h"
#include "tables/pack.h"
#include "tables/table.h"
#include "testkit/synthetic.h"

namespace engram {
namespace {

using bench::Quantile;

struct Options {
  std::string dir = "/var/tmp";
  uint64_t rows = 600'000, cache_mib = 64, rounds = 3;
  uint32_t workers = 0;
};

struct Bench {
  std::string work;  // removed at exit
  std::vector<std::unique_ptr<Table>> tables;
  std::unique_ptr<GatherEngine> engine;
  StoreConfig config;
  uint64_t identity = 0;
  std::vector<uint64_t> cached;  // the rows the kept cache holds
  UniqueFd kept;                 // its memfd
  ~Bench() {
    if (!work.empty()) (void)std::system(("rm -rf '" + work + "'").c_str());
  }
};

absl::StatusOr<std::unique_ptr<RowStore>> Start(Bench& b, UniqueFd fd, CacheHandoff* handoff) {
  *handoff = CacheHandoff{.fd = std::move(fd), .tables_identity = b.identity};
  return RowStore::Create(
      b.config, b.tables, b.engine.get(), [](const std::string&) {}, handoff);
}

// Reads `rows` through the store in pieces (misses: from the file into the cache).
absl::Status GatherAll(RowStore& store, const Table* table, const std::vector<uint64_t>& rows) {
  constexpr size_t kPiece = 4096;
  std::vector<uint8_t> out(kPiece * kRowBytes);
  for (size_t at = 0; at < rows.size(); at += kPiece) {
    const size_t n = std::min(kPiece, rows.size() - at);
    std::span<const uint64_t> piece(rows.data() + at, n);
    if (absl::Status s = store.Gather({.table = table, .rows = piece, .dest = out.data()});
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// A paged table in --dir, and a full cache over it kept as its memfd.
absl::Status SetUp(const Options& o, Bench& b) {
  std::string tmpl = o.dir + "/engram-cache-adopt-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) return absl::ErrnoToStatus(errno, "mkdtemp in " + o.dir);
  b.work = tmpl;
  const std::string path = b.work + "/l14.paged.engram";
  SynthOptions synth{.out_dir = b.work + "/model", .rows = o.rows, .seed = 3, .layers = {14}};
  if (absl::Status s = WriteSyntheticCheckpoint(synth); !s.ok()) return s;
  PackOptions pack{.input = b.work + "/model", .layer = 14, .out = path};
  pack.paged = true;
  if (absl::Status s = PackTable(pack); !s.ok()) return s;
  (void)std::system(("rm -rf '" + b.work + "/model'").c_str());
  auto opened = OpenTables(path, {});
  if (!opened.ok()) return opened.status();
  b.tables = std::move(*opened);
  auto engine = GatherEngine::Create({.workers = o.workers});
  if (!engine.ok()) return engine.status();
  b.engine = std::move(*engine);
  const Table* table = b.tables[0].get();
  if (absl::Status s = b.engine->AddTable(table, {.mode = ReadMode::kDirect}); !s.ok()) return s;
  b.config.default_tier = Tier::kCache;
  b.config.cache_bytes = o.cache_mib << 20;
  b.config.pressure = false;
  b.identity = TablesIdentity(b.tables);
  CacheHandoff h;
  auto store = Start(b, UniqueFd(), &h);
  if (!store.ok()) return store.status();
  std::vector<uint64_t> all(o.rows);
  for (uint64_t r = 0; r < o.rows; ++r) all[r] = r;
  std::shuffle(all.begin(), all.end(), std::mt19937_64(7));
  all.resize(std::min<uint64_t>(o.rows, (*store)->cache()->capacity_slots()));
  b.cached = all;
  if (absl::Status s = GatherAll(**store, table, b.cached); !s.ok()) return s;
  b.kept = UniqueFd(fcntl((*store)->cache()->fd(), F_DUPFD_CLOEXEC, 3));
  return absl::OkStatus();
}

UniqueFd Dup(const Bench& b) { return UniqueFd(fcntl(b.kept.get(), F_DUPFD_CLOEXEC, 3)); }

// The check before every row was proven: adopt, then 64 rows compared with the file.
absl::Status Sample(Bench& b) {
  RowCacheAdoption a;
  auto cache = RowCache::Adopt(
      Dup(b), {.max_bytes = b.config.cache_bytes, .tables_identity = b.identity}, nullptr,
      [](uint32_t, uint64_t) { return true; }, &a);
  if (!cache.ok()) return cache.status();
  uint8_t cached[kRowBytes], stored[kRowBytes];
  for (size_t i = 0; i < 64; ++i) {
    const uint64_t row = b.cached[i * b.cached.size() / 64];
    if (!(*cache)->reader().Lookup(14, row, cached)) continue;
    if (absl::Status s = ReadRowBlocking(*b.tables[0], row, stored); !s.ok()) return s;
    if (std::memcmp(cached, stored, kRowBytes) != 0) return absl::DataLossError("row differs");
  }
  return absl::OkStatus();
}

absl::Status Proven(Bench& b) {
  CacheHandoff h;
  auto store = Start(b, Dup(b), &h);
  if (!store.ok()) return store.status();
  if (!h.adopted || (*store)->cache()->Stats().used_slots != b.cached.size()) {
    return absl::InternalError("the kept cache was not adopted whole: " + h.outcome);
  }
  return absl::OkStatus();
}

absl::Status Cold(Bench& b) {
  CacheHandoff h;
  auto store = Start(b, UniqueFd(), &h);
  if (!store.ok()) return store.status();
  return GatherAll(**store, b.tables[0].get(), b.cached);
}

void PrintMachine(const Options& o, const Bench& b) {
  utsname u{};
  uname(&u);
  std::ifstream in("/proc/cpuinfo");
  std::string cpu = "?";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::printf(
      "machine: %s, %ld CPUs, kernel %s; table: %lu rows paged in %s; cache: %lu MiB, "
      "%zu rows held; gather engine workers: %u (0: one per CPU), O_DIRECT\n",
      cpu.c_str(), sysconf(_SC_NPROCESSORS_ONLN), u.release, o.rows, o.dir.c_str(), o.cache_mib,
      b.cached.size(), o.workers);
}

int Main(int argc, char** argv) {
  CLI::App app{"What proving a kept row cache against its table files costs a restart",
               "engram-cache-adopt"};
  Options o;
  app.add_option("--dir", o.dir, "Where the paged table is written (the device to measure)")
      ->capture_default_str();
  app.add_option("--rows", o.rows, "Rows of the table")->capture_default_str();
  app.add_option("--cache-mib", o.cache_mib, "Row cache size")->capture_default_str();
  app.add_option("--rounds", o.rounds, "Rounds of (sample, proven, cold)")->capture_default_str();
  app.add_option("--workers", o.workers, "Gather engine workers (0: online CPUs, as engramd)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.rounds == 0 || o.rows < 1000) {
    std::fprintf(stderr, "engram-cache-adopt: --rounds at least 1, --rows at least 1000\n");
    return 2;
  }
  Bench b;
  if (absl::Status s = SetUp(o, b); !s.ok()) {
    std::fprintf(stderr, "engram-cache-adopt: %s\n", s.ToString().c_str());
    return 1;
  }
  PrintMachine(o, b);
  std::vector<uint64_t> sample_ns, proven_ns, cold_ns;
  for (uint64_t round = 0; round < o.rounds; ++round) {
    for (auto [ns, run] : {std::pair{&sample_ns, &Sample}, std::pair{&proven_ns, &Proven},
                           std::pair{&cold_ns, &Cold}}) {
      const uint64_t t0 = NowNs();
      if (absl::Status s = run(b); !s.ok()) {
        std::fprintf(stderr, "engram-cache-adopt: %s\n", s.ToString().c_str());
        return 1;
      }
      ns->push_back(NowNs() - t0);
    }
  }
  const double sample = Quantile(sample_ns, 0.5) / 1e6, proven = Quantile(proven_ns, 0.5) / 1e6,
               cold = Quantile(cold_ns, 0.5) / 1e6;
  std::printf("%-8s %12s %14s\n", "", "median ms", "us per row");
  for (auto [name, ms] :
       {std::pair{"sample", sample}, std::pair{"proven", proven}, std::pair{"cold", cold}}) {
    std::printf("%-8s %12.1f %14.2f\n", name, ms, ms * 1e3 / double(b.cached.size()));
  }
  std::printf("ratio proven / sample: %.1f; proven / cold: %.2f (%lu rounds)\n", proven / sample,
              proven / cold, o.rounds);
  return 0;
}

}  // namespace
}  // namespace engram

int main(int argc, char** argv) { return engram::Main(argc, argv); }
