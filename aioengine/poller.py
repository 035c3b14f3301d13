"""The fence poller: how the event loop learns that GPU work completed, without blocking.

One :class:`Poller` per event loop watches every pending :class:`~aioengine.fence.Fence` of the
engines on that loop. It keeps one FIFO per stream and queries only FIFO heads (a stream's
events complete in order), with the backend's ``query`` (``cudaEventQuery``: a status code,
never ``Event.done``, which reads an error as "not ready" and would spin forever). It polls
again at once after progress, else backs off from 1 ms to :attr:`Poller.max_delay` (never below
1 ms: uvloop runs shorter timers as ``call_soon``, a busy spin), and stops when nothing is
pending: an idle engine costs no timer and no task.

No CUDA host callbacks (``launch_host_func``): they take the GIL on a driver thread and can
deadlock (see ``reference/gpu-design.md`` §4).

Locking: ``_lock`` guards ``_fifos``, ``_scheduled`` and ``_delay``; fences are appended from
worker threads and popped on the loop thread. Completions are delivered to their engines on the
loop thread with ``_lock`` released (lock order: engine lock, then ``_lock``).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from typing import Any

from .executors.device import EVENT_NOT_READY
from .fence import Fence

__all__ = ("Poller", "poller_for")

_pollers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Poller] = weakref.WeakKeyDictionary()
_pollers_lock = threading.Lock()


def poller_for(loop: asyncio.AbstractEventLoop) -> Poller:
    """The poller of ``loop``, created on first use (from any thread)."""
    with _pollers_lock:
        poller = _pollers.get(loop)
        if poller is None:
            poller = _pollers[loop] = Poller(loop)
        return poller


class Poller:
    """Watches fences for one event loop and reports their completion to their engines.

    Attributes:
        min_delay: the first back-off sleep after a tick without progress (seconds).
        max_delay: the longest back-off sleep (seconds).
        queries: event queries made so far (for tests and statistics).
        ticks: polling passes made so far.
    """

    min_delay = 1e-3
    max_delay = 4e-3

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._fifos: dict[int, deque[Fence]] = {}  # by id(stream): fences in record order
        self._scheduled = False  # invariant: True iff a _tick is scheduled on the loop
        self._delay = 0.0  # the sleep before the scheduled tick
        self._handle: asyncio.Handle | None = None
        self.queries = 0
        self.ticks = 0

    @property
    def pending(self) -> int:
        """Fences watched and not yet seen completed."""
        with self._lock:
            return sum(len(f) for f in self._fifos.values())

    @property
    def running(self) -> bool:
        """Whether a polling pass is scheduled (False once idle)."""
        return self._scheduled

    def watch(self, fence: Fence) -> None:
        """Watch ``fence`` (recorded already; from any thread)."""
        with self._lock:
            fifo = self._fifos.get(id(fence.stream))
            if fifo is None:
                fifo = self._fifos[id(fence.stream)] = deque()
            fifo.append(fence)
            if self._scheduled:
                return
            self._scheduled = True
            self._delay = 0.0
        loop = self._loop
        if asyncio._get_running_loop() is loop:
            self._handle = loop.call_soon(self._tick)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._tick)

    def _tick(self) -> None:
        """One polling pass over the FIFO heads (loop thread), then reschedule or stop."""
        settled: list[tuple[Fence, int]] = []
        failed: dict[tuple[int, int], int] = {}  # (id(backend), device) -> error status
        with self._lock:
            self.ticks += 1
            for key, fifo in list(self._fifos.items()):
                while fifo:
                    fence = fifo[0]
                    if fence.status is not None:  # settled by its engine (device failure)
                        fifo.popleft()
                        continue
                    self.queries += 1
                    status = fence.backend.query(fence.event)
                    if status == EVENT_NOT_READY:
                        break
                    fifo.popleft()
                    settled.append((fence, status))
                    if status:
                        failed.setdefault((id(fence.backend), fence.device_id), status)
                if not fifo:
                    del self._fifos[key]
            if failed:
                # A device error is sticky: every fence of that device fails with it.
                for key, fifo in list(self._fifos.items()):
                    keep: deque[Fence] = deque()
                    for fence in fifo:
                        status = failed.get((id(fence.backend), fence.device_id))
                        if status is None:
                            keep.append(fence)
                        elif fence.status is None:
                            settled.append((fence, status))
                    if keep:
                        self._fifos[key] = keep
                    else:
                        del self._fifos[key]
            if not self._fifos:
                self._scheduled = False
                self._handle = None
            else:
                self._delay = (
                    0.0 if settled else min(max(2 * self._delay, self.min_delay), self.max_delay)
                )
                if self._delay:
                    self._handle = self._loop.call_later(self._delay, self._tick)
                else:
                    self._handle = self._loop.call_soon(self._tick)
        if settled:
            self._deliver(settled)

    def _deliver(self, settled: list[tuple[Fence, int]]) -> None:
        by_owner: dict[int, tuple[Any, list[tuple[Fence, int]]]] = {}
        for fence, status in settled:
            entry = by_owner.get(id(fence.owner))
            if entry is None:
                by_owner[id(fence.owner)] = (fence.owner, [(fence, status)])
            else:
                entry[1].append((fence, status))
        for owner, items in by_owner.values():
            try:
                owner._fences_settled(items)
            except Exception as exc:  # an engine bug must not stop polling for the others
                self._loop.call_exception_handler(
                    {"message": "aioengine: error settling GPU fences", "exception": exc}
                )

    def __repr__(self) -> str:
        state = "polling" if self._scheduled else "idle"
        return f"<Poller {state} pending={self.pending} queries={self.queries}>"
