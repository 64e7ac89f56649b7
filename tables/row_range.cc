// ParseRowRange: the one parser of "BEGIN:END" row ranges (flags, config files, tools).
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "tables/table.h"

namespace engram {

absl::StatusOr<RowRange> ParseRowRange(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  RowRange range;
  if (parts.size() != 2 ||
      !absl::SimpleAtoi(absl::StrReplaceAll(parts[0], {{"_", ""}}), &range.begin) ||
      !absl::SimpleAtoi(absl::StrReplaceAll(parts[1], {{"_", ""}}), &range.end)) {
    return absl::InvalidArgumentError(
        absl::StrCat("row range '", text, "' is not BEGIN:END (two row numbers)"));
  }
  if (range.begin >= range.end) {
    return absl::InvalidArgumentError(
        absl::StrCat("row range '", text, "' is empty: BEGIN must be below END"));
  }
  return range;
}

}  // namespace engram
