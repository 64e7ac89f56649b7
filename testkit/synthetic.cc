// Synthetic DeepSeek-V4.1 checkpoints: the row generator and the streaming checkpoint writer.
#include "testkit/synthetic.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_io.h"
#include "nlohmann/json.hpp"

namespace engram {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// splitmix64's finaliser: a bijective, well-mixed function of its input.
inline uint64_t Mix64(uint64_t z) {
  z += kGolden;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t LayerKey(uint64_t seed, uint32_t layer) {
  return Mix64(Mix64(seed) ^ (uint64_t{layer} * 0xd1b54a32d192ed03ull));
}

inline void FillRow(uint64_t layer_key, uint64_t row, uint8_t* values, uint8_t* scales) {
  const uint64_t base = Mix64(layer_key ^ Mix64(row));
  for (uint32_t i = 0; i < kValueBytes / 8; ++i) {
    // wyrand-style step: one 64x64->128 multiply per word, independent across words, so the
    // loop pipelines; the per-row state comes from the full splitmix64 mix above.
    const uint64_t s = base + (i + 1) * 0xa0761d6478bd642full;
    const unsigned __int128 m = static_cast<unsigned __int128>(s) * (s ^ 0xe7037ed1a0b428dbull);
    uint64_t w = static_cast<uint64_t>(m >> 64) ^ static_cast<uint64_t>(m);
    // A byte whose low 7 bits are all ones is an E4M3 NaN (0x7F, 0xFF). Adding 1 to the low 7
    // bits carries into bit 7 exactly for those bytes; flipping their bit 0 makes them the
    // largest finite magnitude (0x7E, 0xFE) instead.
    const uint64_t nan =
        ((w & 0x7f7f7f7f7f7f7f7full) + 0x0101010101010101ull) & 0x8080808080808080ull;
    w ^= nan >> 7;
    std::memcpy(values + 8 * i, &w, 8);
  }
  const uint64_t s = Mix64(base);
  for (uint32_t j = 0; j < kScaleBytes; ++j) {
    scales[j] = static_cast<uint8_t>(120 + ((s >> (8 * j)) & 0xff) % 15);
  }
}

// A file being written: O_CLOEXEC, closed on every path; Finish() fsyncs and reports close().
class OutputFile {
 public:
  static absl::StatusOr<std::unique_ptr<OutputFile>> Create(const std::string& path) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus("cannot create", path);
    return std::unique_ptr<OutputFile>(new OutputFile(path, fd));
  }
  ~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  absl::Status WriteAt(const void* buf, uint64_t len, uint64_t offset) {
    return WriteAllAt(fd_, path_, buf, len, offset);
  }
  absl::Status Finish() {
    if (::fsync(fd_) != 0) return ErrnoStatus("cannot fsync", path_);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return ErrnoStatus("cannot close", path_);
    return absl::OkStatus();
  }

 private:
  OutputFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_;
};

// One tensor of a shard being planned: its header entry and how to fill its bytes.
struct PlannedTensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  uint64_t bytes = 0;
  uint64_t begin = 0;  // data offset, assigned by PlanShard
  enum class Fill { kDecoy, kEngramValues, kEngramScales } fill = Fill::kDecoy;
};

struct PlannedShard {
  std::string name;
  std::vector<PlannedTensor> tensors;
  uint32_t engram_layer = 0;
  bool has_engram = false;
  uint64_t rows = 0;
  std::string header;  // padded JSON
  uint64_t data_start = 0;
  uint64_t data_bytes = 0;
};

PlannedTensor Decoy(std::string name, std::string dtype, std::vector<uint64_t> shape,
                    uint64_t element_bytes) {
  PlannedTensor t{std::move(name), std::move(dtype), std::move(shape)};
  t.bytes = element_bytes;
  for (uint64_t d : t.shape) t.bytes *= d;
  return t;
}

// Lays the tensors out back to back and pads the JSON with spaces (which safetensors permits
// after the object) so that data starts at an odd offset: 8 + length ≡ 3 (mod 8).
void PlanShard(PlannedShard* shard) {
  ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (PlannedTensor& t : shard->tensors) {
    t.begin = offset;
    offset += t.bytes;
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.begin + t.bytes}}};
  }
  shard->data_bytes = offset;
  shard->header = header.dump();
  while ((8 + shard->header.size()) % 8 != 3) shard->header.push_back(' ');
  shard->data_start = 8 + shard->header.size();
}

absl::Status WriteDecoy(OutputFile& out, const PlannedShard& shard, const PlannedTensor& t,
                        std::vector<uint8_t>& buf) {
  // BF16 values near 1.0: harmless if anything ever reads them as numbers.
  for (uint64_t done = 0; done < t.bytes;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), t.bytes - done);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t pos = done + i;
      buf[i] = (pos & 1) ? 0x3f : static_cast<uint8_t>(Mix64(pos) & 0xff);
    }
    if (absl::Status s = out.WriteAt(buf.data(), n, shard.data_start + t.begin + done); !s.ok()) {
      return s;
    }
    done += n;
  }
  return absl::OkStatus();
}

// Streams both Engram tensors of a layer: values and scales are generated together, chunk by
// chunk, and written to their two regions of the shard.
absl::Status WriteEngramTensors(OutputFile& out, const PlannedShard& shard, uint64_t seed,
                                uint64_t values_begin, uint64_t scales_begin,
                                const SynthOptions& options, uint64_t* done_bytes,
                                uint64_t total_bytes) {
  constexpr uint64_t kChunkRows = 8192;  // 2 MiB of values + 64 KiB of scales
  std::vector<uint8_t> values(kChunkRows * kValueBytes);
  std::vector<uint8_t> scales(kChunkRows * kScaleBytes);
  const uint64_t key = LayerKey(seed, shard.engram_layer);
  constexpr uint64_t kSyncWindow = 256ull << 20;
  uint64_t unsynced_from = shard.data_start + values_begin;
  for (uint64_t first = 0; first < shard.rows; first += kChunkRows) {
    const uint64_t n = std::min(kChunkRows, shard.rows - first);
    for (uint64_t i = 0; i < n; ++i) {
      FillRow(key, first + i, values.data() + i * kValueBytes, scales.data() + i * kScaleBytes);
    }
    const uint64_t value_off = shard.data_start + values_begin + first * kValueBytes;
    if (absl::Status s = out.WriteAt(values.data(), n * kValueBytes, value_off); !s.ok()) return s;
    if (absl::Status s = out.WriteAt(scales.data(), n * kScaleBytes,
                                     shard.data_start + scales_begin + first * kScaleBytes);
        !s.ok()) {
      return s;
    }
    // Start writeback of what is done so a multi-GB checkpoint does not pile up gigabytes of
    // dirty pages before the final fsync.
    const uint64_t written_to = value_off + n * kValueBytes;
    if (written_to - unsynced_from >= kSyncWindow) {
      (void)::sync_file_range(out.fd(), static_cast<off_t>(unsynced_from),
                              static_cast<off_t>(written_to - unsynced_from),
                              SYNC_FILE_RANGE_WRITE);
      unsynced_from = written_to;
    }
    *done_bytes += n * kRowBytes;
    if (options.progress) options.progress(*done_bytes, total_bytes);
  }
  return absl::OkStatus();
}

absl::Status WriteShard(const std::string& dir, const PlannedShard& shard,
                        const SynthOptions& options, uint64_t* done_bytes, uint64_t total_bytes) {
  auto out = OutputFile::Create((std::filesystem::path(dir) / shard.name).string());
  if (!out.ok()) return out.status();
  uint8_t length[8];
  uint64_t h = shard.header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(h >> (8 * i));
  if (absl::Status s = (*out)->WriteAt(length, 8, 0); !s.ok()) return s;
  if (absl::Status s = (*out)->WriteAt(shard.header.data(), h, 8); !s.ok()) return s;
  std::vector<uint8_t> buf(1 << 20);
  uint64_t values_begin = 0, scales_begin = 0;
  for (const PlannedTensor& t : shard.tensors) {
    switch (t.fill) {
      case PlannedTensor::Fill::kDecoy:
        if (absl::Status s = WriteDecoy(**out, shard, t, buf); !s.ok()) return s;
        break;
      case PlannedTensor::Fill::kEngramValues:
        values_begin = t.begin;
        break;
      case PlannedTensor::Fill::kEngramScales:
        scales_begin = t.begin;
        break;
    }
  }
  if (shard.has_engram) {
    if (absl::Status s = WriteEngramTensors(**out, shard, options.seed, values_begin, scales_begin,
                                            options, done_bytes, total_bytes);
        !s.ok()) {
      return s;
    }
  }
  return (*out)->Finish();
}

absl::Status WriteJson(const std::string& path, const ordered_json& doc) {
  return WriteWholeFile(path, doc.dump(2) + "\n");
}

absl::StatusOr<uint64_t> FullRowsOf(uint32_t layer) {
  for (int i = 0; i < 2; ++i) {
    if (kDsv41EngramLayers[i] == layer) return kDsv41EngramRows[i];
  }
  return absl::InvalidArgumentError(
      absl::StrCat("layer ", layer,
                   " has no DeepSeek-V4.1 row count; full-size checkpoints have layers 1 "
                   "and 14 (pass a row count instead)"));
}

// Rows of each layer's table, in options.layers' order.
absl::StatusOr<std::vector<uint64_t>> RowsPerLayer(const SynthOptions& options) {
  if (options.hashable) {
    if (options.hash_prime_start < 2 || options.hash_prime_start > kMaxHashPrimeStart) {
      return absl::InvalidArgumentError(absl::StrCat("engram_vocab_size ", options.hash_prime_start,
                                                     " is outside [2, ", kMaxHashPrimeStart, "]"));
    }
    return HashableRows(options.layers.size(), options.hash_prime_start);
  }
  std::vector<uint64_t> rows;
  for (uint32_t layer : options.layers) {
    auto n = options.rows != 0 ? absl::StatusOr<uint64_t>(options.rows) : FullRowsOf(layer);
    if (!n.ok()) return n.status();
    rows.push_back(*n);
  }
  return rows;
}

// config.json: the engram_* keys under text_config. A hashable checkpoint's describe its
// tokenizer and primes; otherwise DeepSeek-V4.1's, with the rows written.
std::string ConfigText(const SynthOptions& options, const std::vector<uint64_t>& rows,
                       const SyntheticVocab* vocab) {
  ordered_json text_config;
  text_config["model_type"] = "deepseek_v4";
  if (vocab != nullptr) text_config["vocab_size"] = vocab->tokens.size();
  text_config["engram_layer_ids"] = options.layers;
  text_config["engram_num_embeddings"] = rows;
  text_config["engram_max_ngram_size"] = kSyntheticMaxNgram;
  text_config["engram_n_heads"] = kSyntheticHeadsPerOrder;
  text_config["engram_head_dim"] = kValueBytes;
  text_config["engram_vocab_size"] = vocab != nullptr ? options.hash_prime_start : 16000000;
  text_config["engram_pad_token_id"] = vocab != nullptr ? vocab->pad_token_id : 2;
  text_config["engram_compressed_vocab_size"] = vocab != nullptr ? vocab->compressed_size : 99092;
  ordered_json config;
  config["architectures"] = {"DeepseekV4ForCausalLM"};
  config["model_type"] = "deepseek_v4";
  config["text_config"] = text_config;
  // Lets tools verify rows against SyntheticRow() without being told the seed.
  config["engram_synthetic"] = {{"seed", options.seed}, {"generator", "engram-synth"}};
  return config.dump(2) + "\n";
}

// config.json, and with options.hashable the tokenizer files and engram-hash.bin after it
// (their fingerprint covers config.json as written).
absl::Status WriteModelFiles(const SynthOptions& options, const std::vector<uint64_t>& rows) {
  const std::filesystem::path dir(options.out_dir);
  std::optional<SyntheticVocab> vocab;
  if (options.hashable) vocab = MakeSyntheticVocab(kSyntheticWords);
  const std::string config = ConfigText(options, rows, vocab ? &*vocab : nullptr);
  if (absl::Status s = WriteWholeFile((dir / "config.json").string(), config); !s.ok()) return s;
  if (vocab) return WriteHashFiles(options.out_dir, config, *vocab);
  return absl::OkStatus();
}

// A shard holding one Engram layer's tensors between two decoys.
void PlanEngramShard(uint32_t layer, uint64_t rows, std::string name, PlannedShard* shard) {
  shard->name = std::move(name);
  shard->engram_layer = layer;
  shard->has_engram = true;
  shard->rows = rows;
  const std::string prefix = absl::StrCat("layers.", layer, ".");
  // A decoy whose name looks like an Engram tensor comes first, so the table data does not
  // start at data offset 0 either.
  shard->tensors.push_back(Decoy(prefix + "engram.norm.weight", "BF16", {kValueBytes}, 2));
  PlannedTensor values{prefix + "engram.embed.weight", "F8_E4M3", {rows, kValueBytes}};
  values.bytes = rows * kValueBytes;
  values.fill = PlannedTensor::Fill::kEngramValues;
  shard->tensors.push_back(values);
  PlannedTensor scales{prefix + "engram.embed.scale", "F8_E8M0", {rows, kScaleBytes}};
  scales.bytes = rows * kScaleBytes;
  scales.fill = PlannedTensor::Fill::kEngramScales;
  shard->tensors.push_back(scales);
  shard->tensors.push_back(Decoy(prefix + "ffn.gate.weight", "BF16", {32, 64}, 2));
}

std::string ShardName(size_t index, size_t count) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, count);
}

}  // namespace

void SyntheticRow(uint64_t seed, uint32_t layer, uint64_t row, uint8_t* ret_row) {
  FillRow(LayerKey(seed, layer), row, ret_row, ret_row + kValueBytes);
}

void SyntheticRows(uint64_t seed, uint32_t layer, uint64_t first, uint64_t count,
                   uint8_t* ret_rows) {
  const uint64_t key = LayerKey(seed, layer);
  for (uint64_t i = 0; i < count; ++i) {
    uint8_t* row = ret_rows + i * kRowBytes;
    FillRow(key, first + i, row, row + kValueBytes);
  }
}

std::string SyntheticShardName(const SynthOptions& options, uint32_t layer) {
  const size_t count = options.layers.size() + 1;
  for (size_t i = 0; i < options.layers.size(); ++i) {
    if (options.layers[i] == layer) return ShardName(i + 1, count);
  }
  return "";
}

absl::Status WriteSyntheticCheckpoint(const SynthOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("no output directory given");
  if (options.layers.empty()) return absl::InvalidArgumentError("no Engram layers to write");
  for (size_t i = 0; i < options.layers.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (options.layers[i] == options.layers[j]) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", options.layers[i], " is listed twice"));
      }
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create directory ", options.out_dir, ": ", ec.message()));
  }

  // Shard 1: decoys only, like the leading shards of the real checkpoint. Then one shard per
  // Engram layer, so the tables sit in the last shards.
  const size_t shard_count = options.layers.size() + 1;
  std::vector<PlannedShard> shards(shard_count);
  shards[0].name = ShardName(0, shard_count);
  shards[0].tensors.push_back(Decoy("embed.weight", "BF16", {1024, 64}, 2));
  shards[0].tensors.push_back(Decoy("layers.0.attn.wq.weight", "BF16", {64, 64}, 2));
  auto rows_per_layer = RowsPerLayer(options);
  if (!rows_per_layer.ok()) return rows_per_layer.status();
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < options.layers.size(); ++i) {
    const uint64_t rows = (*rows_per_layer)[i];
    total_bytes += rows * kRowBytes;
    PlanEngramShard(options.layers[i], rows, ShardName(i + 1, shard_count), &shards[i + 1]);
  }
  ordered_json weight_map = ordered_json::object();
  uint64_t total_size = 0;
  for (PlannedShard& shard : shards) {
    PlanShard(&shard);
    total_size += shard.data_bytes;
    for (const PlannedTensor& t : shard.tensors) weight_map[t.name] = shard.name;
  }

  uint64_t done_bytes = 0;
  for (const PlannedShard& shard : shards) {
    if (absl::Status s = WriteShard(options.out_dir, shard, options, &done_bytes, total_bytes);
        !s.ok()) {
      return s;
    }
  }

  ordered_json index;
  index["metadata"] = {{"total_size", total_size}};
  index["weight_map"] = weight_map;
  const std::filesystem::path dir(options.out_dir);
  if (absl::Status s = WriteJson((dir / "model.safetensors.index.json").string(), index); !s.ok()) {
    return s;
  }

  if (absl::Status s = WriteModelFiles(options, *rows_per_layer); !s.ok()) return s;

  // Make the new directory entries durable too.
  return FsyncDirectory(options.out_dir);
}

}  // namespace engram
