// Command-line conventions every engramd program follows (engramd, engramctl, the table tools),
// over CLI11: what a usage error prints and its exit status, and numeric arguments checked
// against bounds stated in words.
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
