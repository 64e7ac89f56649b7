// Exact remainder by a fixed divisor through a precomputed 64-bit reciprocal, and the
// non-negative (floor) remainder of an int64 as NumPy's `%` computes it.
//
//   engram::FastMod mod(16000057);
//   uint64_t r = mod(x);                 // == x % 16000057 for every uint64_t x
//   uint64_t s = mod.ModBelow2To63(x);   // the same for x < 2^63, one multiply fewer
//   uint64_t h = mod.FloorModInt64(mix);  // == numpy.int64(mix) % 16000057, in [0, p)
#pragma once

#include <cstdint>

namespace engram {

// Barrett reduction with m = floor((2^64 - 1) / d). For every x < 2^64 the estimated quotient
// q = floor(x * m / 2^64) satisfies q <= x / d < q + 2, because d * m >= 2^64 - d; so one
// conditional subtraction makes the remainder exact. Two multiplies replace a 64-bit divide.
class FastMod {
 public:
  FastMod() = default;
  explicit FastMod(uint64_t divisor) : divisor_(divisor), reciprocal_(UINT64_MAX / divisor) {
    // Granlund-Montgomery for numerators below 2^63: with l = ceil(log2 d) and
    // m = ceil(2^(63 + l) / d), m * d - 2^(63 + l) < d <= 2^l, so floor(x / d) equals
    // floor(x * m / 2^(63 + l)) for every x < 2^63; m < 2^64 because d > 2^(l - 1) (or d is
    // a power of two and m = 2^63).
    if (divisor >= 2) {
      uint32_t l = 0;
      while (l < 64 && (uint64_t{1} << l) < divisor) ++l;
      const unsigned __int128 pow = static_cast<unsigned __int128>(1) << (63 + l);
      below63_multiplier_ = static_cast<uint64_t>((pow + divisor - 1) / divisor);
      below63_shift_ = l - 1;
    }
  }

  uint64_t divisor() const { return divisor_; }

  uint64_t operator()(uint64_t x) const {
    const uint64_t q =
        static_cast<uint64_t>((static_cast<unsigned __int128>(x) * reciprocal_) >> 64);
    uint64_t r = x - q * divisor_;
    if (r >= divisor_) r -= divisor_;
    return r;
  }

  // x % d for x < 2^63 and d >= 2, without a correction step: one high multiply and a shift.
  uint64_t ModBelow2To63(uint64_t x) const {
    const uint64_t q =
        static_cast<uint64_t>((static_cast<unsigned __int128>(x) * below63_multiplier_) >> 64) >>
        below63_shift_;
    return x - q * divisor_;
  }

  // Python/NumPy semantics for a signed dividend: the result takes the divisor's sign, so it is
  // in [0, d). For x < 0, x = -(y + 1) with y = ~x >= 0 and x mod d = d - 1 - (y mod d).
  uint64_t FloorModInt64(uint64_t x) const {
    const uint64_t negative = static_cast<uint64_t>(static_cast<int64_t>(x) >> 63);
    const uint64_t r = divisor_ >= 2 ? ModBelow2To63(x ^ negative) : 0;
    return negative ? divisor_ - 1 - r : r;
  }

 private:
  uint64_t divisor_ = 1;
  uint64_t reciprocal_ = UINT64_MAX;
  uint64_t below63_multiplier_ = 0;
  uint32_t below63_shift_ = 0;
};

}  // namespace engram
