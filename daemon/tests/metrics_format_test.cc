// The exposition's number format and the textfile helpers (daemon/ops/metrics.h): integers in
// exact digits, other values that read back as the same double, and a textfile that can say
// when it was written and be taken away.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/ops/metrics.h"

namespace {

double ReadBack(const std::string& text) {
  double v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  REQUIRE(r.ec == std::errc());
  REQUIRE(r.ptr == text.data() + text.size());
  return v;
}

}  // namespace

using engram::metrics::FormatSampleValue;

TEST_CASE("large counters are written in exact digits") {
  CHECK(FormatSampleValue(0) == "0");
  CHECK(FormatSampleValue(123456789012345.0) == "123456789012345");
  CHECK(FormatSampleValue(9007199254740992.0) == "9007199254740992");  // 2^53
  CHECK(FormatSampleValue(-4.0) == "-4");
}

TEST_CASE("other values read back as the same double") {
  // A start time since the epoch: %.9g made it 1786071230, seconds off.
  const double start = 1786071234.57;
  CHECK(ReadBack(FormatSampleValue(start)) == start);
  for (double v : {1.073741824, 2.5e-7, 1.0 / 3, 123456.789012345678, 6.02e23}) {
    INFO(v);
    CHECK(ReadBack(FormatSampleValue(v)) == v);
  }
  CHECK(FormatSampleValue(1.073741824) == "1.073741824");
  CHECK(FormatSampleValue(1.0 / 0.0) == "+Inf");
  CHECK(FormatSampleValue(-1.0 / 0.0) == "-Inf");
  CHECK(FormatSampleValue(0.0 / 0.0) == "NaN");
}

TEST_CASE("histogram edges are exact") {
  engram::metrics::Exposition e;
  uint64_t buckets[64] = {};
  buckets[29] = 1;  // [2^29, 2^30) ns
  e.Log2Histogram("h_seconds", "h", {}, buckets, 64, 600'000'000, engram::metrics::kClientEdges);
  const std::string text = e.Text();
  CHECK(text.find("h_seconds_bucket{le=\"1.073741824\"} 1\n") != std::string::npos);
  CHECK(text.find("h_seconds_bucket{le=\"0.268435456\"} 0\n") != std::string::npos);
  CHECK(text.find("h_seconds_sum 0.6\n") != std::string::npos);
}

TEST_CASE("the textfile says when it was written and how often") {
  const std::string text = engram::metrics::TextfileFreshness(1786071234.25, 15);
  CHECK(text.find("# TYPE engram_textfile_written_timestamp_seconds gauge\n") != std::string::npos);
  CHECK(text.find("\nengram_textfile_written_timestamp_seconds 1786071234.25\n") !=
        std::string::npos);
  CHECK(text.find("\nengram_textfile_interval_seconds 15\n") != std::string::npos);
}

TEST_CASE("a textfile switched off is removed") {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("metrics_format_" + std::to_string(getpid())))
          .string();
  std::filesystem::create_directories(dir);
  REQUIRE(engram::metrics::WriteTextfile(dir, "engram_up 1\n").ok());
  CHECK(std::filesystem::exists(dir + "/engramd.prom"));
  CHECK(engram::metrics::RemoveTextfile(dir).ok());
  CHECK_FALSE(std::filesystem::exists(dir + "/engramd.prom"));
  CHECK(engram::metrics::RemoveTextfile(dir).ok());  // already gone
  std::filesystem::remove_all(dir);
}
