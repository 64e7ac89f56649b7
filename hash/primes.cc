// Miller-Rabin with the 12 prime bases that decide every n < 2^64, and the Engram prime search.
#include "hash/primes.h"

#include <cstdint>
#include <unordered_set>
#include <vector>

namespace engram {
namespace {

uint64_t MulMod(uint64_t a, uint64_t b, uint64_t m) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(a) * b % m);
}

uint64_t PowMod(uint64_t base, uint64_t exp, uint64_t m) {
  uint64_t result = 1;
  base %= m;
  while (exp > 0) {
    if (exp & 1) result = MulMod(result, base, m);
    base = MulMod(base, base, m);
    exp >>= 1;
  }
  return result;
}

}  // namespace

bool IsPrime(uint64_t n) {
  constexpr uint64_t kBases[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  if (n < 2) return false;
  for (uint64_t p : kBases) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int s = 0;
  while ((d & 1) == 0) {
    d >>= 1;
    ++s;
  }
  for (uint64_t a : kBases) {
    uint64_t x = PowMod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int i = 1; i < s && composite; ++i) {
      x = MulMod(x, x, n);
      if (x == n - 1) composite = false;
    }
    if (composite) return false;
  }
  return true;
}

std::vector<uint64_t> FindHeadPrimes(uint32_t num_layers, const std::vector<uint64_t>& search_start,
                                     uint32_t n_heads) {
  std::vector<uint64_t> primes;
  std::unordered_set<uint64_t> taken;
  for (uint32_t layer = 0; layer < num_layers; ++layer) {
    for (uint64_t start : search_start) {
      uint64_t candidate = start - 1;
      for (uint32_t head = 0; head < n_heads; ++head) {
        do {
          ++candidate;
        } while (!IsPrime(candidate) || taken.contains(candidate));
        taken.insert(candidate);
        primes.push_back(candidate);
      }
    }
  }
  return primes;
}

}  // namespace engram
