// Text from outside (client names, file paths, table metadata) is bytes until proven otherwise.
// It is escaped exactly once, by the code that writes it into a format, and in that format's
// own way: EscapeBytes for a log line (one printable line), the JSON writer for a JSON string
// (SetJsonText: the text, plus its exact bytes in hex when they are not UTF-8), EscapeLabel
// (metrics.h) for a metric label value (Utf8Text).
//
//   log::Info("client {}", EscapeBytes(name));   // "vllm\x0a<0>x" stays on one line
//   SetJsonText(&out, "name", name);              // "vllm\n<0>x" in the JSON text
#pragma once

#include <string>
#include <string_view>

#include "nlohmann/json.hpp"

namespace engram {

// Valid UTF-8 sequences of printable characters are kept as they are; a backslash becomes
// "\\"; a control character (C0, DEL, C1), a byte that does not start or continue a valid
// sequence (stray continuation bytes, overlong forms, surrogates, code points past U+10FFFF, a
// sequence cut short) becomes "\xNN", one per byte. The result never holds a newline.
std::string EscapeBytes(std::string_view bytes);

// True when `bytes` is valid UTF-8 without control characters or backslashes, i.e. when
// EscapeBytes would return it unchanged.
bool IsPlainText(std::string_view bytes);

// True when `bytes` is valid UTF-8 (RFC 3629; control characters allowed).
bool IsValidUtf8(std::string_view bytes);

// For formats that carry Unicode text only (JSON strings, metric label values), whose writer
// escapes it: `bytes` unchanged when they are valid UTF-8, else with each byte that is not part
// of a valid sequence replaced by U+FFFD.
std::string Utf8Text(std::string_view bytes);

// The bytes as lowercase hex, two digits each.
std::string HexBytes(std::string_view bytes);

// Sets (*object)[key] to Utf8Text(bytes) and, only when the bytes are not valid UTF-8,
// (*object)[key + "_hex"] to HexBytes(bytes): a reader gets the exact bytes back either way.
void SetJsonText(nlohmann::json* object, const std::string& key, std::string_view bytes);

}  // namespace engram
