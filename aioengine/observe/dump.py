"""Hang diagnosis: a snapshot of who holds and who waits for every busy Var (:meth:`Engine.dump`).

A :class:`Dump` lists each busy Var's queue (the operations holding it, in grant order, and
the ones waiting for it, in push order) and each pending operation: its state, the Vars it
holds and waits for, its await stack if it is a suspended coroutine, and a flag on a
callback-style operation that is running, i.e. whose ``on_complete()`` has not been called.

Push sites (``file:line``) and times ("waiting since") come from the recorder, so they appear
only for operations pushed while one is installed (:meth:`Engine.record_history`, or
``Engine(watchdog=...)``, which installs one); capturing a push site costs a short frame walk
per push, which the engine does not pay otherwise.

The timeouts of :meth:`Engine.wait_for_var` and :meth:`Engine.wait_for_all` put the relevant
part of a dump in their message: for a Var, the operations on it and, transitively, the ones
those are waiting behind, so the operation at the root of a hang is named.

Threading: :func:`build_dump` may be called from any thread; it reads the engine's state under
its lock and walks coroutine frames after releasing it.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..context import DeviceType
from ..kinds import _BULK, _CALLBACK, _SYNC, OpState
from ..task import run_coroutine
from ..var import MODE_NAMES
from .history import Recorder, kind_name, pool_name

if TYPE_CHECKING:
    from ..operation import Operation
    from ..var import Var
    from . import Observed

_GPU = DeviceType.GPU
_REMOTE = DeviceType.REMOTE

__all__ = ("Dump", "OpInfo", "VarInfo", "await_stack", "build_dump")

_MAX_STACK = 24  # frames shown per await stack
_RUN_COROUTINE = run_coroutine.__code__  # the frame every coroutine operation's task starts in
_ORDER = {OpState.RUNNING: 0, OpState.READY: 1, OpState.PENDING: 2}


@dataclass(frozen=True, slots=True)
class OpInfo:
    """One pending operation in a :class:`Dump`.

    Attributes:
        seq: push sequence number.
        name: its name.
        state: PENDING (waiting for Vars), READY (waiting for a worker) or RUNNING.
        kind: ``sync``, ``coroutine`` or ``callback``.
        pool: where it runs (``cpu0``, ``loop``, ...).
        holds: ``(var name, mode)`` for each Var it has been granted, the mode being
            ``"read"``, ``"write"``, ``"commute"`` or ``"concurrent"``.
        waits: the same for each Var it is still waiting for; a member of a bulk segment
            also lists, as ``(var name, "via its bulk segment")``, the Vars of the other
            members that its segment still waits for.
        site: ``file:line`` of its push, if recorded.
        pending_for: seconds since its push, if recorded.
        running_for: seconds since it started, if recorded.
        stack: its await stack, outermost first (coroutine operations).
        flag: a warning, e.g. that a callback-style operation has not called ``on_complete``.
    """

    seq: int
    name: str
    state: OpState
    kind: str
    pool: str
    holds: tuple[tuple[str, str], ...]
    waits: tuple[tuple[str, str], ...]
    site: str | None
    pending_for: float | None
    running_for: float | None
    stack: tuple[str, ...]
    flag: str | None

    @property
    def label(self) -> str:
        """``#seq 'name'``."""
        return f"#{self.seq} {self.name!r}"


@dataclass(frozen=True, slots=True)
class VarInfo:
    """One busy Var in a :class:`Dump`: ``(seq, mode)`` of holders and waiters (the mode
    ``"read"``, ``"write"``, ``"commute"`` or ``"concurrent"``)."""

    name: str
    version: int
    holders: tuple[tuple[int, str], ...]
    waiters: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class Dump:
    """A snapshot of every busy Var's queue and every pending operation; ``print`` it.

    Attributes:
        ops: the pending operations shown, the ones that block others first (running, then
            ready, then pending; each in push order).
        vars: the busy Vars shown, in the order their first holder was pushed.
        pending: the number of pending operations in the engine (may exceed ``len(ops)``
            when the dump was narrowed to one Var).
        recorded: whether a recorder supplied push sites and times.
        note: why the dump is empty although operations are pending (the engine's lock
            stayed busy), else None.
    """

    ops: tuple[OpInfo, ...]
    vars: tuple[VarInfo, ...]
    pending: int
    recorded: bool
    note: str | None = None

    def op(self, name: str) -> OpInfo:
        """The first pending operation called ``name`` (KeyError if none)."""
        for info in self.ops:
            if info.name == name:
                return info
        raise KeyError(name)

    def format(self, limit: int | None = None) -> str:
        """The dump as text, showing at most ``limit`` operations (and their Vars, each
        with at most ``limit`` holders and ``limit`` waiters)."""
        ops = self.ops if limit is None else self.ops[:limit]
        shown = {o.seq for o in ops}
        by_seq = {o.seq: o for o in self.ops}
        lines = [
            f"aioengine dump: {self.pending} pending operation(s), "
            f"{len(self.vars)} busy Var(s) shown"
        ]
        if self.note is not None:
            lines.append(self.note)
        if self.vars:
            lines.append("Vars:")
        for v in self.vars:
            if limit is not None and not any(s in shown for s, _ in (*v.holders, *v.waiters)):
                continue
            lines.append(f"  {v.name!r} (version {v.version})")
            # With a limit, as many holders and waiters per Var at most (the first in its
            # queue): one busy Var with 10,000 readers queued must not make a huge message.
            holders = v.holders if limit is None else v.holders[:limit]
            waiters = v.waiters if limit is None else v.waiters[:limit]
            for seq, mode in holders:
                lines.append(f"    held by  {_brief(by_seq.get(seq), seq, mode, running=True)}")
            if len(holders) < len(v.holders):
                lines.append(f"    ... and {len(v.holders) - len(holders)} more holding it")
            for seq, mode in waiters:
                lines.append(f"    waiting  {_brief(by_seq.get(seq), seq, mode, running=False)}")
            if len(waiters) < len(v.waiters):
                lines.append(f"    ... and {len(v.waiters) - len(waiters)} more waiting")
        if ops:
            lines.append("Operations:")
        for o in ops:
            lines.extend(_describe(o))
        if len(ops) < len(self.ops):
            lines.append(f"  ... and {len(self.ops) - len(ops)} more operation(s)")
        if self.pending and not self.recorded:
            lines.append(
                "(push sites and times are recorded after engine.record_history() or with "
                "Engine(watchdog=...))"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _ago(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.3g} s"


def _site(site: str | None) -> str:
    if site is None:
        return ""
    path, _, line = site.rpartition(":")
    try:
        rel = os.path.relpath(path)
    except ValueError:  # pragma: no cover - another drive on Windows
        rel = path
    return f"{path if rel.startswith('..') else rel}:{line}"


def _brief(o: OpInfo | None, seq: int, mode: str, *, running: bool) -> str:
    if o is None:
        return f"#{seq} ({mode})"
    parts = [f"{o.label} ({mode}, {o.state.name.lower()}"]
    if running and o.running_for is not None:
        parts.append(f", for {_ago(o.running_for)}")
    elif o.pending_for is not None:
        parts.append(f", since {_ago(o.pending_for)}")
    parts.append(")")
    if o.site:
        parts.append(f" pushed at {_site(o.site)}")
    if o.flag:
        parts.append(f"  !! {o.flag}")
    return "".join(parts)


def _describe(o: OpInfo) -> list[str]:
    head = f"  {o.label} {o.state.name.lower()} ({o.kind} on {o.pool})"
    if o.running_for is not None:
        head += f" for {_ago(o.running_for)}"
    elif o.pending_for is not None:
        head += f", pushed {_ago(o.pending_for)} ago"
    if o.site:
        head += f" at {_site(o.site)}"
    lines = [head]
    if o.holds:
        lines.append("      holds " + ", ".join(f"{v!r} ({m})" for v, m in o.holds))
    if o.waits:
        lines.append("      waits for " + ", ".join(f"{v!r} ({m})" for v, m in o.waits))
    if o.flag:
        lines.append(f"      !! {o.flag}")
    if o.stack:
        lines.append("      suspended in:")
        lines.extend(f"        {frame}" for frame in o.stack)
    return lines


def await_stack(task: asyncio.Task[Any]) -> tuple[str, ...]:
    """The await chain of ``task``'s coroutine, outermost first, as ``file:line in fn``.

    Follows ``cr_await`` (and ``gi_yieldfrom``) from the task's coroutine down to what it is
    suspended on; the last entry names a Future or other awaitable when the chain ends there.
    """
    frames: list[str] = []
    obj: Any = task.get_coro()
    if getattr(obj, "cr_code", None) is _RUN_COROUTINE:  # the engine's frame: start below it
        obj = obj.cr_await
    while obj is not None and len(frames) < _MAX_STACK:
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None)
        if frame is not None:
            code = frame.f_code
            frames.append(f"{_site(f'{code.co_filename}:{frame.f_lineno}')} in {code.co_name}")
        nxt = getattr(obj, "cr_await", None)
        if nxt is None:
            nxt = getattr(obj, "gi_yieldfrom", None)
        if frame is None and isinstance(obj, asyncio.Future):
            frames.append(f"awaiting {obj!r}")
        obj = nxt
    return tuple(frames)


#: Seconds: the bound of every wait for the engine lock here (and in Engine.dump()); the
#: engine's critical sections are far shorter.
_LOCK_WAIT = 2.0
_LOCK_BUSY = (
    "(no snapshot: the engine's lock stayed busy for {} s. Called from a signal handler "
    "installed with signal.signal()? It may have interrupted the engine inside its lock: "
    "use loop.add_signal_handler(), whose handler runs as a loop callback)"
)


def build_dump(engine: Observed, var: Var | None = None) -> Dump:
    """Snapshot ``engine``; with ``var``, only what the waiters of ``var`` are stuck behind."""
    rows: dict[int, dict[str, Any]] = {}
    var_rows: dict[Var, tuple[list[tuple[int, str]], list[tuple[int, str]]]] = {}
    tasks: dict[int, asyncio.Task[Any]] = {}
    core = engine._core  # read only (scheduler.py: the read-only API for observers)
    lock = core.lock
    # Bounded: a signal handler that interrupted the engine inside its lock (on the same
    # thread) would otherwise wait for itself forever.
    if not lock.acquire(timeout=_LOCK_WAIT):
        return Dump((), (), len(core.live), False, note=_LOCK_BUSY.format(_LOCK_WAIT))
    try:
        now = time.monotonic()
        recorder = Recorder.of(engine)
        records = recorder.live if recorder is not None else {}
        pending = len(core.live)
        for op in core.live.values():
            holds: list[tuple[Var, str]] = []
            waits: list[tuple[Var, str]] = []
            requests = op.accesses()  # (Var, "read" | "write" | "commute" | "concurrent")
            # A bulk segment's member holds its Vars when its segment does (bulk.py).
            holder = op if op.segment is None or not op.segment.seq else op.segment
            for v, mode in requests:
                if v._holds(holder):
                    holds.append((v, mode))
                    var_rows.setdefault(v, ([], []))[0].append((op.seq, mode))
                else:
                    waits.append((v, mode))
                    var_rows.setdefault(v, ([], []))
            if holder is not op and op._state is OpState.PENDING:
                # It also waits for the Vars of the other members that its segment waits for.
                seg = holder
                for v in (*seg.const_vars, *seg.mutate_vars):
                    if v not in op.const_vars and v not in op.mutate_vars and not v._holds(seg):
                        waits.append((v, "via its bulk segment"))
                        var_rows.setdefault(v, ([], []))
            record = records.get(op.seq)
            state = op._state
            flag = None
            if op.kind == _CALLBACK and state is OpState.RUNNING:
                flag = "callback-style operation: on_complete() has not been called yet"
            elif op.nfwait and state is OpState.PENDING:
                flag = f"its Vars are granted; waiting for {op.nfwait} GPU fence(s) to complete"
            elif state is OpState.RUNNING and op.kind == _SYNC and op.ctx.device_type is _GPU:
                flag = "GPU operation: completes when its fence (the event after it) does"
            elif state is OpState.RUNNING and op.ctx.device_type is _REMOTE:
                remote = core.remote
                key = remote.key_of(op) if remote is not None else None
                flag = f"remote operation on the Dask cluster, key {key!r}"
            if op.task is not None and not op.task.done() and op.ctx.device_type is not _REMOTE:
                tasks[op.seq] = op.task
            rows[op.seq] = {
                "seq": op.seq,
                "name": op.name,
                "state": state,
                "kind": kind_name(op.kind),
                "pool": pool_name(op.target),
                "holds": holds,
                "waits": waits,
                "site": record.site if record is not None else None,
                "pending_for": now - record.pushed if record is not None else None,
                "running_for": (
                    now - record.started
                    if record is not None and record.started is not None
                    else None
                ),
                "flag": flag,
            }
        versions: dict[Var, int] = {}
        for v, (_, waiters) in var_rows.items():
            versions[v] = v._version
            for waiter, queued_mode in v._requests():
                # An Operation, or a wait_for_var marker (not in _live); a cancelled one neither.
                seq: int = waiter.seq
                if core.live.get(seq) is waiter:
                    waiters.append((seq, MODE_NAMES[queued_mode]))
                elif waiter.kind == _BULK and waiter._result:  # a segment: its members
                    members: list[Operation[Any]] = waiter._result
                    for m in members:
                        if m._state is OpState.PENDING and (
                            v in m.mutate_vars or v in m.const_vars
                        ):
                            waiters.append((m.seq, "write" if v in m.mutate_vars else "read"))
    finally:
        lock.release()
    if var is not None:
        keep = _blockers(var, rows, var_rows)
        rows = {s: r for s, r in rows.items() if s in keep}
        var_rows = {v: q for v, q in var_rows.items() if any(s in keep for s, _ in (*q[0], *q[1]))}
    ops = tuple(
        OpInfo(
            **{**row, "holds": _names(row["holds"]), "waits": _names(row["waits"])},
            stack=await_stack(tasks[seq]) if seq in tasks else (),
        )
        for seq, row in sorted(rows.items(), key=lambda kv: (_ORDER[kv[1]["state"]], kv[0]))
    )
    var_infos = tuple(
        VarInfo(v.name, versions[v], tuple(h), tuple(w))
        for v, (h, w) in sorted(var_rows.items(), key=lambda kv: _first(kv[1]))
        if h or w
    )
    return Dump(ops, var_infos, pending, recorder is not None)


def _names(pairs: list[tuple[Var, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((v.name, mode) for v, mode in pairs)


def _first(queues: tuple[list[tuple[int, str]], list[tuple[int, str]]]) -> int:
    seqs = [s for s, _ in (*queues[0], *queues[1])]
    return min(seqs) if seqs else 0


def _blockers(
    var: Var,
    rows: dict[int, dict[str, Any]],
    var_rows: dict[Var, tuple[list[tuple[int, str]], list[tuple[int, str]]]],
) -> set[int]:
    """The operations on ``var`` and, transitively, those ahead of what they wait for.

    Every user of ``var`` counts (a waiter on ``var`` is behind all of them); for a Var ``u``
    that such an operation waits for, its holders and the waiters queued ahead of it count.
    """
    keep: set[int] = set()
    todo: list[tuple[Var, int | None]] = [(var, None)]  # (Var, seq of the op waiting on it)
    while todo:
        v, behind = todo.pop()
        holders, waiters = var_rows.get(v, ([], []))
        ahead = [s for s, _ in waiters]
        if behind is not None:
            ahead = ahead[: ahead.index(behind)] if behind in ahead else []
        for seq in (*(s for s, _ in holders), *ahead):
            if seq in keep or seq not in rows:
                continue
            keep.add(seq)
            todo.extend((u, seq) for u, _ in rows[seq]["waits"])
    return keep


def describe_var(engine: Observed, var: Var) -> str:
    """The part of a dump that explains why ``var`` is busy (for timeout messages)."""
    return build_dump(engine, var).format(limit=20)


def describe_all(engine: Observed) -> str:
    """A dump limited to the first 20 operations (for wait_for_all's timeout message)."""
    return build_dump(engine).format(limit=20)
