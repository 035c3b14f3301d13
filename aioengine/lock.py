"""The engine lock: a mutex that the hot paths take and give back with one C call each.

Every push takes the engine's lock once, and so does every finish. On CPython 3.11,
``threading.Lock.acquire()`` parses its (absent) arguments with
``PyArg_ParseTupleAndKeywords``, which costs more instructions than the critical section of a
push. ``queue.SimpleQueue``'s ``get()`` and ``put()`` are ``METH_FASTCALL`` functions, and a
SimpleQueue that holds one token is a mutex: ``get()`` takes the token, waiting (without the
GIL) while another thread holds it; ``put()`` gives it back and wakes one waiter. A round trip
costs half of the Lock's (measured: 37 against 75 ns), and a no-op operation about 3% less.
"""

from __future__ import annotations

import functools
import queue
from collections.abc import Callable
from types import TracebackType

__all__ = ("EngineLock",)


class EngineLock:
    """A non-reentrant mutex with :class:`threading.Lock`'s interface.

    :attr:`take` and :attr:`give` are the bare calls for the engine's hot paths, which pair
    them in a ``try`` statement: ``take()`` is ``acquire()`` and ``give()`` is ``release()``
    without its check that the lock is held.
    """

    __slots__ = ("_token", "give", "take")

    def __init__(self) -> None:
        # Invariant: the queue holds the one token (None) exactly while the lock is free.
        self._token: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._token.put(None)
        #: Acquire: take the token, waiting while another thread holds it.
        self.take: Callable[[], None] = self._token.get
        #: Release (by the holder only; unchecked): give the token back, waking one waiter.
        self.give: Callable[[], None] = functools.partial(self._token.put, None)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Acquire the lock, as :meth:`threading.Lock.acquire`; return whether it was."""
        if not blocking:
            if timeout != -1:
                raise ValueError("can't specify a timeout for a non-blocking call")
            timeout = 0
        elif timeout < 0 and timeout != -1:
            raise ValueError("timeout value must be positive")
        try:
            if timeout == -1:
                self._token.get()
            else:
                self._token.get(timeout > 0, timeout or None)
        except queue.Empty:
            return False
        return True

    def release(self) -> None:
        """Release the lock, as :meth:`threading.Lock.release` (any thread may release it).

        Raises:
            RuntimeError: if the lock is not held.
        """
        if not self._token.empty():
            raise RuntimeError("release unlocked lock")
        self._token.put(None)

    def locked(self) -> bool:
        """Return True if the lock is held."""
        return self._token.empty()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<aioengine.EngineLock {'locked' if self.locked() else 'unlocked'}>"
