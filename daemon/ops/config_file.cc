// The TOML configuration file of engramd (config_file.h), read with toml++.
#include "daemon/ops/config_file.h"

#include <dirent.h>
#include <sys/stat.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <iterator>
#include <sstream>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "engram/protocol.h"

namespace engram {

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  std::string t = std::string(absl::StripAsciiWhitespace(text));
  uint64_t scale = 1;
  if (!t.empty()) {
    const char suffix = absl::ascii_toupper(t.back());
    const std::string units = "KMGT";
    if (size_t i = units.find(suffix); i != std::string::npos) {
      scale = uint64_t{1} << (10 * (i + 1));
      t.pop_back();
    } else if (suffix == 'B') {
      t.pop_back();
    }
  }
  uint64_t value = 0;
  if (t.empty() || !absl::SimpleAtoi(t, &value) || value > UINT64_MAX / scale) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s' is not a byte size (a number with an optional K, M, G or T)", text));
  }
  return value * scale;
}

namespace {

using Kind = Setting::Kind;

absl::Status OneOf(const std::string& v, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed) {
    if (v == a) return absl::OkStatus();
  }
  std::string list;
  for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  return absl::InvalidArgumentError(absl::StrFormat("'%s' is not one of %s", v, list));
}

absl::Status AbsolutePath(const std::string& v, bool may_be_empty) {
  if ((v.empty() && may_be_empty) || (!v.empty() && v[0] == '/')) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat("'%s' is not an absolute path", v));
}

// "64M" for 64 << 20: the largest unit that divides the size.
std::string ByteText(uint64_t bytes) {
  const char* units = "KMGT";
  int unit = -1;
  while (unit < 3 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return unit < 0 ? absl::StrFormat("%u", bytes) : absl::StrFormat("\"%u%c\"", bytes, units[unit]);
}

absl::Status CheckRange(const Setting& setting, uint64_t v) {
  if (v < setting.min || v > setting.max) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%u is outside [%u, %u]", v, setting.min, setting.max));
  }
  return absl::OkStatus();
}

template <typename T>
T& At(const Setting& setting, DaemonSettings* s) {
  return *static_cast<T*>(setting.field(s));
}

absl::Status ApplyTomlList(const Setting& setting, const toml::node& n, DaemonSettings* s) {
  const toml::array* a = n.as_array();
  const bool ids = setting.kind == Kind::kIds;
  if (a == nullptr) {
    return absl::InvalidArgumentError(
        ids ? absl::StrFormat("expected an array of %ss (integers %u to %u)", setting.item,
                              setting.min, setting.max)
            : "expected an array of strings");
  }
  // A later file replaces the list, it does not append.
  if (ids) {
    At<std::vector<uint32_t>>(setting, s).clear();
  } else {
    At<std::vector<std::string>>(setting, s).clear();
  }
  size_t index = 0;
  for (const toml::node& e : *a) {
    std::ostringstream shown;
    e.visit([&](const auto& value) { shown << value; });
    if (ids) {
      if (!e.is_integer() || *e.value<int64_t>() < 0 || !setting.ApplyText(shown.str(), s).ok()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "element %u, %s, is not a %s (an array of %ss, integers %u to %u)", index, shown.str(),
            setting.item, setting.item, setting.min, setting.max));
      }
    } else {
      absl::Status st = e.is_string() ? setting.ApplyText(*e.value<std::string>(), s)
                                      : absl::InvalidArgumentError("expected an array of strings");
      if (!st.ok()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("element %u, %s: %s", index, shown.str(), st.message()));
      }
    }
    ++index;
  }
  return absl::OkStatus();
}

// Applies a TOML value; scalars go through Setting::ApplyText, as flags do.
absl::Status ApplyToml(const Setting& setting, const toml::node& n, DaemonSettings* s) {
  switch (setting.kind) {
    case Kind::kUint32:
    case Kind::kUint64: {
      const auto v = n.value<int64_t>();
      if (!n.is_integer() || !v) return absl::InvalidArgumentError("expected an integer");
      if (*v < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%d is outside [%u, %u]", *v, setting.min, setting.max));
      }
      return setting.ApplyText(absl::StrFormat("%d", *v), s);
    }
    case Kind::kBytes:
    case Kind::kBytesOrZero:
      if (n.is_integer()) {
        if (*n.value<int64_t>() < 0) {
          return absl::InvalidArgumentError("a byte size cannot be negative");
        }
        return setting.ApplyText(absl::StrFormat("%d", *n.value<int64_t>()), s);
      }
      if (n.is_string()) return setting.ApplyText(*n.value<std::string>(), s);
      return absl::InvalidArgumentError("expected a byte count or a string such as \"1G\"");
    case Kind::kString:
      if (!n.is_string()) return absl::InvalidArgumentError("expected a string");
      return setting.ApplyText(*n.value<std::string>(), s);
    case Kind::kBool:
      if (!n.is_boolean()) return absl::InvalidArgumentError("expected true or false");
      At<bool>(setting, s) = *n.value<bool>();
      return absl::OkStatus();
    case Kind::kStrings:
    case Kind::kIds:
      return ApplyTomlList(setting, n, s);
  }
  return absl::OkStatus();
}

}  // namespace

std::string Setting::Text(const DaemonSettings& settings) const {
  auto* s = const_cast<DaemonSettings*>(&settings);
  switch (kind) {
    case Kind::kUint32:
      return absl::StrFormat("%u", At<uint32_t>(*this, s));
    case Kind::kUint64:
      return absl::StrFormat("%u", At<uint64_t>(*this, s));
    case Kind::kBytes:
    case Kind::kBytesOrZero:
      return ByteText(At<uint64_t>(*this, s));
    case Kind::kString:
      return "\"" + At<std::string>(*this, s) + "\"";
    case Kind::kBool:
      return At<bool>(*this, s) ? "true" : "false";
    case Kind::kStrings: {
      std::string out;
      for (const std::string& v : At<std::vector<std::string>>(*this, s)) {
        out += (out.empty() ? "\"" : ", \"") + v + "\"";
      }
      return "[" + out + "]";
    }
    case Kind::kIds: {
      std::string out;
      for (uint32_t v : At<std::vector<uint32_t>>(*this, s)) {
        out += (out.empty() ? "" : ", ") + std::to_string(v);
      }
      return "[" + out + "]";
    }
  }
  return "";
}

absl::Status Setting::ApplyText(const std::string& text, DaemonSettings* s) const {
  switch (kind) {
    case Kind::kUint32:
    case Kind::kUint64:
    case Kind::kIds: {
      uint64_t v = 0;
      if (!absl::SimpleAtoi(text, &v)) {
        return absl::InvalidArgumentError(absl::StrFormat("'%s' is not an integer", text));
      }
      if (absl::Status st = CheckRange(*this, v); !st.ok()) return st;
      if (kind == Kind::kUint32) {
        At<uint32_t>(*this, s) = static_cast<uint32_t>(v);
      } else if (kind == Kind::kUint64) {
        At<uint64_t>(*this, s) = v;
      } else {
        At<std::vector<uint32_t>>(*this, s).push_back(static_cast<uint32_t>(v));
      }
      return absl::OkStatus();
    }
    case Kind::kBytes:
    case Kind::kBytesOrZero: {
      absl::StatusOr<uint64_t> v = ParseByteSize(text);
      if (!v.ok()) return v.status();
      if (*v == 0 && kind == Kind::kBytes) return absl::InvalidArgumentError("must be above 0");
      At<uint64_t>(*this, s) = *v;
      return absl::OkStatus();
    }
    case Kind::kString:
      if (check) {
        if (absl::Status st = check(text); !st.ok()) return st;
      }
      At<std::string>(*this, s) = text;
      return absl::OkStatus();
    case Kind::kBool: {
      // A flag without a value sets the opposite of the default.
      DaemonSettings defaults;
      if (text.empty()) {
        At<bool>(*this, s) = !At<bool>(*this, &defaults);
      } else if (text == "true" || text == "false") {
        At<bool>(*this, s) = text == "true";
      } else {
        return absl::InvalidArgumentError(absl::StrFormat("'%s' is not true or false", text));
      }
      return absl::OkStatus();
    }
    case Kind::kStrings:
      if (check) {
        if (absl::Status st = check(text); !st.ok()) return st;
      }
      At<std::vector<std::string>>(*this, s).push_back(text);
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

void Setting::ClearList(DaemonSettings* s) const {
  if (kind == Kind::kStrings) At<std::vector<std::string>>(*this, s).clear();
  if (kind == Kind::kIds) At<std::vector<uint32_t>>(*this, s).clear();
}

namespace {

// Calls fn(&value) with this setting's value in *s, typed as its Kind stores it.
template <typename Fn>
void VisitValue(const Setting& setting, DaemonSettings* s, Fn&& fn) {
  switch (setting.kind) {
    case Kind::kUint32:
      return fn(&At<uint32_t>(setting, s));
    case Kind::kUint64:
    case Kind::kBytes:
    case Kind::kBytesOrZero:
      return fn(&At<uint64_t>(setting, s));
    case Kind::kString:
      return fn(&At<std::string>(setting, s));
    case Kind::kStrings:
      return fn(&At<std::vector<std::string>>(setting, s));
    case Kind::kIds:
      return fn(&At<std::vector<uint32_t>>(setting, s));
    case Kind::kBool:
      return fn(&At<bool>(setting, s));
  }
}

}  // namespace

bool Setting::Same(const DaemonSettings& a, const DaemonSettings& b) const {
  bool same = false;
  VisitValue(*this, const_cast<DaemonSettings*>(&a), [&](auto* value) {
    using T = std::remove_pointer_t<decltype(value)>;
    same = *value == At<T>(*this, const_cast<DaemonSettings*>(&b));
  });
  return same;
}

void Setting::Copy(const DaemonSettings& from, DaemonSettings* to) const {
  VisitValue(*this, to, [&](auto* value) {
    using T = std::remove_pointer_t<decltype(value)>;
    *value = At<T>(*this, const_cast<DaemonSettings*>(&from));
  });
}

// One tables.tiers entry: "LAYER=storage", "LAYER=resident" or "LAYER=cache".
absl::Status CheckTierEntry(const std::string& v) {
  const size_t eq = v.find('=');
  uint32_t layer = 0;
  if (eq == std::string::npos || !absl::SimpleAtoi(v.substr(0, eq), &layer) ||
      !ParseTier(v.substr(eq + 1))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s' is not LAYER=storage, LAYER=resident or LAYER=cache", v));
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckFileMode(const std::string& v) {
  char* end = nullptr;
  const unsigned long mode = strtoul(v.c_str(), &end, 8);
  if (v.empty() || *end != '\0' || mode > 07777) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s' is not an octal file mode such as \"0660\"", v));
  }
  return absl::OkStatus();
}

absl::Status CheckLoopback(const std::string& v) {
  if (v != "127.0.0.1" && v != "::1" && v != "localhost") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' is not a loopback address (127.0.0.1, ::1 or localhost); the metrics port is never "
        "exposed beyond the node",
        v));
  }
  return absl::OkStatus();
}

// "error, warning, notice, info or debug", from log::kLevelNames.
std::string LevelList() {
  std::string out;
  const size_t n = std::size(log::kLevelNames);
  for (size_t i = 0; i < n; ++i) {
    out += (i == 0 ? "" : i + 1 == n ? " or " : ", ") + std::string(log::kLevelNames[i].name);
  }
  return out;
}

absl::Status CheckLevel(const std::string& v) {
  if (log::ParseLevel(v)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat("'%s' is not one of %s", v, LevelList()));
}

const std::string& LevelHelp() {
  static const std::string* help =
      new std::string("Least important messages logged: " + LevelList());
  return *help;
}

}  // namespace

// Every setting of engramd, once: its key, flag, help, kind, whether SIGHUP applies it, field
// and check. One table rather than code, so it is one piece however long it grows; the config
// file, --help, reload and docs/operations.md (checked by a test) all read it.
const std::vector<Setting>& Settings() {
  using S = DaemonSettings;
  constexpr Setting::Reload kLive = Setting::Reload::kLive;
  constexpr Setting::Reload kRestart = Setting::Reload::kRestart;
  static const auto* settings = new std::vector<Setting>{
      {.key = "tables.models",
       .flag = "--model",
       .help = "Checkpoint directory; every Engram table in it is served",
       .kind = Kind::kStrings,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->models; },
       .example = "/srv/engram/model"},
      {.key = "tables.files",
       .flag = "--table",
       .help = "A packed table file (or a checkpoint directory)",
       .kind = Kind::kStrings,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->tables; },
       .example = "/srv/engram/layer-14.engram"},
      {.key = "tables.rows",
       .flag = "--rows",
       .help = "Per-rank copy: the rows A:B the sources hold (others are refused)",
       .kind = Kind::kString,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->rows; },
       .check = [](const std::string& v) -> absl::Status {
         if (v.empty()) return absl::OkStatus();
         absl::StatusOr<RowRange> r = ParseRowRange(v);
         return r.ok() ? absl::OkStatus() : r.status();
       },
       .example = "0:1000000"},
      {.key = "tables.layers",
       .flag = "--layers",
       .help = "Serve only these layer ids (empty: all)",
       .kind = Kind::kIds,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->server.layers; },
       .max = UINT32_MAX,
       .flag_separator = ",",
       .item = "layer id"},
      {"tables.check_holes", "--no-check-holes",
       "Do not check sparse copies for holes in the rows they claim", Kind::kBool, kRestart,
       [](S* s) -> void* { return &s->server.check_holes; }},
      {.key = "tables.read_mode",
       .flag = "--read-mode",
       .help = "buffered (page cache, RWF_NOWAIT fast path) or direct (O_DIRECT, for tables much "
               "larger than RAM)",
       .kind = Kind::kString,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->read_mode; },
       .check =
           [](const std::string& v) {
             return OneOf(v, {"buffered", "direct"});
           },
       .example = "direct"},
      {.key = "tables.tier",
       .flag = "--default-tier",
       .help = "Tier of the tables tables.tiers does not name: storage, resident or cache "
               "(docs/row-store.md)",
       .kind = Kind::kString,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->default_tier; },
       .check =
           [](const std::string& v) {
             return OneOf(v, {"storage", "resident", "cache"});
           },
       .example = "resident"},
      {.key = "tables.tiers",
       .flag = "--tier",
       .help = "A table's tier, LAYER=storage|resident|cache (repeatable)",
       .kind = Kind::kStrings,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->tiers; },
       .check = CheckTierEntry,
       .example = "14=resident"},
      {.key = "memory.budget",
       .flag = "--memory-budget",
       .help = "Bytes engramd may hold in all: its process, buffers, client arenas, page cache and "
               "the row store (0: unbounded); the service's memory limits derive from it",
       .kind = Kind::kBytesOrZero,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->store.budget_bytes; },
       .example = "1G"},
      {"memory.cache", "--cache-bytes", "Size of the row cache (0: what the budget leaves)",
       Kind::kBytesOrZero, kRestart, [](S* s) -> void* { return &s->store.cache_bytes; }},
      {"memory.pressure", "--no-memory-pressure",
       "Do not shrink the row cache under memory pressure (PSI)", Kind::kBool, kRestart,
       [](S* s) -> void* { return &s->store.pressure; }},
      {.key = "memory.pressure_file",
       .flag = "--pressure-file",
       .help = "PSI file the row cache follows (empty: the cgroup's memory.pressure, else "
               "/proc/pressure/memory)",
       .kind = Kind::kString,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->store.pressure_file; },
       .path = true,
       .example = "/sys/fs/cgroup/engram.slice/memory.pressure"},
      {"memory.pressure_interval_ms", "--pressure-interval",
       "Milliseconds between two samples of memory pressure (10..60000)", Kind::kUint32, kRestart,
       [](S* s) -> void* { return &s->store.pressure_interval_ms; }, 10, 60000},
      {"memory.huge_pages", "--no-huge-pages",
       "Do not put resident tables on 2 MiB pages even where the kernel has them to give",
       Kind::kBool, kRestart, [](S* s) -> void* { return &s->store.huge_pages; }},
      {"memory.load_at_start", "--no-load-at-start",
       "Do not load resident tables at start; `engramctl load` does (storage serves until then)",
       Kind::kBool, kRestart, [](S* s) -> void* { return &s->store.load_at_start; }},
      {"memory.load_rate", "--load-rate",
       "Bytes per second a resident table's load may read (0: no limit), so that loading beside "
       "serving leaves the disk to the misses",
       Kind::kBytesOrZero, kRestart, [](S* s) -> void* { return &s->store.load_rate_bytes_per_s; }},
      {.key = "memory.hot_set_path",
       .flag = "--hot-set-path",
       .help = "File the row cache's hot set (row ids) is written to, periodically and at stop, "
               "and warmed from in the background after a start that did not keep the cache "
               "(empty: none)",
       .kind = Kind::kString,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->server.hot_set_path; },
       .path = true,
       .example = "/var/lib/engramd/hot-set"},
      {"memory.hot_set_interval_seconds", "--hot-set-interval",
       "Seconds between writes of the hot set (0: only at stop)", Kind::kUint32, kRestart,
       [](S* s) -> void* { return &s->server.hot_set_interval_s; }, 0, 86400},
      {"memory.hot_set_rows", "", "Rows the hot set keeps at most (8 bytes each)", Kind::kUint64,
       kRestart, [](S* s) -> void* { return &s->server.hot_set_rows; }, 1, uint64_t{1} << 30},
      {.key = "memory.miss_depth",
       .flag = "--miss-depth",
       .help = "Device reads of cache-tier misses in flight past which prefill and prefetch "
               "misses wait (decode steps' go at once, first); about the queue depth at which "
               "the device reaches its read rate",
       .kind = Kind::kUint32,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->store.miss_depth; },
       .min = 1,
       .max = 4096},
      {.key = "socket.path",
       .flag = "--socket",
       .help = "Unix socket to listen on",
       .kind = Kind::kString,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->server.socket_path; },
       .check = [](const std::string& v) { return AbsolutePath(v, false); },
       .path = true,
       .example = "/run/engramd-b/engramd.sock"},
      {.key = "socket.mode",
       .flag = "--socket-mode",
       .help = "File mode of the socket (octal)",
       .kind = Kind::kString,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->socket_mode; },
       .check = CheckFileMode,
       .example = "0600"},
      {.key = "socket.group",
       .flag = "--socket-group",
       .help = "Group owning the socket (empty: the daemon's group)",
       .kind = Kind::kString,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->server.socket_group; },
       .example = "engram"},
      {.key = "access.allow_users",
       .flag = "--allow-uid",
       .help = "User (name or uid) allowed to connect besides root and engramd's own uid, "
               "which always are; repeatable",
       .kind = Kind::kStrings,
       .reload = kLive,
       .field = [](S* s) -> void* { return &s->allow_users; },
       .example = "root"},
      {.key = "access.allow_groups",
       .flag = "--allow-gid",
       .help = "Group (name or gid) whose members may connect (root and engramd's own uid "
               "always may); repeatable",
       .kind = Kind::kStrings,
       .reload = kLive,
       .field = [](S* s) -> void* { return &s->allow_groups; },
       .example = "root"},
      {.key = "access.admin_uids",
       .flag = "--admin-uid",
       .help = "uid that may also run warm and evict (root and engramd's own uid always may); "
               "repeatable",
       .kind = Kind::kIds,
       .reload = kLive,
       .field = [](S* s) -> void* { return &s->server.admin_uids; },
       .max = kMaxId,
       .item = "uid"},
      {.key = "access.admin_gids",
       .flag = "--admin-gid",
       .help = "gid whose members may run warm and evict; repeatable",
       .kind = Kind::kIds,
       .reload = kLive,
       .field = [](S* s) -> void* { return &s->server.admin_gids; },
       .max = kMaxId,
       .item = "gid"},
      {"limits.max_clients", "--max-clients", "Sessions at once", Kind::kUint32, kLive,
       [](S* s) -> void* { return &s->server.limits.max_clients; }, 1, 65536},
      {"limits.max_inflight", "--max-inflight", "Requests in flight per session", Kind::kUint32,
       kRestart, [](S* s) -> void* { return &s->server.limits.max_inflight; }, 1, ENGRAM_MAX_SLOTS},
      {"limits.max_rows_per_request", "--max-rows-per-request", "Rows in one request",
       Kind::kUint64, kRestart,
       [](S* s) -> void* { return &s->server.limits.max_rows_per_request; }, 1, uint64_t{1} << 32},
      {"limits.max_arena_bytes", "--max-arena-bytes",
       "Data region of one session (bytes; K/M/G suffixes)", Kind::kBytes, kLive,
       [](S* s) -> void* { return &s->server.limits.max_arena_bytes; }},
      {"limits.max_total_arena_bytes", "--max-total-arena-bytes", "Arenas of all sessions together",
       Kind::kBytes, kLive, [](S* s) -> void* { return &s->server.limits.max_total_arena_bytes; }},
      {"limits.default_data_bytes", "",
       "Data region of a session whose client asks for the default (0)", Kind::kBytes, kLive,
       [](S* s) -> void* { return &s->server.limits.default_data_bytes; }},
      {"limits.default_slots", "", "Request slots of a session whose client asks for the default",
       Kind::kUint32, kLive, [](S* s) -> void* { return &s->server.limits.default_slots; }, 1,
       ENGRAM_MAX_SLOTS},
      {"limits.prefetch_queue_rows", "--prefetch-queue-rows",
       "Rows queued for prefetch, all sessions together (a full queue drops its oldest rows, "
       "counted; 0: prefetch off)",
       Kind::kUint64, kRestart, [](S* s) -> void* { return &s->server.limits.prefetch_queue_rows; },
       0, uint64_t{1} << 28},
      {"limits.prefetch_session_rows", "--prefetch-session-rows",
       "Rows one session may have waiting for prefetch, from submission until they are worked "
       "on or dropped (a PREFETCH past it is refused: RESOURCE_EXHAUSTED)",
       Kind::kUint64, kRestart,
       [](S* s) -> void* { return &s->server.limits.prefetch_session_rows; }, 1,
       uint64_t{1} << 28},
      {"limits.max_device_sessions", "--max-device-sessions",
       "Sessions that may submit from a device (ENGRAM_CONNECT_DEVICE_SUBMIT) at once; only "
       "administrators may open one (0: none)",
       Kind::kUint32, kLive, [](S* s) -> void* { return &s->server.limits.max_device_sessions; },
       0, 65536},
      {"engine.workers", "--workers", "Gather workers (0: one per CPU)", Kind::kUint32, kRestart,
       [](S* s) -> void* { return &s->server.workers; }, 0, 1024},
      {"engine.request_threads", "--request-threads",
       "Requests gathered at the same time (0: half the CPUs, 2 to 32); requests larger than a "
       "decode step run on a separate pool of half as many",
       Kind::kUint32, kRestart, [](S* s) -> void* { return &s->server.request_threads; }, 0, 1024},
      {"engine.poll_spin_min_us", "--poll-spin-min-us", "Shortest polling spell before sleeping",
       Kind::kUint64, kRestart, [](S* s) -> void* { return &s->spin_min_us; }, 0, 10'000'000},
      {"engine.poll_spin_max_us", "--poll-spin-max-us", "Longest polling spell before sleeping",
       Kind::kUint64, kRestart, [](S* s) -> void* { return &s->spin_max_us; }, 0, 10'000'000},
      {"engine.pace", "--pace",
       "Wake the poller and two request threads ahead of regularly paced requests (spins CPU)",
       Kind::kBool, kRestart, [](S* s) -> void* { return &s->server.poll.pace; }},
      {.key = "engine.poll_mode",
       .flag = "--poll-mode",
       .help = "Polling mode: while clients are active, the poller and engine.poll_cores - 1 "
               "request threads spin instead of sleeping (spins CPU): on, off, or auto (on from "
               "16 CPUs up)",
       .kind = Kind::kString,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->poll_mode; },
       .check = [](const std::string& v) { return OneOf(v, {"auto", "on", "off"}); },
       .example = "on"},
      {"engine.poll_cores", "--poll-cores",
       "Cores that spin in polling mode, the poller's included (0: an eighth of the CPUs, at "
       "least 2)",
       Kind::kUint32, kRestart, [](S* s) -> void* { return &s->poll_cores; }, 0, 1024},
      {"engine.poll_idle_ms", "--poll-idle-ms",
       "Polling mode: clients are active until this long after the last request",
       Kind::kUint32, kRestart, [](S* s) -> void* { return &s->poll_idle_ms; }, 1, 60'000},
      {"engine.emulate_read_latency_us", "--emulate-read-latency-us",
       "BENCHMARKING ONLY: every O_DIRECT read (row cache misses, tables.read_mode = direct) "
       "completes no sooner than this after it was issued (0: off)",
       Kind::kUint64, kRestart, [](S* s) -> void* { return &s->emulate_read_latency_us; }, 0,
       10'000'000},
      {"engine.emulate_read_iops", "--emulate-read-iops",
       "BENCHMARKING ONLY: O_DIRECT reads, all threads together, complete no faster than this "
       "many 4 KiB reads per second (0: off)",
       Kind::kUint64, kRestart, [](S* s) -> void* { return &s->emulate_read_iops; }, 0,
       100'000'000},
      {"engine.inline_rows", "--inline-rows",
       "Gather requests of up to this many rows on the polling thread", Kind::kUint64, kRestart,
       [](S* s) -> void* { return &s->server.poll.inline_rows; }, 0, uint64_t{1} << 32},
      {.key = "log.level",
       .flag = "--log-level",
       .help = LevelHelp().c_str(),
       .kind = Kind::kString,
       .reload = kLive,
       .field = [](S* s) -> void* { return &s->log_level; },
       .check = CheckLevel,
       .example = "debug"},
      {"metrics.http_port", "--metrics-port",
       "Serve Prometheus metrics on this loopback TCP port (0: off)", Kind::kUint32, kRestart,
       [](S* s) -> void* { return &s->metrics.http_port; }, 0, 65535},
      {.key = "metrics.http_address",
       .flag = "",
       .help = "Loopback address of the metrics port",
       .kind = Kind::kString,
       .reload = kRestart,
       .field = [](S* s) -> void* { return &s->metrics.http_address; },
       .check = CheckLoopback,
       .example = "::1"},
      {.key = "metrics.textfile_dir",
       .flag = "--metrics-textfile-dir",
       .help = "Write engramd.prom for node-exporter's textfile collector into this directory",
       .kind = Kind::kString,
       .reload = kLive,
       .field = [](S* s) -> void* { return &s->metrics.textfile_dir; },
       .check = [](const std::string& v) { return AbsolutePath(v, true); },
       .path = true,
       .example = "/var/lib/prometheus/node-exporter"},
      {"metrics.textfile_interval_seconds", "", "Seconds between textfile writes", Kind::kUint32,
       kLive, [](S* s) -> void* { return &s->metrics.textfile_interval_s; }, 1, 3600},
  };
  return *settings;
}

namespace {

const Setting* FindSetting(const std::string& key) {
  for (const Setting& s : Settings()) {
    if (key == s.key) return &s;
  }
  return nullptr;
}

absl::Status Walk(const std::string& path, const toml::table& table, const std::string& prefix,
                  DaemonSettings* settings) {
  for (const auto& [key, node] : table) {
    const std::string name =
        prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    const auto line = node.source().begin.line;
    if (const toml::table* sub = node.as_table(); sub != nullptr && prefix.empty()) {
      if (absl::Status s = Walk(path, *sub, name, settings); !s.ok()) return s;
      continue;
    }
    const Setting* setting = FindSetting(name);
    if (setting == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%u: unknown key '%s' (docs/operations.md lists every key)", path, line, name));
    }
    if (absl::Status s = ApplyToml(*setting, node, settings); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%u: key '%s': %s", path, line, name, s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> ConfigKeys() {
  std::vector<std::string> keys;
  for (const Setting& s : Settings()) keys.push_back(s.key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

absl::Status ApplyConfigFile(const std::string& path, DaemonSettings* settings) {
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const std::string why(e.description());
    if (e.source().begin.line == 0) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: %s", path, why));
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("%s:%u: %s", path, e.source().begin.line, why));
  }
  if (absl::Status s = Walk(path, table, "", settings); !s.ok()) return s;
  return ApplyTiers(settings);
}

absl::Status ApplyTiers(DaemonSettings* settings) {
  StoreConfig& store = settings->store;
  store.default_tier = *ParseTier(settings->default_tier);  // checked when it was set
  store.tiers.clear();
  for (const std::string& entry : settings->tiers) {
    if (absl::Status s = CheckTierEntry(entry); !s.ok()) return s;
    const size_t eq = entry.find('=');
    uint32_t layer = 0;
    (void)absl::SimpleAtoi(entry.substr(0, eq), &layer);
    store.tiers[layer] = *ParseTier(entry.substr(eq + 1));
  }
  return absl::OkStatus();
}

absl::Status LoadConfig(const std::string& path, bool must_exist, DaemonSettings* settings,
                        std::vector<std::string>* ret_files) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrFormat("%s is not a regular file", path));
    }
    if (absl::Status s = ApplyConfigFile(path, settings); !s.ok()) return s;
    ret_files->push_back(path);
  } else if (errno != ENOENT || must_exist) {
    return absl::NotFoundError(
        absl::StrFormat("cannot read configuration file %s: %s", path, strerror(errno)));
  }
  const std::string dropins = path + ".d";
  DIR* dir = opendir(dropins.c_str());
  if (dir == nullptr) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot list drop-in directory %s: %s", dropins, strerror(errno)));
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.size() > 5 && absl::EndsWith(name, ".toml") && name[0] != '.') names.push_back(name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string file = dropins + "/" + name;
    if (absl::Status s = ApplyConfigFile(file, settings); !s.ok()) return s;
    ret_files->push_back(file);
  }
  return absl::OkStatus();
}

}  // namespace engram
