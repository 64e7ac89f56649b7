// Counter lines from the counter lists (counter_lines.h).
#include "tools/engramctl/counter_lines.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "engram/session_stats.h"
#include "protocol/store_counters.h"
#include "tools/engramctl/control_client.h"

namespace engramctl {
namespace {

using nlohmann::json;

#define ENGRAMCTL_GROWS_COUNTER true
#define ENGRAMCTL_GROWS_GAUGE false

constexpr CounterText kSessionCounters[] = {
#define ENGRAMCTL_SESSION_(field, origin, type, metric, help) \
  ENGRAM_SESSION_ON_WIRE_##origin({#field, ENGRAMCTL_GROWS_##type}, )
    ENGRAM_SESSION_COUNTERS(ENGRAMCTL_SESSION_) ENGRAM_SESSION_DAEMON_COUNTERS(ENGRAMCTL_SESSION_)
#undef ENGRAMCTL_SESSION_
};

constexpr CounterText kRowCacheCounters[] = {
#define ENGRAMCTL_CACHE_(field, json_key, type, metric, help) {json_key, ENGRAMCTL_GROWS_##type},
    ENGRAM_ROW_CACHE_COUNTERS(ENGRAMCTL_CACHE_)
#undef ENGRAMCTL_CACHE_
};

constexpr CounterText kStoreTableCounters[] = {
#define ENGRAMCTL_TABLE_(field, json_key, tiers, type, metric, help) \
  {json_key, ENGRAMCTL_GROWS_##type},
    ENGRAM_STORE_TABLE_COUNTERS(ENGRAMCTL_TABLE_)
#undef ENGRAMCTL_TABLE_
};

constexpr CounterText kMissClassCounters[] = {
#define ENGRAMCTL_MISS_(field, json_key, type, metric, help) {json_key, ENGRAMCTL_GROWS_##type},
    ENGRAM_MISS_CLASS_COUNTERS(ENGRAMCTL_MISS_)
#undef ENGRAMCTL_MISS_
};

bool EndsWith(std::string_view s, std::string_view end) {
  return s.size() >= end.size() && s.substr(s.size() - end.size()) == end;
}

// "latency p50 1.2 ms", "bytes 3.0 MiB (1.0 MiB/s)", "doorbells 12 (3/s)".
std::string CounterText1(const CounterText& c, const json& now, const json* before,
                         double seconds) {
  const std::string_view key = c.key;
  const bool duration = EndsWith(key, "_ns");
  const bool bytes = EndsWith(key, "bytes");
  std::string label(duration ? key.substr(0, key.size() - 3) : key);
  std::replace(label.begin(), label.end(), '_', ' ');
  const uint64_t v = now[c.key].get<uint64_t>();
  std::string text = label + " " +
                     (duration ? Duration(v)
                      : bytes  ? Bytes(double(v))
                               : std::to_string(v));
  if (c.grows && before != nullptr && seconds > 0 && before->contains(c.key) &&
      (*before)[c.key].is_number_unsigned()) {
    const uint64_t b = (*before)[c.key].get<uint64_t>();
    const double rate = double(v - std::min(v, b)) / seconds;
    text += bytes ? absl::StrFormat(" (%s/s)", Bytes(rate)) : absl::StrFormat(" (%.0f/s)", rate);
  }
  return text;
}

}  // namespace

std::span<const CounterText> SessionCounters() { return kSessionCounters; }
std::span<const CounterText> RowCacheCounters() { return kRowCacheCounters; }
std::span<const CounterText> MissClassCounters() { return kMissClassCounters; }
std::span<const CounterText> StoreTableCounters() { return kStoreTableCounters; }

std::string CounterLines(std::span<const CounterText> counters, const json& now, const json* before,
                         double seconds, const std::string& indent) {
  constexpr size_t kColumns = 80;  // a terminal's width
  std::string out, line;
  for (const CounterText& c : counters) {
    if (!now.contains(c.key) || !now[c.key].is_number_unsigned()) continue;
    const std::string item = CounterText1(c, now, before, seconds);
    if (!line.empty() && line.size() + 2 + item.size() + 1 > kColumns) {
      out += line + ",\n";
      line.clear();
    }
    line += line.empty() ? indent + item : ", " + item;
  }
  return line.empty() ? out : out + line + "\n";
}

}  // namespace engramctl
