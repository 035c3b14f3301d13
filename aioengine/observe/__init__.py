"""Observers: what the engine shows about itself, built on the scheduler's read-only API.

Each module reads the core (``scheduler.py``: its docstring lists what observers may read,
under the engine lock) and never changes its state; the :class:`~aioengine.Engine` façade
offers them as methods (``dump()``, ``graph()``, ``statistics()``, ``trace()``,
``record_history()``, ``wait_for_all(progress=True)``, ``Engine(watchdog=...)``).
The core does not know they exist. They are independent of each other except where one
builds on another's records: the history recorder (``history``) feeds ``dump``, ``graph``,
``stats`` and ``trace``; ``watchdog`` logs a ``dump``.

- ``history``: the recorder of push sites, times and dependencies (an Instrument).
- ``log``: one DEBUG log line per operation event (an Instrument).
- ``dump``: a snapshot of every busy Var and pending operation.
- ``graph``: the dependency graph (DOT, Mermaid).
- ``stats``: counts by state and pool.
- ``trace``: Chrome/Perfetto trace recording (an Instrument); ``timeline``: drawing one.
- ``progress``: the progress bar of ``wait_for_all(progress=True)``.
- ``watchdog``: logs a dump when nothing finishes for too long.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..scheduler import Scheduler

__all__ = ("Observed",)


class Observed(Protocol):
    """What an observer may use of the engine it observes (:class:`~aioengine.Engine` is one).

    ``_core`` is the scheduler, read only through its documented read-only API
    (``scheduler.py``); the rest is the façade's public API. A protocol, not the façade's
    class: observers sit below the façade and never import it.
    """

    @property
    def _core(self) -> Scheduler: ...

    @property
    def closed(self) -> bool: ...

    def record_history(self, n: int = ...) -> None: ...

    def start_trace(self) -> None: ...

    def stop_trace(self, path: str | os.PathLike[str] | None = ...) -> dict[str, Any]: ...

    async def _drained(self, timeout: float | None) -> None: ...  # noqa: ASYNC109
