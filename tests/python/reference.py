# A plain NumPy/PyTorch reference for Engram embeddings, written from the format's definition
# and independent of the engram package: index the table tensors, decode E4M3 and E8M0 by their
# bit fields in float64, scale, round to bfloat16.
import numpy as np
import torch


def decode_e4m3(bytes_):
    b = np.asarray(bytes_, dtype=np.uint8).astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exponent = (b >> 3) & 0xF
    mantissa = (b & 0x7).astype(np.float64)
    normal = sign * (8.0 + mantissa) * np.exp2(exponent.astype(np.float64) - 10.0)
    subnormal = sign * mantissa * 2.0 ** -9
    value = np.where(exponent == 0, subnormal, normal)
    return np.where((exponent == 0xF) & (mantissa == 7), np.nan, value)


def decode_e8m0(bytes_):
    b = np.asarray(bytes_, dtype=np.uint8).astype(np.float64)
    return np.where(b == 255, np.nan, np.exp2(b - 127.0))


def dequantize(rows):
    """uint8 [n, 264] -> bf16 [n, 256]."""
    rows = np.asarray(rows, dtype=np.uint8)
    values = decode_e4m3(rows[:, :256])
    scales = np.repeat(decode_e8m0(rows[:, 256:]), 32, axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        product = values * scales
    # float64 -> float32 is exact here (4-bit significands, exponents within float32's range,
    # overflow to inf), so the bf16 conversion below is the only rounding.
    with np.errstate(over="ignore", invalid="ignore"):
        as_float32 = product.astype(np.float32)
    return torch.from_numpy(to_bf16_bits(as_float32)).view(torch.bfloat16)


def to_bf16_bits(float32):
    """float32 array -> int16 bf16 bit patterns: round to nearest even; NaN -> 0x7FC0."""
    bits = np.ascontiguousarray(float32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = np.where(np.isnan(float32), 0x7FC0, rounded)
    return rounded.astype(np.uint16).view(np.int16)


def embeddings(tables, layer, ids):
    """bf16 [tokens, heads, 256] for ids [tokens, heads]; a negative id reads as zeros."""
    weight, scale = tables[layer]
    ids = np.asarray(ids, dtype=np.int64)
    tokens, heads = ids.shape
    flat = ids.reshape(-1)
    out = torch.zeros((flat.size, 256), dtype=torch.bfloat16)
    valid = flat >= 0
    if valid.any():
        rows = np.concatenate([weight[flat[valid]], scale[flat[valid]]], axis=1)
        out[torch.from_numpy(valid)] = dequantize(rows)
    return out.view(tokens, heads, 256)


def bits(tensor):
    """bf16 tensor -> its int16 bit patterns (compares NaNs and signed zeros exactly)."""
    return tensor.contiguous().view(torch.int16)
