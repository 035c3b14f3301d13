"""Live operations and Python's cycle collector.

A pushed operation is reachable from its engine (``Scheduler.live``) until it completes, and it
refers back to the engine: the cycle collector cannot free it in that time, yet walks it, its
context snapshot (``copy_context()`` at the push) and the tuple of its Vars in each of its
passes, and every full collection walks them together with the whole program's heap. With many
operations pending (a push loop that runs ahead of them) those walks cost more than the
operations themselves.

So the compiled core (setup.py) takes a pushed operation, its snapshot and its Var tuple out of
the collector's generations and puts them back when the operation completes: ``hide(op)`` and
``show(op)``, C functions in ``collector.pxd`` that the compiled engine inlines. Python has no
call that untracks an object, so the pure-Python engine hides nothing (this module is not
compiled).

A snapshot must be back in the collector's lists before its last reference goes: a Context's
dealloc unlinks it from them without checking that it is there. Every path shows it first:
completion (the operation keeps its snapshot until it is freed, so it is shown by then), a
push refused after the hide (``Scheduler.push`` shows what it hid before it raises), and a
full collection (below). The Var tuple may be the caller's, shared by several pending
operations: whichever of them shows it first tracks it, and a tuple's dealloc accepts an
untracked tuple.

One case needs the collector to see live operations: an engine dropped, without being
closed, while operations that can never finish are pending (their loop is gone, say). The
engine and its operations are garbage then, but the collector finds that only through the
references between them. So before every full collection each engine shows all its live
operations again (:func:`watch`, which registers the engine in
``lifecycle.engines_before_full_collection``: lifecycle.py owns the ``gc.callbacks`` hook);
the full collection frees such an engine, which warns, as it would if nothing were hidden.

A ``submit``'s call record (an ``operation.Call``) and its ``args`` tuple are hidden with
its operation and shown again when the record is called (``Call.show``: a failure's
traceback may keep them from then on), or by the full collection's walk; one never called is
freed untracked, which the deallocs of a heap type and of a tuple allow.

Invariants (compiled): an operation, its snapshot and its Var tuple are hidden and shown
together, in C calls that run no Python code, so no other thread runs in between; showing
checks each object first (tracking a tracked object is a fatal error); a completed operation
and its snapshot are shown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import lifecycle

if TYPE_CHECKING:
    from .corestate import CoreState

__all__ = ("watch",)


def watch(core: CoreState) -> None:
    """Make every later full collection see ``core``'s live operations first.

    The compiled core calls it when it is created. The registration is weak (it keeps no
    engine alive); the ``gc.callbacks`` hook that runs it is installed (once per process)
    with the first, and costs nothing until a full collection.
    """
    lifecycle.engines_before_full_collection.add(core, _show_live)


def _show_live(core: CoreState) -> None:
    # Runs on the thread that collects, which may hold an engine's lock: _show_live takes
    # none, and runs no Python code.
    core._show_live()
