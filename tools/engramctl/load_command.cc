// engramctl load: loads a resident table into the row store's memory (or resumes a load that was
// cancelled or failed), showing progress; Ctrl-C or `--cancel` stops it after the chunk in
// progress. The daemon's loader thread reads; gathers are served from storage for the rows not
// loaded yet, and from memory for the others, throughout.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/command_line.h"
#include "engram/row.h"
#include "tools/engramctl/commands.h"
#include "tools/engramctl/control_client.h"

namespace engramctl {
namespace {

using nlohmann::json;

std::atomic<bool> g_load_interrupted{false};

struct LoadOptions {
  CommonOptions common;
  uint32_t table = 0;
  bool cancel = false;
  bool no_wait = false;
  bool quiet = false;
};

void PrintState(const LoadOptions& o, const json& s, double seconds) {
  if (o.common.json) {
    json out = s;
    out["schema_version"] = 1;
    out["command"] = "load";
    out["seconds"] = seconds;
    printf("%s\n", out.dump(2).c_str());
    return;
  }
  if (o.quiet) return;
  const uint64_t done = s["rows_loaded"], rows = s["rows"];
  printf("layer %u: %s, %lu of %lu rows in memory (%s)%s\n", o.table,
         s["state"].get<std::string>().c_str(), done, rows,
         Bytes(double(s["bytes"].get<uint64_t>())).c_str(),
         s.contains("error") ? absl::StrCat("; ", s["error"].get<std::string>()).c_str() : "");
}

int RunLoad(const LoadOptions& o) {
  ControlError error;
  std::unique_ptr<ControlClient> client =
      ControlClient::Connect(o.common.socket, o.common.timeout_s, &error);
  if (client == nullptr) return Report(error, o.common.json);
  json state;
  const auto call = [&](const char* action) {
    return client->Call("load", json{{"table", o.table}, {"action", action}}, &state, &error);
  };
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  if (!call(o.cancel ? "cancel" : "start")) return Report(error, o.common.json);
  if (o.cancel || o.no_wait) {
    PrintState(o, state, seconds());
    return kExitRunning;
  }
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_load_interrupted = true; };
  sigaction(SIGINT, &sa, nullptr);
  const bool bar = !o.quiet && !o.common.json && isatty(STDERR_FILENO);
  const uint64_t first = state["rows_loaded"];
  bool cancel_sent = false;
  while (state["state"] == "queued" || state["state"] == "loading") {
    if (g_load_interrupted && !cancel_sent) {
      if (!call("cancel")) break;
      cancel_sent = true;  // the loader stops after its chunk; keep polling until it has
      continue;
    }
    if (bar) {
      const uint64_t done = state["rows_loaded"], rows = state["rows"];
      fprintf(stderr, "\r\033[K%s",
              ProgressLine(absl::StrFormat("load layer %u", o.table), done * ENGRAM_ROW_BYTES,
                           rows * ENGRAM_ROW_BYTES,
                           (done - std::min(done, first)) * ENGRAM_ROW_BYTES, seconds())
                  .c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (!call("status")) break;
  }
  if (bar) fputc('\n', stderr);
  if (!error.message.empty()) return Report(error, o.common.json);
  PrintState(o, state, seconds());
  if (state["state"] == "loaded") return kExitRunning;
  if (state["state"] == "cancelled") {
    if (!o.quiet && !o.common.json) {
      printf("the rows loaded stay in memory; `engramctl load %u` resumes\n", o.table);
    }
    return 130;
  }
  return kExitFailed;  // failed: the daemon's error is printed above
}

}  // namespace

void AddLoadCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<LoadOptions>();  // owned by the callback
  CLI::App* c = app.add_subcommand(
      "load",
      "Load a resident table into the row store's memory, or resume its load; Ctrl-C cancels "
      "(rows loaded stay; administrators only: exit 77 otherwise)");
  AddCommonOptions(c, &o->common);
  c->add_option("LAYER", o->table, "Layer id of a table of the resident tier")
      ->required()
      ->check(engram::cli::Integer(0, UINT32_MAX));
  c->add_flag("--cancel", o->cancel, "Stop the table's load after the chunk in progress");
  c->add_flag("--no-wait", o->no_wait, "Start the load and return at once");
  c->add_flag("-q,--quiet", o->quiet, "No progress bar or summary");
  c->callback([=] { *exit_code = RunLoad(*o); });
}

}  // namespace engramctl
