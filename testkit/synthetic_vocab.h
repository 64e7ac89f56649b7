// The files that make a synthetic checkpoint hashable: a small byte-level BPE tokenizer whose
// compressed vocabulary is known by construction, and the derived hash tables (engram-hash.bin)
// that the n-gram hasher loads, written from the hasher's own derivation (hash/).
//
//   engram::SyntheticVocab vocab = engram::MakeSyntheticVocab(engram::kSyntheticWords);
//   std::vector<uint64_t> rows = engram::HashableRows(2, 600);  // rows of layers 1 and 14
//   ... write config.json with those rows and vocab's sizes ...
//   absl::Status s = engram::WriteHashFiles("/tmp/model", config_text, vocab);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace engram {

// engram_vocab_size of a hashable synthetic checkpoint unless told otherwise: each layer's 24
// head primes are searched from here, so its table has about 24 x this many rows (~16k, ~20k).
inline constexpr uint64_t kDefaultHashPrimeStart = 600;
// The largest engram_vocab_size engram-synth accepts: DeepSeek-V4.1's own (203 GB of tables).
inline constexpr uint64_t kMaxHashPrimeStart = 16000000;
// Words of the synthetic tokenizer; each is three tokenizer ids (see MakeSyntheticVocab).
inline constexpr uint32_t kSyntheticWords = 1000;

// Hash parameters every synthetic checkpoint's config.json carries (DeepSeek-V4.1's).
inline constexpr uint32_t kSyntheticMaxNgram = 4;
inline constexpr uint32_t kSyntheticHeadsPerOrder = 8;

// A tokenizer vocabulary and its compressed vocabulary.
struct SyntheticVocab {
  std::vector<std::string> tokens;  // tokenizer id -> token, in GPT-2 byte-level characters
  std::vector<uint32_t> lookup;     // tokenizer id -> compressed id
  uint32_t compressed_size = 0;
  int64_t pad_token_id = 0;           // engram_pad_token_id
  std::vector<std::string> specials;  // the added (special) tokens, ids 0, 1, 2
};

// Three special tokens (ids 0-2: begin, end, pad), then for each word w<i> the tokens "w<i>",
// " w<i>" (byte-level "Ġw<i>") and "W<i>": case and a leading space are what the compressed
// vocabulary folds, so the three share one compressed id (3 + i), the specials keep 0-2.
SyntheticVocab MakeSyntheticVocab(uint32_t words);

// Rows of each of `num_layers` tables whose head primes are searched from `prime_start`
// (engram_vocab_size for every order): the sum of each layer's primes, as the hasher derives
// them (docs/hashing.md, "Primes").
std::vector<uint64_t> HashableRows(size_t num_layers, uint64_t prime_start);

// Writes tokenizer.json and tokenizer_config.json for `vocab` into `dir`, then engram-hash.bin
// derived from `config_text` (config.json as written there, whose engram_* keys describe
// `vocab`): the multipliers and primes of DeriveLayerTables, the fingerprints of both files.
// InvalidArgument when the config's keys do not match the vocabulary or its primes.
absl::Status WriteHashFiles(const std::string& dir, const std::string& config_text,
                            const SyntheticVocab& vocab);

}  // namespace engram
