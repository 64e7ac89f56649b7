// Command-line conventions every engramd program follows (engramd, engramctl, the table tools),
// over CLI11: what a usage error prints and its exit status, and numeric arguments checked
// against bounds stated in words, and help that fits a terminal of kHelpColumns.
//
//   CLI::App app{"engram-pack: ..."};
//   app.add_option("--buffer-mib", mib, "...")->check(engram::cli::Integer(1, 1024));
//   if (std::optional<int> done = engram::cli::Parse(app, argc, argv)) return *done;
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace engram::cli {

// The exit status of a usage error (an unknown option, a missing or out-of-range argument), as
// Python's argparse and most Unix tools use it; nothing was run.
inline constexpr int kExitUsage = 2;

// The width every line of --help fits (descriptions, the app's description and its footer are
// wrapped at spaces): a terminal's, as the listings of engramctl fit it.
inline constexpr size_t kHelpColumns = 80;

// CLI11's help layout (names and types in the first 30 columns, descriptions after them, as
// tools/completion/cli_docs.py reads them) with every description wrapped so that no line passes
// kHelpColumns, and at least two spaces between a name and its description (or the description
// on the next line). Parse() gives it to the app and all of its subcommands.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option(const CLI::Option* opt, bool is_positional) const override;
  std::string make_option_desc(const CLI::Option* opt) const override;
  std::string make_subcommand(const CLI::App* sub) const override;
  std::string make_description(const CLI::App* app) const override;
  std::string make_footer(const CLI::App* app) const override;
};

// `text` with its spaces turned into line breaks where a line would pass `width` characters;
// its own line breaks are kept. A word longer than `width` stays whole on its own line.
std::string WrapText(const std::string& text, size_t width);

// Parses the arguments (args in the order typed, without the program name). Returns nullopt
// when the program should go on; otherwise the status to exit with: 0 after --help or
// --version (printed to stdout), kExitUsage after a usage error, for which stderr gets one line
// naming what was wrong, the usage of the (sub)command it concerns and where its help is.
std::optional<int> Parse(CLI::App& app, const std::vector<std::string>& args);
std::optional<int> Parse(CLI::App& app, int argc, char** argv);

// Prints a usage error that the program found itself after parsing (as Parse prints one) and
// returns kExitUsage. `command` is the (sub)command it concerns.
int UsageError(const CLI::App& command, const std::string& what);

// Validators for ->check(): the argument's text must be a decimal integer in [min, max]
// ("--max-clients must be an integer from 1 to 65536, got -4"; "ROW must be an integer of at
// least 0, got -1"); a number (of seconds, for Seconds) in [min, max], finite.
CLI::Validator Integer(uint64_t min, uint64_t max);
CLI::Validator Seconds(double min, double max);

// A validator of `check`, a rule given as a function: its error's message is what was wrong
// ("--rows: BEGIN must be below END").
CLI::Validator Checked(std::function<absl::Status(const std::string&)> check);

// The bounds of Integer(min, max) in words: "from 1 to 65536", "of at least 0".
std::string IntegerBounds(uint64_t min, uint64_t max);

}  // namespace engram::cli
