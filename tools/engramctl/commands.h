// The subcommands of engramctl. Each lives in its own <name>_command.cc and registers itself
// with the CLI11 app from main.cc; when it runs, it stores its exit status in *exit_code.
// The options a subcommand parses into are owned (shared_ptr) by its callback, which the app
// holds: they live as long as the app and no longer.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>

namespace engramctl {

// engramctl hash: DeepSeek-V4.1 Engram row ids of token ids (hash_command.cc).
void AddHashCommand(CLI::App& app, int* exit_code);

// engramctl status, stats, tables, clients, config, metrics (daemon_commands.cc).
void AddDaemonCommands(CLI::App& app, int* exit_code);
// engramctl warm, evict (warm_command.cc).
void AddWarmCommands(CLI::App& app, int* exit_code);
// engramctl load (load_command.cc).
void AddLoadCommand(CLI::App& app, int* exit_code);
// engramctl rows (rows_command.cc).
void AddRowsCommand(CLI::App& app, int* exit_code);

// The row store's lines in status, stats (per table) and tables (per table, each line ending in
// a newline) (store_lines.cc).
void PrintStoreStatus(const nlohmann::json& reply);
void PrintStoreTableStats(const nlohmann::json& table);
std::string StoreTableLines(const nlohmann::json& table);

}  // namespace engramctl
