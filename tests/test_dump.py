"""Hang diagnosis: a hung operation is named in the dump and in the timeout errors."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator

import pytest

import aioengine as ae
from aioengine.observe import dump as dump_module

SERIAL = "<serial>"  # the hidden Var every operation writes in serial mode


class Hang:
    """A callback-style function that never calls on_complete until ``release()``."""

    def __init__(self) -> None:
        self.tokens: list[ae.OnComplete] = []
        self.released = False
        self.lock = threading.Lock()
        self.called = threading.Event()  # set once the engine has started it

    def __call__(self, rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
        self.called.set()
        with self.lock:
            if not self.released:
                self.tokens.append(on_complete)
                return
        on_complete()

    async def running(self) -> None:
        """Return once the engine has started it (on a worker thread or on the loop)."""
        assert await asyncio.to_thread(self.called.wait, 10), "the engine never started it"

    def release(self) -> None:
        with self.lock:
            self.released = True
            tokens, self.tokens = self.tokens, []
        for token in tokens:
            token()


@pytest.fixture
def hang() -> Iterator[Hang]:
    """Request it after the engine fixture: it is released before the engine closes."""
    h = Hang()
    try:
        yield h
    finally:
        h.release()


def public(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    return tuple(p for p in pairs if p[0] != SERIAL)


class TestDump:
    async def test_hung_callback_op_is_named_and_flagged(
        self, engine: ae.Engine, hang: Hang
    ) -> None:
        x = engine.new_var("x")
        engine.push_async(hang, mutate_vars=[x], name="hang")
        engine.push_sync(lambda r: None, const_vars=[x], name="reader")
        await hang.running()
        dump = engine.dump()
        assert dump.pending == 2
        hung = dump.op("hang")
        assert hung.state is ae.OpState.RUNNING
        assert public(hung.holds) == (("x", "write"),)
        assert hung.flag is not None
        assert "on_complete() has not been called" in hung.flag
        reader = dump.op("reader")
        assert reader.state is ae.OpState.PENDING
        assert public(reader.waits) == (("x", "read"),)
        (var,) = [v for v in dump.vars if v.name != SERIAL]
        assert var.name == "x"
        assert var.holders == ((hung.seq, "write"),)
        assert var.waiters == ((reader.seq, "read"),)
        text = str(dump)
        assert re.search(r"held by  #\d+ 'hang' \(write, running\)", text)
        assert re.search(r"waiting  #\d+ 'reader' \(read, pending\)", text)
        assert "engine.record_history()" in text  # no push sites without a recorder
        with pytest.raises(KeyError):
            dump.op("nobody")
        hang.release()
        await engine.wait_for_all()
        assert str(engine.dump()) == "aioengine dump: 0 pending operation(s), 0 busy Var(s) shown"

    async def test_timeouts_name_the_hung_op(self, engine: ae.Engine, hang: Hang) -> None:
        x, y = engine.new_var("x"), engine.new_var("y")
        engine.push_async(hang, mutate_vars=[x], name="hang")
        await hang.running()  # a worker has started it (else the dump says 'ready')
        # 'stuck' holds y and waits for x: waiting for y must lead to 'hang' through it.
        engine.push_sync(lambda r: None, const_vars=[x], mutate_vars=[y], name="stuck")
        engine.push_sync(lambda r: None, mutate_vars=[engine.new_var("z")], name="unrelated")
        with pytest.raises(TimeoutError) as info:
            await engine.wait_for_var(y, timeout=0.05)
        message = str(info.value)
        assert message.startswith("wait_for_var(<Var 'y'")
        assert "'stuck'" in message
        assert "'hang'" in message
        assert "on_complete() has not been called" in message
        assert "unrelated" not in message
        with pytest.raises(TimeoutError) as info:
            await engine.wait_for_all(timeout=0.05)
        message = str(info.value)
        assert re.search(r"with [23] operation\(s\) pending", message)  # unrelated: serial
        assert "'hang'" in message
        assert "on_complete() has not been called" in message
        hang.release()
        await engine.wait_for_all()

    async def test_push_sites_and_times_with_a_recorder(
        self, threaded_engine: ae.Engine, hang: Hang
    ) -> None:
        engine = threaded_engine
        engine.record_history()
        x = engine.new_var("x")
        line = _lineno() + 1
        engine.push_async(hang, mutate_vars=[x], name="hang")
        await hang.running()
        hung = engine.dump().op("hang")
        assert hung.site is not None
        assert hung.site.endswith(f"test_dump.py:{line}")
        assert hung.pending_for is not None
        assert hung.running_for is not None
        assert hung.pending_for >= hung.running_for >= 0
        assert f"test_dump.py:{line}" in str(engine.dump())
        hang.release()
        await engine.wait_for_all()

    async def test_push_sites_of_the_front_ends_are_the_callers(
        self, threaded_engine: ae.Engine, hang: Hang
    ) -> None:
        """submit(), @engine.op and Var.set() push for the caller: the site is the caller's."""
        engine = threaded_engine
        engine.record_history()
        x = engine.new_var("x", value=0)
        engine.push_async(hang, mutate_vars=[x], name="hang")

        @engine.op(const_vars=[x], name="decorated")
        def decorated() -> None:
            pass

        lines = {"submitted": _lineno() + 1}
        engine.submit(lambda: None, reads=[x], name="submitted")
        lines["decorated"] = _lineno() + 1
        decorated()
        lines["set(x)"] = _lineno() + 1
        x.set(1)
        dump = engine.dump()
        for name, line in lines.items():
            site = dump.op(name).site
            assert site is not None
            assert site.endswith(f"test_dump.py:{line}"), (name, site)
        hang.release()
        await engine.wait_for_all()

    async def test_await_stack_of_a_suspended_coroutine(self, engine: ae.Engine) -> None:
        release = asyncio.Event()

        waiting = asyncio.Event()

        async def inner() -> None:
            waiting.set()
            await release.wait()

        async def outer(rctx: ae.RunContext) -> None:
            await inner()

        op = engine.push_async(outer, name="outer")
        try:
            await asyncio.wait_for(waiting.wait(), 10)  # outer is suspended in release.wait()
            info = engine.dump().op("outer")
            functions = [frame.rsplit(" in ", 1)[1] for frame in info.stack]
            assert functions[:3] == ["outer", "inner", "wait"]
            assert "suspended in:" in str(engine.dump())
        finally:
            release.set()  # a failed assertion must not leave the engine's exit waiting
        await op

    async def test_await_stack_through_the_tracer(self, threaded_engine: ae.Engine) -> None:
        engine = threaded_engine
        release = asyncio.Event()

        waiting = asyncio.Event()

        async def sleeper(rctx: ae.RunContext) -> None:
            waiting.set()
            await release.wait()

        async with engine.trace():
            op = engine.push_async(sleeper, name="sleeper")
            await asyncio.wait_for(waiting.wait(), 10)  # suspended in release.wait()
            functions = [f.rsplit(" in ", 1)[1] for f in engine.dump().op("sleeper").stack]
            assert functions[:2] == ["sleeper", "wait"]
            release.set()
            await op

    async def test_format_limit(self, threaded_engine: ae.Engine, hang: Hang) -> None:
        """At most ``limit`` operations, and per Var at most ``limit`` holders and waiters:
        one Var with thousands queued makes no huge text (timeout messages, the watchdog)."""
        engine = threaded_engine
        x = engine.new_var("x")
        engine.push_async(hang, mutate_vars=[x], name="hang")
        for i in range(2_000):
            engine.push_sync(lambda r: None, const_vars=[x], name=f"r{i}")
        text = engine.dump().format(limit=2)
        assert "... and 1999 more operation(s)" in text
        assert "'r1'" not in text.split("Operations:")[1]
        text = engine.dump().format(limit=20)
        assert "held by  #1 'hang'" in text
        assert "... and 1980 more waiting" in text
        assert len(text.splitlines()) < 100
        with pytest.raises(TimeoutError) as info:
            await engine.wait_for_var(x, timeout=0.01)
        assert len(str(info.value).splitlines()) < 100
        assert "... and 1980 more waiting" in str(info.value)
        hang.release()
        await engine.wait_for_all()


def test_dump_gives_up_on_a_lock_that_stays_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal.signal() handler calling dump() may interrupt the engine inside its lock, on
    the same thread: waiting for the lock would wait forever. The dump says so instead."""
    monkeypatch.setattr(dump_module, "_LOCK_WAIT", 0.05)
    engine = ae.Engine()
    dumps: list[ae.Dump] = []
    with engine._core.lock:  # held, as by the code the handler interrupted
        helper = threading.Thread(target=lambda: dumps.append(engine.dump()), daemon=True)
        helper.start()
        helper.join(10)
    (dump,) = dumps
    assert dump.ops == ()
    assert dump.note is not None
    assert "loop.add_signal_handler" in str(dump)
    assert engine.dump().note is None  # once the lock is free


def _lineno() -> int:
    import sys

    return sys._getframe(1).f_lineno


async def test_dump_gives_up_on_a_busy_lock_with_a_bulk_segment_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same, with a bulk segment open: closing it first must not wait for the lock
    either."""
    monkeypatch.setattr(dump_module, "_LOCK_WAIT", 0.05)
    async with ae.Engine() as engine:
        x = engine.new_var("x")
        with engine.bulk(8):
            op = engine.push_sync(lambda r: None, mutate_vars=[x], prop=ae.FnProperty.ASYNC)
            assert engine._core.segments.open is not None
            with engine._core.lock:  # held, as by the code a signal handler interrupted
                dump = engine.dump()
            assert dump.note is not None
            assert engine.dump().note is None  # once the lock is free
        await op
