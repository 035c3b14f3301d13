"""The fence poller: how the event loop learns that GPU work completed, without blocking.

One :class:`Poller` per event loop watches every pending :class:`~aioengine.fence.Fence` of the
engines on that loop. It polls on a thread of its own, so that no CUDA call ever runs on the
loop thread: it keeps one FIFO per stream and queries only FIFO heads (a stream's events
complete in order), with the backend's ``query`` (``cudaEventQuery``: a status code, never
``Event.done``, which reads an error as "not ready" and would spin forever). It polls again at
once after progress, else backs off from 1 ms to :attr:`Poller.max_delay`, and hands the
completions of each pass to the loop in one ``call_soon_threadsafe``. When nothing is pending
it stops polling, and its thread exits after :attr:`Poller.linger` seconds: an idle engine
costs no timer, no task and no query.

No CUDA host callbacks (``launch_host_func``): they take the GIL on a driver thread and can
deadlock (see ``docs/gpu-design.md``, section "Observing completion: the poller").

Settled events and keepalives are handed back to the poller (:meth:`Poller.release`), which
drops them on its own thread: destroying an event (``cudaEventDestroy``) or freeing pool memory
is a CUDA call too. The poller holds its loop weakly and stops when the loop is closed.

Locking: ``_cond`` guards ``_fifos``, ``_released``, ``_thread`` and ``_delay``. Fences are
appended from worker threads and popped on the poller thread; completions are delivered to
their engines on the loop thread, with ``_cond`` released (lock order: engine lock, then
``_cond``). The poller never takes an engine lock, and queries events with ``_cond``
released: a query may stall (``cudaEventQuery`` behind the driver's lock), and the loop thread
takes ``_cond`` in :meth:`Poller.release`, with its engine's lock held.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from typing import Any

from . import lifecycle
from .executors.device import EVENT_NOT_READY
from .fence import Fence

_QUERY_FAILED = 999  # cudaErrorUnknown: the status of a query that raised (never expected)
_SETTLED = -1  # not a CUDA status: its engine settled the fence already (its device failed)

__all__ = ("Poller", "poller_for")

_pollers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Poller] = weakref.WeakKeyDictionary()
_pollers_lock = threading.Lock()
# What a forked child must not touch: the parent's fences, events and keepalives (freeing a
# CUDA object of the parent's context there is undefined). Kept, never dropped.
_parents_objects: list[object] = []


def _after_fork_in_child(pollers: weakref.WeakKeyDictionary[Any, Poller]) -> None:
    """In a forked child (lifecycle.pollers_after_fork): the pollers' threads are the
    parent's and do not exist here, and a lock may have been copied held. Each poller starts
    over, idle; the next fence watched starts a thread in the child."""
    global _pollers_lock
    _pollers_lock = threading.Lock()
    for poller in list(pollers.values()):
        _parents_objects.append((poller._fifos, poller._released))
        poller._cond = threading.Condition(threading.Lock())
        poller._fifos = {}
        poller._released = []
        poller._thread = None
        poller._delay = 0.0


lifecycle.pollers_after_fork.add(_pollers, _after_fork_in_child)


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
        min_delay: the first back-off sleep after a pass without progress (seconds).
        max_delay: the longest back-off sleep (seconds).
        linger: how long the idle poller thread waits for new fences before it exits.
        queries: event queries made so far (for tests and statistics).
        ticks: polling passes made so far.
    """

    min_delay = 1e-3
    max_delay = 4e-3
    linger = 0.05

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # weak: _pollers must not keep closed loops alive
        self._cond = threading.Condition(threading.Lock())
        self._fifos: dict[int, deque[Fence]] = {}  # by id(stream): fences in record order
        self._released: list[object] = []  # events and keepalives to drop on this thread
        self._thread: threading.Thread | None = None  # invariant: set iff the thread runs
        self._delay = 0.0  # the back-off sleep after the latest pass
        self.queries = 0
        self.ticks = 0

    @property
    def pending(self) -> int:
        """Fences watched and not yet seen completed."""
        with self._cond:
            return sum(len(f) for f in self._fifos.values())

    @property
    def running(self) -> bool:
        """Whether it is polling (False once nothing is pending)."""
        with self._cond:
            return bool(self._fifos)

    @property
    def alive(self) -> bool:
        """Whether its thread exists (it exits :attr:`linger` seconds after going idle)."""
        return self._thread is not None

    def watch(self, fence: Fence) -> None:
        """Watch ``fence`` (recorded already; from any thread)."""
        with self._cond:
            fifo = self._fifos.get(fence.stream_id)
            if fifo is None:
                fifo = self._fifos[fence.stream_id] = deque()
            fifo.append(fence)
            self._wake_locked(len(self._fifos) == 1 and len(fifo) == 1)

    def release(self, objs: list[object]) -> None:
        """Drop ``objs`` (settled events, keepalives) on the poller thread, not the caller's.

        Takes ownership: ``objs`` is emptied under the lock, so the caller holds no reference
        that could outlive the poller's and drop the last one on the caller's (loop) thread.
        """
        with self._cond:
            self._released.extend(objs)
            objs.clear()
            self._wake_locked(True)

    def _wake_locked(self, was_idle: bool) -> None:
        """Start the thread, or wake it if it may be lingering idle (``_cond`` held)."""
        if self._thread is None:
            self._delay = 0.0
            self._thread = threading.Thread(
                target=self._run, name="aioengine-gpu-poller", daemon=True
            )
            self._thread.start()
        elif was_idle:
            self._delay = 0.0
            self._cond.notify()

    def _run(self) -> None:
        """The poller thread: poll while fences are pending, linger when idle, then exit."""
        try:
            self._poll_until_idle()
        finally:
            with self._cond:  # on an exception too: the next watch() starts a new thread
                if self._thread is threading.current_thread():
                    self._thread = None

    def _poll_until_idle(self) -> None:
        cond = self._cond
        while True:
            with cond:
                released = self._released
                self._released = []
            del released  # drop events and keepalives here, outside the lock
            loop = self._loop()
            if loop is None or loop.is_closed():  # nobody is left to tell
                with cond:
                    self._fifos.clear()
                    self._released.clear()
                    self._thread = None
                return
            del loop
            with cond:
                if not self._fifos:  # idle: drop what was released, linger, then exit
                    if not self._released:
                        cond.wait(self.linger)
                        if not self._fifos and not self._released:
                            self._thread = None  # in the same critical section as the check
                            return
                    continue
                heads = list(self._fifos.items())
            done = self._query(heads)
            with cond:
                settled = self._pop_locked(heads, done)
                if not self._fifos:
                    delay = 0.0
                elif settled:
                    delay = self._delay = 0.0
                else:
                    delay = self._delay = min(max(2 * self._delay, self.min_delay), self.max_delay)
            if settled:
                self._hand_over(settled)
            del settled, heads, done  # a lingering thread must hold no fence (nor engine, loop)
            if delay:
                with cond:
                    if not self._released:
                        cond.wait(delay)

    def _query(self, heads: list[tuple[int, deque[Fence]]]) -> list[list[tuple[Fence, int]]]:
        """One pass over the FIFO heads, ``_cond`` released; returns, per FIFO, its leading
        fences that completed or failed (or were settled meanwhile: ``_SETTLED``).

        Safe unlocked: other threads only append to a FIFO (:meth:`watch`, under ``_cond``);
        only this thread pops from one or removes it from ``_fifos``.
        """
        done: list[list[tuple[Fence, int]]] = []
        self.ticks += 1
        for _, fifo in heads:
            ended: list[tuple[Fence, int]] = []
            for i in range(len(fifo)):
                fence = fifo[i]
                event = fence.event  # read once: its engine may settle it meanwhile
                if fence.status is not None or event is None:  # settled (device failure)
                    ended.append((fence, _SETTLED))
                    continue
                self.queries += 1
                try:
                    status = fence.backend.query(event)
                except Exception:  # a backend bug must not kill polling for every engine
                    status = _QUERY_FAILED
                if status == EVENT_NOT_READY:
                    break
                ended.append((fence, status))
            done.append(ended)
        return done

    def _pop_locked(
        self, heads: list[tuple[int, deque[Fence]]], done: list[list[tuple[Fence, int]]]
    ) -> list[tuple[Fence, int]]:
        """Remove the fences :meth:`_query` saw end from their FIFOs; return those that
        completed or failed, with their status (``_cond`` held)."""
        settled: list[tuple[Fence, int]] = []
        failed: dict[tuple[int, int], int] = {}  # (id(backend), device) -> error status
        for (key, fifo), ended in zip(heads, done, strict=True):
            for fence, status in ended:
                fifo.popleft()  # the same fence: only this thread pops
                if status == _SETTLED:
                    continue
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
                    error = failed.get((id(fence.backend), fence.device_id))
                    if error is None:
                        keep.append(fence)
                    elif fence.status is None:
                        settled.append((fence, error))
                if keep:
                    self._fifos[key] = keep
                else:
                    del self._fifos[key]
        return settled

    def _hand_over(self, settled: list[tuple[Fence, int]]) -> None:
        """Deliver ``settled`` on the loop thread (dropped if the loop closed meanwhile)."""
        loop = self._loop()
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._deliver, settled)
        except RuntimeError:  # closed: the next pass stops
            pass

    def _deliver(self, settled: list[tuple[Fence, int]]) -> None:
        """Tell each engine which of its fences settled (loop thread)."""
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
            except Exception as exc:  # an engine bug must not stop delivery to the others
                loop = self._loop()
                if loop is not None:
                    loop.call_exception_handler(
                        {"message": "aioengine: error settling GPU fences", "exception": exc}
                    )

    def __repr__(self) -> str:
        state = "polling" if self._fifos else "idle"
        return f"<Poller {state} pending={self.pending} queries={self.queries}>"
