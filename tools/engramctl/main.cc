// engramctl: the operator's command line for engramd (hashing, and the daemon's status and
// tables as their subcommands are added). Each subcommand is registered from commands.h.
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "engram/version.h"
#include "tools/engramctl/commands.h"

namespace {

// Options every daemon subcommand takes that may also come before the subcommand, as with git,
// systemctl and kubectl: `engramctl --socket S status` is `engramctl status --socket S`.
struct GlobalOption {
  const char* name;
  bool takes_value;
};
constexpr GlobalOption kGlobalOptions[] = {
    {"--socket", true}, {"--timeout", true}, {"--json", false}};

// How many arguments starting at args[i] form one global option (0: not one).
size_t GlobalOptionLength(const std::vector<std::string>& args, size_t i) {
  for (const GlobalOption& o : kGlobalOptions) {
    const std::string name = o.name;
    if (args[i] == name) {
      if (!o.takes_value) return 1;
      return i + 1 < args.size() ? 2 : 0;  // a missing value stays where CLI11 reports it
    }
    if (o.takes_value && args[i].rfind(name + "=", 0) == 0) return 1;
  }
  return 0;
}

// Moves global options typed before the subcommand to just after its name, so the subcommand
// parses them; anything else typed before the subcommand stays in front of it for CLI11 to
// report, so every mistake is reported in the order it was typed. Without a subcommand the
// arguments are left as they are.
std::vector<std::string> HoistGlobalOptions(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::vector<std::string> before, hoisted;
  for (size_t i = 0; i < args.size();) {
    if (const size_t n = GlobalOptionLength(args, i); n > 0) {
      hoisted.insert(hoisted.end(), args.begin() + i, args.begin() + i + n);
      i += n;
      continue;
    }
    const bool subcommand =
        !app.get_subcommands([&](CLI::App* c) { return c->check_name(args[i]); }).empty();
    if (!subcommand) {
      before.push_back(args[i++]);
      continue;
    }
    std::vector<std::string> out = before;
    out.push_back(args[i]);
    out.insert(out.end(), hoisted.begin(), hoisted.end());
    out.insert(out.end(), args.begin() + i + 1, args.end());
    return out;
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"engramctl: inspect and drive engramd and DeepSeek-V4.1 Engram tables"};
  app.name("engramctl");
  // The release engramctl was built as, and that of the libengram_client it loaded.
  app.set_version_flag("--version", std::string("engramctl ") + ENGRAM_VERSION +
                                        " (libengram_client " + engram_version() + ")");
  app.require_subcommand(1);
  app.footer(
      "--socket PATH, --timeout SECONDS and --json may come before or after the subcommand.");
  int exit_code = 0;
  engramctl::AddHashCommand(app, &exit_code);
  engramctl::AddDaemonCommands(app, &exit_code);
  engramctl::AddWarmCommands(app, &exit_code);
  engramctl::AddLoadCommand(app, &exit_code);
  engramctl::AddRowsCommand(app, &exit_code);
  // Usage errors exit 2 naming what was wrong; engramctl alone prints its help, as one (exit 2).
  if (std::optional<int> done = engram::cli::Parse(app, HoistGlobalOptions(app, argc, argv))) {
    return *done;
  }
  return exit_code;
}
