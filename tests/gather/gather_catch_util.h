// What the gather engine's Catch2 tests share beyond gather_test_util.h (which the benchmarks
// use too): tables and engines that must open, the one table's statistics, gathers into a
// poisoned buffer, the real read behind a read seam, and a notice collector.
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gather/gather_engine.h"
#include "testkit/gather_test_util.h"

namespace engram::testing {

// The packed file, or the checkpoint directory's table of `layer`; the test stops if it fails.
inline std::unique_ptr<Table> RequireTable(const std::string& path, uint32_t layer) {
  auto t = OpenOne(path, layer);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  return std::move(*t);
}

inline std::unique_ptr<GatherEngine> RequireEngine(const GatherEngineOptions& o) {
  auto e = GatherEngine::Create(o);
  INFO(e.status().ToString());
  REQUIRE(e.ok());
  return std::move(*e);
}

// The statistics of an engine serving one table.
inline TableGatherStats StatsOf(GatherEngine& e) {
  auto s = e.Stats();
  REQUIRE(s.size() == 1);
  return s[0];
}

// Gathers `rows` into `out`, resized and filled with 0xEE first so no stale row can pass.
inline absl::Status GatherInto(GatherEngine& e, const Table& t, const std::vector<uint64_t>& rows,
                               std::vector<uint8_t>& out) {
  out.assign(rows.size() * kRowBytes, 0xEE);
  return e.Gather({.table = &t, .rows = rows, .dest = out.data()});
}

// The read a ReadFn seam passes on to: preadv2 with -errno on failure.
inline ssize_t RealRead(int fd, const iovec* iov, int cnt, off_t off, int flags) {
  const ssize_t n = preadv2(fd, iov, cnt, off, flags);
  return n < 0 ? -errno : n;
}

// Collects the engine's notices; thread-safe.
struct Notices {
  std::mutex mu;
  std::vector<std::string> seen;
  NoticeFn Fn() {
    return [this](const std::string& n) {
      std::lock_guard<std::mutex> l(mu);
      seen.push_back(n);
    };
  }
  std::vector<std::string> All() {
    std::lock_guard<std::mutex> l(mu);
    return seen;
  }
  int Count(const std::string& part) {
    std::lock_guard<std::mutex> l(mu);
    return static_cast<int>(std::count_if(seen.begin(), seen.end(), [&](const std::string& n) {
      return n.find(part) != std::string::npos;
    }));
  }
};

}  // namespace engram::testing
