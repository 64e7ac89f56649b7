"""Typed views of gathered Engram rows: FP8 E4M3 values and E8M0 scales over the same bytes.

A row is 264 bytes: 256 FP8 E4M3 values (the "fn" variant: no infinities, 0x7F and 0xFF are
NaN), then 8 E8M0 scales, one per block of 32 values. Dequantised,
value[i] = e4m3(row[i]) * 2^(row[256 + i // 32] - 127), and a scale byte of 255 is NaN.

    rows = client.gather(14, ids)                 # torch.uint8 [n, 264], the arena itself
    values, scales = engram.split_rows(rows)      # float8_e4m3fn [n, 256], uint8 [n, 8]
    arr = client.gather(14, ids, array="numpy")   # numpy.uint8 [n, 264], no torch needed
    values, scales = engram.split_rows(arr)       # uint8 [n, 256] (E4M3 bits), uint8 [n, 8]
    floats = engram.decode_e4m3(values)           # numpy.float32 [n, 256]

Nothing is copied: both parts view the gathered memory, so they live exactly as long as it does
(see Client.release). NumPy has no FP8 dtype, so NumPy values stay uint8 bit patterns with
decode_e4m3 / decode_e8m0 / dequantize_numpy to read them. torch has float8_e4m3fn since 2.1;
on an older torch, split_rows(tensor) raises Float8UnavailableError, and
split_rows(tensor, float8=False) gives uint8 values instead.
This module needs only NumPy; it imports nothing from torch unless torch is already loaded.
"""

import functools
import sys
from typing import Any, NamedTuple, Optional

import numpy as np

from . import _lib

ROW_VALUES = 256
BLOCK_VALUES = 32
SCALE_BYTES = ROW_VALUES // BLOCK_VALUES


class Float8UnavailableError(TypeError):
    """The torch in use has no float8_e4m3fn dtype (it arrived in torch 2.1)."""


class RowView(NamedTuple):
    """The two typed parts of gathered rows, and the raw bytes they view."""
    values: Any  # FP8 E4M3: torch.float8_e4m3fn, or uint8 bit patterns [..., 256]
    scales: Any  # E8M0 exponents, uint8 [..., 8]
    raw: Any  # uint8 [..., 264]


def float8_dtype():
    """torch.float8_e4m3fn, or None when torch is not loaded or predates it."""
    torch = sys.modules.get("torch")
    return getattr(torch, "float8_e4m3fn", None) if torch is not None else None


def _is_tensor(rows):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(rows, torch.Tensor)


def split_rows(rows, *, float8: Optional[bool] = None) -> RowView:
    """(values, scales, raw) viewing rows [..., 264] without a copy.

    rows: a torch.uint8 tensor or a numpy.uint8 array whose last dimension is 264 and is
    contiguous (what Client.gather returns). float8: None gives torch.float8_e4m3fn values for
    a tensor and uint8 values for an array; False gives uint8 values for both; True requires
    float8 (a tensor on torch >= 2.1). Raises ValueError for another dtype or shape,
    Float8UnavailableError when float8 values are asked of a torch without them."""
    if _is_tensor(rows):
        dtype, shape = str(rows.dtype), tuple(rows.shape)
        contiguous = rows.dim() > 0 and rows.stride(-1) == 1
    elif isinstance(rows, np.ndarray):
        dtype, shape = str(rows.dtype), rows.shape
        contiguous = rows.ndim > 0 and rows.strides[-1] == 1
    else:
        raise TypeError(f"rows must be a torch tensor or a NumPy array, got {type(rows).__name__}")
    if dtype not in ("torch.uint8", "uint8") or not shape or shape[-1] != _lib.row_bytes():
        raise ValueError(f"rows must be uint8 [..., {_lib.row_bytes()}], got {dtype} "
                         f"{list(shape)}")
    if not contiguous:
        raise ValueError("rows must be contiguous in their last dimension (264 bytes a row)")
    values, scales = rows[..., :ROW_VALUES], rows[..., ROW_VALUES:]
    if float8 is False:
        return RowView(values, scales, rows)
    if not _is_tensor(rows):
        if float8:
            raise TypeError("NumPy has no FP8 dtype: split_rows(array) gives uint8 values "
                            "(decode them with engram.decode_e4m3)")
        return RowView(values, scales, rows)
    fp8 = float8_dtype()
    if fp8 is None:
        version = getattr(sys.modules.get("torch"), "__version__", "?")
        raise Float8UnavailableError(
            f"torch {version} has no float8_e4m3fn (torch 2.1 added it); "
            f"split_rows(rows, float8=False) gives the values as uint8 bit patterns")
    return RowView(values.view(fp8), scales, rows)


@functools.lru_cache(maxsize=None)
def _e4m3_table():
    b = np.arange(256, dtype=np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exponent = (b >> 3) & 0xF
    mantissa = (b & 0x7).astype(np.float64)
    normal = sign * (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
    subnormal = sign * mantissa * 2.0 ** -9  # m/8 * 2^-6
    table = np.where(exponent == 0, subnormal, normal)
    table[(exponent == 0xF) & (b & 0x7 == 0x7)] = np.nan
    return table.astype(np.float32)


@functools.lru_cache(maxsize=None)
def _e8m0_table():
    s = np.arange(256, dtype=np.float64)
    table = np.exp2(s - 127.0)
    table[255] = np.nan
    return table.astype(np.float32)  # 2^-127 is a float32 subnormal: exact


def decode_e4m3(values) -> np.ndarray:
    """FP8 E4M3 bit patterns (uint8 array) -> their values as float32 (exact)."""
    return _e4m3_table()[np.asarray(values, dtype=np.uint8)]


def decode_e8m0(scales) -> np.ndarray:
    """E8M0 bytes (uint8 array) -> 2^(byte - 127) as float32; 255 -> NaN (exact)."""
    return _e8m0_table()[np.asarray(scales, dtype=np.uint8)]


def dequantize_numpy(rows) -> np.ndarray:
    """uint8 rows [..., 264] -> float32 [..., 256]: value x block scale, exact in float32
    (rounding it to bfloat16, to nearest even, gives what the GPU kernel writes)."""
    rows = np.asarray(rows, dtype=np.uint8)
    if rows.ndim == 0 or rows.shape[-1] != _lib.row_bytes():
        raise ValueError(f"rows must be uint8 [..., {_lib.row_bytes()}], got "
                         f"{list(rows.shape)}")
    lead = rows.shape[:-1]
    values = decode_e4m3(rows[..., :ROW_VALUES]).reshape(*lead, SCALE_BYTES, BLOCK_VALUES)
    scales = decode_e8m0(rows[..., ROW_VALUES:]).reshape(*lead, SCALE_BYTES, 1)
    with np.errstate(over="ignore", invalid="ignore"):
        return (values * scales).reshape(*lead, ROW_VALUES)
