// Internals of engram_gpu_register (include/engram/gpu.h): which runtime libraries are tried,
// exposed so tests can point the search at libraries that do not exist.
#pragma once

#include <span>

#include "engram/gpu.h"

namespace engram {

// The sonames engram_gpu_register tries, newest first. A library already loaded in the process
// (RTLD_NOLOAD) wins over loading one; CUDA is tried before HIP at each stage.
std::span<const char* const> DefaultCudaRuntimeNames();
std::span<const char* const> DefaultHipRuntimeNames();

// engram_gpu_register with explicit candidate lists.
int GpuRegisterWith(void* addr, size_t len, std::span<const char* const> cuda_names,
                    std::span<const char* const> hip_names, engram_gpu_registration** ret_reg);

}  // namespace engram
