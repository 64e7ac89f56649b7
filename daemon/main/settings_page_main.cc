// engramd-settings-page: writes engramd.toml(5) from its template, the line "@SETTINGS@" replaced
// by every row of the settings table (daemon/ops/config_file.h) in roff, so that the page names
// each key the file accepts with its type, bounds, default, flag and whether a SIGHUP applies it.
// The build runs it (man/meson.build); it is not installed.
//   engramd-settings-page TEMPLATE > engramd.toml.5
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/str_format.h"
#include "cli/command_line.h"
#include "daemon/ops/config_file.h"

namespace engram {
namespace {

// Text as roff prints it: backslashes and hyphens escaped, a control character at the start of
// a line defused.
std::string Roff(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\e";
    } else if (c == '-') {
      out += "\\-";
    } else {
      out += c;
    }
  }
  if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out = "\\&" + out;
  return out;
}

// What a value of `s` is: "integer from 1 to 65536", "size", "array of strings".
std::string TypeText(const Setting& s) {
  using Kind = Setting::Kind;
  const bool bounded = s.min != 0 || s.max != UINT64_MAX;
  const std::string bounds = bounded ? " " + cli::IntegerBounds(s.min, s.max) : "";
  switch (s.kind) {
    case Kind::kUint32:
    case Kind::kUint64:
      return "integer" + bounds;
    case Kind::kBytes:
      return "size";
    case Kind::kBytesOrZero:
      return "size or 0";
    case Kind::kString:
      return s.path ? "absolute path" : "string";
    case Kind::kStrings:
      return s.path ? "array of absolute paths" : "array of strings";
    case Kind::kIds:
      return "array of integers" + bounds;
    case Kind::kBool:
      return "boolean";
  }
  return "";
}

// One setting as a tagged paragraph: the key with its type and default, the help, the flag
// and when a change applies.
std::string Entry(const Setting& s, const std::string& name) {
  std::string out = absl::StrFormat(".TP\n\\fB%s\\fR (%s; default \\fB%s\\fR)\n", Roff(name),
                                    Roff(TypeText(s)), Roff(s.DefaultText()));
  if (s.kind == Setting::Kind::kBool && s.flag[0] != '\0') {
    // A boolean's help describes its flag, which sets the opposite of the default.
    out += absl::StrFormat("Flag \\fB%s\\fR sets it to %s: %s.\n", Roff(s.flag),
                           s.DefaultText() == "true" ? "false" : "true", Roff(s.help));
  } else {
    out += Roff(s.help) + ".\n";
    if (s.flag[0] != '\0') out += absl::StrFormat("Flag \\fB%s\\fR.\n", Roff(s.flag));
  }
  out += s.live() ? "A SIGHUP applies a change.\n" : "A change takes effect at the next start.\n";
  return out;
}

// Every setting, under a subsection per section of the file, in the table's order.
std::string SettingsRoff() {
  std::string out, section;
  for (const Setting& s : Settings()) {
    const std::string key = s.key;
    const size_t dot = key.find('.');
    const std::string in = key.substr(0, dot);
    if (in != section) {
      section = in;
      out += absl::StrFormat(".SS \"[%s]\"\n", section);
    }
    out += Entry(s, key.substr(dot + 1));
  }
  return out;
}

int Main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: engramd-settings-page TEMPLATE > PAGE\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    fprintf(stderr, "engramd-settings-page: cannot read %s\n", argv[1]);
    return 1;
  }
  bool placed = false;
  std::ostringstream page;
  for (std::string line; std::getline(in, line);) {
    if (line == "@SETTINGS@") {
      page << SettingsRoff();
      placed = true;
    } else {
      page << line << "\n";
    }
  }
  if (!placed) {
    fprintf(stderr, "engramd-settings-page: %s has no @SETTINGS@ line\n", argv[1]);
    return 1;
  }
  std::cout << page.str() << std::flush;
  return std::cout ? 0 : 1;
}

}  // namespace
}  // namespace engram

int main(int argc, char** argv) { return engram::Main(argc, argv); }
