"""GpuDecodeStep: a decode step's Engram lookups driven entirely by the GPU.

The step's token ids live in static CUDA tensors that the engine's sampler writes; ``run()``
queues, on the current stream, the GPU hash of every layer straight into the session's arena
(include/engram/gpu_hash.h), a kernel that publishes the gather requests in pieces and one that
dequantises each piece into static bf16 outputs as soon as it lands
(engram_gpu_queue_gather_dequant, include/engram/gpu_submit.h). Nothing
on the host waits or calls into the daemon, so ``run()`` can be captured once in
``torch.cuda.graph`` and replayed every step::

    step = engram.GpuDecodeStep(hasher, layers=[1, 14], seqs=16, tokens_per_seq=6,
                                tp_size=4, tp_rank=1)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step.run()
    ...
    step.tokens.copy_(sampled)            # [seqs * tokens_per_seq] int32, on the GPU
    step.history.copy_(last_three)        # [seqs, 3] int32, -1 where a sequence starts
    g.replay()
    emb = step.output(14)                 # bf16 [tokens, heads, 256]
    if step.error:                        # after the step: the daemon failed or is gone
        ...                               # reconnect: a new GpuDecodeStep, capture again

docs/gpu.md ("Requests from the GPU") describes the protocol and the recovery.
"""

import ctypes
from typing import Any, Optional, Sequence

from . import _lib
from ._gpu import Kernels, Registration, _kernels_check
from .client import Client

HISTORY = 3  # DeepSeek-V4.1: max_ngram_size 4


class _HashArgs(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("layer_id", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("head_begin", ctypes.c_uint32),
        ("head_end", ctypes.c_uint32),
        ("tokens", ctypes.c_void_p),
        ("n_tokens", ctypes.c_uint32),
        ("n_seqs", ctypes.c_uint32),
        ("seq_starts", ctypes.c_void_p),
        ("history", ctypes.c_void_p),
        ("rows", ctypes.c_void_p),
        ("error_count", ctypes.c_void_p),
    ]


class _Request(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("table", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("rows", ctypes.c_void_p),
        ("num_rows", ctypes.c_uint64),
        ("dest", ctypes.c_void_p),
    ]


class _Dequant(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("index_map", ctypes.c_void_p),
        ("tokens", ctypes.c_uint32),
        ("heads", ctypes.c_uint32),
        ("out", ctypes.c_void_p),
        ("bad_index_count", ctypes.c_void_p),
    ]


class _QueueOptions(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("timeout_ns", ctypes.c_uint64)]


# ENGRAM_GPU_HASH_MAX_CALLS: the calls one engram_gpu_hash_layers launch takes.
_HASH_MAX_CALLS = 8

_STEP_FUNCTIONS = {
    "engram_gpu_hasher_create": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]),
    "engram_gpu_hasher_destroy": (ctypes.c_int, [ctypes.c_void_p]),
    "engram_gpu_hash_layers": (ctypes.c_int, [ctypes.c_void_p,
                                              ctypes.POINTER(ctypes.POINTER(_HashArgs)),
                                              ctypes.c_uint32, ctypes.c_size_t]),
    "engram_gpu_queue_create": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p,
                                               ctypes.POINTER(_QueueOptions),
                                               ctypes.POINTER(ctypes.c_void_p)]),
    "engram_gpu_queue_destroy": (ctypes.c_int, [ctypes.c_void_p]),
    "engram_gpu_queue_gather_dequant": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_Request),
                                                       ctypes.POINTER(_Dequant), ctypes.c_uint32,
                                                       ctypes.c_uint32, ctypes.c_size_t]),
    "engram_gpu_queue_error": (ctypes.POINTER(ctypes.c_int32), [ctypes.c_void_p]),
}


class GpuDecodeStep:
    """One captured-graph-ready decode step: ``seqs`` sequences of ``tokens_per_seq`` new
    tokens each (1 + speculative tokens), the heads of TP rank ``tp_rank`` of ``tp_size``, for
    every layer in ``layers``. The session connects with the device-submit flag, so its ring
    belongs to the GPU; ``timeout`` bounds how long a step waits for the daemon. Each layer's
    rows go out in pieces of ``piece_rows`` (a multiple of 16; 0: the library's default), which
    the daemon gathers side by side and the GPU dequantises as they land."""

    def __init__(self, hasher: Any, layers: Sequence[int], seqs: int, tokens_per_seq: int, *,
                 tp_size: int = 1, tp_rank: int = 0, socket: Optional[str] = None,
                 timeout: float = 2.0, piece_rows: int = 0):
        import torch

        self._kernels = Kernels("cuda")
        lib = self._kernels._lib
        _lib._declare(lib, _STEP_FUNCTIONS, self._kernels.path)
        self._lib = lib
        self.layers = list(layers)
        self.piece_rows = piece_rows
        self.head_begin, self.head_end = hasher.rank_heads(tp_size, tp_rank)
        self.heads = self.head_end - self.head_begin
        self.n_tokens = seqs * tokens_per_seq
        self.n_seqs = seqs
        n = self.n_tokens * self.heads
        self._rows_per_layer = n
        dev = torch.device("cuda", torch.cuda.current_device())
        self.tokens = torch.zeros(self.n_tokens, dtype=torch.int32, device=dev)
        self.history = torch.full((seqs, HISTORY), -1, dtype=torch.int32, device=dev)
        self._starts = torch.arange(0, self.n_tokens + 1, tokens_per_seq, dtype=torch.int32,
                                    device=dev)
        self._map = torch.arange(n, dtype=torch.int32, device=dev)
        self._out = {layer: torch.empty((self.n_tokens, self.heads, 256), dtype=torch.bfloat16,
                                        device=dev) for layer in self.layers}
        self._hash_errors = torch.zeros(1, dtype=torch.int32, device=dev)
        self._client = Client(socket, data_bytes=max(1 << 20, 2 * len(self.layers) * n *
                                                     (8 + _lib.row_bytes())),
                              slots=32, device_submit=True)
        base, size = self._client.arena()
        self._reg = Registration(base, size)
        self._ids = {layer: self._client.alloc(n * 8) for layer in self.layers}
        self._rows = {layer: self._client.alloc(n * _lib.row_bytes()) for layer in self.layers}
        self._gpu_hasher = ctypes.c_void_p()
        _kernels_check(lib, lib.engram_gpu_hasher_create(hasher._h(),
                                                         ctypes.byref(self._gpu_hasher)),
                       "engram_gpu_hasher_create")
        options = _QueueOptions(ctypes.sizeof(_QueueOptions), int(timeout * 1e9))
        self._queue = ctypes.c_void_p()
        _kernels_check(lib, lib.engram_gpu_queue_create(self._client._session(),
                                                        self._reg._handle, ctypes.byref(options),
                                                        ctypes.byref(self._queue)),
                       "engram_gpu_queue_create")
        self._error_word = lib.engram_gpu_queue_error(self._queue)

    def run(self, stream: Any = None) -> None:
        """Queues the step on ``stream`` (default: torch's current stream): hash, then submit,
        wait and dequantise, pipelined. Capturable; reads ``tokens`` and ``history`` when it
        runs."""
        import torch

        s = (stream or torch.cuda.current_stream()).cuda_stream
        lib = self._lib
        requests = (_Request * len(self.layers))()
        dequants = (_Dequant * len(self.layers))()
        hash_args = [
            _HashArgs(ctypes.sizeof(_HashArgs), layer, 0, self.head_begin, self.head_end,
                      self.tokens.data_ptr(), self.n_tokens, self.n_seqs, self._starts.data_ptr(),
                      self.history.data_ptr(), self._reg.device_ptr(self._ids[layer].address),
                      self._hash_errors.data_ptr()) for layer in self.layers]
        # Every layer's ids in as few launches as the library takes calls.
        for first in range(0, len(hash_args), _HASH_MAX_CALLS):
            chunk = hash_args[first:first + _HASH_MAX_CALLS]
            pointers = (ctypes.POINTER(_HashArgs) * len(chunk))(*[ctypes.pointer(a) for a in chunk])
            _kernels_check(lib, lib.engram_gpu_hash_layers(self._gpu_hasher, pointers,
                                                           len(chunk), s),
                           "engram_gpu_hash_layers")
        for i, layer in enumerate(self.layers):
            requests[i] = _Request(ctypes.sizeof(_Request), layer, 0, self._ids[layer].address,
                                   self._rows_per_layer, self._rows[layer].address)
            dequants[i] = _Dequant(ctypes.sizeof(_Dequant), self._map.data_ptr(), self.n_tokens,
                                   self.heads, self._out[layer].data_ptr(), None)
        _kernels_check(lib, lib.engram_gpu_queue_gather_dequant(self._queue, requests, dequants,
                                                                len(self.layers),
                                                                self.piece_rows, s),
                       "engram_gpu_queue_gather_dequant")

    def output(self, layer: int) -> Any:
        """The static bf16 [tokens, heads, 256] output of ``layer``, filled by each run()."""
        return self._out[layer]

    @property
    def error(self) -> int:
        """0 while every step so far succeeded; else the status code (engram_status_code) of
        the first failure: 4 the daemon did not answer in time, 14 it stopped, or the
        request's own code. Sticky: the queue submits nothing until clear_error()."""
        return int(self._error_word[0])

    def clear_error(self) -> None:
        """Resets the error word (after a request's own failure, e.g. a bad token id)."""
        self._error_word[0] = 0

    @property
    def hash_errors(self) -> int:
        """Token ids the GPU hasher found out of range since the step was built (synchronises)."""
        return int(self._hash_errors.item())

    def close(self) -> None:
        """Frees the queue, the GPU hasher, the registration and the session. No queued step
        may still run (synchronise first). Idempotent."""
        lib = self._lib
        queue, self._queue = getattr(self, "_queue", None), None
        if queue:
            lib.engram_gpu_queue_destroy(queue)
        gpu_hasher, self._gpu_hasher = getattr(self, "_gpu_hasher", None), None
        if gpu_hasher:
            lib.engram_gpu_hasher_destroy(gpu_hasher)
        reg = getattr(self, "_reg", None)
        if reg is not None:
            reg.unregister()
        for buffers in (getattr(self, "_ids", {}), getattr(self, "_rows", {})):
            for b in buffers.values():
                b.free()
        client = getattr(self, "_client", None)
        if client is not None:
            client.close()

    def __enter__(self) -> "GpuDecodeStep":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
