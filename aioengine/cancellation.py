"""Cancellation: taking an operation back, before it runs or while it does.

Part of the core, beside the scheduler, whose declared API it uses (``finish_locked``,
``dispatch_locked``, ``submit_ready``). What a cancel does depends on how far the operation got:

- PENDING or READY: it is finished CANCELLED at once, its requests withdrawn from its Vars'
  queues (later operations move up), and its awaiter's ``CancelledError`` carries ``msg``.
  A cancelled deletion did not happen: its Var is usable again.
- RUNNING a coroutine: its task is cancelled on the loop thread; the operation ends with what
  the coroutine does with the ``CancelledError``.
- RUNNING on a thread: a thread cannot be interrupted, so nothing happens (False), except for
  a remote value operation whose result nobody was given yet, which the remote collaborator
  withdraws (``RemoteSeam.withdraw_locked``).
- Final: nothing happens (False).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from . import lifecycle
from .kinds import _CORO, FnProperty, OpState
from .lock import Deferred, defer

if TYPE_CHECKING:
    from .operation import Operation
    from .scheduler import Scheduler

__all__ = ("cancel", "cancel_marker", "cancel_not_started")

_get_ident = threading.get_ident
_collection = lifecycle.collection
_PENDING = OpState.PENDING
_READY = OpState.READY
_RUNNING = OpState.RUNNING
_DONE = OpState.DONE
_CANCELLED = OpState.CANCELLED


def cancel(core: Scheduler, op: Operation[Any], msg: object) -> bool:
    """Cancel ``op`` (``Operation.cancel``, any thread); True if it was (or, from another
    thread than the loop's, will be) cancelled. From a finalizer it is deferred (``lock.py``)
    and answers whether ``op`` is not final yet."""
    core.check_fork()  # the parent's operations cannot be cancelled in a forked child
    lock = core.lock
    me = _get_ident()
    if lock.owner == me or _collection.thread == me:  # from a finalizer (lock.py)
        defer(lock, me, Deferred(cancel, core, op, msg))
        return op._state < _DONE
    ready: list[Any] = []
    with lock:
        state = op._state
        if state >= _DONE:
            return False
        if state is not _RUNNING:  # the message is kept in _result (result() raises it)
            if op.prop is FnProperty.DELETE_VAR:
                for v in op.mutate_vars:  # (finishing forgets them)
                    if v._deleted is op:
                        v._deleted = False  # a deletion cancelled did not happen
            core.finish_locked(op, _CANCELLED, msg, None, ready)
            todo = core.dispatch_locked(ready)
        elif op.kind != _CORO and op.task is None:
            # A running thread cannot be interrupted (a remote operation has a task that
            # awaits its Dask future while it holds its Vars: that one can; and a remote
            # value operation submitted whose result nobody was given yet).
            remote = core.remote
            return remote is not None and remote.withdraw_locked(op, msg)
        else:
            todo = None
    if todo is not None:
        if todo:
            core.submit_ready(todo)
        return True
    # A running coroutine: cancel its task on the loop thread.
    loop = core.loop
    assert loop is not None
    if _get_ident() == core.loop_thread:
        task = op.task
        return task.cancel(msg) if task is not None else False
    if loop.is_closed():
        return False
    loop.call_soon_threadsafe(_cancel_task, op, msg)
    return True


def _cancel_task(op: Operation[Any], msg: object) -> None:
    task = op.task
    if task is not None:
        task.cancel(msg)


def cancel_not_started(core: Scheduler) -> None:
    """Cancel every operation that has not started (``aclose(cancel=True)``); the running
    ones finish. Each awaiter's ``CancelledError`` says the engine was closed."""
    ready: list[Any] = []
    with core.lock:
        if core.segments.open is not None:
            core.segments.flush_locked(core)
        ops = list(core.live.values())  # released once unlocked (lock.py)
        for op in ops:
            if op._state is _PENDING or op._state is _READY:
                # The message its awaiter's CancelledError carries: not its own cancel.
                msg = f"{op.name!r} was cancelled before it started: the engine was closed"
                core.finish_locked(op, _CANCELLED, msg + " (aclose(cancel=True))", None, ready)
        todo = core.dispatch_locked(ready)
    core.submit_ready(todo)


def cancel_marker(core: Scheduler, marker: Operation[None]) -> None:
    """Take back ``wait_for_var``'s marker, whose awaiter gave up (cancelled or timed out)."""
    ready: list[Any] = []
    with core.lock:
        if marker._state < _DONE:
            core.finish_locked(marker, _CANCELLED, None, None, ready)
        todo = core.dispatch_locked(ready)
    if todo:
        core.submit_ready(todo)
