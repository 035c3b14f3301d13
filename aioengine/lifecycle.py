"""Process lifecycle: what the package does when the process forks, exits or collects garbage.

Engines, thread pools, fence pollers and blocking portals own threads and locks. A child made
by ``os.fork()`` has none of those threads (only the forking thread is copied), and a lock
another thread held at the fork stays held there forever; interpreter exit must stop the
package's threads before Python joins them, or it waits forever. This module owns every hook
the package installs for those events: its ``os.register_at_fork``,
``threading._register_atexit``, ``atexit.register`` and ``gc.callbacks`` entries are the only
ones in aioengine. It knows nothing of engines or pools (it imports only the standard
library): each :class:`Registry` holds objects *weakly*, each with the hook to call on it. A
registration never keeps its object alive, and an object that is gone is not called.

The registries, and when their hooks run:

In a forked child, right after ``os.fork()`` (``os.register_at_fork(after_in_child=...)``),
in this order, lower layers first (by the time an engine's or a portal's hook runs, what it is
built on has been reset):

1. :data:`pools_after_fork`: CPU and GPU thread pools (``executors/threads.py``) forget their
   workers, get new locks and drop what they queued; they accept nothing more.
2. :data:`pollers_after_fork`: the fence pollers (``poller.py``) forget their thread (the
   parent's) and get new locks; the next fence starts a thread in the child.
3. :data:`engines_after_fork`: engines (their scheduler, ``scheduler.py``) get a new lock and
   raise on every use.
4. :data:`portals_after_fork`: BlockingEngines (``blocking.py``) forget their loop thread
   (the parent's), raise on use, and leave :data:`portals_at_exit`.

At interpreter exit, in this order:

5. :data:`pools_at_exit` (``threading._register_atexit``: once the main thread has finished,
   *before* Python joins the non-daemon threads, and before ``concurrent.futures`` joins its
   pools' workers): every thread pool stops its worker loops; queued operations are
   cancelled, so that a non-daemon thread waiting for one wakes instead of hanging the exit.
6. :data:`portals_at_exit` (``atexit``: *after* the non-daemon threads have been joined,
   since until then they may still use a BlockingEngine): every BlockingEngine entered and
   not closed stops its loop thread, without draining.

Before each full collection (``gc.callbacks``, phase ``"start"``, generation 2):

7. :data:`engines_before_full_collection`: compiled engines show the collector their live
   operations again (``collector.py``). Installed with the first registration: until then a
   collection costs no call here.

Around every collection (``gc.callbacks``, phases ``"start"`` and ``"stop"``, installed with
the first engine: :func:`track_collections`):

8. :data:`collection` records the thread running it, so that an engine call made by a
   finalizer the collector runs is recognised (that thread may hold any lock: the engine's,
   a pool's, one of ``concurrent.futures``'s) and deferred instead of waiting for a lock of
   its own thread; at the end of the collection the deferred calls go to
   :data:`deferred_calls`, which the engine's finalizer thread (``lock.py``) makes.

Within one registry, hooks run in the order their objects were registered. A hook that
raises does not stop the others: the exception is logged (ERROR, with its traceback, on the
``aioengine`` logger, where the package reports its own internal errors) and the next hook
runs. Only :class:`Exception` is caught; a ``KeyboardInterrupt`` goes on to the interpreter,
except in the hooks before a full collection: the collector would only print it, so they all
run again and the interrupt is handed back to the interpreter for after the collection.

Locking: none. Registrations are dictionary stores (atomic under the GIL) from any thread,
and the hooks run without a lock of this module's: a forked child may have inherited any lock
held, and a collection may start on a thread that holds an engine's lock.
"""

from __future__ import annotations

import _thread
import atexit
import concurrent.futures.thread  # noqa: F401 - its exit hook must be registered before ours
import gc
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = (
    "Registry",
    "engines_after_fork",
    "engines_before_full_collection",
    "pollers_after_fork",
    "pools_after_fork",
    "pools_at_exit",
    "portals_after_fork",
    "portals_at_exit",
)

T = TypeVar("T")

logger = logging.getLogger("aioengine")


class _Entry(weakref.ref):  # type: ignore[type-arg]
    """A registration: a weak reference to the object, with its key and hook."""

    __slots__ = ("hook", "key")

    key: int
    hook: Callable[[Any], object]


class Registry:
    """Objects, held weakly, each with the hook to call on it when this registry runs.

    Objects are told apart by identity (they need not be hashable) and must support weak
    references.

    Args:
        name: what the log calls it when a hook fails.
        install: called once, with the first registration (see
            :data:`engines_before_full_collection`).
    """

    def __init__(self, name: str, install: Callable[[], None] | None = None) -> None:
        self.name = name
        self._install = install
        # id(obj) -> its entry, in registration order. An entry leaves when its object dies
        # (_forget, the weak reference's callback) or is discarded.
        self._entries: dict[int, _Entry] = {}

    def add(self, obj: T, hook: Callable[[T], object]) -> None:
        """Call ``hook(obj)`` when this registry runs, as long as ``obj`` lives.

        A second registration of ``obj`` replaces its hook and keeps its place.

        Raises:
            ValueError: if ``hook`` is a bound method of ``obj``: it would keep ``obj``
                alive. Register the function (``type(obj).method``) instead.
            TypeError: if ``obj`` does not support weak references.
        """
        if getattr(hook, "__self__", None) is obj:
            raise ValueError(
                f"{self.name}: the hook of {obj!r} is bound to it and would keep it alive; "
                "register a function that takes the object"
            )
        entry = _Entry(obj, self._forget)
        entry.key, entry.hook = id(obj), hook
        install, self._install = self._install, None
        if install is not None:
            install()
        self._entries[entry.key] = entry

    def _forget(self, entry: _Entry) -> None:
        if self._entries.get(entry.key) is entry:  # not a later registration's
            self._entries.pop(entry.key, None)

    def discard(self, obj: object) -> None:
        """Forget ``obj`` (nothing happens if it is not registered)."""
        entry = self._entries.get(id(obj))
        if entry is not None and entry() is obj:
            self._forget(entry)

    def __contains__(self, obj: object) -> bool:
        entry = self._entries.get(id(obj))
        return entry is not None and entry() is obj

    def __len__(self) -> int:
        return sum(entry() is not None for entry in self._entries.copy().values())

    def run(self) -> None:
        """Call every live object's hook, in registration order; log a hook's exception and
        go on with the next."""
        # dict.copy() runs no Python code and allocates no collected object, so no _forget
        # (nor another thread) can change the dict while it is copied.
        for entry in self._entries.copy().values():
            obj = entry()
            if obj is None:
                continue
            try:
                entry.hook(obj)
            except Exception:
                logger.exception("aioengine: %s hook %r failed on %r", self.name, entry.hook, obj)
            del obj

    def __repr__(self) -> str:
        return f"<lifecycle.Registry {self.name} objects={len(self)}>"


def _install_gc_callback() -> None:
    gc.callbacks.append(_before_collection)


pools_after_fork = Registry("pools_after_fork")
"""Thread pools; hooks run in a forked child, first."""
pollers_after_fork = Registry("pollers_after_fork")
"""Fence pollers; hooks run in a forked child, after the pools'."""
engines_after_fork = Registry("engines_after_fork")
"""Engines; hooks run in a forked child, after the pollers'."""
portals_after_fork = Registry("portals_after_fork")
"""BlockingEngines; hooks run in a forked child, last."""
pools_at_exit = Registry("pools_at_exit")
"""Thread pools; hooks run at exit before the non-daemon threads are joined."""
portals_at_exit = Registry("portals_at_exit")
"""BlockingEngines; hooks run at exit after the non-daemon threads were joined."""
engines_before_full_collection = Registry("engines_before_full_collection", _install_gc_callback)
"""Compiled engines; hooks run before each full (generation 2) collection."""

_AFTER_FORK = (pools_after_fork, pollers_after_fork, engines_after_fork, portals_after_fork)


def _after_fork_in_child() -> None:
    for registry in _AFTER_FORK:
        registry.run()


class Collection:
    """The garbage collection under way, seen from :func:`track_collections`'s callback."""

    __slots__ = ("calls", "thread")

    def __init__(self) -> None:
        #: The ident of the thread running a collection (and so its finalizers), else 0.
        #: One collection runs at a time, holding the GIL between its two callbacks.
        self.thread = 0
        #: Engine calls the collection's finalizers deferred (appended by that thread only).
        self.calls: list[object] = []


collection = Collection()
"""The collection under way (``thread`` is 0 between collections)."""
deferred_calls: queue.SimpleQueue[list[object]] = queue.SimpleQueue()
"""The engine calls of each collection's finalizers, in order, one list per collection
(``put`` is a C call that takes no lock of Python's: safe at the end of any collection)."""


def _around_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        collection.thread = threading.get_ident()
        return
    collection.thread = 0
    if collection.calls:
        calls, collection.calls = collection.calls, []
        deferred_calls.put(calls)


def track_collections() -> None:
    """Record, from now on, which thread runs each garbage collection (idempotent)."""
    if _around_collection not in gc.callbacks:
        gc.callbacks.append(_around_collection)


def _before_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start" and info["generation"] == 2:
        try:
            engines_before_full_collection.run()
        except KeyboardInterrupt:
            # The collector would only print it ("Exception ignored in"): run every hook,
            # then hand the Ctrl-C back to the interpreter, for after the collection.
            engines_before_full_collection.run()
            _thread.interrupt_main()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
# Private but stable since 3.9: concurrent.futures stops its own workers with it. Its
# callbacks run last registered first, so ours (registered after concurrent.futures.thread's,
# imported above) stops the pools' worker loops before concurrent.futures joins the workers.
threading._register_atexit(pools_at_exit.run)  # type: ignore[attr-defined]
atexit.register(portals_at_exit.run)
