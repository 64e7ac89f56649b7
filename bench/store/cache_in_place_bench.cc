// engram-cache-in-place-bench: a cache-tier table whose every row is a hit, read in place by the
// client (ENGRAM_GATHER_IN_PLACE: the row cache mapped read-only, no request), beside the same
// rows of a resident table read in place and both tables gathered through engramd, interleaved
// in one run: p50/p99 of each and its ratio to the resident in-place gather.
//
//   build/bench/store/engram-cache-in-place-bench --dir /var/tmp/engram-cache-in-place
//
// Both layers are synthetic tables of --rows rows; layer 14 is resident, layer 1 in the cache
// tier with a cache that holds the --working-set rows every batch draws from (gathered through
// engramd twice first, so that each is cached). Every in-place batch's bytes are compared with
// the same batch through engramd, and the in-place loop is checked to have sent no request.
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
#include "engram/engram.h"
#include "testkit/synthetic.h"

namespace {

uint64_t Percentile(std::vector<uint64_t> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

struct Options {
  std::string dir = "/var/tmp/engram-cache-in-place";
  uint64_t rows = 200'000, working_set = 50'000, batch = 1152, pace_us = 0;
  uint32_t iterations = 2000;
};

// The synthetic model (written once per size): its folder, or "" with the reason printed.
std::string Model(const Options& o) {
  std::filesystem::create_directories(o.dir);
  const std::string model = o.dir + "/model-" + std::to_string(o.rows);
  if (!std::filesystem::exists(model + "/config.json")) {
    engram::SynthOptions so{.out_dir = model, .rows = o.rows, .seed = 7, .layers = {1, 14}};
    if (absl::Status s = engram::WriteSyntheticCheckpoint(so); !s.ok()) {
      return fprintf(stderr, "%s\n", s.ToString().c_str()), "";
    }
  }
  return model;
}

// engramd's flags: layer 14 resident, layer 1 from a cache with room for the working set (with
// the small FIFO's share and the index to spare).
std::vector<std::string> DaemonFlags(const Options& o) {
  const uint64_t cache_mib = o.working_set * 2 * 320 / (1 << 20) + 2;
  return {"--tier",  "14=resident",   "--tier",
          "1=cache", "--cache-bytes", std::to_string(cache_mib) + "M"};
}

struct Method {
  const char* name;
  uint32_t layer, flags;
  std::vector<uint64_t> ns;
};

// The table of the methods' p50/p99 and their ratios to the first.
void Report(const Options& o, const Method (&methods)[4], uint64_t cache_requests,
            uint64_t rows_in_place) {
  utsname u;
  uname(&u);
  printf(
      "engram-cache-in-place-bench on %s %s, %ld CPUs: %lu-row batches drawn uniformly from a "
      "working set of %lu rows (all cached) of %lu-row tables, %u batches a method, interleaved, "
      "pace %lu us\n",
      u.nodename, u.release, sysconf(_SC_NPROCESSORS_ONLN), o.batch, o.working_set, o.rows,
      o.iterations, o.pace_us);
  const double base50 = Percentile(methods[0].ns, 0.5), base99 = Percentile(methods[0].ns, 0.99);
  printf("  %-36s %10s %10s %12s %12s\n", "method", "p50 us", "p99 us", "p50 ratio", "p99 ratio");
  for (const Method& m : methods) {
    const double p50 = Percentile(m.ns, 0.5), p99 = Percentile(m.ns, 0.99);
    printf("  %-36s %10.1f %10.1f %12.2f %12.2f\n", m.name, p50 / 1e3, p99 / 1e3, p50 / base50,
           p99 / base99);
  }
  printf("  cache in place: %lu requests sent to engramd, %lu rows copied in place (of %lu)\n",
         cache_requests, rows_in_place, uint64_t{o.iterations} * o.batch);
}

int Run(const Options& o) {
  const std::string model = Model(o);
  if (model.empty()) return 1;
  engram::bench::EngramdProcess daemon(model, o.dir + "/cache-in-place.sock", DaemonFlags(o));
  if (!daemon.ok()) return 1;
  engram_connect_options co;
  engram_connect_options_init(&co, sizeof(co));
  co.data_bytes = o.batch * (2 * engram::kRowBytes + 32) + (8 << 20);
  engram_session* s = daemon.Connect(co);
  if (s == nullptr) return fprintf(stderr, "no engramd: %s\n", engram_last_error()), 1;
  engram_table_map* map = nullptr;
  if (engram::bench::MapTableWhenLoaded(s, 14, &map) != 0) {
    return fprintf(stderr, "map: %s\n", engram_last_error()), 1;
  }
  engram_table_map_close(map);
  uint64_t* ids;
  uint8_t *out, *check;
  engram_alloc(s, o.batch * 8, reinterpret_cast<void**>(&ids));
  engram_alloc(s, o.batch * engram::kRowBytes, reinterpret_cast<void**>(&out));
  engram_alloc(s, o.batch * engram::kRowBytes, reinterpret_cast<void**>(&check));
  const auto gather = [&](uint32_t layer, uint32_t flags, uint8_t* dest) {
    engram_gather_request r{.size = sizeof(r),
                            .layer = layer,
                            .flags = flags,
                            .rows = ids,
                            .num_rows = o.batch,
                            .dest = dest};
    return engram_gather(s, &r, 10'000'000'000);
  };
  // Every row of the working set cached: two passes through engramd.
  for (int pass = 0; pass < 2; ++pass) {
    for (uint64_t first = 0; first < o.working_set; first += o.batch) {
      for (uint64_t i = 0; i < o.batch; ++i) ids[i] = (first + i) % o.working_set;
      if (gather(1, ENGRAM_GATHER_VIA_DAEMON, out) != 0) {
        return fprintf(stderr, "warm: %s\n", engram_last_error()), 1;
      }
    }
  }
  Method methods[4] = {{"resident, read in place", 14, ENGRAM_GATHER_IN_PLACE, {}},
                       {"cache (all hits), read in place", 1, ENGRAM_GATHER_IN_PLACE, {}},
                       {"resident, through engramd", 14, ENGRAM_GATHER_VIA_DAEMON, {}},
                       {"cache (all hits), through engramd", 1, ENGRAM_GATHER_VIA_DAEMON, {}}};
  std::mt19937_64 rng(1);
  uint64_t cache_requests = 0, rows_in_place = 0;
  for (uint32_t it = 0; it < o.iterations; ++it) {
    for (uint64_t i = 0; i < o.batch; ++i) ids[i] = rng() % o.working_set;
    for (Method& m : methods) {
      engram_session_stats before{.size = sizeof(before)}, after{.size = sizeof(after)};
      engram_get_session_stats(s, &before);
      const uint64_t t0 = engram::NowNs();
      if (gather(m.layer, m.flags, out) != 0) {
        return fprintf(stderr, "%s: %s\n", m.name, engram_last_error()), 1;
      }
      m.ns.push_back(engram::NowNs() - t0);
      engram_get_session_stats(s, &after);
      if (m.layer == 1 && m.flags == ENGRAM_GATHER_IN_PLACE) {
        cache_requests += after.requests_submitted - before.requests_submitted;
        rows_in_place += after.rows_in_place - before.rows_in_place;
        if (gather(1, ENGRAM_GATHER_VIA_DAEMON, check) != 0 ||
            std::memcmp(out, check, o.batch * engram::kRowBytes) != 0) {
          return fprintf(stderr, "in-place rows differ from engramd's\n"), 2;
        }
      }
      if (o.pace_us != 0) usleep(static_cast<useconds_t>(o.pace_us));
    }
  }
  Report(o, methods, cache_requests, rows_in_place);
  engram_session_close(s);
  daemon.Stop();
  return cache_requests == 0 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Cache-tier hits read in place beside resident in place and through engramd"};
  Options o;
  app.add_option("--dir", o.dir, "Where the synthetic tables and the socket go")
      ->capture_default_str();
  app.add_option("--rows", o.rows, "Rows of each synthetic table")->capture_default_str();
  app.add_option("--working-set", o.working_set, "Rows the batches draw from (all cached)")
      ->capture_default_str();
  app.add_option("--batch", o.batch, "Rows a gather")->capture_default_str();
  app.add_option("--iterations", o.iterations, "Batches per method")->capture_default_str();
  app.add_option("--pace-us", o.pace_us, "Sleep after each gather (0: back to back)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.working_set == 0 || o.working_set > o.rows || o.batch == 0) {
    return fprintf(stderr, "--working-set must lie in [1, --rows] and --batch be above 0\n"), 1;
  }
  return Run(o);
}
