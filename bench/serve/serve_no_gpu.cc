// engram-serve in a build without the CUDA kernels: the GPU run is skipped (exit 77), the
// CPU-only smoke run still works.
#include <cstdio>

#include "bench/serve/serve_run.h"

namespace engram::bench::serve {

int RunOnGpu(const ServeOptions&, const Platform&, RequestSource&, Report&) {
  std::printf("SKIP: built without the CUDA kernels\n");
  return 77;
}

}  // namespace engram::bench::serve
