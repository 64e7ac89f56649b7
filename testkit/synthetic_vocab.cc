// A hashable synthetic checkpoint's tokenizer files and derived hash tables (synthetic_vocab.h).
#include "testkit/synthetic_vocab.h"

#include <bit>
#include <cstring>
#include <filesystem>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_io.h"
#include "hash/hash_tables.h"
#include "hash/primes.h"
#include "nlohmann/json.hpp"

namespace engram {
namespace {

using ordered_json = nlohmann::ordered_json;

static_assert(std::endian::native == std::endian::little, "engram-hash.bin is little-endian");

// GPT-2's byte-level stand-in for a space (U+0120), which its decoder turns back into 0x20.
constexpr char kByteLevelSpace[] = "\xC4\xA0";

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

template <typename T>
void Append(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

std::string TokenizerJson(const SyntheticVocab& vocab) {
  ordered_json added = ordered_json::array();
  for (size_t id = 0; id < vocab.specials.size(); ++id) {
    added.push_back({{"id", id},
                     {"content", vocab.specials[id]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  ordered_json map = ordered_json::object();
  for (size_t id = 0; id < vocab.tokens.size(); ++id) map[vocab.tokens[id]] = id;
  const ordered_json byte_level = {{"type", "ByteLevel"},
                                   {"add_prefix_space", false},
                                   {"trim_offsets", true},
                                   {"use_regex", true}};
  ordered_json doc;
  doc["version"] = "1.0";
  doc["truncation"] = nullptr;
  doc["padding"] = nullptr;
  doc["added_tokens"] = added;
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = byte_level;
  doc["post_processor"] = nullptr;
  doc["decoder"] = byte_level;
  doc["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"vocab", map},
                  {"merges", ordered_json::array()}};
  return doc.dump(1) + "\n";
}

std::string TokenizerConfigJson(const SyntheticVocab& vocab) {
  ordered_json doc;
  doc["tokenizer_class"] = "PreTrainedTokenizerFast";
  doc["bos_token"] = vocab.specials[0];
  doc["eos_token"] = vocab.specials[1];
  doc["pad_token"] = vocab.specials[vocab.pad_token_id];
  doc["add_bos_token"] = true;
  doc["add_eos_token"] = false;
  doc["model_max_length"] = 65536;
  doc["clean_up_tokenization_spaces"] = false;
  return doc.dump(2) + "\n";
}

// The checks LoadDerivedTables makes of the parameters, made before anything is written.
absl::Status CheckConfigAgainstVocab(const HashConfig& config, const SyntheticVocab& vocab) {
  if (config.compressed_vocab_size != vocab.compressed_size ||
      config.pad_token_id != vocab.pad_token_id) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "config.json has engram_compressed_vocab_size %d and engram_pad_token_id %d; the "
        "synthetic tokenizer has %d compressed ids and pad id %d",
        config.compressed_vocab_size, config.pad_token_id, vocab.compressed_size,
        vocab.pad_token_id));
  }
  return absl::OkStatus();
}

// The body of engram-hash.bin: per layer its record, multipliers and primes; then the lookup.
std::string DerivedBody(const std::vector<LayerTables>& layers, const SyntheticVocab& vocab) {
  std::string body;
  for (const LayerTables& t : layers) {
    Append(body, DerivedLayerRecord{t.layer_id, 0, t.num_rows()});
    for (int64_t m : t.multipliers) Append(body, m);
    for (uint64_t p : t.primes) Append(body, p);
  }
  for (uint32_t id : vocab.lookup) Append(body, id);
  return body;
}

absl::StatusOr<std::string> DerivedTablesFile(const std::string& config_text,
                                              const std::string& tokenizer_text,
                                              const SyntheticVocab& vocab) {
  auto config = ParseHashConfig(config_text, "config.json");
  if (!config.ok()) return config.status();
  if (absl::Status s = CheckConfigAgainstVocab(*config, vocab); !s.ok()) return s;
  auto layers = DeriveLayerTables(*config);  // refuses rows that are not the primes' sums
  if (!layers.ok()) return layers.status();
  const std::string body = DerivedBody(*layers, vocab);
  DerivedHeader h{};
  std::memcpy(h.magic, kDerivedMagic, sizeof(h.magic));
  h.version = kDerivedVersion;
  h.header_bytes = sizeof(DerivedHeader);
  h.file_bytes = sizeof(DerivedHeader) + body.size();
  h.body_crc32 = Crc32(Bytes(body));
  h.config_bytes = config_text.size();
  h.config_crc32 = Crc32(Bytes(config_text));
  h.tokenizer_crc32 = Crc32(Bytes(tokenizer_text));
  h.tokenizer_bytes = tokenizer_text.size();
  h.vocab_size = static_cast<uint32_t>(vocab.lookup.size());
  h.compressed_vocab_size = vocab.compressed_size;
  h.seed = config->seed;
  h.pad_token_id = vocab.pad_token_id;
  h.compressed_pad_id = vocab.lookup[vocab.pad_token_id];
  h.max_ngram_size = config->max_ngram_size;
  h.n_heads = config->n_heads;
  h.num_layers = static_cast<uint32_t>(layers->size());
  h.header_crc32 = Crc32({reinterpret_cast<const uint8_t*>(&h), sizeof(h)});
  std::string file;
  Append(file, h);
  return file + body;
}

}  // namespace

SyntheticVocab MakeSyntheticVocab(uint32_t words) {
  SyntheticVocab v;
  v.specials = {"<|begin_of_sentence|>", "<|end_of_sentence|>", "<|pad|>"};
  v.pad_token_id = 2;
  for (const std::string& s : v.specials) {
    v.lookup.push_back(static_cast<uint32_t>(v.tokens.size()));
    v.tokens.push_back(s);
  }
  for (uint32_t i = 0; i < words; ++i) {
    const uint32_t compressed = static_cast<uint32_t>(v.specials.size()) + i;
    for (std::string token :
         {absl::StrCat("w", i), absl::StrCat(kByteLevelSpace, "w", i), absl::StrCat("W", i)}) {
      v.tokens.push_back(std::move(token));
      v.lookup.push_back(compressed);
    }
  }
  v.compressed_size = static_cast<uint32_t>(v.specials.size()) + words;
  return v;
}

std::vector<uint64_t> HashableRows(size_t num_layers, uint64_t prime_start) {
  const uint32_t heads = (kSyntheticMaxNgram - 1) * kSyntheticHeadsPerOrder;
  const std::vector<uint64_t> primes = FindHeadPrimes(
      static_cast<uint32_t>(num_layers), std::vector<uint64_t>(kSyntheticMaxNgram - 1, prime_start),
      kSyntheticHeadsPerOrder);
  std::vector<uint64_t> rows(num_layers, 0);
  for (size_t i = 0; i < primes.size(); ++i) rows[i / heads] += primes[i];
  return rows;
}

absl::Status WriteHashFiles(const std::string& dir, const std::string& config_text,
                            const SyntheticVocab& vocab) {
  const std::filesystem::path d(dir);
  const std::string tokenizer = TokenizerJson(vocab);
  auto derived = DerivedTablesFile(config_text, tokenizer, vocab);
  if (!derived.ok()) {
    return absl::Status(derived.status().code(), absl::StrCat((d / "config.json").string(), ": ",
                                                              derived.status().message()));
  }
  if (absl::Status s = WriteWholeFile((d / "tokenizer.json").string(), tokenizer); !s.ok()) {
    return s;
  }
  if (absl::Status s =
          WriteWholeFile((d / "tokenizer_config.json").string(), TokenizerConfigJson(vocab));
      !s.ok()) {
    return s;
  }
  return WriteWholeFile(DefaultDerivedPath(dir), *derived);
}

}  // namespace engram
