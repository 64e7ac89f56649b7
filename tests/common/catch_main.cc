// The one translation unit that holds Catch2's main; every test binary links it. It exits 77
// (meson's SKIP) when a test case skipped (tests/common/skip.h) and none failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/common/skip.h"

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

}  // namespace engram::testing

int main(int argc, char** argv) {
  const int failed = Catch::Session().run(argc, argv);
  const auto& skips = engram::testing::Skips();
  if (failed != 0 || skips.empty()) return failed;
  for (const std::string& s : skips) std::fprintf(stderr, "SKIP: %s\n", s.c_str());
  return 77;
}
