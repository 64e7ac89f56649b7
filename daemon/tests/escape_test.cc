// Outside text escaped once per format: EscapeBytes for log lines, Utf8Text (+ HexBytes) for JSON
// strings and metric labels, whose writers do their own escaping.
#include "base/escape.h"

#include <catch2/catch.hpp>
#include <string>

#include "daemon/ops/metrics.h"

namespace engram {
namespace {

const std::string kNasty = std::string("a\\b\"c\nd\xff\xc3\xa9", 10);

TEST_CASE("a log line gets every byte, once, on one line", "[ops][escape]") {
  CHECK(EscapeBytes(kNasty) == "a\\\\b\"c\\x0ad\\xff\xc3\xa9");
  CHECK(EscapeBytes("plain") == "plain");
}

TEST_CASE("JSON text is the bytes themselves when they are UTF-8, with hex beside when not",
          "[ops][escape]") {
  const std::string valid = "a\\b\"c\nd \xc3\xa9";
  CHECK(IsValidUtf8(valid));
  CHECK(Utf8Text(valid) == valid);  // the JSON writer escapes it, once
  nlohmann::json j = nlohmann::json::object();
  SetJsonText(&j, "name", valid);
  CHECK_FALSE(j.contains("name_hex"));
  CHECK(nlohmann::json::parse(j.dump())["name"] == valid);  // round trip, byte for byte

  CHECK_FALSE(IsValidUtf8(kNasty));
  CHECK(Utf8Text(kNasty) == "a\\b\"c\nd\xef\xbf\xbd\xc3\xa9");
  SetJsonText(&j, "name", kNasty);
  const nlohmann::json back = nlohmann::json::parse(j.dump());
  CHECK(back["name"] == "a\\b\"c\nd\xef\xbf\xbd\xc3\xa9");
  CHECK(back["name_hex"] == "615c6222630a64ffc3a9");
  CHECK(HexBytes(std::string("\x00\x7f", 2)) == "007f");
  // Overlong forms, surrogates and a cut sequence are not UTF-8 either.
  CHECK_FALSE(IsValidUtf8("\xc0\xaf"));
  CHECK_FALSE(IsValidUtf8("\xed\xa0\x80"));
  CHECK_FALSE(IsValidUtf8("\xe2\x82"));
}

TEST_CASE("a metric label escapes the text once", "[ops][escape]") {
  CHECK(metrics::EscapeLabel(Utf8Text("a\\b\"c\nd")) == "a\\\\b\\\"c\\nd");
}

}  // namespace
}  // namespace engram
