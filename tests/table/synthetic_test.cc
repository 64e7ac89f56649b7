// Tests of the synthetic row generator: pure, distinct per (seed, layer, row), finite values
// and sane scales.
#include "testkit/synthetic.h"

#include <array>
#include <catch2/catch.hpp>
#include <cstring>
#include <set>

namespace engram {
namespace {

TEST_CASE("SyntheticRow is a pure function of seed, layer and row", "[synthetic]") {
  uint8_t a[kRowBytes], b[kRowBytes];
  SyntheticRow(7, 14, 123456789, a);
  SyntheticRow(7, 14, 123456789, b);
  CHECK(std::memcmp(a, b, kRowBytes) == 0);

  SyntheticRow(8, 14, 123456789, b);
  CHECK(std::memcmp(a, b, kRowBytes) != 0);
  SyntheticRow(7, 1, 123456789, b);
  CHECK(std::memcmp(a, b, kRowBytes) != 0);
  SyntheticRow(7, 14, 123456790, b);
  CHECK(std::memcmp(a, b, kRowBytes) != 0);
  // Rows far apart must not collide either (a generator keyed on 32 bits of the row would).
  SyntheticRow(7, 14, 123456789 + (uint64_t{1} << 32), b);
  CHECK(std::memcmp(a, b, kRowBytes) != 0);
}

TEST_CASE("SyntheticRows equals SyntheticRow row by row", "[synthetic]") {
  std::vector<uint8_t> rows(100 * kRowBytes);
  SyntheticRows(3, 1, 1000, 100, rows.data());
  uint8_t one[kRowBytes];
  for (uint64_t i = 0; i < 100; ++i) {
    SyntheticRow(3, 1, 1000 + i, one);
    REQUIRE(std::memcmp(one, rows.data() + i * kRowBytes, kRowBytes) == 0);
  }
}

TEST_CASE("synthetic values are finite FP8 E4M3 and scales are sane E8M0", "[synthetic]") {
  std::array<uint64_t, 256> value_counts{};
  std::set<int> scales;
  uint8_t row[kRowBytes];
  for (uint64_t r = 0; r < 20000; ++r) {
    SyntheticRow(1, 14, r * 7919, row);
    for (uint32_t i = 0; i < kValueBytes; ++i) value_counts[row[i]]++;
    for (uint32_t j = 0; j < kScaleBytes; ++j) scales.insert(row[kValueBytes + j]);
  }
  CHECK(value_counts[0x7f] == 0);  // E4M3 NaN encodings
  CHECK(value_counts[0xff] == 0);
  // Every other byte shows up: the values are not degenerate.
  for (int v = 0; v < 256; ++v) {
    if (v == 0x7f || v == 0xff) continue;
    INFO("byte " << v);
    CHECK(value_counts[v] > 0);
  }
  CHECK(*scales.begin() == 120);
  CHECK(*scales.rbegin() == 134);
  CHECK(scales.size() == 15);
}

}  // namespace
}  // namespace engram
