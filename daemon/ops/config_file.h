// engramd's configuration file: /etc/engramd/engramd.toml plus drop-ins in engramd.toml.d/*.toml
// (name order, later files override earlier ones key by key). Every key has a default, so an
// empty file is valid; an unknown key or a bad value is refused naming the file, line and key.
// docs/operations.md lists every key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/server/server_config.h"
#include "daemon/store/store_config.h"

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
  MetricsOptions metrics;
  StoreConfig store;  // [tables] tier / tiers, [memory] (docs/row-store.md)
};

// Applies one TOML file onto *settings. InvalidArgument names "FILE:LINE: key 'a.b': why".
absl::Status ApplyConfigFile(const std::string& path, DaemonSettings* settings);

// Applies `path` (which may be missing only when `path` is the default) and then every
// `*.toml` of `path + ".d/"` in name order. *ret_files lists the files read, in order.
absl::Status LoadConfig(const std::string& path, bool must_exist, DaemonSettings* settings,
                        std::vector<std::string>* ret_files);

// "1G", "512M", "4096" → bytes. InvalidArgument on anything else.
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);

}  // namespace engram
