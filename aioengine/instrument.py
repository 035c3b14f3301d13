"""Instruments: how the history, hang dumps and statistics observe the engine (a trace
records through the core's own log instead: ``tracelog.py``).

An :class:`Instrument` is told when an operation is pushed, starts and finishes. The engine
keeps a tuple of instruments (``Scheduler.instruments``, replaced whole, never mutated, under
its lock: a hook called without the lock iterates the tuple it read, unchanged); with none
installed the cost on the hot path is one truth test. The functions below are the
scheduler's plumbing for them: calling the hooks, and uninstalling one that raised.

Threading contract: ``on_push`` and ``on_finish`` are called with the engine lock held (on the
pushing, resp. finishing thread), so they must be quick and must not call back into the
engine; ``on_start`` is called without the lock, on the thread about to run the function.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .corestate import CoreState
    from .operation import Operation

__all__ = ("Instrument",)

logger = logging.getLogger("aioengine")


class Instrument:
    """Base class of engine observers; override the hooks you need (all default to no-ops)."""

    def on_push(self, op: Operation[Any]) -> None:
        """``op`` was pushed (engine lock held; ``op.seq`` is set). Called before its
        requests are appended to its Vars' queues, in the same critical section: no other
        push or grant can come between."""

    def on_start(self, op: Operation[Any]) -> None:
        """``op`` is about to run its function on the current thread (no lock held)."""

    def on_finish(self, op: Operation[Any]) -> None:
        """``op`` reached a final state (engine lock held; ``op.state`` is final)."""

    def on_ran_on(self, op: Operation[Any], where: str | None) -> None:
        """``op``'s function ran elsewhere and has just finished there (a remote operation,
        on the loop thread, no lock held, before ``on_finish``): on ``where``, the address
        of the Dask worker that ran it, or None if that is not known (its task failed)."""

    def wrap_coroutine(
        self, op: Operation[Any], coro: Coroutine[Any, Any, Any]
    ) -> Coroutine[Any, Any, Any]:
        """Return the coroutine to run for coroutine operation ``op`` (default: ``coro``)."""
        return coro


def notify_locked(core: CoreState, hook: str, op: Operation[Any]) -> None:
    """Call the ``hook`` method (``"on_push"`` or ``"on_finish"``) of every instrument (lock
    held). One that raises is uninstalled and reported: a broken observer must not strand the
    operations it observes (the bookkeeping around the hook goes on)."""
    for inst in core.instruments:
        try:
            getattr(inst, hook)(op)
        except Exception as exc:
            failed_locked(core, inst, hook, exc)


def notify_start(core: CoreState, op: Operation[Any]) -> None:
    """:func:`notify_locked` for ``Instrument.on_start`` (called without the lock)."""
    for inst in core.instruments:
        try:
            inst.on_start(op)
        except Exception as exc:
            failed(core, inst, "on_start", exc)


def notify_ran_on(core: CoreState, op: Operation[Any], where: str | None) -> None:
    """:func:`notify_locked` for ``Instrument.on_ran_on`` (called without the lock)."""
    for inst in core.instruments:
        try:
            inst.on_ran_on(op, where)
        except Exception as exc:
            failed(core, inst, "on_ran_on", exc)


def failed(core: CoreState, inst: Instrument, hook: str, exc: Exception) -> None:
    """:func:`failed_locked` from a hook called without the lock."""
    with core.lock:
        failed_locked(core, inst, hook, exc)


def failed_locked(core: CoreState, inst: Instrument, hook: str, exc: Exception) -> None:
    """Uninstall ``inst``, whose ``hook`` raised ``exc``, and report it (lock held)."""
    uninstall_locked(core, inst)
    message = f"aioengine: {type(inst).__name__}.{hook} raised; the instrument was removed"
    loop = core.loop
    if loop is not None and not loop.is_closed():  # the handler runs later, not locked
        loop.call_soon_threadsafe(
            loop.call_exception_handler, {"message": message, "exception": exc}
        )
    else:
        logger.error(message, exc_info=exc)


def install_locked(core: CoreState, instrument: Instrument) -> None:
    """Install ``instrument`` (lock held)."""
    core.instruments = (*core.instruments, instrument)


def uninstall_locked(core: CoreState, instrument: Instrument) -> None:
    """Uninstall ``instrument`` if installed (lock held)."""
    core.instruments = tuple(i for i in core.instruments if i is not instrument)
