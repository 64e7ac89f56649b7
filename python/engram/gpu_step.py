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

With speculative decoding (``draft_per_seq=k``) the step can instead be queued in two phases,
each group's rows requested as soon as its tokens exist: ``submit_accepted()`` at the step's
start, ``submit_draft()`` right after the draft model wrote its tokens, ``finish()`` before
the first Engram layer (side streams forked and joined with events; docs/python.md).

Tables engramd holds in memory are read in place (``in_place``, the default): after the GPU
hash, a resident table's rows are dequantised straight from its registered read-only mapping
(engram_dequant_gather: no request at all), and a cache-tier table's hits straight from the
registered row cache, its misses requested through the same device-submit ring and awaited in
the same stream (engram_gpu_queue_cache_gather). Only storage-tier tables take the arena path
above. The bytes are the same either way. After a step, ``report_hits()`` (host side, outside
the graph) hands the row cache's hits to its eviction policy.

docs/gpu.md ("Requests from the GPU") describes the protocol and the recovery; docs/python.md
the in-place routes.
"""

import ctypes
import errno
import os
import warnings
from typing import Any, Dict, Optional, Sequence

from . import _lib
from ._gpu import (ROUTE_ARENA, ROUTE_RESIDENT, ROUTE_ROW_CACHE, CacheBuffers, GpuTables,
                   Kernels, Registration, _kernels_check)
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


def _step_lib(kernels: Kernels) -> Any:
    """The kernel library with the GPU hasher and queue calls declared."""
    _lib._declare(kernels._lib, _STEP_FUNCTIONS, kernels.path)
    return kernels._lib


# What error reports for a mapped table that may no longer be read (engram_table_map_check).
_STALE_STATUS = {errno.ESTALE: 15, errno.ENOTCONN: 14}  # DATA_LOSS, UNAVAILABLE


class _Lane:
    """One device-submit session and its GPU queue, with row-id and row buffers in its arena
    for each (group, layer) it serves. A queue publishes one call at a time (its tickets and
    status slots are per queue), so work that must be in flight at once needs lanes of its own."""

    def __init__(self, lib: Any, socket: Optional[str], timeout: float,
                 groups: Sequence[tuple]):
        self._lib = lib
        self.queue, self.reg, self.ids, self.rows = None, None, {}, {}
        rows = sum(n for _, layers, n in groups for _ in layers)
        self.client = Client(socket, data_bytes=max(1 << 20, 2 * rows * (8 + _lib.row_bytes())),
                             slots=32, device_submit=True)
        try:
            self._open(groups, timeout)
        except BaseException:
            self.close()
            raise

    def _open(self, groups: Sequence[tuple], timeout: float) -> None:
        lib = self._lib
        base, size = self.client.arena()
        self.reg = Registration(base, size)
        self.ids = {(g, layer): self.client.alloc(n * 8) for g, layers, n in groups
                    for layer in layers}
        self.rows = {(g, layer): self.client.alloc(n * _lib.row_bytes()) for g, layers, n in groups
                     for layer in layers}
        options = _QueueOptions(ctypes.sizeof(_QueueOptions), int(timeout * 1e9))
        self.queue = ctypes.c_void_p()
        _kernels_check(lib, lib.engram_gpu_queue_create(self.client._session(), self.reg._handle,
                                                        ctypes.byref(options),
                                                        ctypes.byref(self.queue)),
                       "engram_gpu_queue_create")
        self.error_word = lib.engram_gpu_queue_error(self.queue)

    def close(self) -> None:
        queue, self.queue = self.queue, None
        if queue:
            self._lib.engram_gpu_queue_destroy(queue)
        if self.reg is not None:
            self.reg.unregister()
        for buffers in (self.ids, self.rows):
            for b in buffers.values():
                b.free()
        self.client.close()


class GpuDecodeStep:
    """One captured-graph-ready decode step: ``seqs`` sequences of ``tokens_per_seq`` new
    tokens each (1 + speculative tokens), the heads of TP rank ``tp_rank`` of ``tp_size``, for
    every layer in ``layers``. The session connects with the device-submit flag, so its ring
    belongs to the GPU; ``timeout`` bounds how long a step waits for the daemon. Each layer's
    rows go out in pieces of ``piece_rows`` (a multiple of 16; 0: the library's default), which
    the daemon gathers side by side and the GPU dequantises as they land.

    ``draft_per_seq`` (k, 0 < k < tokens_per_seq) enables the two-phase step for speculative
    decoding: each sequence's tokens are its ``tokens_per_seq - k`` accepted tokens, then its k
    draft tokens, and ``submit_accepted()``, ``submit_draft()`` and ``finish()`` fetch the two
    groups' rows at the points of the step where each group is known. The draft group has a
    session (and queue) of its own, so that both groups' requests are in flight at once.

    ``in_place`` (default: True unless the environment sets ENGRAM_IN_PLACE=0): each layer whose
    table engramd holds in memory is read in place by the GPU (``routes[layer]`` is "resident"
    or "row cache"; "arena" for the rest). A table that cannot be read in place (the storage
    tier; or, with one RuntimeWarning naming the layers and why, a mapping or registration
    refused, a table still loading or withdrawn) takes the arena path. False: every layer takes
    the arena path."""

    def __init__(self, hasher: Any, layers: Sequence[int], seqs: int, tokens_per_seq: int, *,
                 tp_size: int = 1, tp_rank: int = 0, socket: Optional[str] = None,
                 timeout: float = 2.0, piece_rows: int = 0, draft_per_seq: int = 0,
                 in_place: Optional[bool] = None):
        import torch

        if not 0 <= draft_per_seq < tokens_per_seq:
            raise ValueError(f"draft_per_seq {draft_per_seq}: must be in [0, tokens_per_seq "
                             f"{tokens_per_seq}) (each sequence keeps an accepted token)")
        self._kernels = Kernels("cuda")
        lib = _step_lib(self._kernels)
        self._lib = lib
        self.layers = list(layers)
        self.piece_rows = piece_rows
        self.head_begin, self.head_end = hasher.rank_heads(tp_size, tp_rank)
        self.heads = self.head_end - self.head_begin
        self.n_tokens = seqs * tokens_per_seq
        self.n_seqs = seqs
        self.tokens_per_seq = tokens_per_seq
        self.draft_per_seq = draft_per_seq
        self.accepted_per_seq = tokens_per_seq - draft_per_seq
        dev = torch.device("cuda", torch.cuda.current_device())
        self._dev = dev
        self.tokens = torch.zeros(self.n_tokens, dtype=torch.int32, device=dev)
        self.history = torch.full((seqs, HISTORY), -1, dtype=torch.int32, device=dev)
        self._out = {layer: torch.empty((self.n_tokens, self.heads, 256), dtype=torch.bfloat16,
                                        device=dev) for layer in self.layers}
        self._hash_errors = torch.zeros(1, dtype=torch.int32, device=dev)
        if in_place is None:
            in_place = os.environ.get("ENGRAM_IN_PLACE", "1") in ("", "1")
        self.in_place = bool(in_place)
        self.routes: Dict[int, str] = {layer: ROUTE_ARENA for layer in self.layers}
        self._tables = None
        self._read_in_place: Dict[str, set] = {}
        self._lanes = []
        self._gpu_hasher = ctypes.c_void_p()
        try:
            self._open(hasher, socket, timeout)
        except BaseException:
            self.close()
            raise

    def _open(self, hasher: Any, socket: Optional[str], timeout: float) -> None:
        import torch

        lib, seqs = self._lib, self.n_seqs
        a, k = self.accepted_per_seq, self.draft_per_seq
        # Groups of tokens whose rows one call fetches: (name, layers, rows per layer).
        full = ("step", self.layers, self.n_tokens * self.heads)
        self._groups = {"step": self._group(self.tokens, self.history, self.tokens_per_seq,
                                            self._out)}
        if k == 0:
            self._lanes.append(_Lane(lib, socket, timeout, [full]))
        else:
            self._groups["accepted"] = self._group(
                torch.zeros(seqs * a, dtype=torch.int32, device=self._dev), self.history, a)
            self._groups["draft"] = self._group(
                torch.zeros(seqs * k, dtype=torch.int32, device=self._dev),
                torch.full((seqs, HISTORY), -1, dtype=torch.int32, device=self._dev), k)
            # The draft's n-gram context: the history, then the accepted tokens.
            self._draft_context = torch.full((seqs, HISTORY + a), -1, dtype=torch.int32,
                                             device=self._dev)
            self._lanes.append(_Lane(lib, socket, timeout,
                                     [full, ("accepted", self.layers, seqs * a * self.heads)]))
            self._lanes.append(_Lane(lib, socket, timeout,
                                     [("draft", self.layers, seqs * k * self.heads)]))
            self._streams = {"accepted": torch.cuda.Stream(self._dev),
                             "draft": torch.cuda.Stream(self._dev)}
            self._forks = {g: torch.cuda.Event() for g in self._streams}
            self._joins = {g: torch.cuda.Event() for g in self._streams}
            self._pending = set()
        self._groups["step"]["lane"] = self._lanes[0]
        if k:
            self._groups["accepted"]["lane"] = self._lanes[0]
            self._groups["draft"]["lane"] = self._lanes[1]
        _kernels_check(lib, lib.engram_gpu_hasher_create(hasher._h(),
                                                         ctypes.byref(self._gpu_hasher)),
                       "engram_gpu_hasher_create")
        if self.in_place:
            self._open_in_place()

    def _open_in_place(self) -> None:
        """Maps and registers the tables read in place, and each group's device buffers for
        them: the row ids the GPU hash writes, and for a row cache the misses' list (row ids
        and their rows in the group's lane arena, where the daemon reads and writes them)."""
        import torch

        self._tables = GpuTables(self._lanes[0].client, self.layers, self._kernels.in_place)
        self.routes.update(self._tables.routes)
        if self._tables.warning:
            warnings.warn(self._tables.warning, RuntimeWarning, stacklevel=3)
        for name, group in self._groups.items():
            lane, slots = group["lane"], group["n"] * self.heads
            group["ids_d"], group["cache"] = {}, {}
            for layer in self.layers:
                if self.routes[layer] == ROUTE_ARENA:
                    continue
                group["ids_d"][layer] = torch.empty(slots, dtype=torch.int64, device=self._dev)
                if self.routes[layer] == ROUTE_ROW_CACHE:
                    group["cache"][layer] = CacheBuffers(
                        torch, self._dev, slots, lane.reg.device_ptr(lane.ids[name, layer].address),
                        lane.reg.device_ptr(lane.rows[name, layer].address))

    def _group(self, tokens: Any, history: Any, per_seq: int, out: Optional[dict] = None) -> dict:
        """The static buffers of one group of tokens: per_seq a sequence, back to back; its
        rows are dequantised into out (default: outputs of its own)."""
        import torch

        n = tokens.numel()
        out = out if out is not None else {
            layer: torch.empty((n, self.heads, 256), dtype=torch.bfloat16, device=self._dev)
            for layer in self.layers}
        return {"tokens": tokens, "history": history, "n": n,
                "starts": torch.arange(0, n + 1, per_seq, dtype=torch.int32, device=self._dev),
                "map": torch.arange(n * self.heads, dtype=torch.int32, device=self._dev),
                "out": out}

    def _current_routes(self) -> Dict[int, str]:
        """The routes a step queued now takes: a layer whose mapped table may no longer be read
        (withdrawn, daemon gone) goes through the arena from now on, with one warning."""
        if self._tables is not None:
            stale = {layer: rc for layer, rc in self._tables.stale().items()
                     if self.routes[layer] != ROUTE_ARENA}
            if stale:
                for layer in stale:
                    self.routes[layer] = ROUTE_ARENA
                warnings.warn(
                    "engram: the mapped table(s) of layer(s) " + ", ".join(
                        f"{layer} ({errno.errorcode.get(-rc, rc)})"
                        for layer, rc in sorted(stale.items())) +
                    " may no longer be read in place; steps queued from now on gather them "
                    "through engramd (a graph captured before reads the withdrawn rows: "
                    "capture it again)", RuntimeWarning, stacklevel=4)
        return dict(self.routes)

    def _fetch(self, name: str, stream: Any) -> None:
        """Queues on stream: the GPU hash of group name's tokens, then each layer's rows:
        resident tables and row cache hits read in place, the rest (and the misses) requested
        through the group's lane, awaited and dequantised."""
        s = stream.cuda_stream
        lib, group = self._lib, self._groups[name]
        lane = group["lane"]
        routes = self._current_routes()
        self._read_in_place[name] = {layer for layer in self.layers
                                     if routes[layer] != ROUTE_ARENA}
        ids_d = group.get("ids_d", {})

        def rows_for(layer):
            if routes[layer] != ROUTE_ARENA:
                return ids_d[layer].data_ptr()
            return lane.reg.device_ptr(lane.ids[name, layer].address)

        hash_args = [
            _HashArgs(ctypes.sizeof(_HashArgs), layer, 0, self.head_begin, self.head_end,
                      group["tokens"].data_ptr(), group["n"], self.n_seqs,
                      group["starts"].data_ptr(), group["history"].data_ptr(),
                      rows_for(layer), self._hash_errors.data_ptr()) for layer in self.layers]
        # Every layer's ids in as few launches as the library takes calls.
        for first in range(0, len(hash_args), _HASH_MAX_CALLS):
            chunk = hash_args[first:first + _HASH_MAX_CALLS]
            pointers = (ctypes.POINTER(_HashArgs) * len(chunk))(*[ctypes.pointer(a) for a in chunk])
            _kernels_check(lib, lib.engram_gpu_hash_layers(self._gpu_hasher, pointers,
                                                           len(chunk), s),
                           "engram_gpu_hash_layers")
        n, heads = group["n"], self.heads
        # Resident tables first (no request, a few microseconds), then the row caches (their
        # misses through the queue), then the arena's layers, whose kernel waits for the daemon.
        for layer in self.layers:
            if routes[layer] == ROUTE_RESIDENT:
                table = self._tables.maps[layer]
                self._kernels.dequant_gather(table.table_d, table.covered_begin,
                                             table.covered_end - table.covered_begin,
                                             ids_d[layer].data_ptr(), n, heads,
                                             group["out"][layer].data_ptr(), None, s)
        for layer in self.layers:
            if routes[layer] == ROUTE_ROW_CACHE:
                buffers = group["cache"][layer]
                self._kernels.queue_cache_gather(lane.queue, self._tables.maps[layer].cache,
                                                 ids_d[layer].data_ptr(), n, heads,
                                                 group["out"][layer].data_ptr(), buffers.misses,
                                                 buffers.miss_dest_d, s)
                buffers.used = True
        arena = [layer for layer in self.layers if routes[layer] == ROUTE_ARENA]
        if not arena:
            return
        requests = (_Request * len(arena))()
        dequants = (_Dequant * len(arena))()
        for i, layer in enumerate(arena):
            requests[i] = _Request(ctypes.sizeof(_Request), layer, 0,
                                   lane.ids[name, layer].address, n * heads,
                                   lane.rows[name, layer].address)
            dequants[i] = _Dequant(ctypes.sizeof(_Dequant), group["map"].data_ptr(), n,
                                   heads, group["out"][layer].data_ptr(), None)
        _kernels_check(lib, lib.engram_gpu_queue_gather_dequant(lane.queue, requests, dequants,
                                                                len(arena), self.piece_rows, s),
                       "engram_gpu_queue_gather_dequant")

    def run(self, stream: Any = None) -> None:
        """Queues the step on ``stream`` (default: torch's current stream): hash, then submit,
        wait and dequantise, pipelined. Capturable; reads ``tokens`` and ``history`` when it
        runs."""
        import torch

        self._fetch("step", stream or torch.cuda.current_stream())

    def _fork(self, name: str, stream: Any) -> Any:
        """The side stream of group name, made to wait for the work queued so far on stream."""
        if self.draft_per_seq == 0:
            raise RuntimeError("the two-phase step needs draft_per_seq > 0 at construction")
        if name in self._pending:
            raise RuntimeError(f"submit_{name}() called twice before finish()")
        self._pending.add(name)
        self._forks[name].record(stream)
        side = self._streams[name]
        side.wait_event(self._forks[name])
        return side

    def submit_accepted(self, stream: Any = None) -> None:
        """Phase 1, at the start of the step (the accepted tokens and ``history`` written):
        forks a side stream from ``stream`` (default: the current stream) that copies each
        sequence's accepted tokens out of ``tokens``, hashes them and publishes, awaits and
        dequantises their rows. Nothing waits on ``stream``: the draft model's work queued
        after this call runs while the rows are fetched. Capturable."""
        import torch

        stream = stream or torch.cuda.current_stream()
        side = self._fork("accepted", stream)
        a, group = self.accepted_per_seq, self._groups["accepted"]
        with torch.cuda.stream(side):
            group["tokens"].view(self.n_seqs, a).copy_(
                self.tokens.view(self.n_seqs, self.tokens_per_seq)[:, :a])
            self._fetch("accepted", side)
            self._joins["accepted"].record(side)

    def submit_draft(self, stream: Any = None) -> None:
        """Phase 2, queued right after the draft model wrote the draft tokens into ``tokens``
        on ``stream``: forks a second side stream that copies the draft tokens and their n-gram
        context (the history, then the accepted tokens), hashes them and publishes, awaits and
        dequantises their rows. Nothing waits on ``stream``. Capturable."""
        import torch

        stream = stream or torch.cuda.current_stream()
        side = self._fork("draft", stream)
        a, seqs, group = self.accepted_per_seq, self.n_seqs, self._groups["draft"]
        step_tokens = self.tokens.view(seqs, self.tokens_per_seq)
        with torch.cuda.stream(side):
            self._draft_context[:, :HISTORY].copy_(self.history)
            self._draft_context[:, HISTORY:].copy_(step_tokens[:, :a])
            group["history"].copy_(self._draft_context[:, a:])
            group["tokens"].view(seqs, self.draft_per_seq).copy_(step_tokens[:, a:])
            self._fetch("draft", side)
            self._joins["draft"].record(side)

    def finish(self, stream: Any = None) -> None:
        """Phase 3, before the first Engram layer: makes ``stream`` wait for both side streams
        and copies both groups' rows into ``output(layer)`` in token order. Both submit calls
        must have been queued (a capture must end with this call, which joins the side
        streams back). Capturable."""
        import torch

        if self.draft_per_seq == 0:
            raise RuntimeError("the two-phase step needs draft_per_seq > 0 at construction")
        if self._pending != {"accepted", "draft"}:
            raise RuntimeError("finish() needs submit_accepted() and submit_draft() first")
        self._pending.clear()
        stream = stream or torch.cuda.current_stream()
        seqs, a = self.n_seqs, self.accepted_per_seq
        for name in ("accepted", "draft"):
            stream.wait_event(self._joins[name])
        with torch.cuda.stream(stream):
            for layer in self.layers:
                out = self._out[layer].view(seqs, self.tokens_per_seq, self.heads, 256)
                out[:, :a].copy_(self._groups["accepted"]["out"][layer].view(
                    seqs, a, self.heads, 256))
                out[:, a:].copy_(self._groups["draft"]["out"][layer].view(
                    seqs, self.draft_per_seq, self.heads, 256))

    def output(self, layer: int) -> Any:
        """The static bf16 [tokens, heads, 256] output of ``layer``, filled by each run()."""
        return self._out[layer]

    @property
    def error(self) -> int:
        """0 while every step so far succeeded; else the status code (engram_status_code) of
        the first failure: 4 the daemon did not answer in time, 14 it stopped, or the
        request's own code. Sticky: the queue submits nothing until clear_error(). A table read
        in place that engramd withdrew since (a file of it changed, or it is stopping) gives 15
        (DATA_LOSS), one whose daemon is gone 14: that step's rows of the layer may not be used
        (build a new GpuDecodeStep, or queue/capture the step again: it then takes the arena
        path for that layer)."""
        for lane in self._lanes:
            if lane.error_word[0] != 0:
                return int(lane.error_word[0])
        if self._tables is not None:
            # The layers the latest queued (or captured) step of some group read in place.
            read = set().union(*self._read_in_place.values())
            for layer, rc in sorted(self._tables.stale().items()):
                if layer in read:
                    return _STALE_STATUS.get(-rc, 13)
        return 0

    def report_hits(self) -> Dict[int, int]:
        """Hands the row cache hits of the steps run since the last call to the cache's eviction
        policy (engram_table_map_report_hits): the rows read in place are added to the table's
        statistics, and the hits of the latest step of each group count as uses of their slots.
        Call it on the host, outside the graph, once the step's work has finished (after the
        sampled tokens were read back, or after a synchronise): it copies small device counters
        back. Every step, or every few: the row counts lose nothing, only the slot uses of the
        steps in between are not seen. Returns {layer: hit rows reported}; {} when no layer is
        read from a row cache."""
        reported: Dict[int, int] = {}
        for group in self._groups.values():
            for layer, buffers in group.get("cache", {}).items():
                if buffers.used:
                    rows = buffers.report(self._tables.maps[layer])
                    reported[layer] = reported.get(layer, 0) + rows
        return reported

    def clear_error(self) -> None:
        """Resets the error words (after a request's own failure, e.g. a bad token id)."""
        for lane in self._lanes:
            lane.error_word[0] = 0

    @property
    def hash_errors(self) -> int:
        """Token ids the GPU hasher found out of range since the step was built (synchronises)."""
        return int(self._hash_errors.item())

    def close(self) -> None:
        """Frees the queue, the GPU hasher, the registrations, the table maps and the sessions.
        No queued step may still run (synchronise first). Idempotent."""
        tables, self._tables = getattr(self, "_tables", None), None
        if tables is not None:
            tables.close()
        lanes, self._lanes = getattr(self, "_lanes", []), []
        for lane in lanes:
            lane.close()
        gpu_hasher, self._gpu_hasher = getattr(self, "_gpu_hasher", None), None
        if gpu_hasher:
            self._lib.engram_gpu_hasher_destroy(gpu_hasher)

    def __enter__(self) -> "GpuDecodeStep":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
