// Text from outside (client names, file paths, table metadata) is bytes until proven otherwise.
// EscapeBytes turns such bytes into one line of valid, printable UTF-8 that says exactly what
// the bytes were, for log lines, JSON strings and metric labels alike.
//
//   log::Info("client {}", EscapeBytes(name));   // "vllm\x0a<0>x" stays on one line
#pragma once

#include <string>
#include <string_view>

namespace engram {

// Valid UTF-8 sequences of printable characters are kept as they are; a backslash becomes
// "\\"; a control character (C0, DEL, C1), a byte that does not start or continue a valid
// sequence (stray continuation bytes, overlong forms, surrogates, code points past U+10FFFF, a
// sequence cut short) becomes "\xNN", one per byte. The result never holds a newline.
std::string EscapeBytes(std::string_view bytes);

// True when `bytes` is valid UTF-8 without control characters or backslashes, i.e. when
// EscapeBytes would return it unchanged.
bool IsPlainText(std::string_view bytes);

}  // namespace engram
