// Page-cache residency (daemon/ops/residency.h): cachestat and mincore agree on a file whose pages
// were read and dropped, partial pages at the ends count as the methods document, and errors
// name the file. The cases tagged [cachestat] run as their own meson test, which skips (exit 77)
// on a kernel without cachestat(2).
#include "daemon/ops/residency.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/page_size.h"
#include "tests/common/skip.h"

namespace engram {
namespace {

// The kernel's page: what fadvise drops and mincore counts.
const uint64_t kPage = KernelPageBytes();
constexpr uint64_t kPages = 64;

struct TempFile {
  std::string path;
  int fd = -1;
  TempFile() {
    char tmpl[] = "/var/tmp/engram-residency-XXXXXX";
    fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    path = tmpl;
    std::vector<uint8_t> data(kPages * kPage, 0x5A);
    REQUIRE(pwrite(fd, data.data(), data.size(), 0) == static_cast<ssize_t>(data.size()));
    REQUIRE(fsync(fd) == 0);  // clean pages, so that DONTNEED can drop them
  }
  ~TempFile() {
    close(fd);
    unlink(path.c_str());
  }
  void ReadAll() const {
    std::vector<uint8_t> buf(kPages * kPage);
    REQUIRE(pread(fd, buf.data(), buf.size(), 0) == static_cast<ssize_t>(buf.size()));
  }
  void Drop(uint64_t first_page, uint64_t pages) const {
    REQUIRE(posix_fadvise(fd, first_page * kPage, pages * kPage, POSIX_FADV_DONTNEED) == 0);
  }
};

// Whether this kernel has cachestat(2) (Linux 6.5+); the [cachestat] cases skip without it.
bool HaveCachestat(const TempFile& f) {
  return !absl::IsUnimplemented(ResidencyByCachestat(f.fd, f.path, 0, kPage).status());
}

// Both methods over one range; a proactive reclaimer may change the page cache between the two
// calls, so they are asked again a few times before judging.
void ExpectAgreement(const TempFile& f, uint64_t offset, uint64_t bytes) {
  INFO("range [" << offset << ", " << offset + bytes << ")");
  absl::StatusOr<Residency> by_mincore, by_cachestat;
  for (int i = 0; i < 4; ++i) {
    by_cachestat = ResidencyByCachestat(f.fd, f.path, offset, bytes);
    REQUIRE(by_cachestat.ok());
    by_mincore = ResidencyByMincore(f.fd, f.path, offset, bytes);
    REQUIRE(by_mincore.ok());
    if (by_mincore->resident_bytes == by_cachestat->resident_bytes) break;
  }
  CHECK(by_cachestat->resident_bytes == by_mincore->resident_bytes);
  CHECK(std::string(by_cachestat->method) == "cachestat");
  CHECK(std::string(by_mincore->method) == "mincore");
}

TEST_CASE("a read file is resident, a dropped one is not", "[residency]") {
  TempFile f;
  f.ReadAll();
  absl::StatusOr<Residency> r = ResidencyByMincore(f.fd, f.path, 0, kPages * kPage);
  REQUIRE(r.ok());
  CHECK(r->resident_bytes == kPages * kPage);
  r = ResidencyOf(f.fd, f.path, 0, kPages * kPage);
  REQUIRE(r.ok());
  CHECK(r->resident_bytes == kPages * kPage);

  f.Drop(0, kPages);
  r = ResidencyByMincore(f.fd, f.path, 0, kPages * kPage);
  REQUIRE(r.ok());
  CHECK(r->resident_bytes == 0);
}

TEST_CASE("cachestat agrees with mincore on a read and a dropped file", "[cachestat]") {
  TempFile f;
  if (!HaveCachestat(f)) ENGRAM_SKIP("this kernel has no cachestat(2) (Linux 6.5+)");
  f.ReadAll();
  ExpectAgreement(f, 0, kPages * kPage);
  f.Drop(0, kPages);
  ExpectAgreement(f, 0, kPages * kPage);
}

TEST_CASE("a partly dropped file: the methods agree page by page", "[cachestat]") {
  TempFile f;
  if (!HaveCachestat(f)) ENGRAM_SKIP("this kernel has no cachestat(2) (Linux 6.5+)");
  f.ReadAll();
  f.Drop(kPages / 2, kPages / 2);
  // Large folios may keep more than was dropped; what matters is that both see the same.
  absl::StatusOr<Residency> whole = ResidencyByMincore(f.fd, f.path, 0, kPages * kPage);
  REQUIRE(whole.ok());
  CHECK(whole->resident_bytes >= kPages / 2 * kPage);
  ExpectAgreement(f, 0, kPages * kPage);
  ExpectAgreement(f, 0, kPages / 2 * kPage);
  ExpectAgreement(f, kPages / 2 * kPage, kPages / 2 * kPage);
}

TEST_CASE("partial pages at the ends of a range", "[residency]") {
  TempFile f;
  f.ReadAll();
  // 100 bytes into page 0 through 904 bytes into page 1: mincore counts the bytes exactly;
  // cachestat counts whole pages, up to the range's length.
  absl::StatusOr<Residency> m = ResidencyByMincore(f.fd, f.path, 100, 5000);
  REQUIRE(m.ok());
  CHECK(m->resident_bytes == 5000);
  absl::StatusOr<Residency> empty = ResidencyOf(f.fd, f.path, 4096, 0);
  REQUIRE(empty.ok());
  CHECK(empty->resident_bytes == 0);
}

TEST_CASE("cachestat counts the partial pages at the ends of a range as whole", "[cachestat]") {
  TempFile f;
  if (!HaveCachestat(f)) ENGRAM_SKIP("this kernel has no cachestat(2) (Linux 6.5+)");
  f.ReadAll();
  absl::StatusOr<Residency> c = ResidencyByCachestat(f.fd, f.path, 100, 5000);
  REQUIRE(c.ok());
  CHECK(c->resident_bytes == 5000);
}

TEST_CASE("errors name the file", "[residency]") {
  absl::StatusOr<Residency> r = ResidencyOf(-1, "/nowhere/table.engram", 0, kPage);
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()).find("/nowhere/table.engram") != std::string::npos);
}

}  // namespace
}  // namespace engram
