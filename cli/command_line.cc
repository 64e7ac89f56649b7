// engramd's programs' command-line conventions (command_line.h).
#include "cli/command_line.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace engram::cli {
namespace {

// The subcommand the arguments reached, deepest first selected; the app itself when none.
const CLI::App* Reached(const CLI::App& app, std::string* ret_name) {
  const CLI::App* at = &app;
  *ret_name = app.get_name();
  while (!at->get_subcommands().empty()) {
    at = at->get_subcommands().front();
    *ret_name += " " + at->get_name();
  }
  return at;
}

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "PROG SUB: what", the usage of PROG SUB and where its help is, on stderr.
void PrintUsageError(const CLI::App& command, const std::string& full_name,
                     const std::string& what) {
  std::string name = full_name;
  if (const size_t space = name.find(' '); space != std::string::npos) {
    name = Basename(name.substr(0, space)) + name.substr(space);
  } else {
    name = Basename(name);
  }
  std::cerr << name << ": " << what << "\n"
            << CLI::Formatter().make_usage(&command, name) << "Run '" << name
            << " --help' for more.\n"
            << std::flush;
}

// What a CLI11 error says, in one line. A bounds check's "NAME: must be ..." reads
// "NAME must be ..."; arguments CLI11 did not expect are named first, in the order typed (it
// checks required options before it reports them, and lists them backwards).
std::string WhatWasWrong(const CLI::App& app, const CLI::ParseError& e) {
  const std::vector<std::string> extras = app.remaining(true);
  if (!extras.empty()) {
    std::string list;
    for (const std::string& a : extras) list += (list.empty() ? "" : " ") + a;
    return (extras.size() == 1 ? "The following argument was not expected: "
                               : "The following arguments were not expected: ") +
           list;
  }
  std::string what = e.what();
  if (const size_t at = what.find(": must be "); at != std::string::npos) what.erase(at, 1);
  if (const size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
  return what;
}

// Gives `app` and its subcommands, all levels down, the formatter.
void UseFormatter(CLI::App& app, const std::shared_ptr<HelpFormatter>& formatter) {
  app.formatter(formatter);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    UseFormatter(*sub, formatter);
  }
}

// The width left to a description that starts at the formatter's column.
size_t DescriptionWidth(const CLI::Formatter& f) {
  return kHelpColumns > f.get_column_width() ? kHelpColumns - f.get_column_width() : 1;
}

}  // namespace

std::string WrapText(const std::string& text, size_t width) {
  std::string out;
  size_t line_start = 0;  // where the line being filled starts in `out`
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find_first_of(" \n", at), text.size());
    const std::string word = text.substr(at, end - at);
    const size_t line = out.size() - line_start;
    if (line > 0 && line + 1 + word.size() > width) {
      out += '\n';
      line_start = out.size();
    } else if (at > 0 && text[at - 1] == ' ') {
      out += ' ';
    }
    out += word;
    if (end < text.size() && text[end] == '\n') {
      out += '\n';
      line_start = out.size();
    }
    at = end + 1;
  }
  return out;
}

std::string HelpFormatter::make_option(const CLI::Option* opt, bool is_positional) const {
  const std::string head = "  " + make_option_name(opt, is_positional) + make_option_opts(opt);
  const std::string desc = make_option_desc(opt);
  const size_t column = get_column_width();
  std::string out = head;
  if (!desc.empty()) {
    // CLI11 leaves one space after a name one short of the column; cli_docs.py needs two.
    out += head.size() + 2 <= column ? std::string(column - head.size(), ' ')
                                     : "\n" + std::string(column, ' ');
    for (const char c : desc) {
      out += c;
      if (c == '\n') out += std::string(column, ' ');
    }
  }
  return out + "\n";
}

std::string HelpFormatter::make_option_desc(const CLI::Option* opt) const {
  return WrapText(CLI::Formatter::make_option_desc(opt), DescriptionWidth(*this));
}

std::string HelpFormatter::make_subcommand(const CLI::App* sub) const {
  std::stringstream out;
  CLI::detail::format_help(out, sub->get_display_name(true),
                           WrapText(sub->get_description(), DescriptionWidth(*this)),
                           get_column_width());
  return out.str();
}

std::string HelpFormatter::make_description(const CLI::App* app) const {
  return WrapText(CLI::Formatter::make_description(app), kHelpColumns);
}

std::string HelpFormatter::make_footer(const CLI::App* app) const {
  return WrapText(CLI::Formatter::make_footer(app), kHelpColumns);
}

int UsageError(const CLI::App& command, const std::string& what) {
  std::string name = command.get_name();
  for (const CLI::App* p = command.get_parent(); p != nullptr; p = p->get_parent()) {
    name = p->get_name() + " " + name;
  }
  PrintUsageError(command, name, what);
  return kExitUsage;
}

std::optional<int> Parse(CLI::App& app, const std::vector<std::string>& args) {
  UseFormatter(app, std::make_shared<HelpFormatter>());
  // Nothing asked of a program that needs a subcommand: its help, as a usage error.
  if (args.empty() && app.get_require_subcommand_min() > 0) {
    std::cerr << app.help();
    return kExitUsage;
  }
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them so
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::string name;
    const CLI::App* reached = Reached(app, &name);
    PrintUsageError(*reached, name, WhatWasWrong(app, e));
    return kExitUsage;
  }
  return std::nullopt;
}

std::optional<int> Parse(CLI::App& app, int argc, char** argv) {
  if (app.get_name().empty() && argc > 0) app.name(argv[0]);  // as CLI11 names it
  return Parse(app, std::vector<std::string>(argv + 1, argv + argc));
}

std::string IntegerBounds(uint64_t min, uint64_t max) {
  return max == UINT64_MAX ? absl::StrFormat("of at least %u", min)
                           : absl::StrFormat("from %u to %u", min, max);
}

CLI::Validator Integer(uint64_t min, uint64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        uint64_t v = 0;
        // SimpleAtoi takes "+5" and surrounding spaces; only plain digits are a value here.
        const bool digits =
            !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || !absl::SimpleAtoi(text, &v) || v < min || v > max) {
          return absl::StrFormat("must be an integer %s, got %s", IntegerBounds(min, max), text);
        }
        return "";
      },
      "");
}

CLI::Validator Checked(std::function<absl::Status(const std::string&)> check) {
  return CLI::Validator(
      [check](std::string& text) {
        const absl::Status s = check(text);
        return s.ok() ? std::string() : std::string(s.message());
      },
      "");
}

CLI::Validator Seconds(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        double v = 0;
        if (!absl::SimpleAtod(text, &v) || !std::isfinite(v) || v < min || v > max) {
          return absl::StrFormat("must be a number of seconds from %g to %g, got %s", min, max,
                                 text);
        }
        return "";
      },
      "");
}

}  // namespace engram::cli
