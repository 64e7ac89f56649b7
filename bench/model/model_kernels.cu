// The model-side kernels of the DeepSeek-V4.1-shaped step; see model_kernels.h.
#include <cuda_bf16.h>
#include <mma.h>

#include <cstring>

#include "bench/model/model_kernels.h"

namespace engram::bench {
namespace {

using namespace nvcuda;

// Block tile 128 x 128, K step 32, 8 warps as 2 (rows) x 4 (columns), each warp 64 x 32 of C.
constexpr int kBm = 128, kBn = 128, kBk = 32, kPadA = 8, kPadB = 8, kThreads = 256;

__device__ inline void CopyAsync16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ inline void CopyCommit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ inline void CopyWaitAllButOne() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ inline void CopyWaitAll() { asm volatile("cp.async.wait_group 0;\n" ::); }

struct GemmSmem {
  __nv_bfloat16 a[2][kBm][kBk + kPadA];
  __nv_bfloat16 b[2][kBk][kBn + kPadB];
};

// Loads the K slice k0 of the block's A rows and B columns into stage `st`. A rows past M
// repeat row M - 1 (their results are never stored).
__device__ inline void LoadStage(GemmSmem& sm, int st, const __nv_bfloat16* a,
                                 const __nv_bfloat16* b, uint32_t m, uint32_t n, uint32_t k,
                                 uint32_t row0, uint32_t col0, uint32_t k0) {
  for (int i = threadIdx.x; i < kBm * kBk / 8; i += kThreads) {
    const int r = i / (kBk / 8), c = (i % (kBk / 8)) * 8;
    const uint32_t gr = min(row0 + r, m - 1);
    CopyAsync16(&sm.a[st][r][c], a + uint64_t{gr} * k + k0 + c);
  }
  for (int i = threadIdx.x; i < kBk * kBn / 8; i += kThreads) {
    const int r = i / (kBn / 8), c = (i % (kBn / 8)) * 8;
    CopyAsync16(&sm.b[st][r][c], b + uint64_t{k0 + r} * n + col0 + c);
  }
}

__global__ void __launch_bounds__(kThreads)
    GemmKernel(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* c, uint32_t m,
               uint32_t n, uint32_t k) {
  __shared__ __align__(128) GemmSmem sm;
  __shared__ __align__(32) float scratch[kThreads / 32][16 * 16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wr = warp / 4, wc = warp % 4;  // warp row (0..1) and column (0..3)
  const uint32_t row0 = blockIdx.y * kBm, col0 = blockIdx.x * kBn;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
  for (auto& row : acc) {
    for (auto& f : row) wmma::fill_fragment(f, 0.0f);
  }
  LoadStage(sm, 0, a, b, m, n, k, row0, col0, 0);
  CopyCommit();
  const uint32_t steps = k / kBk;
  for (uint32_t s = 0; s < steps; ++s) {
    const int st = s & 1;
    if (s + 1 < steps) {
      LoadStage(sm, st ^ 1, a, b, m, n, k, row0, col0, (s + 1) * kBk);
      CopyCommit();
      CopyWaitAllButOne();
    } else {
      CopyWaitAll();
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBk; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[4];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb[2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        wmma::load_matrix_sync(fa[i], &sm.a[st][wr * 64 + i * 16][kk], kBk + kPadA);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::load_matrix_sync(fb[j], &sm.b[st][kk][wc * 32 + j * 16], kBn + kPadB);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  // Each warp rounds its fragments to bf16 through a 16 x 16 scratch tile, storing rows < M.
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(scratch[warp], acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const uint32_t r = row0 + wr * 64 + i * 16 + e / 16;
        const uint32_t col = col0 + wc * 32 + j * 16 + e % 16;
        if (r < m) c[uint64_t{r} * n + col] = __float2bfloat16(scratch[warp][e]);
      }
      __syncwarp();
    }
  }
}

// Sum over the block (256 threads) of four values; every thread gets the sums.
__device__ inline float4 BlockSum4(float4 v) {
  __shared__ float4 part[8];
  for (int o = 16; o > 0; o /= 2) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
    v.z += __shfl_xor_sync(0xffffffffu, v.z, o);
    v.w += __shfl_xor_sync(0xffffffffu, v.w, o);
  }
  __syncthreads();  // part[] may still be read from a previous call
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float4 s = make_float4(0, 0, 0, 0);
  for (int w = 0; w < 8; ++w) {
    s.x += part[w].x, s.y += part[w].y, s.z += part[w].z, s.w += part[w].w;
  }
  return s;
}

constexpr float kEps = 1e-6f;

// One block per (token, branch): the gate from RMSNorm(key) . RMSNorm(query) / sqrt(H), then
// gated = gate * value and normed = RMSNorm(gated) * conv_norm.
__global__ void GateKernel(MixerArgs a) {
  const uint32_t t = blockIdx.x / a.hc, br = blockIdx.x % a.hc, h = a.hidden;
  const __nv_bfloat16* row =
      reinterpret_cast<const __nv_bfloat16*>(a.proj) + uint64_t{t} * (1 + a.hc) * h;
  const __nv_bfloat16* value = row;
  const __nv_bfloat16* key = row + uint64_t{1 + br} * h;
  const __nv_bfloat16* query =
      reinterpret_cast<const __nv_bfloat16*>(a.hidden_io) + (uint64_t{t} * a.hc + br) * h;
  float4 s = make_float4(0, 0, 0, 0);  // key^2, query^2, weighted key.query, value^2
  for (uint32_t j = threadIdx.x; j < h; j += blockDim.x) {
    const float kv = __bfloat162float(key[j]), qv = __bfloat162float(query[j]);
    const float vv = __bfloat162float(value[j]);
    s.x += kv * kv, s.y += qv * qv, s.w += vv * vv;
    s.z += kv * a.key_norm[br * h + j] * qv * a.query_norm[br * h + j];
  }
  s = BlockSum4(s);
  const float score = s.z * rsqrtf(s.x / h + kEps) * rsqrtf(s.y / h + kEps) * rsqrtf(float(h));
  const float root = sqrtf(fmaxf(fabsf(score), 1e-6f));
  const float gate = 1.0f / (1.0f + expf(-(score < 0 ? -root : root)));
  const float inv = rsqrtf(gate * gate * s.w / h + kEps);
  __nv_bfloat16* gated = reinterpret_cast<__nv_bfloat16*>(a.gated) + (uint64_t{t} * a.hc + br) * h;
  __nv_bfloat16* normed =
      reinterpret_cast<__nv_bfloat16*>(a.normed) + (uint64_t{t} * a.hc + br) * h;
  for (uint32_t j = threadIdx.x; j < h; j += blockDim.x) {
    const float g = gate * __bfloat162float(value[j]);
    gated[j] = __float2bfloat16(g);
    normed[j] = __float2bfloat16(g * inv * a.conv_norm[j]);
  }
}

// One block per (token, branch): hidden += gated + SiLU(causal depthwise conv of normed), the
// convolution over positions t, t-3, t-6, t-9 of the same sequence.
__global__ void ConvKernel(MixerArgs a) {
  const uint32_t t = blockIdx.x / a.hc, br = blockIdx.x % a.hc, h = a.hidden;
  const uint32_t pos = t % a.seq_len;
  const auto* normed = reinterpret_cast<const __nv_bfloat16*>(a.normed);
  const auto* gated = reinterpret_cast<const __nv_bfloat16*>(a.gated);
  auto* io = reinterpret_cast<__nv_bfloat16*>(a.hidden_io);
  const uint64_t at = (uint64_t{t} * a.hc + br) * h;
  for (uint32_t j = threadIdx.x; j < h; j += blockDim.x) {
    float acc = 0;
    for (uint32_t tap = 0; tap < 4; ++tap) {
      const uint32_t back = (3 - tap) * 3;
      if (pos >= back) {
        acc += a.conv_w[j * 4 + tap] *
               __bfloat162float(normed[(uint64_t{t - back} * a.hc + br) * h + j]);
      }
    }
    const float silu = acc / (1.0f + expf(-acc));
    io[at + j] =
        __float2bfloat16(__bfloat162float(io[at + j]) + __bfloat162float(gated[at + j]) + silu);
  }
}

__global__ void StampKernel(uint64_t* slot) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *slot = t;
}

__global__ void FillKernel(__nv_bfloat16* p, uint64_t n, uint32_t seed, float scale) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i * 2654435761u) ^ (seed * 0x9E3779B9u);
    x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
    p[i] = __float2bfloat16(scale * (static_cast<float>(x >> 8) / 8388608.0f - 1.0f));
  }
}

}  // namespace

cudaError_t Gemm(const uint16_t* a, const uint16_t* b, uint16_t* c, uint32_t m, uint32_t n,
                 uint32_t k, cudaStream_t stream) {
  if (m == 0 || n % kBn != 0 || k % kBk != 0) return cudaErrorInvalidValue;
  const dim3 grid(n / kBn, (m + kBm - 1) / kBm);
  GemmKernel<<<grid, kThreads, 0, stream>>>(reinterpret_cast<const __nv_bfloat16*>(a),
                                            reinterpret_cast<const __nv_bfloat16*>(b),
                                            reinterpret_cast<__nv_bfloat16*>(c), m, n, k);
  return cudaGetLastError();
}

cudaError_t EngramMix(const MixerArgs& a, cudaStream_t stream) {
  if (a.tokens == 0 || a.hc == 0 || a.seq_len == 0 || a.tokens % a.seq_len != 0) {
    return cudaErrorInvalidValue;
  }
  GateKernel<<<a.tokens * a.hc, 256, 0, stream>>>(a);
  ConvKernel<<<a.tokens * a.hc, 256, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t Stamp(uint64_t* slot, cudaStream_t stream) {
  StampKernel<<<1, 1, 0, stream>>>(slot);
  return cudaGetLastError();
}

cudaError_t FillBf16(uint16_t* p, uint64_t n, uint32_t seed, float scale, cudaStream_t stream) {
  FillKernel<<<1024, 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(p), n, seed, scale);
  return cudaGetLastError();
}

float Bf16ToFloat(uint16_t v) {
  const uint32_t bits = uint32_t{v} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace engram::bench
