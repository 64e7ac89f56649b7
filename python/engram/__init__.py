"""engram: use engramd (DeepSeek-V4.1 Engram rows over shared memory) from Python and PyTorch.

    import engram
    with engram.Client() as client:
        rows = client.gather(14, [3, 1, 4])      # torch.uint8 [3, 264], zero-copy
        ticket = client.submit(1, ids)           # asynchronous
        more = ticket.wait(timeout=1.0)

    lookup = engram.EngramLookup(layers=[1, 14], heads=24, max_tokens=512)
    lookup.prepare({1: ids_1, 14: ids_14})      # at forward entry
    emb = lookup.get(14)                        # bf16 [tokens, 24, 256] on the current stream

    hasher = engram.Hasher("/models/DeepSeek-V4.1-Flash")   # host-side n-gram hashing
    ids = hasher.hash(tokens, history=last3, layer=14)      # int64 [positions, 24]
    rows = client.gather_tokens(hasher, 14, tokens, history=last3)  # uint8 [positions, 24, 264]

A thin layer over libengram_client's C ABI (include/engram/engram.h, gpu.h) through ctypes;
docs/python.md describes it in full.
"""

from . import _lib
from .client import (DEFAULT_SOCKET, Client, SessionStats, TableInfo, Ticket, library_path,
                     protocol_version)
from .dequant import dequantize_rows, dequantize_scatter
from .errors import (EngramConnectionError, EngramError, EngramIOError, EngramPermissionError,
                     EngramTimeoutError, GpuUnavailableError, HashTablesError,
                     InvalidArgumentError, LibraryNotFoundError, ModelFileNotFoundError,
                     NoVocabularyError, ProtocolError, ResourceExhaustedError,
                     RowOutOfRangeError, UnknownTableError)
from .hasher import Hasher
from .lookup import EngramLookup

__version__ = "0.1.0"

__all__ = [
    "Client", "Ticket", "TableInfo", "SessionStats", "EngramLookup", "DEFAULT_SOCKET",
    "ROW_BYTES", "library_path", "protocol_version", "dequantize_rows", "dequantize_scatter",
    "EngramError", "LibraryNotFoundError", "EngramConnectionError", "EngramPermissionError",
    "InvalidArgumentError", "UnknownTableError", "RowOutOfRangeError", "ResourceExhaustedError",
    "EngramTimeoutError", "ProtocolError", "EngramIOError", "GpuUnavailableError", "Hasher",
    "ModelFileNotFoundError", "HashTablesError", "NoVocabularyError",
]


def __getattr__(name):
    # ROW_BYTES (264) comes from libengram_client's engram_row_bytes(), read on first use.
    if name == "ROW_BYTES":
        return _lib.row_bytes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
