"""EngramLookup: what an inference engine's Engram layers call, once per forward step.

    lookup = engram.EngramLookup(layers=[1, 14], heads=24, max_tokens=512)   # once
    lookup.admit_tokens(7, hasher, prompt)  # the engine admits request 7: engramd reads its
    ...                                     # prompt's rows into its row cache and pins them
    lookup.prepare({1: ids_1, 14: ids_14})  # forward entry: every layer's rows gathered
    # or, from token ids: lookup.prepare_tokens(hasher, new_ids, history=last_ids)
    # chunked prefill: ..., next_tokens=next_chunk, next_history=chunk[-3:] (read meanwhile)
    ...
    emb = lookup.get(14)                    # in layer 14: bf16 [tokens, heads, 256]
    emb = lookup.embeddings(14, input_ids)  # the same through torch.ops.engram.gather_wait,
                                            # which torch.compile(fullgraph=True) traces
    lookup.admit_done(7)                    # after request 7's prefill, or when cancelled

ids_L are the step's row ids of layer L, shape [tokens, heads] (integers on the CPU; a negative
id marks a padding slot, which reads as zeros). By default prepare() copies the rows of
resident and cache-tier tables itself (in place) and has the daemon gather the rest before it
returns; with in_place=False it returns as soon as the requests are submitted. On a GPU, get() queues on the current CUDA stream a wait for the daemon's
completion counter followed by the dequantise-and-scatter kernel, which reads the rows straight
from the arena (registered host memory): the host never waits, and the two launches can be
captured into a CUDA graph and replayed, each replay using the rows of the latest prepare().
Without a GPU (device="cpu"), get() waits on the host and dequantises in PyTorch, with
bit-identical results.

Step protocol (the rows of a step live at fixed arena addresses until the next prepare()):
  - prepare(step k + 1) first waits, on the host, for the daemon to finish step k's requests
    (normally long done) and raises their errors; then it overwrites step k's rows.
  - So step k's GPU work must be finished before prepare(step k + 1) is called. Eagerly, this
    class makes sure of it (a CUDA event after each get(), waited on by the next prepare());
    with CUDA graphs the engine guarantees it by reading the sampled tokens back before
    preparing the next step, as engines do.
  - Under graph capture the token count of the captured step is baked into the graph: replay
    only with steps of that many tokens (pad with -1 ids).
"""

import ctypes
import errno
import os
import time
import warnings
from typing import Any, Dict, Optional, Sequence, Union

import numpy as np
import torch

from ._arrays import step_row_ids
from .client import _layer_alias, ArenaBuffer, Client, TableInfo, row_bytes
from .dequant import ROW_VALUES, dequantize_scatter
from .errors import (EngramError, EngramTimeoutError, GpuUnavailableError,
                     InvalidArgumentError, ResourceExhaustedError, UnknownTableError, error_for)

# ENGRAM_ARENA_ALIGN: engram_alloc rounds each allocation up to it. A protocol constant, not the
# page size: it is 4096 on every kernel.
_ARENA_ALIGN = 4096
# ENGRAM_PREFETCH_MAX_ROWS (engram/protocol.h): the ids of a prefetch or admission are copied
# into the data region this many at a time (the hints' session is sized for it).
_PREFETCH_MAX_ROWS = 8192
_INT32_MAX = 2**31 - 1
# engram_status_code -> errno, for a failure the GPU queue recorded.
_STATUS_ERRNO = {3: errno.EINVAL, 4: errno.ETIMEDOUT, 5: errno.ENOENT, 8: errno.ENOSPC,
                 11: errno.ERANGE, 14: errno.ENOTCONN, 15: errno.EIO}


def _round_up(n, to):
    return (n + to - 1) // to * to


class _Layer:
    """One Engram layer's buffers in the arena and (on a GPU) its output on the device."""

    def __init__(self, layer_id: int, info: TableInfo, capacity: int, buffer: ArenaBuffer):
        self.layer_id = layer_id
        self.info = info
        self.capacity = capacity
        self.buffer = buffer  # rows [capacity, 264], then ids (uint64), then the index map
        self.ids_offset = capacity * row_bytes()
        self.map_offset = self.ids_offset + capacity * 8
        self.rows_address = buffer.address
        self.map_address = buffer.address + self.map_offset
        self.ids = buffer.numpy(np.uint64, capacity, self.ids_offset)
        self.index_map = buffer.numpy(np.int32, capacity, self.map_offset)
        self.index_map[:] = -1
        self.map_high_water = 0  # index_map entries beyond the step's slots are kept at -1
        self.tokens = None  # of the prepared step
        self.num_rows = 0
        self.ticket = None  # engram ticket of the step's request, until waited for
        self.cpu_result = None
        self.out = None  # device output [max_tokens, heads, 256] bf16
        self.step_counter = None  # device uint32 for engram_stream_wait_ticket
        self.table = None  # on a GPU reading the table in place: its _gpu.GpuTableMap
        self.cache = None  # ... from a row cache: the misses' buffers (_gpu.CacheBuffers)
        self.gpu_in_place = False  # the step's rows are read from table, not the arena
        self.captured_in_place = False  # a captured get() reads table


class EngramLookup:
    """Gathers every Engram layer's rows of a step at forward entry; dequantises at the layer.

    Args:
        layers: Engram layer ids (table ids), e.g. [1, 14].
        heads: row ids per token per layer (24 for DeepSeek-V4.1; 6 per table on a TP4 rank).
        max_tokens: most tokens of one step (the arena and outputs are sized for it).
        device: "cpu", "cuda", "cuda:N" or a torch.device; None: the current CUDA device if
            torch sees one, else the CPU.
        socket, client_name, timeout: as for Client (the lookup owns its own session: its
            completion counter must count only its gathers; prefetches and admissions open a
            second one).
        in_place: True (the default): prepare() copies the rows of tables resident in engramd's
            memory itself, from read-only mappings of them, before it returns: no request, no
            wait on the daemon's threads, and a bad row raises from prepare() itself. A
            cache-tier table's cached rows are copied from a read-only mapping of the row
            cache, the rest asked of the daemon in one request; storage-tier tables are
            gathered by the daemon, also before prepare() returns. The host thread spends the
            copy's time (about 0.1 ms for a 2,304-row step). False: prepare() only submits
            every layer's request to the daemon and returns (the wait is the GPU's, or
            result()'s). The environment variable ENGRAM_IN_PLACE=0 makes False the
            default. On a GPU, with in_place, resident and cache-tier tables are not copied at
            all: get() dequantises a resident table's rows straight from its registered
            read-only mapping (the step's index map, written by prepare(), locates them), and
            a cache-tier table's hits from the registered row cache, its misses requested by
            the GPU through a device-submit session of the lookup's own (report_hits() feeds
            the cache's policy); prepare() makes no request for either. A table that cannot be
            read so (registration refused, mapping refused or withdrawn) is gathered as above,
            with one RuntimeWarning; `routes` says which layer takes which path.
    """

    def __init__(self, layers: Sequence[int], heads: int, max_tokens: int, *,
                 device: Union[str, torch.device, None] = None, socket: Optional[str] = None,
                 client_name: Optional[str] = None, timeout: Optional[float] = None,
                 in_place: Optional[bool] = None):
        layers = [int(layer) for layer in layers]
        if not layers or len(set(layers)) != len(layers):
            raise ValueError(f"layers must be distinct layer ids, got {layers}")
        if heads < 1 or max_tokens < 1:
            raise ValueError(f"heads ({heads}) and max_tokens ({max_tokens}) must be positive")
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) \
                if torch.cuda.is_available() else torch.device("cpu")
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise GpuUnavailableError(
                -errno.ENODEV, f"device {device} asked for, but torch {torch.__version__} sees no "
                               f"GPU; use device='cpu' (same values, dequantised on the host)")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be the CPU or a CUDA/ROCm device, got {device}")
        self.device = device
        self.heads = heads
        self.max_tokens = max_tokens
        self.layers = layers
        if in_place is None:
            in_place = os.environ.get("ENGRAM_IN_PLACE", "1") in ("", "1")
        self.in_place = bool(in_place)
        capacity = max_tokens * heads
        per_layer = _round_up(capacity * (row_bytes() + 8 + 4), _ARENA_ALIGN)
        data_bytes = per_layer * len(layers) + 2 * _ARENA_ALIGN
        self._client = Client(socket, data_bytes=data_bytes, slots=max(8, 2 * len(layers)),
                              client_name=client_name, timeout=timeout)
        self._closed = False
        self._registration = None
        self._tables = None
        self._miss_lane = None
        self._miss_timeout = timeout if timeout is not None else 2.0
        self._hints = None  # the session of prefetches and admissions (_hint_client)
        self._client_name, self._timeout = client_name, timeout
        self._event = None
        self._layers: Dict[int, _Layer] = {}
        self._target_buffer = None
        try:
            served = {t.layer: t for t in self._client.tables()}
            missing = [layer for layer in layers if layer not in served]
            if missing:
                raise error_for(-errno.ENOENT,
                                f"engramd at {self._client.socket} serves no table for layer(s) "
                                f"{missing} (it serves: {sorted(served) or 'none'})")
            for layer in layers:
                self._layers[layer] = _Layer(layer, served[layer], capacity,
                                             self._client.alloc(capacity * (row_bytes() + 12)))
            self._target_buffer = self._client.alloc(8)
            self._target = ctypes.c_uint64.from_address(self._target_buffer.address)
            counter_address = self._client.completion_counter_address()
            self._counter = ctypes.c_uint64.from_address(counter_address)
            # Only this object submits on the session: completions = base + requests submitted.
            self._submitted = self._counter.value
            self._target.value = self._submitted
            if device.type == "cuda":
                self._setup_gpu(counter_address)
        except BaseException:
            # Nothing outside this object views its buffers: end the session at once.
            if self._miss_lane is not None:
                self._miss_lane.close()
            if self._tables is not None:
                self._tables.close()
            if self._registration is not None:
                self._registration.unregister()
            self._free_buffers()
            self._client.close()
            raise
        from . import ops
        self.op_id = ops.register_lookup(self)  # names this lookup to torch.ops.engram

    def _setup_gpu(self, counter_address):
        from . import _gpu
        self._kernels = _gpu.Kernels()
        with torch.cuda.device(self.device):
            address, length = self._client.arena()
            self._registration = _gpu.Registration(address, length)
            reg = self._registration
            self._counter_d = reg.device_ptr(counter_address)
            self._target_d = reg.device_ptr(self._target_buffer.address)
            for layer in self._layers.values():
                layer.rows_d = reg.device_ptr(layer.rows_address)
                layer.map_d = reg.device_ptr(layer.map_address)
                layer.out = torch.empty((self.max_tokens, self.heads, ROW_VALUES),
                                        dtype=torch.bfloat16, device=self.device)
                layer.step_counter = torch.zeros(1, dtype=torch.int32, device=self.device)
            if self.in_place:
                self._open_gpu_tables()

    def _open_gpu_tables(self):
        """Maps and registers the tables get() reads in place on the GPU: resident ones, and
        row caches where the kernel library has engram_gpu_queue_cache_gather (their misses go
        through a device-submit session of the lookup's own)."""
        from . import _gpu
        # Resident tables take engram_dequant_scatter over the mapping: no newer kernel.
        self._tables = _gpu.GpuTables(self._client, self.layers,
                                      row_cache=self._kernels.in_place)
        refused = {}
        cached = []
        for layer_id, route in self._tables.routes.items():
            table = self._tables.maps.get(layer_id)
            layer = self._layers[layer_id]
            if route == _gpu.ROUTE_ROW_CACHE:
                layer.table_rows = table.covered_end - table.covered_begin
                cached.append(layer_id)
            elif route == _gpu.ROUTE_RESIDENT:
                rows = table.covered_end - table.covered_begin
                if rows > _INT32_MAX:
                    # The index map is int32: engram_dequant_scatter cannot name such a row.
                    refused[layer_id] = f"{rows} rows, more than an int32 index map names"
                    continue
                layer.table, layer.table_rows = table, rows
        if cached:
            try:
                self._open_miss_lane(cached)
            except EngramError as e:
                for layer_id in cached:
                    self._layers[layer_id].table = self._layers[layer_id].cache = None
                    refused[layer_id] = f"a device-submit session for its misses: {e.message}"
        warning = self._tables.warning
        if refused:
            warning = (warning + "; " if warning else "engram: ") + "; ".join(
                f"layer {layer}: not read in place on the GPU: {why}"
                for layer, why in sorted(refused.items()))
        if warning:
            warnings.warn(warning, RuntimeWarning, stacklevel=4)

    def _open_miss_lane(self, layer_ids):
        """The device-submit session, GPU queue and buffers the row caches' misses go through."""
        from ._gpu import CacheBuffers
        from .gpu_step import _Lane, _step_lib
        capacity = self.max_tokens * self.heads
        self._miss_lane = _Lane(_step_lib(self._kernels), self._client.socket,
                                self._miss_timeout, [("lookup", layer_ids, capacity)])
        lane = self._miss_lane
        for layer_id in layer_ids:
            layer = self._layers[layer_id]
            layer.table = self._tables.maps[layer_id]
            layer.cache = CacheBuffers(
                torch, self.device, capacity,
                lane.reg.device_ptr(lane.ids["lookup", layer_id].address),
                lane.reg.device_ptr(lane.rows["lookup", layer_id].address))
            layer.ids_d = self._registration.device_ptr(layer.buffer.address + layer.ids_offset)
            layer.pad_host = torch.zeros(capacity, dtype=torch.bool).pin_memory()
            layer.pad_d = torch.zeros(capacity, dtype=torch.bool, device=self.device)

    def report_hits(self) -> Dict[int, int]:
        """Hands the row cache hits get() read in place since the last call to the cache's
        policy, as GpuDecodeStep.report_hits does (engram_table_map_report_hits): on the host,
        after the step's GPU work finished, every step or every few. Returns
        {layer: hit rows reported}; {} when no layer is read from a row cache."""
        reported = {}
        for layer_id, layer in self._layers.items():
            if layer.cache is not None and layer.cache.used:
                reported[layer_id] = layer.cache.report(self._tables.maps[layer_id])
        return reported

    @property
    def routes(self) -> Dict[int, str]:
        """{layer: how get() reads its rows}: "resident" (straight from the table's registered
        mapping, on a GPU with in_place), "row cache" (the hits from the registered row cache,
        the misses requested by the GPU) or "arena" (gathered into the arena by prepare(), in
        place on the host or by engramd, or by the daemon alone with in_place=False)."""
        return {layer_id: "arena" if layer.table is None else
                "row cache" if layer.cache is not None else "resident"
                for layer_id, layer in self._layers.items()}

    # ---- the step --------------------------------------------------------------------------

    def prepare(self, row_ids: Union[Dict[int, Any], Sequence[Any]],
                timeout: Optional[float] = None, *,
                next_row_ids: Union[Dict[int, Any], Sequence[Any], None] = None) -> None:
        """Submits the step's gathers, one request per layer, and returns without waiting.

        row_ids: {layer_id: ids} or a sequence in the order of `layers`; ids of shape
        [tokens, heads] (CPU tensor, NumPy array or nested lists of integers; -1 = padding).
        next_row_ids: the next chunk's row ids (chunked prefill), as for prefetch() and checked
        the same way before anything is submitted; handed to engramd as a prefetch hint once
        this step's gathers are (its misses first), dropped where it has no room for them.
        Raises ValueError for a bad shape or a row outside the table (naming layer, token and
        head), UnknownTableError for ids of a layer this lookup does not serve,
        InvalidArgumentError when a layer of the lookup has none (all of them EngramError and
        ValueError), and the daemon's errors of the previous step (see the module's notes)."""
        self._check_open()
        row_ids = self._by_layer(row_ids)
        if sorted(row_ids) != sorted(self.layers):
            raise InvalidArgumentError(
                -errno.EINVAL, f"row ids given for layers {sorted(row_ids)}, expected "
                               f"{sorted(self.layers)}")
        steps = {layer: self._validate(layer, ids) for layer, ids in row_ids.items()}
        upcoming = None if next_row_ids is None else self._checked_hint(next_row_ids)
        self._finish_step(timeout)
        self._check_gpu_tables()
        for layer_id in self.layers:
            self._stage(self._layers[layer_id], *steps[layer_id])
        try:
            for layer_id in self.layers:
                layer = self._layers[layer_id]
                layer.cpu_result = None
                if layer.num_rows == 0 or layer.gpu_in_place:
                    continue
                if self.in_place:
                    self._gather_now(layer, timeout)
                    continue
                layer.ticket = self._client.submit_in_arena(
                    layer_id, layer.buffer, layer.num_rows, layer.buffer,
                    ids_offset=layer.ids_offset)
                self._submitted += 1
        finally:
            # The GPU waits until every request of the step completed: requests may complete
            # in any order, so only the step's total is a safe value to wait for.
            self._target.value = self._submitted
        if upcoming is not None:
            # Only now: this step's misses reach engramd first (the hints' session was opened
            # before anything was submitted). The step stands whatever becomes of the hint.
            self._hint(upcoming, drop_refused=True)

    def _gather_now(self, layer, timeout):
        """The layer's rows, in place or through the daemon, before returning."""
        # Only this object submits on the session and every earlier request has completed, so
        # a request this gather makes (at most one) is the counter's next completion.
        before = self._counter.value
        try:
            self._client.gather_in_arena(layer.layer_id, layer.buffer, layer.num_rows,
                                         layer.buffer, ids_offset=layer.ids_offset,
                                         in_place=True, timeout=timeout)
        except EngramTimeoutError as e:
            # The request stays in flight: the next prepare() waits for it before it
            # overwrites the buffers, and the GPU waits count it.
            self._submitted = before + 1
            raise type(e)(e.code, f"layer {layer.layer_id}: {e.message}") from None
        except EngramError as e:
            self._submitted = self._counter.value
            raise type(e)(e.code, f"layer {layer.layer_id}: {e.message}") from None
        self._submitted = self._counter.value

    def prepare_tokens(self, hasher: Any, tokens: Any, history: Any = None, *,
                       tp_size: Optional[int] = None, tp_rank: Optional[int] = None,
                       heads: Any = None, compressed: bool = False,
                       timeout: Optional[float] = None, next_tokens: Any = None,
                       next_history: Any = None) -> None:
        """prepare() with the step's row ids hashed on the host from its token ids.

        hasher: an engram.Hasher of the served model. tokens, history, compressed: as for
        Hasher.hash (one sequence, or a list of sequences whose positions run in order, each
        with the ids right before its new tokens). tp_size/tp_rank or heads pick the heads,
        which must number `heads` of this lookup. Every layer of the lookup is hashed with its
        own multipliers and primes; the token count is the step's total positions.
        next_tokens, next_history: the next chunk's token ids and the ids right before them
        (as tokens and history; the next chunk of one sequence has this chunk's last ids),
        hashed alike and passed to prepare() as next_row_ids.
        Raises as Hasher.hash and prepare() do."""
        self._check_open()
        step = self._hash_tokens(hasher, tokens, history, tp_size, tp_rank, heads, compressed)
        upcoming = None if next_tokens is None else self._hash_tokens(
            hasher, next_tokens, next_history, tp_size, tp_rank, heads, compressed)
        self.prepare(step, timeout, next_row_ids=upcoming)

    def prefetch(self, row_ids: Union[Dict[int, Any], Sequence[Any]]) -> int:
        """Hands engramd the row ids of a step that will probably come (the draft tokens of
        speculative decoding, the next prefill chunk) so that it brings them into memory in the
        background (Client.prefetch); returns without waiting for any I/O, with the rows queued.

        row_ids as for prepare() ({layer_id: ids} or one array per layer, [tokens, heads],
        -1 = padding), checked the same way (ValueError naming layer, token and head for a row
        outside the table). Does not touch the step in flight."""
        self._check_open()
        return self._hint(self._checked_hint(row_ids))

    def _checked_hint(self, row_ids):
        """{layer: rows} of a prefetch, checked as a step's ids are; opens the hints' session."""
        row_ids = self._by_layer(row_ids)
        checked = {layer: self._validate(layer, ids)[2] for layer, ids in row_ids.items()}
        self._hint_client()
        return checked

    def _hint(self, rows, drop_refused=False):
        """Hands {layer: rows} to engramd's prefetch, in that order; the rows queued.
        drop_refused: rows past the session's bound (ResourceExhaustedError) are dropped."""
        queued = 0
        for layer, layer_rows in rows.items():
            try:
                queued += self._hints.prefetch(layer, layer_rows)
            except ResourceExhaustedError:
                if not drop_refused:
                    raise
        return queued

    def prefetch_tokens(self, hasher: Any, tokens: Any, history: Any = None, *,
                        tp_size: Optional[int] = None, tp_rank: Optional[int] = None,
                        heads: Any = None, compressed: bool = False) -> int:
        """prefetch() with the row ids hashed on the host from token ids that will probably
        come (draft tokens with the sequence's last ids as history); arguments as for
        prepare_tokens()."""
        self._check_open()
        return self.prefetch(self._hash_tokens(hasher, tokens, history, tp_size, tp_rank, heads,
                                               compressed))

    def admit(self, request_id: int, row_ids: Union[Dict[int, Any], Sequence[Any]], *,
              ttl: Optional[float] = None) -> int:
        """When the engine admits request `request_id`: hands engramd the row ids its prefill
        will gather, so that it reads them into its row cache while the request waits and pins
        them there until admit_done(request_id), `ttl` seconds (None: the daemon's
        memory.admit_ttl_ms) or close() (Client.admit, once per layer, each row once).

        row_ids as for prefetch(), of the whole prompt (any length). Returns the rows queued,
        never after I/O. Raises as prefetch() does, and ResourceExhaustedError past the
        daemon's bounds on pins (admit_done(request_id) releases what it reserved before)."""
        self._check_open()
        row_ids = self._by_layer(row_ids)
        checked = {layer: self._validate(layer, ids, any_tokens=True)[2]
                   for layer, ids in row_ids.items()}
        hints = self._hint_client()
        return sum(hints.admit(request_id, layer, np.unique(rows), ttl=ttl)
                   for layer, rows in checked.items() if rows.size)

    def admit_tokens(self, request_id: int, hasher: Any, tokens: Any, history: Any = None, *,
                     tp_size: Optional[int] = None, tp_rank: Optional[int] = None,
                     heads: Any = None, compressed: bool = False,
                     ttl: Optional[float] = None) -> int:
        """admit() with the prompt's row ids hashed on the host from its token ids, as
        prepare_tokens() hashes the prefill's (the same hasher and head selection: the rows
        admitted are the rows the prefill's steps gather); arguments as for prepare_tokens()."""
        self._check_open()
        return self.admit(request_id, self._hash_tokens(hasher, tokens, history, tp_size,
                                                        tp_rank, heads, compressed), ttl=ttl)

    def admit_done(self, request_id: int) -> bool:
        """Request `request_id` is done with its admitted rows: call it once its prefill's last
        step has read them (the step's forward finished), or when the request is cancelled.
        engramd unpins them (Client.admit_done); unpinning early costs hits, never values.
        True when the request had an admission."""
        self._check_open()
        return self._hints is not None and self._hints.admit_done(request_id)

    def _hint_client(self):
        """The session prefetches and admissions go through, opened on first use: a session of
        their own, because every request completes on the lookup's completion counter, which
        must count only its gathers (the GPU waits for the step's count). close() ends it, and
        with it the admissions."""
        if self._hints is None:
            self._hints = Client(self._client.socket, data_bytes=_PREFETCH_MAX_ROWS * 8,
                                 slots=4, client_name=self._client_name, timeout=self._timeout)
        return self._hints

    def _hash_tokens(self, hasher, tokens, history, tp_size, tp_rank, heads, compressed):
        """{layer: row ids [positions, heads]} of every layer, hashed as a step's are."""
        begin, end = hasher.head_range(tp_size, tp_rank, heads)
        if end - begin != self.heads:
            raise InvalidArgumentError(
                -errno.EINVAL, f"the hasher's head selection [{begin}, {end}) has "
                               f"{end - begin} heads; this lookup was made for {self.heads}")
        unknown = [layer for layer in self.layers if layer not in hasher.layers]
        if unknown:
            raise UnknownTableError(
                -errno.ENOENT, f"layer(s) {unknown} are not Engram layers of the hasher's model "
                               f"(it has {sorted(hasher.layers)})")
        return {layer: hasher.hash(tokens, history, layer=layer, heads=(begin, end),
                                   compressed=compressed) for layer in self.layers}

    def _by_layer(self, row_ids):
        """{layer_id: ids} from a dict, or from a sequence in the order of `layers`;
        UnknownTableError (an EngramError) for ids of layers this lookup does not serve."""
        if not isinstance(row_ids, dict):
            row_ids = list(row_ids)
            if len(row_ids) != len(self.layers):
                raise InvalidArgumentError(
                    -errno.EINVAL, f"{len(row_ids)} row id arrays for {len(self.layers)} layers "
                                   f"{self.layers}")
            return dict(zip(self.layers, row_ids))
        unknown = sorted(set(row_ids) - set(self.layers))
        if unknown:
            raise UnknownTableError(
                -errno.ENOENT, f"row ids given for layers {unknown}, not layers of this lookup "
                               f"{self.layers}")
        return row_ids

    def _validate(self, layer_id, ids, any_tokens=False):
        """(tokens, valid slots, rows) of a step's ids (any_tokens: a prompt's, any length)."""
        info = self._layers[layer_id].info
        return step_row_ids(ids, layer_id, self.heads, None if any_tokens else self.max_tokens,
                            info.covered_begin, info.covered_end)

    def _stage(self, layer, tokens, valid, rows):
        """Writes the step's row ids and index map into the arena."""
        n = int(rows.size)
        slots = tokens * self.heads
        layer.ids[:n] = rows
        index_map = layer.index_map
        layer.gpu_in_place = layer.table is not None
        if layer.gpu_in_place and layer.cache is not None:
            # The row cache is looked up by each slot's row id; padding asks for a row of the
            # table (a valid key) and is then written +0.0 through pad_host.
            slot_ids = np.full(slots, layer.table.covered_begin, dtype=np.uint64)
            slot_ids[valid] = rows
            layer.ids[:slots] = slot_ids
            layer.pad_host[:slots].copy_(torch.from_numpy(~valid))
            index_map[:slots] = -1
        elif layer.gpu_in_place:
            # Rows in place: slot s reads row ids[s] at its offset in the table's mapping.
            index_map[:slots] = -1
            index_map[:slots][valid] = rows.astype(np.int64) - layer.table.covered_begin
        else:
            index_map[:slots] = np.where(valid, np.cumsum(valid, dtype=np.int64) - 1, -1)
        if layer.map_high_water > slots:
            index_map[slots:layer.map_high_water] = -1
        layer.map_high_water = slots
        layer.tokens = tokens
        layer.num_rows = n

    def _check_gpu_tables(self):
        """Before a step: a table read in place on the GPU that engramd withdrew (or whose
        daemon is gone) is copied into the arena from now on, with a warning; if a captured
        get() reads it in place, raises instead (that graph would read the withdrawn rows:
        capture it again after this error, and it reads the arena)."""
        if self._tables is None:
            return
        stale = {layer_id: rc for layer_id, rc in self._tables.stale().items()
                 if self._layers[layer_id].table is not None}
        if not stale:
            return
        captured = []
        for layer_id in stale:
            layer = self._layers[layer_id]
            layer.table = layer.cache = None
            if layer.captured_in_place:
                captured.append(layer_id)
                layer.captured_in_place = False
        what = ", ".join(f"{layer_id} ({errno.errorcode.get(-rc, rc)})"
                         for layer_id, rc in sorted(stale.items()))
        if captured:
            raise error_for(-errno.ESTALE,
                            f"the tables of layer(s) {what} may no longer be read in place, and "
                            f"a CUDA graph captured get() of layer(s) {sorted(captured)} reading "
                            f"them: capture it again (it then reads the rows engramd gathers)")
        warnings.warn(f"engram: the tables of layer(s) {what} may no longer be read in place; "
                      f"their rows go through engramd into the arena from now on",
                      RuntimeWarning, stacklevel=4)

    def _finish_step(self, timeout=None):
        """Waits (host) for the daemon to finish the current step's requests; raises the first
        error. Eagerly launched GPU work of the step is waited for too, so that its rows and
        index maps may be overwritten."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        self._raise_miss_error()
        if self.in_place:
            self._wait_counter(timeout)
        first_error = None
        for layer in self._layers.values():
            if layer.ticket is None:
                continue
            try:
                self._host_wait(layer, timeout)
            except EngramTimeoutError:
                raise
            except EngramError as e:
                first_error = first_error or e
        if first_error is not None:
            raise first_error

    def _raise_miss_error(self):
        """Raises (once) a failure the GPU queue of the row caches' misses recorded during the
        previous step: that step's rows of the cache-tier layers were not valid."""
        lane = self._miss_lane
        if lane is None or lane.error_word[0] == 0:
            return
        status = int(lane.error_word[0])
        lane.error_word[0] = 0
        layers = sorted(l for l, layer in self._layers.items() if layer.cache is not None)
        raise error_for(-_STATUS_ERRNO.get(status, errno.EIO),
                        f"layer(s) {layers}: the previous step's row cache misses were not "
                        f"gathered (engramd status {status}); its rows of those layers are not "
                        f"valid")

    def _wait_counter(self, timeout):
        """Waits on the host until a request a timed-out in-place gather left in flight has
        completed (the completion counter reached what this object submitted)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        next_check = time.monotonic() + 0.02
        while self._counter.value < self._submitted:
            now = time.monotonic()
            if deadline is not None and now > deadline:
                raise EngramTimeoutError(-errno.ETIMEDOUT,
                                         "a request of the previous step is still in flight")
            if now > next_check:
                self._client.stats()  # raises EngramConnectionError once the daemon is gone
                next_check = now + 0.02
            time.sleep(0.0002)

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits on the host until every layer's rows of the prepared step are in the arena,
        raising the daemon's error if a request failed. Optional: get() does not need it."""
        self._check_open()
        for layer in self._layers.values():
            if layer.ticket is not None:
                self._host_wait(layer, timeout)

    def _host_wait(self, layer, timeout=None):
        """Waits for the layer's request; a timeout leaves it in flight, an error ends it."""
        try:
            self._client.wait_request(layer.ticket, timeout)
        except EngramTimeoutError as e:
            raise type(e)(e.code, f"layer {layer.layer_id}: {e.message}") from None
        except EngramError as e:
            layer.ticket = None
            raise type(e)(e.code, f"layer {layer.layer_id}: {e.message}") from None
        layer.ticket = None

    @_layer_alias("layer_id")
    def get(self, layer: int) -> torch.Tensor:
        """The bf16 embeddings [tokens, heads, 256] of layer `layer` for the prepared step.

        On a GPU: a view of this layer's output buffer, written by work queued on the current
        stream (valid until the next get() of this layer); capturable into a CUDA graph. On the
        CPU: a new tensor, after waiting for the rows on the host."""
        prepared = self._prepared_layer(layer)
        if self.device.type == "cpu":
            if prepared.cpu_result is None:
                if prepared.ticket is not None:
                    self._host_wait(prepared)
                prepared.cpu_result = self._dequantize_cpu(prepared)
            return prepared.cpu_result
        with torch.cuda.device(self.device):
            return self._launch_gpu(prepared, prepared.out)[:prepared.tokens]

    @_layer_alias("layer_id")
    def embeddings(self, layer: int, tokens: torch.Tensor) -> torch.Tensor:
        """get(layer) as a torch custom op, torch.ops.engram.gather_wait: what a model
        compiled with torch.compile(fullgraph=True) calls. `tokens` is any tensor on this
        lookup's device whose first dimension is the step's token count (the step's input ids);
        it gives the result its shape when traced. Returns a new bf16 [tokens, heads, 256]
        tensor each call (on a GPU written by work queued on the current stream, capturable
        into a CUDA graph)."""
        return torch.ops.engram.gather_wait(tokens, self.op_id, layer)

    def _prepared_layer(self, layer_id):
        self._check_open()
        layer = self._layers.get(layer_id)
        if layer is None:
            raise UnknownTableError(-errno.ENOENT,
                                    f"layer {layer_id} is not one of {self.layers}")
        if layer.tokens is None:
            raise RuntimeError(f"layer {layer_id}: get() before any prepare()")
        return layer

    def _op_result(self, layer_id, tokens):
        """torch.ops.engram.gather_wait's implementation: a new tensor, never a view of ours."""
        layer = self._prepared_layer(layer_id)
        if tokens != layer.tokens:
            raise InvalidArgumentError(
                -errno.EINVAL, f"layer {layer_id}: the tokens tensor has {tokens} rows but "
                               f"the prepared step has {layer.tokens} tokens")
        if self.device.type == "cpu":
            if layer.ticket is not None:
                self._host_wait(layer)
            return self._dequantize_cpu(layer)
        with torch.cuda.device(self.device):
            out = torch.empty((layer.tokens, self.heads, ROW_VALUES), dtype=torch.bfloat16,
                              device=self.device)
            return self._launch_gpu(layer, out)

    def _dequantize_cpu(self, layer):
        return dequantize_scatter(
            self._rows_tensor(layer),
            torch.from_numpy(layer.index_map[:layer.tokens * self.heads]), layer.tokens,
            self.heads)

    def _rows_tensor(self, layer):
        if layer.num_rows == 0:
            return torch.empty((0, row_bytes()), dtype=torch.uint8)
        width = row_bytes()
        view = (ctypes.c_uint8 * (layer.num_rows * width)).from_address(layer.rows_address)
        return torch.frombuffer(view, dtype=torch.uint8).view(layer.num_rows, width)

    def _launch_gpu(self, layer, out):
        """Queues the wait for the daemon and the dequant-scatter into `out` (bf16, at least
        [tokens, heads, 256], contiguous) on the current stream; returns `out`."""
        stream = torch.cuda.current_stream(self.device)
        handle = stream.cuda_stream
        capturing = torch.cuda.is_current_stream_capturing()
        if layer.gpu_in_place and layer.cache is not None:
            # Hits from the row cache, misses requested and scattered by the GPU, then padding.
            buffers, slots = layer.cache, layer.tokens * self.heads
            self._kernels.queue_cache_gather(self._miss_lane.queue, layer.table.cache,
                                             layer.ids_d, layer.tokens, self.heads,
                                             out.data_ptr(), buffers.misses,
                                             buffers.miss_dest_d, handle)
            buffers.used = True
            layer.pad_d[:slots].copy_(layer.pad_host[:slots], non_blocking=True)
            out[:layer.tokens].view(slots, ROW_VALUES).masked_fill_(
                layer.pad_d[:slots].unsqueeze(1), 0)
            layer.captured_in_place = layer.captured_in_place or capturing
        elif layer.gpu_in_place:
            # No request: the rows are read from the table's registered mapping.
            self._kernels.dequant_scatter(layer.table.table_d, layer.table_rows, layer.map_d,
                                          layer.tokens, self.heads, out.data_ptr(), handle)
            layer.captured_in_place = layer.captured_in_place or capturing
        else:
            self._kernels.stream_wait_ticket(handle, self._counter_d, self._target_d, 1,
                                             layer.step_counter.data_ptr())
            # num_rows = capacity: a captured graph must accept any later step's row count.
            self._kernels.dequant_scatter(layer.rows_d, layer.capacity, layer.map_d,
                                          layer.tokens, self.heads, out.data_ptr(), handle)
        if not capturing:
            event = torch.cuda.Event()
            event.record(stream)
            self._event = event
        return out

    # ---- lifetime ---------------------------------------------------------------------------

    def stats(self) -> Any:
        """The session's statistics (engram.SessionStats)."""
        return self._client.stats()

    def _check_open(self):
        if self._closed:
            raise RuntimeError("the EngramLookup is closed")

    def close(self) -> None:
        """Waits for requests in flight and queued GPU work, then releases everything."""
        if self._closed:
            return
        self._closed = True
        try:
            for layer in self._layers.values():
                if layer.ticket is not None:
                    try:
                        self._client.wait_request(layer.ticket)
                    except EngramError:
                        pass  # closing: the step's error no longer matters
                    layer.ticket = None
            if self._registration is not None:
                torch.cuda.synchronize(self.device)
                if self._miss_lane is not None:
                    self._miss_lane.close()
                if self._tables is not None:
                    self._tables.close()
                self._registration.unregister()
        finally:
            # Hand the buffers back so that close() ends the session now, not at collection.
            self._free_buffers()
            self._client.close()
            if self._hints is not None:
                self._hints.close()

    def _free_buffers(self):
        for layer in self._layers.values():
            layer.ids = layer.index_map = None
            layer.buffer.free()
        self._target = None
        if self._target_buffer is not None:
            self._target_buffer.free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if not getattr(self, "_closed", True):
                self.close()
        except Exception:  # interpreter shutdown: the session dies with the process anyway
            pass
