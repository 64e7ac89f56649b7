// Parsing helpers for engramd's configuration (see server_config.h).
#include "daemon/server_config.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace engram {

absl::StatusOr<RowRange> ParseRowRange(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  RowRange range;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &range.begin) ||
      !absl::SimpleAtoi(parts[1], &range.end)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("row range '%s' is not BEGIN:END (two row numbers)", text));
  }
  if (range.begin >= range.end) {
    return absl::InvalidArgumentError(
        absl::StrFormat("row range '%s' is empty: BEGIN must be below END", text));
  }
  return range;
}

}  // namespace engram
