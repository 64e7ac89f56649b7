// NgramHasher: DeepSeek-V4.1 Engram row ids from token ids, on the host, bit-exact with the
// reference (docs/hashing.md). Immutable once created: every method is const and thread-safe.
//
//   auto hasher = engram::NgramHasher::Open("/models/DeepSeek-V4.1-Flash", {});
//   engram::HashSequence seq{.tokens = new_ids, .history = last_three_ids};
//   std::vector<uint64_t> rows(new_ids.size() * hasher->heads_per_layer());
//   absl::Status s = hasher->Hash(hasher->LayerIndex(14).value(), {&seq, 1},
//                                 engram::TokenSpace::kTokenizer, hasher->AllHeads(), rows);
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hash/fast_mod.h"
#include "hash/hash_tables.h"

namespace engram {

// Which ids a call passes: tokenizer ids (mapped through the compressed vocabulary here) or
// ids already compressed.
enum class TokenSpace { kTokenizer, kCompressed };

// The new tokens of one sequence and the ids that precede them. `history` holds the ids right
// before tokens[0], oldest first, in the same TokenSpace; only its last max_ngram_size - 1
// entries matter. Fewer than that means the sequence starts there: missing ids are the pad id.
// Hashing a sequence in chunks, each with the previous chunk's tail as history, gives exactly
// the rows of hashing it whole.
struct HashSequence {
  std::span<const int32_t> tokens;
  std::span<const int32_t> history;
};

// Half-open range of heads of a layer, [begin, end); heads are order-major (order 2's heads
// first). Head h of a layer owns rows [HeadRows(h).begin, .end).
struct HeadRange {
  uint32_t begin = 0;
  uint32_t end = 0;
  uint32_t size() const { return end - begin; }
};

struct HasherOptions {
  // Derived-tables file; empty: DefaultDerivedPath(model_dir).
  std::string derived_path;
  // Accept a model directory without a derived-tables file; only compressed ids can then be
  // hashed, and compressed_pad_id must say what the pad id compresses to.
  bool compressed_only = false;
  std::optional<uint32_t> compressed_pad_id;
};

class NgramHasher {
 public:
  // Reads <model_dir>/config.json and the derived-tables file (see HasherOptions), validating
  // one against the other.
  static absl::StatusOr<NgramHasher> Open(const std::string& model_dir,
                                          const HasherOptions& options);
  // From parts already loaded; `vocab` empty means compressed ids only.
  static absl::StatusOr<NgramHasher> Create(const HashConfig& config,
                                            std::vector<LayerTables> layers,
                                            std::optional<CompressedVocab> vocab,
                                            uint32_t compressed_pad_id);

  const HashConfig& config() const { return config_; }
  uint32_t num_layers() const { return static_cast<uint32_t>(layers_.size()); }
  uint32_t heads_per_layer() const { return config_.heads_per_layer(); }
  HeadRange AllHeads() const { return {0, heads_per_layer()}; }
  const LayerTables& layer(uint32_t index) const { return layers_[index].tables; }
  bool has_vocab() const { return !lookup_.empty(); }
  uint32_t vocab_size() const { return static_cast<uint32_t>(lookup_.size()); }
  uint32_t compressed_pad_id() const { return compressed_pad_id_; }

  // Index of the model layer `layer_id` (e.g. 14) among the Engram layers; NotFound otherwise.
  absl::StatusOr<uint32_t> LayerIndex(uint32_t layer_id) const;
  // The heads a tensor-parallel rank owns: heads split evenly into tp_size contiguous ranges.
  absl::StatusOr<HeadRange> RankHeads(uint32_t tp_size, uint32_t tp_rank) const;
  // Rows [begin, end) of heads `heads` of layer `layer_index`: one contiguous row range.
  absl::StatusOr<std::pair<uint64_t, uint64_t>> HeadRows(uint32_t layer_index,
                                                         HeadRange heads) const;

  // Row ids of every token of `sequences`, in order, for heads `heads` of layer `layer_index`:
  // out[(t * heads.size()) + (h - heads.begin)] for the t-th token overall. `out` must hold
  // total_tokens * heads.size() entries. Ids are validated first: on error `out` is untouched
  // and the status names the sequence, position and id.
  absl::Status Hash(uint32_t layer_index, std::span<const HashSequence> sequences, TokenSpace space,
                    HeadRange heads, std::span<uint64_t> out) const;

  // Maps tokenizer ids to compressed ids (FailedPrecondition without a vocabulary).
  absl::Status Compress(std::span<const int32_t> tokens, std::span<int32_t> out) const;

 private:
  struct Layer {
    LayerTables tables;
    std::vector<FastMod> mods;  // one per head
  };

  NgramHasher() = default;
  absl::Status CheckIds(std::span<const int32_t> ids, TokenSpace space, size_t sequence,
                        const char* what) const;

  HashConfig config_;
  std::vector<Layer> layers_;
  std::vector<uint32_t> lookup_;
  uint32_t compressed_pad_id_ = 0;
};

}  // namespace engram
