// Columns of text under their headers, for engramctl's listings (tables, clients, stats -w):
// each column as wide as its widest cell, and one column that gives way, cutting its cells in
// the middle, when the lines would not fit the width asked for. Widths count characters (UTF-8
// code points), not bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace engramctl {

// The width tables fit by default, as a terminal's; -o wide lifts it.
inline constexpr size_t kTerminalColumns = 80;
inline constexpr size_t kTerminalRows = 24;

struct TextColumn {
  std::string header;
  bool right = false;      // numbers: aligned right
  bool gives_way = false;  // at most one column: cut to fit the width
};

class TextTable {
 public:
  explicit TextTable(std::vector<TextColumn> columns) : columns_(std::move(columns)) {}
  // One row (as many cells as columns), and lines printed under it as they are (a table's
  // files), cut to the width.
  void AddRow(std::vector<std::string> cells);
  void AddLineUnder(std::string line);
  // The header and the rows, each line at most `width` characters (0: no limit) and ending in
  // a newline; the column that gives way keeps at least its header's width.
  std::string Render(size_t width) const;

 private:
  struct Row {
    std::vector<std::string> cells;
    std::vector<std::string> under;
  };
  std::vector<TextColumn> columns_;
  std::vector<Row> rows_;
};

// Characters (UTF-8 code points) of `text`.
size_t TextWidth(const std::string& text);
// `text` cut to `width` characters, its middle replaced by "~" when it is longer.
std::string FitText(const std::string& text, size_t width);
// A count in at most 6 characters: "9999", "12.3k", "4.5M", "1.2G".
std::string Count(double n);
// A size in IEC units, as everything engramctl prints: "512 B", "1.5 GiB", "320.0 MiB".
std::string Bytes(double bytes);
// "0:42", "12:05", "2:03:10"; "-" when unknown (negative or not finite).
std::string Clock(double seconds);

// `items` joined by ", " after `indent`, a line broken after a comma where the next item would
// pass `width` (the further lines indented two more), ending in a newline: "  reads 12 (io_uring
// 3, ...), 1.5 GiB read,\n    40 syscalls\n". An item wider than the line stays whole.
std::string ItemLines(const std::string& indent, const std::vector<std::string>& items,
                      size_t width = kTerminalColumns);

// `line` (without its newline) broken at spaces where it would pass `width`, the further lines
// indented two more than its own leading spaces; each line ends in a newline. A word wider than
// a line stays whole.
std::string WrapLine(const std::string& line, size_t width = kTerminalColumns);
// Prints WrapLine(line) to stdout.
void PrintLine(const std::string& line);

// One line of a long operation's progress on a terminal, at most `width` characters:
// "load layer 14 [#####     ]  45.0% 1.2 GiB of 2.6 GiB, 310.5 MiB/s, ETA 0:05". `done` and
// `total` are the bytes done and to do in all; the rate (and so the ETA) counts only the
// `moved` bytes of this run over `seconds`, not what an earlier run did.
std::string ProgressLine(const std::string& what, uint64_t done, uint64_t total, uint64_t moved,
                         double seconds, size_t width = kTerminalColumns);

}  // namespace engramctl
