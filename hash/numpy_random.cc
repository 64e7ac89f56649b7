// SeedSequence, PCG64 and bounded int64 draws exactly as NumPy's Generator computes them; the
// constants and mixing order follow numpy/random/bit_generator.pyx and numpy's pcg64.h.
#include "hash/numpy_random.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace engram {
namespace {

// SeedSequence hashing constants (uint32 arithmetic throughout).
constexpr uint32_t kPoolSize = 4;
constexpr uint32_t kInitA = 0x43b0d7e5;
constexpr uint32_t kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd;
constexpr uint32_t kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd;
constexpr uint32_t kMixMultR = 0x4973f715;
constexpr uint32_t kXShift = 16;

uint32_t HashMix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t Mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

// SeedSequence.pool for an integer entropy: the integer is split into little-endian 32-bit
// words (0 is one zero word), then mixed into a 4-word pool.
std::vector<uint32_t> EntropyPool(uint64_t entropy) {
  std::vector<uint32_t> words;
  if (entropy == 0) words.push_back(0);
  for (uint64_t n = entropy; n > 0; n >>= 32) words.push_back(static_cast<uint32_t>(n));

  std::vector<uint32_t> pool(kPoolSize);
  uint32_t hash_const = kInitA;
  for (uint32_t i = 0; i < kPoolSize; ++i) {
    pool[i] = HashMix(i < words.size() ? words[i] : 0, hash_const);
  }
  for (uint32_t src = 0; src < kPoolSize; ++src) {
    for (uint32_t dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) pool[dst] = Mix(pool[dst], HashMix(pool[src], hash_const));
    }
  }
  for (size_t src = kPoolSize; src < words.size(); ++src) {
    for (uint32_t dst = 0; dst < kPoolSize; ++dst) {
      pool[dst] = Mix(pool[dst], HashMix(words[src], hash_const));
    }
  }
  return pool;
}

constexpr unsigned __int128 kPcgMultiplier =
    (static_cast<unsigned __int128>(0x2360ED051FC65DA4ULL) << 64) | 0x4385DF649FCCF645ULL;

}  // namespace

std::vector<uint64_t> SeedSequenceState(uint64_t entropy, uint32_t n_words) {
  const std::vector<uint32_t> pool = EntropyPool(entropy);
  std::vector<uint64_t> state(n_words);
  uint32_t hash_const = kInitB;
  for (uint32_t i = 0; i < 2 * n_words; ++i) {
    uint32_t value = pool[i % kPoolSize];
    value ^= hash_const;
    hash_const *= kMultB;
    value *= hash_const;
    value ^= value >> kXShift;
    // uint32 words viewed as little-endian uint64: the even word is the low half.
    state[i / 2] |= static_cast<uint64_t>(value) << (32 * (i % 2));
  }
  return state;
}

Pcg64::Pcg64(uint64_t seed) {
  const std::vector<uint64_t> words = SeedSequenceState(seed, 4);
  const unsigned __int128 init_state = (static_cast<unsigned __int128>(words[0]) << 64) | words[1];
  const unsigned __int128 init_seq = (static_cast<unsigned __int128>(words[2]) << 64) | words[3];
  // pcg_setseq_128_srandom_r.
  state_ = 0;
  increment_ = (init_seq << 1) | 1;
  state_ = state_ * kPcgMultiplier + increment_;
  state_ += init_state;
  state_ = state_ * kPcgMultiplier + increment_;
}

uint64_t Pcg64::NextUint64() {
  state_ = state_ * kPcgMultiplier + increment_;
  const uint64_t xored = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (xored >> rot) | (xored << ((64 - rot) & 63));
}

absl::StatusOr<std::vector<int64_t>> NumpyGenerator::IntegersInt64(int64_t low, int64_t high,
                                                                   uint32_t count) {
  if (high <= low) {
    return absl::InvalidArgumentError(
        absl::StrFormat("integers(%d, %d): high must be greater than low", low, high));
  }
  // NumPy draws in [0, rng] inclusive and adds low.
  const uint64_t rng = static_cast<uint64_t>(high) - static_cast<uint64_t>(low) - 1;
  if (rng <= 0xFFFFFFFFULL) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "integers(%d, %d): ranges of at most 2^32 values use NumPy's 32-bit sampler, which "
        "is not reproduced (the compressed vocabulary would need over 2^30 entries)",
        low, high));
  }
  std::vector<int64_t> out(count);
  const uint64_t rng_excl = rng + 1;  // rng < 2^64 - 1 because high - low <= 2^64 - 1
  for (uint32_t i = 0; i < count; ++i) {
    unsigned __int128 m = static_cast<unsigned __int128>(bit_generator_.NextUint64()) * rng_excl;
    uint64_t leftover = static_cast<uint64_t>(m);
    if (leftover < rng_excl) {
      const uint64_t threshold = (UINT64_MAX - rng) % rng_excl;
      while (leftover < threshold) {
        m = static_cast<unsigned __int128>(bit_generator_.NextUint64()) * rng_excl;
        leftover = static_cast<uint64_t>(m);
      }
    }
    out[i] = static_cast<int64_t>(static_cast<uint64_t>(low) + static_cast<uint64_t>(m >> 64));
  }
  return out;
}

}  // namespace engram
