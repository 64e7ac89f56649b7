"""Ticket: a gather in flight (Client.submit) and the arena range its rows land in."""

import errno
import threading
import weakref
from typing import Any, Optional

from . import _lib
from .errors import InvalidArgumentError, error_for
from .views import split_rows

_NS = 1_000_000_000


def _timeout_ns(timeout: Optional[float]) -> int:
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError(f"timeout must be None or >= 0 seconds, got {timeout}")
    return int(timeout * _NS)


class Ticket:
    """A gather in flight (from Client.submit). wait() returns the rows tensor.

    Used as a context manager, the rows are released when the block ends:
        with client.submit(14, ids) as ticket:
            rows = ticket.wait()
    """

    _PENDING, _DONE, _FAILED, _RELEASED = range(4)

    def __init__(self, client, ticket, layer, num_rows, allocation, shape=None, array="torch",
                 typed=False):
        self._client = client
        self._array = array
        self._typed = typed
        self._shape = tuple(shape) if shape is not None else (num_rows, _lib.row_bytes())
        self._ticket = ticket
        self.layer = layer
        self.num_rows = num_rows
        self._allocation = allocation
        self._state = self._PENDING
        self._tensor = None
        self._error = None
        self._mutex = threading.Lock()
        # A ticket dropped in flight must not hand its range back while the daemon may still
        # write into it: the finaliser waits for completion first.
        self._finalizer = weakref.finalize(self, Ticket._finalize, client, ticket, allocation)

    @property
    def table(self) -> int:
        """Deprecated name of `layer`."""
        return self.layer

    def __repr__(self):
        state = ["pending", "done", "failed", "released"][self._state]
        return f"<engram.Ticket layer={self.layer} rows={self.num_rows} {state}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    @staticmethod
    def _finalize(client, ticket, allocation):
        if not client._closing and client._handle is not None:
            rc = client._wait(ticket, 10 * _NS)
            if rc == -errno.ETIMEDOUT:
                return  # leave the range allocated rather than let a late write land in reuse
        allocation.free()

    def _settle(self, rc):
        """Records the outcome of the request (rc from engram_wait/poll, not -ETIMEDOUT)."""
        self._finalizer.detach()
        if rc < 0:
            self._state = self._FAILED
            self._error = error_for(rc, _lib.last_error())
            self._allocation.free()
            return
        self._state = self._DONE
        # The ticket holds the tensor until released, so wait() may be called again; the range
        # goes back when both the ticket and every view of the tensor are gone.
        self._tensor = self._client._view(self._allocation, self._shape, self._array)
        if self.num_rows == 0:
            self._allocation.free()

    def _result(self):
        if self._state == self._FAILED:
            raise self._error
        if self._state == self._RELEASED:
            raise InvalidArgumentError(-errno.EINVAL, "the rows of this ticket were released")
        return split_rows(self._tensor) if self._typed else self._tensor

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Waits for the rows (timeout in seconds, None: no limit) and returns them as a
        torch.uint8 tensor [n, 264] viewing the arena (a NumPy array, or a RowView, as the
        submit asked). Raises EngramTimeoutError (the request
        stays in flight: wait again) or the daemon's error (UnknownTableError,
        RowOutOfRangeError, EngramIOError, EngramConnectionError ...). May be called again."""
        with self._mutex:
            if self._state == self._PENDING:
                rc = self._client._wait(self._ticket, _timeout_ns(timeout))
                if rc == -errno.ETIMEDOUT:
                    raise error_for(rc, _lib.last_error())
                self._settle(rc)
            return self._result()

    def done(self) -> bool:
        """True once the request completed (successfully or not); never blocks."""
        with self._mutex:
            if self._state == self._PENDING:
                rc = self._client._poll(self._ticket)
                if rc == -errno.EAGAIN:
                    return False
                self._settle(rc)
            return True

    def release(self) -> None:
        """Hands the rows' arena range back (waiting for the request first if it is still in
        flight); tensors from wait() must not be used afterwards. Idempotent."""
        with self._mutex:
            if self._state == self._PENDING:
                if self._client._closing:
                    self._finalizer.detach()
                    self._allocation.free()
                    self._state = self._RELEASED
                    return
                self._settle(self._client._wait(self._ticket, -1))
            if self._state == self._DONE:
                self._tensor = None
                self._allocation.free()
            self._state = self._RELEASED
