"""The trace log: what the core records of each operation while a trace runs.

``Engine.start_trace`` installs a :class:`TraceLog` on the core (``CoreState.tracelog``); the
core tells it of every push, start and finish, and ``Engine.stop_trace`` takes it back and
hands it to ``observe/trace.py``, which builds the trace (slices, lanes, dependency arrows,
track names) from it. With no trace running, the core pays one ``is None`` test per event.

Recording is append-only and copies raw fields: a push appends its sequence number and time,
a start one tuple (sequence number, time, thread), a finish the fields its slice needs.
Nothing is formatted, looked up or allocated per operation beyond the integers of the times,
so that a trace costs the program it observes a fraction of an operation (Perfetto's SDK and
Ray's timeline record the same way). Integers, strings and the lists that hold them are
invisible to the cycle collector: a long trace adds nothing to its full collections.

What is kept alive: no operation, Var, result or failure. A Var is recorded as ``id()`` and
name, read at its operation's finish while the operation still holds it (the builder tells
Vars apart by these: an id reused by a later Var only ever pairs an operation that had
finished with one pushed after it, which no dependency arrow joins; see observe/trace.py).
A failure is recorded as its one-line summary.

Threading: ``pushed`` and ``finished`` run with the engine lock held (so their flat records
never interleave); ``started`` runs on the thread about to run the function, without the
lock, and appends one tuple (a single append is atomic). ``wrap`` and ``ran_on`` run on the
loop thread. The log is taken off the core under the engine lock: no push or finish records
after that; a start racing the stop may still land, and the builder reads a snapshot.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Coroutine, Generator
from types import FunctionType, TracebackType
from typing import TYPE_CHECKING, Any

from .errors import summary

if TYPE_CHECKING:
    from .operation import Operation

__all__ = ("FINISH_FIELDS", "SteppedCoroutine", "TraceLog")

_now = time.perf_counter_ns
_get_ident = threading.get_ident

# The compiled core's C versions of those two and of id() (tracelog.pxd: the same clock as
# time.perf_counter_ns, threading.get_ident's value, and id's). Declared, not bound: the
# pure-Python log calls them only ``if COMPILED``.
_clock: Callable[[], int]
_thread_ident: Callable[[], int]
_key: Callable[[object], int]  # id()


def _noop() -> None:
    """Never called: its type tells whether this module runs compiled."""


COMPILED = type(_noop) is not FunctionType

# A finish record in ``TraceLog.finishes`` is FINISH_FIELDS values, then an ``id()`` and a
# name per Var (const, then mutate): seq, end (ns), thread ident, state, error summary or
# None, name, kind, target, ctx, priority, nreads, modes, and the number of Vars.
FINISH_FIELDS = 13


class TraceLog:
    """The raw events of one trace, in the order they happened (per list).

    Fields (each written only as the module docstring says):

    - ``first``: the last sequence number pushed before the trace started; operations after
      it were pushed during the trace.
    - ``t0``: when the trace started (``time.perf_counter_ns``).
    - ``pushes``: ``seq, ns`` per push, flat.
    - ``starts``: ``(seq, ns, thread ident)`` per start.
    - ``finishes``: a flat record per finish (:data:`FINISH_FIELDS`).
    - ``threads``: thread ident -> ``(native id, name)`` of each thread that started an
      operation, at its first start (names of threads that end before the trace stops).
    - ``steps``: seq -> the ``(start, end)`` of each step of a coroutine operation.
    - ``ran``: seq -> ``(worker address or None, ns)`` of a remote operation whose task ended.
    - ``stopped``: set when the trace stops; wrapped coroutines stop timing their steps.
    """

    def __init__(self, first: int) -> None:
        self.first = first
        self.t0 = _now()
        self.pushes: list[int] = []
        self.starts: list[tuple[int, int, int]] = []
        self.finishes: list[Any] = []
        self.threads: dict[int, tuple[int, str]] = {}
        self.steps: dict[int, list[tuple[int, int]]] = {}
        self.ran: dict[int, tuple[str | None, int]] = {}
        self.stopped = False

    def pushed(self, op: Operation[Any]) -> None:
        """``op`` was pushed (engine lock held; ``op.seq`` is set)."""
        pushes = self.pushes
        pushes.append(op.seq)
        if COMPILED:
            pushes.append(_clock())  # noqa: F821  (tracelog.pxd: compiled only)
        else:
            pushes.append(_now())

    def started(self, op: Operation[Any]) -> None:
        """``op`` is about to run on the current thread (no lock held)."""
        if COMPILED:
            ns = _clock()  # noqa: F821  (tracelog.pxd: compiled only)
            ident = _thread_ident()  # noqa: F821  (tracelog.pxd: compiled only)
        else:
            ns = _now()
            ident = _get_ident()
        if ident not in self.threads:
            self._first_start(ident)
        self.starts.append((op.seq, ns, ident))

    def _first_start(self, ident: int) -> None:
        """Remember the native id and name of the current thread (ident ``ident``)."""
        thread = threading.current_thread()
        self.threads[ident] = (thread.native_id or ident, thread.name)

    def finished(self, op: Operation[Any]) -> None:
        """``op`` reached a final state (engine lock held, its Vars not yet dropped; not a
        wait's marker or a bulk segment, whose members are recorded)."""
        f = self.finishes
        f.append(op.seq)
        if COMPILED:
            f.append(_clock())  # noqa: F821  (tracelog.pxd: compiled only)
            f.append(_thread_ident())  # noqa: F821  (tracelog.pxd: compiled only)
        else:
            f.append(_now())
            f.append(_get_ident())
        f.append(op._state)
        exc = op._exception
        f.append(None if exc is None else summary(exc))
        f.append(op.name)
        f.append(op.kind)
        f.append(op.target)
        f.append(op.ctx)
        f.append(op.priority)
        f.append(op.nreads)
        f.append(op.modes)
        vars_ = op.vars
        f.append(len(vars_))
        if COMPILED:
            for v in vars_:
                f.append(_key(v))  # noqa: F821  (tracelog.pxd: compiled only)
                f.append(v.name)
        else:
            for v in vars_:
                f.append(id(v))
                f.append(v.name)

    def wrap(self, op: Operation[Any], coro: Coroutine[Any, Any, Any]) -> Coroutine[Any, Any, Any]:
        """The coroutine to run for coroutine operation ``op``: ``coro``, its steps timed."""
        steps: list[tuple[int, int]] = []
        self.steps[op.seq] = steps
        return SteppedCoroutine(coro, steps, self)

    def ran_on(self, op: Operation[Any], where: str | None) -> None:
        """Remote operation ``op``'s task ended, on Dask worker ``where`` (None: unknown)."""
        self.ran[op.seq] = (where, _now())


class SteppedCoroutine(Coroutine[Any, Any, Any]):
    """Runs ``coro`` unchanged, appending ``(start_ns, end_ns)`` for each step to ``steps``.

    ``cr_await`` exposes the wrapped coroutine, so await-stack walkers (``dump.py``) see
    through the wrapper.
    """

    __slots__ = ("_coro", "_log", "_steps")

    def __init__(
        self, coro: Coroutine[Any, Any, Any], steps: list[tuple[int, int]], log: TraceLog
    ) -> None:
        self._coro = coro
        self._steps = steps
        self._log = log  # once its trace has stopped, steps are no longer timed or kept

    def send(self, value: Any) -> Any:
        """Run one step (timed while the trace runs)."""
        if self._log.stopped:
            return self._coro.send(value)
        start = _now()
        try:
            return self._coro.send(value)
        finally:
            self._steps.append((start, _now()))

    def throw(self, typ: Any, val: Any = None, tb: TracebackType | None = None) -> Any:
        """Throw into the coroutine: one step (timed while the trace runs)."""
        if self._log.stopped:
            return self._throw(typ, val, tb)
        start = _now()
        try:
            return self._throw(typ, val, tb)
        finally:
            self._steps.append((start, _now()))

    def _throw(self, typ: Any, val: Any, tb: TracebackType | None) -> Any:
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - the 3-argument form

    def close(self) -> None:
        """Close the wrapped coroutine."""
        self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        return self

    def __iter__(self) -> SteppedCoroutine:
        return self  # pragma: no cover - asyncio calls send()

    def __next__(self) -> Any:
        return self.send(None)  # pragma: no cover - asyncio calls send()

    @property
    def cr_await(self) -> Coroutine[Any, Any, Any]:
        """The wrapped coroutine."""
        return self._coro
