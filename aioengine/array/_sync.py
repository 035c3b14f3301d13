"""Sync points: where an array's value is needed now, and why the loop thread never waits.

A sync point (``bool(x)``, ``float(x)``, ``np.asarray(x)``, ``x.tolist()``, pickling, ...)
needs the value at once. Off the engine's event-loop thread (a script, a ``BlockingEngine``'s
caller, a worker thread) it blocks until the value is ready, as MXNet's ``asnumpy()`` does. On
the loop thread it cannot: the operations that would make the value ready are completed by that
very loop, so a wait there could only deadlock. A pending array raises
:class:`PendingArrayError` there instead (the Array API allows lazy implementations to raise
``ValueError`` from these methods); a ready one answers everywhere. The same holds inside an
operation on one of the engine's worker threads: the value may be queued behind that very
operation.

Two reads wait the same way but never raise, since what they show has a pending form:
``x.shape`` of a data-dependent dimension (None where a sync point cannot wait) and ``str(x)``
(the repr's pending state there). ``repr(x)`` never waits. A thread that runs an event loop of
its own is "off the loop thread" for a ``BlockingEngine``'s arrays (whose loop runs on a thread
of its own): a sync point there blocks that thread, which cannot deadlock the engine, as in a
notebook cell using ``aioengine.array_api``.
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ("PendingArrayError", "in_operation", "on_loop_thread", "running_loop")

#: The event loop running on the calling thread, or None: asyncio's own accessor (the one
#: ``asyncio.get_running_loop()`` calls, without its RuntimeError), bound once here because
#: the fusion hot path and every sync point ask it; the package's one use of it.
running_loop = asyncio._get_running_loop


class PendingArrayError(ValueError, RuntimeError):
    """A sync point was reached on the engine's event-loop thread while the array's value is
    not computed yet: ``await`` the array instead (blocking the loop would deadlock)."""


def on_loop_thread(loop: asyncio.AbstractEventLoop | None) -> bool:
    """Whether the calling thread is running ``loop`` (inside a coroutine, a callback or an
    operation run inline on it)."""
    return loop is not None and running_loop() is loop


# Per thread, whether it is an engine's worker thread: its name is given as it is made, and
# the synchronous hot path asks at every operation.
_threads = threading.local()


def in_operation() -> bool:
    """Whether the calling thread is one of an engine's worker threads (its pools' threads
    are named ``aioengine-...``), so inside an operation."""
    try:
        inside: bool = _threads.inside
    except AttributeError:
        inside = _threads.inside = threading.current_thread().name.startswith("aioengine-")
    return inside
