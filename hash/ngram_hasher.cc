// The hash loop: per position, XOR-mix the products of the last n compressed ids with the
// layer's multipliers (wrapping 64-bit), then reduce each order's mix modulo its heads' primes.
#include "hash/ngram_hasher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace engram {

absl::StatusOr<NgramHasher> NgramHasher::Open(const std::string& model_dir,
                                              const HasherOptions& options) {
  auto config = LoadHashConfig(model_dir);
  if (!config.ok()) return config.status();
  const std::string path =
      options.derived_path.empty() ? DefaultDerivedPath(model_dir) : options.derived_path;
  auto derived = LoadDerivedTables(path, model_dir, *config);
  if (derived.ok()) {
    if (options.compressed_pad_id &&
        *options.compressed_pad_id != derived->vocab.compressed_pad_id) {
      return absl::InvalidArgumentError(
          absl::StrFormat("compressed pad id %d was given, but '%s' maps pad token %d to %d",
                          *options.compressed_pad_id, path, config->pad_token_id,
                          derived->vocab.compressed_pad_id));
    }
    const uint32_t pad = derived->vocab.compressed_pad_id;
    return Create(*config, std::move(derived->layers), std::move(derived->vocab), pad);
  }
  if (!absl::IsNotFound(derived.status()) || !options.compressed_only) {
    if (absl::IsNotFound(derived.status())) {
      return absl::NotFoundError(
          absl::StrCat(derived.status().message(),
                       ": derive the compressed vocabulary with tools/engram_vocab.py --model ",
                       model_dir, " --out ", path, ", or hash compressed ids only"));
    }
    return derived.status();
  }
  if (!options.compressed_pad_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no derived hash tables at '", path,
        "': hashing compressed ids without them needs the compressed pad id (the compressed id "
        "of engram_pad_token_id ",
        config->pad_token_id, ")"));
  }
  auto layers = DeriveLayerTables(*config);
  if (!layers.ok()) return layers.status();
  return Create(*config, *std::move(layers), std::nullopt, *options.compressed_pad_id);
}

absl::StatusOr<NgramHasher> NgramHasher::Create(const HashConfig& config,
                                                std::vector<LayerTables> layers,
                                                std::optional<CompressedVocab> vocab,
                                                uint32_t compressed_pad_id) {
  if (config.max_ngram_size < 2 || config.max_ngram_size > kMaxNgramSize) {
    return absl::InvalidArgumentError(absl::StrFormat("max_ngram_size %d is outside [2, %d]",
                                                      config.max_ngram_size, kMaxNgramSize));
  }
  if (layers.size() != config.layer_ids.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("%d layer tables for %d Engram layers",
                                                      layers.size(), config.layer_ids.size()));
  }
  if (compressed_pad_id >= config.compressed_vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("compressed pad id %d is not below the compressed vocabulary size %d",
                        compressed_pad_id, config.compressed_vocab_size));
  }
  NgramHasher h;
  h.config_ = config;
  h.compressed_pad_id_ = compressed_pad_id;
  for (LayerTables& t : layers) {
    if (t.multipliers.size() != config.max_ngram_size ||
        t.primes.size() != config.heads_per_layer() ||
        t.head_offsets.size() != config.heads_per_layer() + 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Engram layer %d: tables do not match the config's geometry", t.layer_id));
    }
    Layer layer;
    for (uint64_t p : t.primes) {
      if (p < 2) {
        return absl::InvalidArgumentError(
            absl::StrFormat("Engram layer %d: head modulus %d", t.layer_id, p));
      }
      layer.mods.emplace_back(p);
    }
    layer.tables = std::move(t);
    h.layers_.push_back(std::move(layer));
  }
  if (vocab) {
    for (size_t i = 0; i < vocab->lookup.size(); ++i) {
      if (vocab->lookup[i] >= config.compressed_vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrFormat("tokenizer id %d maps to %d, beyond the compressed vocabulary (%d)", i,
                            vocab->lookup[i], config.compressed_vocab_size));
      }
    }
    if (vocab->lookup.size() > static_cast<size_t>(INT32_MAX)) {
      return absl::InvalidArgumentError("tokenizer vocabulary larger than int32 ids");
    }
    h.lookup_ = std::move(vocab->lookup);
  }
  return h;
}

absl::StatusOr<uint32_t> NgramHasher::LayerIndex(uint32_t layer_id) const {
  for (uint32_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i].tables.layer_id == layer_id) return i;
  }
  std::vector<uint32_t> ids = config_.layer_ids;
  return absl::NotFoundError(
      absl::StrCat("layer ", layer_id,
                   " is not an Engram layer (engram_layer_ids: ", absl::StrJoin(ids, ", "), ")"));
}

absl::StatusOr<HeadRange> NgramHasher::RankHeads(uint32_t tp_size, uint32_t tp_rank) const {
  const uint32_t heads = heads_per_layer();
  if (tp_size == 0 || heads % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor-parallel size %d does not divide the %d heads of a layer", tp_size, heads));
  }
  if (tp_rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor-parallel rank %d is not below the size %d", tp_rank, tp_size));
  }
  const uint32_t per_rank = heads / tp_size;
  return HeadRange{tp_rank * per_rank, (tp_rank + 1) * per_rank};
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> NgramHasher::HeadRows(uint32_t layer_index,
                                                                    HeadRange heads) const {
  if (layer_index >= layers_.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layer index %d of %d", layer_index, layers_.size()));
  }
  if (heads.begin >= heads.end || heads.end > heads_per_layer()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("head range [%d, %d) is empty or beyond the %d heads", heads.begin,
                        heads.end, heads_per_layer()));
  }
  const auto& off = layers_[layer_index].tables.head_offsets;
  return std::make_pair(off[heads.begin], off[heads.end]);
}

absl::Status NgramHasher::CheckIds(std::span<const int32_t> ids, TokenSpace space, size_t sequence,
                                   const char* what) const {
  const uint64_t limit =
      space == TokenSpace::kTokenizer ? lookup_.size() : config_.compressed_vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (static_cast<uint64_t>(static_cast<uint32_t>(ids[i])) >= limit || ids[i] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sequence %d, %s at position %d: %s id %d is outside [0, %d)", sequence, what, i,
          space == TokenSpace::kTokenizer ? "tokenizer" : "compressed", ids[i], limit));
    }
  }
  return absl::OkStatus();
}

namespace {

// The heads of one order that a call asks for: [begin, end) of the layer's heads.
struct OrderHeads {
  uint32_t order;  // n - 2
  uint32_t begin;
  uint32_t end;
};

// Hashes one sequence. Per token the N - 1 mixes are computed once; each order's requested
// heads then reduce that order's mix, folded to non-negative (~mix when negative, floor
// modulo restored at the end). N = max_ngram_size is a template parameter so that the window
// shift and the mixes unroll and stay in registers.
template <int N>
void HashSequenceRun(std::span<const int32_t> tokens, const uint32_t* lookup,
                     const uint64_t* window_init, const uint64_t* mult,
                     std::span<const OrderHeads> orders, const FastMod* mods,
                     const uint64_t* offsets, uint32_t first_head, uint32_t n_heads_out,
                     uint64_t* out) {
  uint64_t window[N];  // window[k]: compressed id at lag k
  for (int k = 1; k < N; ++k) window[k] = window_init[k];
  for (size_t t = 0; t < tokens.size(); ++t) {
    const uint32_t raw = static_cast<uint32_t>(tokens[t]);
    window[0] = lookup ? lookup[raw] : raw;
    uint64_t mix[N - 1];  // products and XOR wrap like NumPy's int64
    uint64_t acc = window[0] * mult[0];
    for (int k = 1; k < N; ++k) {
      acc ^= window[k] * mult[k];
      mix[k - 1] = acc;
    }
    uint64_t* row = out + t * n_heads_out - first_head;
    for (const OrderHeads& oh : orders) {
      const uint64_t negative = static_cast<uint64_t>(static_cast<int64_t>(mix[oh.order]) >> 63);
      const uint64_t folded = mix[oh.order] ^ negative;  // < 2^63
      for (uint32_t h = oh.begin; h < oh.end; ++h) {
        const uint64_t r = mods[h].ModBelow2To63(folded);
        // With M the sign mask: r when M = 0, else (p - 1) + ~r + 1 = p - 1 - r.
        row[h] = offsets[h] + (negative & (mods[h].divisor() - 1)) + (r ^ negative) - negative;
      }
    }
    for (int k = N - 1; k > 0; --k) window[k] = window[k - 1];
  }
}

using RunFn = void (*)(std::span<const int32_t>, const uint32_t*, const uint64_t*, const uint64_t*,
                       std::span<const OrderHeads>, const FastMod*, const uint64_t*, uint32_t,
                       uint32_t, uint64_t*);

RunFn RunFor(uint32_t n) {
  switch (n) {
    case 2:
      return &HashSequenceRun<2>;
    case 3:
      return &HashSequenceRun<3>;
    case 4:
      return &HashSequenceRun<4>;
    case 5:
      return &HashSequenceRun<5>;
    case 6:
      return &HashSequenceRun<6>;
    case 7:
      return &HashSequenceRun<7>;
    default:
      return &HashSequenceRun<8>;
  }
}

}  // namespace

absl::Status NgramHasher::Hash(uint32_t layer_index, std::span<const HashSequence> sequences,
                               TokenSpace space, HeadRange heads, std::span<uint64_t> out) const {
  if (layer_index >= layers_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layer index %d, but the model has %d Engram layers", layer_index, layers_.size()));
  }
  if (heads.begin >= heads.end || heads.end > heads_per_layer()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("head range [%d, %d) is empty or beyond the %d heads of a layer",
                        heads.begin, heads.end, heads_per_layer()));
  }
  if (space == TokenSpace::kTokenizer && lookup_.empty()) {
    return absl::FailedPreconditionError(
        "tokenizer ids given, but no compressed vocabulary is loaded (derive it with "
        "tools/engram_vocab.py, or pass compressed ids)");
  }
  uint64_t total = 0;
  for (size_t s = 0; s < sequences.size(); ++s) {
    if (absl::Status st = CheckIds(sequences[s].tokens, space, s, "token"); !st.ok()) return st;
    if (absl::Status st = CheckIds(sequences[s].history, space, s, "history entry"); !st.ok()) {
      return st;
    }
    total += sequences[s].tokens.size();
  }
  if (total * heads.size() > out.size()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%d tokens x %d heads need %d row ids, the output holds %d", total,
                        heads.size(), total * heads.size(), out.size()));
  }

  const Layer& layer = layers_[layer_index];
  const uint32_t n = config_.max_ngram_size;
  const uint32_t* lookup = space == TokenSpace::kTokenizer ? lookup_.data() : nullptr;
  uint64_t mult[kMaxNgramSize];
  for (uint32_t k = 0; k < n; ++k) mult[k] = static_cast<uint64_t>(layer.tables.multipliers[k]);
  const RunFn run = RunFor(n);
  OrderHeads orders[kMaxNgramSize];
  size_t n_orders = 0;
  for (uint32_t o = 0; o + 1 < n; ++o) {
    const uint32_t b = std::max(heads.begin, o * config_.n_heads);
    const uint32_t e = std::min(heads.end, (o + 1) * config_.n_heads);
    if (b < e) orders[n_orders++] = {o, b, e};
  }
  uint64_t* dst = out.data();
  for (const HashSequence& seq : sequences) {
    // window_init[k] = compressed id at lag k of tokens[0]; the pad id before the start.
    uint64_t window_init[kMaxNgramSize];
    for (uint32_t k = 1; k < n; ++k) {
      if (k <= seq.history.size()) {
        const uint32_t id = static_cast<uint32_t>(seq.history[seq.history.size() - k]);
        window_init[k] = lookup ? lookup[id] : id;
      } else {
        window_init[k] = compressed_pad_id_;
      }
    }
    run(seq.tokens, lookup, window_init, mult, {orders, n_orders}, layer.mods.data(),
        layer.tables.head_offsets.data(), heads.begin, heads.size(), dst);
    dst += seq.tokens.size() * heads.size();
  }
  return absl::OkStatus();
}

absl::Status NgramHasher::Compress(std::span<const int32_t> tokens, std::span<int32_t> out) const {
  if (lookup_.empty()) {
    return absl::FailedPreconditionError("no compressed vocabulary is loaded");
  }
  if (out.size() < tokens.size()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%d tokens, the output holds %d", tokens.size(), out.size()));
  }
  if (absl::Status st = CheckIds(tokens, TokenSpace::kTokenizer, 0, "token"); !st.ok()) return st;
  for (size_t i = 0; i < tokens.size(); ++i) {
    out[i] = static_cast<int32_t>(lookup_[static_cast<uint32_t>(tokens[i])]);
  }
  return absl::OkStatus();
}

}  // namespace engram
