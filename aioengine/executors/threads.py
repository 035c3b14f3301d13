"""Thread-pool executors for CPU contexts.

Each CPU context (and the CPU priority pool) owns one :class:`ThreadExecutor`: a
``concurrent.futures.ThreadPoolExecutor`` whose threads run a worker loop over a shared
priority queue. A plain ``ThreadPoolExecutor.submit`` per operation would be FIFO (priority
ignored, as on MXNet's normal pools) and would allocate a ``Future`` per operation; the worker
loop honours priority on every pool and allocates no object per operation: the heap holds the
items' integer keys and ``_items`` maps each key to its item.

Locking: ``_lock`` (the lock of the ``_cond`` condition) guards ``_heap``, ``_items``,
``_threads``, ``_idle`` and ``_closing``. The engine may call :meth:`ThreadExecutor.submit`
while holding its own lock, so a worker never takes the engine lock while holding ``_lock``
(lock order: engine lock, then ``_lock``).
"""

from __future__ import annotations

import heapq
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import lifecycle
from ..context import Context, RunContext
from . import Run

__all__ = ("ThreadExecutor",)

logger = logging.getLogger("aioengine")


def _abandon_at_exit(executor: ThreadExecutor) -> None:
    """At interpreter exit (lifecycle.pools_at_exit: before threads are joined): stop the
    worker loops.

    Without this, an engine that was never closed would keep its workers waiting for work and
    the interpreter would hang joining them. Running operations finish; queued ones are
    cancelled, so that a thread still waiting for one (a non-daemon thread, which Python joins
    after this) wakes instead of hanging the exit.
    """
    for item in executor._abandon():
        item.cancel()


def _reset_in_child(executor: ThreadExecutor) -> None:
    """After os.fork(), in the child (lifecycle.pools_after_fork): the workers do not exist
    there and a lock may be held."""
    executor._lock = threading.Lock()
    executor._cond = threading.Condition(executor._lock)
    executor._heap.clear()
    executor._items.clear()
    executor._threads = executor._idle = 0
    executor._workers.clear()
    executor._pool = None
    executor._closing = executor._abandoned = True


class ThreadExecutor:
    """Runs ``run(item, rctx)`` for submitted items on up to ``workers`` threads, best key first.

    Threads are started lazily, one more whenever work arrives and no thread is idle, up to
    ``workers``; they live until :meth:`shutdown`.
    """

    def __init__(self, ctx: Context, workers: int, name: str, run: Run) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._run = run
        self._ctx = ctx
        self._rctx = RunContext(ctx)
        self._name = name
        self._max = workers
        self._pool: ThreadPoolExecutor | None = None  # created by the first submit
        # Critical sections enter the raw lock (a C call), not the Condition (a Python-level
        # __enter__): holding one is holding the other.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[int] = []  # keys of the queued items: a min-heap
        self._items: dict[int, object] = {}  # key -> item, for every key in _heap
        self._threads = 0  # worker loops started and not exited
        self._idle = 0  # workers blocked in _cond.wait() and not yet notified
        self._closing = False  # shutdown() was called: workers exit once the heap is empty
        self._workers: set[int] = set()  # thread idents of the running worker loops
        self._abandoned = False  # interpreter exit or fork: submissions are dropped silently

    @property
    def ctx(self) -> Context:
        """The context this executor serves."""
        return self._ctx

    @property
    def workers(self) -> int:
        """The most threads this executor runs at once."""
        return self._max

    @property
    def abandoned(self) -> bool:
        """Whether the interpreter is exiting (or this is a forked child): nothing more runs."""
        return self._abandoned

    def owns_current_thread(self) -> bool:
        """Whether the calling thread is one of this executor's workers (no lock: a set
        lookup, and only the calling thread can add or remove its own ident)."""
        return threading.get_ident() in self._workers

    def submit(self, item: object, key: int, wake: bool = True) -> bool:
        """Queue ``item`` to be run on a worker thread, smallest ``key`` first; from any thread.

        ``key`` must be unique among the queued items. With ``wake=False`` no sleeping worker
        is woken (and no thread started) until the next :meth:`wake`: a burst of submissions
        then costs one hand-off, not one per item. Returns False, queueing nothing, once
        :meth:`shutdown` was called (the engine cancels what it could not hand over) or the
        interpreter is exiting (or this is a forked child).
        """
        lock = self._lock
        lock.acquire()  # not "with": see the engine's _lock
        try:
            if self._closing:
                return False
            heapq.heappush(self._heap, key)
            self._items[key] = item
            if wake:
                self._wake_locked()
        finally:
            lock.release()
        return True

    def take(self) -> object:
        """Remove the best queued item and return it; None if the queue is empty. Never blocks.

        The engine calls it on a worker that just finished an operation, with the engine lock
        held, to start the next one in the same critical section.
        """
        lock = self._lock
        lock.acquire()
        try:
            if self._heap:
                return self._items.pop(heapq.heappop(self._heap))
        finally:
            lock.release()
        return None

    def unqueue(self, key: int) -> object:
        """Remove the queued item of ``key`` and return it; None if no item of that key is
        queued (a worker took it, or it never was). Never blocks.

        The engine calls it to run a ready operation on the thread about to wait for it
        instead (``Operation.run_here``): an item taken out here is run by nobody else. (The
        queue is short; the heap is rebuilt, O(n), under the lock.)
        """
        lock = self._lock
        lock.acquire()
        try:
            item = self._items.pop(key, None)
            if item is not None:
                heap = self._heap
                heap.remove(key)
                heapq.heapify(heap)
            return item
        finally:
            lock.release()

    def wake(self, *, caller_pops: bool = True) -> None:
        """Wake (or start) enough workers for what is queued; safe from any thread.

        A worker of this pool calling it is counted as one of them (it pops an item when it
        returns) unless ``caller_pops`` is False: it goes on with other work first.
        """
        with self._lock:
            self._wake_locked(caller_pops)

    def _wake_locked(self, caller_pops: bool = True) -> None:
        # Idle workers go first; each notify hands one wake-up to one sleeper, which then no
        # longer counts as idle (so _idle always equals the sleepers not yet notified).
        if self._closing:
            return  # no thread starts after shutdown(); the workers drain what is queued
        want = len(self._heap)
        if want and caller_pops and threading.get_ident() in self._workers:
            want -= 1  # the calling worker pops the next item itself when it returns
        while want and self._idle:
            self._idle -= 1
            self._cond.notify()
            want -= 1
        while want and self._threads < self._max:
            self._threads += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._max, thread_name_prefix=self._name)
                # An executor with threads: the interpreter's exit and os.fork() must reach it.
                lifecycle.pools_at_exit.add(self, _abandon_at_exit)
                lifecycle.pools_after_fork.add(self, _reset_in_child)
            self._pool.submit(self._work)
            want -= 1

    def shutdown(self, wait: bool) -> None:
        """Let the workers exit once the queue is empty; with ``wait``, join them."""
        with self._lock:
            self._closing = True
            self._idle = 0
            self._cond.notify_all()
            pool = self._pool
        if pool is not None:
            pool.shutdown(wait=wait)

    def _abandon(self) -> list[Any]:
        """Drop what is queued and let the workers exit after their current item; return
        the dropped items."""
        with self._lock:
            self._closing = self._abandoned = True
            dropped = list(self._items.values())
            self._heap.clear()
            self._items.clear()
            self._idle = 0
            self._cond.notify_all()
        return dropped

    def _worker_context(self) -> RunContext:
        """The RunContext of a new worker thread (called on it; GPU pools bind a stream)."""
        return self._rctx

    def _work(self) -> None:
        """Worker loop: pop the best queued callable and run it, until shut down."""
        cond = self._cond
        lock = self._lock
        heap = self._heap
        items = self._items
        run = self._run
        rctx = self._worker_context()
        with lock:
            self._workers.add(threading.get_ident())
        while True:
            lock.acquire()
            try:
                while not heap:
                    if self._closing:
                        self._threads -= 1
                        self._workers.discard(threading.get_ident())
                        return
                    self._idle += 1
                    cond.wait()
                item = items.pop(heapq.heappop(heap))
            finally:
                lock.release()
            try:
                run(item, rctx)
            except BaseException:  # the engine's runner catches user errors itself
                logger.exception("aioengine internal error in %s", self._name)
            del item  # an idle worker must not keep the last operation (and its Vars) alive

    def __repr__(self) -> str:
        return (
            f"<ThreadExecutor {self._name!r} workers={self._threads}/{self._max} "
            f"queued={len(self._heap)}>"
        )
