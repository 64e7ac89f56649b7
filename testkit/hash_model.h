// A model directory that both engramd and the n-gram hasher read: a synthetic checkpoint whose
// tables have exactly the rows the config's hash parameters imply (small primes, so every hashed
// row exists), shared by the tests that hash and then gather.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "testkit/daemon_test_util.h"
#include "testkit/synthetic.h"

namespace engram::testing {

inline constexpr uint64_t kHashSeed = 424242;
inline constexpr uint32_t kLayers[2] = {1, 14};
inline constexpr uint32_t kHeadsPerOrder = 8;
inline constexpr uint32_t kHeads = 3 * kHeadsPerOrder;  // orders 2..4
inline constexpr uint64_t kPrimeStart = 600;            // engram_vocab_size
inline constexpr uint32_t kCompressedVocab = 5000;
inline constexpr uint32_t kPadId = 2;  // compressed pad id (compressed ids only: no tokenizer here)

inline bool IsPrime(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t d = 2; d * d <= n; ++d) {
    if (n % d == 0) return false;
  }
  return true;
}

// Rows of each layer's table: with one engram_vocab_size for every order, the head primes are
// the consecutive primes from it, 24 per layer in layer order (docs/hashing.md, "Primes").
inline std::vector<uint64_t> LayerRows() {
  std::vector<uint64_t> rows;
  uint64_t candidate = kPrimeStart;
  for (size_t layer = 0; layer < 2; ++layer) {
    uint64_t sum = 0;
    for (uint32_t head = 0; head < kHeads; ++head) {
      while (!IsPrime(candidate)) ++candidate;
      sum += candidate++;
    }
    rows.push_back(sum);
  }
  return rows;
}

// A model directory both engramd and the hasher read: a synthetic checkpoint whose tables have
// exactly the rows the config's hash parameters imply (each layer written at its own size).
inline const std::string& HashModel() {
  static std::string dir = [] {
    const std::vector<uint64_t> rows = LayerRows();
    const std::string d = TestDir() + "/hash-model";
    const std::string other = TestDir() + "/hash-model-14";
    for (int i = 0; i < 2; ++i) {
      engram::SynthOptions o{.out_dir = i == 0 ? d : other, .rows = rows[i], .seed = kHashSeed};
      absl::Status s = engram::WriteSyntheticCheckpoint(o);
      if (!s.ok()) {
        fprintf(stderr, "cannot write the synthetic checkpoint: %s\n", s.ToString().c_str());
        abort();
      }
    }
    const engram::SynthOptions names{.out_dir = d, .seed = kHashSeed};
    const std::string shard = engram::SyntheticShardName(names, 14);
    std::filesystem::copy_file(other + "/" + shard, d + "/" + shard,
                               std::filesystem::copy_options::overwrite_existing);
    std::ofstream config(d + "/config.json", std::ios::trunc);
    config << "{\"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\", "
              "\"text_config\": {\"model_type\": \"deepseek_v4\", \"engram_layer_ids\": [1, 14], "
              "\"engram_num_embeddings\": ["
           << rows[0] << ", " << rows[1]
           << "], \"engram_max_ngram_size\": 4, \"engram_n_heads\": 8, \"engram_head_dim\": 256, "
              "\"engram_vocab_size\": "
           << kPrimeStart
           << ", \"engram_pad_token_id\": 2, \"engram_compressed_vocab_size\": " << kCompressedVocab
           << "}}\n";
    config.close();
    if (!config) abort();
    return d;
  }();
  return dir;
}

}  // namespace engram::testing
