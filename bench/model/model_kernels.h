// The model-side kernels of the DeepSeek-V4.1-shaped step (bench/model): a tiled bf16 GEMM on
// the tensor cores (the stand-in layers and the Engram layer's projections), the Engram layer's
// gate and short convolution (python/examples/engram_layer.py's EngramMixer), and a timestamp
// kernel for the step's timeline. Every launch is queued on `stream` and capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace engram::bench {

// C[M, N] = A[M, K] x B[K, N]: bf16 (raw uint16) row-major, float accumulation, C rounded to
// bf16. K must be a multiple of 32 and N of 128; M is any positive count. Returns the launch's
// error.
cudaError_t Gemm(const uint16_t* a, const uint16_t* b, uint16_t* c, uint32_t m, uint32_t n,
                 uint32_t k, cudaStream_t stream);

// The Engram layer's weights and activations for `tokens` tokens of hidden size `hidden`, with
// hc_mult branches, the memory of `mem_width` values per token (the rank's heads x 256).
struct MixerArgs {
  uint32_t tokens, hidden, hc, seq_len;  // seq_len: tokens per sequence (the conv's causal span)
  const uint16_t* proj;     // [tokens, (1 + hc) * hidden]: value, then hc keys (the GEMM's C)
  uint16_t* hidden_io;      // [tokens, hc, hidden]: read, and the update added in place
  const float* key_norm;    // [hc, hidden]
  const float* query_norm;  // [hc, hidden]
  const float* conv_norm;   // [hidden]
  const float* conv_w;      // [hidden, 4] (kernel 4, dilation 3)
  uint16_t* gated;          // scratch [tokens, hc, hidden]
  uint16_t* normed;         // scratch [tokens, hc, hidden]
};

// Gate (RMS-normalised key and query, scaled dot product, signed square root, sigmoid) times the
// value, then the short causal depthwise convolution (kernel 4, dilation 3, SiLU) within each
// sequence, added with the gated value to hidden_io. Two launches.
cudaError_t EngramMix(const MixerArgs& a, cudaStream_t stream);

// Writes the GPU's global nanosecond timer to *slot (one thread).
cudaError_t Stamp(uint64_t* slot, cudaStream_t stream);

// Fills n bf16 values with a deterministic pattern in [-scale, scale).
cudaError_t FillBf16(uint16_t* p, uint64_t n, uint32_t seed, float scale, cudaStream_t stream);

// bf16 <-> float on the host (round to nearest even), for the self-check.
float Bf16ToFloat(uint16_t v);
uint16_t FloatToBf16(float f);

}  // namespace engram::bench
