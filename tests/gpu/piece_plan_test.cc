// How the pipelined GPU step cuts a call into pieces (kernels/piece_plan.h), checked on the CPU
// so that every build runs it: the default piece size, and the size raised so that any call's
// pieces fit the limit, always a multiple of 16 rows.
#include "kernels/piece_plan.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <vector>

namespace engram::kernels {
namespace {

TEST_CASE("a decode step takes the default pieces") {
  const uint64_t step[2] = {576, 576};
  CHECK(DefaultPieceRows(step, 2, 32) == ENGRAM_GPU_PIECE_ROWS_DEFAULT);
  CHECK(PieceCount(step, 2, ENGRAM_GPU_PIECE_ROWS_DEFAULT) == 8);
  const uint64_t small[3] = {1, 16, 143};
  CHECK(DefaultPieceRows(small, 3, 3) == ENGRAM_GPU_PIECE_ROWS_DEFAULT);
}

TEST_CASE("a call too large for the default gets the smallest multiple of 16 that fits") {
  const uint64_t big[1] = {6000};
  const uint32_t p = DefaultPieceRows(big, 1, 32);
  CHECK(p % kPieceRowsMultiple == 0);
  CHECK(PieceCount(big, 1, p) <= 32);
  CHECK(PieceCount(big, 1, p - kPieceRowsMultiple) > 32);
  // As many requests as pieces allowed: one piece each.
  const uint64_t many[4] = {1000, 3000, 17, 4096};
  const uint32_t q = DefaultPieceRows(many, 4, 4);
  CHECK(q % kPieceRowsMultiple == 0);
  CHECK(PieceCount(many, 4, q) == 4);
}

TEST_CASE("row counts past any real request still give a multiple of 16, at once") {
  // The call refuses such requests (they exceed any data region); the size only has to be valid.
  const uint64_t absurd[2] = {uint64_t{1} << 40, UINT64_MAX};
  const uint32_t p = DefaultPieceRows(absurd, 2, 32);
  CHECK(p % kPieceRowsMultiple == 0);
  CHECK(p >= ENGRAM_GPU_PIECE_ROWS_DEFAULT);
  // More requests than pieces allowed: nothing fits, and the call says so with the count.
  const uint64_t crowded[3] = {10, 10, 10};
  CHECK(DefaultPieceRows(crowded, 3, 2) % kPieceRowsMultiple == 0);
  const uint64_t largest[1] = {kLargestPieceRows};
  const uint32_t q = DefaultPieceRows(largest, 1, 32);
  CHECK(q % kPieceRowsMultiple == 0);
  CHECK(PieceCount(largest, 1, q) <= 32);
}

TEST_CASE("random calls: the chosen size is a multiple of 16 and the pieces fit") {
  std::mt19937_64 rng(1201);
  for (int round = 0; round < 20000; ++round) {
    const uint32_t max_pieces = 1 + rng() % 32;
    const uint32_t n = 1 + rng() % max_pieces;
    std::vector<uint64_t> rows(n);
    const uint64_t scale = uint64_t{1} << (rng() % 24);
    for (auto& r : rows) r = 1 + rng() % scale;
    const uint32_t p = DefaultPieceRows(rows.data(), n, max_pieces);
    INFO("round " << round << ": " << n << " requests, up to " << max_pieces << " pieces, p " << p);
    REQUIRE(p % kPieceRowsMultiple == 0);
    REQUIRE(p >= ENGRAM_GPU_PIECE_ROWS_DEFAULT);
    REQUIRE(PieceCount(rows.data(), n, p) <= max_pieces);
    if (p > ENGRAM_GPU_PIECE_ROWS_DEFAULT) {  // the smallest that fits
      REQUIRE(PieceCount(rows.data(), n, p - kPieceRowsMultiple) > max_pieces);
    }
  }
}

}  // namespace
}  // namespace engram::kernels
