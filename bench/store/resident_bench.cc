// engram-resident-bench: a resident table gathered through engramd against the same rows copied
// in-process from the same memory (the client's read-only mapping of the table's memfd), side by
// side in one run, for decode (1,152 rows) and prefill (98,304 rows) batches.
//
//   build/bench/store/engram-resident-bench --dir /var/tmp/engram-resident --rows 2000000
#include <sys/utsname.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "base/clock.h"
#include "bench/common/engramd_process.h"
#include "bench/common/stats.h"
#include "engram/engram.h"
#include "testkit/synthetic.h"

namespace {

using engram::bench::Quantile;

int Run(const std::string& dir, uint64_t rows, uint32_t iterations) {
  std::filesystem::create_directories(dir);
  const std::string model = dir + "/model-" + std::to_string(rows);
  if (!std::filesystem::exists(model + "/config.json")) {
    engram::SynthOptions so{.out_dir = model, .rows = rows, .seed = 7, .layers = {14}};
    if (absl::Status s = engram::WriteSyntheticCheckpoint(so); !s.ok()) {
      return fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
    }
  }
  engram::bench::EngramdProcess daemon(model, dir + "/resident.sock", {"--tier", "14=resident"});
  if (!daemon.ok()) return 1;
  engram_connect_options co;
  engram_connect_options_init(&co, sizeof(co));
  co.data_bytes = 98304ull * (engram::kRowBytes + 8) + (8 << 20);
  engram_session* s = daemon.Connect(co);
  if (s == nullptr) return fprintf(stderr, "no engramd: %s\n", engram_last_error()), 1;
  engram_table_map* map = nullptr;
  if (engram::bench::MapTableWhenLoaded(s, 14, &map) != 0) {
    return fprintf(stderr, "map: %s\n", engram_last_error()), 1;
  }
  uint64_t* ids;
  uint8_t* out;
  engram_alloc(s, 98304 * 8, reinterpret_cast<void**>(&ids));
  engram_alloc(s, 98304ull * engram::kRowBytes, reinterpret_cast<void**>(&out));
  std::vector<uint8_t> local(98304ull * engram::kRowBytes);
  std::mt19937_64 rng(1);
  utsname u;
  uname(&u);
  printf(
      "engram-resident-bench on %s %s, %ld CPUs: layer 14, %lu rows resident (%.1f MiB), "
      "uniform random rows, %u batches each\n",
      u.nodename, u.release, sysconf(_SC_NPROCESSORS_ONLN), rows,
      rows * engram::kRowBytes / 1048576.0, iterations);
  printf("  %-8s %-34s %12s %12s %10s\n", "batch", "method", "p50 us", "p99 us", "ratio p50");
  for (uint64_t n : {1152ull, 98304ull}) {
    std::vector<uint64_t> daemon_ns, local_ns;
    for (uint32_t it = 0; it < iterations; ++it) {
      for (uint64_t i = 0; i < n; ++i) ids[i] = rng() % rows;
      engram_gather_request r{.size = sizeof(r),
                              .layer = 14,
                              .flags = ENGRAM_GATHER_VIA_DAEMON,
                              .rows = ids,
                              .num_rows = n,
                              .dest = out};  // the baseline
      uint64_t t0 = engram::NowNs();
      if (engram_gather(s, &r, 10'000'000'000) != 0) {
        return fprintf(stderr, "gather: %s\n", engram_last_error()), 1;
      }
      daemon_ns.push_back(engram::NowNs() - t0);
      t0 = engram::NowNs();
      engram_table_map_gather(map, ids, n, local.data());
      local_ns.push_back(engram::NowNs() - t0);
      if (std::memcmp(local.data(), out, n * engram::kRowBytes) != 0) {
        return fprintf(stderr, "the daemon's rows differ from the mapping's\n"), 2;
      }
    }
    const double d50 = Quantile(daemon_ns, 0.5) / 1e3, l50 = Quantile(local_ns, 0.5) / 1e3;
    printf("  %-8lu %-34s %12.1f %12.1f %10.2f\n", n, "engramd gather (resident tier)", d50,
           Quantile(daemon_ns, 0.99) / 1e3, d50 / l50);
    printf("  %-8lu %-34s %12.1f %12.1f %10.2f\n", n, "in-process memcpy from the mapping", l50,
           Quantile(local_ns, 0.99) / 1e3, 1.0);
  }
  engram_table_map_close(map);
  engram_session_close(s);
  daemon.Stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A resident table through engramd beside an in-process memcpy gather"};
  std::string dir = "/var/tmp/engram-resident";
  uint64_t rows = 2'000'000;
  uint32_t iterations = 200;
  app.add_option("--dir", dir, "Where the synthetic table and the socket go")
      ->capture_default_str();
  app.add_option("--rows", rows, "Rows of the synthetic table")->capture_default_str();
  app.add_option("--iterations", iterations, "Batches per size and method")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return Run(dir, rows, iterations);
}
