// The CPU reference dequantisation against values worked out by hand: e4m3 decoding, bf16
// rounding (ties to even, subnormals, overflow), scale extremes and every NaN source.
#include "kernels/dequant_ref.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace engram {
namespace {

// Decodes bf16 bits exactly (for checking round trips).
double Bf16ToDouble(uint16_t bits) {
  uint32_t wide = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

TEST_CASE("e4m3 decodes normals, subnormals, signed zero and NaN", "[gpu][ref]") {
  CHECK(E4M3ToDouble(0x00) == 0.0);
  CHECK(std::signbit(E4M3ToDouble(0x80)));
  CHECK(E4M3ToDouble(0x80) == 0.0);
  CHECK(E4M3ToDouble(0x01) == std::ldexp(1.0, -9));      // smallest subnormal
  CHECK(E4M3ToDouble(0x07) == 7 * std::ldexp(1.0, -9));  // largest subnormal
  CHECK(E4M3ToDouble(0x08) == std::ldexp(1.0, -6));      // smallest normal
  CHECK(E4M3ToDouble(0x38) == 1.0);
  CHECK(E4M3ToDouble(0x3C) == 1.5);
  CHECK(E4M3ToDouble(0x40) == 2.0);
  CHECK(E4M3ToDouble(0xC0) == -2.0);
  CHECK(E4M3ToDouble(0x7E) == 448.0);  // largest finite
  CHECK(E4M3ToDouble(0xFE) == -448.0);
  CHECK(E4M3ToDouble(0x78) == 256.0);  // S.1111.000 is finite in the FN variant
  CHECK(std::isnan(E4M3ToDouble(0x7F)));
  CHECK(std::isnan(E4M3ToDouble(0xFF)));
}

TEST_CASE("e8m0 scales cover 2^-127 .. 2^127 and 255 is NaN", "[gpu][ref]") {
  CHECK(E8M0ToDouble(127) == 1.0);
  CHECK(E8M0ToDouble(0) == std::ldexp(1.0, -127));
  CHECK(E8M0ToDouble(254) == std::ldexp(1.0, 127));
  CHECK(std::isnan(E8M0ToDouble(255)));
}

TEST_CASE("bf16 rounding is to nearest, ties to even", "[gpu][ref]") {
  CHECK(RoundToBf16(1.0) == 0x3F80);
  CHECK(RoundToBf16(-1.0) == 0xBF80);
  CHECK(RoundToBf16(1.0 + std::ldexp(1.0, -8)) == 0x3F80);      // tie, down to even
  CHECK(RoundToBf16(1.0 + 3 * std::ldexp(1.0, -8)) == 0x3F82);  // tie, up to even
  CHECK(RoundToBf16(1.0 + std::ldexp(1.0, -7)) == 0x3F81);      // exact
  CHECK(RoundToBf16(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -20)) == 0x3F81);  // above tie
  // Subnormals: units of 2^-133.
  CHECK(RoundToBf16(std::ldexp(1.0, -133)) == 0x0001);
  CHECK(RoundToBf16(std::ldexp(1.0, -134)) == 0x0000);      // half a unit: tie to even 0
  CHECK(RoundToBf16(3 * std::ldexp(1.0, -134)) == 0x0002);  // 1.5 units: tie to even 2
  CHECK(RoundToBf16(-std::ldexp(1.0, -140)) == 0x8000);     // underflow keeps the sign
  CHECK(RoundToBf16(std::ldexp(1.0, -126)) == 0x0080);      // smallest normal
  CHECK(RoundToBf16(std::ldexp(127.5, -133)) == 0x0080);    // subnormal rounding up to it
  // Top of the range.
  CHECK(RoundToBf16(std::ldexp(2.0 - std::ldexp(1.0, -7), 127)) == 0x7F7F);  // largest finite
  CHECK(RoundToBf16(std::ldexp(2.0 - std::ldexp(1.0, -8), 127)) == 0x7F80);  // tie -> inf
  CHECK(RoundToBf16(-std::ldexp(1.0, 130)) == 0xFF80);
  CHECK(RoundToBf16(std::nan("")) == kBf16NaN);
  CHECK(RoundToBf16(-std::nan("")) == kBf16NaN);
}

TEST_CASE("dequantised values at the scale extremes, worked by hand", "[gpu][ref]") {
  CHECK(DequantValue(0x38, 127) == 0x3F80);  // 1 * 2^0
  CHECK(DequantValue(0x08, 127) == 0x3C80);  // 2^-6
  CHECK(DequantValue(0xC0, 130) == 0xC180);  // -2 * 2^3 = -16
  // Scale 0 (2^-127): results fall into bf16's subnormals, counted in units of 2^-133.
  CHECK(DequantValue(0x38, 0) == 0x0040);  // 2^-127 = 64 units
  CHECK(DequantValue(0x01, 0) == 0x0000);  // 2^-136 = 1/8 unit
  CHECK(DequantValue(0x81, 0) == 0x8000);  // -1/8 unit: signed zero
  CHECK(DequantValue(0x07, 0) == 0x0001);  // 7/8 unit
  CHECK(DequantValue(0x04, 0) == 0x0000);  // 1/2 unit: tie to even 0
  CHECK(DequantValue(0x0C, 0) == 0x0002);  // 1.5 * 2^-133: tie to even 2
  CHECK(DequantValue(0x7E, 0) == 0x0460);  // 448 * 2^-127 = 1.75 * 2^-119, a normal
  // Scale 254 (2^127): large values overflow to infinity.
  CHECK(DequantValue(0x38, 254) == 0x7F00);  // 2^127
  CHECK(DequantValue(0x7E, 254) == 0x7F80);  // 448 * 2^127 -> +inf
  CHECK(DequantValue(0xFE, 254) == 0xFF80);  // -inf
  CHECK(DequantValue(0x7E, 246) == 0x7F60);  // 1.75 * 2^127: the largest that stays finite
  CHECK(DequantValue(0x7E, 247) == 0x7F80);
  // Every NaN source gives the one NaN pattern.
  CHECK(DequantValue(0x38, 255) == kBf16NaN);
  CHECK(DequantValue(0x00, 255) == kBf16NaN);  // even zero times a NaN scale
  CHECK(DequantValue(0x7F, 127) == kBf16NaN);
  CHECK(DequantValue(0xFF, 0) == kBf16NaN);
}

TEST_CASE("every value byte under every scale rounds to the exact product when representable",
          "[gpu][ref]") {
  int checked = 0;
  for (int scale = 0; scale < 255; ++scale) {
    for (int value = 0; value < 256; ++value) {
      const uint16_t bits = DequantValue(uint8_t(value), uint8_t(scale));
      const double exact = E4M3ToDouble(uint8_t(value)) * E8M0ToDouble(uint8_t(scale));
      if (std::isnan(exact)) {
        REQUIRE(bits == kBf16NaN);
        continue;
      }
      const double magnitude = std::fabs(exact);
      if (magnitude >= std::ldexp(1.0, -126) && magnitude < std::ldexp(1.0, 128)) {
        // 4 significant bits always fit bf16's 8: no rounding at all.
        REQUIRE(Bf16ToDouble(bits) == exact);
        ++checked;
      } else if (magnitude >= std::ldexp(1.0, 128)) {
        REQUIRE((bits & 0x7FFF) == 0x7F80);
      } else {
        // Subnormal result: within half a unit of 2^-133.
        REQUIRE(std::fabs(Bf16ToDouble(bits) - exact) <= std::ldexp(1.0, -134));
      }
      REQUIRE(((bits & 0x8000) != 0) == std::signbit(exact));
    }
  }
  CHECK(checked > 50000);
}

TEST_CASE("a row uses scale i / 32 for value i", "[gpu][ref]") {
  uint8_t row[264];
  for (int i = 0; i < 256; ++i) row[i] = 0x38;  // 1.0
  for (int b = 0; b < 8; ++b) row[256 + b] = uint8_t(127 + b);
  uint16_t out[256];
  DequantRow(row, out);
  for (int i = 0; i < 256; ++i) {
    INFO("value " << i);
    CHECK(Bf16ToDouble(out[i]) == std::ldexp(1.0, i / 32));
  }
}

TEST_CASE("scatter follows the index map: repeats, padding and out-of-range slots", "[gpu][ref]") {
  std::vector<uint8_t> rows(3 * 264);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 256; ++i) rows[r * 264 + i] = uint8_t(0x38 + 8 * r);  // 1, 2, 4
    for (int b = 0; b < 8; ++b) rows[r * 264 + 256 + b] = 127;
  }
  const std::vector<int32_t> map = {2, 0, 2, -1, 3, 1};
  std::vector<uint16_t> out(map.size() * 256, 0xAAAA);
  CHECK(DequantScatter(rows, 3, map, out) == 1);
  const uint16_t expected[] = {0x4080, 0x3F80, 0x4080, 0x0000, kBf16NaN, 0x4000};
  for (size_t slot = 0; slot < map.size(); ++slot) {
    for (int i = 0; i < 256; ++i) {
      INFO("slot " << slot << " value " << i);
      REQUIRE(out[slot * 256 + i] == expected[slot]);
    }
  }
}

}  // namespace
}  // namespace engram
