// Prime tests and the Engram reference's per-head prime search.
#pragma once

#include <cstdint>
#include <vector>

namespace engram {

// Deterministic Miller-Rabin, exact for every 64-bit n.
bool IsPrime(uint64_t n);

// The primes of every (layer, order, head), in that order, as the Engram reference finds them:
// for each layer and each order 2..max_ngram_size, the search starts at
// search_start[order - 2] - 1 and takes, n_heads times, the next prime above the previous pick
// that no earlier (layer, order, head) has taken. Result: layers x orders x heads, flattened.
std::vector<uint64_t> FindHeadPrimes(uint32_t num_layers, const std::vector<uint64_t>& search_start,
                                     uint32_t n_heads);

}  // namespace engram
