// One spelling for the CUDA and HIP runtime calls the kernels use, so that engram_kernels.cu is a
// single source for nvcc and hipcc. ENGRAM_HIP selects HIP; otherwise CUDA.
#pragma once

#if defined(ENGRAM_HIP)
#include <hip/hip_runtime.h>

#define ENGRAM_GPU_BACKEND "hip"
using gpuError_t = hipError_t;
using gpuStream_t = hipStream_t;
#define gpuSuccess hipSuccess
#define gpuErrorNoDevice hipErrorNoDevice
#define gpuErrorInsufficientDriver hipErrorInsufficientDriver
#define gpuErrorNotSupported hipErrorNotSupported
#define gpuGetErrorName hipGetErrorName
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpyDefault hipMemcpyDefault
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemcpy hipMemcpy
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuErrorMemoryAllocation hipErrorOutOfMemory
#define gpuMemset hipMemset
#define gpuHostAlloc hipHostMalloc
#define gpuHostAllocMapped hipHostMallocMapped
#define gpuHostAllocPortable hipHostMallocPortable
#define gpuHostGetDevicePointer hipHostGetDevicePointer
#define gpuFreeHost hipHostFree
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
// Nanoseconds of a constant-rate device clock: s_memrealtime counts at 100 MHz on gfx9.
#define ENGRAM_GPU_NOW_NS() (__builtin_amdgcn_s_memrealtime() * 10ull)
// Polling back-off inside a waiting kernel: s_sleep takes a constant (units of 64 clocks).
#define ENGRAM_GPU_PAUSE() __builtin_amdgcn_s_sleep(2)
// A shorter one, for polls of device memory (cheap to repeat).
#define ENGRAM_GPU_PAUSE_SHORT() __builtin_amdgcn_s_sleep(1)
// Acquire at system scope after a relaxed load saw a host thread's release.
#define ENGRAM_GPU_ACQUIRE_SYSTEM() __threadfence_system()

#else              // CUDA
#include <cuda.h>  // driver API types only: the functions come from cudaGetDriverEntryPoint*
#include <cuda_runtime.h>

#define ENGRAM_GPU_BACKEND "cuda"
using gpuError_t = cudaError_t;
using gpuStream_t = cudaStream_t;
#define gpuSuccess cudaSuccess
#define gpuErrorNoDevice cudaErrorNoDevice
#define gpuErrorInsufficientDriver cudaErrorInsufficientDriver
#define gpuErrorNotSupported cudaErrorNotSupported
#define gpuGetErrorName cudaGetErrorName
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpyDefault cudaMemcpyDefault
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemcpy cudaMemcpy
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuErrorMemoryAllocation cudaErrorMemoryAllocation
#define gpuMemset cudaMemset
#define gpuHostAlloc cudaHostAlloc
#define gpuHostAllocMapped cudaHostAllocMapped
#define gpuHostAllocPortable cudaHostAllocPortable
#define gpuHostGetDevicePointer cudaHostGetDevicePointer
#define gpuFreeHost cudaFreeHost
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
// Nanoseconds of the device's global timer (the same on every SM).
__device__ __forceinline__ unsigned long long EngramGpuNowNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define ENGRAM_GPU_NOW_NS() EngramGpuNowNs()
#define ENGRAM_GPU_PAUSE() __nanosleep(256)
// A shorter one, for polls of device memory (cheap to repeat).
#define ENGRAM_GPU_PAUSE_SHORT() __nanosleep(32)
// Acquire at system scope after a relaxed load saw a host thread's release: an acquire-release
// fence, lighter than __threadfence_system()'s sequentially consistent one.
#define ENGRAM_GPU_ACQUIRE_SYSTEM() asm volatile("fence.acq_rel.sys;" ::: "memory")
#endif

// Loads `kernel`'s module into the current context now. With lazy module loading (CUDA's
// default since 12.2) a kernel otherwise loads at its first launch, and that load can wait
// behind a stream parked on a completion wait; every library entry point that launches a
// kernel loads it first, outside any capture.
template <typename Kernel>
inline gpuError_t PreloadKernel(Kernel kernel) {
#if defined(ENGRAM_HIP)
  hipFuncAttributes attributes;
  return hipFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel));
#else
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, kernel);
#endif
}
