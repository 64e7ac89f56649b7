// engram-synth: writes a synthetic DeepSeek-V4.1-format checkpoint directory whose Engram rows
// are a pure function of (seed, layer, row); see testkit/synthetic.h.
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "cli/command_line.h"
#include "engram/version.h"
#include "testkit/synthetic.h"
#include "tools/tables/progress.h"

namespace {

// One line saying what was written.
void PrintSummary(const engram::SynthOptions& options) {
  std::printf("wrote %s: Engram layers", options.out_dir.c_str());
  for (uint32_t l : options.layers) std::printf(" %u", l);
  const auto seed = static_cast<unsigned long long>(options.seed);
  if (!options.hashable) {
    std::printf(", %s rows per table, seed %llu\n",
                options.rows ? std::to_string(options.rows).c_str() : "full-size", seed);
    return;
  }
  std::printf(", rows per table");
  for (uint64_t rows : engram::HashableRows(options.layers.size(), options.hash_prime_start)) {
    std::printf(" %llu", static_cast<unsigned long long>(rows));
  }
  std::printf(" (engram_vocab_size %llu), seed %llu; hashable: tokenizer.json, engram-hash.bin\n",
              static_cast<unsigned long long>(options.hash_prime_start), seed);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Write a synthetic DeepSeek-V4.1 checkpoint (config.json, index, safetensors shards with "
      "the Engram tables of layers 1 and 14 and decoy tensors).",
      "engram-synth"};
  app.set_version_flag("--version", std::string("engram-synth ") + ENGRAM_VERSION);
  std::string out_dir;
  std::string rows_text = std::to_string(engram::kDefaultSyntheticRows);
  uint64_t seed = 0;
  std::vector<uint32_t> layers = {1, 14};
  bool progress = false, quiet = false, hashable = false;
  uint64_t prime_start = engram::kDefaultHashPrimeStart;
  app.add_option("OUT_DIR", out_dir, "Checkpoint directory to write")->required();
  CLI::Option* rows_option =
      app.add_option("--rows", rows_text,
                     "Rows per Engram table, or 'full' for DeepSeek-V4.1's 384,006,168 / "
                     "384,016,682 (203 GB)")
          ->capture_default_str();
  CLI::Option* hashable_flag = app.add_flag(
      "--hashable", hashable,
      "Also write a small tokenizer (tokenizer.json, tokenizer_config.json) and its derived "
      "hash tables (engram-hash.bin), with each table's rows set by its head primes, so that "
      "engramctl hash and engram.Hasher work on the checkpoint; excludes --rows");
  rows_option->excludes(hashable_flag);
  app.add_option("--engram-vocab-size", prime_start,
                 "With --hashable: config.json's engram_vocab_size, where the search for each "
                 "layer's 24 head primes starts; a table has about 24 times this many rows")
      ->capture_default_str()
      ->check(engram::cli::Integer(2, engram::kMaxHashPrimeStart))
      ->needs(hashable_flag);
  app.add_option("--seed", seed, "Seed of the row contents")
      ->capture_default_str()
      ->check(engram::cli::Integer(0, UINT64_MAX));
  app.add_option("--layers", layers, "Engram layer ids")
      ->capture_default_str()
      ->delimiter(',')
      ->check(engram::cli::Integer(0, UINT32_MAX));
  rows_option->check(engram::cli::Checked([](const std::string& text) {
    uint64_t rows = 0;
    if (text == "full" || (text.find_first_not_of("0123456789") == std::string::npos &&
                           absl::SimpleAtoi(text, &rows) && rows > 0)) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("must be a positive row count or 'full', got '%s'", text));
  }));
  app.add_flag("--progress", progress, "Show progress even when stderr is not a terminal");
  app.add_flag("-q,--quiet", quiet, "Print nothing on success");
  if (std::optional<int> done = engram::cli::Parse(app, argc, argv)) return *done;

  engram::SynthOptions options;
  options.out_dir = out_dir;
  options.seed = seed;
  options.layers = layers;
  options.hashable = hashable;
  options.hash_prime_start = prime_start;
  if (hashable) {
    options.rows = 0;  // set from the primes
  } else if (rows_text == "full") {
    options.rows = 0;
  } else {
    absl::SimpleAtoi(rows_text, &options.rows);  // checked by Parse
  }
  engram::ProgressLine line("engram-synth " + out_dir, progress || isatty(STDERR_FILENO));
  options.progress = [&](uint64_t done, uint64_t total) { line.Update(done, total); };
  absl::Status s = engram::WriteSyntheticCheckpoint(options);
  line.Finish();
  if (!s.ok()) {
    std::fprintf(stderr, "engram-synth: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  if (!quiet) PrintSummary(options);
  return 0;
}
