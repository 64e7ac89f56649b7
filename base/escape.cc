// EscapeBytes: bytes from outside made into one printable line of UTF-8 (escape.h).
#include "base/escape.h"

#include <cstdint>

namespace engram {
namespace {

// Length of the valid UTF-8 sequence starting at bytes[i] (1-4), or 0 when none starts there.
// Follows RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF.
size_t SequenceLength(std::string_view bytes, size_t i, uint32_t* ret_code_point) {
  const auto at = [&](size_t k) { return static_cast<uint8_t>(bytes[k]); };
  const uint8_t b0 = at(i);
  if (b0 < 0x80) {
    *ret_code_point = b0;
    return 1;
  }
  size_t n;
  uint32_t cp, min;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > bytes.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((at(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (at(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  *ret_code_point = cp;
  return n;
}

bool IsControl(uint32_t cp) { return cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0); }

void AppendHexByte(std::string* out, uint8_t b) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->append("\\x");
  out->push_back(kHex[b >> 4]);
  out->push_back(kHex[b & 0xF]);
}

}  // namespace

std::string EscapeBytes(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    uint32_t cp = 0;
    const size_t n = SequenceLength(bytes, i, &cp);
    if (n == 0 || IsControl(cp)) {
      for (size_t k = 0; k < (n == 0 ? 1 : n); ++k) {
        AppendHexByte(&out, static_cast<uint8_t>(bytes[i + k]));
      }
      i += n == 0 ? 1 : n;
      continue;
    }
    if (cp == '\\') {
      out.append("\\\\");
    } else {
      out.append(bytes.substr(i, n));
    }
    i += n;
  }
  return out;
}

bool IsPlainText(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    uint32_t cp = 0;
    const size_t n = SequenceLength(bytes, i, &cp);
    if (n == 0 || IsControl(cp) || cp == '\\') return false;
    i += n;
  }
  return true;
}

bool IsValidUtf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    uint32_t cp = 0;
    const size_t n = SequenceLength(bytes, i, &cp);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string Utf8Text(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    uint32_t cp = 0;
    const size_t n = SequenceLength(bytes, i, &cp);
    if (n == 0) {
      out.append("\xEF\xBF\xBD");  // U+FFFD REPLACEMENT CHARACTER
      ++i;
      continue;
    }
    out.append(bytes.substr(i, n));
    i += n;
  }
  return out;
}

std::string HexBytes(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xF]);
  }
  return out;
}

void SetJsonText(nlohmann::json* object, const std::string& key, std::string_view bytes) {
  (*object)[key] = Utf8Text(bytes);
  if (!IsValidUtf8(bytes)) (*object)[key + "_hex"] = HexBytes(bytes);
}

}  // namespace engram
