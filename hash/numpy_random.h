// NumPy's default random generator (SeedSequence + PCG64) and Generator.integers() for int64,
// reproduced bit for bit so the Engram multipliers can be derived without Python.
//
//   engram::NumpyGenerator rng(10007);            // numpy.random.default_rng(10007)
//   auto r = rng.IntegersInt64(0, half_bound, 4);  // .integers(0, half_bound, 4, dtype=int64)
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace engram {

// numpy.random.SeedSequence(entropy).generate_state(n_words, dtype=uint64) for a non-negative
// integer entropy, without spawn keys (what default_rng(int) does).
std::vector<uint64_t> SeedSequenceState(uint64_t entropy, uint32_t n_words);

// numpy.random.PCG64 (the 128-bit LCG with XSL-RR output) as seeded from a SeedSequence.
class Pcg64 {
 public:
  explicit Pcg64(uint64_t seed);
  uint64_t NextUint64();

 private:
  unsigned __int128 state_ = 0;
  unsigned __int128 increment_ = 0;
};

// numpy.random.default_rng(seed): the generator methods the Engram derivation needs.
class NumpyGenerator {
 public:
  explicit NumpyGenerator(uint64_t seed) : bit_generator_(seed) {}

  // Generator.integers(low, high, size=count, dtype=np.int64), endpoint=False: NumPy's
  // unmasked Lemire rejection sampling. Ranges of 2^32 values or fewer take a 32-bit path in
  // NumPy that is not reproduced here; they are refused with InvalidArgument.
  absl::StatusOr<std::vector<int64_t>> IntegersInt64(int64_t low, int64_t high, uint32_t count);

 private:
  Pcg64 bit_generator_;
};

}  // namespace engram
