// CPU reference for the dequantise-and-scatter kernel: plain C++ written independently of the
// GPU code (double arithmetic and explicit rounding), so that tests can compare bit for bit.
#pragma once

#include <cstdint>
#include <span>

namespace engram {

// FP8 E4M3 (the "FN" variant: no infinities, 0x7F and 0xFF are NaN) as an exact double.
double E4M3ToDouble(uint8_t byte);
// E8M0 scale byte as 2^(byte - 127); 255 is NaN.
double E8M0ToDouble(uint8_t byte);
// Rounds x to the nearest bf16, ties to even, keeping subnormals; |x| past the largest bf16
// rounds to +-inf; NaN becomes 0x7FC0 (kBf16NaN).
uint16_t RoundToBf16(double x);
inline constexpr uint16_t kBf16NaN = 0x7FC0;

// One value: e4m3(value) * 2^(scale - 127) as bf16 bits.
uint16_t DequantValue(uint8_t value, uint8_t scale);
// One 264-byte row (256 values, then 8 scales) into 256 bf16 values.
void DequantRow(const uint8_t* row, uint16_t* out);

// The whole scatter, with the kernel's index-map contract: slot s (token * heads + head) gets row
// index_map[s]; a negative index writes +0.0; an index >= num_rows writes kBf16NaN and is
// counted. `rows` holds num_rows * 264 bytes, `out` tokens * heads * 256 values.
// Returns the number of out-of-range indices.
uint64_t DequantScatter(std::span<const uint8_t> rows, uint32_t num_rows,
                        std::span<const int32_t> index_map, std::span<uint16_t> out);

}  // namespace engram
