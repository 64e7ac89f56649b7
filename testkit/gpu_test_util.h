// Helpers shared by the GPU tests: CUDA error checks, device buffers, and host memory that is
// registered through engram_gpu_register (the path the client library takes).
#pragma once

#include <cuda_runtime.h>
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <string>

#include "engram/engram.h"  // engram_last_error
#include "engram/gpu.h"

#define CUDA_REQUIRE(call)                                   \
  do {                                                       \
    const cudaError_t cuda_status_ = (call);                 \
    INFO(#call << ": " << cudaGetErrorString(cuda_status_)); \
    REQUIRE(cuda_status_ == cudaSuccess);                    \
  } while (0)

#define ENGRAM_REQUIRE(call)                                           \
  do {                                                                 \
    const int engram_rc_ = (call);                                     \
    INFO(#call << " = " << engram_rc_ << ": " << engram_last_error()); \
    REQUIRE(engram_rc_ == 0);                                          \
  } while (0)

namespace engram::testing {

// Device memory owned for one test.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    CUDA_REQUIRE(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes));
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// Anonymous shared mapping (what a client arena is) registered with the GPU.
class RegisteredHostBuffer {
 public:
  explicit RegisteredHostBuffer(size_t bytes) : bytes_(bytes) {
    host_ = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(host_ != MAP_FAILED);
    const int rc = engram_gpu_register(host_, bytes, &reg_);
    INFO("engram_gpu_register: " << engram_last_error());
    REQUIRE(rc == 0);
  }
  ~RegisteredHostBuffer() {
    if (reg_ != nullptr) engram_gpu_unregister(reg_);
    if (host_ != MAP_FAILED) munmap(host_, bytes_);
  }
  RegisteredHostBuffer(const RegisteredHostBuffer&) = delete;
  RegisteredHostBuffer& operator=(const RegisteredHostBuffer&) = delete;
  template <typename T = void>
  T* host() const {
    return static_cast<T*>(host_);
  }
  template <typename T = void>
  T* device(size_t offset = 0) const {
    return static_cast<T*>(engram_gpu_device_ptr(reg_, static_cast<char*>(host_) + offset));
  }

 private:
  size_t bytes_;
  void* host_ = MAP_FAILED;
  engram_gpu_registration* reg_ = nullptr;
};

}  // namespace engram::testing
