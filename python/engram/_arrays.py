"""Integer id arrays from what callers pass: lists, tuples, ranges, NumPy arrays, CPU tensors;
a step's row ids checked against the rows a table serves."""

import errno
import sys
from typing import Any, Optional, Tuple

import numpy as np

from .errors import InvalidArgumentError, RowOutOfRangeError


def integer_array(values: Any, what: str, *, ndim: Optional[int] = 1,
                  empty_dtype: Any = np.int64, cpu_hint: str = "pass them on the CPU"
                  ) -> np.ndarray:
    """values as a NumPy array of integers with `ndim` dimensions (None: any), without a copy
    where NumPy allows one. Never imports torch: a tensor can only come from a loaded torch.

    Raises InvalidArgumentError for a tensor on a GPU (the message ends with cpu_hint) or
    another number of dimensions, TypeError for values that are not integers. `what` names
    the values in every message."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(values, torch.Tensor):
        if values.device.type != "cpu":
            raise InvalidArgumentError(-errno.EINVAL,
                                       f"{what} are on {values.device}; {cpu_hint}")
        if values.dtype == torch.bool or values.is_floating_point() or values.is_complex():
            raise TypeError(f"{what} must be integers, got a tensor of {values.dtype}")
        array = values.detach().contiguous().numpy()
    elif isinstance(values, np.ndarray):
        array = values
    else:
        array = np.asarray(values)
        if array.size == 0:
            array = array.astype(empty_dtype)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers, got {array.dtype}")
    if ndim is not None and array.ndim != ndim:
        raise InvalidArgumentError(-errno.EINVAL,
                                   f"{what} must be {ndim}-D, got shape {tuple(array.shape)}")
    return array


def step_row_ids(ids: Any, layer: int, heads: int, max_tokens: Optional[int], begin: int,
                 end: int) -> Tuple[int, np.ndarray, np.ndarray]:
    """(tokens, valid slots, rows) of layer `layer`'s row ids of a step, [tokens, heads] on the
    CPU, a negative id marking a padding slot: the rows are the valid slots' ids, in order.

    Raises InvalidArgumentError for another shape or more than max_tokens tokens (None: any
    number), RowOutOfRangeError naming layer, token and head for a row outside [begin, end),
    the rows engramd serves for the table."""
    ids = integer_array(ids, f"layer {layer}: row ids", ndim=None,
                        cpu_hint="pass them on the CPU (they are hashed from token ids on the "
                                 "host)")
    if ids.ndim != 2 or ids.shape[1] != heads:
        raise InvalidArgumentError(-errno.EINVAL,
                                   f"layer {layer}: row ids must have shape [tokens, {heads}], "
                                   f"got {list(ids.shape)}")
    tokens = ids.shape[0]
    if max_tokens is not None and tokens > max_tokens:
        raise InvalidArgumentError(-errno.EINVAL,
                                   f"layer {layer}: {tokens} tokens, more than max_tokens = "
                                   f"{max_tokens}")
    flat = ids.reshape(-1)
    valid = flat >= 0 if ids.dtype.kind == "i" else np.ones(flat.shape, dtype=bool)
    rows = flat[valid]
    if rows.size:
        bad = (rows < begin) | (rows >= end) if begin else rows >= end
        if bad.any():
            slot = int(np.flatnonzero(valid)[int(np.argmax(bad))])
            raise RowOutOfRangeError(
                -errno.ERANGE, f"layer {layer}: row {int(flat[slot])} (token {slot // heads}, "
                               f"head {slot % heads}) is outside the rows [{begin}, {end}) "
                               f"engramd serves for this table")
    return tokens, valid, rows
