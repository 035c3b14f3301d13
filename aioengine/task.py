"""The task of a coroutine operation: the coroutine that runs its function and finishes it.

A module of its own, interpreted even where the compiled core (setup.py) is installed: the
frames of :func:`run_coroutine` and of what it awaits stay ordinary coroutine frames, which
``engine.dump()`` walks (``cr_await``) to show where an operation is suspended.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import sys
import types
import weakref
from collections.abc import Awaitable, Callable, Generator
from types import CoroutineType
from typing import TYPE_CHECKING, Any, TypeVar

from . import instrument as _instrument
from .errors import trim_traceback
from .kinds import OpState

if TYPE_CHECKING:
    from .context import RunContext
    from .operation import Operation

_context_run = contextvars.Context.run  # unbound: no method lookup per start

__all__ = ("current_op", "quiet", "run_coroutine", "start_task")

T = TypeVar("T")

# The coroutine operation whose task is running (set in its context), to refuse waits that
# could only deadlock: an operation waiting for itself or for an operation queued behind it.
# A weak reference: the context outlives the operation in asyncio's handles and tracebacks.
current_op: contextvars.ContextVar[weakref.ref[Operation[Any]] | None] = contextvars.ContextVar(
    "aioengine_current_op", default=None
)


@types.coroutine
def _handoff() -> Generator[None, None, None]:
    """``await _handoff()`` suspends once, then resumes with None (see :func:`run_coroutine`)."""
    yield


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def run_coroutine(op: Operation[Any], fn: Callable[..., Any], rctx: RunContext) -> None:
    """The coroutine of a coroutine operation's task: run ``fn(rctx)``, then finish ``op``.

    Finishing here, at the end of the task's last step, costs no done-callback round trip
    through the loop. The engine runs this up to ``await _handoff()`` itself, before it creates
    the task (see :func:`start_task`): so whatever later happens to the task, even a
    cancellation before its first step, lands in this ``try`` and finishes ``op``.
    """
    core = op.core
    current_op.set(weakref.ref(op))  # in op's context: the task runs in it
    try:
        await _handoff()
        awaitable = fn(rctx)
        if type(awaitable) is not CoroutineType:
            if not inspect.isawaitable(awaitable):
                raise TypeError(f"{op.name!r} did not return an awaitable, got {awaitable!r}")
            awaitable = _await(awaitable)
        for inst in core.instruments:
            try:
                awaitable = inst.wrap_coroutine(op, awaitable)
            except Exception as exc:  # uninstalled and reported, as for the other hooks
                _instrument.failed(core, inst, "wrap_coroutine", exc)
        log = core.tracelog
        if log is not None:
            awaitable = log.wrap(op, awaitable)
        result = await awaitable
    except GeneratorExit as exc:
        if not _in_own_step(core.loop, sys._getframe()):
            raise  # thrown in by close() (its task destroyed with its loop): it never finishes
        # Raised by fn in a step of this task: a failure like any other (below).
        trim_traceback(exc)
        core.finish(op, OpState.FAILED, None, exc)
    except asyncio.CancelledError as exc:  # its message, if any, is cancel()'s
        core.finish(op, OpState.CANCELLED, exc.args[0] if exc.args else None, None)
        raise
    except BaseException as exc:
        # Drop this frame from the traceback: the recorded failure must not keep the
        # operation (and through it its Vars and fn) alive until someone throws it.
        trim_traceback(exc)
        core.finish(op, OpState.FAILED, None, exc)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            # Recorded, and the loop still stops, as for every operation that raises one on
            # the loop thread (docs/guarantees.md). Raised by a loop callback, not by this
            # task: the task ends normally, so asyncio reports nothing about the engine's
            # own task ("Task exception was never retrieved").
            assert core.loop is not None
            core.loop.call_soon(_reraise, exc)
    else:
        core.finish(op, OpState.DONE, result, None)


def _in_own_step(loop: asyncio.AbstractEventLoop | None, frame: types.FrameType) -> bool:
    """Whether ``frame``, :func:`run_coroutine`'s, runs a step of its own task: True when its
    function raised, False when ``close()`` threw ``GeneratorExit`` into the suspended
    coroutine (its task destroyed, its loop closed)."""
    task = asyncio.current_task(loop) if loop is not None else None
    return task is not None and getattr(task.get_coro(), "cr_frame", None) is frame


def _reraise(exc: BaseException) -> None:
    """A loop callback that raises ``exc`` (a KeyboardInterrupt or SystemExit) out of the
    loop, as asyncio does when a task raises one."""
    raise exc


def start_task(
    loop: asyncio.AbstractEventLoop | None,
    op: Operation[Any],
    fn: Callable[..., Any],
    rctx: RunContext,
) -> None:
    """Create the task of coroutine operation ``op`` on ``loop`` (the engine's, on its thread;
    ``op`` is RUNNING): the scheduler's start of every coroutine operation."""
    assert loop is not None
    coro = run_coroutine(op, fn, rctx)
    # Up to its hand-off now, in op's context (it sets current_op there): from here on a
    # cancellation of the task reaches its try statement.
    _context_run(op.snapshot, coro.send, None)
    task = loop.create_task(coro, name=op.name, context=op.snapshot)
    quiet(task)
    op.task = task  # read on the loop thread only (cancel hands off to it), so no lock


def quiet(task: asyncio.Task[Any]) -> None:
    """Let ``task``, one the engine tracks through its operation (a coroutine operation's, or
    a remote operation's wait for its Dask future: ``dump()``, ``statistics()``), be
    destroyed pending without asyncio's "Task was destroyed but it is pending!".

    When its loop closes with it pending (``asyncio.run`` ending while operations are queued
    behind a cancelled one), the operation is simply never finished, which is not worth that
    line on stderr at interpreter exit. asyncio has no public way: its finalizer logs any task
    still pending, and one whose loop has closed can neither finish nor be kept alive without
    keeping its engine (and a remote one's Dask futures) alive with it. The one write of
    asyncio's private flag in the engine.
    """
    task._log_destroy_pending = False  # type: ignore[attr-defined]
