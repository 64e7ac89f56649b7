"""Integer id arrays from what callers pass: lists, tuples, ranges, NumPy arrays, CPU tensors."""

import errno

import numpy as np

from .errors import InvalidArgumentError

try:
    import torch
except ImportError:  # validating ids does not need torch
    torch = None


def integer_array(values, what, *, ndim=1, empty_dtype=np.int64,
                  cpu_hint="pass them on the CPU"):
    """values as a NumPy array of integers with `ndim` dimensions (None: any), without a copy
    where NumPy allows one.

    Raises InvalidArgumentError for a tensor on a GPU (the message ends with cpu_hint) or
    another number of dimensions, TypeError for values that are not integers. `what` names
    the values in every message."""
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
