"""Hasher: DeepSeek-V4.1 Engram row ids computed on the host from token ids (engram/hash.h).

    hasher = engram.Hasher("/models/DeepSeek-V4.1-Flash")
    rows = hasher.hash(new_ids, history=last_ids, layer=14, tp_size=4, tp_rank=1)
    # numpy int64 [positions, 6]: the absolute rows of TP4 rank 1's heads
    emb = client.gather_tokens(hasher, 14, new_ids, history=last_ids)
    # torch.uint8 [positions, 24, 264], hashed straight into the arena and gathered there

Sequences carry their own history (the ids right before their new tokens, oldest first; only
the last max_ngram_size - 1 matter, missing ones are the pad): a chunked prefill passes the
previous chunk's last ids, speculative tokens need no rollback. The hasher is immutable and
may be shared by any number of threads and clients.
"""

import ctypes
import errno
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _lib
from ._arrays import integer_array
from .errors import InvalidArgumentError, hash_error_for

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def _check(rc: int, opening: bool = False) -> int:
    if rc < 0:
        raise hash_error_for(rc, _lib.last_error(), opening)
    return rc


def token_array(tokens: Any, what: str = "tokens") -> np.ndarray:
    """tokens (list, tuple, range, NumPy array or CPU integer tensor, 1-D) as contiguous int32.

    Raises TypeError for non-integers, InvalidArgumentError for a GPU tensor, a shape that is
    not 1-D or an id that does not fit 32 bits (the vocabulary check is the library's)."""
    array = integer_array(tokens, what, empty_dtype=np.int32)
    if array.size and array.dtype != np.int32:
        low, high = int(array.min()), int(array.max())
        if low < _INT32_MIN or high > _INT32_MAX:
            bad = low if low < _INT32_MIN else high
            index = int(np.argmax(array == bad))
            raise InvalidArgumentError(-errno.EINVAL, f"{what}: id {bad} at index {index} does "
                                                      f"not fit a 32-bit token id")
    return np.ascontiguousarray(array, dtype=np.int32)


def _is_batch(tokens):
    if not isinstance(tokens, (list, tuple)) or not tokens:
        return False
    return not isinstance(tokens[0], (int, np.integer))


class _Sequences:
    """The engram_hash_seq array of one call and the int32 arrays it points into."""

    def __init__(self, tokens, history):
        if _is_batch(tokens):
            token_lists = list(tokens)
            if history is None:
                history_lists = [None] * len(token_lists)
            else:
                history_lists = list(history)
                if len(history_lists) != len(token_lists):
                    raise InvalidArgumentError(
                        -errno.EINVAL, f"{len(history_lists)} histories for "
                                       f"{len(token_lists)} sequences")
        else:
            token_lists, history_lists = [tokens], [history]
        self.arrays = []  # keeps the ids alive while the C call reads them
        self.seqs = (_lib.HashSeq * max(1, len(token_lists)))()
        self.count = len(token_lists)
        self.positions = 0
        for i, (t, h) in enumerate(zip(token_lists, history_lists)):
            where = f"sequence {i}: " if self.count > 1 else ""
            t = token_array(t, f"{where}tokens")
            h = token_array([] if h is None else h, f"{where}history")
            self.arrays += [t, h]
            self.seqs[i] = _lib.HashSeq(ctypes.sizeof(_lib.HashSeq), t.ctypes.data, t.size,
                                        h.ctypes.data, h.size)
            self.positions += int(t.size)


class Hasher:
    """The n-gram hasher of a model directory (config.json and its derived-tables file).

    Args:
        model_dir: the model's directory.
        derived_path: the derived-tables file written by tools/engram_vocab.py; None:
            model_dir/engram-hash.bin.
        compressed_only: open without a derived-tables file; only compressed ids can then be
            hashed, and compressed_pad_id must be given.
        compressed_pad_id: the compressed id of the pad token; None: from the derived tables.

    Raises ModelFileNotFoundError (a FileNotFoundError), HashTablesError (stale or corrupt
    derived tables), InvalidArgumentError (a config this hash does not describe).
    """

    layers: Dict[int, int]
    num_layers: int
    max_ngram_size: int
    heads_per_order: int
    heads_per_layer: int
    vocab_size: int
    compressed_vocab_size: int
    compressed_pad_id: int

    def __init__(self, model_dir: Any, *, derived_path: Any = None,
                 compressed_only: bool = False, compressed_pad_id: Optional[int] = None):
        import os
        lib = _lib.hash_lib()
        self._lib = lib
        self.model_dir = os.fspath(model_dir)
        opts = _lib.HasherOpts()
        lib.engram_hasher_opts_init(ctypes.byref(opts), ctypes.sizeof(opts))
        self._derived = os.fsencode(derived_path) if derived_path is not None else None
        opts.derived_path = self._derived
        opts.flags = _lib.HASHER_COMPRESSED_ONLY if compressed_only else 0
        opts.compressed_pad_id = -1 if compressed_pad_id is None else int(compressed_pad_id)
        handle = ctypes.c_void_p()
        _check(lib.engram_hasher_open(os.fsencode(self.model_dir), ctypes.byref(opts),
                                      ctypes.byref(handle)), opening=True)
        self._handle = handle
        info = _lib.HasherInfo()
        info.size = ctypes.sizeof(info)
        _check(lib.engram_hasher_get_info(handle, ctypes.byref(info)))
        for name in _lib.HASHER_INFO_FIELDS:
            setattr(self, name, int(getattr(info, name)))
        self.layers = {}  # layer id -> rows of its table
        for index in range(self.num_layers):
            layer = _lib.HashLayerInfo()
            layer.size = ctypes.sizeof(layer)
            _check(lib.engram_hasher_get_layer(handle, index, ctypes.byref(layer)))
            self.layers[int(layer.layer)] = int(layer.num_rows)

    def __repr__(self):
        return (f"<engram.Hasher {self.model_dir!r} layers={list(self.layers)} "
                f"heads={self.heads_per_layer}>")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Frees the hasher; calls afterwards raise. Idempotent."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            self._lib.engram_hasher_close(handle)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _h(self):
        if self._handle is None:
            raise InvalidArgumentError(-errno.EINVAL, "the Hasher is closed")
        return self._handle

    # ---- heads and rows ---------------------------------------------------------------------

    def rank_heads(self, tp_size: int, tp_rank: int) -> Tuple[int, int]:
        """(begin, end) of the heads tensor-parallel rank tp_rank of tp_size owns."""
        begin, end = ctypes.c_uint32(), ctypes.c_uint32()
        _check(self._lib.engram_hasher_rank_heads(self._h(), tp_size, tp_rank,
                                                  ctypes.byref(begin), ctypes.byref(end)))
        return begin.value, end.value

    def head_rows(self, layer: int, heads: Any = None) -> Tuple[int, int]:
        """(row_begin, row_end): the one contiguous row range heads (begin, end) of a layer own
        (all heads when None)."""
        begin, end = self.head_range(heads=heads)
        row_begin, row_end = ctypes.c_uint64(), ctypes.c_uint64()
        _check(self._lib.engram_hasher_head_rows(self._h(), layer, begin, end,
                                                 ctypes.byref(row_begin), ctypes.byref(row_end)))
        return row_begin.value, row_end.value

    def head_range(self, tp_size: Optional[int] = None, tp_rank: Optional[int] = None,
                   heads: Any = None) -> Tuple[int, int]:
        """The heads a call selects: a TP rank's (tp_size and tp_rank), an explicit (begin, end)
        or range, or all of them."""
        if tp_size is not None or tp_rank is not None:
            if heads is not None:
                raise InvalidArgumentError(-errno.EINVAL, "give either heads or tp_size/tp_rank, "
                                                          "not both")
            if tp_size is None or tp_rank is None:
                raise InvalidArgumentError(-errno.EINVAL, "tp_size and tp_rank go together")
            return self.rank_heads(tp_size, tp_rank)
        if heads is None:
            return 0, self.heads_per_layer
        if isinstance(heads, range):
            if heads.step != 1:
                raise InvalidArgumentError(-errno.EINVAL, f"heads {heads} must be contiguous")
            return heads.start, heads.stop
        begin, end = heads
        return int(begin), int(end)

    # ---- hashing ------------------------------------------------------------------------------

    def compress(self, tokens: Any) -> np.ndarray:
        """Tokenizer ids -> compressed ids (numpy int32)."""
        ids = token_array(tokens)
        out = np.empty(ids.size, dtype=np.int32)
        _check(self._lib.engram_hash_compress(self._h(), ids.ctypes.data, ids.size,
                                              out.ctypes.data))
        return out

    def hash(self, tokens: Any, history: Any = None, *, layer: int,
             tp_size: Optional[int] = None, tp_rank: Optional[int] = None, heads: Any = None,
             compressed: bool = False) -> np.ndarray:
        """Row ids of `tokens` for layer `layer`: numpy int64 [positions, heads], head order.

        tokens: the new token ids of one sequence (list, NumPy array or CPU tensor, 1-D), or a
            list of such sequences, hashed in one call (positions then run through them in
            order); history: the ids right before them (one list per sequence for a batch;
            None: the sequence starts here).
        Heads: all, those of tp_size/tp_rank, or heads=(begin, end). compressed: the ids are
        already compressed ids (no tokenizer lookup).
        Raises UnknownTableError for a layer the hasher does not know, InvalidArgumentError
        for an id outside the vocabulary (naming sequence, position and id) or bad heads,
        NoVocabularyError for tokenizer ids without a compressed vocabulary."""
        begin, end = self.head_range(tp_size, tp_rank, heads)
        seqs = _Sequences(tokens, history)
        width = max(0, end - begin)
        out = np.empty((seqs.positions, width), dtype=np.int64)
        _check(self._lib.engram_hash(self._h(), layer, seqs.seqs, seqs.count, begin, end,
                                     _lib.HASH_COMPRESSED_IDS if compressed else 0,
                                     out.ctypes.data, out.size))
        return out
