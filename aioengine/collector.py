"""Live operations and Python's cycle collector.

A pushed operation is reachable from its engine (``Scheduler._live``) until it completes, and it
refers back to the engine: the cycle collector cannot free it in that time, yet walks it, and
the tuple of its Vars, in each of its passes. With many operations pending (a push loop that
runs ahead of them) those walks cost about a tenth of a no-op operation's time.

So the compiled core (setup.py) takes a pushed operation out of the collector's generations
and puts it back when the operation completes: ``hide(op)`` and ``show(op)``, C functions in
``collector.pxd`` that the compiled engine inlines. Python has no call that untracks an
object, so the pure-Python engine hides nothing (this module is not compiled).

One case needs the collector to see live operations: an engine dropped, without being
closed, while operations that can never finish are pending (their loop is gone, say). The
engine and its operations are garbage then, but the collector finds that only through the
references between them. So before every full collection each engine shows all its live
operations again (:func:`watch`, which registers the engine in
``lifecycle.engines_before_full_collection``: lifecycle.py owns the ``gc.callbacks`` hook);
the full collection frees such an engine, which warns, as it would if nothing were hidden.

Invariants (compiled): an operation and the Var tuple that its push built are hidden and shown
together, in C calls that run no Python code, so no other thread runs in between; a completed
operation is shown; only an operation's own objects are hidden, never a caller's (a Var tuple
passed in by the caller, or an operator handle's, stays tracked).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import lifecycle

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ("watch",)


def watch(engine: Scheduler) -> None:
    """Make every later full collection see ``engine``'s live operations first.

    The compiled engine calls it when it is created. The registration is weak (it keeps no
    engine alive); the ``gc.callbacks`` hook that runs it is installed (once per process)
    with the first, and costs nothing until a full collection.
    """
    lifecycle.engines_before_full_collection.add(engine, _show_live)


def _show_live(engine: Scheduler) -> None:
    # Runs on the thread that collects, which may hold an engine's lock: _show_live takes
    # none, and runs no Python code.
    engine._show_live()
