// A stand-in for libcudart with just the calls engram_gpu_register makes, for testing its
// decisions on machines without a GPU: one device, whose "pageable memory uses host page tables"
// attribute is $FAKE_CUDART_HOST_PAGE_TABLES, and counters of what was registered.
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
  *value = attr == 100 && env != nullptr && std::strcmp(env, "1") == 0 ? 1 : 0;
  return 0;
}
__attribute__((visibility("default"))) int cudaHostRegister(void*, size_t, unsigned) {
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
