// main() of the GPU test binaries: exits 77 (meson's "skipped") with the reason when this machine
// has no usable CUDA device, then runs the Catch2 tests; a test case that skips
// (tests/common/skip.h) makes it exit 77 too, if none failed.
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstdio>

#include "tests/common/skip.h"

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA GPU on this machine (cudaGetDeviceCount: %s, %d devices)\n",
                status == cudaSuccess ? "ok" : cudaGetErrorString(status), devices);
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    std::printf("GPU 0: %s, compute capability %d.%d\n", prop.name, prop.major, prop.minor);
  }
  return engram::testing::ExitStatusWithSkips(Catch::Session().run(argc, argv));
}
