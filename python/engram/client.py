"""Client: a session with engramd, and gathers whose rows are zero-copy tensors in its arena.

    with engram.Client() as client:               # $ENGRAM_SOCKET or /run/engramd/engramd.sock
        rows = client.gather(14, [5, 17, 99])     # torch.uint8 [3, 264], a view of the arena
        ...
        client.release(rows)                      # the arena range may now be reused

Results are torch.uint8 tensors, or NumPy uint8 arrays with array="numpy" (no torch needed);
typed=True splits them into FP8 E4M3 values and E8M0 scales over the same memory (RowView, see
engram.views).

Lifetime of gathered tensors: a tensor returned by gather() or Ticket.wait() is a view of the
session's shared-memory arena, not a copy. Its range goes back to the arena when it is released
(Client.release, Ticket.release, leaving a Ticket's `with` block) or when the last tensor
viewing it is garbage collected. After an explicit release the memory may be overwritten by a
later gather: use tensor.clone() to keep the rows. Client.close() ends the session once no
gathered tensor is alive any more, so a stale tensor never points at unmapped memory.
"""

import ctypes
import errno
import functools
import os
import threading
import time
import warnings
import weakref
from typing import Any, List, Optional, Tuple

import numpy as np

from . import _lib
from ._arrays import integer_array
from .errors import (AdmissionUnsupportedError, InvalidArgumentError, PrefetchUnsupportedError,
                     RowOutOfRangeError, error_for)
from .arena import ArenaBuffer
# TableInfo, SessionStats, protocol_version, library_path, row_bytes and Ticket are part of this
# module's names as before; they live in their own modules.
from .session_info import (TIER_NAMES, SessionStats, TableInfo,  # noqa: F401 (re-exported)
                           library_path, protocol_version, row_bytes)
from .ticket import _NS, Ticket, _timeout_ns
from .views import split_rows

ARRAY_KINDS = ("torch", "numpy")

DEFAULT_SOCKET = "/run/engramd/engramd.sock"


def _layer_alias(*old_names: str):
    """Lets a method that takes a table's Engram layer id as `layer` also take it under its
    deprecated keyword names (`table=`, `layer_id=`), with a DeprecationWarning: C, Python and
    engramctl call a table's id its layer."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            for old in old_names:
                if old not in kwargs:
                    continue
                if "layer" in kwargs:
                    raise TypeError(f"{fn.__name__}() got both layer= and {old}= (one table id)")
                warnings.warn(f"{fn.__name__}({old}=...) is deprecated: pass layer=",
                              DeprecationWarning, stacklevel=2)
                kwargs["layer"] = kwargs.pop(old)
            return fn(*args, **kwargs)
        return call
    return wrap

def row_ids_array(row_ids, what: str = "row ids") -> np.ndarray:
    """row_ids (list, tuple, range, NumPy array or CPU integer tensor) as a 1-D NumPy array.

    Raises TypeError for non-integer ids, ValueError for a tensor on a GPU, a shape that is not
    1-D, or a negative id.
    """
    array = integer_array(row_ids, what, cpu_hint="pass a CPU tensor (the daemon reads them "
                                                  "from host memory)")
    if array.dtype.kind == "i" and array.size and array.min() < 0:
        index = int(np.argmax(array < 0))
        raise RowOutOfRangeError(-errno.ERANGE,
                                 f"{what}: row id {int(array[index])} at index {index} is "
                                 f"negative")
    return array


def _request_id(request_id) -> int:
    """An admission's request id as the uint64 the C call takes; InvalidArgumentError else."""
    if isinstance(request_id, (bool, np.bool_)) or not isinstance(request_id,
                                                                  (int, np.integer)):
        raise InvalidArgumentError(-errno.EINVAL, f"request id {request_id!r} is not an integer")
    if not 0 <= int(request_id) < 2**64:
        raise InvalidArgumentError(-errno.EINVAL, f"request id {int(request_id)} is outside "
                                                  f"[0, 2^64)")
    return int(request_id)


_Allocation = ArenaBuffer


class Client:
    """A session with engramd: its own shared-memory arena, request slots and statistics.

    Args:
        socket: path of the daemon's socket; None: $ENGRAM_SOCKET, else
            /run/engramd/engramd.sock (as the daemon's default).
        data_bytes: size of the arena's data region (rows, row ids); 0: the daemon's default
            (64 MiB). The daemon bounds it (--max-arena-bytes).
        slots: requests in flight at once; 0: the library's default (64).
        client_name: shown in the daemon's statistics; None: the program name.
        timeout: seconds allowed for connecting and the handshake; None: the library's 5 s.
        device_submit: hand the session's submission ring to a GPU producer (what
            engram.GpuDecodeStep does); host-side gathers on it then fail (EngramError,
            errno EBUSY).
        in_place: gather() and gather_tokens() read the rows of resident and cache-tier tables
            in place (see gather()) unless a call says otherwise; False sends them to the daemon
            (ENGRAM_CONNECT_GATHER_VIA_DAEMON), as the environment variable ENGRAM_IN_PLACE=0
            does for every session of the process.

    Methods are thread-safe. Errors raise engram.EngramError subclasses (ConnectionError when
    no daemon listens or the session was lost, ValueError for a bad table or row, ...).
    """

    def __init__(self, socket: Optional[str] = None, *, data_bytes: int = 0, slots: int = 0,
                 client_name: Optional[str] = None, timeout: Optional[float] = None,
                 device_submit: bool = False, in_place: bool = True):
        lib = _lib.client_lib()
        self._lib = lib
        options = _lib.ConnectOptions()
        lib.engram_connect_options_init(ctypes.byref(options), ctypes.sizeof(options))
        socket = os.fspath(socket) if socket is not None else None
        self._socket_bytes = socket.encode() if socket is not None else None
        self._name_bytes = client_name.encode() if client_name is not None else None
        options.socket_path = self._socket_bytes
        options.data_bytes = data_bytes
        options.slots = slots
        options.client_name = self._name_bytes
        options.timeout_ns = 0 if timeout is None else max(1, int(timeout * _NS))
        # The ring then belongs to a GPU producer (engram.GpuDecodeStep): host submits fail.
        options.flags = (_lib.CONNECT_DEVICE_SUBMIT if device_submit else 0) | \
            (0 if in_place else _lib.CONNECT_GATHER_VIA_DAEMON)
        handle = ctypes.c_void_p()
        _lib.check(lib.engram_session_open(ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle
        self.socket = socket or os.environ.get("ENGRAM_SOCKET") or DEFAULT_SOCKET
        self._mutex = threading.Lock()
        self._live = {}  # address -> _Allocation
        self._closing = False
        self._closed = False
        base, size = ctypes.c_void_p(), ctypes.c_uint64()
        _lib.check(lib.engram_data_region(handle, ctypes.byref(base), ctypes.byref(size)))
        self._data_region = (base.value, size.value)
        # The library's default path for a gather without a path flag (the environment's
        # ENGRAM_IN_PLACE included): what gather(in_place=None) does.
        self._in_place_default = in_place and not device_submit and \
            os.environ.get("ENGRAM_IN_PLACE", "1") in ("", "1")

    # ---- session --------------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._closing else "open"
        return f"<engram.Client {self.socket!r} {state}>"

    @property
    def closed(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Ends the session. Tensors still viewing the arena keep it mapped until they are
        released or garbage collected; no new request may be made. Idempotent."""
        with self._mutex:
            if self._closing:
                return
            self._closing = True
            if self._live:
                return
        self._close_now()

    def _close_now(self):
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            handle, self._handle = self._handle, None
        self._lib.engram_session_close(handle)

    def __del__(self):
        # The arena stays mapped while tensors view it (they hold allocations, which hold us).
        if getattr(self, "_handle", None) is not None and not getattr(self, "_closed", True):
            self._lib.engram_session_close(self._handle)
            self._handle = None

    def _session(self):
        if self._closing:
            raise error_for(-errno.ENOTCONN, f"the session with engramd at {self.socket} is "
                                             f"closed")
        return self._handle

    # ---- tables and statistics ------------------------------------------------------------

    def tables(self) -> List[TableInfo]:
        """The tables the daemon serves, ordered by layer id (list of TableInfo)."""
        session = self._session()
        count = ctypes.c_size_t()
        capacity = 16
        while True:
            entries = (_lib.TableInfoStruct * capacity)()
            for entry in entries:
                entry.size = ctypes.sizeof(entry)
            _lib.check(self._lib.engram_list_tables(session, entries, capacity,
                                                    ctypes.byref(count)))
            if count.value <= capacity:
                break
            capacity = count.value
        layouts = {0: "checkpoint", 1: "packed"}
        return [TableInfo(e.layer, e.row_bytes, e.num_rows, e.covered_begin, e.covered_end,
                          layouts.get(e.layout, str(e.layout)), e.files, e.data_bytes,
                          TIER_NAMES.get(e.tier, str(e.tier)))
                for e in entries[:count.value]]

    @_layer_alias("layer_id")
    def table(self, layer: int) -> TableInfo:
        """TableInfo of one layer; UnknownTableError (a ValueError) if it is not served."""
        for info in self.tables():
            if info.layer == layer:
                return info
        served = ", ".join(str(t.layer) for t in self.tables()) or "none"
        raise error_for(-errno.ENOENT, f"engramd at {self.socket} serves no table {layer} "
                                       f"(it serves: {served})")

    def stats(self) -> SessionStats:
        """This session's statistics (SessionStats)."""
        stats = _lib.session_stats_struct()()
        stats.size = ctypes.sizeof(stats)
        _lib.check(self._lib.engram_get_session_stats(self._session(), ctypes.byref(stats)))
        return SessionStats({name: getattr(stats, name) for name, _ in _lib.session_stats_fields()})

    # ---- the arena ------------------------------------------------------------------------

    @property
    def data_region(self) -> Tuple[int, int]:
        """(address, bytes) of the arena's data region, where rows land."""
        return self._data_region

    def arena(self) -> Tuple[int, int]:
        """(address, bytes) of the whole arena mapping (for GPU registration)."""
        base, size = ctypes.c_void_p(), ctypes.c_uint64()
        _lib.check(self._lib.engram_arena(self._session(), ctypes.byref(base),
                                          ctypes.byref(size)))
        return base.value, size.value

    def completion_counter_address(self) -> int:
        """Address of the session's 64-bit completion counter (in the arena)."""
        counter = ctypes.c_void_p()
        _lib.check(self._lib.engram_completion_counter(self._session(), ctypes.byref(counter)))
        return counter.value

    def alloc(self, nbytes: int) -> ArenaBuffer:
        """A buffer of `nbytes` in the session's data region (8-byte aligned), for gathers
        whose row ids and destination the caller lays out (submit_in_arena). Raises
        ResourceExhaustedError when the data region is full."""
        return self._alloc(nbytes)

    def _alloc(self, nbytes):
        ptr = ctypes.c_void_p()
        with self._mutex:
            session = self._session()
            _lib.check(self._lib.engram_alloc(session, max(1, nbytes), ctypes.byref(ptr)))
            allocation = _Allocation(self, ptr.value, nbytes)
            self._live[ptr.value] = allocation
        return allocation

    def _free(self, allocation):
        close_now = False
        with self._mutex:
            if allocation.freed:
                return
            allocation.freed = True
            self._live.pop(allocation.address, None)
            if self._closing:
                # engram_session_close returns the whole arena; no range is reused after close().
                close_now = not self._live and not self._closed
            else:
                rc = self._lib.engram_free(self._handle, ctypes.c_void_p(allocation.address))
                if rc < 0:
                    raise error_for(rc, _lib.last_error())
        if close_now:
            self._close_now()

    def _view(self, allocation, shape, array="torch"):
        """A uint8 tensor (or NumPy array) viewing allocation bytes [0, prod(shape))."""
        nbytes = int(np.prod(shape))
        if array == "numpy":
            if nbytes == 0:
                return np.empty(shape, dtype=np.uint8)
            view = (ctypes.c_uint8 * nbytes).from_address(allocation.address)
            weakref.finalize(view, allocation.free)
            return np.frombuffer(view, dtype=np.uint8).reshape(shape)  # keeps `view` alive
        import torch
        if nbytes == 0:
            return torch.empty(shape, dtype=torch.uint8)
        view = (ctypes.c_uint8 * nbytes).from_address(allocation.address)
        # torch.frombuffer keeps `view` alive as long as any tensor shares its storage: the
        # allocation is freed when the last of them goes away (unless released earlier).
        weakref.finalize(view, allocation.free)
        return torch.frombuffer(view, dtype=torch.uint8).view(shape)

    def release(self, rows: Any) -> None:
        """Returns the arena range behind rows from gather()/Ticket.wait() (a tensor, a NumPy
        array, a RowView or any view into them) now; the rows and every view of them must not
        be used afterwards. Idempotent."""
        if hasattr(rows, "raw") and hasattr(rows, "scales"):
            rows = rows.raw
        if isinstance(rows, np.ndarray):
            address, empty = rows.__array_interface__["data"][0], rows.size == 0
        else:
            address, empty = rows.data_ptr(), rows.numel() == 0
        with self._mutex:
            allocation = next((a for a in self._live.values()
                               if a.address <= address < a.address + max(1, a.bytes)), None)
        if allocation is None:
            if empty:
                return
            raise InvalidArgumentError(-errno.EINVAL, "the rows are not a live gather of this "
                                                      "client (already released?)")
        allocation.free()

    @staticmethod
    def _check_array(array):
        if array not in ARRAY_KINDS:
            raise ValueError(f"array must be one of {ARRAY_KINDS}, got {array!r}")

    # ---- gathering ------------------------------------------------------------------------

    @_layer_alias("table")
    def submit(self, layer: int, row_ids: Any, *, array: str = "torch",
               typed: bool = False) -> "Ticket":
        """Starts gathering rows `row_ids` of the table of layer `layer`; returns a Ticket.

        row_ids: list, NumPy array or CPU tensor of integers (1-D). Nothing is copied but the
        ids, into the arena. array: "torch" (torch.uint8 results) or "numpy" (numpy.uint8, no
        torch import); typed: results as RowView(values, scales, raw) (engram.split_rows).
        Raises UnknownTableError / RowOutOfRangeError when the daemon refuses the request (at
        wait time), ResourceExhaustedError when every slot is busy.
        """
        self._check_array(array)
        allocation, request = self._gather_request(layer, row_ids, 0)
        n = request.num_rows
        try:
            ticket = ctypes.c_uint64()
            _lib.check(self._lib.engram_submit(self._session(), ctypes.byref(request),
                                               ctypes.byref(ticket)))
        except BaseException:
            allocation.free()
            raise
        return Ticket(self, ticket.value, layer, n, allocation, array=array, typed=typed)

    @_layer_alias("table")
    def prefetch(self, layer: int, row_ids: Any) -> int:
        """Tells engramd that rows `row_ids` of layer `layer`'s table will probably be gathered soon
        (draft tokens' rows, the next prefill chunk): it brings them into its row cache or the
        page cache in the background, after the gathers in flight (engram_prefetch).

        Returns once the daemon has checked and queued the ids, never after I/O, with how many
        it queued (all, unless they exceed its whole prefetch queue; a full queue drops its
        oldest rows for new ones and counts them). row_ids as for gather(). Raises UnknownTableError /
        RowOutOfRangeError (naming the table, the row and its index) for a bad id, and
        PrefetchUnsupportedError when the library or the daemon predates prefetch."""
        ids = np.ascontiguousarray(row_ids_array(row_ids), dtype=np.uint64)
        fn = getattr(self._lib, "engram_prefetch", None)
        if fn is None or fn.argtypes is None:
            raise PrefetchUnsupportedError(-errno.EOPNOTSUPP,
                                   f"{_lib.client_lib_path()} has no engram_prefetch (it predates "
                                   f"ENGRAM_0.5): install a newer libengram_client")
        queued = ctypes.c_uint64()
        rc = fn(self._session(), layer, ids.ctypes.data if ids.size else None, ids.size, 0,
                ctypes.byref(queued))
        if rc == -errno.EOPNOTSUPP:
            raise PrefetchUnsupportedError(rc, _lib.last_error())
        _lib.check(rc)
        return int(queued.value)

    def admit(self, request_id: int, layer: int, row_ids: Any, *,
              ttl: Optional[float] = None) -> int:
        """Tells engramd that request `request_id` (an id of this session's choosing, unique
        among its requests) will gather rows `row_ids` of layer `layer`'s table in its prefill:
        call it when the engine admits the request, once per table (another call adds rows to
        the same request). engramd reads the rows its row cache lacks after every gather and
        prefetch, and pins each in the cache, so that no eviction takes it, until
        admit_done(request_id), `ttl` seconds (None or 0: the daemon's memory.admit_ttl_ms,
        also the most it grants) or the session's end (engram_admit). A table outside the
        cache tier has its rows prefetched as prefetch() does, not pinned.

        Returns once the ids are checked and their pins reserved, never after I/O, with the
        rows queued. row_ids as for gather(); each id is a pin, so pass each once. Raises as
        prefetch() does; ResourceExhaustedError when the pins would pass the session's
        memory.admit_session_rows or the daemon's memory.admit_rows (the message names which;
        rows of a call's earlier 8,192-id chunks stay reserved: admit_done releases them);
        AdmissionUnsupportedError when the library or the daemon predates admissions."""
        request_id = _request_id(request_id)
        if ttl is not None and not ttl >= 0:
            raise InvalidArgumentError(-errno.EINVAL, f"request {request_id}: ttl {ttl!r} is "
                                                      f"not a number of seconds >= 0")
        ttl_ns = min(2**64 - 1, max(1, int(min(ttl * _NS, 2.0**64)))) if ttl else 0
        ids = np.ascontiguousarray(row_ids_array(row_ids), dtype=np.uint64)
        queued = ctypes.c_uint64()
        rc = self._admit_fn("engram_admit")(self._session(), request_id, layer,
                                            ids.ctypes.data if ids.size else None, ids.size,
                                            ttl_ns, ctypes.byref(queued))
        if rc == -errno.EOPNOTSUPP:
            raise AdmissionUnsupportedError(rc, _lib.last_error())
        _lib.check(rc)
        return int(queued.value)

    def admit_done(self, request_id: int) -> bool:
        """Request `request_id` is done with the rows admit() pinned for it (its prefill has
        gathered them, or it was cancelled): engramd unpins them and leaves those still queued
        unread (engram_admit_done). True when the request had an admission; False when it had
        none (never made, released already or expired; a daemon without a row cache makes
        none). Raises AdmissionUnsupportedError as admit() does."""
        request_id = _request_id(request_id)
        found = ctypes.c_int()
        rc = self._admit_fn("engram_admit_done")(self._session(), request_id,
                                                 ctypes.byref(found))
        if rc == -errno.EOPNOTSUPP:
            raise AdmissionUnsupportedError(rc, _lib.last_error())
        _lib.check(rc)
        return bool(found.value)

    def _admit_fn(self, name):
        fn = getattr(self._lib, name, None)
        if fn is None or fn.argtypes is None:
            raise AdmissionUnsupportedError(
                -errno.EOPNOTSUPP, f"{_lib.client_lib_path()} has no {name} (it predates "
                                   f"ENGRAM_0.8): install a newer libengram_client")
        return fn

    def _gather_request(self, layer: int, row_ids: Any, flags: int):
        """An arena range for the rows of `row_ids` followed by the ids, and the request that
        gathers them into it."""
        ids = row_ids_array(row_ids)
        n = int(ids.size)
        rows_bytes = n * _lib.row_bytes()  # a multiple of 8: the ids that follow stay aligned
        allocation = self._alloc(rows_bytes + n * 8)
        if n:
            dst = np.ctypeslib.as_array(
                (ctypes.c_uint64 * n).from_address(allocation.address + rows_bytes))
            np.copyto(dst, ids, casting="unsafe")
        request = _lib.GatherRequest(
            size=ctypes.sizeof(_lib.GatherRequest), layer=layer, flags=flags,
            rows=allocation.address + rows_bytes, num_rows=n, dest=allocation.address,
            dest_offsets=None)
        return allocation, request

    @_layer_alias("table")
    def gather(self, layer: int, row_ids: Any, timeout: Optional[float] = None, *,
               array: str = "torch", typed: bool = False,
               in_place: Optional[bool] = None) -> Any:
        """Gathers rows `row_ids` of layer `layer`'s table: a torch.uint8 tensor [n, 264] viewing
        the arena (row i = row row_ids[i]: 256 FP8 E4M3 values, then 8 E8M0 scales); a NumPy
        array with array="numpy"; RowView(values, scales, raw) with typed=True. See the
        module's notes on its lifetime. timeout in seconds (None: no limit).

        in_place: None (the default) takes the session's path (Client's in_place), True the
        in-place path, False the daemon (ENGRAM_GATHER_VIA_DAEMON). In place, where the table is
        resident in engramd's memory this process copies the rows itself from a read-only
        mapping of the table (no round trip; the first such call maps the table); for a table
        of the cache tier it copies the rows the row cache holds from a read-only mapping of it
        and asks the daemon for the others only (one request); storage-tier tables, and tables
        this process cannot map, are gathered by the daemon. The rows, errors and messages are
        the same either way; rows read in place are counted in stats().rows_in_place."""
        if in_place is None:
            in_place = self._in_place_default
        if in_place:
            return self._gather_in_place(layer, row_ids, timeout, array, typed)
        ticket = self.submit(layer, row_ids, array=array, typed=typed)
        # On a timeout the request stays in flight: the dropped ticket's finaliser waits for it
        # before its range is reused.
        return ticket.wait(timeout)

    def _gather_in_place(self, layer, row_ids, timeout, array, typed):
        self._check_array(array)
        allocation, request = self._gather_request(layer, row_ids, _lib.GATHER_IN_PLACE)
        n = request.num_rows
        rc = self._lib.engram_gather(self._session(), ctypes.byref(request), _timeout_ns(timeout))
        if rc < 0:
            error = error_for(rc, _lib.last_error())
            # A request that timed out through the daemon may still land: its range stays
            # allocated rather than be reused under a late write.
            if rc != -errno.ETIMEDOUT:
                allocation.free()
            raise error
        rows = self._view(allocation, (n, _lib.row_bytes()), array)
        if n == 0:
            allocation.free()
        return split_rows(rows) if typed else rows

    @_layer_alias("table")
    def submit_tokens(self, hasher: Any, layer: int, tokens: Any, history: Any = None, *,
                      tp_size: Optional[int] = None, tp_rank: Optional[int] = None,
                      heads: Any = None, compressed: bool = False, array: str = "torch",
                      typed: bool = False) -> "Ticket":
        """Hashes `tokens` with `hasher` (an engram.Hasher) straight into the arena and submits
        the gather of those rows of layer `layer`'s table in the same call (engram_submit_tokens);
        returns a Ticket whose wait() gives a torch.uint8 tensor [positions, heads, 264]
        viewing the arena: [t, h] holds the row of head h for the t-th token.

        tokens, history, tp_size/tp_rank, heads and compressed as for Hasher.hash. Errors of
        the hash (UnknownTableError for a layer the hasher does not know, InvalidArgumentError
        for an id outside the vocabulary, NoVocabularyError) are raised here, before anything
        is submitted; the daemon's at wait time. array and typed as for submit()."""
        self._check_array(array)
        from .errors import hash_error_for
        allocation, request, seqs, shape = self._token_request(hasher, layer, tokens, history,
                                                               tp_size, tp_rank, heads,
                                                               compressed)
        n = request.rows_cap
        try:
            ticket = ctypes.c_uint64()
            rc = _lib.hash_lib().engram_submit_tokens(self._session(), hasher._h(),
                                                      ctypes.byref(request), ctypes.byref(ticket),
                                                      None)
            if rc < 0:
                raise hash_error_for(rc, _lib.last_error())
        except BaseException:
            allocation.free()
            raise
        return Ticket(self, ticket.value, layer, n, allocation, shape=shape, array=array,
                      typed=typed)

    def _token_request(self, hasher, layer, tokens, history, tp_size, tp_rank, heads,
                       compressed):
        """An arena range for the rows of a token request followed by their ids, the request
        (whose sequences live in the returned _Sequences) and the rows' shape."""
        from .hasher import _Sequences
        begin, end = hasher.head_range(tp_size, tp_rank, heads)
        seqs = _Sequences(tokens, history)
        width = max(0, end - begin)
        n = seqs.positions * width
        rows_bytes = n * _lib.row_bytes()  # a multiple of 8: the ids that follow stay aligned
        allocation = self._alloc(rows_bytes + n * 8)
        request = _lib.TokenRequest(
            size=ctypes.sizeof(_lib.TokenRequest), layer=layer,
            flags=_lib.HASH_COMPRESSED_IDS if compressed else 0, seqs=ctypes.addressof(
                seqs.seqs), n_seqs=seqs.count, head_begin=begin, head_end=end, tp_size=0,
            tp_rank=0, rows=allocation.address + rows_bytes, rows_cap=n,
            dest=allocation.address)
        return allocation, request, seqs, (seqs.positions, width, _lib.row_bytes())

    def _gather_tokens_now(self, hasher, layer, tokens, history, tp_size, tp_rank, heads,
                           compressed, timeout, array, typed):
        """gather_tokens through engram_gather_tokens: in place where the table can be
        mapped."""
        self._check_array(array)
        from .errors import hash_error_for
        allocation, request, seqs, shape = self._token_request(hasher, layer, tokens, history,
                                                               tp_size, tp_rank, heads,
                                                               compressed)
        rc = _lib.hash_lib().engram_gather_tokens(self._session(), hasher._h(),
                                                  ctypes.byref(request), _timeout_ns(timeout))
        del seqs  # the library has read the sequences
        if rc < 0:
            error = hash_error_for(rc, _lib.last_error())
            # A request that timed out through the daemon may still land: its range stays
            # allocated rather than be reused under a late write.
            if rc != -errno.ETIMEDOUT:
                allocation.free()
            raise error
        rows = self._view(allocation, shape, array)
        if request.rows_cap == 0:
            allocation.free()
        return split_rows(rows) if typed else rows

    @_layer_alias("table")
    def gather_tokens(self, hasher: Any, layer: int, tokens: Any, history: Any = None, *,
                      tp_size: Optional[int] = None, tp_rank: Optional[int] = None,
                      heads: Any = None, compressed: bool = False,
                      timeout: Optional[float] = None, array: str = "torch",
                      typed: bool = False) -> Any:
        """submit_tokens(...).wait(timeout): torch.uint8 [positions, heads, 264] viewing the
        arena (see the module's notes on its lifetime). On a session whose default is the
        in-place path (Client's in_place) the rows are gathered as gather() gathers them
        (engram_gather_tokens: in place where the table can be mapped)."""
        if self._in_place_default:
            return self._gather_tokens_now(hasher, layer, tokens, history, tp_size, tp_rank,
                                           heads, compressed, timeout, array, typed)
        ticket = self.submit_tokens(hasher, layer, tokens, history, tp_size=tp_size,
                                    tp_rank=tp_rank, heads=heads, compressed=compressed,
                                    array=array, typed=typed)
        return ticket.wait(timeout)

    @_layer_alias("table")
    def submit_in_arena(self, layer: int, ids: ArenaBuffer, num_rows: int, dest: ArenaBuffer,
                        *, ids_offset: int = 0, dest_offset: int = 0) -> int:
        """Submits a gather whose row ids (uint64) and destination already lie in buffers of
        this session's arena (alloc()): num_rows ids at ids.address + ids_offset, rows written
        to dest.address + dest_offset, 264 bytes each. Returns the request's ticket number for
        wait_request / poll_request; the buffers must stay allocated until it completed.
        Nothing is checked here but the bounds of the buffers: the daemon refuses a bad table
        or row when the request runs (raised by wait_request)."""
        request = self._arena_request(layer, ids, num_rows, dest, ids_offset, dest_offset, 0)
        ticket = ctypes.c_uint64()
        _lib.check(self._lib.engram_submit(self._session(), ctypes.byref(request),
                                           ctypes.byref(ticket)))
        return ticket.value

    @_layer_alias("table")
    def gather_in_arena(self, layer: int, ids: ArenaBuffer, num_rows: int, dest: ArenaBuffer,
                        *, ids_offset: int = 0, dest_offset: int = 0,
                        in_place: Optional[bool] = None,
                        timeout: Optional[float] = None) -> None:
        """submit_in_arena + wait_request in one call (engram_gather). in_place as for
        gather(): None the session's path, True in place (a resident table's rows, a cache-tier
        table's cached rows, copied by this process with no request for them), False the daemon.
        Raises the request's error; on EngramTimeoutError the request stays in flight and the
        buffers must stay allocated until it completes."""
        flags = 0 if in_place is None else \
            _lib.GATHER_IN_PLACE if in_place else _lib.GATHER_VIA_DAEMON
        request = self._arena_request(layer, ids, num_rows, dest, ids_offset, dest_offset, flags)
        _lib.check(self._lib.engram_gather(self._session(), ctypes.byref(request),
                                           _timeout_ns(timeout)))

    def _arena_request(self, layer, ids, num_rows, dest, ids_offset, dest_offset, flags):
        for buffer, offset, nbytes, what in ((ids, ids_offset, num_rows * 8, "row ids"),
                                             (dest, dest_offset, num_rows * _lib.row_bytes(), "rows")):
            if buffer.client is not self or buffer.freed:
                raise InvalidArgumentError(-errno.EINVAL, f"the {what} buffer is not a live "
                                                          f"buffer of this client")
            if offset < 0 or offset + nbytes > buffer.bytes:
                raise InvalidArgumentError(-errno.EINVAL,
                                           f"{num_rows} {what} at offset {offset} exceed the "
                                           f"buffer's {buffer.bytes} bytes")
        return _lib.GatherRequest(
            size=ctypes.sizeof(_lib.GatherRequest), layer=layer, flags=flags,
            rows=ids.address + ids_offset, num_rows=num_rows, dest=dest.address + dest_offset,
            dest_offsets=None)

    def wait_request(self, ticket: int, timeout: Optional[float] = None) -> None:
        """Waits for request `ticket` (from submit_in_arena); raises its error, or
        EngramTimeoutError (the request stays in flight)."""
        rc = self._wait(ticket, _timeout_ns(timeout))
        if rc < 0:
            raise error_for(rc, _lib.last_error())

    def poll_request(self, ticket: int) -> bool:
        """True once request `ticket` completed (its error is raised); never blocks."""
        rc = self._poll(ticket)
        if rc == -errno.EAGAIN:
            return False
        if rc < 0:
            raise error_for(rc, _lib.last_error())
        return True

    def nop(self, timeout: Optional[float] = None) -> float:
        """Round trip through the daemon with an empty request; returns seconds taken."""
        start = time.perf_counter()
        ticket = ctypes.c_uint64()
        _lib.check(self._lib.engram_submit_nop(self._session(), ctypes.byref(ticket)))
        _lib.check(self._lib.engram_wait(self._session(), ticket.value, _timeout_ns(timeout)))
        return time.perf_counter() - start

    def _wait(self, ticket, timeout_ns):
        return self._lib.engram_wait(self._session(), ticket, timeout_ns)

    def _poll(self, ticket):
        return self._lib.engram_poll(self._session(), ticket)


