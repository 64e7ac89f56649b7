"""engram: use engramd (DeepSeek-V4.1 Engram rows over shared memory) from Python and PyTorch.

    import engram
    with engram.Client() as client:
        rows = client.gather(14, [3, 1, 4])      # torch.uint8 [3, 264], zero-copy
        values, scales, _ = client.gather(14, [3], typed=True)  # float8_e4m3fn, uint8 E8M0
        arr = client.gather(14, [3], array="numpy")             # numpy.uint8, no torch
        ticket = client.submit(1, ids)           # asynchronous
        more = ticket.wait(timeout=1.0)

    lookup = engram.EngramLookup(layers=[1, 14], heads=24, max_tokens=512)
    lookup.prepare({1: ids_1, 14: ids_14})      # at forward entry
    emb = lookup.get(14)                        # bf16 [tokens, 24, 256] on the current stream
    emb = lookup.embeddings(14, input_ids)      # the same as torch.ops.engram.gather_wait:
                                                # torch.compile(fullgraph=True) traces it

    hasher = engram.Hasher("/models/DeepSeek-V4.1-Flash")   # host-side n-gram hashing
    ids = hasher.hash(tokens, history=last3, layer=14)      # int64 [positions, 24]

A thin layer over libengram_client's C ABI (include/engram/engram.h, gpu.h) through ctypes;
docs/python.md describes it in full. `import engram` needs only NumPy: torch is imported when a
torch feature is first used (EngramLookup, dequantize_rows, engram.ops, torch results).
`python -m engram` prints the library loaded, the daemon's status and its tables.
"""

from typing import Any

from . import _lib
from .client import (ARRAY_KINDS, DEFAULT_SOCKET, ArenaBuffer, Client, SessionStats, TableInfo,
                     Ticket, library_path, protocol_version)
from .errors import (AdmissionUnsupportedError, EngramConnectionError, EngramError,
                     EngramIOError, EngramPermissionError, EngramTimeoutError,
                     GpuUnavailableError, HashTablesError,
                     InvalidArgumentError, LibraryNotFoundError, ModelFileNotFoundError,
                     NoVocabularyError, PrefetchUnsupportedError, ProtocolError,
                     ResourceExhaustedError, RowOutOfRangeError, UnknownTableError)
from .hasher import Hasher
from .views import (Float8UnavailableError, RowView, decode_e4m3, decode_e8m0,
                    dequantize_numpy, split_rows)

# The release: meson.build's project version, which meson writes into engram/_version.py when it
# installs the package or packs the wheel; a source checkout on PYTHONPATH reads meson.build.
try:
    from ._version import __version__
except ImportError:
    from ._checkout import checkout_version as _checkout_version
    __version__ = _checkout_version()

# Names whose modules import torch: loaded on first use (PEP 562).
_LAZY = {
    "EngramLookup": "lookup",
    "GpuDecodeStep": "gpu_step",
    "dequantize_rows": "dequant",
    "dequantize_scatter": "dequant",
    "ops": None,
}


def __getattr__(name: str) -> Any:
    if name == "ROW_BYTES":  # from libengram_client's engram_row_bytes(), read on first use
        return _lib.row_bytes()
    if name not in _LAZY:
        raise AttributeError(f"module 'engram' has no attribute {name!r}")
    import importlib
    module = importlib.import_module(f".{_LAZY[name] or name}", __name__)
    value = module if _LAZY[name] is None else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | {"ROW_BYTES"})


__all__ = [
    "Client", "Ticket", "TableInfo", "SessionStats", "ArenaBuffer", "EngramLookup",
    "GpuDecodeStep",
    "DEFAULT_SOCKET", "ROW_BYTES", "ARRAY_KINDS", "library_path", "protocol_version",
    "dequantize_rows", "dequantize_scatter", "split_rows", "RowView", "decode_e4m3",
    "decode_e8m0", "dequantize_numpy", "Float8UnavailableError",
    "EngramError", "LibraryNotFoundError", "EngramConnectionError", "EngramPermissionError",
    "InvalidArgumentError", "UnknownTableError", "RowOutOfRangeError", "ResourceExhaustedError",
    "EngramTimeoutError", "ProtocolError", "EngramIOError", "GpuUnavailableError", "Hasher",
    "ModelFileNotFoundError", "HashTablesError", "NoVocabularyError", "PrefetchUnsupportedError",
    "AdmissionUnsupportedError",
]
