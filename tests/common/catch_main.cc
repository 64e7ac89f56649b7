// The one translation unit that holds Catch2's main; every test binary links it. It exits 77
// (meson's SKIP) when a test case skipped (tests/common/skip.h) and none failed. Where the
// machine lacks a kernel interface that some test cases exercise directly (qemu-user refuses
// RWF_NOWAIT reads), those cases are left out by their tag and the run says so: the cases that
// remain test the fallback paths the engine takes there.
#define CATCH_CONFIG_RUNNER
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>

#include "tests/common/skip.h"

namespace engram::testing {

// RWF_NOWAIT reads of a regular file (this binary's): qemu-user answers EOPNOTSUPP or ENOSYS.
bool NowaitMissing(const char* path) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char byte;
  iovec v{&byte, 1};
  const long r = preadv2(fd, &v, 1, 0, RWF_NOWAIT);
  const bool missing = r < 0 && (errno == ENOSYS || errno == EOPNOTSUPP);
  close(fd);
  return missing;
}

}  // namespace engram::testing

int main(int argc, char** argv) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  if (engram::testing::NowaitMissing(argv[0])) {
    std::fprintf(stderr,
                 "this machine refuses RWF_NOWAIT reads of a regular file (an emulator such as "
                 "qemu-user does): the test cases tagged [nowait] are skipped, the engine's "
                 "fallback paths are what runs\n");
    Catch::ConfigData& config = session.configData();
    config.testsOrTags.push_back("~[nowait]");
    session.useConfigData(config);
  }
  return engram::testing::ExitStatusWithSkips(session.run());
}
