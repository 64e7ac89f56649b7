// engram_gpu_register where no GPU runtime can be loaded: a clear error, nothing changed; the
// argument checks and the choice between pinning and unified memory, through a stand-in runtime
// (suite gpu, test gpu_register: every machine); and registration through the default
// runtimes, which must succeed where a GPU and a runtime are present (test
// gpu_register_device, run with the filter [device]: exits 77 on a machine without them).
#include "client/gpu_register.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <string>
#include <vector>

#include "engram/engram.h"
#include "engram/gpu.h"
#include "tests/common/skip.h"

namespace engram {
namespace {

// A GPU device node and a runtime library that loads: then registration has to work. Decided
// without engram_gpu_register, so that the test can catch it failing.
bool GpuPresent(std::string* why) {
  const bool nvidia = access("/dev/nvidia0", F_OK) == 0;
  const bool amd = access("/dev/kfd", F_OK) == 0;
  if (!nvidia && !amd) {
    *why = "no GPU device node (/dev/nvidia0, /dev/kfd)";
    return false;
  }
  for (auto list : {DefaultCudaRuntimeNames(), DefaultHipRuntimeNames()}) {
    for (const char* name : list) {
      if (void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
        dlclose(handle);
        return true;
      }
    }
  }
  *why = "a GPU device node but no loadable CUDA or HIP runtime library";
  return false;
}

TEST_CASE("registration without any GPU runtime fails with ENOSYS and changes nothing",
          "[gpu][register]") {
  const size_t len = 1 << 16;
  void* mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  std::memset(mem, 0x5A, len);
  const char* no_cuda[] = {"libcudart.so.0-engram-test-missing"};
  const char* no_hip[] = {"libamdhip64.so.0-engram-test-missing"};
  engram_gpu_registration* reg = reinterpret_cast<engram_gpu_registration*>(0x1);
  CHECK(GpuRegisterWith(mem, len, no_cuda, no_hip, &reg) == -ENOSYS);
  CHECK(reg == reinterpret_cast<engram_gpu_registration*>(0x1));  // untouched on failure
  const std::string message = engram_last_error();
  CHECK(message.find("no GPU runtime found") != std::string::npos);
  CHECK(message.find("libcudart.so.0-engram-test-missing") != std::string::npos);
  CHECK(message.find("libamdhip64.so.0-engram-test-missing") != std::string::npos);
  // The memory is as it was and still ours to use.
  const auto* bytes = static_cast<const unsigned char*>(mem);
  CHECK(bytes[0] == 0x5A);
  CHECK(bytes[len - 1] == 0x5A);
  std::memset(mem, 0, len);
  CHECK(munmap(mem, len) == 0);
}

TEST_CASE("registration refuses bad arguments", "[gpu][register]") {
  engram_gpu_registration* reg = nullptr;
  char byte = 0;
  CHECK(engram_gpu_register(nullptr, 4096, &reg) == -EINVAL);
  CHECK(std::string(engram_last_error()).find("must all be set") != std::string::npos);
  CHECK(engram_gpu_register(&byte, 0, &reg) == -EINVAL);
  CHECK(engram_gpu_register(&byte, 1, nullptr) == -EINVAL);
  CHECK(reg == nullptr);
  CHECK(engram_gpu_device_ptr(nullptr, &byte) == nullptr);
  CHECK(engram_gpu_registration_runtime(nullptr) == 0);
  CHECK(engram_gpu_unregister(nullptr) == 0);
}

TEST_CASE("registration through the default runtimes succeeds on a GPU machine",
          "[gpu][register][device]") {
  std::string why;
  if (!GpuPresent(&why)) ENGRAM_SKIP("registration on a GPU needs one: " + why);
  const size_t len = 1 << 20;
  void* mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  engram_gpu_registration* reg = nullptr;
  const int rc = engram_gpu_register(mem, len, &reg);
  INFO("engram_gpu_register: " << engram_last_error());
  REQUIRE(rc == 0);
  {
    // The device view covers exactly the range.
    REQUIRE(reg != nullptr);
    CHECK(engram_gpu_registration_runtime(reg) == ENGRAM_GPU_RUNTIME_CUDA);
    char* dev = static_cast<char*>(engram_gpu_device_ptr(reg, mem));
    CHECK(dev != nullptr);
    CHECK(engram_gpu_device_ptr(reg, static_cast<char*>(mem) + len - 1) == dev + len - 1);
    CHECK(engram_gpu_device_ptr(reg, static_cast<char*>(mem) + len) == nullptr);
    CHECK(engram_gpu_device_ptr(reg, static_cast<char*>(mem) - 1) == nullptr);
    engram_gpu_registration* again = nullptr;
    CHECK(engram_gpu_register(mem, len, &again) == -EEXIST);
    CHECK(std::string(engram_last_error()).find("already") != std::string::npos);
    CHECK(engram_gpu_unregister(reg) == 0);
    REQUIRE(engram_gpu_register(mem, len, &reg) == 0);  // registrable again once released
    CHECK(engram_gpu_unregister(reg) == 0);
  }
  CHECK(munmap(mem, len) == 0);
}

// The fake runtime (fake_cudart.cc) as the only CUDA candidate; its counters through dlsym.
struct FakeCudart {
  std::string path = std::getenv("FAKE_CUDART") != nullptr ? std::getenv("FAKE_CUDART") : "";
  void* handle = nullptr;
  FakeCudart() {
    INFO("FAKE_CUDART names the fake runtime library (set by meson test)");
    REQUIRE_FALSE(path.empty());
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    REQUIRE(handle != nullptr);
  }
  ~FakeCudart() { dlclose(handle); }
  int Count(const char* symbol) {
    auto fn = reinterpret_cast<int (*)()>(dlsym(handle, symbol));
    return fn != nullptr ? fn() : -1;
  }
};

TEST_CASE("on unified memory nothing is pinned and the device address is the host address",
          "[gpu][register]") {
  FakeCudart fake;
  const char* cuda[] = {fake.path.c_str()};
  const char* no_hip[] = {"libamdhip64.so.0-engram-test-missing"};
  std::vector<char> mem(1 << 16);
  const int registered = fake.Count("fake_cudart_registered");
  const int unregistered = fake.Count("fake_cudart_unregistered");

  SECTION("the device reads pageable memory through the host page tables (GB10)") {
    setenv("FAKE_CUDART_HOST_PAGE_TABLES", "1", 1);
    engram_gpu_registration* reg = nullptr;
    REQUIRE(GpuRegisterWith(mem.data(), mem.size(), cuda, no_hip, &reg) == 0);
    CHECK(engram_gpu_registration_runtime(reg) == ENGRAM_GPU_RUNTIME_CUDA);
    CHECK(engram_gpu_device_ptr(reg, mem.data() + 100) == mem.data() + 100);
    CHECK(engram_gpu_unregister(reg) == 0);
    CHECK(fake.Count("fake_cudart_registered") == registered);
    CHECK(fake.Count("fake_cudart_unregistered") == unregistered);
  }
  SECTION("$ENGRAM_GPU_PIN=1 pins there anyway") {
    setenv("FAKE_CUDART_HOST_PAGE_TABLES", "1", 1);
    setenv("ENGRAM_GPU_PIN", "1", 1);
    engram_gpu_registration* reg = nullptr;
    REQUIRE(GpuRegisterWith(mem.data(), mem.size(), cuda, no_hip, &reg) == 0);
    CHECK(engram_gpu_device_ptr(reg, mem.data()) != mem.data());
    CHECK(engram_gpu_unregister(reg) == 0);
    unsetenv("ENGRAM_GPU_PIN");
    CHECK(fake.Count("fake_cudart_registered") == registered + 1);
    CHECK(fake.Count("fake_cudart_unregistered") == unregistered + 1);
  }
  SECTION("a discrete GPU: the range is pinned and mapped") {
    setenv("FAKE_CUDART_HOST_PAGE_TABLES", "0", 1);
    engram_gpu_registration* reg = nullptr;
    REQUIRE(GpuRegisterWith(mem.data(), mem.size(), cuda, no_hip, &reg) == 0);
    char* device = static_cast<char*>(engram_gpu_device_ptr(reg, mem.data()));
    CHECK(device != mem.data());
    CHECK(engram_gpu_device_ptr(reg, mem.data() + 64) == device + 64);
    CHECK(engram_gpu_unregister(reg) == 0);
    CHECK(fake.Count("fake_cudart_registered") == registered + 1);
    CHECK(fake.Count("fake_cudart_unregistered") == unregistered + 1);
  }
  unsetenv("FAKE_CUDART_HOST_PAGE_TABLES");
}

TEST_CASE("a read-only mapping the driver will not pin falls back to pageable access or fails "
          "naming the arena path",
          "[gpu][register]") {
  FakeCudart fake;
  const char* cuda[] = {fake.path.c_str()};
  const char* no_hip[] = {"libamdhip64.so.0-engram-test-missing"};
  const size_t len = 1 << 16;
  void* mem = mmap(nullptr, len, PROT_READ, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  const int registered = fake.Count("fake_cudart_registered");
  const int unregistered = fake.Count("fake_cudart_unregistered");
  setenv("FAKE_CUDART_HOST_PAGE_TABLES", "0", 1);
  setenv("FAKE_CUDART_REFUSE_PIN", "1", 1);

  SECTION("the device reads pageable memory: the host address serves, nothing pinned") {
    setenv("FAKE_CUDART_PAGEABLE", "1", 1);
    engram_gpu_registration* reg = nullptr;
    INFO(engram_last_error());
    REQUIRE(GpuRegisterWith(mem, len, cuda, no_hip, &reg) == 0);
    CHECK(engram_gpu_device_ptr(reg, static_cast<char*>(mem) + 8) == static_cast<char*>(mem) + 8);
    CHECK(engram_gpu_unregister(reg) == 0);
    CHECK(fake.Count("fake_cudart_unregistered") == unregistered);
  }
  SECTION("it does not: a clear error that names the arena path, nothing registered") {
    setenv("FAKE_CUDART_PAGEABLE", "0", 1);
    engram_gpu_registration* reg = nullptr;
    CHECK(GpuRegisterWith(mem, len, cuda, no_hip, &reg) == -EINVAL);
    CHECK(reg == nullptr);
    const std::string why = engram_last_error();
    CHECK(why.find("refused to pin") != std::string::npos);
    CHECK(why.find("read-only") != std::string::npos);
    CHECK(why.find("cannot read pageable memory") != std::string::npos);
    CHECK(why.find("arena") != std::string::npos);
  }
  CHECK(fake.Count("fake_cudart_registered") == registered);
  unsetenv("FAKE_CUDART_PAGEABLE");
  unsetenv("FAKE_CUDART_REFUSE_PIN");
  unsetenv("FAKE_CUDART_HOST_PAGE_TABLES");
  CHECK(munmap(mem, len) == 0);
}

}  // namespace
}  // namespace engram
