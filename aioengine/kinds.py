"""What an operation is: its property, its state, and the kind of function it runs.

Leaf types: the enums that every layer names (executors route by :class:`FnProperty`, the
scheduler moves operations through :class:`OpState`, observers count by both), with no
knowledge of the engine.
"""

from __future__ import annotations

import enum
import numbers

__all__ = ("FnProperty", "OpState", "check_priority", "check_prop")


class FnProperty(enum.IntEnum):
    """How an operation is routed and treated, as MXNet's ``FnProperty`` (same values).

    On a CPU context: ``NORMAL``, ``COPY_FROM_GPU``, ``COPY_TO_GPU``, ``GPU_PRIORITIZED`` and
    ``NO_SKIP`` run on the context's thread pool; ``CPU_PRIORITIZED`` on the separate priority
    pool; ``ASYNC`` runs a sync function inline on the event-loop thread when its turn comes
    (for cheap, non-blocking functions: no thread hop). ``NO_SKIP`` and ``DELETE_VAR`` run even
    when an input carries a failure.
    """

    NORMAL = 0
    COPY_FROM_GPU = 1
    COPY_TO_GPU = 2
    CPU_PRIORITIZED = 3
    ASYNC = 4
    DELETE_VAR = 5
    GPU_PRIORITIZED = 6
    NO_SKIP = 7


class OpState(enum.IntEnum):
    """Where an :class:`Operation` is in its life; the last four are final."""

    PENDING = 0  #: waiting for its turn on its Vars
    READY = 1  #: its turn has come; queued for an executor
    RUNNING = 2  #: its function has been called and has not finished
    DONE = 3  #: its function returned
    FAILED = 4  #: its function raised (or passed an exception to ``on_complete``)
    SKIPPED = 5  #: not run because an input carried a failure (raises DependencyError)
    #: cancelled before it finished: its function never ran, was interrupted, or ended
    #: itself with CancelledError (whose message the operation keeps)
    CANCELLED = 6


# Kinds of function an operation runs.
_SYNC = 0  # fn(rctx) -> T on an executor thread (or inline on the loop)
_CORO = 1  # async fn(rctx) -> T as a task on the engine's loop
_CALLBACK = 2  # fn(rctx, on_complete) -> None; complete when on_complete() is called
_WAIT = 3  # no function: a marker that completes as soon as it is granted (wait_for_var);
# its _result is the failure box its Var carried then (None if none)
# Kinds from _WAIT up are the engine's own records, never a user's operation: not counted,
# not shown to instruments, not in Scheduler.live.
_BULK = 4  # a bulk segment: holds its members' Vars and runs them in push order (bulk.py);
# its _result holds the member list until it runs, its fn stays None


def check_prop(prop: object) -> None:
    """Raise TypeError unless ``prop`` is a :class:`~aioengine.FnProperty`."""
    if not isinstance(prop, FnProperty):
        raise TypeError(f"prop must be an aioengine.FnProperty, got {prop!r}")


def check_priority(priority: object) -> int:
    """Return ``priority`` as an int: any integer (``numbers.Integral``, NumPy's included)
    but a bool; else raise TypeError naming its type."""
    if type(priority) is not bool and isinstance(priority, numbers.Integral):
        return int(priority)
    raise TypeError(f"priority must be an int, got {priority!r} ({type(priority).__name__})")
