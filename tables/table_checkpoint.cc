// OpenCheckpoint(): finds and validates the Engram tables of a Hugging Face DeepSeek-V4.1
// checkpoint directory (config.json, index, safetensors shards) and maps their rows.
#include <algorithm>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "tables/safetensors.h"
#include "tables/table.h"
#include "tables/table_internal.h"

namespace engram {
namespace {

using json = nlohmann::json;

// config.json and the index are small; anything far larger is not what we think it is.
constexpr uint64_t kMaxJsonFileBytes = 64ull << 20;

struct EngramConfig {
  std::vector<uint32_t> layer_ids;
  std::vector<uint64_t> num_embeddings;  // parallel to layer_ids
  uint64_t head_dim = kValueBytes;
};

absl::StatusOr<json> ReadJsonFile(const std::string& path) {
  auto file = OpenTableFile(path);
  if (!file.ok()) return file.status();
  if (file->size > kMaxJsonFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is ", file->size,
                                                   " bytes, larger than the ", kMaxJsonFileBytes,
                                                   "-byte limit for JSON metadata"));
  }
  std::string text(file->size, '\0');
  if (absl::Status s = PreadFull(file->fd.get(), path, text.data(), file->size, 0); !s.ok()) {
    return s;
  }
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(path, " is not valid JSON"));
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object"));
  }
  return doc;
}

// The engram_* keys live at the top level or, in multimodal-style configs such as
// DeepSeek-V4.1's, under text_config.
absl::StatusOr<EngramConfig> ParseEngramConfig(const std::string& path, const json& doc) {
  const json* scope = &doc;
  if (!doc.contains("engram_layer_ids")) {
    auto text = doc.find("text_config");
    if (text != doc.end() && text->is_object() && text->contains("engram_layer_ids")) {
      scope = &*text;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          path, " has no engram_layer_ids (top level or text_config): not an Engram model"));
    }
  }
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  EngramConfig config;
  const json& ids = (*scope)["engram_layer_ids"];
  if (!ids.is_array() || ids.empty()) return bad("engram_layer_ids is not a non-empty array");
  for (const json& id : ids) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > UINT32_MAX) {
      return bad(absl::StrCat("engram_layer_ids entry ", id.dump(), " is not a layer number"));
    }
    const uint32_t layer = id.get<uint32_t>();
    if (std::find(config.layer_ids.begin(), config.layer_ids.end(), layer) !=
        config.layer_ids.end()) {
      return bad(absl::StrCat("engram_layer_ids lists layer ", layer, " twice"));
    }
    config.layer_ids.push_back(layer);
  }
  auto rows = scope->find("engram_num_embeddings");
  if (rows == scope->end()) return bad("engram_num_embeddings is missing");
  if (rows->is_number_unsigned()) {
    config.num_embeddings.assign(config.layer_ids.size(), rows->get<uint64_t>());
  } else if (rows->is_array() && rows->size() == config.layer_ids.size()) {
    for (const json& n : *rows) {
      if (!n.is_number_unsigned()) {
        return bad(absl::StrCat("engram_num_embeddings entry ", n.dump(), " is not a row count"));
      }
      config.num_embeddings.push_back(n.get<uint64_t>());
    }
  } else {
    return bad(absl::StrCat("engram_num_embeddings must be a row count or an array of ",
                            config.layer_ids.size(), " (one per engram_layer_ids entry), got ",
                            rows->dump()));
  }
  for (size_t i = 0; i < config.num_embeddings.size(); ++i) {
    if (config.num_embeddings[i] == 0) {
      return bad(absl::StrCat("engram_num_embeddings for layer ", config.layer_ids[i], " is 0"));
    }
  }
  auto head_dim = scope->find("engram_head_dim");
  if (head_dim != scope->end()) {
    if (!head_dim->is_number_unsigned()) return bad("engram_head_dim is not a number");
    config.head_dim = head_dim->get<uint64_t>();
  }
  if (config.head_dim != kValueBytes) {
    return bad(absl::StrCat("engram_head_dim is ", config.head_dim, "; engramd serves ",
                            kValueBytes, "-value rows (DeepSeek-V4.1)"));
  }
  return config;
}

// weight_map from model.safetensors.index.json, or everything in model.safetensors.
struct WeightMap {
  std::string index_path;  // empty for a single-file checkpoint
  std::map<std::string, std::string> shard_of;
  std::string single_file;
  const std::string* Find(const std::string& tensor) const {
    if (!single_file.empty()) return &single_file;
    auto it = shard_of.find(tensor);
    return it == shard_of.end() ? nullptr : &it->second;
  }
};

absl::StatusOr<WeightMap> ReadWeightMap(const std::filesystem::path& dir) {
  WeightMap map;
  const std::filesystem::path index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (!std::filesystem::exists(index, ec)) {
    if (std::filesystem::exists(dir / "model.safetensors", ec)) {
      map.single_file = "model.safetensors";
      return map;
    }
    return absl::NotFoundError(absl::StrCat(dir.string(),
                                            " has neither model.safetensors.index.json nor "
                                            "model.safetensors"));
  }
  map.index_path = index.string();
  auto doc = ReadJsonFile(map.index_path);
  if (!doc.ok()) return doc.status();
  auto weights = doc->find("weight_map");
  if (weights == doc->end() || !weights->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(map.index_path, " has no weight_map object"));
  }
  for (const auto& [tensor, shard] : weights->items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(map.index_path, ": weight_map entry '", tensor, "' is not a file name"));
    }
    map.shard_of[tensor] = shard.get<std::string>();
  }
  return map;
}

struct FoundTensor {
  std::string name;
  std::string shard_path;
};

// Looks a tensor up under its bare name and with the "model." prefix some exports add.
absl::StatusOr<FoundTensor> LocateTensor(const std::filesystem::path& dir, const WeightMap& map,
                                         const std::string& name) {
  for (const std::string& candidate : {name, absl::StrCat("model.", name)}) {
    const std::string* shard = map.Find(candidate);
    if (shard == nullptr) continue;
    const std::filesystem::path rel(*shard);
    if (rel.is_absolute() || rel.empty() ||
        std::find(rel.begin(), rel.end(), std::filesystem::path("..")) != rel.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(map.index_path, ": shard '", *shard, "' of tensor '", candidate,
                       "' is not a file name inside the checkpoint directory"));
    }
    return FoundTensor{candidate, (dir / rel).string()};
  }
  return absl::NotFoundError(absl::StrCat("tensor '", name, "' is not in ", map.index_path));
}

struct OpenedShard {
  OpenedFile file;
  SafetensorsHeader header;
};

absl::StatusOr<OpenedShard> OpenShard(const FoundTensor& found, bool require_complete_file) {
  auto file = OpenTableFile(found.shard_path);
  if (!file.ok()) {
    if (absl::IsNotFound(file.status())) {
      return absl::NotFoundError(
          absl::StrCat("shard ", found.shard_path, " of tensor '", found.name, "' is missing"));
    }
    return file.status();
  }
  SafetensorsReadOptions read_options;
  read_options.require_complete_file = require_complete_file;
  auto header = ReadSafetensorsHeader(found.shard_path, file->fd.get(), file->size, read_options);
  if (!header.ok()) return header.status();
  return OpenedShard{*std::move(file), *std::move(header)};
}

// Checks one Engram tensor against config.json: dtype, 2-D shape [rows, columns].
absl::Status CheckEngramTensor(const SafetensorsTensor& t, const std::string& shard,
                               const char* dtype, uint64_t rows, uint64_t columns, uint32_t layer) {
  const std::string where = absl::StrCat("tensor '", t.name, "' in ", shard);
  if (t.dtype != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has dtype ", t.dtype, ", expected ", dtype));
  }
  if (t.shape.size() != 2 || t.shape[1] != columns) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has shape [", absl::StrJoin(t.shape, ", "),
                     "], config.json implies [", rows, ", ", columns, "]"));
  }
  if (t.shape[0] != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has ", t.shape[0], " rows but config.json engram_num_embeddings says ", rows,
        " for layer ", layer));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Table>> OpenCheckpointLayer(const std::filesystem::path& dir,
                                                           const WeightMap& map, uint32_t layer,
                                                           uint64_t num_rows,
                                                           const OpenOptions& options) {
  RowRange covered{0, num_rows};
  if (options.rows) {
    covered = *options.rows;
    if (covered.begin >= covered.end || covered.end > num_rows) {
      return absl::OutOfRangeError(absl::StrCat("declared rows [", covered.begin, ", ", covered.end,
                                                ") of layer ", layer, " in ", dir.string(),
                                                " are empty or outside its ", num_rows, " rows"));
    }
  }
  // A full copy must hold every byte its headers describe; a declared per-rank range may come
  // from a sparse copy that ends early, and only its covered rows are checked (by Finish()).
  const bool complete = !options.rows.has_value();

  struct Spec {
    std::string name;
    const char* dtype;
    uint64_t columns;
    uint32_t dest_offset;
  };
  const Spec specs[2] = {
      {absl::StrCat("layers.", layer, ".engram.embed.weight"), "F8_E4M3", kValueBytes, 0},
      {absl::StrCat("layers.", layer, ".engram.embed.scale"), "F8_E8M0", kScaleBytes, kValueBytes},
  };
  TableBuilder builder(layer, num_rows, covered, TableLayout::kCheckpoint, dir.string());
  for (const Spec& spec : specs) {
    auto found = LocateTensor(dir, map, spec.name);
    if (!found.ok()) return found.status();
    auto shard = OpenShard(*found, complete);
    if (!shard.ok()) return shard.status();
    const SafetensorsTensor* t = shard->header.Find(found->name);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "shard ", found->shard_path, " has no tensor '", found->name, "' (",
          map.single_file.empty() ? map.index_path + " says it does" : "single-file checkpoint",
          ")"));
    }
    if (absl::Status s =
            CheckEngramTensor(*t, found->shard_path, spec.dtype, num_rows, spec.columns, layer);
        !s.ok()) {
      return s;
    }
    RowPart part;
    part.dest_offset = spec.dest_offset;
    part.bytes = static_cast<uint32_t>(spec.columns);
    part.base = shard->header.data_start + t->begin;
    part.base_row = 0;
    part.file = builder.AddFile(std::move(shard->file));
    builder.AddPart(part);
  }
  return builder.Finish(options.check_holes);
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Table>>> OpenCheckpoint(const std::string& dir,
                                                                   const OpenOptions& options) {
  const std::filesystem::path root(dir);
  auto config_doc = ReadJsonFile((root / "config.json").string());
  if (!config_doc.ok()) return config_doc.status();
  auto config = ParseEngramConfig((root / "config.json").string(), *config_doc);
  if (!config.ok()) return config.status();
  for (uint32_t want : options.layers) {
    if (std::find(config->layer_ids.begin(), config->layer_ids.end(), want) ==
        config->layer_ids.end()) {
      return absl::NotFoundError(
          absl::StrCat("layer ", want, " is not an Engram layer of ", dir,
                       " (engram_layer_ids: ", absl::StrJoin(config->layer_ids, ", "), ")"));
    }
  }
  auto map = ReadWeightMap(root);
  if (!map.ok()) return map.status();
  if (map->index_path.empty()) map->index_path = (root / "model.safetensors").string();

  std::vector<std::unique_ptr<Table>> tables;
  for (size_t i = 0; i < config->layer_ids.size(); ++i) {
    const uint32_t layer = config->layer_ids[i];
    if (!options.layers.empty() &&
        std::find(options.layers.begin(), options.layers.end(), layer) == options.layers.end()) {
      continue;
    }
    auto table = OpenCheckpointLayer(root, *map, layer, config->num_embeddings[i], options);
    if (!table.ok()) return table.status();
    tables.push_back(*std::move(table));
  }
  return tables;
}

}  // namespace engram
