// engramctl's aligned listings (text_table.h).
#include "tools/engramctl/text_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_format.h"

namespace engramctl {
namespace {

bool Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The byte offset where character `n` of `text` starts (text.size() past its end).
size_t OffsetOf(const std::string& text, size_t n) {
  size_t at = 0;
  for (size_t seen = 0; at < text.size(); ++at) {
    if (Continuation(text[at])) continue;
    if (seen++ == n) return at;
  }
  return text.size();
}

std::string Pad(const std::string& text, size_t width, bool right) {
  const size_t w = TextWidth(text);
  if (w >= width) return text;
  return right ? std::string(width - w, ' ') + text : text + std::string(width - w, ' ');
}

}  // namespace

size_t TextWidth(const std::string& text) {
  return static_cast<size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return !Continuation(c); }));
}

std::string FitText(const std::string& text, size_t width) {
  const size_t w = TextWidth(text);
  if (w <= width) return text;
  if (width == 0) return "";
  const size_t head = (width - 1) / 2 + (width - 1) % 2, tail = width - 1 - head;
  return text.substr(0, OffsetOf(text, head)) + "~" + text.substr(OffsetOf(text, w - tail));
}

std::string Count(double n) {
  if (n < 10'000) return absl::StrFormat("%.0f", n);
  const char* units = "kMGTPE";
  int u = -1;
  while (n >= 999.95 && u < 5) {
    n /= 1000;
    ++u;
  }
  return absl::StrFormat("%.1f%c", n, units[u]);
}

void TextTable::AddRow(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  rows_.push_back({std::move(cells), {}});
}

void TextTable::AddLineUnder(std::string line) {
  if (!rows_.empty()) rows_.back().under.push_back(std::move(line));
}

std::string TextTable::Render(size_t width) const {
  std::vector<size_t> widths;
  size_t total = columns_.empty() ? 0 : columns_.size() - 1;  // the spaces between columns
  for (size_t c = 0; c < columns_.size(); ++c) {
    size_t w = TextWidth(columns_[c].header);
    for (const Row& r : rows_) w = std::max(w, TextWidth(r.cells[c]));
    widths.push_back(w);
    total += w;
  }
  for (size_t c = 0; c < columns_.size() && width != 0 && total > width; ++c) {
    if (!columns_[c].gives_way) continue;
    const size_t keep = std::max(TextWidth(columns_[c].header), widths[c] - (total - width));
    total -= widths[c] - std::min(widths[c], keep);
    widths[c] = std::min(widths[c], keep);
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < columns_.size(); ++c) {
      const std::string cell = FitText(cells[c], widths[c]);
      const bool last = c + 1 == columns_.size();
      out += last && !columns_[c].right ? cell : Pad(cell, widths[c], columns_[c].right);
      if (!last) out += ' ';
    }
    return (width == 0 ? out : FitText(out, width)) + "\n";
  };
  std::vector<std::string> headers;
  for (const TextColumn& c : columns_) headers.push_back(c.header);
  std::string out = line(headers);
  for (const Row& r : rows_) {
    out += line(r.cells);
    for (const std::string& u : r.under) out += (width == 0 ? u : FitText(u, width)) + "\n";
  }
  return out;
}

std::string ItemLines(const std::string& indent, const std::vector<std::string>& items,
                      size_t width) {
  std::string out, line = indent;
  bool first = true;
  for (const std::string& item : items) {
    if (!first && TextWidth(line) + 2 + TextWidth(item) + 1 > width) {
      out += line + ",\n";
      line = indent + "  " + item;
    } else {
      line += (first ? "" : ", ") + item;
    }
    first = false;
  }
  return out + line + "\n";
}

std::string WrapLine(const std::string& line, size_t width) {
  const size_t indent = std::min(line.find_first_not_of(' '), line.size());
  std::string out, current = line.substr(0, indent);
  size_t words_on_line = 0;
  for (size_t at = indent; at < line.size();) {
    const size_t end = std::min(line.find(' ', at), line.size());
    const std::string word = line.substr(at, end - at);
    if (words_on_line > 0 && TextWidth(current) + 1 + TextWidth(word) > width) {
      out += current + "\n";
      current = std::string(indent + 2, ' ');
      words_on_line = 0;
    }
    current += (words_on_line > 0 ? " " : "") + word;
    ++words_on_line;
    at = end + 1;
  }
  return out + current + "\n";
}

void PrintLine(const std::string& line) { fputs(WrapLine(line).c_str(), stdout); }

std::string Bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f %s", bytes, units[u])
                : absl::StrFormat("%.1f %s", bytes, units[u]);
}

std::string Clock(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  const uint64_t s = static_cast<uint64_t>(seconds + 0.5);
  if (s < 3600) return absl::StrFormat("%u:%02u", s / 60, s % 60);
  return absl::StrFormat("%u:%02u:%02u", s / 3600, s / 60 % 60, s % 60);
}

std::string ProgressLine(const std::string& what, uint64_t done, uint64_t total, uint64_t moved,
                         double seconds, size_t width) {
  const double frac = total == 0 ? 1.0 : std::min(1.0, double(done) / double(total));
  const double rate = seconds > 0 ? double(moved) / seconds : 0;
  const double eta = rate > 0 ? double(total - std::min(done, total)) / rate : -1;
  const std::string after =
      absl::StrFormat(" %5.1f%% %s of %s, %s/s, ETA %s", 100 * frac, Bytes(double(done)),
                      Bytes(double(total)), Bytes(rate), Clock(eta));
  // The bar takes what the words leave, between 5 and 30 characters.
  const size_t words = TextWidth(what) + 3 + TextWidth(after);
  const size_t bar = std::clamp<size_t>(width > words ? width - words : 0, 5, 30);
  const size_t filled = static_cast<size_t>(frac * double(bar));
  return FitText(absl::StrFormat("%s [%s%s]%s", what, std::string(filled, '#'),
                                 std::string(bar - filled, ' '), after),
                 width);
}

}  // namespace engramctl
