"""The recorder: what the engine itself does not keep (push sites, times, recent operations).

The engine keeps only what it needs to run: pending operations (``Scheduler.live``) and the Var
queues. Everything the observability tools want on top of that is collected here, by an
:class:`~aioengine.instrument.Instrument` that is installed only when something asks for it
(:meth:`Engine.record_history`, or ``Engine(watchdog=...)``), so an engine without it pays one
truth test per hook and nothing else.

While installed, :class:`Recorder` records for every operation pushed since: its push site
(``file:line`` of the first frame outside aioengine), when it was pushed, started and
finished, and the operations it depends on (:class:`DepTracker`). Finished operations go to a
bounded history (the newest ``n``), which :meth:`Engine.graph` shows next to the pending ones.

Threading: ``on_push`` and ``on_finish`` run with the engine lock held, so the recorder's own
fields are guarded by that lock; ``on_start`` runs without it and only stores one float on a
record. Readers (``graph()``, ``dump()``, ``statistics()``, the watchdog) take the engine lock.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections import deque
from collections.abc import Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

from ..errors import summary
from ..instrument import Instrument
from ..kinds import _CALLBACK, _CORO, OpState
from ..var import MODE_NAMES

if TYPE_CHECKING:
    from ..operation import Operation
    from ..var import Var
    from . import Observed

__all__ = ("DepTracker", "OpRecord", "Recorder", "kind_name", "pool_name")

# Frames of these modules are skipped when looking for the push site: the engine's own, and
# the front ends that push for the caller (submit, @op, Var.get/set, BlockingEngine).
_INTERNAL = frozenset(
    {
        "aioengine.engine",
        "aioengine.scheduler",
        "aioengine.gpu_sync",
        "aioengine.operation",
        "aioengine.observe.history",
        "aioengine.instrument",
        "aioengine.observe.trace",
        "aioengine.ergonomic",
        "aioengine.var",
        "aioengine.blocking",
        "aioengine._blocking_generated",
    }
)

_MAX_READERS = 4096  # readers remembered per Var between two writes (dependency tracking)


def pool_name(target: object) -> str:
    """The short name of an executor (``cpu0``, ``cpu-priority``), or ``loop`` for None."""
    if target is None:
        return "loop"
    name = getattr(target, "_name", None)
    if isinstance(name, str):
        return name.removeprefix("aioengine-")
    return type(target).__name__


def kind_name(kind: int) -> str:
    """``sync``, ``coroutine`` or ``callback`` for an operation's ``kind``."""
    if kind == _CORO:
        return "coroutine"
    if kind == _CALLBACK:
        return "callback"
    return "sync"


def push_site() -> str | None:
    """``file:line`` of the innermost frame outside aioengine's own modules (cheap walk).

    The walk starts at the caller and skips by module, never by a count of frames: the
    compiled core (setup.py) runs the engine's functions without frames of their own.
    """
    frame: Any = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in _INTERNAL:
        frame = frame.f_back
    if frame is None:  # pragma: no cover - pushed from inside the engine only
        return None
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class _VarTrack:
    """The last writer of a Var and the readers since, as push sequence numbers; with
    commute and concurrent accesses, the current group and what it waits for."""

    __slots__ = ("base", "kind", "readers", "var", "writer")

    def __init__(self, var: weakref.ref[Var] | None) -> None:
        # The Var tracked (None in a replay): tells it from a later Var that reuses its id().
        self.var = var
        self.writer = 0  # 0: no writer seen
        self.readers: list[int] = []  # the current group's members (readers, or one mode's)
        self.kind = "read"  # the current group's mode
        self.base: list[int] | None = None  # what the group follows, if not the writer


class DepTracker:
    """Computes each pushed operation's dependencies, in push order (caller serializes).

    A reader depends on the previous writer of the Var; a writer on the previous writer and
    on the readers since. Only the ``const_vars`` and ``mutate_vars`` count (not the hidden
    serial-mode sequencer). Live pushes (:meth:`push`) hold Vars weakly; a trace's replay
    (:meth:`replay`) has no Vars, only the ``id()`` its log recorded.
    """

    def __init__(self) -> None:
        # id(var) -> its track: a plain dict lookup per Var (a WeakKeyDictionary costs a
        # Python call and a new weakref per lookup). A Var's death removes its entry (the
        # weakref's callback), before its id can be reused.
        self._tracks: dict[int, _VarTrack] = {}

    def _track(self, v: Var) -> _VarTrack:
        key = id(v)
        tracks = self._tracks

        def forget(ref: weakref.ref[Var]) -> None:
            track = tracks.get(key)
            if track is not None and track.var is ref:
                del tracks[key]

        track = tracks[key] = _VarTrack(weakref.ref(v, forget))
        return track

    def push(self, op: Operation[Any]) -> tuple[tuple[int, str], ...]:
        """Record ``op``'s accesses; return its dependencies as ``(seq, var name)`` pairs."""
        vars_ = op.vars
        tracks = self._tracks
        for v in vars_:
            if id(v) not in tracks:  # (a dead Var's entry is gone: see __init__)
                self._track(v)
        keys = [id(v) for v in vars_]
        return self.replay(op.seq, keys, [v.name for v in vars_], op.nreads, op.modes)

    def replay(
        self,
        seq: int,
        keys: Sequence[int],
        names: Sequence[str],
        nreads: int,
        modes: Sequence[int] | None,
    ) -> tuple[tuple[int, str], ...]:
        """Record the accesses of operation ``seq``, its Vars given by key (one per Var, the
        same for every use of it) and name, reads first; return its dependencies. What
        :meth:`push` does once it has tracked the Vars, and a trace's replay of an operation
        recorded earlier (whose keys get tracks without a Var)."""
        deps: list[tuple[int, str]] = []
        tracks = self._tracks
        for key in keys:
            if key not in tracks:
                tracks[key] = _VarTrack(None)
        for i in range(nreads):
            track = tracks[keys[i]]
            name = names[i]
            if track.kind != "read":  # after a commute or concurrent group
                self._join(track, name, "read", seq, deps)
                continue
            if track.base is not None:  # a read group after such a group
                deps.extend(zip(track.base, repeat(name)))
            elif track.writer:
                deps.append((track.writer, name))
            _join_group(track, seq)
        for i in range(nreads, len(keys)):
            track = tracks[keys[i]]
            name = names[i]
            mode = MODE_NAMES[modes[i - nreads]] if modes is not None else "write"
            if mode != "write":
                self._join(track, name, mode, seq, deps)
                continue
            if track.writer:
                deps.append((track.writer, name))
            if track.readers:
                deps.extend(zip(track.readers, repeat(name)))
                track.readers = []
            track.writer = seq
            track.kind = "read"
            track.base = None
        return tuple(deps)

    @staticmethod
    def _join(
        track: _VarTrack, name: str, mode: str, seq: int, deps: list[tuple[int, str]]
    ) -> None:
        """A commute or concurrent access: it joins the current group if of its mode, else
        opens a group after the current one; it depends on what its group follows."""
        if track.kind != mode:
            if track.readers:
                track.base = track.readers
                track.readers = []
            track.kind = mode
        if track.base is not None:
            deps.extend(zip(track.base, repeat(name)))
        elif track.writer:
            deps.append((track.writer, name))
        _join_group(track, seq)


def _join_group(track: _VarTrack, seq: int) -> None:
    """Add operation ``seq`` to ``track``'s current group (its newest members only kept)."""
    readers = track.readers
    readers.append(seq)
    if len(readers) > _MAX_READERS:
        del readers[: _MAX_READERS // 2]


class OpRecord:
    """What the recorder knows about one operation (times are ``time.monotonic()``)."""

    __slots__ = (
        "const",
        "deps",
        "error",
        "finished",
        "kind",
        "modes",
        "mutate",
        "name",
        "pool",
        "priority",
        "pushed",
        "seq",
        "site",
        "started",
        "state",
    )

    def __init__(
        self, op: Operation[Any], site: str | None, deps: tuple[tuple[int, str], ...]
    ) -> None:
        self.seq = op.seq
        self.name = op.name
        self.kind = kind_name(op.kind)
        self.pool = pool_name(op.target)
        self.priority = op.priority
        self.const = tuple(v.name for v in op.const_vars)
        self.mutate = tuple(v.name for v in op.mutate_vars)  # commute and concurrent included
        self.modes = tuple(mode for _, mode in op.accesses())  # of const, then mutate
        self.site = site
        self.deps = deps
        self.pushed = time.monotonic()
        self.started: float | None = None
        self.finished: float | None = None
        self.state = OpState.PENDING
        self.error: str | None = None

    def __repr__(self) -> str:
        return f"<OpRecord #{self.seq} {self.name!r} {self.state.name.lower()}>"


class Recorder(Instrument):
    """Records push sites, times, dependencies and the newest finished operations.

    Install it with :meth:`Engine.record_history`; ``Engine(watchdog=...)`` installs one too.
    """

    def __init__(self, history: int) -> None:
        self.history: deque[OpRecord] = deque(maxlen=history)  # finished, oldest first
        self.live: dict[int, OpRecord] = {}  # pending operations pushed while installed
        self.busy: dict[str, float] = {}  # seconds from start to finish, by pool
        self.since = time.monotonic()  # when it was installed
        self._deps = DepTracker()

    @staticmethod
    def of(engine: Observed) -> Recorder | None:
        """The recorder installed on ``engine``, if any."""
        for inst in engine._core.instruments:
            if isinstance(inst, Recorder):
                return inst
        return None

    def resize(self, history: int) -> None:
        """Keep the newest ``history`` finished operations from now on."""
        if self.history.maxlen != history:
            self.history = deque(self.history, maxlen=history)

    def on_push(self, op: Operation[Any]) -> None:
        """Record the push site, time and dependencies (engine lock held)."""
        self.live[op.seq] = OpRecord(op, push_site(), self._deps.push(op))

    def on_start(self, op: Operation[Any]) -> None:
        """Record the start time (no lock: one attribute store)."""
        record = self.live.get(op.seq)
        if record is not None:
            record.started = time.monotonic()

    def on_finish(self, op: Operation[Any]) -> None:
        """Move the operation to the history with its outcome (engine lock held)."""
        record = self.live.pop(op.seq, None)
        if record is None:
            return  # pushed before the recorder was installed
        record.finished = now = time.monotonic()
        record.state = op._state
        if op._exception is not None:
            record.error = summary(op._exception)
        if record.started is not None:
            self.busy[record.pool] = self.busy.get(record.pool, 0.0) + now - record.started
        self.history.append(record)
