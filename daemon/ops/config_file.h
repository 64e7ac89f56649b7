// engramd's configuration file: /etc/engramd/engramd.toml plus drop-ins in engramd.toml.d/*.toml
// (name order, later files override earlier ones key by key). Every key has a default, so an
// empty file is valid; an unknown key or a bad value is refused naming the file, line and key.
// docs/operations.md lists every key.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/server/server_config.h"
#include "store/store_config.h"

namespace engram {

inline constexpr char kDefaultConfigPath[] = "/etc/engramd/engramd.toml";

// Where the metrics go besides the socket.
struct MetricsOptions {
  uint32_t http_port = 0;  // 0: no HTTP listener
  std::string http_address = "127.0.0.1";
  std::string textfile_dir;  // empty: no node-exporter textfile
  uint32_t textfile_interval_s = 15;
};

// The settings as the file and the command line state them, before names are resolved (users,
// groups) and text is parsed (row range, socket mode). Command-line flags write into the same
// struct after the file, so a flag overrides the file.
struct DaemonSettings {
  ServerConfig server;  // socket path and group, layers, limits, workers, poll, check_holes
  std::vector<std::string> models;
  std::vector<std::string> tables;
  std::string rows;  // "A:B", empty: full tables
  std::vector<std::string> allow_users;
  std::vector<std::string> allow_groups;
  std::string socket_mode = "0660";
  std::string log_level = "info";
  std::string read_mode = "buffered";
  uint64_t spin_min_us = 20;
  uint64_t spin_max_us = 500;
  std::string poll_mode = "auto";  // engine.poll_mode: auto, on or off (PollCores)
  uint32_t poll_cores = 0;         // engine.poll_cores (0: PollCores' rule)
  uint32_t poll_idle_ms = 200;     // engine.poll_idle_ms
  // Benchmarking only (GatherEngineOptions::emulated_device): every O_DIRECT read completes no
  // sooner than this after its issue, and no faster than this many 4 KiB reads per second.
  uint64_t emulate_read_latency_us = 0;
  uint64_t emulate_read_iops = 0;
  MetricsOptions metrics;
  StoreConfig store;  // [memory]; its tiers come from default_tier and tiers (docs/row-store.md)
  std::string default_tier = "storage";  // [tables] tier
  std::vector<std::string> tiers;        // [tables] tiers: "LAYER=tier"
};

// One setting of engramd, defined once: its configuration-file key, its command-line flag, its
// help text, whether a SIGHUP applies a new value live and to what, where its value lives in
// DaemonSettings and how a value is checked. A row is constant data (settings_table.cc holds the
// rows, one table per section of the file). The file parser, engramd's flags (and --help), the
// SIGHUP reload (reload.h, Control::Reload), `engramctl config` and the check of
// docs/operations.md all read Settings(); the defaults are DaemonSettings' member initialisers,
// shown through DefaultText().
struct Setting {
  enum class Kind {
    kUint32,  // an integer in [min, max]
    kUint64,  // an integer in [min, max]
    kBytes,   // a byte size above 0 (uint64_t): an integer or "64M" (K, M, G, T: powers of 1024)
    kBytesOrZero,  // the same, where 0 means "none" or "unbounded"
    kString,       // text, checked by `check` when set
    kStrings,      // a list of text; a repeatable flag
    kIds,          // a list of integers in [min, max]; a repeatable (or comma-separated) flag
    kBool,         // true or false; the flag, if any, sets the opposite of the default
  };
  // Who takes a changed value at a SIGHUP. kRestart: nobody; the running daemon keeps its value
  // and the SIGHUP names the setting as needing a restart. The others are live: the reload copies
  // the row's new value into the settings in force (Copy) and the part named here takes it from
  // there, on the control thread, the only thread that reads these values:
  //   kServer: the server's handshake limits and access lists (its ServerConfig, `server_field`);
  //   kLog: the log level;
  //   kTextfile: the metrics textfile the watchdog writes (directory, interval).
  enum class Applies { kRestart, kServer, kLog, kTextfile };

  const char* key;   // "limits.max_clients"
  const char* flag;  // "--max-clients"; "" when only the file sets it
  const char* help;  // one line, for --help and the docs
  Kind kind;
  Applies applies;
  // Where the value lives (type as Kind says): `field` in DaemonSettings or, for a value of the
  // server's configuration, `server_field` alone, in ServerConfig (DaemonSettings::server). A
  // setting the server reads resolved has both: access.allow_users' names in `field`, the uids
  // engramd resolves them to in `server_field`, as std::vector<uint32_t>.
  void* (*field)(DaemonSettings*) = nullptr;
  void* (*server_field)(ServerConfig*) = nullptr;
  uint64_t min = 0;
  uint64_t max = UINT64_MAX;
  absl::Status (*check)(const std::string&) = nullptr;  // kString: the value's rules
  const char* flag_separator = "";  // kIds: a flag may list values with this separator
  const char* item = "";            // kIds: what one value is ("uid"), for messages
  // kString: a path, which the file must give absolute; a flag's relative path is taken from
  // the working directory.
  bool path = false;
  // kString, kStrings: a valid value other than the default (for kStrings, one element); kBytes,
  // kBytesOrZero: a size that passes the setting's own checks, where a step up from the default
  // would not. The reload test sets it to change the setting alone.
  const char* example = "";

  bool live() const { return applies != Applies::kRestart; }
  // The value's storage in *s (type as Kind says).
  void* At(DaemonSettings* s) const { return field ? field(s) : server_field(&s->server); }
  // The value as TOML text ("64M", "[]", "\"info\"", "true").
  std::string Text(const DaemonSettings& s) const;
  std::string DefaultText() const { return Text(DaemonSettings{}); }
  // Applies one value given as text (a flag's argument; a list setting appends it).
  absl::Status ApplyText(const std::string& text, DaemonSettings* s) const;
  // Empties a list setting (a flag replaces the file's list); no-op for others.
  void ClearList(DaemonSettings* s) const;
  // Whether `a` and `b` hold the same value of this setting.
  bool Same(const DaemonSettings& a, const DaemonSettings& b) const;
  // Sets this setting of *to to its value in `from`: the value, and the resolved value the
  // server reads where it has one of its own (access.allow_users: names and uids).
  void Copy(const DaemonSettings& from, DaemonSettings* to) const;
  // Sets the value the server reads (`server_field`) of *to to that of `from`; nothing for a
  // setting without one.
  void CopyServerValue(const ServerConfig& from, ServerConfig* to) const;
};

// Every setting, in the order of docs/operations.md.
const std::vector<Setting>& Settings();

// The setting of `key` ("limits.max_clients"); nullptr for a key Settings() does not have.
const Setting* FindSetting(const std::string& key);

// One tables.tiers entry: "LAYER=storage", "LAYER=resident" or "LAYER=cache".
absl::Status CheckTierEntry(const std::string& entry);

// Applies one TOML file onto *settings. InvalidArgument names "FILE:LINE: key 'a.b': why".
absl::Status ApplyConfigFile(const std::string& path, DaemonSettings* settings);

// Applies `path` (which may be missing only when `path` is the default) and then every
// `*.toml` of `path + ".d/"` in name order. *ret_files lists the files read, in order.
absl::Status LoadConfig(const std::string& path, bool must_exist, DaemonSettings* settings,
                        std::vector<std::string>* ret_files);

// Turns tables.tier and tables.tiers (text, as the file and flags set them) into
// settings->store's tiers. ApplyConfigFile does it; call it again after applying flags.
absl::Status ApplyTiers(DaemonSettings* settings);

// Every key the file accepts ("section.name"), sorted. docs/operations.md must list each one
// with its default and flag (daemon/tests/config_file_test.cc checks it).
std::vector<std::string> ConfigKeys();

// "1G", "512M", "4096" → bytes. InvalidArgument on anything else.
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);

}  // namespace engram
