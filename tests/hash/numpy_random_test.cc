// NumPy's SeedSequence, PCG64 and Generator.integers reproduced bit for bit (expected values
// printed by numpy 1.24), the prime test, and DeepSeek-V4.1's multipliers and head primes.
#include "hash/numpy_random.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <numeric>
#include <vector>

#include "hash/hash_tables.h"
#include "hash/primes.h"

namespace engram {
namespace {

TEST_CASE("SeedSequence state matches numpy") {
  CHECK(SeedSequenceState(0, 4) ==
        std::vector<uint64_t>{15793235383387715774ULL, 12390638538380655177ULL,
                              2361836109651742017ULL, 3188717715514472916ULL});
  CHECK(SeedSequenceState(140098, 4) ==
        std::vector<uint64_t>{15805499435905774270ULL, 12485762845600855621ULL,
                              5860821814761405108ULL, 11501711722205355141ULL});
}

TEST_CASE("PCG64 raw output matches numpy") {
  Pcg64 g(10007);
  CHECK(g.NextUint64() == 15187255322829266483ULL);
  CHECK(g.NextUint64() == 959186003677246517ULL);
  CHECK(g.NextUint64() == 7126631698937927467ULL);
}

TEST_CASE("Generator.integers int64 matches numpy") {
  const int64_t high = 46535421845467;
  NumpyGenerator g0(0);
  CHECK(*g0.IntegersInt64(0, high, 6) == std::vector<int64_t>{29641280818904, 12554638533303,
                                                              1906720220866, 769120491428,
                                                              37845873655548, 42475465830421});
  NumpyGenerator g1(123456789012345ULL);  // entropy wider than one 32-bit word
  CHECK(*g1.IntegersInt64(0, high, 3) ==
        std::vector<int64_t>{24664097831584, 2068131598013, 35244113215957});
}

TEST_CASE("Generator.integers refuses what it does not reproduce") {
  NumpyGenerator g(0);
  CHECK(!g.IntegersInt64(5, 5, 1).ok());
  auto small = g.IntegersInt64(0, 1LL << 32, 1);  // NumPy's 32-bit path
  REQUIRE(!small.ok());
  CHECK(small.status().message().find("32-bit") != std::string::npos);
}

TEST_CASE("IsPrime agrees with trial division and known hard cases") {
  for (uint64_t n = 0; n < 20000; ++n) {
    bool prime = n >= 2;
    for (uint64_t f = 2; f * f <= n && prime; ++f) prime = n % f != 0;
    REQUIRE(IsPrime(n) == prime);
  }
  CHECK(IsPrime((1ULL << 61) - 1));
  CHECK(IsPrime(UINT64_MAX - 58));          // the largest 64-bit prime
  CHECK(!IsPrime(3215031751ULL));           // strong pseudoprime to bases 2, 3, 5, 7
  CHECK(!IsPrime(3825123056546413051ULL));  // strong pseudoprime to bases up to 23
  CHECK(!IsPrime(4294967297ULL));           // 641 * 6700417
}

HashConfig Dsv41() {
  HashConfig c;
  c.layer_ids = {1, 14};
  c.num_embeddings = {384006168, 384016682};
  c.max_ngram_size = 4;
  c.n_heads = 8;
  c.prime_search_start = {16000000, 16000000, 16000000};
  c.pad_token_id = 2;
  c.compressed_vocab_size = 99092;
  return c;
}

TEST_CASE("DeepSeek-V4.1 head primes and multipliers") {
  auto layers = DeriveLayerTables(Dsv41());
  REQUIRE(layers.ok());
  const LayerTables& l1 = (*layers)[0];
  const LayerTables& l14 = (*layers)[1];
  CHECK(l1.primes.front() == 16000057);
  CHECK(l1.primes.back() == 16000463);
  CHECK(l1.num_rows() == 384006168);
  CHECK(l14.primes.front() == 16000477);
  CHECK(l14.primes.back() == 16000889);
  CHECK(l14.num_rows() == 384016682);
  CHECK(l1.head_offsets[6] == 96000564);  // TP4 rank 1 starts here
  CHECK(l1.multipliers ==
        std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391});
  CHECK(l14.multipliers ==
        std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591});
  // Every order restarts its search, so primes interleave across orders but never repeat.
  std::vector<uint64_t> all = l1.primes;
  all.insert(all.end(), l14.primes.begin(), l14.primes.end());
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
}

TEST_CASE("A config whose primes do not sum to engram_num_embeddings is refused") {
  HashConfig c = Dsv41();
  c.num_embeddings[1] += 1;
  auto layers = DeriveLayerTables(c);
  REQUIRE(!layers.ok());
  CHECK(layers.status().message().find("layer 14") != std::string::npos);
  CHECK(layers.status().message().find("384016682") != std::string::npos);
}

}  // namespace
}  // namespace engram
