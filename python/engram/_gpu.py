"""ctypes wrappers of include/engram/gpu.h: arena registration, stream waits, dequant-scatter.

Registration comes from libengram_client (it loads the process's CUDA or HIP runtime at run
time); the kernels from libengram_kernels_cuda.so (or _hip.so). Streams are passed as integers
(torch's stream.cuda_stream), so nothing here synchronises with the host.
"""

import ctypes
import errno
from typing import Dict, Iterable, Optional

from . import _lib
from .errors import EngramError, error_for


def _kernels_check(rc, what):
    if rc < 0:
        raise error_for(rc, f"{what}: {_lib.last_error() or what}")


class Registration:
    """[address, address + length) pinned and mapped for the GPU (engram_gpu_register)."""

    def __init__(self, address: int, length: int):
        self._lib = _lib.gpu_register_lib()
        handle = ctypes.c_void_p()
        rc = self._lib.engram_gpu_register(ctypes.c_void_p(address), length, ctypes.byref(handle))
        if rc < 0:
            message = _lib.last_error()
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
                raise error_for(rc, _lib.last_error() or "engram_gpu_unregister failed")


class Kernels:
    """The kernel library for torch's backend ('cuda' or 'hip')."""

    def __init__(self, backend=None):
        self._lib, self.path = _lib.kernels_lib(backend)
        # The in-place kernels (ENGRAM_KERNELS_0.7): without them every table goes through the
        # arena.
        self.in_place = _lib._declare(self._lib, _lib.IN_PLACE_KERNEL_FUNCTIONS, self.path,
                                      required=False)

    def dequant_gather(self, table, row_begin, num_rows, row_ids, tokens, heads, out,
                       bad_index_count, stream):
        rc = self._lib.engram_dequant_gather(
            ctypes.c_void_p(table), row_begin, num_rows, ctypes.c_void_p(row_ids), tokens, heads,
            ctypes.c_void_p(out), ctypes.c_void_p(bad_index_count or None), stream)
        _kernels_check(rc, "engram_dequant_gather")

    def queue_cache_gather(self, queue, cache, row_ids, tokens, heads, out, misses, miss_dest,
                           stream):
        rc = self._lib.engram_gpu_queue_cache_gather(
            queue, ctypes.byref(cache), ctypes.c_void_p(row_ids), tokens, heads,
            ctypes.c_void_p(out), ctypes.byref(misses), ctypes.c_void_p(miss_dest), None, stream)
        _kernels_check(rc, "engram_gpu_queue_cache_gather")

    def dequant_scatter(self, rows, num_rows, index_map, tokens, heads, out, stream):
        rc = self._lib.engram_dequant_scatter(
            ctypes.c_void_p(rows), num_rows, ctypes.c_void_p(index_map), tokens, heads,
            ctypes.c_void_p(out), None, 0, None, stream)
        _kernels_check(rc, "engram_dequant_scatter")

    def stream_wait_ticket(self, stream, counter, tickets, ring, step_counter):
        rc = self._lib.engram_stream_wait_ticket(stream, ctypes.c_void_p(counter),
                                                 ctypes.c_void_p(tickets), ring,
                                                 ctypes.c_void_p(step_counter))
        _kernels_check(rc, "engram_stream_wait_ticket")


# ---- tables read in place by the GPU -------------------------------------------------------

ROUTE_RESIDENT = "resident"    # engram_dequant_gather from the table's registered mapping
ROUTE_ROW_CACHE = "row cache"  # the hits from the registered row cache, the misses requested
ROUTE_ARENA = "arena"          # gathered by engramd into the session's arena


class GpuTableMap:
    """One layer's table mapped read-only (engram_table_map_open_any) with the device address
    the GPU reads it at: a resident table's rows at `table_d + (row - covered_begin) * 264`, a
    cache-tier table's through `cache` (struct engram_gpu_row_cache). Owned by a GpuTables."""

    def __init__(self, lib, handle, info: "_lib.TableMapInfo"):
        self._lib = lib
        self._handle = handle
        self.layer = int(info.layer)
        self.kind = int(info.kind)
        self.base = int(info.base or 0)
        self.map_bytes = int(info.map_bytes)
        self.covered_begin = int(info.covered_begin)
        self.covered_end = int(info.covered_end)
        self.table_d = None  # resident: the device address of the first covered row
        self.cache = None    # row cache: _lib.GpuRowCache

    @property
    def route(self) -> str:
        return ROUTE_ROW_CACHE if self.kind == _lib.TABLE_MAP_ROW_CACHE else ROUTE_RESIDENT

    def check(self) -> int:
        """0 while the daemon stands behind the mapped rows; -ESTALE (the table was withdrawn:
        a file changed, or the daemon is stopping) or -ENOTCONN (the daemon is gone), for good."""
        if self._handle is None:
            return -errno.EBADF
        return int(self._lib.engram_table_map_check(self._handle))

    def report_hits(self, hit_rows: int, hits, n: int) -> None:
        """engram_table_map_report_hits: hit_rows rows read in place, and n hits (a ctypes array
        of GpuCacheHit) as uses of their slots in the cache's policy."""
        rc = self._lib.engram_table_map_report_hits(self._handle, hit_rows, 0,
                                                    hits if n else None, n)
        _lib.check(rc, f"layer {self.layer}: engram_table_map_report_hits")

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            self._lib.engram_table_map_close(handle)


class CacheBuffers:
    """One cache-tier layer's buffers for engram_gpu_queue_cache_gather over `slots` output
    slots: the misses' list (row ids at miss_ids_d, in the device-submit session's arena where
    the daemon reads them; output slots and count in device memory), the rows the daemon
    gathers for them (miss_dest_d, in that arena), and the hits the kernel records for the
    cache's policy (a running total and the latest call's list)."""

    def __init__(self, torch, device, slots: int, miss_ids_d: int, miss_dest_d: int):
        self.slots = slots
        self.miss_slots = torch.zeros(slots, dtype=torch.int32, device=device)
        self.miss_count = torch.zeros(1, dtype=torch.int32, device=device)
        self.hits = torch.zeros(slots * ctypes.sizeof(_lib.GpuCacheHit), dtype=torch.uint8,
                                device=device)
        self.hit_count = torch.zeros(1, dtype=torch.int32, device=device)
        self.hit_total = torch.zeros(1, dtype=torch.int64, device=device)
        self.reported = 0  # hit_total when report() last read it
        self.used = False  # a call was queued with these buffers
        self.misses = _lib.GpuCacheMisses(
            ctypes.sizeof(_lib.GpuCacheMisses), miss_ids_d, self.miss_slots.data_ptr(),
            self.miss_count.data_ptr(), self.hits.data_ptr(), self.hit_count.data_ptr(),
            self.hit_total.data_ptr())
        self.miss_dest_d = miss_dest_d

    def report(self, table: GpuTableMap) -> int:
        """Reports the hits counted since the last call, and the latest call's list, to table's
        cache (the queued work must have finished); returns the hit rows reported."""
        import numpy as np
        total = int(self.hit_total.item())
        rows, self.reported = total - self.reported, total
        count = min(int(self.hit_count.item()), self.slots)
        size = ctypes.sizeof(_lib.GpuCacheHit)
        hits = self.hits[:count * size].cpu().numpy() if count else np.zeros(size, np.uint8)
        table.report_hits(rows, (_lib.GpuCacheHit * max(count, 1)).from_buffer(hits), count)
        return rows


class GpuTables:
    """The tables of `layers` that the GPU can read in place, mapped through `client`'s session
    and registered with the GPU runtime of the current device: `routes[layer]` is ROUTE_RESIDENT,
    ROUTE_ROW_CACHE or ROUTE_ARENA, and for the last `reasons[layer]` says why. A table engramd
    does not serve from memory (the storage tier: -EOPNOTSUPP) is routed through the arena
    quietly; any other refusal (the library or kernels predate the calls, the table is still
    loading or was withdrawn, the daemon is gone, the GPU runtime refused to register the
    mapping) also routes it through the arena and is named in `warning` (None when there is
    none), for the caller to issue once. Every cache-tier table's map is the same row cache, so
    one registration (the first map's) serves them all (docs/gpu.md). `row_cache=False` maps
    resident tables only (engram_table_map_open), leaving cache-tier ones to the arena quietly.

    Unregister (close) only once no queued GPU work reads the mappings."""

    def __init__(self, client, layers: Iterable[int], kernels_in_place: bool = True, *,
                 row_cache: bool = True):
        self._row_cache = row_cache
        self.maps: Dict[int, GpuTableMap] = {}
        self.routes: Dict[int, str] = {}
        self.reasons: Dict[int, str] = {}
        self._registrations = []
        self._cache_owner: Optional[GpuTableMap] = None
        refused = {}
        try:
            lib = _lib.table_map_lib()
        except EngramError as e:
            lib, refused = None, {layer: e.message for layer in layers}
        if lib is not None and not kernels_in_place:
            refused = {layer: "the kernel library predates engram_gpu_queue_cache_gather "
                              "(ENGRAM_KERNELS_0.7)" for layer in layers}
        for layer in layers:
            if layer in refused:
                continue
            try:
                self.maps[layer] = self._open(lib, client, layer)
                self.routes[layer] = self.maps[layer].route
            except EngramError as e:
                self.routes[layer] = ROUTE_ARENA
                self.reasons[layer] = e.message
                if e.code != -errno.EOPNOTSUPP:
                    refused[layer] = e.message
        for layer, why in refused.items():
            self.routes[layer] = ROUTE_ARENA
            self.reasons[layer] = why
        self.warning = None
        if refused:
            self.warning = ("engram: reading in place on the GPU refused for layer(s) "
                            f"{sorted(refused)}; their rows go through engramd into the arena "
                            "instead: " + "; ".join(f"layer {layer}: {why}"
                                                    for layer, why in sorted(refused.items())))

    def _open(self, lib, client, layer: int) -> GpuTableMap:
        handle = ctypes.c_void_p()
        open_map = lib.engram_table_map_open_any if self._row_cache else lib.engram_table_map_open
        rc = open_map(client._session(), layer, ctypes.byref(handle))
        _lib.check(rc, f"mapping layer {layer}'s table")
        info = _lib.TableMapInfo()
        info.size = ctypes.sizeof(info)
        rc = lib.engram_get_table_map_info(handle, ctypes.byref(info))
        table = GpuTableMap(lib, handle, info)
        registered = len(self._registrations)
        try:
            _lib.check(rc, f"layer {layer}: engram_get_table_map_info")
            rc = table.check()
            if rc < 0:
                raise error_for(rc, f"the mapped table may not be read "
                                    f"({errno.errorcode.get(-rc, rc)}: withdrawn, or engramd "
                                    f"is gone)")
            if table.kind == _lib.TABLE_MAP_RESIDENT:
                reg = self._register(table)
                table.table_d = reg.device_ptr(table.base)
            elif table.kind == _lib.TABLE_MAP_ROW_CACHE:
                self._attach_cache(lib, table)
            else:
                raise error_for(-errno.EPROTO, f"layer {layer}: a table map of unknown kind "
                                               f"{table.kind}")
        except BaseException:
            # Unregister what this table registered before its mapping goes away.
            while len(self._registrations) > registered:
                self._registrations.pop().unregister()
            if self._cache_owner is table:
                self._cache_owner = None
            table.close()
            raise
        return table

    def _register(self, table: GpuTableMap) -> Registration:
        reg = Registration(table.base, table.map_bytes)
        self._registrations.append(reg)
        return reg

    def _attach_cache(self, lib, table: GpuTableMap) -> None:
        """The row cache as the kernels read it: registered once, through the first map."""
        owner = self._cache_owner
        if owner is None:
            reg = self._register(table)
            cache = _lib.GpuRowCache()
            cache.size = ctypes.sizeof(cache)
            rc = lib.engram_table_map_gpu_cache(table._handle, reg._handle, ctypes.byref(cache))
            _lib.check(rc, f"layer {table.layer}: engram_table_map_gpu_cache")
            table.cache = cache
            self._cache_owner = table
            return
        cache = _lib.GpuRowCache()
        ctypes.memmove(ctypes.byref(cache), ctypes.byref(owner.cache), ctypes.sizeof(cache))
        cache.layer = table.layer
        cache.covered_begin, cache.covered_end = table.covered_begin, table.covered_end
        table.cache = cache

    def stale(self) -> Dict[int, int]:
        """{layer: -ESTALE or -ENOTCONN} of the layers read in place whose rows may no longer be
        read (engram_table_map_check: two loads from shared memory each)."""
        out = {}
        for layer, table in self.maps.items():
            if self.routes.get(layer) != ROUTE_ARENA:
                rc = table.check()
                if rc < 0:
                    out[layer] = rc
        return out

    def close(self) -> None:
        """Unregisters and unmaps; no queued GPU work may still read them. Idempotent."""
        registrations, self._registrations = self._registrations, []
        first_error = None
        for reg in registrations:
            try:
                reg.unregister()
            except EngramError as e:
                first_error = first_error or e
        maps, self.maps = self.maps, {}
        for table in maps.values():
            table.close()
        if first_error is not None:
            raise first_error
