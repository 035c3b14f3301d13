"""The core's state: every field of an engine's scheduler, documented and checked in one place.

:class:`CoreState` is the base of :class:`~aioengine.scheduler.Scheduler`, as distributed's
``WorkerState`` is the state its ``Worker`` drives: this module holds the fields, their
invariants (:meth:`CoreState.validate_state`), the binding to a loop and to a process, the
collaborators' attachment and the lifecycle's transitions; ``scheduler.py`` holds the
per-operation cycle that changes the rest. The collaborators read the public fields and call
the methods without an underscore (``scheduler.py``'s docstring lists that API); only the
core's modules assign a field.

Lock discipline: ``lock`` guards every mutable field below, the Vars' queues and the
operations' fields. It is held only for bookkeeping, never while user code runs and never
across an ``await``; a method that needs it held ends in ``_locked``. The loop thread takes it
for microseconds, so the loop is never blocked on a worker. User objects that a critical
section detaches go to ``lock.after`` and engine calls made by a finalizer inside one are
deferred there (``lock.py`` states that rule once); the hot paths enter and leave their critical
sections with ``lock.enter(me)`` and ``lock.leave()``, which keep ``lock.owner`` and
``lock.after``.

State (every field of :class:`CoreState`, documented once, here; :meth:`CoreState.validate_state`
checks the invariants):

- ``settings``: the engine's resolved :class:`~aioengine.settings.Settings` (immutable).
- ``lock``: the engine lock; the hot paths' critical sections are ``lock.enter(me)`` ...
  ``lock.leave()`` (``lock.py``).
- ``state``: the lifecycle (OPEN, CLOSING, CLOSED); pushes are admitted only while OPEN.
- ``_pid``, ``forked``: the creating process; ``forked`` is set in a child after ``os.fork()``.
- ``_guarded``: whether the SIGINT wrapper guards this engine (set when it is first used on the
  main thread; the façade forgets it at close: ``lock.py``).
- ``loop``, ``loop_thread``, ``_loop_is_running``: the loop bound on first use, its thread's
  ident and a call whose truth is its ``is_running()`` (``_is_running``).
- ``seq``: the sequence number of the latest operation (or marker, or segment).
- ``live``: operations pushed and not finished, by sequence number (so in push order).
- ``ledger``: the failure ledger (``failures.py``: the failures an operation may still
  see, which were thrown, and their retirement). ``failures`` is its dict of them, read
  here on the fast path: empty, a start checks for no skip.
- ``_deleted_vars``: some Var was deleted, so pushes must check their Vars.
- ``wakeups``: the loop futures that wait on this scheduler (``wait_for_all``, the
  backpressured pushes) and the inbox of wake-ups other threads leave for the loop
  (``wakeups.py``, where its state is documented).
- ``loop_queue``: READY operations for the loop thread, best first (``loopqueue.py``).
- ``_wakes``: executors to wake at the end of this loop iteration (loop thread only); not
  empty only while a ``_flush_wakes`` is scheduled (scheduled before a target is recorded).
- ``routes``: the executors and the route of each context (``routing.py``, where its state
  is documented); ``_last_route``: the last CPU route taken, ``(ctx, prop, executor)``,
  checked by identity first on every push.
- ``loop_rctx``, ``loop_ctx``: the RunContext of the operation running inline, and its
  context.
- ``instruments``: installed observers (a tuple, replaced under the lock).
- ``tracelog``: the running trace's log (``tracelog.py``), else None; set and taken back
  under the lock (``Engine.start_trace`` / ``stop_trace``).
- ``finished``: finished operations by executor and OpState (``statistics()``);
  ``_loop_finished``: its row for the loop (``finished[None]``), None until there is one.
- ``_sequencer``: serial mode's hidden Var that every operation writes, else None.
- ``segments``: bulk execution (the open segment and the active scopes; ``bulk.py``). An
  object to ``corestate.pxd``, since ``bulk.pxd`` types this class: the scheduler's hot
  paths read it through a local typed ``Segments`` (``scheduler.pxd``).
- ``gpu``: the GPU collaborator, None until the first GPU push (its opener, in ``routes``,
  attaches it: :meth:`attach_locked`).
- ``remote``: the remote collaborator, None until the first remote push (likewise).
- ``may_hold``: one of those two is open, so a READY operation may be held back by it
  (``Scheduler._held_locked``); False, the local-only fast path, pays one test for both.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import os
import threading
from collections.abc import Callable
from types import FunctionType
from typing import TYPE_CHECKING, Any

from . import instrument as _instrument
from . import lifecycle
from .bulk import Segments
from .collector import watch as _watch_collections
from .context import Context, RunContext
from .executors import Executor
from .failures import Ledger
from .instrument import Instrument
from .kinds import _BULK, _WAIT, OpState
from .lock import EngineLock, guard_interrupts, start_finalizer_thread
from .loopqueue import LoopQueue
from .routing import GpuSeam, RemoteSeam, Routes
from .settings import Settings
from .task import current_op
from .tracelog import TraceLog
from .var import Failure, Var, check_groups
from .wakeups import Wakeups, wake_locked

if TYPE_CHECKING:
    from .operation import Operation
    from .scheduler import Scheduler

__all__ = ("COMPILED", "CoreState", "State")

_get_running_loop = asyncio._get_running_loop
_partial = functools.partial
_get_ident = threading.get_ident
_RUNNING = OpState.RUNNING
_DONE = OpState.DONE

# The compiled core's C function that puts an operation back in the cycle collector's passes
# (collector.pxd, cimported by corestate.pxd). Declared, not bound: the pure-Python core calls
# it only ``if COMPILED``.
_show: Callable[[Operation[Any]], None]


def _zeros() -> list[int]:
    """A row of ``finished``: finished operations by ``OpState`` value."""
    return [0] * len(OpState)


class State(enum.Enum):
    """Lifecycle of an engine (its scheduler admits pushes only while OPEN)."""

    OPEN = "open"
    CLOSING = "closing"  # aclose() started: pushes raise, pending operations drain
    CLOSED = "closed"  # drained and executors shut down


def _after_fork_in_child(core: CoreState) -> None:
    """In a child after os.fork() (``lifecycle.engines_after_fork``): an engine of the parent
    raises on use instead of hanging.

    Its worker threads do not exist in the child and its lock may have been copied held, so
    the lock is replaced and every later call raises a clear RuntimeError.
    """
    core.forked = True
    core._use_lock(EngineLock())


def _noop(rctx: RunContext) -> None:
    """Never called: its type tells whether this module runs compiled."""


# Whether the core runs compiled (setup.py): Cython's functions are not Python functions.
# The one test of the build; the scheduler, the test suite and the benchmarks ask it too
# (engine._COMPILED).
COMPILED = type(_noop) is not FunctionType


def _is_running(loop: asyncio.AbstractEventLoop) -> Callable[[], object]:
    """A call equivalent to ``loop.is_running()`` (its truth value), as cheap as can be: every
    push from the loop's thread asks it.

    asyncio's own loops answer ``self._thread_id is not None`` in a Python method, which the
    compiled core calls as a C caller (a frame of its own, per push); reading the attribute
    directly costs half as much there. The pure-Python core's call to the method is inlined
    by the interpreter, so it keeps the method, and so does any other loop (uvloop's is C).
    """
    if (
        COMPILED
        and type(loop).is_running is asyncio.BaseEventLoop.is_running
        and hasattr(loop, "_thread_id")
    ):
        return _partial(getattr, loop, "_thread_id", None)
    return loop.is_running


class CoreState:
    """The state of one engine's core (the module docstring lists every field) and the
    methods that keep it: binding, fork checks, the lifecycle, attaching collaborators,
    the failure ledger's throws, an operation's completion (:meth:`complete_locked`: its
    counters, the waits and its awaiters; bulk segments call it for each member, as C
    calls), the loop's callbacks, and :meth:`validate_state`.

    Not created alone: :class:`~aioengine.scheduler.Scheduler` derives from it.
    """

    def __init__(
        self,
        settings: Settings,
        open_gpu: Callable[[Scheduler, Context], GpuSeam],
        instruments: tuple[Instrument, ...],
        open_remote: Callable[[Scheduler, Context], RemoteSeam],
    ) -> None:
        self.settings = settings
        self._pid = os.getpid()
        self.forked = False
        # The hot paths (push, start, finish) take and give back the lock in a try statement
        # with lock.enter() and lock.leave() ("with lock:" costs twice as much: __exit__
        # takes three arguments); compiled, each is one C call (lock.pxd).
        self._use_lock(EngineLock())
        self._guarded = False
        start_finalizer_thread()  # makes the engine calls of the collector's finalizers
        self.state = State.OPEN
        # Bound once, in one critical section with the next two (_bind).
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread = 0
        self._loop_is_running: Callable[[], object] | None = None
        self.seq = 0
        # Set in the critical section that marks a Var deleted, so a push (which checks it
        # under the lock) cannot miss it.
        self._deleted_vars = False
        self.live: dict[int, Operation[Any]] = {}
        self.ledger = Ledger()  # its state is documented in failures.py
        self.failures: dict[Failure, None] = self.ledger.failures  # the same dict
        self.wakeups = Wakeups()  # its state is documented in wakeups.py
        self.routes = Routes(open_gpu, open_remote)  # its state is documented in routing.py
        # Checked by identity first: a push loop repeats one context and property, and
        # hashing a Context or an enum runs Python code. Replaced whole (one tuple), so a
        # reader on another thread sees a consistent entry.
        self._last_route: tuple[object, object, Executor | None] = (None, None, None)
        self.loop_rctx: RunContext | None = None
        self.loop_ctx: Context | None = None  # loop thread only
        self.loop_queue = LoopQueue()
        self._wakes: list[Executor] = []
        # Replaced, never mutated, under the lock (instrument.install_locked): a hook
        # called without the lock iterates the tuple it read, unchanged.
        self.instruments: tuple[Instrument, ...] = instruments
        # Set and cleared under the lock, so that every push and finish it records is one
        # of the trace's (tracelog.py); a start, recorded unlocked, may race its removal.
        self.tracelog: TraceLog | None = None
        self.finished: dict[Executor | None, list[int]] = {}
        self._loop_finished: list[int] | None = None
        self._sequencer: Var | None = Var(self, "<serial>") if settings.serial else None
        self.segments = Segments()  # its own state is documented in bulk.py
        # While None, no fence exists and host consumers skip the fence checks (the CPU-only
        # fast path); set once, under the lock, by its opener (attach_locked).
        self.gpu: GpuSeam | None = None
        # While None, no Var carries a remote version and nothing is held for one (the
        # local-only fast path); set once, under the lock, by its opener (attach_locked).
        self.remote: RemoteSeam | None = None
        # False while both are None: dispatch asks neither whether to hold an operation (one
        # test on the local-only path); set with either, in attach_locked's critical section.
        self.may_hold = False
        lifecycle.engines_after_fork.add(self, _after_fork_in_child)
        if COMPILED:  # live operations are hidden from the collector (collector.py)
            _watch_collections(self)

    def abandon_executors(self) -> None:
        """Shut every executor down without waiting and without the lock.

        For the façade's finalizer, which may run inside a critical section of this thread
        (the engine's last reference dropped there): each step is one operation on a dict or
        a field, atomic under the GIL, and nothing creates an executor any more (no façade is
        left to push).
        """
        self._last_route = (None, None, None)
        for executor in self.routes.forget_locked():
            executor.shutdown(False)

    def __repr__(self) -> str:
        """The engine this scheduler serves, as users know it (``Engine.__repr__`` is this):
        the core's errors name the engine with it, never the scheduler."""
        mode = "serial" if self.settings.serial else f"cpu_workers={self.settings.cpu_workers}"
        return f"<aioengine.Engine {self.state.value} pending={len(self.live)} {mode}>"

    @property
    def closed(self) -> bool:
        """Whether the engine's ``aclose()`` has finished."""
        return self.state is State.CLOSED

    def validate_state(self) -> None:
        """Check the invariants of this module's state (tests; takes the lock).

        Raises:
            AssertionError: naming the first invariant that does not hold.
        """
        with self.lock:
            self.loop_queue.check_invariants()
            for seq, op in self.live.items():
                assert op.seq == seq, (seq, op)
                assert op._state < _DONE, op
                assert op.kind < _WAIT, op
            seg = self.segments.open
            assert seg is None or seg.kind == _BULK, seg
            assert self.failures is self.ledger.failures, "the ledger's dict was replaced"
            self.ledger.validate()
            self.wakeups.check()
            check_groups(self.live.values())

    def _use_lock(self, lock: EngineLock) -> None:
        """Make ``lock`` the engine lock (before the engine is shared, in a forked child, or
        in a test that swaps in a stand-in: an EngineLock by type, with its own ``take`` and
        ``give``, which the hot paths' ``enter`` and ``leave`` call)."""
        self.lock = lock

    def _bind(self) -> asyncio.AbstractEventLoop | None:
        """Bind to the running loop on first use; return the bound loop (None if unbound).

        Called from any thread. A thread with no running loop may push sync operations to
        an unbound engine; a thread running a different loop may not use the engine at all.
        """
        if self.forked:
            self.check_fork()
        if not self._guarded:  # a Ctrl-C never splits a critical section (lock.py)
            self._guarded = guard_interrupts(self)
        loop = _get_running_loop()
        bound = self.loop
        if loop is bound:
            return bound
        if loop is None:
            if bound is not None and bound.is_closed():
                raise RuntimeError(
                    f"{self!r} is bound to an event loop that is closed; create a new Engine"
                )
            return bound
        with self.lock:
            if self.loop is None:
                self.loop = loop
                self.loop_thread = _get_ident()
                self._loop_is_running = _is_running(loop)
                first = True
            else:
                first = False
        if first:
            return loop
        raise RuntimeError(
            f"{self!r} is bound to another event loop; an Engine serves the loop it was "
            "first used on: create one Engine per loop"
        )

    def require_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._bind()
        if loop is None:
            raise RuntimeError(
                f"{self!r} is not bound to an event loop yet; use it from a coroutine first"
            )
        return loop

    def shutdown_executors(self, *, wait: bool) -> list[Executor]:
        """Shut every executor down (with ``wait``, join their workers); return them."""
        with self.lock:
            self._last_route = (None, None, None)
            executors = self.routes.forget_locked()
        for executor in executors:
            executor.shutdown(wait)
        return executors

    def attach_locked(self, gpu: GpuSeam | None = None, remote: RemoteSeam | None = None) -> None:
        """Attach the GPU or the remote collaborator, once, as its opener creates it (lock
        held): from now on dispatch asks it whether to hold a READY operation back."""
        if gpu is not None:
            assert self.gpu is None
            self.gpu = gpu
        if remote is not None:
            assert self.remote is None
            self.remote = remote
        self.may_hold = True

    def check_fork(self) -> None:
        if self.forked:
            raise RuntimeError(
                f"{self!r} was created in process {self._pid} and cannot be used after "
                "os.fork(): its threads do not exist here. Create a new Engine in the child "
                "(or use multiprocessing's 'spawn' start method)"
            )

    def running_op(self) -> Operation[Any] | None:
        """The running coroutine operation of this engine the caller is inside, if any."""
        ref = current_op.get()
        current = ref() if ref is not None else None
        if current is None or current.core is not self or current._state is not _RUNNING:
            return None
        return current

    def set_state_locked(self, state: State) -> None:
        """Move the lifecycle on (the façade's close: CLOSING, then CLOSED; lock held)."""
        self.state = state

    def record_failure_locked(self, box: Failure) -> None:
        """Record a failure that a collaborator found (a GPU's device, a remote version lost
        or failed, a cluster out of reach): waits raise it until it is thrown (lock held)."""
        self.ledger.record(box)

    def take_failure_locked(self, box: Failure | None) -> BaseException | None:
        """Throw ``box``, the failure a Var carried at a wait's turn, unless it was thrown
        already: its exception, or None (lock held; failures.py)."""
        return self.ledger.take(box, self.seq, next(iter(self.live), None))

    def take_failures(self) -> list[BaseException]:
        """Claim every failure not thrown yet, in the order they happened, and clear them
        everywhere for the operations pushed from now on (``wait_for_all``, ``aclose``)."""
        with self.lock:
            return self.ledger.take_all(self.seq, next(iter(self.live), None))

    def start_trace_locked(self) -> None:
        """Start recording a trace (lock held): the operations pushed from now on are its."""
        self.tracelog = TraceLog(self.seq)

    def stop_trace_locked(self) -> TraceLog | None:
        """Stop recording the running trace, if any, and return its log (lock held)."""
        log, self.tracelog = self.tracelog, None
        return log

    def complete_locked(self, op: Operation[Any], state: OpState) -> None:
        """Make ``op`` final: counters, ``wait_for_all``, awaiters and callbacks (lock held)."""
        if self.instruments and op.kind < _WAIT:
            _instrument.notify_locked(self, "on_finish", op)
        if self.tracelog is not None and op.kind < _WAIT:
            self.tracelog.finished(op)
        if COMPILED:  # back in the cycle collector, with its Var tuple (collector.py)
            _show(op)  # noqa: F821  (corestate.pxd: compiled only)
        # A finished operation keeps no Var alive (its failure's traceback may keep it).
        op.vars = ()
        op.nreads = 0
        if op.kind < _WAIT:
            del self.live[op.seq]
            target = op.target  # statistics()
            if target is None:  # the loop's row, at hand (_loop_finished is _finished[None])
                row = self._loop_finished
                if row is None:
                    row = self._loop_finished = self.finished[None] = _zeros()
            else:
                finished = self.finished
                if target not in finished:
                    finished[target] = _zeros()
                row = finished[target]
            i = state
            row[i] += 1
            wakeups = self.wakeups
            if wakeups.capacity:
                wakeups.capacity_freed_locked(self)
            if not self.live:
                if self.ledger.thrown:  # nothing pushed before a throw is live: retire all
                    self.ledger.retire(None)
                if wakeups.idle:
                    wakeups.became_idle_locked(self)
        if op.waiters is not None or op.callbacks is not None:  # (no call when nobody waits)
            self._notify_locked(op)

    def _notify_locked(self, op: Operation[Any]) -> None:
        """Tell final ``op``'s awaiters and callbacks (lock held): at once on the loop thread,
        else through the inbox, which the loop drains (asyncio futures are the loop's)."""
        if _get_ident() == self.loop_thread:
            wake_locked(self.loop, op)
        else:
            self.wakeups.post_locked(self, op)

    def _show_live(self) -> None:
        """Show the cycle collector every live operation again (collector.py).

        Called before a full collection, on whichever thread collects, which may hold the
        lock: so it takes none. It runs no Python code, so no other thread runs meanwhile.
        """
        if COMPILED:
            for op in list(self.live.values()):
                _show(op)  # noqa: F821  (corestate.pxd: compiled only)

    def call_soon_locked(self, callback: Callable[[], None]) -> None:
        """Schedule ``callback`` on the engine's loop from any thread (lock held)."""
        loop = self.loop
        assert loop is not None
        if _get_ident() == self.loop_thread:
            loop.call_soon(callback)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(callback)

    def drain_wakeups(self) -> None:
        """Wake what other threads left for the loop (scheduled by ``wakeups.post_locked``)."""
        self.wakeups.drain(self)
