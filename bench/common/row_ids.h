// Row ids for the benchmarks: uniform over a range, or Zipf(s) over ranks scattered over the range
// by a bijective multiplicative hash so that hot rows are not neighbours in the file.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace engram::bench {

// Draws ids from [begin, begin + count) (`dist`: "uniform" or "zipf").
class RowIdSource {
 public:
  RowIdSource(const std::string& dist, uint64_t begin, uint64_t count, double s, uint64_t seed)
      : zipf_(dist == "zipf"),
        begin_(begin),
        count_(std::max<uint64_t>(1, count)),
        s_(s),
        rng_(seed) {
    mult_ = 0x9E3779B97F4A7C15ull % count_;
    if (mult_ == 0) mult_ = 1;
    while (std::gcd(mult_, count_) != 1) ++mult_;
  }
  uint64_t Next() {
    if (!zipf_) return begin_ + rng_() % count_;
    // Inverse-CDF sampling of a continuous Zipf(s) density on [1, count + 1).
    const double n1 = static_cast<double>(count_) + 1.0;
    const double x = unit_(rng_);
    double k;
    if (std::abs(s_ - 1.0) < 1e-9) {
      k = std::pow(n1, x);
    } else {
      k = std::pow(1.0 + x * (std::pow(n1, 1.0 - s_) - 1.0), 1.0 / (1.0 - s_));
    }
    const uint64_t rank = std::min<uint64_t>(count_ - 1, static_cast<uint64_t>(k) - 1);
    return begin_ +
           static_cast<uint64_t>((static_cast<unsigned __int128>(rank) * mult_ + 12345) % count_);
  }
  void Fill(uint64_t* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = Next();
  }

 private:
  bool zipf_;
  uint64_t begin_, count_, mult_;
  double s_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> unit_{0.0, 1.0};
};

// `n` ids over [0, rows).
inline std::vector<uint64_t> MakeRows(const std::string& dist, size_t n, uint64_t rows, double s,
                                      uint64_t seed) {
  std::vector<uint64_t> out(n);
  RowIdSource(dist, 0, rows, s, seed).Fill(out.data(), n);
  return out;
}

// `n` distinct uniform ids over [0, rows) (rows >= n), in random order: a batch of misses.
inline std::vector<uint64_t> DistinctRows(std::mt19937_64& rng, uint64_t rows, uint64_t n) {
  std::vector<uint64_t> out;
  while (out.size() < n) {
    out.push_back(rng() % rows);
    if (out.size() == n) {
      std::sort(out.begin(), out.end());
      out.erase(std::unique(out.begin(), out.end()), out.end());
    }
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

}  // namespace engram::bench
