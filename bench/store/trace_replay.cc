// engram-trace-replay: replays an Engram token trace made from real text (tools/trace) through
// engramd with both tables in the cache tier and a cache smaller than the tables, and sets the
// hit rate it got beside offline LRU and S3-FIFO simulations of the same row stream.
//
//   node tools/trace/engram_trace.mjs --out /var/tmp/debian-doc.trace
//   build/bench/store/engram-trace-replay --trace /var/tmp/debian-doc.trace --dir /var/tmp/replay
//
// Row ids come from the real DeepSeek-V4.1 hash (client/hash) of the trace's compressed ids.
// The synthetic tables engramd serves have --table-rows rows, so each row id r is served as
// r mod table-rows (the simulations see the same folded ids); decode replays --sequences
// documents one token per step, prefill 8,192-token chunks.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench/common/engramd_process.h"
#include "bench/store/cache_sim.h"
#include "client/hash/ngram_hasher.h"
#include "engram/engram.h"
#include "nlohmann/json.hpp"
#include "protocol/clock.h"
#include "tools/tables/synthetic.h"

namespace engram::bench {
namespace {

using nlohmann::json;

struct Trace {
  std::vector<std::vector<int32_t>> docs;
  uint32_t compressed_vocab = 0;
  uint32_t pad = 0;
};

absl::StatusOr<Trace> ReadTrace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  uint32_t head[4];
  uint64_t tokens = 0;
  if (!in.read(magic, 8) || std::memcmp(magic, "ENGTRC01", 8) != 0 ||
      !in.read(reinterpret_cast<char*>(head), sizeof(head)) ||
      !in.read(reinterpret_cast<char*>(&tokens), 8) || head[0] != 1) {
    return absl::InvalidArgumentError(path + ": not an Engram token trace (ENGTRC01, version 1)");
  }
  Trace t;
  t.compressed_vocab = head[2];
  t.pad = head[3];
  for (uint32_t d = 0; d < head[1]; ++d) {
    uint32_t n = 0;
    if (!in.read(reinterpret_cast<char*>(&n), 4) || n > (1u << 28)) {
      return absl::DataLossError(absl::StrCat(path, ": document ", d, " is cut short"));
    }
    std::vector<int32_t> ids(n);
    if (!in.read(reinterpret_cast<char*>(ids.data()), 4ull * n)) {
      return absl::DataLossError(absl::StrCat(path, ": document ", d, " is cut short"));
    }
    for (int32_t id : ids) {
      if (id < 0 || static_cast<uint32_t>(id) >= t.compressed_vocab) {
        return absl::DataLossError(absl::StrCat(path, ": document ", d, " holds id ", id,
                                                " outside its vocabulary of ", t.compressed_vocab));
      }
    }
    t.docs.push_back(std::move(ids));
  }
  return t;
}

// DeepSeek-V4.1-Flash's Engram hash parameters (config.json, text_config).
HashConfig Dsv41HashConfig() {
  HashConfig c;
  c.layer_ids = {1, 14};
  c.num_embeddings = {384006168, 384016682};
  c.max_ngram_size = 4;
  c.n_heads = 8;
  c.prime_search_start = {16000000, 16000000, 16000000};
  c.pad_token_id = 2;
  c.compressed_vocab_size = 99092;
  return c;
}

// One request per layer: rows[layer] for this step.
struct Step {
  std::vector<uint64_t> rows[2];
};

struct Options {
  std::string trace, dir = "/var/tmp/engram-replay", mode = "decode";
  uint64_t table_rows = 1'000'000, cache_mib = 64, max_steps = 0;
  uint32_t sequences = 16, chunk_tokens = 8192;
};

// Row ids of each document per layer, token-major (24 per token).
std::vector<std::vector<uint64_t>> HashDocs(const NgramHasher& h, const Trace& t, uint32_t li) {
  std::vector<std::vector<uint64_t>> out;
  for (const auto& d : t.docs) {
    std::vector<uint64_t> rows(d.size() * h.heads_per_layer());
    HashSequence seq{.tokens = d, .history = {}};
    absl::Status s = h.Hash(li, {&seq, 1}, TokenSpace::kCompressed, h.AllHeads(), rows);
    if (!s.ok()) {
      fprintf(stderr, "hash: %s\n", s.ToString().c_str());
      exit(1);
    }
    out.push_back(std::move(rows));
  }
  return out;
}

std::vector<Step> BuildSteps(const Options& o, const std::vector<std::vector<uint64_t>> rows[2],
                             uint32_t heads) {
  std::vector<Step> steps;
  const size_t docs = rows[0].size();
  auto emit = [&](Step& s, size_t d, size_t t0, size_t t1) {
    for (int l = 0; l < 2; ++l) {
      for (size_t i = t0 * heads; i < t1 * heads; ++i)
        s.rows[l].push_back(rows[l][d][i] % o.table_rows);
    }
  };
  if (o.mode == "prefill") {
    for (size_t d = 0; d < docs; ++d) {
      const size_t n = rows[0][d].size() / heads;
      for (size_t t = 0; t < n; t += o.chunk_tokens) {
        Step s;
        emit(s, d, t, std::min(n, t + o.chunk_tokens));
        steps.push_back(std::move(s));
      }
    }
    return steps;
  }
  // Decode: `sequences` documents in flight, one token each per step; a finished document is
  // replaced by the next one.
  std::vector<std::pair<size_t, size_t>> live;  // (document, next token)
  size_t next_doc = 0;
  for (;;) {
    while (live.size() < o.sequences && next_doc < docs) live.emplace_back(next_doc++, 0);
    if (live.empty()) break;
    Step s;
    for (auto& [d, t] : live) emit(s, d, t, t + 1), ++t;
    std::erase_if(live, [&](auto& p) { return p.second >= rows[0][p.first].size() / heads; });
    steps.push_back(std::move(s));
  }
  return steps;
}

pid_t StartDaemon(const Options& o, const std::string& model, const std::string& socket) {
  std::vector<std::string> args = {EngramdPath("build/daemon/engramd"),
                                   "--model",
                                   model,
                                   "--socket",
                                   socket,
                                   "--tier",
                                   "1=cache",
                                   "--tier",
                                   "14=cache",
                                   "--cache-bytes",
                                   std::to_string(o.cache_mib << 20),
                                   "--max-rows-per-request",
                                   "262144",
                                   "--log-level",
                                   "warning"};
  return StartEngramd(std::move(args), socket);
}

json Control(const std::string& socket, const char* command) {
  const char* env = getenv("ENGRAMCTL");
  const std::string line = std::string(env != nullptr ? env : "build/tools/engramctl/engramctl") +
                           " " + command + " --json --socket " + socket;
  FILE* p = popen(line.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  pclose(p);
  return json::parse(out, nullptr, false);
}

uint64_t ProcKb(pid_t pid, const char* key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(strlen(key) + 1));
  }
  return 0;
}

uint64_t Percentile(std::vector<uint64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

int Run(const Options& o) {
  auto trace = ReadTrace(o.trace);
  if (!trace.ok()) return fprintf(stderr, "%s\n", trace.status().ToString().c_str()), 1;
  const HashConfig config = Dsv41HashConfig();
  auto layers = DeriveLayerTables(config);
  auto hasher = NgramHasher::Create(config, *layers, std::nullopt, trace->pad);
  if (!hasher.ok()) return fprintf(stderr, "%s\n", hasher.status().ToString().c_str()), 1;
  const uint32_t heads = hasher->heads_per_layer();
  std::vector<std::vector<uint64_t>> rows[2] = {HashDocs(*hasher, *trace, 0),
                                                HashDocs(*hasher, *trace, 1)};
  std::vector<Step> steps = BuildSteps(o, rows, heads);
  if (o.max_steps != 0 && steps.size() > o.max_steps) steps.resize(o.max_steps);
  uint64_t lookups = 0, max_rows = 0;
  for (const Step& s : steps) {
    lookups += s.rows[0].size() + s.rows[1].size();
    max_rows = std::max<uint64_t>(max_rows, s.rows[0].size());
  }

  std::filesystem::create_directories(o.dir);
  const std::string model = o.dir + "/model-" + std::to_string(o.table_rows);
  if (!std::filesystem::exists(model + "/config.json")) {
    SynthOptions so{.out_dir = model, .rows = o.table_rows, .seed = 7};
    if (absl::Status s = WriteSyntheticCheckpoint(so); !s.ok()) {
      return fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
    }
  }
  const std::string socket = o.dir + "/replay.sock";
  const pid_t daemon = StartDaemon(o, model, socket);
  if (daemon < 0) return 1;
  engram_session* session = nullptr;
  engram_connect_options co;
  engram_connect_options_init(&co, sizeof(co));
  co.socket_path = socket.c_str();
  co.data_bytes = 2 * max_rows * (kRowBytes + 8) + (16 << 20);
  co.slots = 4;
  for (int i = 0; i < 500 && engram_connect(&co, &session) != 0; ++i) usleep(20000);
  if (session == nullptr) return fprintf(stderr, "no engramd: %s\n", engram_last_error()), 1;
  uint64_t* ids[2];
  uint8_t* out[2];
  for (int l = 0; l < 2; ++l) {
    engram_alloc(session, max_rows * 8, reinterpret_cast<void**>(&ids[l]));
    engram_alloc(session, max_rows * kRowBytes, reinterpret_cast<void**>(&out[l]));
  }
  const uint32_t layer_ids[2] = {1, 14};
  std::vector<uint64_t> latency;
  uint64_t wrong = 0, hwm_kb = 0;
  uint8_t want[kRowBytes];
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    const uint64_t t0 = NowNs();
    uint64_t tickets[2];
    for (int l = 0; l < 2; ++l) {
      std::memcpy(ids[l], s.rows[l].data(), s.rows[l].size() * 8);
      engram_gather_request r{.size = sizeof(r),
                              .table = layer_ids[l],
                              .rows = ids[l],
                              .num_rows = s.rows[l].size(),
                              .dest = out[l]};
      if (engram_submit(session, &r, &tickets[l]) != 0) {
        return fprintf(stderr, "submit: %s\n", engram_last_error()), 1;
      }
    }
    for (int l = 0; l < 2; ++l) {
      if (engram_wait(session, tickets[l], -1) != 0) {
        return fprintf(stderr, "gather: %s\n", engram_last_error()), 1;
      }
    }
    latency.push_back(NowNs() - t0);
    for (int l = 0; l < 2; ++l) {
      for (size_t k = 0; k < s.rows[l].size(); ++k) {
        SyntheticRow(7, layer_ids[l], s.rows[l][k], want);
        wrong += std::memcmp(want, out[l] + k * kRowBytes, kRowBytes) != 0;
      }
    }
    if (i % 64 == 0) hwm_kb = std::max(hwm_kb, ProcKb(daemon, "VmRSS:"));
  }
  hwm_kb = std::max(hwm_kb, ProcKb(daemon, "VmHWM:"));
  const json status = Control(socket, "status");
  engram_close(session);
  kill(daemon, SIGTERM);
  waitpid(daemon, nullptr, 0);

  const json& store = status["store"];
  const uint64_t capacity = store["cache"]["capacity_rows"].get<uint64_t>();
  LruSim lru(capacity);
  S3FifoSim s3(capacity);
  uint64_t s3_all_hit = 0, requests = 0;
  std::vector<uint64_t> keys;
  for (const Step& s : steps) {
    for (int l = 0; l < 2; ++l) {
      keys.clear();
      for (uint64_t r : s.rows[l]) keys.push_back(uint64_t{layer_ids[l]} << 40 | r);
      lru.Batch(keys);
      s3_all_hit += s3.Batch(keys) == keys.size();
      ++requests;
    }
  }
  utsname u;
  uname(&u);
  printf("engram-trace-replay on %s %s, %ld CPUs\n", u.nodename, u.release,
         sysconf(_SC_NPROCESSORS_ONLN));
  printf(
      "trace %s: %zu documents, compressed vocabulary %u; mode %s (%s), %zu steps, %lu row "
      "lookups; tables of %lu rows (rows folded mod that), both in one cache of %lu rows "
      "(%.1f MiB)\n",
      o.trace.c_str(), trace->docs.size(), trace->compressed_vocab, o.mode.c_str(),
      o.mode == "decode" ? absl::StrCat(o.sequences, " sequences, one token a step").c_str()
                         : absl::StrCat(o.chunk_tokens, "-token chunks").c_str(),
      steps.size(), lookups, o.table_rows, capacity,
      double(store["cache"]["bytes"].get<uint64_t>()) / (1 << 20));
  printf("  %-22s %10s %14s\n", "", "hit rate", "all-hit reqs");
  printf("  %-22s %10.4f %14.4f\n", "engramd (S3-FIFO)", store["hit_rate"].get<double>(),
         store["all_hit_fraction"].get<double>());
  printf("  %-22s %10.4f %14.4f\n", "simulated S3-FIFO", s3.counts.hit_rate(),
         double(s3_all_hit) / double(requests));
  printf("  %-22s %10.4f %14s\n", "simulated LRU", lru.counts.hit_rate(), "");
  printf("  step latency p50 %.1f us, p99 %.1f us (both layers' gathers, submitted together)\n",
         Percentile(latency, 0.5) / 1e3, Percentile(latency, 0.99) / 1e3);
  printf(
      "  engramd memory high-water %.1f MiB RSS; row store %.1f MiB (%lu evictions); rows "
      "wrong %lu\n",
      hwm_kb / 1024.0, double(store["store_bytes"].get<uint64_t>()) / (1 << 20),
      store["cache"]["evictions"].get<uint64_t>(), wrong);
  return wrong == 0 ? 0 : 2;
}

}  // namespace
}  // namespace engram::bench

int main(int argc, char** argv) {
  engram::bench::Options o;
  CLI::App app{
      "Replays an Engram token trace through engramd's row cache beside LRU and S3-FIFO "
      "simulations"};
  app.add_option("--trace", o.trace, "Trace from tools/trace/engram_trace.mjs")->required();
  app.add_option("--dir", o.dir, "Where the synthetic tables and the socket go")
      ->capture_default_str();
  app.add_option("--mode", o.mode, "decode or prefill")
      ->check(CLI::IsMember({"decode", "prefill"}))
      ->capture_default_str();
  app.add_option("--table-rows", o.table_rows, "Rows per synthetic table")->capture_default_str();
  app.add_option("--cache-mib", o.cache_mib, "Row cache size (MiB)")->capture_default_str();
  app.add_option("--sequences", o.sequences, "Decode: sequences in flight")->capture_default_str();
  app.add_option("--chunk-tokens", o.chunk_tokens, "Prefill: tokens a chunk")
      ->capture_default_str();
  app.add_option("--max-steps", o.max_steps, "Stop after this many steps (0: the whole trace)");
  CLI11_PARSE(app, argc, argv);
  return engram::bench::Run(o);
}
