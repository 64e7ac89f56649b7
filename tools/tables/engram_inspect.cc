// engram-inspect: opens a checkpoint directory or packed file exactly as engramd would, prints
// each Engram table's geometry, and optionally checks rows against the synthetic generator.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/command_line.h"
#include "engram/version.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "tables/pack.h"
#include "tables/table.h"
#include "testkit/synthetic.h"
#include "tools/tables/progress.h"

namespace {

// The seed engram-synth recorded in config.json, if `path` is a synthetic checkpoint.
std::optional<uint64_t> RecordedSeed(const std::string& path) {
  std::FILE* f = std::fopen((path + "/config.json").c_str(), "re");
  if (f == nullptr) return std::nullopt;
  nlohmann::json doc = nlohmann::json::parse(f, nullptr, false);
  std::fclose(f);
  if (doc.is_discarded() || !doc.contains("engram_synthetic")) return std::nullopt;
  const auto& seed = doc["engram_synthetic"]["seed"];
  if (!seed.is_number_unsigned()) return std::nullopt;
  return seed.get<uint64_t>();
}

struct Options {
  std::string path, rows_text;
  std::vector<uint32_t> layers;
  bool no_check_holes = false, json_out = false;
  std::optional<uint64_t> seed;
  bool verify = false;
  uint64_t sample = 4096;
};

void AddOptions(CLI::App& app, Options& o) {
  app.add_option("PATH", o.path, "Checkpoint directory or packed table file")->required();
  app.add_option("--layer", o.layers, "Only these layers")
      ->delimiter(',')
      ->check(engram::cli::Integer(0, UINT32_MAX));
  app.add_option("--rows", o.rows_text, "Declared row range BEGIN:END of a sparse per-rank copy")
      ->check(engram::cli::Checked(
          [](const std::string& text) { return engram::ParseRowRange(text).status(); }));
  app.add_flag("--no-check-holes", o.no_check_holes, "Skip the SEEK_HOLE check of covered rows");
  app.add_flag("--verify-synthetic", o.verify,
               "Compare rows with engram-synth's generator (seed from config.json or --seed)");
  app.add_option("--seed", o.seed, "Seed for --verify-synthetic (implies it)")
      ->check(engram::cli::Integer(0, UINT64_MAX));
  app.add_option("--sample", o.sample,
                 "Rows to compare per table for --verify-synthetic (spread evenly, always "
                 "including the first and last; 0 = every row)")
      ->capture_default_str()
      ->check(engram::cli::Integer(0, UINT64_MAX));
  app.add_flag("--json", o.json_out, "Print the geometry as JSON");
}

// The table's geometry as JSON (the --json report's entry).
nlohmann::json Describe(const engram::Table& t) {
  nlohmann::json entry;
  entry["layer"] = t.layer_id();
  entry["layout"] = engram::TableLayoutName(t.layout());
  entry["num_rows"] = t.num_rows();
  entry["covered"] = {t.covered().begin, t.covered().end};
  entry["data_bytes"] = t.data_bytes();
  for (const engram::RowPart& p : t.parts()) {
    entry["parts"].push_back({{"file", t.files()[p.file].path},
                              {"row_bytes", p.bytes},
                              {"dest_offset", p.dest_offset},
                              {"base", p.base},
                              {"base_row", p.base_row},
                              {"base_aligned_4k", p.base % 4096 == 0},
                              {"rows_per_page", p.rows_per_page}});
  }
  return entry;
}

// The table's geometry as text.
void PrintGeometry(const engram::Table& t) {
  std::printf("layer %u: %s, %llu rows, covers [%llu, %llu) = %s\n", t.layer_id(),
              engram::TableLayoutName(t.layout()), static_cast<unsigned long long>(t.num_rows()),
              static_cast<unsigned long long>(t.covered().begin),
              static_cast<unsigned long long>(t.covered().end),
              engram::HumanBytes(t.data_bytes()).c_str());
  for (const engram::RowPart& p : t.parts()) {
    if (p.paged()) {
      std::printf(
          "  bytes [%u, %u) of each row: %s, paged: row r in slot s = r - %llu at %llu + (s / %u) "
          "* %u + (s %% %u) * %u (one page read a row)\n",
          p.dest_offset, p.dest_offset + p.bytes, t.files()[p.file].path.c_str(),
          static_cast<unsigned long long>(p.base_row), static_cast<unsigned long long>(p.base),
          p.rows_per_page, p.page_bytes, p.rows_per_page, p.bytes);
      continue;
    }
    std::printf("  bytes [%u, %u) of each row: %s, row r at %llu + (r - %llu) * %u%s\n",
                p.dest_offset, p.dest_offset + p.bytes, t.files()[p.file].path.c_str(),
                static_cast<unsigned long long>(p.base),
                static_cast<unsigned long long>(p.base_row), p.bytes,
                p.base % 4096 == 0 ? "" : " (not 4 KiB aligned)");
  }
}

// Compares `sample` rows of t (spread evenly) with engram-synth's generator and records the
// counts in entry. False when the rows differ; a row that cannot be read is a status.
absl::StatusOr<bool> VerifySynthetic(const engram::Table& t, const Options& o,
                                     nlohmann::json& entry) {
  const engram::RowRange c = t.covered();
  const uint64_t count =
      o.sample == 0 || o.sample >= c.size() ? c.size() : std::max<uint64_t>(2, o.sample);
  uint64_t mismatched = 0, first_bad = 0;
  uint8_t got[engram::kRowBytes], want[engram::kRowBytes];
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t row =
        count == c.size() ? c.begin + i : c.begin + (c.size() - 1) * i / (count - 1);
    if (absl::Status s = engram::ReadRowBlocking(t, row, got); !s.ok()) return s;
    engram::SyntheticRow(*o.seed, t.layer_id(), row, want);
    if (std::memcmp(got, want, sizeof(got)) != 0 && mismatched++ == 0) first_bad = row;
  }
  entry["verified_rows"] = count;
  entry["mismatched_rows"] = mismatched;
  if (mismatched) {
    std::fprintf(stderr,
                 "engram-inspect: layer %u: %llu of %llu rows differ from engram-synth seed "
                 "%llu (first: row %llu)\n",
                 t.layer_id(), static_cast<unsigned long long>(mismatched),
                 static_cast<unsigned long long>(count), static_cast<unsigned long long>(*o.seed),
                 static_cast<unsigned long long>(first_bad));
    return false;
  }
  if (!o.json_out) {
    std::printf("  %llu rows match engram-synth seed %llu\n",
                static_cast<unsigned long long>(count), static_cast<unsigned long long>(*o.seed));
  }
  return true;
}

// Opens the tables as engramd would; on failure says why and sets *ret_exit.
std::optional<std::vector<std::unique_ptr<engram::Table>>> Open(const Options& o, int* ret_exit) {
  engram::OpenOptions options;
  options.layers = o.layers;
  options.check_holes = !o.no_check_holes;
  if (!o.rows_text.empty()) options.rows = *engram::ParseRowRange(o.rows_text);  // checked by Parse
  auto tables = engram::OpenTables(o.path, options);
  if (!tables.ok()) {
    std::fprintf(stderr, "engram-inspect: %s is not servable: %s\n", o.path.c_str(),
                 tables.status().ToString().c_str());
    *ret_exit = 1;
    return std::nullopt;
  }
  return *std::move(tables);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Open Engram tables as engramd does (validating every header, shape and offset) and print "
      "their geometry.",
      "engram-inspect"};
  app.set_version_flag("--version", std::string("engram-inspect ") + ENGRAM_VERSION);
  Options o;
  AddOptions(app, o);
  if (std::optional<int> done = engram::cli::Parse(app, argc, argv)) return *done;

  int exit_code = 0;
  auto tables = Open(o, &exit_code);
  if (!tables) return exit_code;
  if (o.seed) o.verify = true;
  if (o.verify && !o.seed) o.seed = RecordedSeed(o.path);
  if (o.verify && !o.seed) {
    std::fprintf(stderr,
                 "engram-inspect: --verify-synthetic: %s records no engram-synth seed; pass "
                 "--seed\n",
                 o.path.c_str());
    return 2;
  }

  nlohmann::json report = nlohmann::json::array();
  int failures = 0;
  for (const auto& t : *tables) {
    nlohmann::json entry = Describe(*t);
    if (!o.json_out) PrintGeometry(*t);
    if (o.verify) {
      absl::StatusOr<bool> matched = VerifySynthetic(*t, o, entry);
      if (!matched.ok()) {
        std::fprintf(stderr, "engram-inspect: %s\n", matched.status().ToString().c_str());
        return 1;
      }
      if (!*matched) ++failures;
    }
    report.push_back(entry);
  }
  if (o.json_out) std::printf("%s\n", report.dump(2).c_str());
  return failures ? 1 : 0;
}
