// MemoryBudget and byte-size parsing.
#include "daemon/store/memory_budget.h"

#include <cctype>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace engram {

uint64_t MemoryBudget::available() const {
  if (budget_ == 0) return std::numeric_limits<uint64_t>::max();
  uint64_t u = used();
  return u >= budget_ ? 0 : budget_ - u;
}

absl::Status MemoryBudget::Reserve(uint64_t bytes, const std::string& what) {
  uint64_t cur = used_.load(std::memory_order_relaxed);
  do {
    if (budget_ != 0 && (cur + bytes < cur || cur + bytes > budget_)) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " needs ", bytes, " bytes but the memory budget has ", budget_ - cur,
                       " of ", budget_, " left ([memory] budget)"));
    }
  } while (!used_.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  return absl::OkStatus();
}

absl::Status ParseByteSize(const std::string& text, uint64_t* ret_bytes) {
  std::string t(absl::StripAsciiWhitespace(text));
  size_t digits = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits]))) ++digits;
  uint64_t value = 0;
  if (digits == 0 || !absl::SimpleAtoi(t.substr(0, digits), &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", absl::CEscape(text), "' is not a byte size (e.g. 64G, 512M, 0)"));
  }
  std::string unit = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(t.substr(digits)));
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  const char* prefixes = "KMGT";
  for (int i = 0; i < 4 && shift < 0; ++i) {
    std::string p(1, prefixes[i]);
    if (unit == p || unit == p + "B" || unit == p + "IB") shift = 10 * (i + 1);
  }
  if (shift < 0 || (shift > 0 && value > (std::numeric_limits<uint64_t>::max() >> shift))) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", absl::CEscape(text), "' is not a byte size (e.g. 64G, 512M, 0)"));
  }
  *ret_bytes = value << shift;
  return absl::OkStatus();
}

}  // namespace engram
