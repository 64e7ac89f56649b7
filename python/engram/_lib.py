"""Finds and loads libengram_client (and the GPU kernel library) and declares their C ABI.

Search order for libengram_client.so (the first that exists is loaded):
  1. $ENGRAM_CLIENT_LIB: the library file itself (an error if it does not load);
  2. $ENGRAM_LIB_DIR: a folder holding it (e.g. a bundle of built libraries);
  3. next to the package (engram/lib/ or engram/), for self-contained installs;
  4. the library folder recorded by `meson install` (engram/_install_paths.py);
  5. a meson build folder: $ENGRAM_BUILD_DIR, else build*/ of the source tree this package
     sits in (the newest library wins);
  6. the system's library path (ldconfig, LD_LIBRARY_PATH).
The kernel library (libengram_kernels_cuda.so or _hip.so) is found the same way, with
$ENGRAM_KERNELS_LIB in place of $ENGRAM_CLIENT_LIB and kernels/ in place of client/.
"""

import ctypes
import functools
import ctypes.util
import os
import pathlib
import threading
import warnings

from .errors import GpuUnavailableError, LibraryNotFoundError, error_for

ROW_VALUES = 256
BLOCK_VALUES = 32

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent

c_size_t = ctypes.c_size_t
c_u32 = ctypes.c_uint32
c_u64 = ctypes.c_uint64
c_i64 = ctypes.c_int64
c_int = ctypes.c_int
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p
c_uintptr = ctypes.c_size_t  # uintptr_t on every platform CPython supports here


def _alias(field):
    """A property naming a struct field by its deprecated C name (engram.h, convention 9: the
    table's id is `layer`; `table` and `layer_id` are older names of the same field). Each use
    warns (DeprecationWarning), as the C compiler warns of the C name."""
    def warn(self):
        warnings.warn(f"{type(self).__name__}: this field's name is deprecated, use .{field}",
                      DeprecationWarning, stacklevel=3)

    def get(self):
        warn(self)
        return getattr(self, field)

    def set_(self, value):
        warn(self)
        setattr(self, field, value)
    return property(get, set_)


class ConnectOptions(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("socket_path", c_char_p),
        ("data_bytes", c_u64),
        ("slots", c_u32),
        ("spin_ns", c_u32),
        ("client_name", c_char_p),
        ("timeout_ns", c_i64),
        ("flags", c_u32),
        ("reserved", c_u32),
    ]


CONNECT_DEVICE_SUBMIT = 1  # ENGRAM_CONNECT_DEVICE_SUBMIT
CONNECT_GATHER_VIA_DAEMON = 2  # ENGRAM_CONNECT_GATHER_VIA_DAEMON


class GatherRequest(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("layer", c_u32),
        ("flags", c_u32),
        ("rows", c_void_p),
        ("num_rows", c_u64),
        ("dest", c_void_p),
        ("dest_offsets", c_void_p),
    ]
    table = _alias("layer")


class TableInfoStruct(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("layer", c_u32),
        ("row_bytes", c_u32),
        ("num_rows", c_u64),
        ("covered_begin", c_u64),
        ("covered_end", c_u64),
        ("layout", c_u32),
        ("files", c_u32),
        ("data_bytes", c_u64),
        ("tier", c_u32),
        ("reserved", c_u32),
    ]
    layer_id = _alias("layer")


@functools.lru_cache(maxsize=None)
def session_stats_fields():
    """((name, help), ...) of struct engram_session_stats after `size`, in order, as the loaded
    library declares them (engram_session_stats_field; the list is engram/session_stats.h)."""
    lib = client_lib()
    if not hasattr(lib, "engram_session_stats_field"):
        raise LibraryNotFoundError(
            0, f"{client_lib_path()} does not export engram_session_stats_field (ENGRAM_0.6): "
               f"it predates this package's statistics; use the library built with it")
    fields = []
    name, help_text = c_char_p(), c_char_p()
    while lib.engram_session_stats_field(len(fields), ctypes.byref(name),
                                         ctypes.byref(help_text)) == 0:
        fields.append((name.value.decode(), help_text.value.decode()))
    if not fields or fields[0][0] != "session_id":
        raise LibraryNotFoundError(
            0, f"{client_lib_path()}: engram_session_stats_field names no session_id first")
    return tuple(fields)


@functools.lru_cache(maxsize=None)
def session_stats_struct():
    """struct engram_session_stats as a ctypes.Structure: size, then a uint64_t per field."""
    fields = [("size", c_size_t)] + [(name, c_u64) for name, _ in session_stats_fields()]
    return type("SessionStatsStruct", (ctypes.Structure,), {"_fields_": fields})


# ---- host-side hashing (engram/hash.h) and the combined submit (engram.h, ENGRAM_0.3) ----

class HasherOpts(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("flags", c_u32),
        ("reserved", c_u32),
        ("derived_path", c_char_p),
        ("compressed_pad_id", c_i64),
    ]


HASHER_INFO_FIELDS = ("num_layers", "max_ngram_size", "heads_per_order", "heads_per_layer",
                      "vocab_size", "compressed_vocab_size", "compressed_pad_id")


class HasherInfo(ctypes.Structure):
    _fields_ = [("size", c_size_t)] + [(name, c_u32) for name in HASHER_INFO_FIELDS]


class HashLayerInfo(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("layer", c_u32),
        ("reserved", c_u32),
        ("num_rows", c_u64),
    ]
    layer_id = _alias("layer")


class HashSeq(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("tokens", c_void_p),
        ("n_tokens", c_size_t),
        ("history", c_void_p),
        ("n_history", c_size_t),
    ]


class TokenRequest(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("layer", c_u32),
        ("flags", c_u32),
        ("seqs", c_void_p),
        ("n_seqs", c_size_t),
        ("head_begin", c_u32),
        ("head_end", c_u32),
        ("tp_size", c_u32),
        ("tp_rank", c_u32),
        ("rows", c_void_p),
        ("rows_cap", c_u64),
        ("dest", c_void_p),
    ]
    table = _alias("layer")


# ---- table maps read in place by a GPU (engram.h ENGRAM_0.6-0.7, gpu.h) ----------------------

class TableMapInfo(ctypes.Structure):
    """struct engram_table_map_info (56 bytes); `base` is the host address of the mapping."""
    _fields_ = [
        ("size", c_size_t),
        ("layer", c_u32),
        ("row_bytes", c_u32),
        ("covered_begin", c_u64),
        ("covered_end", c_u64),
        ("base", c_void_p),
        ("map_bytes", c_u64),
        ("kind", c_u32),
        ("reserved", c_u32),
    ]
    layer_id = _alias("layer")


TABLE_MAP_RESIDENT = 0  # ENGRAM_TABLE_MAP_RESIDENT
TABLE_MAP_ROW_CACHE = 1  # ENGRAM_TABLE_MAP_ROW_CACHE


class GpuRowCache(ctypes.Structure):
    """struct engram_gpu_row_cache (72 bytes): a row cache as a kernel looks rows up in it."""
    _fields_ = [
        ("size", c_size_t),
        ("cache", c_void_p),
        ("layer", c_u32),
        ("bucket_count", c_u32),
        ("buckets_offset", c_u64),
        ("slots_offset", c_u64),
        ("max_slots", c_u32),
        ("slot_bytes", c_u32),
        ("covered_begin", c_u64),
        ("covered_end", c_u64),
        ("guard_page_bytes", c_u32),
        ("reserved", c_u32),
    ]


class GpuCacheHit(ctypes.Structure):
    """struct engram_gpu_cache_hit (16 bytes): a hit for the cache's policy."""
    _fields_ = [("key", c_u64), ("slot", c_u32), ("reserved", c_u32)]


class GpuCacheMisses(ctypes.Structure):
    """struct engram_gpu_cache_misses (56 bytes): where a cache lookup lists what it missed
    (device pointers)."""
    _fields_ = [
        ("size", c_size_t),
        ("rows", c_void_p),
        ("slots", c_void_p),
        ("count", c_void_p),
        ("hits", c_void_p),
        ("hit_count", c_void_p),
        ("hit_total", c_void_p),
    ]


# The sizes the C headers assert (ENGRAM_ASSERT_SIZE); struct_sizes_ok() compares them.
C_STRUCT_SIZES = {
    "TableMapInfo": 56, "GpuRowCache": 72, "GpuCacheHit": 16, "GpuCacheMisses": 56,
    "GatherRequest": 48,
}


def struct_size_mismatches():
    """[(name, ctypes size, C size)] of the structs above whose ctypes layout is not the C one
    (empty on every platform this package supports: LP64)."""
    return [(name, ctypes.sizeof(globals()[name]), size) for name, size in C_STRUCT_SIZES.items()
            if ctypes.sizeof(globals()[name]) != size]


HASHER_COMPRESSED_ONLY = 1
HASH_COMPRESSED_IDS = 1
GATHER_IN_PLACE = 1  # ENGRAM_GATHER_IN_PLACE
GATHER_VIA_DAEMON = 2  # ENGRAM_GATHER_VIA_DAEMON


_P = ctypes.POINTER

# name: (restype, argtypes)
_CLIENT_FUNCTIONS = {
    "engram_connect_options_init": (None, [_P(ConnectOptions), c_size_t]),
    "engram_last_error": (c_char_p, []),
    "engram_data_region": (c_int, [c_void_p, _P(c_void_p), _P(c_u64)]),
    "engram_arena": (c_int, [c_void_p, _P(c_void_p), _P(c_u64)]),
    "engram_alloc": (c_int, [c_void_p, c_u64, _P(c_void_p)]),
    "engram_free": (c_int, [c_void_p, c_void_p]),
    "engram_submit": (c_int, [c_void_p, _P(GatherRequest), _P(c_u64)]),
    "engram_submit_nop": (c_int, [c_void_p, _P(c_u64)]),
    "engram_gather": (c_int, [c_void_p, _P(GatherRequest), c_i64]),
    "engram_wait": (c_int, [c_void_p, c_u64, c_i64]),
    "engram_poll": (c_int, [c_void_p, c_u64]),
    "engram_completion_counter": (c_int, [c_void_p, _P(c_void_p)]),
    "engram_list_tables": (c_int, [c_void_p, _P(TableInfoStruct), c_size_t, _P(c_size_t)]),
    "engram_get_session_stats": (c_int, [c_void_p, c_void_p]),
    "engram_protocol_version": (None, [_P(c_u32), _P(c_u32)]),
    "engram_row_bytes": (c_u32, []),
}

# Since ENGRAM_0.6 (engram.h, convention 8), each with the older name it replaces: a library
# without the new name gets it as an alias of the old one, so callers use the new names only.
# The older names are deprecated in C; they are looked up here only in a library that lacks the
# new ones (one built before ENGRAM_0.6).
_RENAMED = {
    "engram_session_open": "engram_connect",
    "engram_session_close": "engram_close",
    "engram_table_map_open": "engram_map_table",
    "engram_table_map_close": "engram_unmap_table",
}
_RENAMED_FUNCTIONS = {
    "engram_session_open": (c_int, [_P(ConnectOptions), _P(c_void_p)]),
    "engram_session_close": (None, [c_void_p]),
    "engram_table_map_open": (c_int, [c_void_p, c_u32, _P(c_void_p)]),
    "engram_table_map_close": (None, [c_void_p]),
}
_RENAMED_REQUIRED = ("engram_session_open", "engram_session_close")

# Since ENGRAM_0.5: a library without it still loads; Client.prefetch says what is missing.
_PREFETCH_FUNCTIONS = {
    "engram_prefetch": (c_int, [c_void_p, c_u32, c_void_p, c_u64, c_u32, _P(c_u64)]),
}

# Since ENGRAM_0.8: a library without them still loads; Client.admit says what is missing.
_ADMIT_FUNCTIONS = {
    "engram_admit": (c_int, [c_void_p, c_u64, c_u32, c_void_p, c_u64, c_u64, _P(c_u64)]),
    "engram_admit_done": (c_int, [c_void_p, c_u64, _P(c_int)]),
}

# Since ENGRAM_0.6: a library without it still loads; Client.stats says what is missing.
_STATS_FIELD_FUNCTIONS = {
    "engram_session_stats_field": (c_int, [c_size_t, _P(c_char_p), _P(c_char_p)]),
}

_HASH_FUNCTIONS = {
    "engram_hasher_opts_init": (None, [_P(HasherOpts), c_size_t]),
    "engram_hasher_open": (c_int, [c_char_p, _P(HasherOpts), _P(c_void_p)]),
    "engram_hasher_close": (None, [c_void_p]),
    "engram_hasher_get_info": (c_int, [c_void_p, _P(HasherInfo)]),
    "engram_hasher_get_layer": (c_int, [c_void_p, c_u32, _P(HashLayerInfo)]),
    "engram_hasher_rank_heads": (c_int, [c_void_p, c_u32, c_u32, _P(c_u32), _P(c_u32)]),
    "engram_hasher_head_rows": (c_int, [c_void_p, c_u32, c_u32, c_u32, _P(c_u64), _P(c_u64)]),
    "engram_hash": (c_int, [c_void_p, c_u32, c_void_p, c_size_t, c_u32, c_u32, c_u32, c_void_p,
                            c_size_t]),
    "engram_hash_compress": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p]),
}

_TOKEN_FUNCTIONS = {
    "engram_submit_tokens": (c_int, [c_void_p, c_void_p, _P(TokenRequest), _P(c_u64),
                                     _P(c_u64)]),
    "engram_gather_tokens": (c_int, [c_void_p, c_void_p, _P(TokenRequest), c_i64]),
}

_GPU_REGISTER_FUNCTIONS = {
    "engram_gpu_register": (c_int, [c_void_p, c_size_t, _P(c_void_p)]),
    "engram_gpu_device_ptr": (c_void_p, [c_void_p, c_void_p]),
    "engram_gpu_registration_runtime": (c_int, [c_void_p]),
    "engram_gpu_unregister": (c_int, [c_void_p]),
}

# Since ENGRAM_0.7: a library without them still loads; the GPU paths then gather every table
# into the arena (table_map_lib says what is missing).
_TABLE_MAP_FUNCTIONS = {
    "engram_table_map_open_any": (c_int, [c_void_p, c_u32, _P(c_void_p)]),
    "engram_get_table_map_info": (c_int, [c_void_p, _P(TableMapInfo)]),
    "engram_table_map_check": (c_int, [c_void_p]),
    "engram_table_map_gpu_cache": (c_int, [c_void_p, c_void_p, _P(GpuRowCache)]),
    "engram_table_map_report_hits": (c_int, [c_void_p, c_u64, c_u64, _P(GpuCacheHit), c_size_t]),
}

# Kernels reading tables in place (ENGRAM_KERNELS_0.6 / 0.7), declared by _gpu.InPlaceKernels.
IN_PLACE_KERNEL_FUNCTIONS = {
    "engram_dequant_gather": (c_int, [c_void_p, c_u64, c_u64, c_void_p, c_u32, c_u32, c_void_p,
                                      c_void_p, c_uintptr]),
    "engram_dequant_cache_gather": (c_int, [_P(GpuRowCache), c_void_p, c_u32, c_u32, c_void_p,
                                            _P(GpuCacheMisses), c_void_p, c_uintptr]),
    "engram_gpu_queue_cache_gather": (c_int, [c_void_p, _P(GpuRowCache), c_void_p, c_u32, c_u32,
                                              c_void_p, _P(GpuCacheMisses), c_void_p, c_void_p,
                                              c_uintptr]),
}

_KERNEL_FUNCTIONS = {
    "engram_dequant_scatter": (c_int, [c_void_p, c_u32, c_void_p, c_u32, c_u32, c_void_p,
                                       c_void_p, c_size_t, c_void_p, c_uintptr]),
    "engram_stream_wait_value64": (c_int, [c_uintptr, c_void_p, c_u64, _P(c_uintptr)]),
    "engram_stream_wait_ticket": (c_int, [c_uintptr, c_void_p, c_void_p, c_u32, c_void_p]),
    "engram_kernels_backend": (c_char_p, []),
}


def _declare(lib, functions, path, required=True):
    missing = []
    for name, (restype, argtypes) in functions.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    if missing and required:
        raise LibraryNotFoundError(
            0, f"{path} does not export {', '.join(missing)}: it is not the library this "
               f"package expects (rebuild it, or point the environment at the right one)")
    return not missing


def _declare_renamed(lib, path=None):
    """Declares the ENGRAM_0.6 names, falling back on their older names in an older library.
    ctypes returns a new function object per name, so each is declared under both. A library
    with neither name of a session call is not one this package can use."""
    for new, old in _RENAMED.items():
        restype, argtypes = _RENAMED_FUNCTIONS[new]
        try:
            fn = getattr(lib, new)
        except AttributeError:
            try:
                fn = getattr(lib, old)
            except AttributeError:
                if new in _RENAMED_REQUIRED:
                    raise LibraryNotFoundError(
                        0, f"{path or lib} exports neither {new} nor {old}: it is not the "
                           f"library this package expects") from None
                continue  # neither (engram_map_table came in ENGRAM_0.4)
            setattr(lib, new, fn)
        fn.restype = restype
        fn.argtypes = argtypes


def _source_tree_build_dirs():
    """build*/ folders of the source tree this package sits in (python/engram/ in the repo)."""
    root = _PACKAGE_DIR.parent.parent
    if not (root / "include" / "engram" / "engram.h").is_file():
        return []
    return sorted(p for p in root.glob("build*") if (p / "build.ninja").is_file())


def _installed_libdir():
    try:
        from . import _install_paths  # written by `meson install`
    except ImportError:
        return None
    return pathlib.Path(_install_paths.LIBDIR)


def _candidates(file_names, build_subdir):
    """(where, path) pairs to try, in the documented order; env_file wins outright."""
    found = []
    lib_dir = os.environ.get("ENGRAM_LIB_DIR")
    if lib_dir:
        found += [("$ENGRAM_LIB_DIR", pathlib.Path(lib_dir) / n) for n in file_names]
    for folder in (_PACKAGE_DIR / "lib", _PACKAGE_DIR):
        found += [("next to the package", folder / n) for n in file_names]
    libdir = _installed_libdir()
    if libdir is not None:
        found += [("meson install libdir", libdir / n) for n in file_names]
    build_dir = os.environ.get("ENGRAM_BUILD_DIR")
    builds = [pathlib.Path(build_dir)] if build_dir else _source_tree_build_dirs()
    in_builds = [b / build_subdir / n for b in builds for n in file_names]
    in_builds = [p for p in in_builds if p.is_file()]
    in_builds.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    found += [("meson build folder", p) for p in in_builds]
    return found


def _load(kind, file_names, env_file, build_subdir):
    """Loads the first library found; raises LibraryNotFoundError naming every place tried."""
    explicit = os.environ.get(env_file)
    if explicit:
        try:
            return ctypes.CDLL(explicit), explicit
        except OSError as e:
            raise LibraryNotFoundError(0, f"${env_file}={explicit} cannot be loaded: {e}") from e
    tried = []
    for where, path in _candidates(file_names, build_subdir):
        if not path.is_file():
            tried.append(f"{path} ({where}: absent)")
            continue
        try:
            return ctypes.CDLL(str(path)), str(path)
        except OSError as e:
            tried.append(f"{path} ({where}: {e})")
    for name in file_names + [ctypes.util.find_library(file_names[0][3:].split(".so")[0])]:
        if not name:
            continue
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            tried.append(f"{name} (system library path: {e})")
    raise LibraryNotFoundError(
        0, f"cannot find {kind} {file_names[0]}; set ${env_file} to the library file, "
           f"$ENGRAM_LIB_DIR to its folder or $ENGRAM_BUILD_DIR to a meson build folder. "
           f"Tried: " + "; ".join(dict.fromkeys(tried)))


_lock = threading.Lock()
_client = None
_client_path = None
_gpu_register = None
_kernels = {}


def client_lib():
    """The loaded libengram_client (ctypes.CDLL), declared."""
    global _client, _client_path
    with _lock:
        if _client is None:
            lib, path = _load("the engram client library",
                              ["libengram_client.so", "libengram_client.so.0"],
                              "ENGRAM_CLIENT_LIB", "client")
            _declare(lib, _CLIENT_FUNCTIONS, path)
            _declare_renamed(lib, path)
            _declare(lib, _PREFETCH_FUNCTIONS, path, required=False)
            _declare(lib, _ADMIT_FUNCTIONS, path, required=False)
            _declare(lib, _STATS_FIELD_FUNCTIONS, path, required=False)
            _declare(lib, _TABLE_MAP_FUNCTIONS, path, required=False)
            _client, _client_path = lib, path
        return _client


def client_lib_path():
    client_lib()
    return _client_path


@functools.lru_cache(maxsize=None)
def row_bytes():
    """Bytes per gathered row (264), as libengram_client defines it (engram_row_bytes)."""
    return int(client_lib().engram_row_bytes())


def __getattr__(name):
    # ROW_BYTES is read from the library on first use, so that importing needs no library.
    if name == "ROW_BYTES":
        return row_bytes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def last_error():
    message = client_lib().engram_last_error()
    return message.decode("utf-8", "replace") if message else ""


def check(rc, what=None):
    """Raises the exception for a negative return code with the library's message."""
    if rc < 0:
        message = last_error() or (what or "engram call failed")
        raise error_for(rc, message)
    return rc


def table_map_lib():
    """libengram_client with the table-map calls a GPU reads tables in place through
    (ENGRAM_0.7); LibraryNotFoundError naming what an older library lacks."""
    lib = client_lib()
    missing = [name for name in _TABLE_MAP_FUNCTIONS if not hasattr(lib, name)]
    if missing:
        raise LibraryNotFoundError(
            0, f"{_client_path} does not export {', '.join(missing)} (ENGRAM_0.7): it predates "
               f"reading tables in place on the GPU")
    return lib


def gpu_register_lib():
    """The library exporting engram_gpu_register & co.: libengram_client, else the kernels."""
    global _gpu_register
    with _lock:
        if _gpu_register is not None:
            return _gpu_register
    lib = client_lib()
    if _declare(lib, _GPU_REGISTER_FUNCTIONS, _client_path, required=False):
        _gpu_register = lib
        return lib
    kernels, path = kernels_lib()
    if _declare(kernels, _GPU_REGISTER_FUNCTIONS, path, required=False):
        _gpu_register = kernels
        return kernels
    raise GpuUnavailableError(
        0, f"neither {_client_path} nor {path} exports engram_gpu_register "
           f"(include/engram/gpu.h): the client library was built without GPU registration")


def kernels_lib(backend=None):
    """(CDLL, path) of libengram_kernels_<backend>.so; backend 'cuda' or 'hip' (torch's)."""
    if backend is None:
        import torch
        backend = "hip" if getattr(torch.version, "hip", None) else "cuda"
    # The kernel library links libengram_client (one engram_last_error for both): load that
    # first, from wherever it was found, so the loader resolves the kernels' dependency on it.
    client_lib()
    with _lock:
        if backend not in _kernels:
            name = f"libengram_kernels_{backend}.so"
            try:
                lib, path = _load(f"the {backend.upper()} kernel library", [name],
                                  "ENGRAM_KERNELS_LIB", "kernels")
            except LibraryNotFoundError as e:
                raise GpuUnavailableError(0, e.message) from e
            _declare(lib, _KERNEL_FUNCTIONS, path)
            _kernels[backend] = (lib, path)
        return _kernels[backend]


_hash_declared = None


def hash_lib():
    """libengram_client with the hashing functions (ENGRAM_0.2) and the combined submit
    (ENGRAM_0.3) declared; LibraryNotFoundError naming what is missing from an older one."""
    global _hash_declared
    lib = client_lib()
    with _lock:
        if _hash_declared is None:
            _declare(lib, {**_HASH_FUNCTIONS, **_TOKEN_FUNCTIONS}, _client_path)
            _hash_declared = True
    return lib


def hash_last_error():
    """Deprecated: last_error(), which the hashing functions report through too."""
    message = hash_lib().engram_last_error()
    return message.decode("utf-8", "replace") if message else ""
