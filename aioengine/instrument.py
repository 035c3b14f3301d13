"""Instruments: how tracing, hang dumps and statistics observe the engine.

An :class:`Instrument` is told when an operation is pushed, starts and finishes. The engine
keeps a tuple of instruments; with none installed the cost on the hot path is one truth test.

Threading contract: ``on_push`` and ``on_finish`` are called with the engine lock held (on the
pushing, resp. finishing thread), so they must be quick and must not call back into the
engine; ``on_start`` is called without the lock, on the thread about to run the function.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .operation import Operation

__all__ = ("Instrument",)


class Instrument:
    """Base class of engine observers; override the hooks you need (all default to no-ops)."""

    def on_push(self, op: Operation[Any]) -> None:
        """``op`` was pushed (engine lock held; ``op._seq`` is set). Called before its
        requests are appended to its Vars' queues, in the same critical section: no other
        push or grant can come between."""

    def on_start(self, op: Operation[Any]) -> None:
        """``op`` is about to run its function on the current thread (no lock held)."""

    def on_finish(self, op: Operation[Any]) -> None:
        """``op`` reached a final state (engine lock held; ``op.state`` is final)."""

    def wrap_coroutine(
        self, op: Operation[Any], coro: Coroutine[Any, Any, Any]
    ) -> Coroutine[Any, Any, Any]:
        """Return the coroutine to run for coroutine operation ``op`` (default: ``coro``)."""
        return coro
