"""The watchdog logs one dump per stall; settings from the argument or AIOENGINE_WATCHDOG."""

from __future__ import annotations

import asyncio
import logging
import threading
import types
from typing import ClassVar

import pytest

import aioengine as ae
from aioengine.observe import watchdog
from aioengine.observe.history import Recorder

from .helpers import until
from .test_dump import Hang

PERIOD = 0.05


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "aioengine" and r.levelno == logging.WARNING and "no operation" in r.msg
    ]


def watchdogs() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "aioengine-watchdog"]


def run_watchdog(
    monkeypatch: pytest.MonkeyPatch, seconds: float, script: dict[float, tuple[int, int]]
) -> list[float]:
    """Run the watchdog's loop on a fake clock against a stub engine; return the times of
    its warnings. ``script`` gives, at each wake, (operations pending, finished so far);
    the engine closes after the last one."""
    clock = types.SimpleNamespace(now=0.0)

    class Stub:
        """What the watchdog reads of an engine."""

        lock = threading.Lock()
        forked = False
        live: ClassVar[dict[int, None]] = {}
        closed = False
        finished = 0

    Stub._core = Stub  # type: ignore[attr-defined]  # the core's read-only fields, above

    last = max(script)

    def sleep(dt: float) -> None:
        clock.now = round(clock.now + dt, 6)
        if clock.now > last:
            Stub.closed = True
            return
        pending, finished = script[clock.now]
        Stub.live = dict.fromkeys(range(pending))
        Stub.finished = finished

    monkeypatch.setattr(
        watchdog, "time", types.SimpleNamespace(sleep=sleep, monotonic=lambda: clock.now)
    )
    monkeypatch.setattr(watchdog, "finished_total", lambda engine: engine.finished)
    monkeypatch.setattr(watchdog, "build_dump", lambda engine: ae.Dump((), (), 1, True))
    fired_at: list[float] = []
    monkeypatch.setattr(watchdog.logger, "warning", lambda *args: fired_at.append(clock.now))
    engine = Stub()
    watchdog._watch(lambda: engine, seconds)  # type: ignore[arg-type, return-value]
    return fired_at


class TestWatchdog:
    async def test_fires_exactly_once_per_stall(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.WARNING, logger="aioengine")
        hang, again = Hang(), Hang()
        engine = ae.Engine(cpu_workers=2, watchdog=PERIOD)
        try:
            x = engine.new_var("x")
            engine.push_async(hang, mutate_vars=[x], name="hang")
            engine.push_sync(lambda r: None, const_vars=[x], name="reader")
            await until(lambda: len(warnings_of(caplog)) == 1)
            await asyncio.sleep(6 * PERIOD)  # the stall goes on: no second warning
            assert len(warnings_of(caplog)) == 1
            message = warnings_of(caplog)[0].getMessage()
            assert "'hang'" in message
            assert "on_complete() has not been called" in message
            assert "test_watchdog.py:" in message  # push sites: the watchdog records them
            hang.release()
            await engine.wait_for_all()
            await asyncio.sleep(2 * PERIOD)  # idle: no warning either
            assert len(warnings_of(caplog)) == 1
            engine.push_async(again, mutate_vars=[x], name="again")  # a new stall
            await until(lambda: len(warnings_of(caplog)) == 2)
            await asyncio.sleep(6 * PERIOD)
            assert len(warnings_of(caplog)) == 2
            assert "'again'" in warnings_of(caplog)[1].getMessage()
        finally:
            hang.release()
            again.release()
            await engine.aclose()

    def test_a_stall_is_timed_from_when_work_arrived(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Work pushed just before a wake, after idleness, has not waited since the wake
        before: a 0.76 s stall must not be reported by a 1 s watchdog (interval 0.25 s)."""
        script = {0.25: (0, 0), 0.5: (1, 0), 0.75: (1, 0), 1.0: (1, 0), 1.25: (1, 0)}
        script |= {1.5: (1, 0), 1.75: (1, 0)}
        # Work arrived between the wakes at 0.25 and 0.5: reported at 1.5, one stall.
        assert run_watchdog(monkeypatch, 1.0, script) == [1.5]

    def test_quiet_while_operations_keep_finishing(self, monkeypatch: pytest.MonkeyPatch) -> None:
        script = {0.25 * k: (3, k) for k in range(1, 40)}  # one finishes per wake
        assert run_watchdog(monkeypatch, 1.0, script) == []
        script = {0.25 * k: (3, k // 3) for k in range(1, 40)}  # one per 0.75 s: still quiet
        assert run_watchdog(monkeypatch, 1.0, script) == []
        script = {0.25 * k: (3, min(k, 8)) for k in range(1, 40)}  # none after 2 s
        assert run_watchdog(monkeypatch, 1.0, script) == [3.0]

    async def test_thread_exits_after_close(self) -> None:
        before = set(watchdogs())
        async with ae.Engine(cpu_workers=1, watchdog=PERIOD) as engine:
            (thread,) = set(watchdogs()) - before
            assert Recorder.of(engine) is not None
        await until(lambda: not thread.is_alive())

    async def test_environment_variable(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AIOENGINE_WATCHDOG", "2.5")
        async with ae.Engine(cpu_workers=1) as engine:
            assert engine._settings.watchdog == 2.5
            assert Recorder.of(engine) is not None

    @pytest.mark.parametrize("raw", ["soon", "0", "-1", "inf"])
    def test_bad_environment_variable(self, monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
        monkeypatch.setenv("AIOENGINE_WATCHDOG", raw)
        with pytest.raises(ValueError, match=r"^environment variable AIOENGINE_WATCHDOG="):
            ae.Engine()

    @pytest.mark.parametrize("value", [0, -1.0, "1", float("inf"), True])
    def test_bad_argument(self, value: object) -> None:
        with pytest.raises(ValueError, match=r"^watchdog must be"):
            ae.Engine(watchdog=value)  # type: ignore[arg-type]

    def test_off_by_default(self) -> None:
        engine = ae.Engine()
        assert engine._settings.watchdog is None
        assert engine._core.instruments == ()
