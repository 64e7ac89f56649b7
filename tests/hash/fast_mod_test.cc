// FastMod against the hardware remainder: edge values around multiples of the divisor, the
// ends of the 64-bit range, and NumPy's floor modulo for negative int64 mixes.
#include "hash/fast_mod.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace engram {
namespace {

std::vector<uint64_t> Divisors() {
  std::vector<uint64_t> d = {1,
                             2,
                             3,
                             7,
                             10,
                             16000057,
                             16000463,
                             16000477,
                             16000889,
                             65535,
                             4294967291,
                             4294967295,
                             4294967296,
                             4294967311,
                             1ULL << 62,
                             (1ULL << 63) - 25,
                             1ULL << 63,
                             (1ULL << 63) + 1,
                             UINT64_MAX - 58,
                             UINT64_MAX - 1,
                             UINT64_MAX};
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200; ++i) d.push_back((rng() >> (rng() % 64)) | 1);
  for (int i = 0; i < 200; ++i) d.push_back(16000000 + rng() % 1000);
  return d;
}

std::vector<uint64_t> Values(uint64_t d, std::mt19937_64& rng) {
  std::vector<uint64_t> v = {0,
                             1,
                             2,
                             d - 1,
                             d,
                             d + 1,
                             2 * d - 1,
                             2 * d,
                             INT64_MAX,
                             1ULL << 63,
                             (1ULL << 63) + 1,
                             UINT64_MAX,
                             UINT64_MAX - 1};
  const uint64_t top = UINT64_MAX / d;  // the largest quotient
  for (uint64_t q : {top, top - 1, top / 2, top / 3 + 1}) {
    const uint64_t base = q * d;
    v.push_back(base);
    v.push_back(base - 1);
    if (base <= UINT64_MAX - (d - 1)) v.push_back(base + (d - 1));
  }
  for (int i = 0; i < 500; ++i) v.push_back(rng());
  return v;
}

TEST_CASE("FastMod equals the hardware remainder for every value class") {
  std::mt19937_64 rng(7);
  for (uint64_t d : Divisors()) {
    const FastMod mod(d);
    for (uint64_t x : Values(d, rng)) {
      INFO("x = " << x << ", d = " << d);
      REQUIRE(mod(x) == x % d);
    }
  }
}

TEST_CASE("ModBelow2To63 equals the hardware remainder below 2^63") {
  std::mt19937_64 rng(8);
  std::vector<uint64_t> divisors = Divisors();
  for (uint32_t j = 1; j < 64; ++j) divisors.push_back(uint64_t{1} << j);  // powers of two
  for (uint64_t d : divisors) {
    if (d < 2) continue;
    const FastMod mod(d);
    for (uint64_t x : Values(d, rng)) {
      x &= INT64_MAX;  // the contract: x < 2^63
      INFO("x = " << x << ", d = " << d);
      REQUIRE(mod.ModBelow2To63(x) == x % d);
    }
    const uint64_t top = INT64_MAX / d;
    for (uint64_t q : {top, top - 1}) {
      for (uint64_t x : {q * d, q * d - 1, q * d + (d - 1)}) {
        if (x > static_cast<uint64_t>(INT64_MAX)) continue;
        REQUIRE(mod.ModBelow2To63(x) == x % d);
      }
    }
  }
}

TEST_CASE("FastMod is exact over a dense range of one DeepSeek-V4.1 prime's multiples") {
  const uint64_t p = 16000057;
  const FastMod mod(p);
  const uint64_t top = UINT64_MAX / p;
  for (uint64_t q = top - 2000; q <= top; ++q) {
    for (uint64_t off : {uint64_t{0}, uint64_t{1}, p - 1}) {
      const uint64_t x = q * p + off;
      if (x < q * p) continue;  // wrapped past 2^64
      REQUIRE(mod(x) == x % p);
      const uint64_t y = x >> 1;  // and its neighbourhood below 2^63
      REQUIRE(mod.ModBelow2To63(y) == y % p);
    }
  }
}

// NumPy: int64 % positive int is non-negative (floor division semantics).
uint64_t NumpyFloorMod(int64_t x, uint64_t d) {
  __int128 r = static_cast<__int128>(x) % static_cast<__int128>(d);
  if (r < 0) r += d;
  return static_cast<uint64_t>(r);
}

TEST_CASE("FloorModInt64 follows NumPy for negative and positive mixes") {
  std::mt19937_64 rng(9);
  for (uint64_t d : {uint64_t{2}, uint64_t{3}, uint64_t{16000057}, uint64_t{16000889},
                     uint64_t{4294967291}, uint64_t{(1ULL << 63) - 25}}) {
    const FastMod mod(d);
    const int64_t sd = static_cast<int64_t>(d);
    std::vector<int64_t> xs = {0, 1, -1, INT64_MAX, INT64_MIN, INT64_MIN + 1};
    // Values next to k * d, where they are int64s: for d near 2^63, -2 * d is not.
    for (const auto& [k, c] : std::vector<std::pair<int64_t, int64_t>>{
             {1, -1}, {1, 0}, {-1, 0}, {-1, 1}, {-1, -1}, {-2, 0}, {-2, 1}}) {
      int64_t x;
      if (!__builtin_mul_overflow(k, sd, &x) && !__builtin_add_overflow(x, c, &x)) {
        xs.push_back(x);
      }
    }
    for (int i = 0; i < 2000; ++i) xs.push_back(static_cast<int64_t>(rng()));
    for (int64_t x : xs) {
      INFO("x = " << x << ", d = " << d);
      const uint64_t got = mod.FloorModInt64(static_cast<uint64_t>(x));
      REQUIRE(got == NumpyFloorMod(x, d));
      REQUIRE(got < d);
    }
  }
}

}  // namespace
}  // namespace engram
