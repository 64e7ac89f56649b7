// Reading config.json's engram_* keys, deriving multipliers and primes, and loading the
// derived-tables file that carries the compressed vocabulary.
#include "hash/hash_tables.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "hash/numpy_random.h"
#include "hash/primes.h"
#include "nlohmann/json.hpp"

namespace engram {
namespace {

using nlohmann::json;

// Reads a whole (small) file; NotFound when it does not exist.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
    return absl::UnavailableError(absl::StrCat("cannot open '", path, "': ", std::strerror(err)));
  }
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading '", path, "'"));
  return data;
}

absl::StatusOr<uint64_t> GetUint(const json& obj, const char* key, absl::string_view origin,
                                 uint64_t min, uint64_t max) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": missing key '", key, "'"));
  }
  if (!it->is_number_integer() ||
      (it->is_number_integer() && !it->is_number_unsigned() && it->get<int64_t>() < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": '", key, "' must be a non-negative integer, not ", it->dump()));
  }
  const uint64_t v = it->get<uint64_t>();
  if (v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: '%s' = %d is outside [%d, %d]", origin, key, v, min, max));
  }
  return v;
}

// An integer or a list of integers; `count` entries expected (a scalar is repeated).
absl::StatusOr<std::vector<uint64_t>> GetUintList(const json& obj, const char* key,
                                                  absl::string_view origin, size_t count,
                                                  bool allow_scalar, uint64_t min, uint64_t max) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": missing key '", key, "'"));
  }
  std::vector<uint64_t> out;
  if (it->is_array()) {
    if (it->size() != count) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: '%s' has %d entries, expected %d", origin, key, it->size(), count));
    }
    for (const json& v : *it) {
      json wrapper = {{key, v}};
      auto value = GetUint(wrapper, key, origin, min, max);
      if (!value.ok()) return value.status();
      out.push_back(*value);
    }
  } else {
    if (!allow_scalar && count != 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: '%s' must be a list of %d integers", origin, key, count));
    }
    auto value = GetUint(obj, key, origin, min, max);
    if (!value.ok()) return value.status();
    out.assign(count, *value);
  }
  return out;
}

}  // namespace

absl::StatusOr<HashConfig> ParseHashConfig(absl::string_view json_text, absl::string_view origin) {
  json doc = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not a JSON object"));
  }
  // Multimodal configs nest the language model's keys under text_config.
  const json* section = &doc;
  if (auto tc = doc.find("text_config");
      tc != doc.end() && tc->is_object() && tc->contains("engram_layer_ids")) {
    section = &*tc;
  }
  const json& c = *section;
  if (!c.contains("engram_layer_ids")) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ": no 'engram_layer_ids' (top level or text_config): not an Engram model"));
  }
  HashConfig config;
  const json& ids = c["engram_layer_ids"];
  if (!ids.is_array() || ids.empty() || ids.size() > kMaxEngramLayers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: 'engram_layer_ids' must be a list of 1 to %d layer ids", origin, kMaxEngramLayers));
  }
  for (const json& v : ids) {
    json wrapper = {{"engram_layer_ids", v}};
    auto id = GetUint(wrapper, "engram_layer_ids", origin, 0, 1u << 20);
    if (!id.ok()) return id.status();
    for (uint32_t seen : config.layer_ids) {
      if (seen == *id) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: layer %d appears twice in 'engram_layer_ids'", origin, *id));
      }
    }
    config.layer_ids.push_back(static_cast<uint32_t>(*id));
  }
  const size_t layers = config.layer_ids.size();

  auto max_ngram = GetUint(c, "engram_max_ngram_size", origin, 2, kMaxNgramSize);
  if (!max_ngram.ok()) return max_ngram.status();
  config.max_ngram_size = static_cast<uint32_t>(*max_ngram);
  auto n_heads = GetUint(c, "engram_n_heads", origin, 1, kMaxHeadsPerOrder);
  if (!n_heads.ok()) return n_heads.status();
  config.n_heads = static_cast<uint32_t>(*n_heads);
  auto rows = GetUintList(c, "engram_num_embeddings", origin, layers, /*allow_scalar=*/false, 1,
                          std::numeric_limits<int64_t>::max());
  if (!rows.ok()) return rows.status();
  config.num_embeddings = *rows;
  auto starts = GetUintList(c, "engram_vocab_size", origin, config.orders(),
                            /*allow_scalar=*/true, 2, kMaxPrimeSearchStart);
  if (!starts.ok()) return starts.status();
  config.prime_search_start = *starts;
  auto pad = GetUint(c, "engram_pad_token_id", origin, 0, std::numeric_limits<int32_t>::max());
  if (!pad.ok()) return pad.status();
  config.pad_token_id = static_cast<int64_t>(*pad);
  auto compressed = GetUint(c, "engram_compressed_vocab_size", origin, 1, kMaxCompressedVocab - 1);
  if (!compressed.ok()) return compressed.status();
  config.compressed_vocab_size = *compressed;
  if (c.contains("engram_seed")) {
    auto seed = GetUint(c, "engram_seed", origin, 0, 1ULL << 62);
    if (!seed.ok()) return seed.status();
    config.seed = *seed;
  }
  return config;
}

absl::StatusOr<HashConfig> LoadHashConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseHashConfig(*text, path);
}

absl::StatusOr<std::vector<int64_t>> DeriveMultipliers(const HashConfig& config,
                                                       uint32_t layer_id) {
  const int64_t vocab = static_cast<int64_t>(config.compressed_vocab_size);
  const int64_t half_bound =
      std::max<int64_t>(1, (std::numeric_limits<int64_t>::max() / vocab) / 2);
  NumpyGenerator rng(config.seed + 10007ULL * layer_id);
  auto draws = rng.IntegersInt64(0, half_bound, config.max_ngram_size);
  if (!draws.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("multipliers of Engram layer ", layer_id, ": ", draws.status().message()));
  }
  for (int64_t& r : *draws) r = r * 2 + 1;
  return draws;
}

absl::StatusOr<std::vector<LayerTables>> DeriveLayerTables(const HashConfig& config) {
  const uint32_t heads = config.heads_per_layer();
  const std::vector<uint64_t> primes = FindHeadPrimes(
      static_cast<uint32_t>(config.layer_ids.size()), config.prime_search_start, config.n_heads);
  std::vector<LayerTables> layers;
  for (size_t i = 0; i < config.layer_ids.size(); ++i) {
    LayerTables t;
    t.layer_id = config.layer_ids[i];
    auto mult = DeriveMultipliers(config, t.layer_id);
    if (!mult.ok()) return mult.status();
    t.multipliers = *std::move(mult);
    t.primes.assign(primes.begin() + i * heads, primes.begin() + (i + 1) * heads);
    t.head_offsets.assign(1, 0);
    for (uint64_t p : t.primes) t.head_offsets.push_back(t.head_offsets.back() + p);
    if (t.num_rows() != config.num_embeddings[i]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("Engram layer %d: the %d head primes (%d ... %d) sum to %d rows but "
                          "engram_num_embeddings says %d: config.json does not describe this hash",
                          t.layer_id, heads, t.primes.front(), t.primes.back(), t.num_rows(),
                          config.num_embeddings[i]));
    }
    layers.push_back(std::move(t));
  }
  return layers;
}

std::string DefaultDerivedPath(const std::string& model_dir) {
  return model_dir + "/engram-hash.bin";
}

uint32_t Crc32(std::span<const uint8_t> data, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (uint8_t b : data) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Reads a little-endian value at `offset`; the caller has checked the bounds.
template <typename T>
T LoadAt(const std::string& data, size_t offset) {
  T v;
  std::memcpy(&v, data.data() + offset, sizeof(T));
  return v;
}

// A derived-tables file being loaded: its bytes, and the two kinds of error it can give.
struct DerivedFile {
  const std::string& path;
  const std::string& model_dir;
  std::string data;

  // The file is damaged.
  absl::Status Corrupt(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("derived hash tables '", path, "': ", what));
  }
  // The file is sound but was derived from other model files: derive it again.
  absl::Status Stale(absl::string_view what) const {
    return absl::FailedPreconditionError(absl::StrCat(
        "derived hash tables '", path, "' do not match ", model_dir, ": ", what,
        "; re-derive them with tools/engram_vocab.py --model ", model_dir, " --out ", path));
  }
};

// The header: magic, version, sizes and both checksums.
absl::StatusOr<DerivedHeader> CheckDerivedHeader(const DerivedFile& f) {
  if (f.data.size() < sizeof(DerivedHeader)) return f.Corrupt("shorter than its header");
  DerivedHeader h = LoadAt<DerivedHeader>(f.data, 0);
  if (std::memcmp(h.magic, kDerivedMagic, sizeof(h.magic)) != 0) {
    return f.Corrupt("bad magic: not an engram derived-tables file");
  }
  if (h.version != kDerivedVersion) {
    return f.Stale(absl::StrFormat("file version %d, this build reads version %d", h.version,
                                   kDerivedVersion));
  }
  if (h.header_bytes != sizeof(DerivedHeader)) {
    return f.Corrupt(
        absl::StrFormat("header_bytes %d, expected %d", h.header_bytes, sizeof(DerivedHeader)));
  }
  if (h.file_bytes != f.data.size()) {
    return f.Corrupt(absl::StrFormat("header says %d bytes, file has %d (truncated?)", h.file_bytes,
                                     f.data.size()));
  }
  DerivedHeader zeroed = h;
  zeroed.header_crc32 = 0;
  const uint32_t crc = Crc32({reinterpret_cast<const uint8_t*>(&zeroed), sizeof(zeroed)});
  if (crc != h.header_crc32) return f.Corrupt("header checksum mismatch");
  const uint32_t body = Crc32(Bytes(f.data).subspan(sizeof(DerivedHeader)));
  if (body != h.body_crc32) return f.Corrupt("body checksum mismatch");
  return h;
}

// The file must have been derived from these very files, with this config's hash parameters.
absl::Status CheckFingerprints(const DerivedFile& f, const DerivedHeader& h,
                               const HashConfig& config) {
  auto config_text = ReadFile(f.model_dir + "/config.json");
  if (!config_text.ok()) return config_text.status();
  if (config_text->size() != h.config_bytes || Crc32(Bytes(*config_text)) != h.config_crc32) {
    return f.Stale("config.json changed since the tables were derived");
  }
  auto tokenizer_text = ReadFile(f.model_dir + "/tokenizer.json");
  if (tokenizer_text.ok()) {
    if (tokenizer_text->size() != h.tokenizer_bytes ||
        Crc32(Bytes(*tokenizer_text)) != h.tokenizer_crc32) {
      return f.Stale("tokenizer.json changed since the tables were derived");
    }
  } else if (!absl::IsNotFound(tokenizer_text.status())) {
    return tokenizer_text.status();
  }

  if (h.max_ngram_size != config.max_ngram_size || h.n_heads != config.n_heads ||
      h.num_layers != config.layer_ids.size() || h.seed != config.seed ||
      h.pad_token_id != config.pad_token_id ||
      h.compressed_vocab_size != config.compressed_vocab_size) {
    return f.Stale(absl::StrFormat(
        "file has max_ngram_size %d, n_heads %d, %d layers, seed %d, pad %d, compressed vocab "
        "%d; config.json has %d, %d, %d, %d, %d, %d",
        h.max_ngram_size, h.n_heads, h.num_layers, h.seed, h.pad_token_id, h.compressed_vocab_size,
        config.max_ngram_size, config.n_heads, config.layer_ids.size(), config.seed,
        config.pad_token_id, config.compressed_vocab_size));
  }
  return absl::OkStatus();
}

// Each layer's record must hold what the derivation gives; returns where the vocabulary lookup
// starts.
absl::StatusOr<size_t> CheckLayerRecords(const DerivedFile& f, const DerivedHeader& h,
                                         const HashConfig& config,
                                         const std::vector<LayerTables>& derived) {
  const uint32_t heads = config.heads_per_layer();
  const size_t layer_bytes =
      sizeof(DerivedLayerRecord) + 8ULL * config.max_ngram_size + 8ULL * heads;
  const size_t lookup_offset = sizeof(DerivedHeader) + layer_bytes * h.num_layers;
  if (lookup_offset + 4ULL * h.vocab_size != f.data.size()) {
    return f.Corrupt(absl::StrFormat("size %d does not fit %d layers and %d lookup entries",
                                     f.data.size(), h.num_layers, h.vocab_size));
  }
  size_t off = sizeof(DerivedHeader);
  for (const LayerTables& want : derived) {
    const auto rec = LoadAt<DerivedLayerRecord>(f.data, off);
    off += sizeof(rec);
    if (rec.layer_id != want.layer_id || rec.num_rows != want.num_rows()) {
      return f.Stale(
          absl::StrFormat("file has layer %d with %d rows where config has layer %d "
                          "with %d rows",
                          rec.layer_id, rec.num_rows, want.layer_id, want.num_rows()));
    }
    for (uint32_t k = 0; k < config.max_ngram_size; ++k, off += 8) {
      if (LoadAt<int64_t>(f.data, off) != want.multipliers[k]) {
        return f.Stale(absl::StrFormat("layer %d multiplier %d is %d, derivation gives %d",
                                       want.layer_id, k, LoadAt<int64_t>(f.data, off),
                                       want.multipliers[k]));
      }
    }
    for (uint32_t j = 0; j < heads; ++j, off += 8) {
      if (LoadAt<uint64_t>(f.data, off) != want.primes[j]) {
        return f.Stale(absl::StrFormat("layer %d head %d prime is %d, derivation gives %d",
                                       want.layer_id, j, LoadAt<uint64_t>(f.data, off),
                                       want.primes[j]));
      }
    }
  }
  return lookup_offset;
}

// The tokenizer id -> compressed id lookup at `lookup_offset`, checked.
absl::StatusOr<CompressedVocab> LoadVocab(const DerivedFile& f, const DerivedHeader& h,
                                          const HashConfig& config, size_t lookup_offset) {
  CompressedVocab vocab;
  vocab.lookup.resize(h.vocab_size);
  std::memcpy(vocab.lookup.data(), f.data.data() + lookup_offset, 4ULL * h.vocab_size);
  // Compressed ids are numbered in order of first appearance: each id is at most one more than
  // the largest before it, and the largest must reach compressed_vocab_size - 1.
  uint64_t next_new = 0;
  for (uint32_t i = 0; i < h.vocab_size; ++i) {
    const uint32_t id = vocab.lookup[i];
    if (id > next_new) {
      return f.Corrupt(
          absl::StrFormat("tokenizer id %d maps to compressed id %d before id %d "
                          "has appeared",
                          i, id, next_new));
    }
    if (id == next_new) ++next_new;
  }
  if (next_new != config.compressed_vocab_size) {
    return f.Stale(absl::StrFormat(
        "tokenizer.json compresses to %d ids but engram_compressed_vocab_size is %d", next_new,
        config.compressed_vocab_size));
  }
  if (config.pad_token_id >= h.vocab_size) {
    return f.Stale(absl::StrFormat("engram_pad_token_id %d is not a tokenizer id (vocab %d)",
                                   config.pad_token_id, h.vocab_size));
  }
  vocab.compressed_pad_id = vocab.lookup[config.pad_token_id];
  if (vocab.compressed_pad_id != h.compressed_pad_id) {
    return f.Corrupt(absl::StrFormat("compressed pad id %d, lookup table gives %d",
                                     h.compressed_pad_id, vocab.compressed_pad_id));
  }
  return vocab;
}

}  // namespace

absl::StatusOr<DerivedTables> LoadDerivedTables(const std::string& path,
                                                const std::string& model_dir,
                                                const HashConfig& config) {
  static_assert(std::endian::native == std::endian::little, "the file format is little-endian");
  auto data = ReadFile(path);
  if (!data.ok()) return data.status();
  const DerivedFile f{path, model_dir, *std::move(data)};
  absl::StatusOr<DerivedHeader> h = CheckDerivedHeader(f);
  if (!h.ok()) return h.status();
  if (absl::Status s = CheckFingerprints(f, *h, config); !s.ok()) return s;
  auto derived = DeriveLayerTables(config);
  if (!derived.ok()) return derived.status();
  absl::StatusOr<size_t> lookup_offset = CheckLayerRecords(f, *h, config, *derived);
  if (!lookup_offset.ok()) return lookup_offset.status();
  absl::StatusOr<CompressedVocab> vocab = LoadVocab(f, *h, config, *lookup_offset);
  if (!vocab.ok()) return vocab.status();
  DerivedTables out;
  out.layers = *std::move(derived);
  out.vocab = *std::move(vocab);
  return out;
}

}  // namespace engram
