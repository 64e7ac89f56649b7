// engram-model-step's synthetic checkpoint: tables of the DeepSeek-V4.1 layout whose sizes the
// head primes imply, and the hashers that read it and find the rank's rows.
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "bench/model/model_step.h"
#include "engram/gpu_hash.h"
#include "engram/hash.h"
#include "testkit/synthetic.h"

namespace engram::bench::model_step {
namespace {

bool IsPrime(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t d = 2; d * d <= n; ++d) {
    if (n % d == 0) return false;
  }
  return true;
}

}  // namespace

std::vector<std::vector<uint64_t>> HeadPrimes(uint64_t start) {
  std::vector<std::vector<uint64_t>> primes(2);
  uint64_t c = start;
  for (auto& layer : primes) {
    while (layer.size() < kHeadsPerTable) {
      if (IsPrime(c)) layer.push_back(c);
      ++c;
    }
  }
  return primes;
}

std::string MakeModel(const Options& o, const std::vector<std::vector<uint64_t>>& primes) {
  const std::string d = o.dir + "/model-" + std::to_string(o.engram_vocab_size);
  if (std::filesystem::exists(d + "/config.json")) return d;
  uint64_t rows[2];
  for (int l = 0; l < 2; ++l) {
    rows[l] = 0;
    for (uint64_t p : primes[l]) rows[l] += p;
  }
  const std::string tmp = d + ".part";
  std::filesystem::remove_all(tmp);
  for (int l = 0; l < 2; ++l) {
    const std::string part = tmp + "-" + std::to_string(l);
    std::filesystem::remove_all(part);
    SynthOptions so{.out_dir = part, .rows = rows[l], .seed = 7};
    absl::Status s = WriteSyntheticCheckpoint(so);
    if (!s.ok()) throw Failure("cannot write the synthetic checkpoint: " + s.ToString());
  }
  // Layer 1's checkpoint directory with layer 14's shard from the second one (each table at its
  // own size), then the config with the hash parameters.
  std::filesystem::rename(tmp + "-0", tmp);
  const SynthOptions names{.out_dir = tmp, .seed = 7};
  const std::string shard = SyntheticShardName(names, 14);
  std::filesystem::rename(tmp + "-1/" + shard, tmp + "/" + shard);
  std::filesystem::remove_all(tmp + "-1");
  std::ofstream config(tmp + "/config.json", std::ios::trunc);
  config << "{\"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\", "
            "\"text_config\": {\"model_type\": \"deepseek_v4\", \"engram_layer_ids\": [1, 14], "
            "\"engram_num_embeddings\": ["
         << rows[0] << ", " << rows[1]
         << "], \"engram_max_ngram_size\": 4, \"engram_n_heads\": 8, \"engram_head_dim\": 256, "
            "\"engram_vocab_size\": "
         << o.engram_vocab_size << ", \"engram_pad_token_id\": 2, "
         << "\"engram_compressed_vocab_size\": " << kCompressedVocab << "}}\n";
  config.close();
  if (!config) throw Failure("cannot write " + tmp + "/config.json");
  std::filesystem::rename(tmp, d);
  return d;
}

Hashing::Hashing(const std::string& model, const std::vector<std::vector<uint64_t>>& primes) {
  engram_hasher_opts ho;
  engram_hasher_opts_init(&ho, sizeof(ho));
  ho.flags = ENGRAM_HASHER_COMPRESSED_ONLY;
  ho.compressed_pad_id = kPadId;
  ENGRAM_CHECK(engram_hasher_open(model.c_str(), &ho, &h.host));
  ENGRAM_CHECK(engram_gpu_hasher_create(h.host, &h.gpu));
  ENGRAM_CHECK(engram_hasher_rank_heads(h.host, kTp, kRank, &h.head_begin, &h.head_end));
  for (int l = 0; l < 2; ++l) {
    for (uint32_t hd = 0; hd < kHeadsPerTable; ++hd) {
      if (hd < h.head_begin)
        rank_begin[l] += primes[l][hd];
      else if (hd < h.head_end)
        rank_rows[l] += primes[l][hd];
    }
  }
}

Hashing::~Hashing() {
  engram_gpu_hasher_destroy(h.gpu);
  engram_hasher_close(h.host);
}

}  // namespace engram::bench::model_step
