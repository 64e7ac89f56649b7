// engramctl warm / evict: load a table's rows into the page cache, or drop them, step by step
// through the daemon (which owns the files), with a progress bar and a rate. Ctrl-C stops warm
// after the step in progress. The daemon refuses to warm a table whose gathers do not read the
// page cache (resident, cache tier, O_DIRECT): its first step fails naming the tier, exit 1.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>

#include "absl/strings/str_format.h"
#include "cli/command_line.h"
#include "tables/table.h"
#include "tools/engramctl/commands.h"
#include "tools/engramctl/control_client.h"

namespace engramctl {
namespace {

using nlohmann::json;

std::atomic<bool> g_cancel{false};

struct WarmOptions {
  CommonOptions common;
  uint32_t table = 0;
  std::string rows;
  bool quiet = false;
};

int RunWarm(const WarmOptions& o, const std::string& command) {
  ControlError error;
  std::unique_ptr<ControlClient> client =
      ControlClient::Connect(o.common.socket, o.common.timeout_s, &error);
  if (client == nullptr) return Report(error, o.common.json);
  // The range: --rows, else what the daemon serves of the table.
  json tables;
  if (!client->Call("tables", json{{"residency", false}}, &tables, &error)) {
    return Report(error, o.common.json);
  }
  const json* table = nullptr;
  for (const json& t : tables["tables"]) {
    if (t["layer"] == o.table) table = &t;
  }
  if (table == nullptr) {
    return Report({kExitFailed, absl::StrFormat("engramd on %s serves no table for layer %u; "
                                                "`engramctl tables` lists them",
                                                o.common.socket, o.table)},
                  o.common.json);
  }
  uint64_t begin = (*table)["covered_begin"], end = (*table)["covered_end"];
  if (!o.rows.empty()) {
    absl::StatusOr<engram::RowRange> r = engram::ParseRowRange(o.rows);
    if (!r.ok()) {
      return Report({kExitFailed, std::string(r.status().message())}, o.common.json);
    }
    begin = r->begin;
    end = r->end;
  }
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_cancel = true; };
  sigaction(SIGINT, &sa, nullptr);
  const bool bar = !o.quiet && !o.common.json && isatty(STDERR_FILENO);
  const auto start = std::chrono::steady_clock::now();
  const uint64_t row_bytes = table->value("row_bytes", uint64_t{ENGRAM_ROW_BYTES});
  uint64_t at = begin, bytes = 0;
  while (at < end && !g_cancel) {
    json step;
    if (!client->Call(command, json{{"table", o.table}, {"begin", at}, {"end", end}}, &step,
                      &error)) {
      if (bar) fputc('\n', stderr);
      return Report(error, o.common.json);
    }
    at = step["end"];
    bytes += step["bytes"].get<uint64_t>();
    if (bar) {
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // Done and to do in the table's rows, so that the total is known before the end.
      fprintf(stderr, "\r\033[K%s",
              ProgressLine(absl::StrFormat("%s layer %u", command, o.table),
                           (at - begin) * row_bytes, (end - begin) * row_bytes, bytes, secs)
                  .c_str());
    }
  }
  if (bar) fputc('\n', stderr);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool cancelled = at < end;
  if (o.common.json) {
    json out = {{"schema_version", 1}, {"command", command}, {"layer", o.table},
                {"begin", begin},      {"end", end},         {"done_to", at},
                {"bytes", bytes},      {"seconds", secs},    {"cancelled", cancelled}};
    printf("%s\n", out.dump(2).c_str());
  } else if (!o.quiet) {
    printf("%s layer %u rows [%lu, %lu): %s in %.2f s (%s/s)%s\n",
           command == "warm" ? "warmed" : "evicted", o.table, begin, at,
           Bytes(double(bytes)).c_str(), secs, Bytes(secs > 0 ? double(bytes) / secs : 0).c_str(),
           cancelled ? absl::StrFormat("; cancelled, rows [%u, %u) left", at, end).c_str() : "");
  }
  return cancelled ? 130 : kExitRunning;
}

}  // namespace

void AddWarmCommands(CLI::App& app, int* exit_code) {
  for (const char* name : {"warm", "evict"}) {
    auto o = std::make_shared<WarmOptions>();
    const std::string command = name;
    CLI::App* c = app.add_subcommand(
        name, command == "warm"
                  ? "Load a table (or --rows A:B of it) into the page cache; Ctrl-C cancels. "
                    "Only storage tables read through the page cache: resident, cache-tier and "
                    "O_DIRECT tables are refused, exit 1 (administrators only: exit 77 otherwise)"
                  : "Drop a table (or --rows A:B of it) from the page cache (administrators "
                    "only: exit 77 otherwise)");
    AddCommonOptions(c, &o->common);
    c->add_option("LAYER", o->table, "Layer id of the table")
        ->required()
        ->check(engram::cli::Integer(0, UINT32_MAX));
    c->add_option("--rows", o->rows, "Only rows A:B")
        ->type_name("A:B")
        ->check(engram::cli::Checked(
            [](const std::string& text) { return engram::ParseRowRange(text).status(); }));
    c->add_flag("-q,--quiet", o->quiet, "No progress bar or summary");
    c->callback([=] { *exit_code = RunWarm(*o, command); });
  }
}

}  // namespace engramctl
