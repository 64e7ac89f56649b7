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
// cudaDevAttrPageableMemoryAccess: the device reads pageable host memory (HMM or ATS).
constexpr int kCudaAttrPageableMemoryAccess = 88;

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
// Whether the CUDA runtime `library` says the current device has the boolean attribute `attr`.
bool CudaDeviceHas(void* library, int runtime, int attr) {
  if (runtime != ENGRAM_GPU_RUNTIME_CUDA) return false;
  using GetDeviceFn = int (*)(int*);
  using GetAttributeFn = int (*)(int*, int, int);
  auto get_device = reinterpret_cast<GetDeviceFn>(dlsym(library, "cudaGetDevice"));
  auto get_attribute = reinterpret_cast<GetAttributeFn>(dlsym(library, "cudaDeviceGetAttribute"));
  int device = 0, value = 0;
  return get_device != nullptr && get_attribute != nullptr && get_device(&device) == 0 &&
         get_attribute(&value, attr, device) == 0 && value == 1;
}

bool HostPageTablesShared(void* library, int runtime) {
  if (const char* pin = getenv("ENGRAM_GPU_PIN"); pin != nullptr && std::string(pin) == "1") {
    return false;
  }
  return CudaDeviceHas(library, runtime, kCudaAttrPageableUsesHostPageTables);
}

// A runtime library opened for registration, with the calls it is used through.
struct Runtime {
  using RegisterFn = int (*)(void*, size_t, unsigned);
  using DevicePointerFn = int (*)(void**, void*, unsigned);
  using UnregisterFn = int (*)(void*);
  using ErrorStringFn = const char* (*)(int);
  using DeviceCountFn = int (*)(int*);

  const RuntimeApi* api = nullptr;
  void* library = nullptr;
  RegisterFn do_register = nullptr;
  DevicePointerFn device_pointer = nullptr;
  UnregisterFn unregister = nullptr;
  ErrorStringFn error_string = nullptr;
  DeviceCountFn device_count = nullptr;
};

// Opens the runtime the process already uses first, so registration lands in its context, and
// looks up its calls. 0, or -errno with the message set.
int OpenRuntime(std::span<const char* const> cuda_names, std::span<const char* const> hip_names,
                Runtime* ret) {
  Runtime rt;
  for (int flags : {RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) {
    if ((rt.library = OpenFirst(cuda_names, flags)) != nullptr) {
      rt.api = &kCuda;
      break;
    }
    if ((rt.library = OpenFirst(hip_names, flags)) != nullptr) {
      rt.api = &kHip;
      break;
    }
  }
  if (rt.library == nullptr) {
    return Fail(ENOSYS, Format("engram_gpu_register: no GPU runtime found (tried %s, %s); GPU "
                               "registration needs the CUDA or HIP runtime",
                               JoinNames(cuda_names).c_str(), JoinNames(hip_names).c_str()));
  }
  const auto symbol = [&](const char* name) { return dlsym(rt.library, name); };
  rt.do_register = reinterpret_cast<Runtime::RegisterFn>(symbol(rt.api->register_symbol));
  rt.device_pointer =
      reinterpret_cast<Runtime::DevicePointerFn>(symbol(rt.api->device_pointer_symbol));
  rt.unregister = reinterpret_cast<Runtime::UnregisterFn>(symbol(rt.api->unregister_symbol));
  rt.error_string = reinterpret_cast<Runtime::ErrorStringFn>(symbol(rt.api->error_string_symbol));
  rt.device_count = reinterpret_cast<Runtime::DeviceCountFn>(symbol(rt.api->device_count_symbol));
  if (!rt.do_register || !rt.device_pointer || !rt.unregister || !rt.error_string ||
      !rt.device_count) {
    dlclose(rt.library);
    return Fail(ENOSYS, Format("engram_gpu_register: the %s runtime lacks %s or its peers",
                               rt.api->name, rt.api->register_symbol));
  }
  *ret = rt;
  return 0;
}

// 0 when the runtime sees a GPU; otherwise closes the library and fails with ENODEV.
int RequireDevice(const Runtime& rt) {
  int devices = 0;
  // Messages are formatted before dlclose: error_string lives in the library.
  if (int status = rt.device_count(&devices); status != 0 || devices == 0) {
    std::string message =
        status == 0
            ? Format("engram_gpu_register: the %s runtime sees no GPU", rt.api->name)
            : Format("engram_gpu_register: %s failed: %s (%s error %d): no usable GPU",
                     rt.api->device_count_symbol, rt.error_string(status), rt.api->name, status);
    dlclose(rt.library);
    return Fail(ENODEV, std::move(message));
  }
  return 0;
}

std::string RuntimeError(const Runtime& rt, const char* call, void* addr, size_t len, int status) {
  return Format("engram_gpu_register: %s of [%p, +%zu) failed: %s (%s error %d)", call, addr, len,
                rt.error_string(status), rt.api->name, status);
}

// Does the current CUDA device read pageable host memory at all (cudaDevAttrPageableMemoryAccess,
// through the host's page tables or HMM)? Asked only when pinning was refused.
bool PageableAccess(void* library, int runtime) {
  return CudaDeviceHas(library, runtime, kCudaAttrPageableMemoryAccess);
}

// Clears the runtime's last error after a refused call it was asked for on purpose: the next
// launch check of any library would otherwise take it for its own.
void ClearLastError(const Runtime& rt) {
  using GetLastErrorFn = int (*)();
  if (auto clear =
          reinterpret_cast<GetLastErrorFn>(dlsym(rt.library, rt.api->get_last_error_symbol))) {
    clear();
  }
}

// Pins [addr, +len) and maps it for the device; on failure closes the library. *ret_pinned
// false: both pinning attempts were refused (a read-only mapping whose driver does not take
// cudaHostRegisterReadOnly) and the device reads pageable memory: the host address serves.
int PinAndMap(const Runtime& rt, void* addr, size_t len, void** ret_device, bool* ret_pinned) {
  const RuntimeApi& api = *rt.api;
  *ret_pinned = true;
  int status = rt.do_register(addr, len, kRegisterPortable | kRegisterMapped);
  int read_only_status = 0;
  if (status != 0 && status != api.already_registered &&
      (read_only_status = rt.do_register(
           addr, len, kRegisterPortable | kRegisterMapped | kRegisterReadOnly)) != 0 &&
      PageableAccess(rt.library, api.runtime)) {
    ClearLastError(rt);
    *ret_device = addr;
    *ret_pinned = false;
    return 0;
  }
  if (status != 0 && status != api.already_registered && read_only_status != 0) {
    std::string message = Format(
        "engram_gpu_register: the %s runtime refused to pin [%p, +%zu) (%s, error %d; read-only: "
        "%s, error %d) and the device cannot read pageable memory: this mapping cannot be read "
        "in place by the GPU; gather its rows into the session's registered arena instead "
        "(engram_gather, or the GPU queue)",
        api.name, addr, len, rt.error_string(status), status, rt.error_string(read_only_status),
        read_only_status);
    ClearLastError(rt);
    dlclose(rt.library);
    return Fail(ErrnoFor(status, api.already_registered), std::move(message));
  }
  if (status != 0 && status != api.already_registered) {
    // A read-only mapping (a resident table's, engram_table_map_open) pins only as read-only
    // memory.
    // The refused first attempt stays the runtime's last error: clear it.
    ClearLastError(rt);
    status = 0;
  }
  if (status != 0) {
    std::string message = RuntimeError(rt, api.register_symbol, addr, len, status);
    dlclose(rt.library);
    return Fail(ErrnoFor(status, api.already_registered), std::move(message));
  }
  void* device = nullptr;
  if (int status = rt.device_pointer(&device, addr, 0); status != 0 || device == nullptr) {
    const std::string message = RuntimeError(rt, api.device_pointer_symbol, addr, len, status);
    rt.unregister(addr);
    dlclose(rt.library);
    return Fail(EIO, message);
  }
  *ret_device = device;
  return 0;
}

engram_gpu_registration* NewRegistration(const Runtime& rt, void* addr, size_t len, void* device,
                                         bool pinned) {
  auto* reg = new engram_gpu_registration;
  reg->library = rt.library;
  reg->runtime = rt.api->runtime;
  reg->host = static_cast<char*>(addr);
  reg->len = len;
  reg->device = static_cast<char*>(device);
  reg->pinned = pinned;
  reg->unregister = rt.unregister;
  reg->error_string = rt.error_string;
  return reg;
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
  Runtime rt;
  if (int r = OpenRuntime(cuda_names, hip_names, &rt); r != 0) return r;
  if (int r = RequireDevice(rt); r != 0) return r;
  if (HostPageTablesShared(rt.library, rt.api->runtime)) {
    // Unified memory: the host address is the device address and nothing needs pinning (which
    // would only take the pages from the memory the GPU and the page cache share).
    *ret_reg = NewRegistration(rt, addr, len, addr, /*pinned=*/false);
    return 0;
  }
  void* device = nullptr;
  bool pinned = true;
  if (int r = PinAndMap(rt, addr, len, &device, &pinned); r != 0) return r;
  *ret_reg = NewRegistration(rt, addr, len, device, pinned);
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
