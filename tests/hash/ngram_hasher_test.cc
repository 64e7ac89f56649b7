// NgramHasher: golden rows, history across chunks and micro-batches, head ranges and ranks,
// the compressed vocabulary, config parsing and every refused input.
#include "hash/ngram_hasher.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace engram {
namespace {

constexpr char kDsv41Config[] = R"({"model_type": "deepseek_v4", "text_config": {
  "engram_layer_ids": [1, 14], "engram_num_embeddings": [384006168, 384016682],
  "engram_max_ngram_size": 4, "engram_n_heads": 8, "engram_head_dim": 256,
  "engram_vocab_size": 16000000, "engram_pad_token_id": 2,
  "engram_compressed_vocab_size": 99092}})";

NgramHasher MakeHasher(std::optional<CompressedVocab> vocab = std::nullopt, uint32_t pad = 2) {
  auto config = ParseHashConfig(kDsv41Config, "test config");
  REQUIRE(config.ok());
  auto layers = DeriveLayerTables(*config);
  REQUIRE(layers.ok());
  auto h = NgramHasher::Create(*config, *layers, std::move(vocab), pad);
  REQUIRE(h.ok());
  return *std::move(h);
}

std::vector<uint64_t> HashWhole(const NgramHasher& h, uint32_t layer,
                                const std::vector<int32_t>& ids, HeadRange heads) {
  std::vector<uint64_t> out(ids.size() * heads.size());
  HashSequence seq{ids, {}};
  REQUIRE(h.Hash(layer, {&seq, 1}, TokenSpace::kCompressed, heads, out).ok());
  return out;
}

std::vector<int32_t> RandomIds(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % 99092);
  return ids;
}

TEST_CASE("Golden rows from the reference, both layers") {
  const NgramHasher h = MakeHasher();
  auto rows14 = HashWhole(h, 1, {5, 17, 99091, 3}, h.AllHeads());
  const std::vector<uint64_t> want14 = {
      3342376,   21618915,  42413839,  54133478,  68950507,  84184975,  111235544, 120138013,
      136986856, 159180752, 165935763, 182628261, 198073603, 211128059, 234924244, 240163183,
      267717383, 277766378, 294513801, 304083642, 335453080, 342589283, 366724339, 377785826};
  CHECK(std::vector<uint64_t>(rows14.begin() + 3 * 24, rows14.end()) == want14);
  CHECK(std::vector<uint64_t>(rows14.begin(), rows14.begin() + 3) ==
        std::vector<uint64_t>{6939818, 27264717, 45254833});
  auto rows1 = HashWhole(h, 0, {0, 99091, 2, 2, 77}, h.AllHeads());
  const std::vector<uint64_t> want1 = {
      5558068,   24419415,  37771614,  48595376,  64853195,  86278509,  96992278,  126975926,
      140551575, 147242406, 175398281, 191075418, 200069926, 220577321, 227350310, 253962167,
      262252437, 277083940, 302149621, 309772649, 321332718, 348389905, 364923724, 380607781};
  CHECK(std::vector<uint64_t>(rows1.begin() + 4 * 24, rows1.end()) == want1);
}

TEST_CASE("Chunks with their history hash exactly as the whole sequence") {
  const NgramHasher h = MakeHasher();
  const std::vector<int32_t> ids = RandomIds(40, 1);
  const auto whole = HashWhole(h, 1, ids, h.AllHeads());
  for (size_t chunk = 1; chunk <= ids.size(); ++chunk) {
    std::vector<HashSequence> seqs;
    for (size_t b = 0; b < ids.size(); b += chunk) {
      const size_t e = std::min(ids.size(), b + chunk);
      // History: at most the 3 ids that matter, or everything before (extra ids are ignored).
      const size_t hist = chunk % 2 ? std::min<size_t>(b, 3) : b;
      seqs.push_back({std::span<const int32_t>(ids).subspan(b, e - b),
                      std::span<const int32_t>(ids).subspan(b - hist, hist)});
    }
    std::vector<uint64_t> out(whole.size());
    REQUIRE(h.Hash(1, seqs, TokenSpace::kCompressed, h.AllHeads(), out).ok());
    INFO("chunk " << chunk);
    REQUIRE(out == whole);
  }
}

TEST_CASE("Missing history is the pad id; short history is padded before it") {
  const NgramHasher h = MakeHasher();
  const std::vector<int32_t> ids = RandomIds(10, 2);
  std::vector<int32_t> padded = {2, 2, 2};
  padded.insert(padded.end(), ids.begin(), ids.end());
  const auto with_pads = HashWhole(h, 0, padded, h.AllHeads());
  const auto plain = HashWhole(h, 0, ids, h.AllHeads());
  CHECK(std::vector<uint64_t>(with_pads.begin() + 3 * 24, with_pads.end()) == plain);

  // One id of history: the two before it are pad.
  const std::vector<int32_t> one = {ids[0]};
  HashSequence seq{std::span<const int32_t>(ids).subspan(1), one};
  std::vector<uint64_t> out(9 * 24);
  REQUIRE(h.Hash(0, {&seq, 1}, TokenSpace::kCompressed, h.AllHeads(), out).ok());
  CHECK(out == std::vector<uint64_t>(plain.begin() + 24, plain.end()));
}

TEST_CASE("Sequences of a batch do not see each other") {
  const NgramHasher h = MakeHasher();
  const auto a = RandomIds(7, 3), b = RandomIds(5, 4);
  HashSequence seqs[2] = {{a, {}}, {b, {}}};
  std::vector<uint64_t> out(12 * 24);
  REQUIRE(h.Hash(1, seqs, TokenSpace::kCompressed, h.AllHeads(), out).ok());
  auto wa = HashWhole(h, 1, a, h.AllHeads());
  auto wb = HashWhole(h, 1, b, h.AllHeads());
  wa.insert(wa.end(), wb.begin(), wb.end());
  CHECK(out == wa);
}

TEST_CASE("Head ranges and tensor-parallel ranks select contiguous slices") {
  const NgramHasher h = MakeHasher();
  const auto ids = RandomIds(50, 5);
  const auto all = HashWhole(h, 0, ids, h.AllHeads());
  for (uint32_t tp : {1u, 2u, 3u, 4u, 6u, 8u, 12u, 24u}) {
    for (uint32_t rank = 0; rank < tp; ++rank) {
      auto heads = h.RankHeads(tp, rank);
      REQUIRE(heads.ok());
      CHECK(heads->size() == 24 / tp);
      auto rows = h.HeadRows(0, *heads);
      REQUIRE(rows.ok());
      const auto part = HashWhole(h, 0, ids, *heads);
      for (size_t t = 0; t < ids.size(); ++t) {
        for (uint32_t j = 0; j < heads->size(); ++j) {
          const uint64_t row = part[t * heads->size() + j];
          REQUIRE(row == all[t * 24 + heads->begin + j]);
          REQUIRE(row >= rows->first);
          REQUIRE(row < rows->second);
        }
      }
    }
  }
  auto r1 = h.RankHeads(4, 1);
  CHECK(h.HeadRows(0, *r1)->first == 96000564);
  CHECK(h.HeadRows(0, *r1)->second == 192001740);
  CHECK(!h.RankHeads(5, 0).ok());
  CHECK(!h.RankHeads(0, 0).ok());
  CHECK(!h.RankHeads(4, 4).ok());
  CHECK(!h.HeadRows(0, {3, 3}).ok());
  CHECK(!h.HeadRows(2, {0, 1}).ok());
}

TEST_CASE("Tokenizer ids go through the compressed vocabulary, the pad id too") {
  // Tokenizer ids 0..199999 fold onto compressed ids by i % 99092 (in order of appearance).
  CompressedVocab vocab;
  for (uint32_t i = 0; i < 200000; ++i) vocab.lookup.push_back(i % 99092);
  vocab.compressed_pad_id = 2;
  const NgramHasher h = MakeHasher(vocab, 2);
  const std::vector<int32_t> raw = {150000, 5, 199999, 99094, 7};
  std::vector<int32_t> compressed(raw.size());
  REQUIRE(h.Compress(raw, compressed).ok());
  CHECK(compressed == std::vector<int32_t>{150000 - 99092, 5, 199999 - 2 * 99092, 2, 7});
  std::vector<uint64_t> out(raw.size() * 24);
  HashSequence seq{raw, {}};
  REQUIRE(h.Hash(0, {&seq, 1}, TokenSpace::kTokenizer, h.AllHeads(), out).ok());
  CHECK(out == HashWhole(h, 0, compressed, h.AllHeads()));
  std::vector<int32_t> bad = {200000};
  CHECK(absl::IsInvalidArgument(h.Compress(bad, compressed)));
}

TEST_CASE("Bad ids, short output and bad ranges are refused before anything is written") {
  const NgramHasher h = MakeHasher();
  const auto ids = RandomIds(6, 6);
  std::vector<int32_t> bad = ids;
  bad[2] = 99092;
  std::vector<uint64_t> out(12 * 24, 12345);
  HashSequence seqs[2] = {{ids, {}}, {bad, {}}};
  auto st = h.Hash(0, seqs, TokenSpace::kCompressed, h.AllHeads(), out);
  REQUIRE(absl::IsInvalidArgument(st));
  CHECK(std::string(st.message()).find("sequence 1, token at position 2") != std::string::npos);
  CHECK(std::string(st.message()).find("99092") != std::string::npos);
  CHECK(std::all_of(out.begin(), out.end(), [](uint64_t v) { return v == 12345; }));

  bad[2] = -1;
  CHECK(absl::IsInvalidArgument(h.Hash(0, seqs, TokenSpace::kCompressed, h.AllHeads(), out)));
  const std::vector<int32_t> bad_history = {1, -5};
  HashSequence hs{ids, bad_history};
  st = h.Hash(0, {&hs, 1}, TokenSpace::kCompressed, h.AllHeads(), out);
  CHECK(std::string(st.message()).find("history entry at position 1") != std::string::npos);

  HashSequence ok{ids, {}};
  std::vector<uint64_t> small(6 * 24 - 1);
  CHECK(
      absl::IsResourceExhausted(h.Hash(0, {&ok, 1}, TokenSpace::kCompressed, h.AllHeads(), small)));
  CHECK(absl::IsInvalidArgument(h.Hash(0, {&ok, 1}, TokenSpace::kCompressed, {4, 25}, out)));
  CHECK(absl::IsInvalidArgument(h.Hash(0, {&ok, 1}, TokenSpace::kCompressed, {4, 4}, out)));
  CHECK(absl::IsInvalidArgument(h.Hash(2, {&ok, 1}, TokenSpace::kCompressed, h.AllHeads(), out)));
  CHECK(absl::IsFailedPrecondition(h.Hash(0, {&ok, 1}, TokenSpace::kTokenizer, h.AllHeads(), out)));
  CHECK(h.LayerIndex(14).value() == 1);
  CHECK(absl::IsNotFound(h.LayerIndex(2).status()));
  CHECK(!NgramHasher::Create(h.config(), {}, std::nullopt, 2).ok());
  auto layers = DeriveLayerTables(h.config());
  CHECK(!NgramHasher::Create(h.config(), *layers, std::nullopt, 99092).ok());
}

TEST_CASE("config.json parsing names what is wrong") {
  auto top = ParseHashConfig(R"({"engram_layer_ids": [3], "engram_num_embeddings": [10],
      "engram_max_ngram_size": 3, "engram_n_heads": 2, "engram_vocab_size": [7, 9],
      "engram_pad_token_id": 0, "engram_compressed_vocab_size": 100, "engram_seed": 4})",
                             "a.json");
  REQUIRE(top.ok());
  CHECK(top->prime_search_start == std::vector<uint64_t>{7, 9});
  CHECK(top->seed == 4);
  CHECK(top->heads_per_layer() == 4);

  const auto error = [](const std::string& json) {
    auto c = ParseHashConfig(json, "cfg.json");
    REQUIRE(!c.ok());
    return std::string(c.status().message());
  };
  const std::string base = R"("engram_num_embeddings": [10], "engram_max_ngram_size": 3,
      "engram_n_heads": 2, "engram_vocab_size": 7, "engram_pad_token_id": 0,
      "engram_compressed_vocab_size": 100)";
  CHECK(error("[1, 2]").find("not a JSON object") != std::string::npos);
  CHECK(error("{\"x\": 1}").find("not an Engram model") != std::string::npos);
  CHECK(error(R"({"engram_layer_ids": [3, 3], )" + base + "}").find("twice") != std::string::npos);
  CHECK(error(R"({"engram_layer_ids": [3, 4], )" + base + "}")
            .find("'engram_num_embeddings' has 1 entries, expected 2") != std::string::npos);
  CHECK(error(R"({"engram_layer_ids": [3], "engram_num_embeddings": [10],
      "engram_max_ngram_size": 9, "engram_n_heads": 2, "engram_vocab_size": 7,
      "engram_pad_token_id": 0, "engram_compressed_vocab_size": 100})")
            .find("'engram_max_ngram_size' = 9 is outside [2, 8]") != std::string::npos);
  CHECK(error(R"({"engram_layer_ids": [3], "engram_num_embeddings": [10],
      "engram_max_ngram_size": 3, "engram_n_heads": "2", "engram_vocab_size": 7,
      "engram_pad_token_id": 0, "engram_compressed_vocab_size": 100})")
            .find("'engram_n_heads' must be a non-negative integer") != std::string::npos);
  CHECK(error(R"({"engram_layer_ids": [3], "engram_num_embeddings": [10],
      "engram_max_ngram_size": 3, "engram_n_heads": 2, "engram_vocab_size": 7,
      "engram_pad_token_id": -1, "engram_compressed_vocab_size": 100})")
            .find("engram_pad_token_id") != std::string::npos);
  CHECK(error(R"({"engram_layer_ids": [3], "engram_num_embeddings": [10],
      "engram_max_ngram_size": 3, "engram_n_heads": 2, "engram_vocab_size": 7,
      "engram_pad_token_id": 0})")
            .find("missing key 'engram_compressed_vocab_size'") != std::string::npos);
  CHECK(absl::IsNotFound(LoadHashConfig("/nonexistent-model-dir").status()));
}

}  // namespace
}  // namespace engram
