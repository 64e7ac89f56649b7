// engram-admit-bench: a prefill's gathers when its prompt's rows were admitted at the request's
// arrival (engram_admit), against the same kind of prefill not admitted, alternating in one run.
//
//   build/bench/store/engram-admit-bench --dir /var/tmp/engram-admit --requests 24
//
// engramd serves a synthetic layer 1 of --rows rows from the cache tier with a --cache-mib row
// cache (a small share of the table, so a prompt's random rows miss: O_DIRECT reads). Each
// request is --prompt-rows distinct random rows of its own. It arrives, waits --queue-ms in the
// engine's queue (running requests and earlier chunks ahead of it), and its prefill then gathers
// its rows in chunks of --chunk-rows (the miss queue's prefill class). Every other request is
// admitted when it arrives (the admission class reads and pins its rows while it waits) and
// released after its prefill. Reported per method: the prefill's time (what its first token
// waits for) and each chunk's, p50/p99, the share of its rows engramd held when the prefill
// asked for them (from `engramctl status`: verifies the "not admitted" prefill is cold), and the
// ratio of the admitted prefill's time to the other's.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "bench/common/engramctl_json.h"
#include "bench/common/engramd_process.h"
#include "bench/common/row_ids.h"
#include "bench/common/stats.h"
#include "engram/engram.h"
#include "testkit/synthetic.h"

namespace engram::bench {
namespace {

struct Options {
  std::string dir = "/var/tmp/engram-admit";
  uint64_t rows = 4'000'000, cache_mib = 64, prompt_rows = 40'000, chunk_rows = 20'000;
  uint64_t requests = 24, seed = 1;
  double queue_ms = 300;
};

// What the prefills of one method measured.
struct Method {
  const char* name;
  std::vector<uint64_t> prefill_ns, chunk_ns;
  uint64_t rows = 0, held = 0;  // the prefills' rows, and those engramd held when asked
};

// Rows engramd's row cache answered, since it started (layer 1 is the only table).
int64_t HitRows(const std::string& socket) {
  const nlohmann::json s = ControlJson(socket, "status");
  if (s.is_discarded() || !s.contains("store") || !s["store"].contains("cache")) return -1;
  return s["store"]["cache"].value("hits", int64_t{-1});
}

// The client's session and its arena buffers for a chunk's ids and rows.
struct Arena {
  engram_session* s;
  uint64_t* ids;
  uint8_t* out;
};

// Request `k`: admitted when k is odd, then --queue-ms in the queue, then its prefill in
// chunks, timed into `m`, and released. False (with the reason printed) on an error.
bool RunRequest(const Options& o, const Arena& a, const std::string& socket, uint64_t k,
                const std::vector<uint64_t>& rows, Method& m) {
  const bool admit = k % 2 == 1;
  uint64_t queued = 0;
  if (admit && engram_admit(a.s, k, 1, rows.data(), rows.size(), 0, &queued) != 0) {
    return fprintf(stderr, "engram-admit-bench: admit: %s\n", engram_last_error()), false;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(uint64_t(o.queue_ms * 1e3)));
  const int64_t hits_before = HitRows(socket);
  const uint64_t t0 = NowNs();
  for (uint64_t begin = 0; begin < rows.size(); begin += o.chunk_rows) {
    const uint64_t n = std::min(o.chunk_rows, rows.size() - begin);
    std::copy(rows.begin() + begin, rows.begin() + begin + n, a.ids);
    engram_gather_request r{.size = sizeof(r),
                            .layer = 1,
                            .flags = ENGRAM_GATHER_VIA_DAEMON,
                            .rows = a.ids,
                            .num_rows = n,
                            .dest = a.out};
    const uint64_t c0 = NowNs();
    if (engram_gather(a.s, &r, 60'000'000'000) != 0) {
      return fprintf(stderr, "engram-admit-bench: gather: %s\n", engram_last_error()), false;
    }
    m.chunk_ns.push_back(NowNs() - c0);
  }
  m.prefill_ns.push_back(NowNs() - t0);
  const int64_t hits_after = HitRows(socket);
  if (hits_before < 0 || hits_after < 0) {
    return fprintf(stderr, "engram-admit-bench: engramctl status gave no row cache hits\n"), false;
  }
  m.rows += rows.size();
  m.held += uint64_t(hits_after - hits_before);
  if (admit && engram_admit_done(a.s, k, nullptr) != 0) {
    return fprintf(stderr, "engram-admit-bench: admit done: %s\n", engram_last_error()), false;
  }
  return true;
}

void Print(const Method& m, double ratio) {
  printf("  %-13s %8zu %13.1f %13.1f %12.1f %12.1f %9.1f%% %8.2f\n", m.name, m.prefill_ns.size(),
         Quantile(m.prefill_ns, 0.5) / 1e6, Quantile(m.prefill_ns, 0.99) / 1e6,
         Quantile(m.chunk_ns, 0.5) / 1e6, Quantile(m.chunk_ns, 0.99) / 1e6,
         100.0 * double(m.held) / double(std::max<uint64_t>(1, m.rows)), ratio);
}

int Main(int argc, char** argv) {
  CLI::App app{
      "A prefill's gathers with its prompt admitted at arrival against the same prefill not "
      "admitted (a cache-tier table, its misses read from the device)",
      "engram-admit-bench"};
  Options o;
  app.add_option("--dir", o.dir, "Where the synthetic model and the socket go (the device)")
      ->capture_default_str();
  app.add_option("--rows", o.rows, "Rows of the table")->capture_default_str();
  app.add_option("--cache-mib", o.cache_mib, "engramd's row cache")->capture_default_str();
  app.add_option("--prompt-rows", o.prompt_rows, "Rows of a prompt (its tokens x heads)")
      ->capture_default_str();
  app.add_option("--chunk-rows", o.chunk_rows,
                 "Rows of a prefill chunk (over 16,384: the prefill class)")
      ->capture_default_str();
  app.add_option("--queue-ms", o.queue_ms, "How long a request waits before its prefill")
      ->capture_default_str();
  app.add_option("--requests", o.requests, "Requests, half of them admitted")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Row ids' random seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.chunk_rows <= 16384 || o.prompt_rows < o.chunk_rows || o.rows < 8 * o.prompt_rows ||
      o.requests < 2 || o.queue_ms < 0) {
    fprintf(stderr,
            "engram-admit-bench: --chunk-rows must be over 16384, --prompt-rows at least it, "
            "--rows at least 8x --prompt-rows, --requests at least 2\n");
    return 2;
  }
  std::filesystem::create_directories(o.dir);
  const std::string model = o.dir + "/model-" + std::to_string(o.rows);
  if (!std::filesystem::exists(model + "/config.json")) {
    SynthOptions so{.out_dir = model, .rows = o.rows, .seed = 7, .layers = {1}};
    if (absl::Status s = WriteSyntheticCheckpoint(so); !s.ok()) {
      return fprintf(stderr, "engram-admit-bench: %s\n", s.ToString().c_str()), 1;
    }
  }
  EngramdProcess daemon(model, o.dir + "/admit.sock",
                        {"--tier", "1=cache", "--cache-bytes", std::to_string(o.cache_mib) + "M"});
  if (!daemon.ok()) return 1;
  engram_connect_options co;
  engram_connect_options_init(&co, sizeof(co));
  co.data_bytes = o.chunk_rows * (kRowBytes + 8) + (8 << 20);
  engram_session* s = daemon.Connect(co);
  if (s == nullptr) return fprintf(stderr, "no engramd: %s\n", engram_last_error()), 1;
  uint64_t* ids = nullptr;
  uint8_t* out = nullptr;
  if (engram_alloc(s, o.chunk_rows * 8, reinterpret_cast<void**>(&ids)) != 0 ||
      engram_alloc(s, o.chunk_rows * kRowBytes, reinterpret_cast<void**>(&out)) != 0) {
    return fprintf(stderr, "engram-admit-bench: arena: %s\n", engram_last_error()), 1;
  }
  printf(
      "engram-admit-bench: layer 1, %lu rows in the cache tier, a %lu MiB row cache; %lu "
      "requests of %lu rows, prefilled in chunks of %lu after %.0f ms in the queue\n",
      o.rows, o.cache_mib, o.requests, o.prompt_rows, o.chunk_rows, o.queue_ms);
  std::mt19937_64 rng(o.seed);
  Method methods[2] = {{.name = "not admitted"}, {.name = "admitted"}};
  for (uint64_t k = 0; k < o.requests; ++k) {
    // Every other request admitted, each with rows of its own.
    const std::vector<uint64_t> rows = DistinctRows(rng, o.rows, o.prompt_rows);
    if (!RunRequest(o, {s, ids, out}, daemon.socket(), k, rows, methods[k % 2])) return 1;
  }
  const double base = Quantile(methods[0].prefill_ns, 0.5);
  printf("  %-13s %8s %13s %13s %12s %12s %10s %8s\n", "method", "prefills", "prefill p50 ms",
         "prefill p99 ms", "chunk p50 ms", "chunk p99 ms", "held", "p50 x");
  Print(methods[0], 1.0);
  Print(methods[1], Quantile(methods[1].prefill_ns, 0.5) / base);
  // The baseline must have been cold: its rows random in a table many times the cache.
  const double cold_held = double(methods[0].held) / double(std::max<uint64_t>(1, methods[0].rows));
  if (cold_held > 0.2) {
    printf("warning: the not-admitted prefills found %.0f%% of their rows held: not cold\n",
           100 * cold_held);
  }
  engram_session_close(s);
  return 0;
}

}  // namespace
}  // namespace engram::bench

int main(int argc, char** argv) { return engram::bench::Main(argc, argv); }
