// engram-trace-replay: replays an Engram token trace made from real text (tools/trace) through
// engramd with both tables in the cache tier and a cache smaller than the tables, and sets the
// hit rate it got beside offline LRU and S3-FIFO simulations of the same row stream, each also
// behind a TinyLFU admission filter (replay_policies.h). --cache-fraction sizes the cache as a
// share of the tables' rows (a DGX Spark's is 0.085); --sim-only runs the simulations alone.
//
//   node tools/trace/engram_trace.mjs --out /var/tmp/debian-doc.trace
//   build/bench/store/engram-trace-replay --trace /var/tmp/debian-doc.trace --dir /var/tmp/replay
//
// Row ids come from the real DeepSeek-V4.1 hash (hash/) of the trace's compressed ids.
// The synthetic tables engramd serves have --table-rows rows, so each row id r is served as
// r mod table-rows (the simulations see the same folded ids); decode replays --sequences
// documents one token per step, prefill 8,192-token chunks.
//
// --prefetch-drafts K (decode) replays the trace twice, each time through a fresh engramd: once
// as above, once with the rows of K speculative tokens per sequence prefetched after every step
// (engram_prefetch), as an engine would prefetch its draft model's proposals, and reports the
// fraction of the first run's misses the prefetch avoided. The draft model is simulated: each
// drafted token is the trace's true next token with probability --draft-accept as long as every
// earlier draft of the step was right, and a random token from then on (a wrong draft makes the
// rest of the draft diverge, as it would).
//
// --hide-drafts K (decode) replays the trace again through a fresh engramd as a speculative
// decode step fetches its rows in two phases: each step gathers its accepted tokens' rows, then
// the rows of K draft tokens a sequence (the simulated draft model above), each timed. From
// those times and the step timeline of testkit/miss_timeline.h (the accepted rows start at
// the step's start, the draft rows once the draft model has run, --draft-share of the step;
// both must land when the first Engram layer, layer 1 of 40, starts) it reports, for each
// --step-ms, the fraction of the fetch time the step hides and the steps it did not fully hide.
//
// --write-steps FILE writes the hashed steps as engram-ranks --trace text (bench/daemon) and
// replays nothing.
//
// --in-place replays the trace again through a fresh engramd with every gather flagged
// ENGRAM_GATHER_IN_PLACE (the client copies the row cache's hits itself and reports them in its
// touch page; only misses reach engramd) and sets its hit rate beside the first run's: the
// policy must see the hits read in place as it sees those it serves.
#include <sys/utsname.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "base/clock.h"
#include "bench/common/engramctl_json.h"
#include "bench/common/engramd_process.h"
#include "bench/common/stats.h"
#include "bench/common/token_trace.h"
#include "bench/store/replay_policies.h"
#include "engram/engram.h"
#include "hash/ngram_hasher.h"
#include "nlohmann/json.hpp"
#include "store/row_cache.h"
#include "testkit/miss_timeline.h"
#include "testkit/synthetic.h"

namespace engram::bench {
namespace {

using nlohmann::json;

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

// One request per layer: rows[layer] for this step; in decode, the (document, token) each
// sequence of the step is at.
struct Step {
  std::vector<uint64_t> rows[2];
  std::vector<std::pair<uint32_t, uint32_t>> at;
};

struct Options {
  std::string trace, dir = "/var/tmp/engram-replay", mode = "decode";
  uint64_t table_rows = 1'000'000, cache_mib = 64, max_steps = 0;
  // The cache as a share of both tables' rows (a DGX Spark's budget holds 0.085 of each table's
  // rows); 0: --cache-mib. Either way cache_bytes is what engramd is given.
  double cache_fraction = 0;
  uint64_t cache_bytes = 0;
  bool sim_only = false;          // the offline policies alone, no engramd
  uint64_t warmup_steps = 0;      // steps the policies' hit rate after the warm-up leaves out
  bool tinylfu_variants = false;  // every setting of the TinyLFU filter in front of S3-FIFO
  uint32_t sequences = 16, chunk_tokens = 8192;
  uint32_t prefetch_drafts = 0;  // speculative tokens prefetched per sequence (0: no prefetch)
  double draft_accept = 0.7;     // chance a draft token is the true one (while the draft holds)
  uint64_t step_gap_us = 0;      // host time between steps (the GPU's forward pass), both runs
  uint64_t seed = 1;
  bool in_place = false;      // replay again with ENGRAM_GATHER_IN_PLACE and compare the hit rates
  uint32_t hide_drafts = 0;   // draft tokens a sequence fetched in the two-phase replay (0: none)
  double draft_share = 0.25;  // the draft model's share of a step in the timeline
  std::vector<double> step_ms = {10, 20, 50};
  std::string write_steps;  // write the steps as engram-ranks --trace text and replay nothing
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
    for (auto& [d, t] : live) {
      s.at.emplace_back(static_cast<uint32_t>(d), static_cast<uint32_t>(t));
      emit(s, d, t, t + 1), ++t;
    }
    std::erase_if(live, [&](auto& p) { return p.second >= rows[0][p.first].size() / heads; });
    steps.push_back(std::move(s));
  }
  return steps;
}

// engramd's flags: both layers from a row cache of --cache-mib, requests as large as a prefill.
std::vector<std::string> DaemonFlags(const Options& o) {
  return {"--tier",
          "1=cache",
          "--tier",
          "14=cache",
          "--cache-bytes",
          std::to_string(o.cache_bytes),
          "--max-rows-per-request",
          "262144"};
}

// A session on `daemon` with, per layer, room for the ids and rows of up to `max_rows` rows
// (ids[l], out[l]); null with the reason printed.
engram_session* ReplaySession(const EngramdProcess& daemon, uint64_t max_rows, uint64_t* ids[2],
                              uint8_t* out[2]) {
  engram_connect_options co;
  engram_connect_options_init(&co, sizeof(co));
  co.data_bytes = 2 * max_rows * (kRowBytes + 8) + (16 << 20);
  co.slots = 4;
  engram_session* session = daemon.Connect(co);
  if (session == nullptr) {
    fprintf(stderr, "no engramd: %s\n", engram_last_error());
    return nullptr;
  }
  for (int l = 0; l < 2; ++l) {
    engram_alloc(session, max_rows * 8, reinterpret_cast<void**>(&ids[l]));
    engram_alloc(session, max_rows * kRowBytes, reinterpret_cast<void**>(&out[l]));
  }
  return session;
}

uint64_t ProcKb(pid_t pid, const char* key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(strlen(key) + 1));
  }
  return 0;
}

// The draft rows of step `s` per layer: for every sequence at token t, the rows of tokens
// t+1 .. t+k as a simulated draft model proposes them (see the top of the file).
struct Drafter {
  const Options& o;
  const NgramHasher& hasher;
  const Trace& trace;
  uint64_t state;
  uint32_t drafts;  // draft tokens a sequence
  double Uniform() {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return double(state >> 11) / double(1ull << 53);
  }
  void Rows(const Step& s, std::vector<uint64_t> ret[2]) {
    ret[0].clear(), ret[1].clear();
    std::vector<int32_t> draft;
    std::vector<uint64_t> rows;
    const uint32_t heads = hasher.heads_per_layer();
    for (auto [d, t] : s.at) {
      const std::vector<int32_t>& doc = trace.docs[d];
      draft.clear();
      bool holds = true;
      for (uint32_t j = 1; j <= drafts && t + j < doc.size(); ++j) {
        holds = holds && Uniform() < o.draft_accept;
        draft.push_back(holds ? doc[t + j]
                              : static_cast<int32_t>(Uniform() * trace.compressed_vocab));
      }
      if (draft.empty()) continue;
      const size_t h0 = t >= 2 ? t - 2 : 0;
      const std::span<const int32_t> history(doc.data() + h0, t + 1 - h0);
      HashSequence seq{.tokens = draft, .history = history};
      rows.resize(draft.size() * heads);
      for (uint32_t l = 0; l < 2; ++l) {
        if (!hasher.Hash(l, {&seq, 1}, TokenSpace::kCompressed, hasher.AllHeads(), rows).ok()) {
          continue;
        }
        for (uint64_t r : rows) ret[l].push_back(r % o.table_rows);
      }
    }
  }
};

// What one replay through a fresh engramd saw.
struct Phase {
  json status;
  std::vector<uint64_t> latency;
  std::vector<uint64_t> prefetch_ns;  // engram_prefetch calls (both layers' of a step)
  uint64_t prefetch_refused = 0;      // rows refused at the session's bound (-ENOSPC)
  uint64_t wrong = 0, hwm_kb = 0, requests = 0, all_hit = 0;
  uint64_t rows_in_place = 0;  // rows the client copied from the mapped row cache
};

// A step's drafts are known once its tokens are: their rows are prefetched for the steps ahead.
// A session past limits.prefetch_session_rows is refused its hints, as an engine's would be:
// they are counted and the replay goes on. 1 on any other error.
int PrefetchDrafts(engram_session* session, Drafter* drafter, const Step& s,
                   std::vector<uint64_t> (&draft)[2], Phase* ret) {
  const uint32_t layer_ids[2] = {1, 14};
  drafter->Rows(s, draft);
  const uint64_t p0 = NowNs();
  for (int l = 0; l < 2; ++l) {
    const int rc =
        engram_prefetch(session, layer_ids[l], draft[l].data(), draft[l].size(), 0, nullptr);
    if (rc == -ENOSPC) {
      ret->prefetch_refused += draft[l].size();
    } else if (rc != 0) {
      return fprintf(stderr, "prefetch: %s\n", engram_last_error()), 1;
    }
  }
  ret->prefetch_ns.push_back(NowNs() - p0);
  return 0;
}

int Replay(const Options& o, const std::vector<Step>& steps, const std::string& model,
           uint64_t max_rows, Drafter* drafter, bool in_place, Phase* ret) {
  EngramdProcess daemon(model, o.dir + "/replay.sock", DaemonFlags(o));
  if (!daemon.ok()) return 1;
  uint64_t* ids[2];
  uint8_t* out[2];
  engram_session* session = ReplaySession(daemon, max_rows, ids, out);
  if (session == nullptr) return 1;
  const uint32_t layer_ids[2] = {1, 14};
  uint8_t want[kRowBytes];
  std::vector<uint64_t> draft[2];
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    const uint64_t t0 = NowNs();
    uint64_t tickets[2];
    for (int l = 0; l < 2; ++l) {
      std::memcpy(ids[l], s.rows[l].data(), s.rows[l].size() * 8);
      engram_gather_request r{.size = sizeof(r),
                              .layer = layer_ids[l],
                              .flags = in_place ? ENGRAM_GATHER_IN_PLACE : 0u,
                              .rows = ids[l],
                              .num_rows = s.rows[l].size(),
                              .dest = out[l]};
      // In place: each layer's hits copied here and its misses waited for, one layer after
      // the other (engram_gather); otherwise both submitted, then both waited for.
      if (in_place) {
        if (engram_gather(session, &r, -1) != 0) {
          return fprintf(stderr, "gather: %s\n", engram_last_error()), 1;
        }
      } else if (engram_submit(session, &r, &tickets[l]) != 0) {
        return fprintf(stderr, "submit: %s\n", engram_last_error()), 1;
      }
    }
    for (int l = 0; l < 2 && !in_place; ++l) {
      if (engram_wait(session, tickets[l], -1) != 0) {
        return fprintf(stderr, "gather: %s\n", engram_last_error()), 1;
      }
    }
    ret->latency.push_back(NowNs() - t0);
    // The step's drafts are known once its tokens are: prefetch their rows for the steps ahead.
    if (drafter != nullptr && PrefetchDrafts(session, drafter, s, draft, ret) != 0) return 1;
    for (int l = 0; l < 2; ++l) {
      for (size_t k = 0; k < s.rows[l].size(); ++k) {
        SyntheticRow(7, layer_ids[l], s.rows[l][k], want);
        ret->wrong += std::memcmp(want, out[l] + k * kRowBytes, kRowBytes) != 0;
      }
    }
    if (i % 64 == 0) ret->hwm_kb = std::max(ret->hwm_kb, ProcKb(daemon.pid(), "VmRSS:"));
    // The rest of the step: the forward pass the host waits for.
    while (NowNs() - t0 < o.step_gap_us * 1000) usleep(50);
  }
  ret->hwm_kb = std::max(ret->hwm_kb, ProcKb(daemon.pid(), "VmHWM:"));
  ret->status = ControlJson(daemon.socket(), "status");
  engram_session_stats stats{.size = sizeof(stats)};
  if (engram_get_session_stats(session, &stats) == 0) ret->rows_in_place = stats.rows_in_place;
  engram_session_close(session);
  daemon.Stop();
  return 0;
}

// Gathers rows[l] of both layers (submitted together, then both awaited) into ids/out; the
// wall time from the first submit to the last completion, or 0 after saying why it failed.
uint64_t GatherTimed(engram_session* session, uint64_t* const ids[2], uint8_t* const out[2],
                     const std::vector<uint64_t> (&rows)[2]) {
  const uint32_t layer_ids[2] = {1, 14};
  const uint64_t t0 = NowNs();
  uint64_t tickets[2];
  for (int l = 0; l < 2; ++l) {
    std::memcpy(ids[l], rows[l].data(), rows[l].size() * 8);
    engram_gather_request r{.size = sizeof(r),
                            .layer = layer_ids[l],
                            .flags = 0,
                            .rows = ids[l],
                            .num_rows = rows[l].size(),
                            .dest = out[l]};
    if (engram_submit(session, &r, &tickets[l]) != 0) {
      return fprintf(stderr, "submit: %s\n", engram_last_error()), 0;
    }
  }
  for (int l = 0; l < 2; ++l) {
    if (engram_wait(session, tickets[l], -1) != 0) {
      return fprintf(stderr, "gather: %s\n", engram_last_error()), 0;
    }
  }
  return std::max<uint64_t>(1, NowNs() - t0);
}

// Rows of both layers that differ from the synthetic tables' rows.
uint64_t WrongRows(uint8_t* const out[2], const std::vector<uint64_t> (&rows)[2]) {
  const uint32_t layer_ids[2] = {1, 14};
  uint8_t want[kRowBytes];
  uint64_t wrong = 0;
  for (int l = 0; l < 2; ++l) {
    for (size_t k = 0; k < rows[l].size(); ++k) {
      SyntheticRow(7, layer_ids[l], rows[l][k], want);
      wrong += std::memcmp(want, out[l] + k * kRowBytes, kRowBytes) != 0;
    }
  }
  return wrong;
}

// The two-phase replay (--hide-drafts): each step's accepted rows, then its drafts' rows, each
// gathered and timed; --step-gap-us paces the steps as in the other replays.
int ReplayTwoPhase(const Options& o, const std::vector<Step>& steps, const std::string& model,
                   uint64_t max_rows, Drafter* drafter, std::vector<StepFetch>* ret_fetch,
                   Phase* ret) {
  EngramdProcess daemon(model, o.dir + "/replay.sock", DaemonFlags(o));
  if (!daemon.ok()) return 1;
  uint64_t* ids[2];
  uint8_t* out[2];
  engram_session* session = ReplaySession(daemon, max_rows, ids, out);
  if (session == nullptr) return 1;
  std::vector<uint64_t> draft[2];
  for (const Step& s : steps) {
    const uint64_t t0 = NowNs();
    StepFetch f;
    f.accepted_ns = GatherTimed(session, ids, out, s.rows);
    if (f.accepted_ns == 0) return 1;
    ret->wrong += WrongRows(out, s.rows);
    drafter->Rows(s, draft);
    f.draft_ns = GatherTimed(session, ids, out, draft);
    if (f.draft_ns == 0) return 1;
    ret->wrong += WrongRows(out, draft);
    ret_fetch->push_back(f);
    while (NowNs() - t0 < o.step_gap_us * 1000) usleep(50);
  }
  ret->status = ControlJson(daemon.socket(), "status");
  engram_session_close(session);
  daemon.Stop();
  return 0;
}

uint64_t CacheMisses(const Phase& p) {
  return p.status["store"]["cache"]["misses"].get<uint64_t>();
}

void PrintPhase(const char* name, const Phase& p) {
  const json& store = p.status["store"];
  printf("  %-52s %10.4f %14.4f %12lu\n", name, store["hit_rate"].get<double>(),
         store["all_hit_fraction"].get<double>(), CacheMisses(p));
}

// The steps to replay, made from the trace's documents with the DeepSeek-V4.1 hash.
struct Workload {
  Trace trace;
  std::optional<NgramHasher> hasher;
  std::vector<Step> steps;
  uint64_t lookups = 0;   // row lookups of all steps
  uint64_t distinct = 0;  // rows of both tables they touch
  uint64_t max_rows = 0;  // the most rows a layer's gather (or its drafts' prefetch) holds
};

// Reads the trace and hashes it into steps; 0, or an exit status after saying why.
int MakeWorkload(const Options& o, Workload& w) {
  auto trace = ReadTrace(o.trace);
  if (!trace.ok()) return fprintf(stderr, "%s\n", trace.status().ToString().c_str()), 1;
  if (o.sim_only && (o.prefetch_drafts != 0 || o.hide_drafts != 0 || o.in_place)) {
    fprintf(stderr,
            "--sim-only runs no engramd: --prefetch-drafts, --hide-drafts and "
            "--in-place replay through one\n");
    return 1;
  }
  if ((o.prefetch_drafts != 0 || o.hide_drafts != 0) && o.mode != "decode") {
    fprintf(stderr, "--prefetch-drafts and --hide-drafts replay decode steps (--mode decode)\n");
    return 1;
  }
  w.trace = *std::move(trace);
  const HashConfig config = Dsv41HashConfig();
  auto layers = DeriveLayerTables(config);
  auto hasher = NgramHasher::Create(config, *layers, std::nullopt, w.trace.pad);
  if (!hasher.ok()) return fprintf(stderr, "%s\n", hasher.status().ToString().c_str()), 1;
  w.hasher.emplace(*std::move(hasher));
  const uint32_t heads = w.hasher->heads_per_layer();
  std::vector<std::vector<uint64_t>> rows[2] = {HashDocs(*w.hasher, w.trace, 0),
                                                HashDocs(*w.hasher, w.trace, 1)};
  w.steps = BuildSteps(o, rows, heads);
  if (o.max_steps != 0 && w.steps.size() > o.max_steps) w.steps.resize(o.max_steps);
  absl::flat_hash_set<uint64_t> touched;
  for (const Step& s : w.steps) {
    w.lookups += s.rows[0].size() + s.rows[1].size();
    for (int l = 0; l < 2; ++l) {
      for (uint64_t r : s.rows[l]) touched.insert(uint64_t(l) << 40 | r);
    }
    w.max_rows = std::max<uint64_t>(w.max_rows, s.rows[0].size());
  }
  w.distinct = touched.size();
  // Drafts of all sequences of a step, per layer.
  w.max_rows = std::max<uint64_t>(
      w.max_rows, uint64_t{o.sequences} * std::max(o.prefetch_drafts, o.hide_drafts) * heads);
  return 0;
}

// The synthetic checkpoint engramd serves, written unless it is there; empty after saying why.
std::string EnsureModel(const Options& o) {
  std::filesystem::create_directories(o.dir);
  const std::string model = o.dir + "/model-" + std::to_string(o.table_rows);
  if (!std::filesystem::exists(model + "/config.json")) {
    SynthOptions so{.out_dir = model, .rows = o.table_rows, .seed = 7};
    if (absl::Status s = WriteSyntheticCheckpoint(so); !s.ok()) {
      fprintf(stderr, "%s\n", s.ToString().c_str());
      return "";
    }
  }
  return model;
}

// The rows of --cache-fraction: that share of both tables' rows.
uint64_t FractionRows(const Options& o) {
  return static_cast<uint64_t>(o.cache_fraction * double(2 * o.table_rows) + 0.5);
}

// The fewest bytes whose row cache holds at least `rows` rows (RowCache::Size, as engramd sizes
// its cache; its slot counts go in steps of up to 1/64, so it may hold a little more).
uint64_t CacheBytesForRows(uint64_t rows) {
  uint64_t lo = 0, hi = RowCache::BytesForSlots(rows) * 2 + (64 << 20);
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (RowCache::Size(mid).slots >= rows) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// The same requests through the offline policies at engramd's capacity, layer 1's request of a
// step before layer 14's.
std::vector<PolicyResult> Simulate(const Options& o, const std::vector<Step>& steps,
                                   uint64_t capacity) {
  return SimulatePolicies(
      [&](const RequestVisitor& visit) {
        std::vector<uint64_t> keys;
        for (size_t i = 0; i < steps.size(); ++i) {
          for (int l = 0; l < 2; ++l) {
            keys.clear();
            for (uint64_t r : steps[i].rows[l]) {
              keys.push_back(uint64_t{l == 0 ? 1u : 14u} << 40 | r);
            }
            visit(keys, i >= o.warmup_steps);
          }
        }
      },
      capacity, o.tinylfu_variants);
}

// The replay with prefetched drafts against the one without.
void PrintPrefetch(const Options& o, const Phase& plain, const Phase& prefetched) {
  PrintPhase(absl::StrCat("engramd + prefetch k=", o.prefetch_drafts).c_str(), prefetched);
  const json& p = prefetched.status["prefetch"];
  const double without = double(CacheMisses(plain)), with = double(CacheMisses(prefetched));
  printf(
      "  drafts: k=%u a sequence, each right with p=%.2f while the draft holds, random after; "
      "%lu µs between steps\n",
      o.prefetch_drafts, o.draft_accept, o.step_gap_us);
  printf("  fraction of later misses avoided by prefetch: %.4f (%.0f -> %.0f row misses)\n",
         without == 0 ? 0.0 : (without - with) / without, without, with);
  printf(
      "  prefetch: %lu rows queued, %lu fetched, %lu already held, %lu dropped, %lu used by "
      "gathers (%.1f%% of those fetched), %lu refused at the session's bound; engram_prefetch p50 "
      "%.1f us, p99 %.1f us a step\n",
      p["requested_rows"].get<uint64_t>(), p["fetched_rows"].get<uint64_t>(),
      p["held_rows"].get<uint64_t>(), p["dropped_rows"].get<uint64_t>(),
      p["used_rows"].get<uint64_t>(),
      100.0 * double(p["used_rows"].get<uint64_t>()) /
          double(std::max<uint64_t>(1, p["fetched_rows"].get<uint64_t>())),
      prefetched.prefetch_refused, Quantile(prefetched.prefetch_ns, 0.5) / 1e3,
      Quantile(prefetched.prefetch_ns, 0.99) / 1e3);
  printf("  step latency with prefetch p50 %.1f us, p99 %.1f us\n",
         Quantile(prefetched.latency, 0.5) / 1e3, Quantile(prefetched.latency, 0.99) / 1e3);
}

// The two-phase replay's fetch times on the step timeline, for each step length.
void PrintHidden(const Options& o, const Phase& two_phase, const std::vector<StepFetch>& fetch) {
  std::vector<uint64_t> accepted, drafts;
  for (const StepFetch& f : fetch) accepted.push_back(f.accepted_ns), drafts.push_back(f.draft_ns);
  PrintPhase(absl::StrCat("engramd, two-phase k=", o.hide_drafts).c_str(), two_phase);
  printf(
      "  two-phase fetch: accepted rows p50 %.1f us, p99 %.1f us; draft rows (k=%u, right "
      "with p=%.2f while the draft holds) p50 %.1f us, p99 %.1f us\n",
      Quantile(accepted, 0.5) / 1e3, Quantile(accepted, 0.99) / 1e3, o.hide_drafts, o.draft_accept,
      Quantile(drafts, 0.5) / 1e3, Quantile(drafts, 0.99) / 1e3);
  printf(
      "  timeline: draft model %.0f%% of the step, then 40 layers; rows needed at layer 1; "
      "accepted rows from the step's start, draft rows from the draft's end\n",
      100.0 * o.draft_share);
  printf("  %8s %8s %9s %8s %15s %10s %12s %15s\n", "step", "hidden", "accepted", "draft",
         "steps exposed", "stall ms", "after-draft", "steps exposed");
  for (double ms : o.step_ms) {
    const StepTimeline t{.step_ns = static_cast<uint64_t>(ms * 1e6), .draft_share = o.draft_share};
    const HiddenReport r = HideFetches(fetch, t);
    printf("  %6.0fms %8.4f %9.4f %8.4f %7zu/%-7zu %10.2f %12.4f %7lu/%-7zu\n", ms,
           r.hidden_fraction, r.accepted_hidden_fraction, r.draft_hidden_fraction,
           r.exposed_steps.size(), fetch.size(), r.stall_ns / 1e6, r.after_draft_hidden_fraction,
           r.after_draft_exposed, fetch.size());
    std::string listed;
    for (size_t i = 0; i < r.exposed_steps.size() && i < 12; ++i) {
      const uint32_t step = r.exposed_steps[i];
      absl::StrAppend(&listed, " ", step, " (", TwoPhaseStallNs(fetch[step], t) / 1000, " us)");
    }
    if (!listed.empty()) {
      printf("    not fully hidden:%s%s\n", listed.c_str(),
             r.exposed_steps.size() > 12 ? " ..." : "");
    }
  }
}

// The machine, the trace, the mode and the cache: `capacity` rows in `cache_bytes`.
void PrintHeader(const Options& o, const Workload& w, uint64_t capacity, uint64_t cache_bytes) {
  utsname u;
  uname(&u);
  printf("engram-trace-replay on %s %s, %ld CPUs\n", u.nodename, u.release,
         sysconf(_SC_NPROCESSORS_ONLN));
  printf(
      "trace %s: %zu documents, compressed vocabulary %u; mode %s (%s), %zu steps, %lu row "
      "lookups of %lu distinct rows; tables of %lu rows (rows folded mod that), both in one "
      "cache of %lu rows (%.4f of the tables' rows, %.1f MiB)\n",
      o.trace.c_str(), w.trace.docs.size(), w.trace.compressed_vocab, o.mode.c_str(),
      o.mode == "decode" ? absl::StrCat(o.sequences, " sequences, one token a step").c_str()
                         : absl::StrCat(o.chunk_tokens, "-token chunks").c_str(),
      w.steps.size(), w.lookups, w.distinct, o.table_rows, capacity,
      double(capacity) / (2.0 * o.table_rows), double(cache_bytes) / (1 << 20));
  printf("  %-52s %10s %14s %12s %17s\n", "", "hit rate", "all-hit reqs", "row misses",
         o.warmup_steps == 0 ? "" : absl::StrCat("after ", o.warmup_steps, " steps").c_str());
}

void PrintReport(const Options& o, const Workload& w, const Phase& plain, const Phase& prefetched,
                 const Phase& in_place, const std::vector<PolicyResult>& sims,
                 const Phase& two_phase, const std::vector<StepFetch>& fetch) {
  const json& store = plain.status["store"];
  PrintHeader(o, w, store["cache"]["capacity_rows"].get<uint64_t>(),
              store["cache"]["bytes"].get<uint64_t>());
  PrintPhase("engramd (S3-FIFO)", plain);
  PrintPolicies(sims, o.warmup_steps != 0);
  if (o.prefetch_drafts != 0) PrintPrefetch(o, plain, prefetched);
  if (o.hide_drafts != 0) PrintHidden(o, two_phase, fetch);
  if (o.in_place) {
    PrintPhase("engramd, read in place", in_place);
    const double points = 100.0 * (in_place.status["store"]["hit_rate"].get<double>() -
                                   store["hit_rate"].get<double>());
    printf(
        "  read in place: %lu rows copied by the client; hit rate %+.2f points against "
        "through engramd; step latency p50 %.1f us, p99 %.1f us (layers one after the "
        "other)\n",
        in_place.rows_in_place, points, Quantile(in_place.latency, 0.5) / 1e3,
        Quantile(in_place.latency, 0.99) / 1e3);
  }
  printf("  step latency p50 %.1f us, p99 %.1f us (both layers' gathers, submitted together)\n",
         Quantile(plain.latency, 0.5) / 1e3, Quantile(plain.latency, 0.99) / 1e3);
  printf(
      "  engramd memory high-water %.1f MiB RSS; row store %.1f MiB (%lu evictions); rows "
      "wrong %lu\n",
      plain.hwm_kb / 1024.0, double(store["store_bytes"].get<uint64_t>()) / (1 << 20),
      store["cache"]["evictions"].get<uint64_t>(),
      plain.wrong + prefetched.wrong + in_place.wrong + two_phase.wrong);
}

// The steps as engram-ranks reads a trace (bench/daemon/ranks_bench.cc): one line per step,
// `1:ID,... 14:ID,...`; 0, or 1 after saying why the file could not be written.
int WriteSteps(const Options& o, const Workload& w) {
  FILE* f = fopen(o.write_steps.c_str(), "w");
  if (f == nullptr) {
    return fprintf(stderr, "cannot write %s: %s\n", o.write_steps.c_str(), strerror(errno)), 1;
  }
  fprintf(f, "# %zu %s steps of %s, rows folded into tables of %" PRIu64 " rows\n", w.steps.size(),
          o.mode.c_str(), o.trace.c_str(), o.table_rows);
  constexpr uint32_t kLayerIds[2] = {1, 14};
  for (const Step& s : w.steps) {
    for (int l = 0; l < 2; ++l) {
      fprintf(f, "%s%u:", l == 0 ? "" : " ", kLayerIds[l]);
      for (size_t i = 0; i < s.rows[l].size(); ++i) {
        fprintf(f, "%s%" PRIu64, i == 0 ? "" : ",", s.rows[l][i]);
      }
    }
    fputc('\n', f);
  }
  if (fclose(f) != 0) {
    return fprintf(stderr, "cannot write %s: %s\n", o.write_steps.c_str(), strerror(errno)), 1;
  }
  printf("wrote %zu steps (%" PRIu64 " row lookups) to %s\n", w.steps.size(), w.lookups,
         o.write_steps.c_str());
  return 0;
}

int Run(const Options& o) {
  Workload w;
  if (int rc = MakeWorkload(o, w); rc != 0) return rc;
  if (!o.write_steps.empty()) return WriteSteps(o, w);
  if (o.sim_only) {  // the capacity engramd would have with these bytes
    const uint64_t capacity = RowCache::Size(o.cache_bytes).slots;
    PrintHeader(o, w, capacity, o.cache_bytes);
    PrintPolicies(Simulate(o, w.steps, capacity), o.warmup_steps != 0);
    return 0;
  }
  const std::string model = EnsureModel(o);
  if (model.empty()) return 1;
  Phase plain, prefetched, in_place, two_phase;
  std::vector<StepFetch> fetch;
  if (int rc = Replay(o, w.steps, model, w.max_rows, nullptr, false, &plain); rc != 0) return rc;
  if (o.prefetch_drafts != 0) {
    Drafter drafter{.o = o,
                    .hasher = *w.hasher,
                    .trace = w.trace,
                    .state = o.seed * 2654435761u + 1,
                    .drafts = o.prefetch_drafts};
    if (int rc = Replay(o, w.steps, model, w.max_rows, &drafter, false, &prefetched); rc != 0) {
      return rc;
    }
  }
  if (o.in_place) {
    if (int rc = Replay(o, w.steps, model, w.max_rows, nullptr, true, &in_place); rc != 0) {
      return rc;
    }
  }
  if (o.hide_drafts != 0) {
    Drafter drafter{.o = o,
                    .hasher = *w.hasher,
                    .trace = w.trace,
                    .state = o.seed * 2654435761u + 1,
                    .drafts = o.hide_drafts};
    if (int rc = ReplayTwoPhase(o, w.steps, model, w.max_rows, &drafter, &fetch, &two_phase);
        rc != 0) {
      return rc;
    }
  }
  const uint64_t capacity = plain.status["store"]["cache"]["capacity_rows"].get<uint64_t>();
  PrintReport(o, w, plain, prefetched, in_place, Simulate(o, w.steps, capacity), two_phase, fetch);
  return plain.wrong + prefetched.wrong + in_place.wrong + two_phase.wrong == 0 ? 0 : 2;
}

void AddOptions(CLI::App& app, Options& o) {
  app.add_option("--trace", o.trace, "Trace from tools/trace/engram_trace.mjs")->required();
  app.add_option("--dir", o.dir, "Where the synthetic tables and the socket go")
      ->capture_default_str();
  app.add_option("--mode", o.mode, "decode or prefill")
      ->check(CLI::IsMember({"decode", "prefill"}))
      ->capture_default_str();
  app.add_option("--table-rows", o.table_rows, "Rows per synthetic table")->capture_default_str();
  app.add_option("--cache-mib", o.cache_mib, "Row cache size (MiB)")->capture_default_str();
  app.add_option("--cache-fraction", o.cache_fraction,
                 "Row cache size as a share of both tables' rows (a DGX Spark: 0.085); the "
                 "fewest bytes holding that many rows, instead of --cache-mib")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--sim-only", o.sim_only,
               "Run the offline policies alone at the cache's capacity, without engramd");
  app.add_option("--warmup-steps", o.warmup_steps,
                 "Also give the policies' hit rate over the steps after this many");
  app.add_flag("--tinylfu-variants", o.tinylfu_variants,
               "Also run S3-FIFO's TinyLFU filter with every setting of its sketch (sample, "
               "doorkeeper) and comparison (ties, ghost)");
  app.add_option("--sequences", o.sequences, "Decode: sequences in flight")->capture_default_str();
  app.add_option("--chunk-tokens", o.chunk_tokens, "Prefill: tokens a chunk")
      ->capture_default_str();
  app.add_option("--max-steps", o.max_steps, "Stop after this many steps (0: the whole trace)");
  app.add_option("--prefetch-drafts", o.prefetch_drafts,
                 "Decode: replay again prefetching the rows of this many draft tokens a sequence "
                 "after each step, and report the misses avoided (0: no)")
      ->capture_default_str();
  app.add_option("--draft-accept", o.draft_accept,
                 "Chance that a draft token is the true one while the draft holds")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--step-gap-us", o.step_gap_us,
                 "Microseconds from a step's start to the next (the forward pass), both runs")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the simulated draft model")->capture_default_str();
  app.add_option("--hide-drafts", o.hide_drafts,
                 "Decode: replay again fetching each step's accepted rows, then the rows of this "
                 "many draft tokens a sequence, and report the fetch time a step hides (0: no)")
      ->capture_default_str();
  app.add_option("--draft-share", o.draft_share,
                 "The draft model's share of a step in the --hide-drafts timeline")
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  app.add_option("--step-ms", o.step_ms, "Step lengths (ms) the --hide-drafts report covers")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--in-place", o.in_place,
               "Replay again with ENGRAM_GATHER_IN_PLACE (hits copied by the client) and compare "
               "the hit rates");
  app.add_option("--write-steps", o.write_steps,
                 "Write the hashed steps to this file as engram-ranks --trace reads them (one line "
                 "per step, LAYER:ID,... groups) and replay nothing");
}

}  // namespace
}  // namespace engram::bench

int main(int argc, char** argv) {
  engram::bench::Options o;
  CLI::App app{
      "Replays an Engram token trace through engramd's row cache beside LRU and S3-FIFO "
      "simulations, with and without a TinyLFU admission filter"};
  engram::bench::AddOptions(app, o);
  CLI11_PARSE(app, argc, argv);
  o.cache_bytes = o.cache_fraction > 0
                      ? engram::bench::CacheBytesForRows(engram::bench::FractionRows(o))
                      : o.cache_mib << 20;
  return engram::bench::Run(o);
}
