"""Wake-ups: the loop futures that wait on the scheduler, and how other threads wake them.

A collaborator of the scheduler inside the core: :class:`Wakeups` is its typed field
``core.wakeups``. Nothing touches the event loop unless someone waits: loop futures exist only
for the awaiters of an operation, of ``wait_for_all`` (*idle* waiters: no operation pending)
and of the backpressured pushes (*capacity* waiters: fewer than ``max_pending``). asyncio's
futures belong to the loop, so a worker thread that finishes an operation never sets one: it
leaves the wake-up in the *inbox* and schedules one drain on the loop (``call_soon_threadsafe``
once per batch, not per operation).
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .corestate import CoreState
    from .operation import Operation

__all__ = ("Wakeups", "wake_locked")

_get_ident = threading.get_ident


def wake_locked(loop: asyncio.AbstractEventLoop | None, op: Operation[Any]) -> None:
    """Schedule final ``op``'s callbacks, then resolve its awaiters (loop thread, lock held).

    In that order, so that a callback added before ``await op`` has run when the await
    returns, as with an asyncio.Future (resolving a waiter schedules its task's step).
    """
    callbacks = op.callbacks
    if callbacks is not None:
        op.callbacks = None
        assert loop is not None
        for fn, context in callbacks:
            loop.call_soon(fn, op, context=context)
    waiters = op.waiters
    if waiters is not None:
        op.waiters = None
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


def _resolve(waiters: list[asyncio.Future[None]]) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)


class Wakeups:
    """The scheduler's waiters and its inbox of wake-ups for the loop.

    Its state, every field guarded by the engine lock (``core.lock``):

    - ``idle``: the futures of ``wait_for_all`` callers, set once no operation is pending.
    - ``capacity``: the futures of backpressured pushes, set once fewer than ``max_pending``
      operations are pending (each caller checks the bound again).
    - ``inbox``: final operations whose awaiters and callbacks the loop must wake, left by
      other threads.
    - ``idle_due``, ``capacity_due``: another thread saw the idle or the capacity waiters'
      condition met; the next drain wakes them.
    - ``scheduled``: True iff a drain is scheduled on the loop and has not yet swapped
      ``inbox`` out (so one ``call_soon_threadsafe`` serves a whole batch).
    """

    def __init__(self) -> None:
        self.idle: list[asyncio.Future[None]] = []
        self.capacity: list[asyncio.Future[None]] = []
        self.inbox: list[Operation[Any]] = []
        self.idle_due = False
        self.capacity_due = False
        self.scheduled = False

    def idle_waiter_locked(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A loop future set once no operation is pending (``wait_for_all``; lock held)."""
        fut: asyncio.Future[None] = loop.create_future()
        self.idle.append(fut)
        return fut

    def capacity_waiter_locked(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A loop future set once fewer operations than ``max_pending`` are pending (the
        backpressured pushes; lock held)."""
        fut: asyncio.Future[None] = loop.create_future()
        self.capacity.append(fut)
        return fut

    def drop_waiter_locked(self, fut: asyncio.Future[None]) -> None:
        """Forget a waiter whose awaiter was cancelled before it was set (lock held)."""
        for waiters in (self.idle, self.capacity):
            if fut in waiters:
                waiters.remove(fut)

    def post_locked(self, core: CoreState, op: Operation[Any] | None = None) -> None:
        """Leave final ``op`` (if any) in the inbox, and make sure a drain is scheduled on
        the loop (another thread; lock held)."""
        if op is not None:
            self.inbox.append(op)
        if not self.scheduled:
            self.scheduled = True
            core.call_soon_locked(core.drain_wakeups)

    def drain(self, core: CoreState) -> None:
        """Wake what other threads left for the loop (the loop thread; takes the lock)."""
        with core.lock:
            ops = self.inbox
            self.inbox = []
            idle = self.idle_due
            self.idle_due = False
            if self.capacity_due:
                self.capacity_due = False
                self.wake_capacity_locked(core)
            self.scheduled = False
            loop = core.loop
            for op in ops:
                wake_locked(loop, op)
            if idle and not core.live:
                self.wake_idle_locked()

    def capacity_freed_locked(self, core: CoreState) -> None:
        """An operation completed while pushes wait for capacity: wake them now on the loop
        thread, else at the next drain (lock held)."""
        if _get_ident() == core.loop_thread:
            self.wake_capacity_locked(core)
        else:
            self.capacity_due = True
            self.post_locked(core)

    def became_idle_locked(self, core: CoreState) -> None:
        """The last pending operation completed while ``wait_for_all`` callers wait: wake them
        now on the loop thread, else at the next drain (lock held)."""
        if _get_ident() == core.loop_thread:
            self.wake_idle_locked()
        else:
            self.idle_due = True
            self.post_locked(core)

    def wake_capacity_locked(self, core: CoreState) -> None:
        """Wake every backpressured push; each re-checks the bound (loop thread, lock held)."""
        limit = core.settings.max_pending
        if limit is not None and len(core.live) >= limit:
            return
        waiters = self.capacity
        self.capacity = []
        _resolve(waiters)

    def wake_idle_locked(self) -> None:
        """Wake every ``wait_for_all`` caller (loop thread, lock held)."""
        waiters = self.idle
        self.idle = []
        _resolve(waiters)

    def check(self) -> None:
        """Check this state's invariant (``Scheduler.validate_state``; lock held)."""
        assert not self.inbox or self.scheduled, "inbox not scheduled"
