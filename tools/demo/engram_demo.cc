// engram-demo: drives a decode-like and a prefill-like gather workload through engramd from a
// separate process, checks the bytes it gets, and prints rows/s and latency.
//
//   engram-demo --socket /tmp/engramd.sock --synthetic-seed 7       # rows checked by formula
//   engram-demo --socket /tmp/engramd.sock --verify-model /models/x  # rows checked by reading
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "engram/engram.h"
#include "tables/table.h"
#include "testkit/synthetic.h"

namespace {

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

// Checks gathered rows against the synthetic formula or the table files.
class Verifier {
 public:
  Verifier(std::optional<uint64_t> seed, std::vector<std::unique_ptr<engram::Table>> tables)
      : seed_(seed), tables_(std::move(tables)) {}
  bool enabled() const { return seed_.has_value() || !tables_.empty(); }
  // Index of the first wrong row, -1 if all match; *ret_error set when a row cannot be read.
  int64_t FirstBad(uint32_t layer, const uint64_t* rows, uint64_t n, const uint8_t* out,
                   std::string* ret_error) const {
    uint8_t expect[engram::kRowBytes];
    const engram::Table* table = nullptr;
    for (const auto& t : tables_) {
      if (t->layer_id() == layer) table = t.get();
    }
    for (uint64_t i = 0; i < n; ++i) {
      if (seed_) {
        engram::SyntheticRow(*seed_, layer, rows[i], expect);
      } else if (table != nullptr) {
        absl::Status s = engram::ReadRowBlocking(*table, rows[i], expect);
        if (!s.ok()) {
          *ret_error = s.ToString();
          return static_cast<int64_t>(i);
        }
      } else {
        *ret_error = "layer not found in --verify-model";
        return 0;
      }
      if (memcmp(expect, out + i * engram::kRowBytes, engram::kRowBytes) != 0) {
        return static_cast<int64_t>(i);
      }
    }
    return -1;
  }

 private:
  std::optional<uint64_t> seed_;
  std::vector<std::unique_ptr<engram::Table>> tables_;
};

struct Phase {
  const char* name;
  uint64_t rows_per_step;
  uint32_t steps;
};

uint64_t Percentile(std::vector<uint64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

struct Options {
  std::string socket_path;
  int64_t table = -1;
  uint32_t decode_steps = 300, prefill_steps = 4;
  uint64_t decode_rows = 1152, prefill_rows = 98304;
  std::optional<uint64_t> seed;
  std::string verify_model;
  uint64_t rng_seed = 1;
};

void AddOptions(CLI::App& app, Options& o) {
  app.add_option("--socket", o.socket_path,
                 "engramd socket (default: $ENGRAM_SOCKET or " ENGRAM_DEFAULT_SOCKET ")");
  app.add_option("--table", o.table, "Layer id to gather from (default: the first served)");
  app.add_option("--decode-steps", o.decode_steps, "Decode steps")->capture_default_str();
  app.add_option("--decode-rows", o.decode_rows, "Rows per decode step (16 seqs x 6 tokens x 12)")
      ->capture_default_str();
  app.add_option("--prefill-steps", o.prefill_steps, "Prefill chunks")->capture_default_str();
  app.add_option("--prefill-rows", o.prefill_rows, "Rows per prefill chunk (8,192 tokens x 12)")
      ->capture_default_str();
  app.add_option("--synthetic-seed", o.seed,
                 "Check rows against the synthetic checkpoint's formula");
  app.add_option("--verify-model", o.verify_model, "Check rows by reading this checkpoint/table");
  app.add_option("--rng-seed", o.rng_seed, "Seed of the random row ids")->capture_default_str();
}

// The verifier the options ask for; nullopt (after saying why) when --verify-model fails to open.
std::optional<Verifier> MakeVerifier(const Options& o) {
  std::vector<std::unique_ptr<engram::Table>> tables;
  if (!o.verify_model.empty()) {
    auto opened = engram::OpenTables(o.verify_model, {});
    if (!opened.ok()) {
      fprintf(stderr, "engram-demo: %s\n", opened.status().ToString().c_str());
      return std::nullopt;
    }
    tables = std::move(*opened);
  }
  return Verifier(o.seed, std::move(tables));
}

// A session with room for `max_rows` rows a request; nullptr (after saying why) on failure.
engram_session* Connect(const Options& opts, uint64_t max_rows) {
  engram_connect_options o;
  engram_connect_options_init(&o, sizeof(o));
  o.socket_path = opts.socket_path.empty() ? nullptr : opts.socket_path.c_str();
  o.data_bytes = max_rows * (engram::kRowBytes + 8) + (1 << 20);
  o.client_name = "engram-demo";
  engram_session* s = nullptr;
  if (engram_session_open(&o, &s) != 0) {
    fprintf(stderr, "engram-demo: %s\n", engram_last_error());
    return nullptr;
  }
  return s;
}

// Lists the tables engramd serves and picks `table` (or the first); nullptr after saying why.
const engram_table_info* ChooseTable(engram_session* s, int64_t table,
                                     std::span<engram_table_info, 16> infos) {
  for (auto& info : infos) info.size = sizeof(info);
  size_t count = 0;
  if (engram_list_tables(s, infos.data(), 16, &count) != 0 || count == 0) {
    fprintf(stderr, "engram-demo: cannot list tables: %s\n", engram_last_error());
    return nullptr;
  }
  printf("engramd serves %zu table(s):\n", count);
  const engram_table_info* chosen = nullptr;
  for (size_t i = 0; i < count && i < 16; ++i) {
    const engram_table_info& t = infos[i];
    printf("  layer %u: %" PRIu64 " rows, serving [%" PRIu64 ", %" PRIu64 "), %.1f MB, %s\n",
           t.layer, t.num_rows, t.covered_begin, t.covered_end, t.data_bytes / 1e6,
           t.layout == ENGRAM_TABLE_PACKED ? "packed" : "checkpoint");
    if (chosen == nullptr && (table < 0 || t.layer == table)) chosen = &t;
  }
  if (chosen == nullptr) {
    fprintf(stderr, "engram-demo: engramd serves no layer %" PRId64 "\n", table);
    return nullptr;
  }
  return chosen;
}

// What a phase gathers with: the session, the table, the shared buffers and the row ids.
struct Gatherer {
  engram_session* s;
  const engram_table_info* table;
  uint64_t* rows;
  uint8_t* out;
  std::mt19937_64 rng;
  std::uniform_int_distribution<uint64_t> pick;
  const Verifier& verifier;
};

// Runs one phase and prints its line; false when a gather failed (said on stderr). A row that
// differs is said on stderr and clears *all_ok.
bool RunPhase(Gatherer& g, const Phase& phase, bool* all_ok) {
  std::vector<uint64_t> latencies;
  uint64_t total_ns = 0;
  for (uint32_t step = 0; step < phase.steps; ++step) {
    for (uint64_t i = 0; i < phase.rows_per_step; ++i) g.rows[i] = g.pick(g.rng);
    engram_gather_request r{.size = sizeof(r),
                            .layer = g.table->layer,
                            .flags = 0,
                            .rows = g.rows,
                            .num_rows = phase.rows_per_step,
                            .dest = g.out,
                            .dest_offsets = nullptr};
    const uint64_t t0 = NowNs();
    const int rc = engram_gather(g.s, &r, 30'000'000'000);
    const uint64_t dt = NowNs() - t0;
    if (rc != 0) {
      fprintf(stderr, "engram-demo: %s step %u: %s\n", phase.name, step, engram_last_error());
      return false;
    }
    latencies.push_back(dt);
    total_ns += dt;
    std::string error;
    const int64_t bad =
        g.verifier.enabled()
            ? g.verifier.FirstBad(g.table->layer, g.rows, phase.rows_per_step, g.out, &error)
            : -1;
    if (bad >= 0) {
      fprintf(stderr,
              "engram-demo: %s step %u: row %" PRIu64 " (index %" PRId64
              ") differs from the checkpoint %s\n",
              phase.name, step, g.rows[bad], bad, error.c_str());
      *all_ok = false;
    }
  }
  const double rows_total = double(phase.rows_per_step) * phase.steps;
  printf("%-8s %5u steps x %6" PRIu64
         " rows: %10.0f rows/s, %7.1f MB/s, latency p50 %8.1f µs"
         "  p99 %8.1f µs  max %8.1f µs\n",
         phase.name, phase.steps, phase.rows_per_step, rows_total / (total_ns / 1e9),
         rows_total * engram::kRowBytes / (total_ns / 1e3), Percentile(latencies, 0.5) / 1e3,
         Percentile(latencies, 0.99) / 1e3,
         *std::max_element(latencies.begin(), latencies.end()) / 1e3);
  return true;
}

void PrintSessionStats(engram_session* s) {
  struct engram_session_stats st {};
  st.size = sizeof(st);
  if (engram_get_session_stats(s, &st) == 0) {
    printf("session %" PRIu64 ": %" PRIu64 " requests, %" PRIu64
           " rows, %.1f MB served; "
           "daemon-side p50 %.1f µs, p99 %.1f µs (bucket bounds); %" PRIu64 " doorbells, %" PRIu64
           " client sleeps\n",
           st.session_id, st.requests_ok, st.rows, st.bytes / 1e6, st.latency_p50_ns / 1e3,
           st.latency_p99_ns / 1e3, st.doorbells, st.client_sleeps);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"engram-demo: decode- and prefill-like gathers through engramd, checked"};
  Options opts;
  AddOptions(app, opts);
  if (std::optional<int> done = engram::cli::Parse(app, argc, argv)) return *done;

  std::optional<Verifier> verifier = MakeVerifier(opts);
  if (!verifier) return 1;
  const uint64_t max_rows = std::max(opts.decode_rows, opts.prefill_rows);
  engram_session* s = Connect(opts, max_rows);
  if (s == nullptr) return 1;
  engram_table_info infos[16];
  const engram_table_info* chosen = ChooseTable(s, opts.table, infos);
  if (chosen == nullptr) return 1;
  uint64_t* rows;
  uint8_t* out;
  if (engram_alloc(s, max_rows * 8, reinterpret_cast<void**>(&rows)) != 0 ||
      engram_alloc(s, max_rows * engram::kRowBytes, reinterpret_cast<void**>(&out)) != 0) {
    fprintf(stderr, "engram-demo: %s\n", engram_last_error());
    return 1;
  }
  Gatherer g{
      s,
      chosen,
      rows,
      out,
      std::mt19937_64(opts.rng_seed),
      std::uniform_int_distribution<uint64_t>(chosen->covered_begin, chosen->covered_end - 1),
      *verifier};
  printf("gathering from layer %u (row ids uniform over the served range; %s)\n", chosen->layer,
         verifier->enabled() ? "every byte checked" : "bytes not checked");
  bool all_ok = true;
  for (const Phase& phase : {Phase{"decode", opts.decode_rows, opts.decode_steps},
                             Phase{"prefill", opts.prefill_rows, opts.prefill_steps}}) {
    if (phase.steps == 0) continue;
    if (!RunPhase(g, phase, &all_ok)) return 1;
  }
  PrintSessionStats(s);
  engram_session_close(s);
  if (verifier->enabled()) printf("verification: %s\n", all_ok ? "every row matched" : "FAILED");
  return all_ok ? 0 : 2;
}
