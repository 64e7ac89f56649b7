// A visible skip for Catch2 2.x, which has none: ENGRAM_SKIP(reason) ends the test case and
// records why; the test binary then exits 77 (meson's SKIP) with the reasons on stderr if
// nothing failed. Tests that can skip are tagged so that meson runs them as their own test and
// a skip never hides the others passing (tests/table/meson.build: [holes]).
#pragma once

#include <string>

namespace engram::testing {

// Records that the current test case cannot run here, and why.
void RecordSkip(const std::string& reason);

// What main() returns after the run: `failed` when a test failed or none skipped, else 77 (meson's
// SKIP), with each skip's reason on stderr (tests/common/skip.cc).
int ExitStatusWithSkips(int failed);

}  // namespace engram::testing

#define ENGRAM_SKIP(reason)                \
  do {                                     \
    ::engram::testing::RecordSkip(reason); \
    return;                                \
  } while (0)
