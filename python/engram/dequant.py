"""Dequantises gathered Engram rows on the CPU, with the GPU kernel's exact results.

A row is 256 FP8 E4M3 values then 8 E8M0 scales, one per block of 32 values:
value[i] = e4m3(row[i]) * 2^(row[256 + i // 32] - 127); a scale byte of 255 and the E4M3 NaN
encodings (0x7F, 0xFF) give NaN. The product is exact in float32 (a 4-bit significand times a
power of two within float32's range, or an overflow to +-inf), so converting it to bfloat16
rounds once, to nearest even, as the kernel does. NaN is written as the kernel writes it
(0x7FC0, positive quiet NaN).
"""

import functools
from typing import Any

import torch

from . import _lib

ROW_VALUES = 256
BLOCK_VALUES = 32
SCALE_BYTES = ROW_VALUES // BLOCK_VALUES


def e4m3_value(byte: int) -> float:
    """The real number an FP8 E4M3 (fn variant: no infinities) byte encodes, as a float."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent = (byte >> 3) & 0xF
    mantissa = byte & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return float("nan")
    if exponent == 0:
        return sign * mantissa * 2.0 ** -9  # subnormal: m/8 * 2^-6
    return sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)


@functools.lru_cache(maxsize=None)
def _tables(device: str = "cpu"):
    # Debian's torch (1.13) has no float8 dtypes: decode through 256-entry tables instead.
    values = torch.tensor([e4m3_value(b) for b in range(256)], dtype=torch.float32)
    scales = torch.tensor([2.0 ** (s - 127) if s != 255 else float("nan") for s in range(256)],
                          dtype=torch.float32)
    return values.to(device), scales.to(device)


def dequantize_rows(rows: torch.Tensor) -> torch.Tensor:
    """rows: uint8 tensor [n, 264]. Returns bf16 [n, 256] on the rows' device."""
    row_bytes = _lib.row_bytes()
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != row_bytes:
        raise ValueError(f"rows must be a uint8 tensor [n, {row_bytes}], got {rows.dtype} "
                         f"{list(rows.shape)}")
    values_table, scales_table = _tables(str(rows.device))
    n = rows.shape[0]
    values = values_table[rows[:, :ROW_VALUES].long()].view(n, SCALE_BYTES, BLOCK_VALUES)
    scales = scales_table[rows[:, ROW_VALUES:].long()].view(n, SCALE_BYTES, 1)
    out = (values * scales).view(n, ROW_VALUES)
    nan = torch.isnan(out)
    out = out.to(torch.bfloat16)
    # torch's vectorised conversion writes NaN as 0xFFFF: use the kernel's pattern instead.
    out.view(torch.int16)[nan] = 0x7FC0
    return out


def dequantize_scatter(rows: torch.Tensor, index_map: Any, tokens: int,
                       heads: int) -> torch.Tensor:
    """The CPU twin of engram_dequant_scatter: bf16 [tokens, heads, 256] where slot
    token * heads + head holds row index_map[slot] of `rows`, +0.0 where index_map < 0.
    Indices past the rows raise IndexError (the kernel writes NaN; a CPU caller gets told)."""
    index_map = torch.as_tensor(index_map).reshape(-1).long()
    if index_map.numel() != tokens * heads:
        raise ValueError(f"index_map has {index_map.numel()} entries, expected tokens * heads "
                         f"= {tokens} * {heads}")
    dequantized = dequantize_rows(rows)
    if index_map.numel() and int(index_map.max()) >= dequantized.shape[0]:
        raise IndexError(f"index_map holds {int(index_map.max())}, but only "
                         f"{dequantized.shape[0]} rows were gathered")
    out = torch.zeros((tokens * heads, ROW_VALUES), dtype=torch.bfloat16)
    dequantized = dequantized.cpu()
    valid = index_map >= 0
    if bool(valid.any()):
        out[valid] = dequantized[index_map[valid]]
    return out.view(tokens, heads, ROW_VALUES)
