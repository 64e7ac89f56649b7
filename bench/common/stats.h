// Order statistics of a benchmark's samples: the quantiles and means its tables print.
//
//   std::vector<uint64_t> ns = ...;                   // one latency a step
//   printf("p99 %.1f µs\n", Quantile(ns, 0.99) / 1e3);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>
#include <vector>

namespace engram::bench {

// The q-quantile of the samples (0.5: the median, 0.99: p99): the element at index q x size of
// them sorted, the largest for q = 1; `if_empty` when there are none.
template <typename T>
T Quantile(std::vector<T> v, double q, std::type_identity_t<T> if_empty = T{}) {
  if (v.empty()) return if_empty;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// The arithmetic mean; NaN when there are no samples.
inline double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? NAN : s / v.size();
}

}  // namespace engram::bench
