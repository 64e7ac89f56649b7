// engramd's Prometheus metrics (every `engram_*` family, docs/operations.md), rendered from
// what the server lets the operator side see. Thread-safe: the HTTP listener, the textfile
// writer and the `metrics` control command all call it.
#pragma once

#include <string>

#include "daemon/ops/server_view.h"

namespace engram {

std::string RenderMetrics(const ServerView& server, const std::string& version);

}  // namespace engram
