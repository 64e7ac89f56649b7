// How engram_gpu_queue_gather_dequant cuts a call's requests into pieces: plain host code, so
// that the library (nvcc, hipcc) and a CPU test (tests/gpu/piece_plan_test.cc) share it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "engram/gpu_submit.h"
#include "engram/row.h"

namespace engram::kernels {

// Pieces of one destination start on 128-byte boundaries (16 rows of 264 bytes = 33 x 128), so
// no cache line the fused kernel reads holds rows of two pieces, one of them not yet landed.
inline constexpr uint32_t kPieceAlign = 128;
inline constexpr uint32_t kPieceRowsMultiple = 16;
static_assert(kPieceRowsMultiple * ENGRAM_ROW_BYTES % kPieceAlign == 0);
static_assert(ENGRAM_GPU_PIECE_ROWS_DEFAULT % kPieceRowsMultiple == 0);
// The largest piece size, a multiple of kPieceRowsMultiple.
inline constexpr uint64_t kLargestPieceRows =
    uint64_t{UINT32_MAX} / kPieceRowsMultiple * kPieceRowsMultiple;

// Pieces of at most `piece_rows` rows that requests of rows[0..n) rows take (piece_rows > 0).
inline uint64_t PieceCount(const uint64_t* rows, uint32_t n, uint64_t piece_rows) {
  uint64_t pieces = 0;
  for (uint32_t i = 0; i < n; ++i) pieces += rows[i] / piece_rows + (rows[i] % piece_rows != 0);
  return pieces;
}

// ENGRAM_GPU_PIECE_ROWS_DEFAULT, or, where requests of rows[0..n) rows would need more than
// max_pieces pieces of it, the smallest multiple of kPieceRowsMultiple that makes them fit (at
// most kLargestPieceRows). Where nothing fits (more requests than max_pieces, or a request
// longer than any data region, which the call refuses anyway) it returns a valid size all the
// same.
inline uint32_t DefaultPieceRows(const uint64_t* rows, uint32_t n, uint32_t max_pieces) {
  uint64_t total = 0, longest = 0;
  for (uint32_t i = 0; i < n; ++i) {
    total += std::min(rows[i], kLargestPieceRows);
    longest = std::max(longest, rows[i]);
  }
  if (PieceCount(rows, n, ENGRAM_GPU_PIECE_ROWS_DEFAULT) <= max_pieces) {
    return ENGRAM_GPU_PIECE_ROWS_DEFAULT;
  }
  // Each request's last piece may be short: with p >= total / (max_pieces - n) the pieces
  // number at most total / p + n <= max_pieces; with p >= the longest request, n. The
  // smallest size that fits lies between the default and that bound: PieceCount only falls as
  // p grows, so halve the interval in steps of kPieceRowsMultiple.
  uint64_t bound = max_pieces > n ? (total + max_pieces - n - 1) / (max_pieces - n) : longest;
  bound = std::min(bound, kLargestPieceRows - kPieceRowsMultiple + 1);
  uint64_t lo = ENGRAM_GPU_PIECE_ROWS_DEFAULT / kPieceRowsMultiple;  // does not fit
  uint64_t hi = (bound + kPieceRowsMultiple - 1) / kPieceRowsMultiple;
  if (PieceCount(rows, n, hi * kPieceRowsMultiple) > max_pieces) {
    return static_cast<uint32_t>(hi * kPieceRowsMultiple);  // rows past any real request
  }
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (PieceCount(rows, n, mid * kPieceRowsMultiple) <= max_pieces ? hi : lo) = mid;
  }
  return static_cast<uint32_t>(hi * kPieceRowsMultiple);
}

}  // namespace engram::kernels
