"""Executors: the device seam between the engine core and the things that run functions.

The engine hands every operation whose turn has come to the executor of its context. An
executor knows nothing about Vars, operations or failures: it receives a ``run`` callable, a
priority and a push sequence number, and calls ``run(rctx)`` once on one of its workers with the
:class:`~aioengine.RunContext` of that worker. Everything else (skipping, completion, releasing
Vars) happens inside ``run``. GPU and remote executors plug in here without touching
``var.py`` or ``engine.py``.

Ordering promise every executor keeps: among the ``run`` callables submitted and not started,
the one with the highest priority starts first, ties in sequence (push) order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..context import Context, RunContext

__all__ = ("Executor", "Run")

Run = Callable[[RunContext], None]
"""What an executor runs: the engine's closure around one operation; it never raises."""


class Executor(Protocol):
    """What the engine needs from the thing that runs a context's operations."""

    @property
    def ctx(self) -> Context:
        """The context this executor serves."""
        ...

    @property
    def abandoned(self) -> bool:
        """Whether it stopped taking work for good (interpreter exit): workers must return."""
        ...

    def submit(
        self, run: Run, priority: int, seq: int, wake: bool = True, tag: object = None
    ) -> None:
        """Queue ``run``; called from any thread, never blocks on running work.

        ``wake=False`` may defer starting it until the next :meth:`wake` (the engine batches
        the submissions of one event-loop iteration that way). ``tag``: the operation ``run``
        starts, for :meth:`take`.
        """
        ...

    def take(self) -> object:
        """Remove the best queued item and return its tag, or None; never blocks."""
        ...

    def wake(self, *, caller_pops: bool = True) -> None:
        """Start whatever :meth:`submit` queued with ``wake=False``.

        ``caller_pops=False``: a worker of this executor calling it will not take the next
        item itself when it returns (it goes on with another operation), so wake for all.
        """
        ...

    def shutdown(self, wait: bool) -> None:
        """Stop once the queue is empty; with ``wait``, join the workers first."""
        ...
