"""Integer id arrays from what callers pass: lists, tuples, ranges, NumPy arrays, CPU tensors."""

import errno
import sys
from typing import Any, Optional

import numpy as np

from .errors import InvalidArgumentError


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
