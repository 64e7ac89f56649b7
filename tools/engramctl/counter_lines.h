// Counters printed straight from their lists (engram/session_stats.h for sessions,
// protocol/store_counters.h for the row store), so that a counter added to a list shows in
// engramctl's text with no change here. Each prints as "label value": the label is its JSON key
// with spaces for underscores (less a trailing "_ns"), the value a duration for a key ending in
// _ns, a size for one ending in bytes, else a count.
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>

namespace engramctl {

struct CounterText {
  const char* key;  // JSON key
  bool grows;       // a COUNTER: shown with its rate when watched
};

// Sessions' counters as engramd reports them (ENGRAM_SESSION_COUNTERS on the wire, then
// ENGRAM_SESSION_DAEMON_COUNTERS).
std::span<const CounterText> SessionCounters();
// ENGRAM_ROW_CACHE_COUNTERS and ENGRAM_STORE_TABLE_COUNTERS.
std::span<const CounterText> RowCacheCounters();
std::span<const CounterText> StoreTableCounters();
// ENGRAM_MISS_CLASS_COUNTERS (the miss queue, one class).
std::span<const CounterText> MissClassCounters();

// "label value" of each counter of `counters` that `now` holds, comma-separated and wrapped at
// 80 columns, each line starting with `indent` and ending in a newline; with `before`, counters
// that grow add their rate over `seconds`. Empty when `now` holds none.
std::string CounterLines(std::span<const CounterText> counters, const nlohmann::json& now,
                         const nlohmann::json* before, double seconds, const std::string& indent);

}  // namespace engramctl
