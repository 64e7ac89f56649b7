// A stand-in for libcudart with just the calls engram_gpu_register makes, for testing its
// decisions on machines without a GPU: one device, whose "pageable memory uses host page tables"
// attribute is $FAKE_CUDART_HOST_PAGE_TABLES, whose "pageable memory access" attribute is
// $FAKE_CUDART_PAGEABLE, and counters of what was registered.
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {
int g_registered = 0;
int g_unregistered = 0;
// Device addresses are the host address plus this, as a discrete GPU's mapping would differ.
constexpr uintptr_t kDeviceOffset = uintptr_t{1} << 44;
}  // namespace

extern "C" {
__attribute__((visibility("default"))) int cudaGetDeviceCount(int* count) {
  *count = 1;
  return 0;
}
__attribute__((visibility("default"))) int cudaGetDevice(int* device) {
  *device = 0;
  return 0;
}
__attribute__((visibility("default"))) int cudaDeviceGetAttribute(int* value, int attr, int) {
  const char* env = std::getenv("FAKE_CUDART_HOST_PAGE_TABLES");
  const char* pageable = std::getenv("FAKE_CUDART_PAGEABLE");
  *value = (attr == 100 && env != nullptr && std::strcmp(env, "1") == 0) ||
                   (attr == 88 && pageable != nullptr && std::strcmp(pageable, "1") == 0)
               ? 1
               : 0;
  return 0;
}
// $FAKE_CUDART_REFUSE_PIN=1: a driver that pins a read-only mapping only with
// cudaHostRegisterReadOnly and does not take that flag: invalid value (1) without it, not
// supported (801) with it.
__attribute__((visibility("default"))) int cudaHostRegister(void*, size_t, unsigned flags) {
  const char* refuse = std::getenv("FAKE_CUDART_REFUSE_PIN");
  if (refuse != nullptr && std::strcmp(refuse, "1") == 0) return (flags & 8u) != 0 ? 801 : 1;
  ++g_registered;
  return 0;
}
__attribute__((visibility("default"))) int cudaHostGetDevicePointer(void** device, void* host,
                                                                    unsigned) {
  *device = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(host) + kDeviceOffset);
  return 0;
}
__attribute__((visibility("default"))) int cudaHostUnregister(void*) {
  ++g_unregistered;
  return 0;
}
__attribute__((visibility("default"))) const char* cudaGetErrorString(int) { return "fake"; }
__attribute__((visibility("default"))) int fake_cudart_registered() { return g_registered; }
__attribute__((visibility("default"))) int fake_cudart_unregistered() { return g_unregistered; }
}
