// engramctl hash: prints the absolute Engram row ids that token ids hash to, per position and
// head, as the daemon would gather them (text, or JSON with a schema_version).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "cli/command_line.h"
#include "hash/ngram_hasher.h"
#include "nlohmann/json.hpp"
#include "tools/engramctl/commands.h"

namespace engramctl {
namespace {

constexpr int kHashJsonSchemaVersion = 1;
// --tp-size: at most as many ranks as a node could hold GPUs many times over.
constexpr uint64_t kMaxTpSize = 1024;

struct HashArgs {
  std::string model;
  uint32_t layer = 0;
  bool compressed = false;
  uint32_t tp_size = 1;
  uint32_t tp_rank = 0;
  std::vector<int32_t> history;
  size_t chunk = 0;
  std::string derived;
  std::optional<uint32_t> compressed_pad_id;
  std::string tokens_file;
  bool json = false;
  std::vector<int32_t> tokens;
};

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "engramctl hash: %s\n", std::string(status.message()).c_str());
  return 1;
}

absl::Status ReadTokensFile(const std::string& path, std::vector<int32_t>& tokens) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot open tokens file '%s'", path));
  int64_t v;
  while (in >> v) {
    if (v < INT32_MIN || v > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tokens file '%s': %d is not a 32-bit token id", path, v));
    }
    tokens.push_back(static_cast<int32_t>(v));
  }
  if (!in.eof()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tokens file '%s': not whitespace-separated integers", path));
  }
  return absl::OkStatus();
}

// What `engramctl hash` prints: each token's rows, one per head of the rank, and where they lie.
struct HashedRows {
  uint32_t layer_index = 0;
  engram::HeadRange heads;
  std::pair<uint64_t, uint64_t> row_range;
  std::vector<uint64_t> rows;       // tokens x heads
  std::vector<int32_t> compressed;  // each token's compressed id
};

// Hashes args.tokens (after args.history, in chunks of args.chunk) with the opened hasher.
absl::StatusOr<HashedRows> HashTokens(const HashArgs& args, const engram::NgramHasher& hasher) {
  HashedRows out;
  auto layer_index = hasher.LayerIndex(args.layer);
  if (!layer_index.ok()) return layer_index.status();
  out.layer_index = *layer_index;
  auto heads = hasher.RankHeads(args.tp_size, args.tp_rank);
  if (!heads.ok()) return heads.status();
  out.heads = *heads;
  auto row_range = hasher.HeadRows(*layer_index, *heads);
  if (!row_range.ok()) return row_range.status();
  out.row_range = *row_range;

  // History and tokens in one buffer, so each chunk's history is simply what precedes it.
  std::vector<int32_t> ids = args.history;
  ids.insert(ids.end(), args.tokens.begin(), args.tokens.end());
  const size_t first = args.history.size();
  const size_t chunk = args.chunk == 0 ? args.tokens.size() : args.chunk;
  std::vector<engram::HashSequence> sequences;
  for (size_t begin = first; begin < ids.size(); begin += chunk) {
    const size_t end = std::min(ids.size(), begin + chunk);
    sequences.push_back({std::span<const int32_t>(ids).subspan(begin, end - begin),
                         std::span<const int32_t>(ids).subspan(0, begin)});
  }
  const auto space =
      args.compressed ? engram::TokenSpace::kCompressed : engram::TokenSpace::kTokenizer;
  out.rows.resize(args.tokens.size() * heads->size());
  if (absl::Status st = hasher.Hash(*layer_index, sequences, space, *heads, out.rows); !st.ok()) {
    return st;
  }
  out.compressed = args.tokens;
  if (!args.compressed) {
    if (absl::Status st = hasher.Compress(args.tokens, out.compressed); !st.ok()) return st;
  }
  return out;
}

void PrintHashJson(const HashArgs& args, const engram::NgramHasher& hasher, const HashedRows& h) {
  const engram::LayerTables& tables = hasher.layer(h.layer_index);
  const size_t heads = h.heads.size();
  nlohmann::json out;
  out["schema_version"] = kHashJsonSchemaVersion;
  out["model"] = args.model;
  out["layer"] = args.layer;
  out["id_space"] = args.compressed ? "compressed" : "tokenizer";
  out["tp_size"] = args.tp_size;
  out["tp_rank"] = args.tp_rank;
  out["heads"] = {h.heads.begin, h.heads.end};
  out["row_range"] = {h.row_range.first, h.row_range.second};
  out["history"] = args.history;
  out["chunk"] = args.chunk;
  out["compressed_pad_id"] = hasher.compressed_pad_id();
  out["layer_tables"] = {{"multipliers", tables.multipliers},
                         {"primes", tables.primes},
                         {"head_offsets", tables.head_offsets}};
  nlohmann::json positions = nlohmann::json::array();
  for (size_t t = 0; t < args.tokens.size(); ++t) {
    positions.push_back({{"token", args.tokens[t]},
                         {"compressed", h.compressed[t]},
                         {"rows", std::vector<uint64_t>(h.rows.begin() + t * heads,
                                                        h.rows.begin() + (t + 1) * heads)}});
  }
  out["positions"] = std::move(positions);
  std::cout << out.dump() << "\n";
}

// Per position a line of its token and compressed id, then its rows in head order, as many to
// a line as fit 80 columns in right-aligned columns (24 ids of 9 digits would not fit one).
void PrintHashText(const HashArgs& args, const HashedRows& h) {
  constexpr size_t kColumns = 80, kIndent = 4;
  const size_t digits = std::to_string(h.row_range.second).size();
  const size_t per_line = std::max<size_t>(1, (kColumns - kIndent + 1) / (digits + 1));
  std::printf("# layer %u, heads [%u, %u), rows [%llu, %llu), %s ids\n", args.layer, h.heads.begin,
              h.heads.end, static_cast<unsigned long long>(h.row_range.first),
              static_cast<unsigned long long>(h.row_range.second),
              args.compressed ? "compressed" : "tokenizer");
  std::printf("# position token compressed, then the row of each head, %zu to a line\n", per_line);
  for (size_t t = 0; t < args.tokens.size(); ++t) {
    std::printf("%zu %d %d\n", t, args.tokens[t], h.compressed[t]);
    for (uint32_t k = 0; k < h.heads.size(); ++k) {
      std::printf("%s%*llu", k % per_line == 0 ? std::string(kIndent - 1, ' ').c_str() : "",
                  static_cast<int>(digits) + 1,
                  static_cast<unsigned long long>(h.rows[t * h.heads.size() + k]));
      if (k % per_line == per_line - 1 || k + 1 == h.heads.size()) std::printf("\n");
    }
  }
}

int RunHash(HashArgs& args) {
  if (!args.tokens_file.empty()) {
    if (absl::Status st = ReadTokensFile(args.tokens_file, args.tokens); !st.ok()) return Fail(st);
  }
  if (args.tokens.empty()) {
    return Fail(absl::InvalidArgumentError("no tokens: give TOKEN... or --tokens-file"));
  }
  engram::HasherOptions options;
  options.derived_path = args.derived;
  options.compressed_only = args.compressed;
  options.compressed_pad_id = args.compressed_pad_id;
  auto hasher = engram::NgramHasher::Open(args.model, options);
  if (!hasher.ok()) return Fail(hasher.status());
  absl::StatusOr<HashedRows> hashed = HashTokens(args, *hasher);
  if (!hashed.ok()) return Fail(hashed.status());
  if (args.json) {
    PrintHashJson(args, *hasher, *hashed);
  } else {
    PrintHashText(args, *hashed);
  }
  return 0;
}

}  // namespace

void AddHashCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<HashArgs>();
  CLI::App* cmd = app.add_subcommand(
      "hash", "Print the absolute Engram row ids (one per head) of each token position");
  cmd->add_option("--model", args->model,
                  "Model directory (config.json, tokenizer.json, "
                  "engram-hash.bin)")
      ->required();
  cmd->add_option("--layer", args->layer, "Engram layer id (e.g. 1 or 14)")
      ->required()
      ->check(engram::cli::Integer(0, UINT32_MAX));
  cmd->add_flag("--compressed", args->compressed,
                "TOKENs are compressed ids (no derived tables needed with "
                "--compressed-pad-id)");
  cmd->add_option("--tp-size", args->tp_size, "Tensor-parallel size (heads split evenly)")
      ->check(engram::cli::Integer(1, kMaxTpSize));
  cmd->add_option("--tp-rank", args->tp_rank, "Tensor-parallel rank: print only its heads")
      ->check(engram::cli::Integer(0, kMaxTpSize - 1));
  cmd->add_option("--history", args->history,
                  "Ids before the first TOKEN, oldest first (default: sequence start)")
      ->delimiter(',');
  cmd->add_option("--chunk", args->chunk,
                  "Hash in chunks of N tokens, each with its preceding ids as history")
      ->check(engram::cli::Integer(0, UINT32_MAX));
  cmd->add_option("--derived", args->derived,
                  "Derived-tables file (default MODEL/engram-hash.bin)");
  cmd->add_option("--compressed-pad-id", args->compressed_pad_id,
                  "Compressed id of the pad token, when there are no derived tables")
      ->check(engram::cli::Integer(0, UINT32_MAX));
  cmd->add_option("--tokens-file", args->tokens_file,
                  "Read whitespace-separated token ids from FILE (after TOKENs)");
  cmd->add_flag("--json", args->json, "Print JSON (schema_version 1)");
  cmd->add_option("tokens", args->tokens, "Token ids");
  cmd->callback([args, exit_code] { *exit_code = RunHash(*args); });
}

}  // namespace engramctl
