"""ArenaBuffer: a range of a session's shared-memory data region (Client.alloc)."""

import ctypes
import errno

from typing import TYPE_CHECKING

import numpy as np

from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .client import Client


class ArenaBuffer:
    """A range of the session's data region (Client.alloc): memory the daemon can gather
    into and read row ids from. Freed once, by free(), the end of a `with` block, or (for the
    ranges behind gathered tensors) when the last view is garbage collected."""

    __slots__ = ("client", "address", "bytes", "freed", "__weakref__")

    def __init__(self, client: "Client", address: int, nbytes: int):
        self.client = client
        self.address = address
        self.bytes = nbytes
        self.freed = False

    def __repr__(self):
        state = " freed" if self.freed else ""
        return f"<engram.ArenaBuffer 0x{self.address:x}+{self.bytes}{state}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def numpy(self, dtype, count: int, offset: int = 0) -> np.ndarray:
        """A NumPy view of `count` items of `dtype` at byte `offset`; valid until free()."""
        dtype = np.dtype(dtype)
        if self.freed:
            raise InvalidArgumentError(-errno.EINVAL, "the arena buffer was freed")
        if offset < 0 or count < 0 or offset + count * dtype.itemsize > self.bytes:
            raise InvalidArgumentError(-errno.EINVAL, f"{count} x {dtype} at offset {offset} "
                                                      f"exceeds the buffer's {self.bytes} bytes")
        raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(self.address + offset)
        return np.frombuffer(raw, dtype=dtype, count=count)

    def free(self) -> None:
        """Hands the range back to the arena (no request may still use it). Idempotent."""
        self.client._free(self)
