"""Trace export: Chrome trace-event JSON that Perfetto and ``chrome://tracing`` open.

``async with engine.trace("run.json"):`` (or :meth:`Engine.start_trace` /
:meth:`Engine.stop_trace`) installs a :class:`Tracer` instrument for the duration; with no
trace running the engine pays nothing but its usual truth test on the (empty) instruments.

Layout of the trace (one process, ``aioengine``):

* one track per worker thread (``aioengine-cpu0_0`` ...): a complete slice (``ph: X``) per
  synchronous operation, from the moment it starts to the moment it finished;
* the event-loop thread: synchronous operations that run inline (``FnProperty.ASYNC``, serial
  mode);
* ``coroutine ops #k`` lanes: one slice per coroutine operation, from its start to its end,
  with child slices ``run`` (a step of the coroutine actually executing on the loop, timed by
  wrapping the coroutine, see :meth:`Tracer.wrap_coroutine`) and ``await`` (suspended between
  two steps). Lanes are allocated like registers, so operations on one lane never overlap;
* ``callback ops #k`` lanes: callback-style operations, from their start to ``on_complete()``;
* ``gpu0-compute ops #k`` lanes (one set per GPU pool): GPU operations, from the start of
  their function to the completion of the work it launched, observed through its fence. The
  stream worker moves on once it has launched, so these slices overlap its next ones: on the
  worker's own track they would cross;
* ``worker tcp://host:port #k`` lanes (a set per Dask worker): remote operations, from their
  submission to the end of their task, on the worker that ran it (the remote backend tells
  :meth:`Tracer.on_ran_on`); one whose task failed, or that the trace stopped before it
  finished, shows on ``remote ops #k`` lanes. These lanes are allocated when the trace is
  built, by the slices' times (the worker is known only at the end);
* instant events for operations that finished without running (skipped or cancelled);
* flow arrows (``ph: s`` / ``ph: f``) from each operation to the ones it waited for: those it
  depends on through a Var (see ``graph.py``) that were still pending when it was pushed.

Every operation slice carries ``args``: ``seq``, ``name``, ``kind``, ``pool``, ``const_vars``,
``mutate_vars`` (and ``commute_vars`` / ``concurrent_vars`` where used), ``priority``,
``outcome`` (``done``, ``failed``, ``cancelled``, ...) and the ``error`` of a failed one.

Cost: while tracing, the hooks only note times and copy what the events need (a tuple per
operation, keeping no operation, Var, result or failure alive); the events, arguments and
arrows are built when the trace stops, so tracing perturbs less what it measures.

Threading: hooks run on whatever thread the engine calls them from; the tracer's own lock
``_mu`` guards its fields and is taken inside the engine lock in ``on_push``/``on_finish``
(lock order: engine lock, then ``_mu``); the tracer never calls back into the engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Coroutine, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..context import DeviceType
from ..errors import summary
from ..instrument import Instrument
from ..kinds import _CALLBACK, _CORO, OpState
from ..var import MODE_NAMES
from .history import DepTracker, kind_name, pool_name
from .timeline import Timeline

if TYPE_CHECKING:
    from ..operation import Operation
    from . import Observed

__all__ = ("TraceSession", "Tracer")

_now = time.perf_counter_ns
_LANE_TID = 1 << 24  # pseudo thread ids of the lanes start here (above Linux's pid_max)
# Track order: the loop's track, then the lanes (each label's in a block), then the threads.
_LANE_SORT = 1 << 20
_THREAD_SORT = 1 << 40


class _SteppedCoroutine(Coroutine[Any, Any, Any]):
    """Runs ``coro`` unchanged, appending ``(start_ns, end_ns)`` for each step to ``steps``.

    ``cr_await`` exposes the wrapped coroutine, so await-stack walkers (``dump.py``) see
    through the wrapper.
    """

    __slots__ = ("_coro", "_steps", "_tracer")

    def __init__(
        self, coro: Coroutine[Any, Any, Any], steps: list[tuple[int, int]], tracer: Tracer
    ) -> None:
        self._coro = coro
        self._steps = steps
        self._tracer = tracer  # once it has stopped, steps are no longer timed or kept

    def send(self, value: Any) -> Any:
        if self._tracer.stopped:
            return self._coro.send(value)
        start = _now()
        try:
            return self._coro.send(value)
        finally:
            self._steps.append((start, _now()))

    def throw(self, typ: Any, val: Any = None, tb: TracebackType | None = None) -> Any:
        if self._tracer.stopped:
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
        self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        return self

    def __iter__(self) -> _SteppedCoroutine:
        return self  # pragma: no cover - asyncio calls send()

    def __next__(self) -> Any:
        return self.send(None)  # pragma: no cover - asyncio calls send()

    @property
    def cr_await(self) -> Coroutine[Any, Any, Any]:
        """The wrapped coroutine."""
        return self._coro


# seq, kind, name, executor, const names, mutate names, priority, outcome, error, end (ns),
# and where it ran (None: it never started; it finished on the thread whose id follows).
_Record = tuple[
    int,
    int,
    str,
    Any,
    list[str],
    list[tuple[str, str]],  # the Vars after the reads, with their modes
    int,
    str,
    str | None,
    int,
    "_Started | None",
    int,
]


def _lane_label(op: Operation[Any]) -> str | None:
    """The label of the lanes that show ``op``, or None: it shows on its thread's track."""
    kind = op.kind
    if kind == _CORO:
        return "coroutine ops"
    if kind == _CALLBACK:
        return "callback ops"
    device = op.ctx.device_type
    if device is _CPU:  # the usual case, first
        return None
    if device is DeviceType.GPU and op.target is not None:
        return f"{pool_name(op.target)} ops"  # launched on a stream, done at its fence
    if device is DeviceType.REMOTE:
        return _REMOTE  # submitted to Dask, done when its task is
    return None


_REMOTE = "remote ops"
_OUTCOMES = {state: state.name.lower() for state in OpState}  # (an Enum's name is a property)
_CPU = DeviceType.CPU


def _by_end(span: tuple[int, int]) -> int:
    return span[1]


class _Started:
    """An operation that has started: where and when, and its steps if a coroutine."""

    __slots__ = ("end", "label", "lane", "start", "steps", "tid", "worker")

    def __init__(self, start: int, tid: int, label: str | None = None, lane: int = 0) -> None:
        self.start = start
        self.tid = tid
        self.label = label  # its lanes' label (a key of Tracer._lanes), or None: no lane
        # The index of its lane among them; -1: a remote operation, whose lane is chosen when
        # the trace is built (by worker, see Tracer._span_lane).
        self.lane = lane
        self.steps: list[tuple[int, int]] | None = None  # a coroutine's, once wrapped
        self.worker: str | None = None  # a remote operation's Dask worker, once known
        self.end = 0  # when its task finished (ns), once known


class Tracer(Instrument):
    """Collects trace events while installed; :meth:`finish` turns them into the JSON object."""

    def __init__(self, engine: Observed) -> None:
        self._engine = engine
        self._mu = threading.Lock()
        self._t0 = _now()
        self._pid = os.getpid()
        self._deps = DepTracker()
        # seq -> (push time, its dependencies): those pending at the push get a flow arrow.
        self._waited: dict[int, tuple[int, tuple[tuple[int, str], ...]]] = {}
        self._started: dict[int, _Started] = {}
        # What the hooks record, in finishing order; finish() turns it into events, so that
        # tracing costs the traced program a tuple per operation, not its JSON.
        self._records: list[_Record] = []
        self._slices: dict[int, tuple[int, float, float]] = {}  # seq -> (tid, start, end) in us
        self._events: list[dict[str, Any]] = []
        self._threads: dict[int, tuple[str, int]] = {}  # tid -> (name, sort index)
        # Busy flags of the lanes, by label ("coroutine ops", "gpu0-compute ops", ...), and
        # the first pseudo thread id of each label's lanes.
        self._lanes: dict[str, list[bool]] = {}
        self._lane_base: dict[str, int] = {}
        # The slices (start, end in ns) of each lane of remote operations, by label
        # ("worker tcp://... ", "remote ops"): filled when the trace is built.
        self._spans: dict[str, list[list[tuple[int, int]]]] = {}
        self._flow_id = 0
        # finish() was called: running coroutines stop timing steps. Read unlocked by the loop
        # thread; a step timed as it is set lands in a list the finished trace no longer reads.
        self.stopped = False

    # -- hooks ---------------------------------------------------------------------------

    def on_push(self, op: Operation[Any]) -> None:
        """Remember ``op``'s dependencies and when it was pushed (engine lock held)."""
        deps = self._deps.push(op)
        if deps:
            pushed = _now()
            with self._mu:
                self._waited[op.seq] = (pushed, deps)

    def on_start(self, op: Operation[Any]) -> None:
        """Note when and on which thread (or lane) ``op`` starts."""
        start = _now()
        label = _lane_label(op)
        with self._mu:
            if label is _REMOTE:
                self._started[op.seq] = _Started(start, 0, label, -1)
                return
            if label is not None:
                lanes = self._lanes.setdefault(label, [])
                lane = next((i for i, busy in enumerate(lanes) if not busy), len(lanes))
                if lane == len(lanes):
                    lanes.append(True)
                else:
                    lanes[lane] = True
                self._started[op.seq] = _Started(start, self._lane_tid(label, lane), label, lane)
                return
            tid = threading.get_native_id()
            if tid not in self._threads:
                name = threading.current_thread().name
                if threading.get_ident() == self._engine._core.loop_thread:
                    self._threads[tid] = (f"event loop ({name})", 0)
                else:
                    self._threads[tid] = (name, _THREAD_SORT + 1 + len(self._threads))
            self._started[op.seq] = _Started(start, tid)

    def wrap_coroutine(
        self, op: Operation[Any], coro: Coroutine[Any, Any, Any]
    ) -> Coroutine[Any, Any, Any]:
        """Time each step of the coroutine (the ``run`` slices)."""
        with self._mu:  # (a _Started's fields change under it: finish() may be reading)
            started = self._started.get(op.seq)
            if started is None:  # the trace started between on_start and here
                return coro
            steps = started.steps = []
        return _SteppedCoroutine(coro, steps, self)

    def on_ran_on(self, op: Operation[Any], where: str | None) -> None:
        """Note the Dask worker that ran remote operation ``op``, and when its task ended."""
        end = _now()
        with self._mu:
            started = self._started.get(op.seq)
            if started is not None:
                started.worker = where
                started.end = end

    def on_finish(self, op: Operation[Any]) -> None:
        """Record what ``op``'s slices and flows need (engine lock held)."""
        end = _now()
        exc = op._exception
        error = None if exc is None else summary(exc)
        outcome = None
        with self._mu:
            started = self._started.pop(op.seq, None)
            if started is None:  # not started in the trace: skipped, cancelled, or earlier
                here = threading.get_native_id()
                if here not in self._threads:
                    self._threads[here] = (threading.current_thread().name, _THREAD_SORT)
                if op._state is OpState.DONE or op._state is OpState.FAILED:
                    outcome = f"{_OUTCOMES[op._state]} (started before the trace)"
            else:
                here = started.tid
                if started.end:
                    end = started.end
                if started.label is not None and started.lane >= 0:
                    self._lanes[started.label][started.lane] = False
            self._records.append(self._record(op, outcome, error, end, started, here))

    @staticmethod
    def _record(
        op: Operation[Any],
        outcome: str | None,
        error: str | None,
        end: int,
        started: _Started | None,
        here: int,
    ) -> _Record:
        """What the events of ``op`` need, copied: the trace keeps no operation or Var alive,
        nor the result or failure they hold."""
        nreads, modes, vars_ = op.nreads, op.modes, op.vars
        if modes is None:  # all writes: the usual case, without the modes' names
            mutate = [(v.name, "write") for v in vars_[nreads:]]
        else:
            mutate = [(v.name, MODE_NAMES[m]) for v, m in zip(vars_[nreads:], modes, strict=True)]
        return (
            op.seq,
            op.kind,
            op.name,
            op.target,
            [v.name for v in vars_[:nreads]] if nreads else [],
            mutate,
            op.priority,
            _OUTCOMES[op._state] if outcome is None else outcome,
            error,
            end,
            started,
            here,
        )

    # -- building events (``_mu`` held) -------------------------------------------------

    def _lane_tid(self, label: str, lane: int) -> int:
        base = self._lane_base.get(label)
        if base is None:  # labels in order of first use; lanes sort after the loop's track
            base = self._lane_base[label] = _LANE_TID * (len(self._lane_base) + 1)
        tid = base + lane
        if tid not in self._threads:
            self._threads[tid] = (f"{label} #{lane + 1}", base // _LANE_TID * _LANE_SORT + lane)
        return tid

    def _span_lane(self, started: _Started, end: int) -> int:
        """The lane of a remote operation's slice: the first lane of its worker (or of
        ``remote ops``, the worker unknown) where it overlaps no other slice."""
        label = f"worker {started.worker}" if started.worker else _REMOTE
        lanes = self._spans.setdefault(label, [])
        span = (started.start, end)
        for lane, spans in enumerate(lanes):
            # (Most slices start after the lane's last one ended: the ``all`` is rare.)
            if spans[-1][1] <= span[0] or all(e <= span[0] or s >= span[1] for s, e in spans):
                spans.append(span)
                if spans[-2][1] > span[1]:
                    spans.sort(key=_by_end)
                return self._lane_tid(label, lane)
        lanes.append([span])
        return self._lane_tid(label, len(lanes) - 1)

    def _us(self, ns: int) -> float:
        return (ns - self._t0) / 1000.0

    def _finish(self, record: _Record) -> None:
        seq, kind, name, target, const, mutate, priority, outcome, error, end, started, tid = record
        args: dict[str, Any] = {
            "seq": seq,
            "name": name,
            "kind": kind_name(kind),
            "pool": pool_name(target),
            "const_vars": const,
            "mutate_vars": [n for n, mode in mutate if mode == "write"],
            "priority": priority,
            "outcome": outcome,
        }
        for mode in ("commute", "concurrent"):  # only where used: the usual args stay as they were
            named = [n for n, m in mutate if m == mode]
            if named:
                args[f"{mode}_vars"] = named
        if error is not None:
            args["error"] = error
        pushed, waited = self._waited.pop(seq, (0, ()))
        if started is None:  # finished without running: an instant on the finishing thread
            self._events.append(
                {
                    "name": args["name"],
                    "cat": "op",
                    "ph": "i",
                    "s": "t",
                    "ts": self._us(end),
                    "pid": self._pid,
                    "tid": tid,
                    "args": args,
                }
            )
            return
        if started.lane < 0:
            tid = self._span_lane(started, end)
        start_us, end_us = self._us(started.start), self._us(end)
        self._slice(args["name"], "op", tid, start_us, end_us, args)
        if started.steps:
            previous: float | None = None
            for step_start, step_end in started.steps:
                s, e = self._us(step_start), self._us(min(step_end, end))
                if previous is not None and s > previous:
                    self._slice("await", "await", tid, previous, s, {"seq": seq})
                self._slice("run", "run", tid, s, e, {"seq": seq})
                previous = e
        self._slices[seq] = (tid, start_us, end_us)
        if not waited:
            return
        pushed_us = self._us(pushed)
        slices, append, pid = self._slices, self._events.append, self._pid
        # Where the arrow ends: just inside this slice (half of it if shorter than 1 us).
        end_ts = start_us + min(0.5, (end_us - start_us) / 2)
        for dep, var in waited:
            source = slices.get(dep)
            if source is None:
                continue
            dep_tid, dep_start, dep_end = source
            if dep_end <= pushed_us:
                continue  # it had finished when this one was pushed: nothing was waited for
            self._flow_id += 1
            fid = self._flow_id
            name = f"waits on {var}"
            start_ts = dep_end - min(0.5, (dep_end - dep_start) / 2)
            append(
                {"name": name, "cat": "dependency", "id": fid, "ph": "s", "ts": start_ts,
                 "pid": pid, "tid": dep_tid}
            )  # fmt: skip
            append(
                {"name": name, "cat": "dependency", "id": fid, "ph": "f", "bp": "e",
                 "ts": end_ts, "pid": pid, "tid": tid}
            )  # fmt: skip

    def _slice(
        self, name: str, cat: str, tid: int, start: float, end: float, args: dict[str, Any]
    ) -> None:
        self._events.append(
            {
                "name": name,
                "cat": cat,
                "ph": "X",
                "ts": start,
                "dur": max(end - start, 0.0),
                "pid": self._pid,
                "tid": tid,
                "args": args,
            }
        )

    # -- output --------------------------------------------------------------------------

    def finish(self, live: list[Operation[Any]]) -> dict[str, Any]:
        """Close the slices of ``live`` operations still running and return the trace."""
        self.stopped = True
        end = _now()
        with self._mu:
            records = self._records
            self._records = []
            for op in live:
                started = self._started.pop(op.seq, None)
                if started is not None:
                    outcome = "unfinished (trace stopped)"
                    records.append(self._record(op, outcome, None, end, started, started.tid))
            for record in records:
                self._finish(record)
            events = sorted(self._events, key=lambda e: (e["ts"], e["ph"] != "X"))
            meta: list[dict[str, Any]] = [
                {"name": "process_name", "ph": "M", "pid": self._pid, "args": {"name": "aioengine"}}
            ]
            for tid, (name, index) in sorted(self._threads.items()):
                meta.append(
                    {"name": "thread_name", "ph": "M", "pid": self._pid, "tid": tid,
                     "args": {"name": name}}
                )  # fmt: skip
                meta.append(
                    {"name": "thread_sort_index", "ph": "M", "pid": self._pid, "tid": tid,
                     "args": {"sort_index": index}}
                )  # fmt: skip
        return {
            "traceEvents": meta + events,
            "displayTimeUnit": "ms",
            "otherData": {"producer": "aioengine"},
        }


def tracer_of(instruments: tuple[object, ...]) -> Tracer | None:
    """The running :class:`Tracer` among an engine's instruments, if any."""
    return next((i for i in instruments if isinstance(i, Tracer)), None)


def finish_trace(
    tracer: Tracer, live: list[Operation[Any]], path: str | os.PathLike[str] | None
) -> dict[str, Any]:
    """The trace of an uninstalled ``tracer`` (``live``: the operations still pending),
    also written to ``path``."""
    trace = tracer.finish(live)
    if path is not None:
        _write(trace, path)
    return trace


def _write(trace: dict[str, Any], path: str | os.PathLike[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)


class TraceSession:
    """What :meth:`Engine.trace` returns: traces while its ``with`` / ``async with`` block runs.

    Attributes:
        path: where the JSON is written on exit (None: not written).
        trace: the trace-event JSON object, once the block has exited (else None); see
            :meth:`timeline` to draw it.
    """

    def __init__(self, engine: Observed, path: str | os.PathLike[str] | None) -> None:
        self._engine = engine
        self.path = path
        self.trace: dict[str, Any] | None = None

    def __enter__(self) -> TraceSession:
        self._engine.start_trace()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.trace = self._engine.stop_trace()
        if self.path is not None:  # kept in .trace even if writing it fails
            _write(self.trace, self.path)

    def timeline(self) -> Timeline:
        """The recorded trace as a :class:`Timeline`: a Gantt chart that Jupyter draws inline.

        Call it after the block has exited; ``str()`` of the result summarises the trace. Safe
        to call from any thread.

        Raises:
            RuntimeError: if the ``with`` block has not exited yet (no trace to draw).
        """
        if self.trace is None:
            raise RuntimeError(
                f"the trace of {self._engine!r} is not finished; call timeline() after the "
                "`with engine.trace()` block has exited"
            )
        return Timeline(self.trace)

    async def __aenter__(self) -> TraceSession:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Encoding and writing a large trace takes long: on a thread, not the event loop's.
        self.trace = self._engine.stop_trace()
        if self.path is not None:  # kept in .trace even if writing it fails
            await asyncio.to_thread(_write, self.trace, self.path)
