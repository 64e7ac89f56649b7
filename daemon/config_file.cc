// The TOML configuration file of engramd (config_file.h), read with toml++.
#include "daemon/config_file.h"

#include <dirent.h>
#include <sys/stat.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
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

// One key the file may set: how to apply a TOML value to the settings.
using Setter = std::function<absl::Status(const toml::node&, DaemonSettings*)>;

absl::Status TypeError(const char* want) {
  return absl::InvalidArgumentError(absl::StrFormat("expected %s", want));
}

Setter Uint(std::function<void(DaemonSettings*, uint64_t)> set, uint64_t min, uint64_t max) {
  return [=](const toml::node& n, DaemonSettings* s) -> absl::Status {
    const auto v = n.value<int64_t>();
    if (!n.is_integer() || !v) return TypeError("an integer");
    if (*v < 0 || static_cast<uint64_t>(*v) < min || static_cast<uint64_t>(*v) > max) {
      return absl::InvalidArgumentError(absl::StrFormat("%d is outside [%u, %u]", *v, min, max));
    }
    set(s, static_cast<uint64_t>(*v));
    return absl::OkStatus();
  };
}

Setter Bytes(std::function<void(DaemonSettings*, uint64_t)> set) {
  return [=](const toml::node& n, DaemonSettings* s) -> absl::Status {
    uint64_t bytes = 0;
    if (n.is_integer()) {
      const int64_t v = *n.value<int64_t>();
      if (v < 0) return absl::InvalidArgumentError("a byte size cannot be negative");
      bytes = static_cast<uint64_t>(v);
    } else if (n.is_string()) {
      absl::StatusOr<uint64_t> parsed = ParseByteSize(*n.value<std::string>());
      if (!parsed.ok()) return parsed.status();
      bytes = *parsed;
    } else {
      return TypeError("a byte count or a string such as \"1G\"");
    }
    if (bytes == 0) return absl::InvalidArgumentError("must be above 0");
    set(s, bytes);
    return absl::OkStatus();
  };
}

Setter String(std::function<absl::Status(DaemonSettings*, const std::string&)> set) {
  return [=](const toml::node& n, DaemonSettings* s) -> absl::Status {
    if (!n.is_string()) return TypeError("a string");
    return set(s, *n.value<std::string>());
  };
}

Setter Strings(std::vector<std::string> DaemonSettings::*field) {
  return [=](const toml::node& n, DaemonSettings* s) -> absl::Status {
    const toml::array* a = n.as_array();
    if (a == nullptr) return TypeError("an array of strings");
    std::vector<std::string> out;
    for (const toml::node& e : *a) {
      if (!e.is_string()) return TypeError("an array of strings");
      out.push_back(*e.value<std::string>());
    }
    s->*field = std::move(out);  // a later file replaces the list, it does not append
    return absl::OkStatus();
  };
}

// An array of numeric uids or gids (`what`: "uid" or "gid"). Numbers, not names: the check
// runs on every control request and must not depend on the name service being up.
Setter Ids(std::vector<uint32_t> ServerConfig::*field, const char* what) {
  return [=](const toml::node& n, DaemonSettings* s) -> absl::Status {
    const toml::array* a = n.as_array();
    if (a == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("expected an array of %ss (integers 0 to %u)", what, kMaxId));
    }
    std::vector<uint32_t> ids;
    size_t index = 0;
    for (const toml::node& e : *a) {
      const auto v = e.value<int64_t>();
      if (!e.is_integer() || !v) {
        std::ostringstream shown;
        e.visit([&](const auto& value) { shown << value; });
        return absl::InvalidArgumentError(
            absl::StrFormat("element %u, %s, is not a %s (an integer 0 to %u; `id -u NAME` "
                            "gives a user's)",
                            index, shown.str(), what, kMaxId));
      }
      if (*v < 0 || *v > int64_t{kMaxId}) {
        return absl::InvalidArgumentError(
            absl::StrFormat("element %u, %d, is not a %s (0 to %u)", index, *v, what, kMaxId));
      }
      ids.push_back(static_cast<uint32_t>(*v));
      ++index;
    }
    s->server.*field = std::move(ids);  // a later file replaces the list, it does not append
    return absl::OkStatus();
  };
}

Setter Bool(std::function<void(DaemonSettings*, bool)> set) {
  return [=](const toml::node& n, DaemonSettings* s) -> absl::Status {
    if (!n.is_boolean()) return TypeError("true or false");
    set(s, *n.value<bool>());
    return absl::OkStatus();
  };
}

absl::Status OneOf(const std::string& v, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed) {
    if (v == a) return absl::OkStatus();
  }
  std::string list;
  for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  return absl::InvalidArgumentError(absl::StrFormat("'%s' is not one of %s", v, list));
}

const std::map<std::string, Setter>& Keys() {
  static const auto* keys = new std::map<std::string, Setter>{
      {"tables.models", Strings(&DaemonSettings::models)},
      {"tables.files", Strings(&DaemonSettings::tables)},
      {"tables.rows", String([](DaemonSettings* s, const std::string& v) -> absl::Status {
         if (!v.empty()) {
           if (absl::StatusOr<RowRange> r = ParseRowRange(v); !r.ok()) return r.status();
         }
         s->rows = v;
         return absl::OkStatus();
       })},
      {"tables.layers",
       [](const toml::node& n, DaemonSettings* s) -> absl::Status {
         const toml::array* a = n.as_array();
         if (a == nullptr) return TypeError("an array of layer ids");
         std::vector<uint32_t> layers;
         for (const toml::node& e : *a) {
           const auto v = e.value<int64_t>();
           if (!e.is_integer() || *v < 0 || *v > UINT32_MAX) {
             return TypeError("an array of layer ids (non-negative integers)");
           }
           layers.push_back(static_cast<uint32_t>(*v));
         }
         s->server.layers = std::move(layers);
         return absl::OkStatus();
       }},
      {"tables.check_holes", Bool([](DaemonSettings* s, bool v) { s->server.check_holes = v; })},
      {"tables.read_mode", String([](DaemonSettings* s, const std::string& v) -> absl::Status {
         if (absl::Status st = OneOf(v, {"buffered", "direct"}); !st.ok()) return st;
         s->read_mode = v;
         return absl::OkStatus();
       })},
      {"socket.path", String([](DaemonSettings* s, const std::string& v) -> absl::Status {
         if (v.empty() || v[0] != '/') {
           return absl::InvalidArgumentError(absl::StrFormat("'%s' is not an absolute path", v));
         }
         s->server.socket_path = v;
         return absl::OkStatus();
       })},
      {"socket.mode", String([](DaemonSettings* s, const std::string& v) -> absl::Status {
         char* end = nullptr;
         const unsigned long mode = strtoul(v.c_str(), &end, 8);
         if (v.empty() || *end != '\0' || mode > 07777) {
           return absl::InvalidArgumentError(
               absl::StrFormat("'%s' is not an octal file mode such as \"0660\"", v));
         }
         s->socket_mode = v;
         return absl::OkStatus();
       })},
      {"socket.group", String([](DaemonSettings* s, const std::string& v) -> absl::Status {
         s->server.socket_group = v;
         return absl::OkStatus();
       })},
      {"access.allow_users", Strings(&DaemonSettings::allow_users)},
      {"access.allow_groups", Strings(&DaemonSettings::allow_groups)},
      {"access.admin_uids", Ids(&ServerConfig::admin_uids, "uid")},
      {"access.admin_gids", Ids(&ServerConfig::admin_gids, "gid")},
      {"limits.max_clients",
       Uint([](DaemonSettings* s, uint64_t v) { s->server.limits.max_clients = v; }, 1, 65536)},
      {"limits.max_inflight",
       Uint([](DaemonSettings* s, uint64_t v) { s->server.limits.max_inflight = v; }, 1,
            ENGRAM_MAX_SLOTS)},
      {"limits.max_rows_per_request",
       Uint([](DaemonSettings* s, uint64_t v) { s->server.limits.max_rows_per_request = v; }, 1,
            uint64_t{1} << 32)},
      {"limits.max_arena_bytes",
       Bytes([](DaemonSettings* s, uint64_t v) { s->server.limits.max_arena_bytes = v; })},
      {"limits.max_total_arena_bytes",
       Bytes([](DaemonSettings* s, uint64_t v) { s->server.limits.max_total_arena_bytes = v; })},
      {"limits.default_data_bytes",
       Bytes([](DaemonSettings* s, uint64_t v) { s->server.limits.default_data_bytes = v; })},
      {"limits.default_slots",
       Uint([](DaemonSettings* s, uint64_t v) { s->server.limits.default_slots = v; }, 1,
            ENGRAM_MAX_SLOTS)},
      {"engine.workers",
       Uint([](DaemonSettings* s, uint64_t v) { s->server.workers = v; }, 0, 1024)},
      {"engine.request_threads",
       Uint([](DaemonSettings* s, uint64_t v) { s->server.request_threads = v; }, 1, 1024)},
      {"engine.poll_spin_min_us",
       Uint([](DaemonSettings* s, uint64_t v) { s->spin_min_us = v; }, 0, 10'000'000)},
      {"engine.poll_spin_max_us",
       Uint([](DaemonSettings* s, uint64_t v) { s->spin_max_us = v; }, 0, 10'000'000)},
      {"engine.inline_rows",
       Uint([](DaemonSettings* s, uint64_t v) { s->server.poll.inline_rows = v; }, 0,
            uint64_t{1} << 32)},
      {"log.level", String([](DaemonSettings* s, const std::string& v) -> absl::Status {
         if (absl::Status st = OneOf(v, {"error", "warning", "notice", "info", "debug"});
             !st.ok()) {
           return st;
         }
         s->log_level = v;
         return absl::OkStatus();
       })},
      {"metrics.http_port",
       Uint([](DaemonSettings* s, uint64_t v) { s->metrics.http_port = v; }, 0, 65535)},
      {"metrics.http_address", String([](DaemonSettings* s, const std::string& v) -> absl::Status {
         if (v != "127.0.0.1" && v != "::1" && v != "localhost") {
           return absl::InvalidArgumentError(absl::StrFormat(
               "'%s' is not a loopback address (127.0.0.1, ::1 or localhost); the metrics "
               "port is never exposed beyond the node",
               v));
         }
         s->metrics.http_address = v;
         return absl::OkStatus();
       })},
      {"metrics.textfile_dir", String([](DaemonSettings* s, const std::string& v) -> absl::Status {
         if (!v.empty() && v[0] != '/') {
           return absl::InvalidArgumentError(absl::StrFormat("'%s' is not an absolute path", v));
         }
         s->metrics.textfile_dir = v;
         return absl::OkStatus();
       })},
      {"memory.budget",
       [](const toml::node& n, DaemonSettings* s) -> absl::Status {
         // Like Bytes(), but 0 is allowed: unbounded.
         if (n.is_integer() && *n.value<int64_t>() == 0) {
           s->server.memory_budget = 0;
           return absl::OkStatus();
         }
         if (n.is_string() && absl::StripAsciiWhitespace(*n.value<std::string>()) == "0") {
           s->server.memory_budget = 0;
           return absl::OkStatus();
         }
         return Bytes([](DaemonSettings* s, uint64_t v) { s->server.memory_budget = v; })(n, s);
       }},
      {"metrics.textfile_interval_seconds",
       Uint([](DaemonSettings* s, uint64_t v) { s->metrics.textfile_interval_s = v; }, 1, 3600)},
  };
  return *keys;
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
    auto it = Keys().find(name);
    if (it == Keys().end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%u: unknown key '%s' (docs/operations.md lists every key)", path, line, name));
    }
    if (absl::Status s = it->second(node, settings); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%u: key '%s': %s", path, line, name, s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

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
  return Walk(path, table, "", settings);
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
