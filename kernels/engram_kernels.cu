// The GPU half of include/engram/gpu.h: the dequantise-and-scatter kernel and the stream-side
// waits on the completion counter. One source for nvcc and hipcc (see gpu_compat.h).
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <mutex>

#include "engram/engram.h"
#include "engram/gpu.h"
#include "kernels/dequant_device.h"
#include "kernels/gpu_compat.h"
#include "kernels/kernel_errors.h"

namespace engram::kernels {

int Fail(int err, const char* format, ...) {
  char message[512];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  engram_internal_set_last_error(message);  // where engram_last_error() finds it
  return -err;
}

int FailRuntime(const char* call, gpuError_t status) {
  const int err = (status == gpuErrorNoDevice || status == gpuErrorInsufficientDriver) ? ENODEV
                  : status == gpuErrorNotSupported                                     ? ENOTSUP
                                                                                       : EIO;
  return Fail(err, "%s failed: %s (%s)", call, gpuGetErrorName(status), gpuGetErrorString(status));
}

}  // namespace engram::kernels

namespace {

constexpr uint32_t kRowBytes = ENGRAM_ROW_BYTES;
constexpr uint32_t kRowValues = ENGRAM_ROW_VALUES;
constexpr uint32_t kBlockThreads = 256;
constexpr uint32_t kSlotsPerBlock = kBlockThreads / engram::kernels::kThreadsPerSlot;
constexpr uint32_t kMaxBlocks = 1u << 20;  // the grid-stride loop covers any larger job

using engram::kernels::DequantSlot;
using engram::kernels::Fail;
using engram::kernels::FailRuntime;
using engram::kernels::kThreadsPerSlot;

// ---- dequantisation (per slot: kernels/dequant_device.h) ------------------------------------

// Where slot s's row comes from: a compact array of gathered rows and an int32 index map
// (negative: padding), or a table mapped in place and absolute uint64 row ids.
struct MappedRows {
  const uint8_t* rows;
  uint32_t num_rows;
  const int32_t* index_map;
  // The row of `slot`, nullptr when there is none; *ret_padding says whether that is padding
  // (+0.0) or a bad index (NaN, counted).
  __device__ __forceinline__ const uint8_t* Row(uint64_t slot, bool* ret_padding) const {
    const int32_t index = index_map[slot];
    *ret_padding = index < 0;
    if (index < 0 || static_cast<uint32_t>(index) >= num_rows) return nullptr;
    return rows + uint64_t(index) * kRowBytes;
  }
};
struct TableRows {
  const uint8_t* table;  // row row_begin of the table
  uint64_t row_begin, num_rows;
  const uint64_t* row_ids;
  __device__ __forceinline__ const uint8_t* Row(uint64_t slot, bool* ret_padding) const {
    const uint64_t id = row_ids[slot];
    *ret_padding = false;
    if (id < row_begin || id - row_begin >= num_rows) return nullptr;
    return table + (id - row_begin) * kRowBytes;
  }
};

template <typename Source>
__global__ void __launch_bounds__(kBlockThreads)
    DequantKernel(Source source, uint64_t slots, uint16_t* __restrict__ out,
                  uint32_t* bad_index_count) {
  // Launched after-prior: the rows, row ids and index map may come from the kernel ahead.
  ENGRAM_GPU_AWAIT_PRIOR_GRID();
  ENGRAM_GPU_RELEASE_DEPENDENTS();
  const uint32_t lane = threadIdx.x % kThreadsPerSlot;
  const uint64_t first = uint64_t{blockIdx.x} * kSlotsPerBlock + threadIdx.x / kThreadsPerSlot;
  const uint64_t stride = uint64_t{gridDim.x} * kSlotsPerBlock;
  for (uint64_t slot = first; slot < slots; slot += stride) {
    bool padding = false;
    const uint8_t* row = source.Row(slot, &padding);
    DequantSlot(row, padding, lane, out + slot * kRowValues, bad_index_count);
  }
}

// ---- completion waits -------------------------------------------------------------------------

__global__ void WaitTicketKernel(const volatile unsigned long long* counter,
                                 const volatile unsigned long long* tickets, uint32_t ring,
                                 uint32_t* step_counter) {
  const uint32_t step = *step_counter;
  const unsigned long long target = tickets[step % ring];
  while (static_cast<long long>(*counter - target) < 0) ENGRAM_GPU_PAUSE();
  *step_counter = step + 1;
}

// Loads this library's kernels into the current context before the first real call. With lazy
// module loading (CUDA's default since 12.2) a kernel is otherwise loaded at its first launch,
// and that load can wait behind a stream that is itself parked on a completion-counter wait:
// the process hangs until the producer publishes, which in a test or a daemon restart may be
// never. Every entry point calls this first. Returns 0 or the failure of the load.
int EnsureKernelsLoaded() {
  static std::once_flag once;
  static gpuError_t status = gpuSuccess;
  static const char* which = "";
  std::call_once(once, [] {
    which = "DequantKernel";
    status = PreloadKernel(DequantKernel<MappedRows>);
    if (status == gpuSuccess) status = PreloadKernel(DequantKernel<TableRows>);
    if (status == gpuSuccess) {
      which = "WaitTicketKernel";
      status = PreloadKernel(WaitTicketKernel);
    }
  });
  if (status != gpuSuccess) {
    char call[96];
    snprintf(call, sizeof(call), "loading the engram kernels (%s)", which);
    return FailRuntime(call, status);
  }
  return 0;
}

#if !defined(ENGRAM_HIP)
// Driver-API entry points, resolved once through the runtime so that nothing links libcuda.
struct DriverApi {
  CUresult (*wait64)(CUstream, CUdeviceptr, cuuint64_t, unsigned) = nullptr;
  CUresult (*wait32)(CUstream, CUdeviceptr, cuuint32_t, unsigned) = nullptr;
  CUresult (*node_get)(CUgraphNode, CUDA_BATCH_MEM_OP_NODE_PARAMS*) = nullptr;
  CUresult (*exec_set)(CUgraphExec, CUgraphNode, const CUDA_BATCH_MEM_OP_NODE_PARAMS*) = nullptr;
  CUresult (*get_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  const char* missing = nullptr;  // first symbol that could not be resolved
};

template <typename Fn>
bool Resolve(const char* symbol, Fn* fn) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult result;
  if (cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &result) !=
          cudaSuccess ||
      result != cudaDriverEntryPointSuccess || address == nullptr) {
    return false;
  }
  *fn = reinterpret_cast<Fn>(address);
  return true;
}

const DriverApi& Driver() {
  static const DriverApi api = [] {
    DriverApi d;
    if (!Resolve("cuStreamWaitValue64", &d.wait64)) d.missing = "cuStreamWaitValue64";
    if (!Resolve("cuStreamWaitValue32", &d.wait32)) d.missing = "cuStreamWaitValue32";
    if (!Resolve("cuGraphBatchMemOpNodeGetParams", &d.node_get))
      d.missing = "cuGraphBatchMemOpNodeGetParams";
    if (!Resolve("cuGraphExecBatchMemOpNodeSetParams", &d.exec_set))
      d.missing = "cuGraphExecBatchMemOpNodeSetParams";
    if (!Resolve("cuDeviceGetAttribute", &d.get_attribute)) d.missing = "cuDeviceGetAttribute";
    Resolve("cuGetErrorName", &d.get_error_name);
    return d;
  }();
  return api;
}

int FailDriver(const char* call, CUresult result) {
  const char* name = "unknown";
  if (Driver().get_error_name != nullptr) Driver().get_error_name(result, &name);
  const int err = result == CUDA_ERROR_NOT_SUPPORTED ? ENOTSUP : EIO;
  return Fail(err, "%s failed: %s (%d)", call, name, static_cast<int>(result));
}

// Whether the current device has 64-bit stream memory operations (cached per device).
bool Has64BitMemOps() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  static std::once_flag once[64];
  static bool supported[64];
  std::call_once(once[device], [device] {
    int value = 0;
    supported[device] =
        Driver().get_attribute(&value, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, device) ==
            CUDA_SUCCESS &&
        value != 0;
  });
  return supported[device];
}
#endif

template <typename Source>
int LaunchDequant(const Source& source, uint64_t slots, void* out, uint32_t* bad_index_count,
                  gpuStream_t stream, const char* what) {
  uint64_t blocks = (slots + kSlotsPerBlock - 1) / kSlotsPerBlock;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  const gpuError_t status =
      LaunchAfterPrior(true, DequantKernel<Source>, static_cast<unsigned>(blocks), kBlockThreads, 0,
                       stream, source, slots, static_cast<uint16_t*>(out), bad_index_count);
  if (status == gpuSuccess) return 0;
  char call[96];
  snprintf(call, sizeof(call), "%s: kernel launch", what);
  return FailRuntime(call, status);
}

}  // namespace

extern "C" {

// Deprecated: engram_last_error() under its older name (engram/gpu.h).
const char* engram_kernels_last_error(void) { return engram_last_error(); }

const char* engram_kernels_backend(void) { return ENGRAM_GPU_BACKEND; }

int engram_dequant_scatter(const void* rows, uint32_t num_rows, const int32_t* index_map,
                           uint32_t tokens, uint32_t heads, void* out, void* staging,
                           size_t staging_bytes, uint32_t* bad_index_count, uintptr_t stream) {
  const uint64_t slots = uint64_t{tokens} * heads;
  const uint64_t row_bytes = uint64_t{num_rows} * kRowBytes;
  if (num_rows > 0 && rows == nullptr) {
    return Fail(EINVAL, "engram_dequant_scatter: rows is NULL but num_rows is %u", num_rows);
  }
  if (num_rows > uint32_t{INT32_MAX}) {
    return Fail(EINVAL, "engram_dequant_scatter: num_rows %u exceeds the int32 index map's range",
                num_rows);
  }
  if (reinterpret_cast<uintptr_t>(rows) % 8 != 0) {
    return Fail(EINVAL, "engram_dequant_scatter: rows %p is not 8-byte aligned", rows);
  }
  if (slots > 0 && (index_map == nullptr || out == nullptr)) {
    return Fail(EINVAL,
                "engram_dequant_scatter: index_map (%p) and out (%p) must be set for %u tokens x "
                "%u heads",
                static_cast<const void*>(index_map), out, tokens, heads);
  }
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    return Fail(EINVAL, "engram_dequant_scatter: out %p is not 16-byte aligned", out);
  }
  if (staging != nullptr) {
    if (staging_bytes < row_bytes) {
      return Fail(EINVAL, "engram_dequant_scatter: staging holds %zu bytes, %u rows need %llu",
                  staging_bytes, num_rows, static_cast<unsigned long long>(row_bytes));
    }
    if (reinterpret_cast<uintptr_t>(staging) % 8 != 0) {
      return Fail(EINVAL, "engram_dequant_scatter: staging %p is not 8-byte aligned", staging);
    }
  }
  if (slots == 0) return 0;
  if (int rc = EnsureKernelsLoaded(); rc != 0) return rc;
  const auto s = reinterpret_cast<gpuStream_t>(stream);
  const uint8_t* source = static_cast<const uint8_t*>(rows);
  if (staging != nullptr && row_bytes > 0) {
    const gpuError_t status = gpuMemcpyAsync(staging, rows, row_bytes, gpuMemcpyDefault, s);
    if (status != gpuSuccess) return FailRuntime("engram_dequant_scatter: row copy", status);
    source = static_cast<const uint8_t*>(staging);
  }
  return LaunchDequant(MappedRows{source, num_rows, index_map}, slots, out, bad_index_count, s,
                       "engram_dequant_scatter");
}

int engram_dequant_gather(const void* table, uint64_t row_begin, uint64_t num_rows,
                          const uint64_t* row_ids, uint32_t tokens, uint32_t heads, void* out,
                          uint32_t* bad_index_count, uintptr_t stream) {
  const uint64_t slots = uint64_t{tokens} * heads;
  if (slots > 0 && (table == nullptr || row_ids == nullptr || out == nullptr)) {
    return Fail(EINVAL,
                "engram_dequant_gather: table (%p), row_ids (%p) and out (%p) must be "
                "set for %u tokens x %u heads",
                table, static_cast<const void*>(row_ids), out, tokens, heads);
  }
  if (reinterpret_cast<uintptr_t>(table) % 8 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    return Fail(EINVAL,
                "engram_dequant_gather: table %p must be 8-byte and out %p 16-byte "
                "aligned",
                table, out);
  }
  if (slots == 0) return 0;
  if (int rc = EnsureKernelsLoaded(); rc != 0) return rc;
  return LaunchDequant(TableRows{static_cast<const uint8_t*>(table), row_begin, num_rows, row_ids},
                       slots, out, bad_index_count, reinterpret_cast<gpuStream_t>(stream),
                       "engram_dequant_gather");
}

int engram_stream_wait_value64(uintptr_t stream, const void* addr, uint64_t value,
                               uintptr_t* ret_node) {
  if (addr == nullptr || reinterpret_cast<uintptr_t>(addr) % 8 != 0) {
    return Fail(EINVAL, "engram_stream_wait_value64: address %p is NULL or not 8-byte aligned",
                addr);
  }
  // The kernels queued behind this wait must not need loading while the stream is parked.
  if (int rc = EnsureKernelsLoaded(); rc != 0) return rc;
  const auto s = reinterpret_cast<gpuStream_t>(stream);
#if defined(ENGRAM_HIP)
  const gpuError_t status =
      hipStreamWaitValue64(s, const_cast<void*>(addr), value, hipStreamWaitValueGte, ~uint64_t{0});
  if (status != gpuSuccess) return FailRuntime("hipStreamWaitValue64", status);
  if (ret_node != nullptr) *ret_node = 0;
  return 0;
#else
  const DriverApi& d = Driver();
  if (d.wait64 == nullptr || d.wait32 == nullptr) {
    return Fail(ENOTSUP, "engram_stream_wait_value64: the CUDA driver lacks %s",
                d.missing != nullptr ? d.missing : "stream memory operations");
  }
  const auto device_addr = reinterpret_cast<CUdeviceptr>(addr);
  CUresult result;
  if (Has64BitMemOps()) {
    result = d.wait64(s, device_addr, value, CU_STREAM_WAIT_VALUE_GEQ);
    if (result != CUDA_SUCCESS) return FailDriver("cuStreamWaitValue64", result);
  } else {
    // Little-endian: the low word sits at addr. GEQ is cyclic, so wrap-around is handled.
    result = d.wait32(s, device_addr, static_cast<cuuint32_t>(value), CU_STREAM_WAIT_VALUE_GEQ);
    if (result != CUDA_SUCCESS) return FailDriver("cuStreamWaitValue32", result);
  }
  uintptr_t node = 0;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  size_t num_deps = 0;
#if CUDART_VERSION >= 13000
  cudaError_t status =
      cudaStreamGetCaptureInfo(s, &capture, nullptr, nullptr, &deps, nullptr, &num_deps);
#else
  cudaError_t status = cudaStreamGetCaptureInfo_v2(s, &capture, nullptr, nullptr, &deps, &num_deps);
#endif
  if (status != cudaSuccess) return FailRuntime("cudaStreamGetCaptureInfo", status);
  if (capture == cudaStreamCaptureStatusActive) {
    // The stream's only dependency right after the wait is the wait node itself.
    if (num_deps != 1) {
      return Fail(EIO, "engram_stream_wait_value64: captured wait left %zu dependencies, not 1",
                  num_deps);
    }
    node = reinterpret_cast<uintptr_t>(deps[0]);
  }
  if (ret_node != nullptr) *ret_node = node;
  return 0;
#endif
}

int engram_graph_set_wait_value64(uintptr_t graph_exec, uintptr_t node, uint64_t value) {
#if defined(ENGRAM_HIP)
  (void)graph_exec;
  (void)node;
  (void)value;
  return Fail(ENOTSUP,
              "engram_graph_set_wait_value64: HIP has no executable-graph update of wait nodes; "
              "use engram_stream_wait_ticket in graphs");
#else
  if (graph_exec == 0 || node == 0) {
    return Fail(EINVAL, "engram_graph_set_wait_value64: graph_exec and node must be set");
  }
  const DriverApi& d = Driver();
  if (d.node_get == nullptr || d.exec_set == nullptr) {
    return Fail(ENOTSUP, "engram_graph_set_wait_value64: the CUDA driver lacks %s", d.missing);
  }
  const auto graph_node = reinterpret_cast<CUgraphNode>(node);
  CUDA_BATCH_MEM_OP_NODE_PARAMS params{};
  CUresult result = d.node_get(graph_node, &params);
  if (result != CUDA_SUCCESS) return FailDriver("cuGraphBatchMemOpNodeGetParams", result);
  if (params.count != 1 || params.paramArray == nullptr) {
    return Fail(EINVAL,
                "engram_graph_set_wait_value64: node holds %u memory operations, not the single "
                "wait engram_stream_wait_value64 captured",
                params.count);
  }
  CUstreamBatchMemOpParams op = params.paramArray[0];
  if (op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_64) {
    op.waitValue.value64 = value;
  } else if (op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32) {
    op.waitValue.value = static_cast<cuuint32_t>(value);
  } else {
    return Fail(EINVAL, "engram_graph_set_wait_value64: node's operation %d is not a wait",
                static_cast<int>(op.operation));
  }
  params.paramArray = &op;
  result = d.exec_set(reinterpret_cast<CUgraphExec>(graph_exec), graph_node, &params);
  if (result != CUDA_SUCCESS) return FailDriver("cuGraphExecBatchMemOpNodeSetParams", result);
  return 0;
#endif
}

int engram_stream_wait_ticket(uintptr_t stream, const void* counter, const uint64_t* tickets,
                              uint32_t ring, uint32_t* step_counter) {
  if (counter == nullptr || tickets == nullptr || step_counter == nullptr || ring == 0) {
    return Fail(EINVAL,
                "engram_stream_wait_ticket: counter (%p), tickets (%p), step_counter (%p) must be "
                "set and ring (%u) > 0",
                counter, static_cast<const void*>(tickets), static_cast<void*>(step_counter), ring);
  }
  if (reinterpret_cast<uintptr_t>(counter) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(tickets) % 8 != 0) {
    return Fail(EINVAL, "engram_stream_wait_ticket: counter and tickets must be 8-byte aligned");
  }
  if (int rc = EnsureKernelsLoaded(); rc != 0) return rc;
  WaitTicketKernel<<<1, 1, 0, reinterpret_cast<gpuStream_t>(stream)>>>(
      static_cast<const volatile unsigned long long*>(counter),
      reinterpret_cast<const volatile unsigned long long*>(tickets), ring, step_counter);
  const gpuError_t status = gpuGetLastError();
  if (status != gpuSuccess) return FailRuntime("engram_stream_wait_ticket: kernel launch", status);
  return 0;
}

}  // extern "C"
