"""Instruments (tracing, history, logging, your own): a broken one never strands operations.

An instrument's hooks run inside the engine's bookkeeping (``on_push`` and ``on_finish`` with
its lock held). One that raises is uninstalled and reported through the loop's exception
handler; the operations it observed go on as if it had never been installed. The engine and
its built-in instruments also format failures whose ``__str__`` raises.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import aioengine as ae
from aioengine.instrument import Instrument


class Broken(Instrument):
    """Raises in one hook."""

    def __init__(self, hook: str) -> None:
        self.hook = hook

    def _maybe_raise(self, hook: str) -> None:
        if hook == self.hook:
            raise RuntimeError(f"broken {hook}")

    def on_push(self, op: ae.Operation[Any]) -> None:
        self._maybe_raise("on_push")

    def on_start(self, op: ae.Operation[Any]) -> None:
        self._maybe_raise("on_start")

    def on_finish(self, op: ae.Operation[Any]) -> None:
        self._maybe_raise("on_finish")

    def wrap_coroutine(self, op: ae.Operation[Any], coro: Any) -> Any:
        self._maybe_raise("wrap_coroutine")
        return coro


@pytest.mark.parametrize("hook", ["on_push", "on_start", "on_finish", "wrap_coroutine"])
async def test_a_hook_that_raises_is_removed_and_reported(engine: ae.Engine, hook: str) -> None:
    reported: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda loop, context: reported.append(context))
    try:
        broken = Broken(hook)
        engine.add_instrument(broken)
        x = engine.new_var("x")

        async def coro(rctx: ae.RunContext) -> str:
            await asyncio.sleep(0)
            return "coro"

        ops = [
            engine.push_sync(lambda r: "threaded", mutate_vars=[x]),
            engine.push_sync(lambda r: "inline", mutate_vars=[x], prop=ae.FnProperty.ASYNC),
            engine.push_async(coro, mutate_vars=[x]),
            engine.push_sync(lambda r: "last", const_vars=[x]),
        ]
        async with asyncio.timeout(10):
            assert [await op for op in ops] == ["threaded", "inline", "coro", "last"]
            await engine.wait_for_all()
        assert engine.pending == 0
        assert x.version == 3
        with pytest.raises(ValueError, match="not installed"):
            engine.remove_instrument(broken)
        for _ in range(3):
            await asyncio.sleep(0)  # the report is scheduled, never run under the lock
        assert [str(c["exception"]) for c in reported] == [f"broken {hook}"]
        assert f"Broken.{hook} raised; the instrument was removed" in reported[0]["message"]
    finally:
        loop.set_exception_handler(None)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for you")


async def test_a_failure_whose_str_raises_is_recorded_and_skips_readers(
    engine: ae.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """With every built-in instrument on: tracing, history (watchdog's) and debug logging."""
    engine.start_trace()
    engine.record_history()
    caplog.set_level(logging.DEBUG, logger="aioengine")
    x = engine.new_var("x")
    exc = Unprintable()

    def fail(rctx: ae.RunContext) -> None:
        raise exc

    failing = engine.push_sync(fail, mutate_vars=[x])
    reader = engine.push_sync(lambda r: None, const_vars=[x])
    async with asyncio.timeout(10):
        with pytest.raises(Unprintable):
            await failing
        with pytest.raises(ae.DependencyError, match=r"Unprintable: <str\(\) raised ValueError>"):
            await reader
        with pytest.raises(Unprintable):
            await engine.wait_for_var(x)
    trace = engine.stop_trace()
    errors = [e["args"].get("error") for e in trace["traceEvents"] if "args" in e]
    assert "Unprintable: <str() raised ValueError>" in errors
    assert engine.pending == 0
