"""torch custom ops of the engram package, so that compiled models keep Engram in their graph.

    torch.ops.engram.dequantize(rows)                  # uint8 [..., 264] -> bf16 [..., 256]
    torch.ops.engram.gather_wait(tokens, lookup, layer)
        # EngramLookup.embeddings(layer, tokens): the prepared step's bf16 [tokens, heads, 256]
        # of `layer`, after waiting for its rows (on a GPU: a stream wait queued on the current
        # stream, no host wait); `tokens` is any tensor on the lookup's device whose first
        # dimension is the step's token count; `lookup` is EngramLookup.op_id.

Both have fake (meta) implementations that give the output's shape, dtype and device without
touching the daemon, so torch.compile(fullgraph=True) traces a model through them without a
graph break, and torch.cuda.graphs can capture gather_wait (its work is two launches on the
current stream). They are registered with torch.library.custom_op where it takes a schema
(torch 2.4+), else with torch.library.Library define/impl and a Meta kernel (Debian's 1.13).
Importing this module registers them; `import engram` alone does not import torch.
"""

import inspect
import itertools
import threading
import weakref
from typing import Any, Callable

import torch

from . import _lib
from .dequant import ROW_VALUES, dequantize_rows

_lookups: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_ids = itertools.count(1)
_lock = threading.Lock()


def register_lookup(lookup: Any) -> int:
    """A number naming `lookup` to gather_wait for as long as it is alive."""
    with _lock:
        op_id = next(_ids)
        _lookups[op_id] = lookup
        return op_id


def _lookup(op_id: int) -> Any:
    lookup = _lookups.get(op_id)
    if lookup is None:
        raise ValueError(f"torch.ops.engram.gather_wait: no live EngramLookup has op_id {op_id}")
    return lookup


# ---- implementations ---------------------------------------------------------------------------

def _dequantize(rows: torch.Tensor) -> torch.Tensor:
    if rows.dtype != torch.uint8 or rows.dim() < 1 or rows.shape[-1] != _lib.row_bytes():
        raise ValueError(f"torch.ops.engram.dequantize: rows must be uint8 [..., {_lib.row_bytes()}], "
                         f"got {rows.dtype} {list(rows.shape)}")
    lead = rows.shape[:-1]
    return dequantize_rows(rows.reshape(-1, _lib.row_bytes())).reshape(*lead, ROW_VALUES)


def _dequantize_fake(rows: torch.Tensor) -> torch.Tensor:
    if rows.dtype != torch.uint8 or rows.dim() < 1 or rows.shape[-1] != _lib.row_bytes():
        raise ValueError(f"torch.ops.engram.dequantize: rows must be uint8 [..., {_lib.row_bytes()}], "
                         f"got {rows.dtype} {list(rows.shape)}")
    return rows.new_empty((*rows.shape[:-1], ROW_VALUES), dtype=torch.bfloat16)


def _gather_wait(tokens: torch.Tensor, lookup: int, layer: int) -> torch.Tensor:
    return _lookup(lookup)._op_result(layer, int(tokens.shape[0]))


def _gather_wait_fake(tokens: torch.Tensor, lookup: int, layer: int) -> torch.Tensor:
    found = _lookup(lookup)
    if layer not in found.layers:
        raise ValueError(f"torch.ops.engram.gather_wait: layer {layer} is not one of "
                         f"{found.layers}")
    return tokens.new_empty((tokens.shape[0], found.heads, ROW_VALUES), dtype=torch.bfloat16)


_SCHEMAS = {
    "dequantize": ("(Tensor rows) -> Tensor", _dequantize, _dequantize_fake),
    "gather_wait": ("(Tensor tokens, int lookup, int layer) -> Tensor", _gather_wait,
                    _gather_wait_fake),
}

# ---- registration ------------------------------------------------------------------------------

def _custom_op_takes_a_schema() -> bool:
    custom_op = getattr(torch.library, "custom_op", None)
    if custom_op is None or not hasattr(torch.library, "register_fake"):
        return False
    try:
        return "schema" in inspect.signature(custom_op).parameters
    except (TypeError, ValueError):
        return False


USES_CUSTOM_OP = _custom_op_takes_a_schema()
_library = None


def _register_custom_op(name: str, schema: str, impl: Callable, fake: Callable) -> None:
    op = torch.library.custom_op(f"engram::{name}", impl, mutates_args=(), schema=schema)
    op.register_fake(fake)


def _register_library(name: str, schema: str, impl: Callable, fake: Callable) -> None:
    global _library
    if _library is None:
        _library = torch.library.Library("engram", "DEF")
    _library.define(name + schema)
    for key in ("CPU", "CUDA"):
        _library.impl(name, impl, key)

    def meta(*args):
        # Meta inputs give meta outputs: the same shapes, dtypes, no data.
        return fake(*args)

    _library.impl(name, meta, "Meta")
    # torch 1.13 has no autograd fallthrough for meta tensors: route it to the same function
    # (the ops have no gradient).
    _library.impl(name, meta, "AutogradMeta")


def _register() -> None:
    if hasattr(torch.ops, "engram") and hasattr(torch.ops.engram, "gather_wait"):
        return  # registered by an earlier import of this module (e.g. a reload)
    for name, (schema, impl, fake) in _SCHEMAS.items():
        if USES_CUSTOM_OP:
            _register_custom_op(name, schema, impl, fake)
        else:
            _register_library(name, schema, impl, fake)


_register()
