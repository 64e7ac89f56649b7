// Synthetic DeepSeek-V4.1 Engram checkpoints: row contents that are a pure function of
// (seed, layer, row), and a writer for a checkpoint directory in the released format, so tests
// and benchmarks can compute the expected bytes of any row without reading a file.
//
//   engram::SynthOptions opts{.out_dir = "/tmp/model", .rows = 100000, .seed = 7};
//   absl::Status s = engram::WriteSyntheticCheckpoint(opts);
//   uint8_t row[engram::kRowBytes];
//   engram::SyntheticRow(7, /*layer=*/14, /*row=*/42, row);  // what row 42 of layer 14 holds
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tables/table.h"
#include "testkit/synthetic_vocab.h"

namespace engram {

// DeepSeek-V4.1-Flash's Engram layers and their row counts (config.json, text_config).
inline constexpr uint32_t kDsv41EngramLayers[2] = {1, 14};
inline constexpr uint64_t kDsv41EngramRows[2] = {384006168, 384016682};

// Rows per table engram-synth writes by default: two tables of ~13 MB, small enough for CI.
inline constexpr uint64_t kDefaultSyntheticRows = 50000;

// Fills ret_row (264 bytes) with row `row` of layer `layer` of the synthetic checkpoint with
// seed `seed`: 256 finite FP8 E4M3 values (never 0x7F / 0xFF, the NaN encodings) then 8 E8M0
// scales in [120, 134] (2^-7 .. 2^7, never 255 = NaN). Pure, thread-safe, ~90 ns of CPU per row.
void SyntheticRow(uint64_t seed, uint32_t layer, uint64_t row, uint8_t* ret_row);

// Fills ret_rows with rows [first, first + count) of a layer, row after row (count * 264 bytes).
void SyntheticRows(uint64_t seed, uint32_t layer, uint64_t first, uint64_t count,
                   uint8_t* ret_rows);

struct SynthOptions {
  // Directory to create (or fill, if it exists and is empty of checkpoint files).
  std::string out_dir;
  // Rows per Engram table; 0 means the real DeepSeek-V4.1 counts (203 GB in all).
  uint64_t rows = kDefaultSyntheticRows;
  uint64_t seed = 0;
  // Engram layers to write; their tables go into the last shards, one per layer, as in the
  // released checkpoint.
  std::vector<uint32_t> layers = {1, 14};
  // A checkpoint the n-gram hasher reads too (engramctl hash, engram.Hasher): each table gets
  // exactly the rows its head primes imply (HashableRows from `hash_prime_start`, written as
  // engram_vocab_size; `rows` is not used), and the directory gets a small tokenizer
  // (tokenizer.json, tokenizer_config.json) and its derived tables, engram-hash.bin
  // (testkit/synthetic_vocab.h).
  bool hashable = false;
  uint64_t hash_prime_start = kDefaultHashPrimeStart;
  // Called now and then with bytes of Engram data written so far and the total.
  std::function<void(uint64_t done_bytes, uint64_t total_bytes)> progress;
};

// Writes a DeepSeek-V4.1-format checkpoint directory: config.json (the real engram_* keys under
// text_config, engram_num_embeddings = options.rows per layer, or with options.hashable the
// hash parameters of the synthetic tokenizer and its primes' rows), model.safetensors.index.json,
// a first shard holding only decoy tensors, then one shard per Engram layer holding
// layers.<L>.engram.embed.weight (F8_E4M3 [N, 256]), layers.<L>.engram.embed.scale
// (F8_E8M0 [N, 8]) and a decoy tensor. The JSON headers are padded so that tensor data starts
// at an odd file offset, as unaligned as safetensors permits. Streams in bounded memory
// (a few MB) and syncs every file before returning. With options.hashable also writes
// tokenizer.json, tokenizer_config.json and engram-hash.bin.
absl::Status WriteSyntheticCheckpoint(const SynthOptions& options);

// Name of the shard file holding `layer`'s Engram tensors in a checkpoint written with
// `options` (relative to out_dir).
std::string SyntheticShardName(const SynthOptions& options, uint32_t layer);

}  // namespace engram
