// The skips of tests/common/skip.h, kept for the end of the run: shared by the Catch2 mains
// (catch_main.cc, tests/gpu/gpu_test_main.cc).
#include "tests/common/skip.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

namespace engram::testing {
namespace {
std::vector<std::string>& Skips() {
  static std::vector<std::string> skips;
  return skips;
}
}  // namespace

void RecordSkip(const std::string& reason) {
  Skips().push_back(Catch::getResultCapture().getCurrentTestName() + ": " + reason);
}

int ExitStatusWithSkips(int failed) {
  if (failed != 0 || Skips().empty()) return failed;
  for (const std::string& s : Skips()) std::fprintf(stderr, "SKIP: %s\n", s.c_str());
  return 77;
}

}  // namespace engram::testing
