// Host-side Engram hashing throughput: a 96-token decode step (16 sequences x 6 tokens) and an
// 8,192-token prefill chunk, both DeepSeek-V4.1 layers, all 24 heads and one TP4 rank's 6,
// from compressed and from tokenizer ids; next to the same loop with a hardware divide.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "hash/ngram_hasher.h"

namespace engram {
namespace {

constexpr char kDsv41Config[] = R"({"text_config": {
  "engram_layer_ids": [1, 14], "engram_num_embeddings": [384006168, 384016682],
  "engram_max_ngram_size": 4, "engram_n_heads": 8, "engram_vocab_size": 16000000,
  "engram_pad_token_id": 2, "engram_compressed_vocab_size": 99092}})";
constexpr uint32_t kTokenizerVocab = 129280;

const NgramHasher& Hasher() {
  static const NgramHasher* hasher = [] {
    auto config = ParseHashConfig(kDsv41Config, "DeepSeek-V4.1 config");
    auto layers = DeriveLayerTables(*config);
    // A tokenizer-sized lookup table (129,280 -> 99,092) so tokenizer ids pay the real lookup.
    CompressedVocab vocab;
    std::mt19937 rng(1);
    for (uint32_t i = 0; i < kTokenizerVocab; ++i) {
      vocab.lookup.push_back(i < 99092 ? i : rng() % 99092);
    }
    return new NgramHasher(*NgramHasher::Create(*config, *layers, vocab, 2));
  }();
  return *hasher;
}

// A Zipf-like token stream: what natural text looks like to the hash.
std::vector<int32_t> Tokens(size_t n, uint32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    id = static_cast<int32_t>(std::min<double>(vocab - 1, std::pow(vocab, u) - 1));
  }
  return ids;
}

struct Batch {
  std::vector<int32_t> ids;  // per sequence: 3 history ids, then its new tokens
  std::vector<HashSequence> seqs;
  size_t tokens = 0;
};

Batch MakeBatch(size_t sequences, size_t tokens_each, uint32_t vocab) {
  Batch b;
  b.ids = Tokens(sequences * (tokens_each + 3), vocab, 7);
  for (size_t s = 0; s < sequences; ++s) {
    const size_t base = s * (tokens_each + 3);
    b.seqs.push_back({std::span<const int32_t>(b.ids).subspan(base + 3, tokens_each),
                      std::span<const int32_t>(b.ids).subspan(base, 3)});
  }
  b.tokens = sequences * tokens_each;
  return b;
}

// args: layer id, sequences, tokens per sequence, TP size (1 = all heads; 4 = rank 1's heads),
// tokenizer ids (1) or compressed ids (0).
void BM_NgramHasher(benchmark::State& state) {
  const NgramHasher& h = Hasher();
  const uint32_t layer = *h.LayerIndex(static_cast<uint32_t>(state.range(0)));
  const bool tokenizer_ids = state.range(4) != 0;
  Batch b = MakeBatch(state.range(1), state.range(2), tokenizer_ids ? kTokenizerVocab : 99092);
  const HeadRange heads =
      *h.RankHeads(static_cast<uint32_t>(state.range(3)), state.range(3) > 1 ? 1 : 0);
  std::vector<uint64_t> out(b.tokens * heads.size());
  const TokenSpace space = tokenizer_ids ? TokenSpace::kTokenizer : TokenSpace::kCompressed;
  for (auto _ : state) {
    absl::Status st = h.Hash(layer, b.seqs, space, heads, out);
    benchmark::DoNotOptimize(out.data());
    if (!st.ok()) state.SkipWithError(std::string(st.message()).c_str());
  }
  state.SetItemsProcessed(state.iterations() * b.tokens);
  state.counters["rows"] = static_cast<double>(b.tokens * heads.size());
  state.counters["ns_per_token"] = benchmark::Counter(
      static_cast<double>(b.tokens),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// Baseline: the same hash with the hardware 64-bit divide and a branch on the mix's sign, as
// a direct transcription of the reference would do it.
void BM_HardwareDivideBaseline(benchmark::State& state) {
  const NgramHasher& h = Hasher();
  const LayerTables& t = h.layer(*h.LayerIndex(static_cast<uint32_t>(state.range(0))));
  Batch b = MakeBatch(state.range(1), state.range(2), 99092);
  const HeadRange heads =
      *h.RankHeads(static_cast<uint32_t>(state.range(3)), state.range(3) > 1 ? 1 : 0);
  std::vector<uint64_t> out(b.tokens * heads.size());
  const uint64_t* m = reinterpret_cast<const uint64_t*>(t.multipliers.data());
  for (auto _ : state) {
    uint64_t* dst = out.data();
    for (const HashSequence& s : b.seqs) {
      uint64_t w1 = s.history[2], w2 = s.history[1], w3 = s.history[0];
      for (int32_t tok : s.tokens) {
        const uint64_t w0 = static_cast<uint64_t>(tok);
        const uint64_t mix2 = (w0 * m[0]) ^ (w1 * m[1]);
        const uint64_t mix3 = mix2 ^ (w2 * m[2]);
        const uint64_t mixes[3] = {mix2, mix3, mix3 ^ (w3 * m[3])};
        for (uint32_t hd = heads.begin; hd < heads.end; ++hd) {
          const int64_t mix = static_cast<int64_t>(mixes[hd / 8]);
          const int64_t p = static_cast<int64_t>(t.primes[hd]);
          int64_t r = mix % p;
          if (r < 0) r += p;
          *dst++ = t.head_offsets[hd] + static_cast<uint64_t>(r);
        }
        w3 = w2;
        w2 = w1;
        w1 = w0;
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * b.tokens);
  state.counters["ns_per_token"] = benchmark::Counter(
      static_cast<double>(b.tokens),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void Shapes(benchmark::internal::Benchmark* bm, bool with_token_space) {
  bm->ArgNames({"layer", "seqs", "tokens", "tp", "tokenizer_ids"});
  for (int64_t layer : {1, 14}) {
    for (auto [seqs, tokens] : {std::pair<int64_t, int64_t>{16, 6}, {1, 8192}}) {
      for (int64_t tp : {1, 4}) {
        bm->Args({layer, seqs, tokens, tp, 0});
        if (with_token_space) bm->Args({layer, seqs, tokens, tp, 1});
      }
    }
  }
}

BENCHMARK(BM_NgramHasher)->Apply([](auto* bm) { Shapes(bm, true); });
BENCHMARK(BM_HardwareDivideBaseline)->Apply([](auto* bm) { Shapes(bm, false); });

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

}  // namespace
}  // namespace engram

int main(int argc, char** argv) {
  benchmark::AddCustomContext("cpu_model", engram::CpuModel());
  benchmark::AddCustomContext("config",
                              "DeepSeek-V4.1: layers 1 and 14, orders 2-4, 8 heads "
                              "per order, compressed vocab 99,092, tokenizer 129,280");
  benchmark::AddCustomContext("threads", "1 (the hasher is single-threaded per call)");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
