"""Exceptions raised by the engram package, one per kind of failure of the C library.

Every exception carries the library's negative errno (``code``) and its message, which names
the socket, table, row or limit concerned. The classes also derive from the matching built-in
exception, so ``except ConnectionError`` or ``except ValueError`` work as expected.
"""

import errno as _errno


class EngramError(Exception):
    """Base class: a call into libengram_client (or the GPU libraries) failed.

    Attributes:
        code: the negative errno the C function returned (0 when the failure is Python-side).
        message: what the library said was wrong.
    """

    def __init__(self, code: int, message: str):
        self.code = code
        self.message = message
        name = _errno.errorcode.get(-code, str(code)) if code else ""
        super().__init__(f"{message} [{name}]" if name else message)


class LibraryNotFoundError(EngramError, ImportError):
    """libengram_client.so (or a GPU kernel library) could not be found or loaded."""


class EngramConnectionError(EngramError, ConnectionError):
    """Unavailable: no daemon listens on the socket, or the session was lost (connect again)."""


class EngramPermissionError(EngramError, PermissionError):
    """PermissionDenied: this user or group may not connect to the daemon."""


class InvalidArgumentError(EngramError, ValueError):
    """InvalidArgument: a bad argument or request."""


class UnknownTableError(InvalidArgumentError):
    """NotFound: the daemon serves no table with this layer id."""


class RowOutOfRangeError(InvalidArgumentError):
    """OutOfRange: a row id past the table, or outside the rows this daemon's copy holds."""


class ResourceExhaustedError(EngramError):
    """A limit was hit: request slots, rows per request, arena bytes, clients, admission pins."""


class EngramTimeoutError(EngramError, TimeoutError):
    """The wait timed out; the request is still in flight and may be waited on again."""


class ProtocolError(EngramError):
    """FailedPrecondition: protocol version mismatch or a corrupt arena."""


class EngramIOError(EngramError, OSError):
    """Internal or DataLoss: the daemon failed to read the rows; or a GPU runtime error."""


class GpuUnavailableError(EngramError, RuntimeError):
    """The GPU path cannot run here: no GPU runtime, no GPU, or no kernel library."""


class ModelFileNotFoundError(EngramError, FileNotFoundError):
    """Opening a Hasher: config.json or the derived-tables file (engram-hash.bin) is missing."""


class HashTablesError(EngramError, OSError):
    """Opening a Hasher: the derived-tables file is stale (-ESTALE: config.json or
    tokenizer.json changed; re-run tools/engram_vocab.py) or corrupt (-EBADMSG)."""


class NoVocabularyError(InvalidArgumentError):
    """Tokenizer ids were given to a Hasher opened without a compressed vocabulary."""


class PrefetchUnsupportedError(EngramError):
    """The client library or the daemon predates prefetch (ENGRAM_0.5, protocol 1.2)."""


class AdmissionUnsupportedError(PrefetchUnsupportedError):
    """The client library or the daemon predates admission prefetch (ENGRAM_0.8, protocol 1.6).
    A PrefetchUnsupportedError: `except PrefetchUnsupportedError` covers both."""


_BY_ERRNO = {
    -_errno.ECONNREFUSED: EngramConnectionError,
    -_errno.ENOTCONN: EngramConnectionError,
    -_errno.EACCES: EngramPermissionError,
    -_errno.EPERM: EngramPermissionError,
    -_errno.EINVAL: InvalidArgumentError,
    -_errno.ENOENT: UnknownTableError,
    -_errno.ERANGE: RowOutOfRangeError,
    -_errno.ENOSPC: ResourceExhaustedError,
    -_errno.ETIMEDOUT: EngramTimeoutError,
    -_errno.EPROTO: ProtocolError,
    -_errno.EIO: EngramIOError,
    -_errno.ENOSYS: GpuUnavailableError,
    -_errno.ENODEV: GpuUnavailableError,
    -_errno.ENOTSUP: GpuUnavailableError,
}


def error_for(code: int, message: str) -> EngramError:
    """The exception for a negative errno returned by the C library."""
    return _BY_ERRNO.get(code, EngramError)(code, message)


def hash_error_for(code: int, message: str, opening: bool = False) -> EngramError:
    """The exception for a negative errno from the hashing functions (engram/hash.h) or from
    engram_submit_tokens: -EOPNOTSUPP means no compressed vocabulary there, not a GPU matter;
    -ENOENT while opening is a missing model file."""
    if code == -_errno.EOPNOTSUPP:
        return NoVocabularyError(code, message)
    if code in (-_errno.ESTALE, -_errno.EBADMSG):
        return HashTablesError(code, message)
    if opening and code == -_errno.ENOENT:
        return ModelFileNotFoundError(code, message)
    return error_for(code, message)
