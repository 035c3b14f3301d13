"""Executors: the device seam between the engine core and the things that run functions.

The engine hands every operation whose turn has come to the executor of its context. An
executor knows nothing about Vars, operations or failures: it is built with a ``run`` function
(the engine's), receives opaque items with an integer key, and calls ``run(item, rctx)`` once
per item on one of its workers, with the :class:`~aioengine.RunContext` of that worker.
Everything else (skipping, completion, releasing Vars) happens inside ``run``. GPU and remote
executors plug in here without touching ``var.py`` or ``scheduler.py``.

Ordering promise every executor keeps: among the items submitted and not started, the one with
the smallest key starts first (the engine's keys encode priority, then push order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..context import Context, RunContext

__all__ = ("Executor", "Run")

Run = Callable[[Any, RunContext], None]
"""What an executor calls for each item: the engine's runner; it never raises."""


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

    def owns_current_thread(self) -> bool:
        """Whether the calling thread is one of this executor's workers."""
        ...

    def submit(self, item: object, key: int, wake: bool = True) -> bool:
        """Queue ``item`` (``key``: unique, smaller runs first); from any thread, never blocks.

        ``wake=False`` may defer starting it until the next :meth:`wake` (the engine batches
        the submissions of one event-loop iteration that way). Returns False, queueing
        nothing, once :meth:`shutdown` was called (or the executor was abandoned).
        """
        ...

    def take(self) -> Any:
        """Remove the best queued item and return it, or None if none is queued; never blocks."""
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
