"""The watchdog: log a dump when nothing has completed for a while (``Engine(watchdog=s)``).

A daemon thread per engine (``aioengine-watchdog``) wakes every ``min(seconds / 4, 1)``
seconds and reads the engine's counter of finished operations (see ``stats.py``). When
operations are pending and that counter has not moved for ``seconds``, it logs the engine's
:class:`~aioengine.observe.dump.Dump` on the ``aioengine`` logger at WARNING, once: the next warning
needs a new stall, i.e. some operation finishing (or the engine going idle) first.

A thread rather than a loop timer, so that a loop blocked by a synchronous call is diagnosed
too. The thread holds the engine weakly and exits once the engine is closed or collected. The
watchdog installs a recorder (``history.py``) so the dump has push sites and times.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING

from .dump import build_dump
from .history import Recorder
from .stats import finished_total

if TYPE_CHECKING:
    from . import Observed

__all__ = ("start_watchdog",)

logger = logging.getLogger("aioengine")

DEFAULT_HISTORY = 1000  # operations the watchdog's recorder keeps


def start_watchdog(engine: Observed, seconds: float) -> threading.Thread:
    """Install a recorder on ``engine`` and start its watchdog thread."""
    if Recorder.of(engine) is None:
        engine.record_history(DEFAULT_HISTORY)
    thread = threading.Thread(
        target=_watch,
        args=(weakref.ref(engine), seconds),
        name="aioengine-watchdog",
        daemon=True,
    )
    thread.start()
    return thread


def _watch(ref: weakref.ref[Observed], seconds: float) -> None:
    interval = min(max(seconds / 4, 0.005), 1.0)
    last_done = -1
    last_change = time.monotonic()
    fired = False
    was_idle = True
    while True:
        time.sleep(interval)
        engine = ref()
        if engine is None or engine.closed or engine._core.forked:
            return
        core = engine._core  # read only (scheduler.py: the read-only API for observers)
        with core.lock:
            done = finished_total(engine)
            pending = len(core.live)
        now = time.monotonic()
        # A stall is timed from the first wake that saw progress or work after idleness:
        # work pushed just before this wake did not wait since the last one (which would
        # report a stall up to one interval too early, and overstate it).
        if done != last_done or not pending or was_idle:
            last_done, last_change, fired = done, now, False
        elif not fired and now - last_change >= seconds:
            fired = True
            logger.warning(
                "%r: no operation finished for %.3g s while %d are pending\n%s",
                engine,
                now - last_change,
                pending,
                build_dump(engine).format(limit=50),
            )
        was_idle = not pending
        del engine
