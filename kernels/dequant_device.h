// The device half of the row dequantisation: e4m3 x e8m0 to bf16 for one slot, shared by the
// dequantise kernels (engram_kernels.cu) and the queue's fused wait-and-dequantise kernel
// (engram_queue.cu), so that both produce the same bits as the CPU reference (dequant_ref.h).
// Included only by .cu sources.
#pragma once

#include <cstdint>

#include "engram/gpu.h"
#include "engram/row.h"
#include "kernels/gpu_compat.h"

namespace engram::kernels {

// A group of 32 threads handles one output slot: 8 values (8 bytes in, 16 bytes out) each.
constexpr uint32_t kThreadsPerSlot = 32;
constexpr uint32_t kValuesPerThread = ENGRAM_ROW_VALUES / kThreadsPerSlot;

// e4m3 (FN: no infinities, S.1111.111 is NaN) to float, exactly.
__device__ __forceinline__ float E4M3ToFloat(uint32_t byte) {
  const uint32_t sign = (byte & 0x80u) << 24;
  const uint32_t exponent = (byte >> 3) & 0xFu;
  const uint32_t mantissa = byte & 0x7u;
  float magnitude;
  if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * 0x1p-9f;  // subnormal: m/8 * 2^-6
  } else {
    // Rebias 7 -> 127 and move the 3 mantissa bits to the top of float's 23.
    magnitude = __uint_as_float(((exponent + 120u) << 23) | (mantissa << 20));
  }
  return __uint_as_float(__float_as_uint(magnitude) | sign);
}

// 2^(byte - 127) as float; byte 0 is the float subnormal 2^-127. 255 (NaN) is handled by the
// caller.
__device__ __forceinline__ float E8M0ToFloat(uint32_t byte) {
  return __uint_as_float(byte == 0 ? 0x00400000u : byte << 23);
}

// Round-to-nearest-even float -> bf16 on the bit pattern. bf16 is float's top half, so the
// same carry handles normals, subnormals and overflow to infinity.
__device__ __forceinline__ uint32_t FloatToBf16Bits(float value) {
  const uint32_t bits = __float_as_uint(value);
  return (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
}

// One value. The product of a 4-significant-bit e4m3 value and a power of two is exact in
// float (its smallest magnitude, 2^-136, is above float's 2^-149 floor, and an overflow is
// +-inf either way), so the only rounding is the one to bf16. Requires -ftz=false (default).
__device__ __forceinline__ uint32_t DequantOne(uint32_t byte, float scale, bool scale_nan) {
  if (scale_nan || (byte & 0x7Fu) == 0x7Fu) return ENGRAM_GPU_BF16_NAN;
  return FloatToBf16Bits(E4M3ToFloat(byte) * scale);
}

// Lane `lane` (0-31) of the group writing one slot's 256 bf16 values at `out_slot`: its 8
// values (`values`, little-endian bytes lane * 8 .. + 8 of the row) with the row's scale byte
// of the block they are in.
__device__ __forceinline__ void DequantLane(uint64_t values, uint32_t scale_byte, uint32_t lane,
                                            uint16_t* out_slot) {
  const float scale = E8M0ToFloat(scale_byte);
  const bool scale_nan = scale_byte == 0xFFu;
  uint32_t half[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) half[i] = DequantOne((values >> (8 * i)) & 0xFFu, scale, scale_nan);
  uint4 packed;
  packed.x = half[0] | (half[1] << 16);
  packed.y = half[2] | (half[3] << 16);
  packed.z = half[4] | (half[5] << 16);
  packed.w = half[6] | (half[7] << 16);
  *reinterpret_cast<uint4*>(out_slot + lane * kValuesPerThread) = packed;
}

// Lane `lane` (0-31) of the group writing one slot's 256 bf16 values at `out_slot`: from `row`,
// or +0.0 for padding, or NaN for a bad index (counted once per slot in *bad_index_count).
__device__ __forceinline__ void DequantSlot(const uint8_t* row, bool padding, uint32_t lane,
                                            uint16_t* out_slot, uint32_t* bad_index_count) {
  if (row != nullptr) {
    // 8 value bytes per thread: one 8-byte load (rows are 264 = 33 * 8 bytes apart).
    const uint2 values = *reinterpret_cast<const uint2*>(row + lane * kValuesPerThread);
    const uint32_t scale_byte = row[ENGRAM_ROW_VALUES + lane * kValuesPerThread / 32];
    DequantLane(uint64_t{values.x} | uint64_t{values.y} << 32, scale_byte, lane, out_slot);
    return;
  }
  uint4 packed;
  if (padding) {
    packed = make_uint4(0, 0, 0, 0);  // padding slot: +0.0
  } else {
    const uint32_t nan2 = ENGRAM_GPU_BF16_NAN | (ENGRAM_GPU_BF16_NAN << 16);
    packed = make_uint4(nan2, nan2, nan2, nan2);
    if (lane == 0 && bad_index_count != nullptr) atomicAdd(bad_index_count, 1u);
  }
  *reinterpret_cast<uint4*>(out_slot + lane * kValuesPerThread) = packed;
}

}  // namespace engram::kernels
