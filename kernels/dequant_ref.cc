// CPU reference dequantisation (see dequant_ref.h): every product is formed exactly in double
// and rounded once, so it does not share a single step with the GPU's float path.
#include "kernels/dequant_ref.h"

#include <cassert>
#include <cmath>
#include <limits>

#include "engram/row.h"

namespace engram {
namespace {
constexpr uint32_t kRowBytes = ENGRAM_ROW_BYTES;
constexpr uint32_t kRowValues = ENGRAM_ROW_VALUES;
constexpr uint32_t kScaleBlock = ENGRAM_ROW_SCALE_BLOCK;
}  // namespace

double E4M3ToDouble(uint8_t byte) {
  const bool negative = (byte & 0x80) != 0;
  const int exponent = (byte >> 3) & 0xF;
  const int mantissa = byte & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -9);  // subnormal: m/8 * 2^-6
  } else {
    magnitude = std::ldexp(8 + mantissa, exponent - 7 - 3);  // (1 + m/8) * 2^(e-7)
  }
  return negative ? -magnitude : magnitude;
}

double E8M0ToDouble(uint8_t byte) {
  if (byte == 0xFF) return std::numeric_limits<double>::quiet_NaN();
  return std::ldexp(1.0, int{byte} - 127);
}

uint16_t RoundToBf16(double x) {
  if (std::isnan(x)) return kBf16NaN;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double magnitude = std::fabs(x);
  if (magnitude == 0.0) return sign;
  if (std::isinf(magnitude)) return sign | 0x7F80;
  // Quantum of the bf16 grid at this magnitude: 7 fraction bits for normals (exponents
  // -126..127), a fixed 2^-133 below 2^-126 (subnormals).
  int exp2;
  std::frexp(magnitude, &exp2);  // magnitude = f * 2^exp2, f in [0.5, 1)
  const int unbiased = exp2 - 1;
  const int quantum_exp = unbiased < -126 ? -133 : unbiased - 7;
  // Both scalings are by powers of two, hence exact; nearbyint rounds half to even.
  const double units = std::nearbyint(std::ldexp(magnitude, -quantum_exp));
  const double rounded = std::ldexp(units, quantum_exp);
  if (rounded >= std::ldexp(1.0, 128)) return sign | 0x7F80;
  if (rounded < std::ldexp(1.0, -126)) {
    // Subnormal: the bits are the count of 2^-133 units (128 units is exactly the smallest
    // normal, whose encoding 0x0080 the same formula gives).
    return sign | static_cast<uint16_t>(units);
  }
  int rounded_exp2;
  const double fraction = std::frexp(rounded, &rounded_exp2);  // fraction in [0.5, 1)
  const int biased = rounded_exp2 - 1 + 127;
  const auto mantissa = static_cast<uint16_t>(std::ldexp(fraction, 8) - 128.0);
  return sign | static_cast<uint16_t>(biased << 7) | mantissa;
}

uint16_t DequantValue(uint8_t value, uint8_t scale) {
  return RoundToBf16(E4M3ToDouble(value) * E8M0ToDouble(scale));
}

void DequantRow(const uint8_t* row, uint16_t* out) {
  for (uint32_t i = 0; i < kRowValues; ++i) {
    out[i] = DequantValue(row[i], row[kRowValues + i / kScaleBlock]);
  }
}

uint64_t DequantScatter(std::span<const uint8_t> rows, uint32_t num_rows,
                        std::span<const int32_t> index_map, std::span<uint16_t> out) {
  assert(rows.size() >= uint64_t{num_rows} * kRowBytes);
  assert(out.size() >= index_map.size() * kRowValues);
  uint64_t bad = 0;
  for (size_t slot = 0; slot < index_map.size(); ++slot) {
    uint16_t* dst = out.data() + slot * kRowValues;
    const int32_t index = index_map[slot];
    if (index < 0) {
      for (uint32_t i = 0; i < kRowValues; ++i) dst[i] = 0;
    } else if (static_cast<uint32_t>(index) >= num_rows) {
      for (uint32_t i = 0; i < kRowValues; ++i) dst[i] = kBf16NaN;
      ++bad;
    } else {
      DequantRow(rows.data() + uint64_t(index) * kRowBytes, dst);
    }
  }
  return bad;
}

}  // namespace engram
