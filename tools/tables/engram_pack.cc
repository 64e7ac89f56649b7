// engram-pack: converts one Engram table of a checkpoint (or a packed file) into the packed
// layout, whole or as a per-rank copy, streaming in bounded memory.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "cli/command_line.h"
#include "engram/version.h"
#include "tables/pack.h"
#include "tools/tables/progress.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Write one Engram table in the packed layout (docs/table_format.md): 264-byte rows after "
      "a 4 KiB header, optionally 15 to a 4 KiB page (--paged) and only a row range (a "
      "tensor-parallel rank's copy).",
      "engram-pack"};
  app.set_version_flag("--version", std::string("engram-pack ") + ENGRAM_VERSION);
  std::string input, out, rows_text;
  uint32_t layer = 0;
  bool sparse = false, paged = false, progress = false, quiet = false, no_check_holes = false;
  uint64_t buffer_mib = 4;
  app.add_option("MODEL_DIR", input, "Checkpoint directory (or a packed table file)")->required();
  app.add_option("--layer", layer, "Engram layer to pack (1 or 14 for DeepSeek-V4.1)")
      ->required()
      ->check(engram::cli::Integer(0, UINT32_MAX));
  app.add_option("--out", out, "Packed file to write (via a temporary file and rename)")
      ->required();
  app.add_option("--rows", rows_text, "Only rows BEGIN:END (half-open), e.g. a TP rank's range")
      ->check(engram::cli::Checked(
          [](const std::string& text) { return engram::ParseRowRange(text).status(); }));
  app.add_flag("--sparse", sparse,
               "Keep rows at their original offsets (a sparse file) instead of compacting them");
  app.add_flag("--paged", paged,
               "Format version 2: 15 rows to each 4 KiB page, none straddling one (3.4% larger), "
               "so that a cache-tier miss is one page read");
  app.add_option("--buffer-mib", buffer_mib, "Row data moved per step, in MiB (1 to 1024)")
      ->capture_default_str()
      ->check(engram::cli::Integer(1, 1024));
  app.add_flag("--no-check-holes", no_check_holes,
               "Do not refuse input rows that lie in holes of a sparse input");
  app.add_flag("--progress", progress, "Show progress even when stderr is not a terminal");
  app.add_flag("-q,--quiet", quiet, "Print nothing on success");
  if (std::optional<int> done = engram::cli::Parse(app, argc, argv)) return *done;

  engram::PackOptions options;
  options.input = input;
  options.layer = layer;
  options.out = out;
  options.sparse = sparse;
  options.paged = paged;
  options.buffer_bytes = buffer_mib << 20;
  options.check_input_holes = !no_check_holes;
  if (!rows_text.empty()) options.rows = *engram::ParseRowRange(rows_text);  // checked by Parse
  engram::ProgressLine line("engram-pack layer " + std::to_string(layer),
                            progress || isatty(STDERR_FILENO));
  options.progress = [&](uint64_t done, uint64_t total) { line.Update(done, total); };
  engram::PackStats stats;
  absl::Status s = engram::PackTable(options, &stats);
  line.Finish();
  if (!s.ok()) {
    std::fprintf(stderr, "engram-pack: cannot pack layer %u of %s: %s\n", layer, input.c_str(),
                 s.ToString().c_str());
    return 1;
  }
  if (!quiet) {
    std::printf("wrote %s: layer %u, %s%s%s\n", out.c_str(), layer,
                rows_text.empty() ? "all rows" : ("rows " + rows_text).c_str(),
                sparse ? ", sparse at original offsets" : "",
                paged ? ", paged (15 rows a 4 KiB page)" : "");
    // Space: the file against its row data; time: the whole pack, and its rate in row data.
    std::printf(
        "  space: %llu rows, %llu bytes of rows in a %llu-byte file (%.2f%% over the rows), %llu "
        "bytes on disk\n  time: %.3f s, %.1f MB/s of rows\n",
        static_cast<unsigned long long>(stats.rows),
        static_cast<unsigned long long>(stats.row_bytes),
        static_cast<unsigned long long>(stats.file_bytes),
        stats.row_bytes == 0 ? 0.0
                             : 100.0 * (double(stats.file_bytes) - double(stats.row_bytes)) /
                                   double(stats.row_bytes),
        static_cast<unsigned long long>(stats.disk_bytes), stats.seconds,
        double(stats.row_bytes) / 1e6 / std::max(stats.seconds, 1e-9));
  }
  return 0;
}
