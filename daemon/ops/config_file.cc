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
T& Ref(const Setting& setting, DaemonSettings* s) {
  return *static_cast<T*>(setting.At(s));
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
    Ref<std::vector<uint32_t>>(setting, s).clear();
  } else {
    Ref<std::vector<std::string>>(setting, s).clear();
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
      Ref<bool>(setting, s) = *n.value<bool>();
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
      return absl::StrFormat("%u", Ref<uint32_t>(*this, s));
    case Kind::kUint64:
      return absl::StrFormat("%u", Ref<uint64_t>(*this, s));
    case Kind::kBytes:
    case Kind::kBytesOrZero:
      return ByteText(Ref<uint64_t>(*this, s));
    case Kind::kString:
      return "\"" + Ref<std::string>(*this, s) + "\"";
    case Kind::kBool:
      return Ref<bool>(*this, s) ? "true" : "false";
    case Kind::kStrings: {
      std::string out;
      for (const std::string& v : Ref<std::vector<std::string>>(*this, s)) {
        out += (out.empty() ? "\"" : ", \"") + v + "\"";
      }
      return "[" + out + "]";
    }
    case Kind::kIds: {
      std::string out;
      for (uint32_t v : Ref<std::vector<uint32_t>>(*this, s)) {
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
        Ref<uint32_t>(*this, s) = static_cast<uint32_t>(v);
      } else if (kind == Kind::kUint64) {
        Ref<uint64_t>(*this, s) = v;
      } else {
        Ref<std::vector<uint32_t>>(*this, s).push_back(static_cast<uint32_t>(v));
      }
      return absl::OkStatus();
    }
    case Kind::kBytes:
    case Kind::kBytesOrZero: {
      absl::StatusOr<uint64_t> v = ParseByteSize(text);
      if (!v.ok()) return v.status();
      if (*v == 0 && kind == Kind::kBytes) return absl::InvalidArgumentError("must be above 0");
      Ref<uint64_t>(*this, s) = *v;
      return absl::OkStatus();
    }
    case Kind::kString:
      if (check) {
        if (absl::Status st = check(text); !st.ok()) return st;
      }
      Ref<std::string>(*this, s) = text;
      return absl::OkStatus();
    case Kind::kBool: {
      // A flag without a value sets the opposite of the default.
      DaemonSettings defaults;
      if (text.empty()) {
        Ref<bool>(*this, s) = !Ref<bool>(*this, &defaults);
      } else if (text == "true" || text == "false") {
        Ref<bool>(*this, s) = text == "true";
      } else {
        return absl::InvalidArgumentError(absl::StrFormat("'%s' is not true or false", text));
      }
      return absl::OkStatus();
    }
    case Kind::kStrings:
      if (check) {
        if (absl::Status st = check(text); !st.ok()) return st;
      }
      Ref<std::vector<std::string>>(*this, s).push_back(text);
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

void Setting::ClearList(DaemonSettings* s) const {
  if (kind == Kind::kStrings) Ref<std::vector<std::string>>(*this, s).clear();
  if (kind == Kind::kIds) Ref<std::vector<uint32_t>>(*this, s).clear();
}

namespace {

// Calls fn(&value) with this setting's value in *s, typed as its Kind stores it.
template <typename Fn>
void VisitValue(const Setting& setting, DaemonSettings* s, Fn&& fn) {
  switch (setting.kind) {
    case Kind::kUint32:
      return fn(&Ref<uint32_t>(setting, s));
    case Kind::kUint64:
    case Kind::kBytes:
    case Kind::kBytesOrZero:
      return fn(&Ref<uint64_t>(setting, s));
    case Kind::kString:
      return fn(&Ref<std::string>(setting, s));
    case Kind::kStrings:
      return fn(&Ref<std::vector<std::string>>(setting, s));
    case Kind::kIds:
      return fn(&Ref<std::vector<uint32_t>>(setting, s));
    case Kind::kBool:
      return fn(&Ref<bool>(setting, s));
  }
}

}  // namespace

bool Setting::Same(const DaemonSettings& a, const DaemonSettings& b) const {
  bool same = false;
  VisitValue(*this, const_cast<DaemonSettings*>(&a), [&](auto* value) {
    using T = std::remove_pointer_t<decltype(value)>;
    same = *value == Ref<T>(*this, const_cast<DaemonSettings*>(&b));
  });
  return same;
}

void Setting::Copy(const DaemonSettings& from, DaemonSettings* to) const {
  VisitValue(*this, to, [&](auto* value) {
    using T = std::remove_pointer_t<decltype(value)>;
    *value = Ref<T>(*this, const_cast<DaemonSettings*>(&from));
  });
  if (field != nullptr && server_field != nullptr) CopyServerValue(from.server, &to->server);
}

void Setting::CopyServerValue(const ServerConfig& from, ServerConfig* to) const {
  if (server_field == nullptr) return;
  auto copy = [&]<typename T>(T*) {
    *static_cast<T*>(server_field(to)) =
        *static_cast<const T*>(server_field(const_cast<ServerConfig*>(&from)));
  };
  switch (kind) {
    case Kind::kUint32:
      return copy(static_cast<uint32_t*>(nullptr));
    case Kind::kUint64:
    case Kind::kBytes:
    case Kind::kBytesOrZero:
      return copy(static_cast<uint64_t*>(nullptr));
    case Kind::kString:
      return copy(static_cast<std::string*>(nullptr));
    case Kind::kStrings:  // held resolved, as ids
    case Kind::kIds:
      return copy(static_cast<std::vector<uint32_t>*>(nullptr));
    case Kind::kBool:
      return copy(static_cast<bool*>(nullptr));
  }
}

const Setting* FindSetting(const std::string& key) {
  for (const Setting& s : Settings()) {
    if (key == s.key) return &s;
  }
  return nullptr;
}

namespace {

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
