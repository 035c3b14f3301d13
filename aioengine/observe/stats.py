"""Engine statistics (:meth:`Engine.statistics`): counts per pool, from cheap counters.

The engine keeps one counter per (pool, final state), incremented once per finished operation
under its lock (``Scheduler.finished``); the counts of pending
operations are read from ``Scheduler.live`` when statistics are taken. So ``pushed`` is exact
(every push either is pending or has finished) and nothing else runs per operation. Busy time
needs start and finish times per operation, which only the recorder takes: it is ``None``
unless one is installed (:meth:`Engine.record_history`, ``Engine(watchdog=...)``), and covers
the operations pushed since.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..kinds import OpState
from .history import Recorder, pool_name

if TYPE_CHECKING:
    from . import Observed

__all__ = ("EngineStatistics", "PoolStatistics", "build_statistics")

_NSTATES = len(OpState)


def _zeros() -> list[int]:
    return [0] * _NSTATES


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """Counts of one pool's operations since the engine was created.

    Attributes:
        pushed: operations pushed (pending + finished).
        waiting: pending operations waiting for their Vars (PENDING).
        queued: operations whose turn has come, queued for a worker or the loop (READY):
            the length of the pool's run queue.
        running: operations whose function is running (RUNNING).
        done: operations whose function returned.
        failed: operations whose function raised.
        skipped: operations skipped because an input carried a failure.
        cancelled: operations cancelled.
        busy_s: seconds spent running operations (start to finish; for a coroutine this
            includes its awaits), or None without a recorder.
    """

    pushed: int = 0
    waiting: int = 0
    queued: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0
    cancelled: int = 0
    busy_s: float | None = None

    @property
    def finished(self) -> int:
        """done + failed + skipped + cancelled."""
        return self.done + self.failed + self.skipped + self.cancelled


@dataclass(frozen=True, slots=True)
class EngineStatistics(PoolStatistics):
    """:class:`PoolStatistics` summed over the pools, plus each pool's own (``pools``).

    Pools are named as in traces: ``cpu0`` (the pool of ``cpu(0)``), ``cpu-priority``, and
    ``loop`` for operations that run on the event loop (coroutines, ``FnProperty.ASYNC``,
    serial mode).
    """

    pools: dict[str, PoolStatistics] = field(default_factory=dict)


def build_statistics(engine: Observed) -> EngineStatistics:
    """Snapshot ``engine``'s counters and pending operations."""
    counts: dict[str, list[int]] = {}
    core = engine._core  # read only (scheduler.py: the read-only API for observers)
    with core.lock:
        for target, finished in core.finished.items():
            row = counts.setdefault(pool_name(target), _zeros())
            for i, n in enumerate(finished):
                row[i] += n
        for op in core.live.values():
            counts.setdefault(pool_name(op.target), _zeros())[op._state] += 1
        recorder = Recorder.of(engine)
        busy = dict(recorder.busy) if recorder is not None else None
    pools = {
        name: PoolStatistics(
            pushed=sum(row),
            waiting=row[OpState.PENDING],
            queued=row[OpState.READY],
            running=row[OpState.RUNNING],
            done=row[OpState.DONE],
            failed=row[OpState.FAILED],
            skipped=row[OpState.SKIPPED],
            cancelled=row[OpState.CANCELLED],
            busy_s=busy.get(name, 0.0) if busy is not None else None,
        )
        for name, row in sorted(counts.items())
    }
    values = pools.values()
    return EngineStatistics(
        pushed=sum(p.pushed for p in values),
        waiting=sum(p.waiting for p in values),
        queued=sum(p.queued for p in values),
        running=sum(p.running for p in values),
        done=sum(p.done for p in values),
        failed=sum(p.failed for p in values),
        skipped=sum(p.skipped for p in values),
        cancelled=sum(p.cancelled for p in values),
        busy_s=sum(busy.values()) if busy is not None else None,
        pools=pools,
    )


def finished_total(engine: Observed) -> int:
    """Operations finished since the engine was created (engine lock held by the caller)."""
    return sum(sum(row) for row in engine._core.finished.values())
