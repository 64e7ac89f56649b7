"""ctypes wrappers of include/engram/gpu.h: arena registration, stream waits, dequant-scatter.

Registration comes from libengram_client (it loads the process's CUDA or HIP runtime at run
time); the kernels from libengram_kernels_cuda.so (or _hip.so). Streams are passed as integers
(torch's stream.cuda_stream), so nothing here synchronises with the host.
"""

import ctypes
import errno

from . import _lib
from .errors import error_for


def _kernels_check(lib, rc, what):
    if rc < 0:
        message = lib.engram_kernels_last_error()
        message = message.decode("utf-8", "replace") if message else what
        raise error_for(rc, f"{what}: {message}")


class Registration:
    """[address, address + length) pinned and mapped for the GPU (engram_gpu_register)."""

    def __init__(self, address: int, length: int):
        self._lib = _lib.gpu_register_lib()
        handle = ctypes.c_void_p()
        rc = self._lib.engram_gpu_register(ctypes.c_void_p(address), length, ctypes.byref(handle))
        if rc < 0:
            message = self._lib.engram_gpu_last_error()
            message = message.decode("utf-8", "replace") if message else ""
            raise error_for(rc, f"registering {length} bytes at 0x{address:x} with the GPU "
                                f"runtime: {message}")
        self._handle = handle
        self.address = address
        self.length = length

    def device_ptr(self, host_address: int) -> int:
        """The device address of a host address inside the registered range."""
        if self._handle is None:
            raise error_for(-errno.EINVAL, "the GPU registration was released")
        ptr = self._lib.engram_gpu_device_ptr(self._handle, ctypes.c_void_p(host_address))
        if not ptr:
            raise error_for(-errno.EINVAL, f"0x{host_address:x} is outside the registered "
                                           f"range 0x{self.address:x}+{self.length}")
        return ptr

    def unregister(self) -> None:
        """Unpins the range; no queued GPU work may still read it. Idempotent."""
        handle, self._handle = self._handle, None
        if handle is not None:
            rc = self._lib.engram_gpu_unregister(handle)
            if rc < 0:
                message = self._lib.engram_gpu_last_error()
                raise error_for(rc, message.decode("utf-8", "replace") if message else
                                "engram_gpu_unregister failed")


class Kernels:
    """The kernel library for torch's backend ('cuda' or 'hip')."""

    def __init__(self, backend=None):
        self._lib, self.path = _lib.kernels_lib(backend)

    def dequant_scatter(self, rows, num_rows, index_map, tokens, heads, out, stream):
        rc = self._lib.engram_dequant_scatter(
            ctypes.c_void_p(rows), num_rows, ctypes.c_void_p(index_map), tokens, heads,
            ctypes.c_void_p(out), None, 0, None, stream)
        _kernels_check(self._lib, rc, "engram_dequant_scatter")

    def stream_wait_ticket(self, stream, counter, tickets, ring, step_counter):
        rc = self._lib.engram_stream_wait_ticket(stream, ctypes.c_void_p(counter),
                                                 ctypes.c_void_p(tickets), ring,
                                                 ctypes.c_void_p(step_counter))
        _kernels_check(self._lib, rc, "engram_stream_wait_ticket")
