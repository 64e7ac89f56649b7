// engram_gpu_register and friends: pins and maps a host range for the GPU through whichever
// runtime (libcudart or libamdhip64) the process uses, found with dlopen so nothing links it.
#include "client/gpu_register.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "client/last_error.h"

struct engram_gpu_registration {
  void* library = nullptr;  // dlopen handle, closed on unregister
  int runtime = 0;          // enum engram_gpu_runtime
  char* host = nullptr;
  size_t len = 0;
  char* device = nullptr;
  bool pinned = true;  // false: unified memory, nothing was registered with the runtime
  int (*unregister)(void*) = nullptr;
  const char* (*error_string)(int) = nullptr;
};

namespace engram {
namespace {

// printf-style formatting into a std::string. libengram_client links no Abseil, and this file
// goes into it whole.
std::string Format(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Format(const char* format, ...) {
  char buf[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(buf, sizeof(buf), format, args);
  va_end(args);
  return buf;
}

std::string JoinNames(std::span<const char* const> names) {
  std::string out;
  for (const char* name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

int Fail(int err, std::string message) { return client::SetErrorMessage(-err, std::move(message)); }

// The runtime calls used here have the same shape in CUDA and HIP; the error codes and flag
// values that matter are equal too (Portable = 1, Mapped = 2, NoDevice = 100,
// InsufficientDriver = 35, InvalidValue = 1, out of memory = 2).
struct RuntimeApi {
  const char* name;  // "CUDA" / "HIP"
  const char* register_symbol;
  const char* device_pointer_symbol;
  const char* unregister_symbol;
  const char* error_string_symbol;
  const char* device_count_symbol;
  const char* get_last_error_symbol;
  int already_registered;  // cudaErrorHostMemoryAlreadyRegistered / hipError...
  int runtime;
};

constexpr RuntimeApi kCuda = {"CUDA",
                              "cudaHostRegister",
                              "cudaHostGetDevicePointer",
                              "cudaHostUnregister",
                              "cudaGetErrorString",
                              "cudaGetDeviceCount",
                              "cudaGetLastError",
                              712,
                              ENGRAM_GPU_RUNTIME_CUDA};
constexpr RuntimeApi kHip = {"HIP",
                             "hipHostRegister",
                             "hipHostGetDevicePointer",
                             "hipHostUnregister",
                             "hipGetErrorString",
                             "hipGetDeviceCount",
                             "hipGetLastError",
                             1061,
                             ENGRAM_GPU_RUNTIME_HIP};

constexpr unsigned kRegisterPortable = 1;
constexpr unsigned kRegisterMapped = 2;
constexpr unsigned kRegisterReadOnly = 8;  // cudaHostRegisterReadOnly, hipHostRegisterReadOnly
constexpr int kErrorInvalidValue = 1;
constexpr int kErrorOutOfMemory = 2;
constexpr int kErrorInsufficientDriver = 35;
constexpr int kErrorNoDevice = 100;
// cudaDevAttrPageableMemoryAccessUsesHostPageTables: the device reads pageable host memory
// through the host's page tables (GB10 and GH200 over NVLink-C2C).
constexpr int kCudaAttrPageableUsesHostPageTables = 100;

constexpr const char* kCudaNames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                      "libcudart.so"};
constexpr const char* kHipNames[] = {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5",
                                     "libamdhip64.so"};

void* OpenFirst(std::span<const char* const> names, int flags) {
  for (const char* name : names) {
    if (void* handle = dlopen(name, flags)) return handle;
  }
  return nullptr;
}

int ErrnoFor(int status, int already_registered) {
  if (status == already_registered) return EEXIST;
  switch (status) {
    case kErrorNoDevice:
    case kErrorInsufficientDriver:
      return ENODEV;
    case kErrorInvalidValue:
      return EINVAL;
    case kErrorOutOfMemory:
      return ENOMEM;
    default:
      return EIO;
  }
}

// Does the current CUDA device read pageable host memory through the host's page tables?
// $ENGRAM_GPU_PIN=1 answers no, so the range is pinned anyway.
bool HostPageTablesShared(void* library, int runtime) {
  if (runtime != ENGRAM_GPU_RUNTIME_CUDA) return false;
  if (const char* pin = getenv("ENGRAM_GPU_PIN"); pin != nullptr && std::string(pin) == "1") {
    return false;
  }
  using GetDeviceFn = int (*)(int*);
  using GetAttributeFn = int (*)(int*, int, int);
  auto get_device = reinterpret_cast<GetDeviceFn>(dlsym(library, "cudaGetDevice"));
  auto get_attribute = reinterpret_cast<GetAttributeFn>(dlsym(library, "cudaDeviceGetAttribute"));
  int device = 0, value = 0;
  return get_device != nullptr && get_attribute != nullptr && get_device(&device) == 0 &&
         get_attribute(&value, kCudaAttrPageableUsesHostPageTables, device) == 0 && value == 1;
}

}  // namespace

std::span<const char* const> DefaultCudaRuntimeNames() { return kCudaNames; }
std::span<const char* const> DefaultHipRuntimeNames() { return kHipNames; }

int GpuRegisterWith(void* addr, size_t len, std::span<const char* const> cuda_names,
                    std::span<const char* const> hip_names, engram_gpu_registration** ret_reg) {
  if (addr == nullptr || len == 0 || ret_reg == nullptr) {
    return Fail(EINVAL, Format("engram_gpu_register: addr (%p), len (%zu) and ret_reg (%p) must "
                               "all be set",
                               addr, len, static_cast<void*>(ret_reg)));
  }
  // The runtime the process already uses first, so registration lands in its context.
  const RuntimeApi* api = nullptr;
  void* library = nullptr;
  for (int flags : {RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) {
    if ((library = OpenFirst(cuda_names, flags)) != nullptr) {
      api = &kCuda;
      break;
    }
    if ((library = OpenFirst(hip_names, flags)) != nullptr) {
      api = &kHip;
      break;
    }
  }
  if (library == nullptr) {
    return Fail(ENOSYS, Format("engram_gpu_register: no GPU runtime found (tried %s, %s); GPU "
                               "registration needs the CUDA or HIP runtime",
                               JoinNames(cuda_names).c_str(), JoinNames(hip_names).c_str()));
  }
  using RegisterFn = int (*)(void*, size_t, unsigned);
  using DevicePointerFn = int (*)(void**, void*, unsigned);
  using UnregisterFn = int (*)(void*);
  using ErrorStringFn = const char* (*)(int);
  using DeviceCountFn = int (*)(int*);
  auto do_register = reinterpret_cast<RegisterFn>(dlsym(library, api->register_symbol));
  auto device_pointer =
      reinterpret_cast<DevicePointerFn>(dlsym(library, api->device_pointer_symbol));
  auto unregister = reinterpret_cast<UnregisterFn>(dlsym(library, api->unregister_symbol));
  auto error_string = reinterpret_cast<ErrorStringFn>(dlsym(library, api->error_string_symbol));
  auto device_count = reinterpret_cast<DeviceCountFn>(dlsym(library, api->device_count_symbol));
  if (!do_register || !device_pointer || !unregister || !error_string || !device_count) {
    dlclose(library);
    return Fail(ENOSYS, Format("engram_gpu_register: the %s runtime lacks %s or its peers",
                               api->name, api->register_symbol));
  }
  auto runtime_error = [&](const char* call, int status) {
    return Format("engram_gpu_register: %s of [%p, +%zu) failed: %s (%s error %d)", call, addr, len,
                  error_string(status), api->name, status);
  };
  int devices = 0;
  // Messages are formatted before dlclose: error_string lives in the library.
  if (int status = device_count(&devices); status != 0 || devices == 0) {
    std::string message =
        status == 0 ? Format("engram_gpu_register: the %s runtime sees no GPU", api->name)
                    : Format("engram_gpu_register: %s failed: %s (%s error %d): no usable GPU",
                             api->device_count_symbol, error_string(status), api->name, status);
    dlclose(library);
    return Fail(ENODEV, std::move(message));
  }
  if (HostPageTablesShared(library, api->runtime)) {
    // Unified memory: the host address is the device address and nothing needs pinning (which
    // would only take the pages from the memory the GPU and the page cache share).
    auto* reg = new engram_gpu_registration;
    reg->library = library;
    reg->runtime = api->runtime;
    reg->host = reg->device = static_cast<char*>(addr);
    reg->len = len;
    reg->pinned = false;
    reg->unregister = unregister;
    reg->error_string = error_string;
    *ret_reg = reg;
    return 0;
  }
  int status = do_register(addr, len, kRegisterPortable | kRegisterMapped);
  if (status != 0 && status != api->already_registered &&
      do_register(addr, len, kRegisterPortable | kRegisterMapped | kRegisterReadOnly) == 0) {
    // A read-only mapping (a resident table's, engram_map_table) pins only as read-only memory;
    // a failure of both attempts reports the first. The refused first attempt stays the
    // runtime's last error, which the next launch check of any library would take for its
    // own: clear it.
    using GetLastErrorFn = int (*)();
    if (auto clear = reinterpret_cast<GetLastErrorFn>(dlsym(library, api->get_last_error_symbol))) {
      clear();
    }
    status = 0;
  }
  if (status != 0) {
    std::string message = runtime_error(api->register_symbol, status);
    dlclose(library);
    return Fail(ErrnoFor(status, api->already_registered), std::move(message));
  }
  void* device = nullptr;
  if (int status = device_pointer(&device, addr, 0); status != 0 || device == nullptr) {
    const std::string message = runtime_error(api->device_pointer_symbol, status);
    unregister(addr);
    dlclose(library);
    return Fail(EIO, message);
  }
  auto* reg = new engram_gpu_registration;
  reg->library = library;
  reg->runtime = api->runtime;
  reg->host = static_cast<char*>(addr);
  reg->len = len;
  reg->device = static_cast<char*>(device);
  reg->unregister = unregister;
  reg->error_string = error_string;
  *ret_reg = reg;
  return 0;
}

}  // namespace engram

extern "C" {

int engram_gpu_register(void* addr, size_t len, engram_gpu_registration** ret_reg) {
  return engram::GpuRegisterWith(addr, len, engram::DefaultCudaRuntimeNames(),
                                 engram::DefaultHipRuntimeNames(), ret_reg);
}

void* engram_gpu_device_ptr(const engram_gpu_registration* reg, const void* host_addr) {
  if (reg == nullptr) return nullptr;
  const auto* p = static_cast<const char*>(host_addr);
  if (p < reg->host || p >= reg->host + reg->len) return nullptr;
  return reg->device + (p - reg->host);
}

int engram_gpu_registration_runtime(const engram_gpu_registration* reg) {
  return reg == nullptr ? 0 : reg->runtime;
}

int engram_gpu_unregister(engram_gpu_registration* reg) {
  if (reg == nullptr) return 0;
  int rc = 0;
  if (int status = reg->pinned ? reg->unregister(reg->host) : 0; status != 0) {
    rc = engram::Fail(EIO, engram::Format("engram_gpu_unregister: unregistering [%p, +%zu) "
                                          "failed: %s (error %d)",
                                          static_cast<void*>(reg->host), reg->len,
                                          reg->error_string(status), status));
  }
  dlclose(reg->library);
  delete reg;
  return rc;
}

}  // extern "C"
