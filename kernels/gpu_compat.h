// One spelling for the CUDA and HIP runtime calls the kernels use, so that engram_kernels.cu is a
// single source for nvcc and hipcc. ENGRAM_HIP selects HIP; otherwise CUDA.
#pragma once

#include <atomic>

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
#define gpuMemsetAsync hipMemsetAsync
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
// HIP has no launch that overlaps the kernel ahead on the stream (see the CUDA side).
#define ENGRAM_GPU_AWAIT_PRIOR_GRID() ((void)0)
#define ENGRAM_GPU_RELEASE_DEPENDENTS() ((void)0)

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
#define gpuMemsetAsync cudaMemsetAsync
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
// Programmatic dependent launch (sm_90 and later; LaunchAfterPrior below). AWAIT: wait until
// the grids ahead of this one on the stream have completed and their writes are visible (a
// no-op in a kernel launched the ordinary way). RELEASE: let the grid launched after-prior
// behind this one start once every block of this one has released or exited.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ENGRAM_GPU_AWAIT_PRIOR_GRID() asm volatile("griddepcontrol.wait;" ::: "memory")
#define ENGRAM_GPU_RELEASE_DEPENDENTS() \
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define ENGRAM_GPU_AWAIT_PRIOR_GRID() ((void)0)
#define ENGRAM_GPU_RELEASE_DEPENDENTS() ((void)0)
#endif
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

#if !defined(ENGRAM_HIP)
// Whether the current device launches a kernel before the one ahead of it on the stream has
// finished (compute capability 9.0 or later); asked once per device.
inline bool LaunchOverlapSupported() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  static std::atomic<int> known[64];  // 0: not asked yet, 1: no, 2: yes
  int k = known[device].load(std::memory_order_relaxed);
  if (k == 0) {
    int major = 0;
    k = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                major >= 9
            ? 2
            : 1;
    known[device].store(k, std::memory_order_relaxed);
  }
  return k == 2;
}
#endif

// Launches kernel<<<grid, block, shared, stream>>>(args...). With `overlap`, on CUDA devices of
// compute capability 9.0 or later, as a programmatic dependent launch: the grid may start as soon
// as the kernel ahead of it on the stream has run ENGRAM_GPU_RELEASE_DEPENDENTS() in every block,
// before that kernel has finished, which hides the launch latency between the two. Such a kernel
// must run ENGRAM_GPU_AWAIT_PRIOR_GRID() before it reads or writes anything that work ahead of it
// on the stream touches. Elsewhere, and without `overlap`, an ordinary launch.
template <typename... Params, typename... Args>
inline gpuError_t LaunchAfterPrior(bool overlap, void (*kernel)(Params...), dim3 grid, dim3 block,
                                   size_t shared, gpuStream_t stream, Args... args) {
#if defined(ENGRAM_HIP)
  (void)overlap;
  hipLaunchKernelGGL(kernel, grid, block, shared, stream, args...);
  return hipGetLastError();
#else
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = overlap && LaunchOverlapSupported() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
#endif
}
