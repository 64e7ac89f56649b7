// PageBytes(), KernelPageBytes() and HugePageBytes(): the sizes asked from the kernel once.
#include "base/page_size.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace engram {
namespace {

std::atomic<uint64_t> g_test_granule{0};

}  // namespace

uint64_t KernelPageBytes() {
  static const uint64_t bytes = [] {
    const long v = ::sysconf(_SC_PAGESIZE);
    return v > 0 ? static_cast<uint64_t>(v) : uint64_t{4096};
  }();
  return bytes;
}

uint64_t PageBytes() {
  const uint64_t granule = g_test_granule.load(std::memory_order_relaxed);
  return granule != 0 ? granule : KernelPageBytes();
}

uint64_t ParseHugepagesize(std::string_view meminfo) {
  constexpr std::string_view kKey = "Hugepagesize:";
  size_t at = meminfo.find(kKey);
  // The key starts a line.
  while (at != std::string_view::npos && at != 0 && meminfo[at - 1] != '\n') {
    at = meminfo.find(kKey, at + 1);
  }
  if (at == std::string_view::npos) return 0;
  at += kKey.size();
  while (at < meminfo.size() && meminfo[at] == ' ') ++at;
  uint64_t kib = 0;
  size_t digits = 0;
  for (; at < meminfo.size() && meminfo[at] >= '0' && meminfo[at] <= '9'; ++at, ++digits) {
    if (kib > (UINT64_MAX >> 10) / 10) return 0;
    kib = kib * 10 + static_cast<uint64_t>(meminfo[at] - '0');
  }
  if (digits == 0 || meminfo.substr(at, 3) != " kB") return 0;
  return kib << 10;
}

uint64_t HugePageBytes() {
  static const uint64_t bytes = [] {
    std::ifstream in("/proc/meminfo");
    std::stringstream text;
    text << in.rdbuf();
    return ParseHugepagesize(text.str());
  }();
  return bytes;
}

std::string PageSizeName(uint64_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " bytes";
}

TestPageGranule::TestPageGranule(uint64_t granule_bytes) {
  const uint64_t kernel = KernelPageBytes();
  const bool power_of_two = granule_bytes != 0 && (granule_bytes & (granule_bytes - 1)) == 0;
  if (!power_of_two || granule_bytes % kernel != 0 || g_test_granule.exchange(granule_bytes) != 0) {
    std::fprintf(stderr,
                 "TestPageGranule(%llu): not a power-of-two multiple of the %llu-byte "
                 "kernel page, or another granule is live\n",
                 static_cast<unsigned long long>(granule_bytes),
                 static_cast<unsigned long long>(kernel));
    std::abort();
  }
}

TestPageGranule::~TestPageGranule() { g_test_granule.store(0); }

}  // namespace engram
