"""Trace export: Chrome trace-event JSON that Perfetto and ``chrome://tracing`` open.

``async with engine.trace("run.json"):`` (or :meth:`Engine.start_trace` /
:meth:`Engine.stop_trace`) installs a trace log on the core for the duration
(``tracelog.py``: the core appends raw fields per push, start and finish); at the stop a
:class:`Tracer` builds the trace from it. With no trace running the engine pays one
``is None`` test per event.

Layout of the trace (one process, ``aioengine``):

* one track per worker thread (``aioengine-cpu0_0`` ...): a complete slice (``ph: X``) per
  synchronous operation, from the moment it starts to the moment it finished;
* the event-loop thread: synchronous operations that run inline (``FnProperty.ASYNC``, serial
  mode);
* ``coroutine ops #k`` lanes: one slice per coroutine operation, from its start to its end,
  with child slices ``run`` (a step of the coroutine actually executing on the loop, timed by
  wrapping the coroutine, see ``TraceLog.wrap``) and ``await`` (suspended between
  two steps). Lanes are allocated like registers, so operations on one lane never overlap;
* ``callback ops #k`` lanes: callback-style operations, from their start to ``on_complete()``;
* ``gpu0-compute ops #k`` lanes (one set per GPU pool): GPU operations, from the start of
  their function to the completion of the work it launched, observed through its fence. The
  stream worker moves on once it has launched, so these slices overlap its next ones: on the
  worker's own track they would cross;
* ``worker tcp://host:port #k`` lanes (a set per Dask worker): remote operations, from their
  submission to the end of their task, on the worker that ran it (the remote backend tells
  ``TraceLog.ran_on``); one whose task failed, or that the trace stopped before it
  finished, shows on ``remote ops #k`` lanes. These lanes are allocated when the trace is
  built, by the slices' times (the worker is known only at the end);
* instant events for operations that finished without running (skipped or cancelled);
* flow arrows (``ph: s`` / ``ph: f``) from each operation to the ones it waited for: those it
  depends on through a Var (see ``graph.py``) that were still pending when it was pushed.

Every operation slice carries ``args``: ``seq``, ``name``, ``kind``, ``pool``, ``const_vars``,
``mutate_vars`` (and ``commute_vars`` / ``concurrent_vars`` where used), ``priority``,
``outcome`` (``done``, ``failed``, ``cancelled``, ...) and the ``error`` of a failed one.

Cost: while tracing, the core only appends times and the fields the events need (keeping
no operation, Var, result or failure alive; ``tracelog.py``); threads are named, lanes
allocated, dependencies found and events, arguments and arrows built when the trace stops,
so tracing perturbs little what it measures.

Threading: :class:`Tracer` runs once, on the thread that stops the trace, on a log already
taken off the core (``Engine.stop_trace``); it never calls back into the engine.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import os
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..context import Context, DeviceType
from ..kinds import _CALLBACK, _CORO, _WAIT, OpState
from ..tracelog import FINISH_FIELDS, TraceLog
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


def _lane_label(kind: int, ctx: Context, target: Any) -> str | None:
    """The label of the lanes that show an operation, or None: it shows on its thread's track."""
    if kind == _CORO:
        return "coroutine ops"
    if kind == _CALLBACK:
        return "callback ops"
    device = ctx.device_type
    if device is _CPU:  # the usual case, first
        return None
    if device is DeviceType.GPU and target is not None:
        return f"{pool_name(target)} ops"  # launched on a stream, done at its fence
    if device is DeviceType.REMOTE:
        return _REMOTE  # submitted to Dask, done when its task is
    return None


_REMOTE = "remote ops"
_OUTCOMES = {state: state.name.lower() for state in OpState}  # (an Enum's name is a property)
_CPU = DeviceType.CPU


def _by_end(span: tuple[int, int]) -> int:
    return span[1]


def _mutated(names: list[str], modes: Sequence[int] | None) -> list[tuple[str, str]]:
    """The Vars after the reads, named, with their modes' names."""
    if modes is None:  # all writes: the usual case
        return [(name, "write") for name in names]
    return [(name, MODE_NAMES[m]) for name, m in zip(names, modes, strict=True)]


class _Started:
    """An operation that started in the trace: where and when, and its steps if a coroutine."""

    __slots__ = ("end", "ident", "label", "lane", "start", "steps", "tid", "worker")

    def __init__(self, start: int, ident: int) -> None:
        self.start = start
        self.ident = ident  # the thread it started on
        self.tid = 0  # its track: its thread's native id, or its lane's pseudo id
        # The index of its lane among them, chosen by Tracer._allocate_lanes; -1: a remote
        # operation, whose lane is chosen by worker (Tracer._span_lane).
        self.lane = -1
        self.label: str | None = None  # its lanes' label, or None: no lane
        self.steps: list[tuple[int, int]] | None = None  # a coroutine's
        self.worker: str | None = None  # a remote operation's Dask worker, once known
        self.end = 0  # when its remote task finished (ns), once known


class Tracer:
    """Builds a stopped trace's JSON object from its log (``tracelog.TraceLog``).

    The core records raw fields while the trace runs; everything else happens here, once,
    after the stop: thread names, lanes, each operation's dependencies (a replay of the
    pushes, in push order, through the same :class:`DepTracker` the graph uses), slices,
    arguments and arrows.
    """

    def __init__(self, log: TraceLog, loop_thread: int) -> None:
        self._log = log
        self._loop_thread = loop_thread  # the loop's thread ident: its track is first
        self._t0 = log.t0
        self._pid = os.getpid()
        # seq -> (push time, its dependencies): those pending at the push get a flow arrow.
        self._waited: dict[int, tuple[int, tuple[tuple[int, str], ...]]] = {}
        self._slices: dict[int, tuple[int, float, float]] = {}  # seq -> (tid, start, end) in us
        self._events: list[dict[str, Any]] = []
        self._threads: dict[int, tuple[str, int]] = {}  # tid -> (name, sort index)
        self._idents: dict[int, int] = {}  # thread ident -> native id, for those seen
        self._alive: dict[int, threading.Thread] | None = None  # by ident, once looked up
        self._first_seen = {ident: i for i, ident in enumerate(log.threads)}
        # The first pseudo thread id of each label's lanes, in order of first use.
        self._lane_base: dict[str, int] = {}
        # The slices (start, end in ns) of each lane of remote operations, by label
        # ("worker tcp://... ", "remote ops").
        self._spans: dict[str, list[list[tuple[int, int]]]] = {}
        self._flow_id = 0

    # -- reading the log -----------------------------------------------------------------

    def _thread_tid(self, ident: int) -> int:
        """The track of the thread ``ident`` (its native id), named once."""
        tid = self._idents.get(ident)
        if tid is not None:
            return tid
        seen = self._log.threads.get(ident)
        if seen is not None:
            tid, name = seen
            if ident == self._loop_thread:
                self._threads[tid] = (f"event loop ({name})", 0)
            else:  # in order of first start, whichever operation names it first here
                self._threads[tid] = (name, _THREAD_SORT + 1 + self._first_seen[ident])
        else:  # it only finished operations: a thread of its own, after the others
            if self._alive is None:
                self._alive = {t.ident: t for t in threading.enumerate() if t.ident}
            thread = self._alive.get(ident)
            tid = ident if thread is None or thread.native_id is None else thread.native_id
            name = f"thread {ident}" if thread is None else thread.name
            if ident == self._loop_thread:
                self._threads[tid] = (f"event loop ({name})", 0)
            elif tid not in self._threads:
                self._threads[tid] = (name, _THREAD_SORT)
        self._idents[ident] = tid
        return tid

    def _records(
        self, live: list[Operation[Any]], now: int
    ) -> tuple[list[_Record], dict[int, tuple[list[int], list[str], int, Any]]]:
        """The slices' records, in finishing order (then the operations the stop cut short),
        and the Var accesses of each operation pushed during the trace, by seq."""
        log = self._log
        first = log.first
        # (A start racing the stop may land as this is read: a snapshot.)
        starts = {seq: _Started(ns, ident) for seq, ns, ident in list(log.starts)}
        in_order = list(starts.values())
        records: list[_Record] = []
        accesses: dict[int, tuple[list[int], list[str], int, Any]] = {}
        f = log.finishes
        i, n = 0, len(f)
        while i < n:
            (seq, end, ident, state, error, name, kind, target, ctx, priority, nreads, modes,
             nvars) = f[i : i + FINISH_FIELDS]  # fmt: skip
            i += FINISH_FIELDS
            keys: list[int] = f[i : i + 2 * nvars : 2]
            names: list[str] = f[i + 1 : i + 2 * nvars : 2]
            i += 2 * nvars
            if seq > first:
                accesses[seq] = (keys, names, nreads, modes)
            started = starts.pop(seq, None)
            outcome = _OUTCOMES[state]
            if started is None:  # not started in the trace: skipped, cancelled, or earlier
                here = self._thread_tid(ident)
                if state is OpState.DONE or state is OpState.FAILED:
                    outcome = f"{outcome} (started before the trace)"
            else:
                here = 0  # (its start's track: see below)
                started.label = _lane_label(kind, ctx, target)
            mutate = _mutated(names[nreads:], modes)
            records.append(
                (seq, kind, name, target, names[:nreads], mutate, priority, outcome, error, end,
                 started, here)
            )  # fmt: skip
        for op in live:
            if op.kind >= _WAIT:  # a wait's marker, a bulk segment: their members show
                continue
            seq = op.seq
            vars_ = op.vars
            names = [v.name for v in vars_]
            if seq > first:
                accesses[seq] = ([id(v) for v in vars_], names, op.nreads, op.modes)
            started = starts.pop(seq, None)
            if started is None:
                continue  # not started: no slice
            started.label = _lane_label(op.kind, op.ctx, op.target)
            nreads = op.nreads
            records.append(
                (seq, op.kind, op.name, op.target, names[:nreads], _mutated(names[nreads:],
                 op.modes), op.priority, "unfinished (trace stopped)", None, now, started, 0)
            )  # fmt: skip
        for started in in_order:  # threads' tracks in order of first start, as they were seen
            if started.label is None:
                started.tid = self._thread_tid(started.ident)
        return records, accesses

    def _dependencies(self, accesses: dict[int, tuple[list[int], list[str], int, Any]]) -> None:
        """Replay the trace's pushes in push order: who waited for whom, through which Var.

        A Var is known by the ``id()`` the log recorded. Should a later Var reuse the id of
        one that died, the replay pairs the new Var's first users with operations that had
        finished before the Var existed, so before those users were pushed: such a pair gets
        no arrow (see :meth:`_finish`), so the reuse shows nowhere."""
        tracker = DepTracker()
        pushes = self._log.pushes
        pushed = dict(zip(pushes[0::2], pushes[1::2], strict=True))
        for seq in sorted(accesses):
            keys, names, nreads, modes = accesses[seq]
            deps = tracker.replay(seq, keys, names, nreads, modes)
            if deps:
                self._waited[seq] = (pushed.get(seq, 0), deps)

    def _allocate_lanes(self, records: list[_Record]) -> None:
        """Give each operation that shows on lanes its lane, like registers: the lowest one
        free when it started (freed when the operation before on it ended)."""
        log = self._log
        by_label: dict[str, list[tuple[int, int, _Started]]] = {}
        for record in records:
            started, end = record[10], record[9]
            if started is None or started.label is None:
                continue
            seq = record[0]
            ran = log.ran.get(seq)
            if ran is not None:  # a remote operation: its task's worker and end
                started.worker, started.end = ran
            if started.label is _REMOTE:
                continue  # by worker, when its slice is made (_span_lane)
            started.steps = log.steps.get(seq)
            by_label.setdefault(started.label, []).append((started.start, end, started))
        for label, spans in sorted(by_label.items(), key=lambda item: min(s[0] for s in item[1])):
            spans.sort(key=lambda s: s[0])
            busy: list[tuple[int, int]] = []  # (end, lane) of the lanes in use
            free: list[int] = []  # lanes freed, lowest first
            count = 0
            for start, end, started in spans:
                while busy and busy[0][0] <= start:
                    heapq.heappush(free, heapq.heappop(busy)[1])
                if free:
                    lane = heapq.heappop(free)
                else:
                    lane, count = count, count + 1
                heapq.heappush(busy, (end, lane))
                started.lane = lane
                started.tid = self._lane_tid(label, lane)

    # -- building events -----------------------------------------------------------------

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
        if started.end:  # a remote operation: its task's end
            end = started.end
        tid = self._span_lane(started, end) if started.label is _REMOTE else started.tid
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
        """The trace: ``live`` are the operations pending at the stop (those running are
        closed at this moment)."""
        self._log.stopped = True  # running coroutines stop timing their steps
        now = _now()
        records, accesses = self._records(live, now)
        self._dependencies(accesses)
        self._allocate_lanes(records)
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


def finish_trace(
    log: TraceLog, loop_thread: int, live: list[Operation[Any]], path: str | os.PathLike[str] | None
) -> dict[str, Any]:
    """The trace of ``log``, taken off its core (``live``: the operations pending then;
    ``loop_thread``: the ident of the engine's loop thread), also written to ``path``."""
    trace = Tracer(log, loop_thread).finish(live)
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
