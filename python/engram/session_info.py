"""What a session reports about itself and its library: tables, statistics, versions."""

import ctypes
import dataclasses
from typing import Any, Dict, Tuple

from . import _lib


# enum engram_table_tier (engram/row.h) by value: the names engramd's configuration uses.
TIER_NAMES = {0: "unknown", 1: "storage", 2: "resident", 3: "cache"}


def row_bytes() -> int:
    """Bytes per gathered row (264: 256 FP8 values, 8 E8M0 scales), as libengram_client defines
    it (engram_row_bytes); engram.ROW_BYTES is the same number."""
    return _lib.row_bytes()


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """A table the daemon serves (struct engram_table_info)."""
    layer: int
    row_bytes: int
    num_rows: int
    covered_begin: int  # rows this daemon serves: [covered_begin, covered_end)
    covered_end: int
    layout: str  # "checkpoint" or "packed"
    files: int
    data_bytes: int
    # Where the daemon serves the rows from, as engramctl and engramd's configuration name it:
    # "storage", "resident" or "cache" ("unknown" from a daemon that does not say).
    tier: str = "unknown"

    @property
    def layer_id(self) -> int:
        """Deprecated name of `layer`."""
        return self.layer


class SessionStats:
    """Statistics of this session (struct engram_session_stats): one int attribute per field,
    named as in C (session_id, requests_submitted, requests_ok, doorbells, rows_in_place, ...).
    The fields and what each counts come from the loaded library (engram/session_stats.h), so
    a counter added there appears here: `as_dict()` holds them all, in order, and
    `SessionStats.fields()` gives (name, help) for each."""

    __slots__ = ("_values",)

    def __init__(self, values: Dict[str, int]):
        object.__setattr__(self, "_values", dict(values))

    @staticmethod
    def fields() -> Tuple[Tuple[str, str], ...]:
        """(name, one-line description) of every field, in the struct's order."""
        return _lib.session_stats_fields()

    def as_dict(self) -> Dict[str, int]:
        return dict(self._values)

    def __getattr__(self, name: str) -> int:
        if name.startswith("_"):  # _values itself before __init__ (copy, pickle)
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"SessionStats has no field {name!r} (it has: "
                                 f"{', '.join(self._values)})") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("SessionStats is read-only")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SessionStats) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __repr__(self) -> str:
        return "SessionStats(" + ", ".join(f"{k}={v}" for k, v in self._values.items()) + ")"


def protocol_version() -> Tuple[int, int]:
    """(major, minor) of the wire protocol the loaded client library speaks."""
    major, minor = ctypes.c_uint32(), ctypes.c_uint32()
    _lib.client_lib().engram_protocol_version(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def library_path() -> str:
    """Path of the libengram_client.so this package loaded (see engram._lib for the search)."""
    return _lib.client_lib_path()
