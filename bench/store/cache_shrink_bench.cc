// engram-cache-shrink: how long a gather's miss waits for the row cache's writer lock while a
// large pressure shrink runs. A full cache of --cache-mib is shrunk by a quarter (a pressure
// step) while a thread inserts rows as a gather's misses do and times each insert; run with
// --chunk-slots 4294967295 to see the whole shrink under one hold of the lock.
//
//   build/bench/store/engram-cache-shrink --cache-mib 2048
#include <sys/utsname.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "bench/common/stats.h"
#include "store/row_cache.h"

namespace {

using engram::bench::Quantile;

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "?";
}

int Run(uint64_t cache_mib, uint32_t chunk_slots, double shrink_fraction) {
  auto created = engram::RowCache::Create(
      {.max_bytes = cache_mib << 20, .shrink_chunk_slots = chunk_slots}, nullptr);
  if (!created.ok()) return fprintf(stderr, "%s\n", created.status().ToString().c_str()), 1;
  engram::RowCache& cache = **created;
  const uint64_t full = cache.capacity_slots();
  uint8_t row[engram::kRowBytes] = {};
  for (uint64_t r = 0; r < full; ++r) {
    row[0] = static_cast<uint8_t>(r);
    (void)cache.Insert(14, r, row);
  }
  std::atomic<bool> stop{false}, started{false};
  std::vector<uint64_t> waits;
  waits.reserve(1 << 24);
  std::thread misses([&] {
    for (uint64_t r = 0; !stop.load(std::memory_order_relaxed); ++r) {
      const uint64_t t0 = engram::NowNs();
      (void)cache.Insert(2, r, row);
      waits.push_back(engram::NowNs() - t0);
      started.store(true, std::memory_order_relaxed);
    }
  });
  while (!started.load()) std::this_thread::yield();
  const uint64_t target = full - static_cast<uint64_t>(full * shrink_fraction);
  const uint64_t t0 = engram::NowNs();
  cache.SetCapacitySlots(target);
  const uint64_t shrink_ns = engram::NowNs() - t0;
  stop = true;
  misses.join();
  utsname u{};
  uname(&u);
  printf("# engram-cache-shrink\nmachine: %s, %ld online CPUs, Linux %s\n", CpuModel().c_str(),
         sysconf(_SC_NPROCESSORS_ONLN), u.release);
  printf("cache: %" PRIu64 " MiB, %" PRIu64 " slots, full; shrunk to %" PRIu64
         " slots (%.0f %% less) with %u slots per hold of the lock\n",
         cache_mib, full, target, shrink_fraction * 100, chunk_slots);
  const uint64_t max_wait = waits.empty() ? 0 : *std::max_element(waits.begin(), waits.end());
  printf(
      "shrink: %.1f ms (%.2f us per slot given up); inserts during it: %zu, wait p50 %.1f us, "
      "p99 %.1f us, max %.1f us; skipped while shrinking: %" PRIu64 "\n",
      shrink_ns / 1e6, shrink_ns / 1e3 / double(full - target), waits.size(),
      Quantile(waits, 0.5) / 1e3, Quantile(waits, 0.99) / 1e3, max_wait / 1e3,
      cache.Stats().shrink_skipped_inserts);
  const double slots_16g = double(16ull << 30) / engram::RowCache::BytesForSlots(1);
  printf(
      "16 GiB (%.0f slots), shrunk by %.0f %%: about %.1f s in all at this rate; an insert "
      "waits at most about %.1f ms (%u slots per hold)\n",
      slots_16g, shrink_fraction * 100,
      shrink_ns / 1e9 / double(full - target) * slots_16g * shrink_fraction,
      shrink_ns / 1e6 / double(full - target) * std::min<double>(chunk_slots, slots_16g),
      chunk_slots);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A row cache shrink measured against the inserts of a gather's misses"};
  uint64_t cache_mib = 2048;
  uint32_t chunk_slots = engram::RowCacheOptions{}.shrink_chunk_slots;
  double fraction = 0.25;
  app.add_option("--cache-mib", cache_mib, "Size of the cache (MiB)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--chunk-slots", chunk_slots, "Slots a shrink works through per hold of the lock");
  app.add_option("--shrink", fraction, "Share of the capacity given up")
      ->check(CLI::Range(0.0, 1.0));
  CLI11_PARSE(app, argc, argv);
  return Run(cache_mib, chunk_slots, fraction);
}
