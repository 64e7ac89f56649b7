// engramctl: the operator's command line for engramd (hashing, and the daemon's status and
// tables as their subcommands are added). Each subcommand is registered from commands.h.
#include <CLI/CLI.hpp>

#include "tools/engramctl/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"engramctl: inspect and drive engramd and DeepSeek-V4.1 Engram tables"};
  app.require_subcommand(1);
  int exit_code = 0;
  engramctl::AddHashCommand(app, &exit_code);
  engramctl::AddDaemonCommands(app, &exit_code);
  engramctl::AddWarmCommands(app, &exit_code);
  engramctl::AddRowsCommand(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
