"""The GPU device seam: what the engine needs from a device (streams, events, queries).

The engine never calls CuPy itself. A :class:`DeviceBackend` gives it three things, all of
which it calls from GPU worker threads, except :meth:`DeviceBackend.query` (the poller's):

- streams: a worker thread binds itself to one device and one stream of a
  :class:`StreamFamily` (:meth:`DeviceBackend.bind_worker`), and runs every operation with
  that stream current (:meth:`DeviceBackend.run`);
- events: after an operation's function returns, the worker records a fresh event on the
  stream (:meth:`DeviceBackend.record`); a later operation on another stream orders itself
  after it with :meth:`DeviceBackend.wait_event` (no host wait);
- queries: the poller (``poller.py``) asks :meth:`DeviceBackend.query` for an event's raw
  status, on its own thread; it never blocks and never raises (``cudaEventQuery`` returns a
  status code).

No method is ever called on an event-loop thread.

Two implementations: :class:`~aioengine.executors.cupy_streams.CupyBackend` (real GPUs) and
:class:`~aioengine.executors.simulated.SimulatedGPU` (NumPy and threads, for CI and demos).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Protocol

from ..context import RunContext

__all__ = ("EVENT_DONE", "EVENT_NOT_READY", "DeviceBackend", "StreamFamily")

EVENT_DONE = 0  # cudaSuccess: everything recorded before the event has run
EVENT_NOT_READY = 600  # cudaErrorNotReady; any other status is a device error


class StreamFamily(enum.Enum):
    """Which stream (and worker pool) of a device runs an operation, by its FnProperty.

    ``NORMAL`` (and ``NO_SKIP``, ``CPU_PRIORITIZED``) → ``COMPUTE``; ``COPY_TO_GPU`` →
    ``H2D``; ``COPY_FROM_GPU`` → ``D2H``; ``GPU_PRIORITIZED`` → ``PRIORITY`` (a high-priority
    stream). Separate copy streams let both copy engines and the compute engine work at once.
    """

    COMPUTE = "compute"
    H2D = "h2d"
    D2H = "d2h"
    PRIORITY = "priority"


class DeviceBackend(Protocol):
    """A kind of GPU device the engine can run operations on (the device seam)."""

    name: str  #: shown in reprs, errors and traces, e.g. ``"cupy"`` or ``"simulated"``

    def check(self, device_id: int) -> None:
        """Raise :class:`~aioengine.DeviceUnavailableError` (with the fix) if unusable.

        Called at push, on the pushing thread; must be cheap after the first call.
        """
        ...

    def bind_worker(self, device_id: int, family: StreamFamily) -> Any:
        """Make the calling (worker) thread use ``device_id`` and return its new stream."""
        ...

    def run(self, stream: Any, fn: Callable[[RunContext], Any], rctx: RunContext) -> Any:
        """Call ``fn(rctx)`` with ``stream`` current (worker thread); return its result."""
        ...

    def launch(self, stream: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Enqueue ``fn(*args)`` as device work on ``stream`` (see :meth:`RunContext.launch`)."""
        ...

    def wait_event(self, stream: Any, event: Any) -> None:
        """Make later work on ``stream`` wait for ``event`` (worker thread; no host wait)."""
        ...

    def record(self, stream: Any) -> Any:
        """Record and return a fresh event after the work queued on ``stream`` so far."""
        ...

    def query(self, event: Any) -> int:
        """The raw status of ``event``: :data:`EVENT_DONE`, :data:`EVENT_NOT_READY` or an
        error code. Called on the poller's thread; never blocks, never raises."""
        ...

    def is_device_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` (raised in a worker) means the device itself failed."""
        ...
