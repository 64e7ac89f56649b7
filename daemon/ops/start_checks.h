// What a start warns of and then serves anyway, found by the functions the start runs, so that
// `engramd --check-config`, which runs the same ones, warns of the same in the same words: the
// metrics port, the textfile's directory, the row cache's files, a cache size with no cache.
//
//   for (const std::string& w : StartWarnings(settings, tables)) log::Warning("{}", w);
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/ops/config_file.h"
#include "tables/table.h"

namespace engram {

// A metrics port engramd could not open, as the start and a reload log it: "<why>; serving
// without the metrics port".
std::string WithoutMetricsPort(const absl::Status& why);

// --check-config: opens the metrics port (metrics.http_port, if set) as the start does and closes
// it again; the warning the start would log when it cannot (WithoutMetricsPort).
std::optional<std::string> CheckMetricsPort(const MetricsOptions& metrics);

// What the start warns of once the tables are open, each naming the setting and the path:
// metrics.textfile_dir missing or not writable; memory.cache set while no table is of the cache
// tier; with a cache-tier table, memory.hot_set_path in a directory that is missing or not
// writable and a memory.pressure_file that cannot be read as PSI (the store then runs without
// memory pressure: PressureFileWarned).
std::vector<std::string> StartWarnings(const DaemonSettings& settings,
                                       const std::vector<std::unique_ptr<Table>>& tables);

// Whether StartWarnings warned of memory.pressure_file: the start then builds the store without
// following memory pressure instead of saying so twice.
bool PressureFileWarned(const DaemonSettings& settings,
                        const std::vector<std::unique_ptr<Table>>& tables);

}  // namespace engram
