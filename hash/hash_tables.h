// The parameters of the DeepSeek-V4.1 Engram hash: what config.json says (HashConfig), what is
// derived from it (per-layer multipliers, head primes and offsets), and the compressed
// vocabulary, cached together in a versioned derived-tables file (docs/hashing.md).
//
//   auto config = engram::LoadHashConfig("/models/DeepSeek-V4.1-Flash");
//   auto layers = engram::DeriveLayerTables(*config);   // primes checked against config
//   auto derived = engram::LoadDerivedTables(dir + "/engram-hash.bin", dir, *config);
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace engram {

// Limits on what a config may ask for; beyond them the config is refused, not truncated.
inline constexpr uint32_t kMaxEngramLayers = 64;
inline constexpr uint32_t kMaxNgramSize = 8;
inline constexpr uint32_t kMaxHeadsPerOrder = 64;
inline constexpr uint64_t kMaxCompressedVocab = 1ULL << 30;
inline constexpr uint64_t kMaxPrimeSearchStart = 1ULL << 40;

// The engram_* keys of config.json (top level or under text_config).
struct HashConfig {
  std::vector<uint32_t> layer_ids;           // engram_layer_ids
  std::vector<uint64_t> num_embeddings;      // engram_num_embeddings, rows per layer
  uint32_t max_ngram_size = 0;               // engram_max_ngram_size: orders 2..max
  uint32_t n_heads = 0;                      // engram_n_heads, hash heads per order
  std::vector<uint64_t> prime_search_start;  // engram_vocab_size, one per order
  int64_t pad_token_id = 0;                  // engram_pad_token_id, a tokenizer id
  uint64_t compressed_vocab_size = 0;        // engram_compressed_vocab_size
  uint64_t seed = 0;                         // engram_seed when present, else 0

  uint32_t orders() const { return max_ngram_size - 1; }
  uint32_t heads_per_layer() const { return orders() * n_heads; }
};

// Parses the engram_* keys out of config.json text; `origin` names the file in errors.
absl::StatusOr<HashConfig> ParseHashConfig(absl::string_view json_text, absl::string_view origin);
// Reads and parses <model_dir>/config.json.
absl::StatusOr<HashConfig> LoadHashConfig(const std::string& model_dir);

// Everything the hash needs for one Engram layer.
struct LayerTables {
  uint32_t layer_id = 0;
  std::vector<int64_t> multipliers;    // max_ngram_size odd multipliers, [k] for lag k
  std::vector<uint64_t> primes;        // heads_per_layer primes, order-major
  std::vector<uint64_t> head_offsets;  // heads_per_layer + 1 prefix sums; back() = num_rows
  uint64_t num_rows() const { return head_offsets.back(); }
};

// The odd multipliers of one layer: numpy.random.default_rng(seed + 10007 * layer_id)
// .integers(0, half_bound, max_ngram_size) * 2 + 1, half_bound from the compressed vocab size.
absl::StatusOr<std::vector<int64_t>> DeriveMultipliers(const HashConfig& config, uint32_t layer_id);

// Multipliers, primes and offsets of every layer; InvalidArgument when a layer's primes do
// not sum to its engram_num_embeddings (a config this hash does not describe).
absl::StatusOr<std::vector<LayerTables>> DeriveLayerTables(const HashConfig& config);

// Tokenizer id -> compressed id, as tools/engram_vocab.py derived it from tokenizer.json.
struct CompressedVocab {
  std::vector<uint32_t> lookup;  // one entry per tokenizer id
  uint32_t compressed_pad_id = 0;
};

// What a derived-tables file holds once it has been checked against the model directory.
struct DerivedTables {
  std::vector<LayerTables> layers;
  CompressedVocab vocab;
};

// Loads and validates a derived-tables file: magic, version, size, checksums, the fingerprint
// of <model_dir>/config.json (and tokenizer.json when the directory has one), every parameter
// against `config`, the stored primes and multipliers against DeriveLayerTables(), and the
// lookup table (ids in range, numbered in order of first appearance, pad mapped). NotFound
// when the file does not exist; FailedPrecondition when it is stale; DataLoss when corrupt.
absl::StatusOr<DerivedTables> LoadDerivedTables(const std::string& path,
                                                const std::string& model_dir,
                                                const HashConfig& config);

// The default place of the derived-tables file: <model_dir>/engram-hash.bin.
std::string DefaultDerivedPath(const std::string& model_dir);

// CRC-32 (the zlib polynomial, as Python's zlib.crc32) used by the derived-tables file.
uint32_t Crc32(std::span<const uint8_t> data, uint32_t crc = 0);

// On-disk header of the derived-tables file (little-endian; docs/hashing.md). Followed by, per
// layer, a DerivedLayerRecord, max_ngram_size int64 multipliers and heads_per_layer uint64
// primes; then vocab_size uint32 compressed ids.
inline constexpr char kDerivedMagic[8] = {'E', 'N', 'G', 'R', 'H', 'A', 'S', 'H'};
inline constexpr uint32_t kDerivedVersion = 1;

struct DerivedHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t file_bytes;
  uint32_t body_crc32;    // CRC-32 of bytes [header_bytes, file_bytes)
  uint32_t header_crc32;  // CRC-32 of the header with this field zero
  uint64_t config_bytes;  // fingerprint of config.json: size and CRC-32
  uint32_t config_crc32;
  uint32_t tokenizer_crc32;  // fingerprint of tokenizer.json
  uint64_t tokenizer_bytes;
  uint32_t vocab_size;  // tokenizer ids covered by the lookup table
  uint32_t compressed_vocab_size;
  uint64_t seed;
  int64_t pad_token_id;
  uint32_t compressed_pad_id;
  uint32_t max_ngram_size;
  uint32_t n_heads;
  uint32_t num_layers;
  uint8_t reserved[32];
};
static_assert(sizeof(DerivedHeader) == 128);
static_assert(offsetof(DerivedHeader, file_bytes) == 16);
static_assert(offsetof(DerivedHeader, config_bytes) == 32);
static_assert(offsetof(DerivedHeader, vocab_size) == 56);
static_assert(offsetof(DerivedHeader, seed) == 64);
static_assert(offsetof(DerivedHeader, compressed_pad_id) == 80);
static_assert(offsetof(DerivedHeader, reserved) == 96);

struct DerivedLayerRecord {
  uint32_t layer_id;
  uint32_t reserved;
  uint64_t num_rows;
};
static_assert(sizeof(DerivedLayerRecord) == 16);

}  // namespace engram
