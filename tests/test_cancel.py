"""Cancellation: of operations, of tasks awaiting them, of waits, and of the engine itself.

An operation that has not started is cancelled at once (fn never runs, Vars released, no
failure recorded); a running coroutine operation receives CancelledError; a running sync or
callback-style operation cannot be cancelled and holds its Vars until it has finished.
Blockers are coroutine operations waiting on an ``asyncio.Event`` the test controls, so the
same tests hold in threaded and serial mode.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

import aioengine as ae

from .conftest import Blocker, blocked_var
from .helpers import Boom


def push_probe(
    engine: ae.Engine,
    trace: list[str],
    name: str,
    *,
    kind: str = "sync",
    const: Sequence[ae.Var] = (),
    mutate: Sequence[ae.Var] = (),
) -> ae.Operation[Any]:
    """Push an op of ``kind`` that appends ``name`` to ``trace`` (and returns it)."""
    if kind == "sync":

        def fn(rctx: ae.RunContext) -> str:
            trace.append(name)
            return name

        return engine.push_sync(fn, const_vars=const, mutate_vars=mutate, name=name)
    if kind == "coroutine":

        async def afn(rctx: ae.RunContext) -> str:
            trace.append(name)
            return name

        return engine.push_async(afn, const_vars=const, mutate_vars=mutate, name=name)
    assert kind == "callback"

    def cfn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
        trace.append(name)
        on_complete()

    return engine.push_async(cfn, const_vars=const, mutate_vars=mutate, name=name)


async def wait_thread_event(event: threading.Event) -> None:
    """Wait for a ``threading.Event`` without blocking the loop."""
    assert await asyncio.to_thread(event.wait, 10), "timed out waiting for a thread event"


class TestCancelNotStarted:
    """An op still waiting for its Vars: fn never runs, Vars released, nothing recorded."""

    @pytest.mark.parametrize("kind", ["sync", "coroutine", "callback"])
    @pytest.mark.parametrize("access", ["write", "read"])
    async def test_fn_never_runs_and_vars_are_released(
        self, engine: ae.Engine, kind: str, access: str
    ) -> None:
        x, trace, blocker = blocked_var(engine)
        if access == "write":
            victim = push_probe(engine, trace, "victim", kind=kind, mutate=[x])
        else:
            victim = push_probe(engine, trace, "victim", kind=kind, const=[x])
        after = push_probe(engine, trace, "after", mutate=[x])
        await blocker.started.wait()

        assert victim.cancel() is True
        assert victim.cancelled()
        assert victim.done()
        with pytest.raises(asyncio.CancelledError):
            await victim
        with pytest.raises(asyncio.CancelledError):
            victim.result()
        with pytest.raises(asyncio.CancelledError):
            victim.exception()

        blocker.release()
        assert await after == "after"
        assert trace == ["block:start", "block:end", "after"]
        assert x.version == 2  # the cancelled write is not counted
        await engine.wait_for_var(x)
        await engine.wait_for_all()  # no failure recorded

    async def test_cancel_twice(self, engine: ae.Engine) -> None:
        x, trace, blocker = blocked_var(engine)
        victim = push_probe(engine, trace, "victim", mutate=[x])
        assert victim.cancel() is True
        assert victim.cancel() is False
        assert victim.cancelled()
        blocker.release()
        await engine.wait_for_all()
        assert trace == ["block:start", "block:end"]

    async def test_the_message_reaches_the_cancelled_error(self, engine: ae.Engine) -> None:
        """As asyncio.Future.cancel(msg): await, result() and exception() raise it."""
        x, trace, blocker = blocked_var(engine)
        victim = push_probe(engine, trace, "victim", mutate=[x])
        silent = push_probe(engine, trace, "silent", mutate=[x])
        assert victim.cancel("shutting down")
        assert silent.cancel()
        for call in (victim.result, victim.exception):
            with pytest.raises(asyncio.CancelledError, match=r"^shutting down$"):
                call()
        with pytest.raises(asyncio.CancelledError, match=r"^shutting down$"):
            await victim
        with pytest.raises(asyncio.CancelledError, match="was cancelled"):
            await silent
        blocker.release()
        await engine.wait_for_all()

    async def test_cancel_a_middle_writer_keeps_the_order_of_the_rest(
        self, engine: ae.Engine
    ) -> None:
        x, trace, blocker = blocked_var(engine)
        ops = [push_probe(engine, trace, f"w{i}", mutate=[x]) for i in range(5)]
        assert ops[1].cancel() is True
        assert ops[3].cancel() is True
        blocker.release()
        await engine.wait_for_all()
        assert trace == ["block:start", "block:end", "w0", "w2", "w4"]
        assert x.version == 4
        assert [op.cancelled() for op in ops] == [False, True, False, True, False]

    async def test_cancel_from_another_thread(self, engine: ae.Engine) -> None:
        x, trace, blocker = blocked_var(engine)
        victim = push_probe(engine, trace, "victim", mutate=[x])
        after = push_probe(engine, trace, "after", mutate=[x])
        assert await asyncio.to_thread(victim.cancel) is True
        assert victim.cancelled()
        blocker.release()
        assert await after == "after"
        assert trace == ["block:start", "block:end", "after"]
        await engine.wait_for_all()

    async def test_op_that_only_conflicted_with_it_runs_at_once(
        self, threaded_engine: ae.Engine
    ) -> None:
        """x is held by the blocker; cancelling the x+y writer frees the y reader."""
        engine = threaded_engine
        x, y = engine.new_var("x"), engine.new_var("y")
        trace: list[str] = []
        blocker = Blocker(engine, trace, mutate=[x])
        victim = push_probe(engine, trace, "victim", mutate=[x, y])
        bystander = push_probe(engine, trace, "bystander", const=[y])
        await blocker.started.wait()
        assert not bystander.done()
        assert victim.cancel() is True
        async with asyncio.timeout(10):
            assert await bystander == "bystander"
        assert not blocker.op.done()
        blocker.release()
        await engine.wait_for_all()
        assert trace == ["block:start", "bystander", "block:end"]
        assert (x.version, y.version) == (1, 0)

    async def test_ready_op_queued_behind_busy_workers(self, threaded_engine: ae.Engine) -> None:
        """An op whose Vars are free but whose pool is busy is still cancellable."""
        engine = threaded_engine
        release = threading.Event()
        started = [threading.Event(), threading.Event()]

        def hog(i: int) -> Any:
            def fn(rctx: ae.RunContext) -> int:
                started[i].set()
                assert release.wait(10)
                return i

            return fn

        hogs = [engine.push_sync(hog(i), name=f"hog{i}") for i in range(2)]
        for event in started:
            await wait_thread_event(event)
        trace: list[str] = []
        queued = push_probe(engine, trace, "queued", mutate=[engine.new_var("x")])
        await asyncio.sleep(0.01)  # give a wrong implementation the chance to run it
        assert not queued.done()
        assert queued.cancel() is True
        release.set()
        assert await asyncio.gather(*hogs) == [0, 1]
        await engine.wait_for_all()
        assert queued.cancelled()
        assert trace == []

    @pytest.mark.parametrize("kind", ["sync", "callback"])
    async def test_ready_in_a_pool_queue_a_worker_going_on_drops_it(self, kind: str) -> None:
        """A worker that finishes an operation takes the next one queued on its pool; one
        cancelled while queued there is dropped, never run, and the worker goes on."""
        async with ae.Engine(cpu_workers=1) as engine:
            gate = threading.Event()
            ran: list[int] = []
            engine.push_sync(lambda r: gate.wait(10), mutate_vars=[engine.new_var()])

            def run(i: int) -> Any:
                if kind == "sync":
                    return lambda r: ran.append(i)

                def cb(r: ae.RunContext, done: ae.OnComplete) -> None:
                    ran.append(i)
                    done()

                return cb

            push = engine.push_sync if kind == "sync" else engine.push_async
            ops = [push(run(i), mutate_vars=[engine.new_var()]) for i in range(5)]
            assert all(op.state is ae.OpState.READY for op in ops)  # queued on the one worker
            assert [ops[i].cancel() for i in (1, 2, 4)] == [True, True, True]
            gate.set()
            await engine.wait_for_all()
            assert ran == [0, 3]
            assert [op.cancelled() for op in ops] == [False, True, True, False, True]


class TestCancelRunningCoroutine:
    """A running coroutine op receives CancelledError at its await; Vars released at its end."""

    async def test_receives_cancelled_error_and_releases_after_its_end(
        self, engine: ae.Engine
    ) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        started = asyncio.Event()

        async def body(rctx: ae.RunContext) -> None:
            trace.append("start")
            started.set()
            try:
                await asyncio.Event().wait()  # forever
            except asyncio.CancelledError:
                trace.append("cancelled")
                await asyncio.sleep(0)  # cleanup that awaits: the Var is still held
                trace.append("cleanup")
                raise

        op = engine.push_async(body, mutate_vars=[x])
        after = push_probe(engine, trace, "after", mutate=[x])
        await started.wait()
        assert op.cancel("stop now") is True
        with pytest.raises(asyncio.CancelledError, match=r"^stop now$"):
            await op
        assert op.cancelled()
        with pytest.raises(asyncio.CancelledError, match=r"^stop now$"):
            op.result()
        assert await after == "after"
        assert trace == ["start", "cancelled", "cleanup", "after"]
        assert x.version == 1
        await engine.wait_for_all()  # cancellation is not a failure

    async def test_cancel_from_another_thread(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        started = asyncio.Event()

        async def body(rctx: ae.RunContext) -> None:
            started.set()
            await asyncio.Event().wait()

        op = engine.push_async(body, mutate_vars=[x])
        await started.wait()
        assert await asyncio.to_thread(op.cancel) is True
        with pytest.raises(asyncio.CancelledError):
            await op
        assert op.cancelled()
        await engine.wait_for_var(x)
        await engine.wait_for_all()
        assert x.version == 0

    @pytest.mark.parametrize("how", ["op.cancel", "task.cancel"])
    async def test_cancelled_before_its_task_took_a_step(self, engine: ae.Engine, how: str) -> None:
        """Its task exists but has not run yet: cancelling it (through the operation, or the
        task itself, as a shutdown handler cancelling every task does) still finishes it."""
        x = engine.new_var("x")
        trace: list[str] = []

        async def body(rctx: ae.RunContext) -> None:
            trace.append("body")

        op = engine.push_async(body, mutate_vars=[x])
        after = push_probe(engine, trace, "after", mutate=[x])
        await asyncio.sleep(0)  # the loop queue ran: op's task is created, not yet stepped
        assert op.state is ae.OpState.RUNNING
        assert trace == []
        if how == "op.cancel":
            assert op.cancel() is True
        else:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            assert len(tasks) == 1
            tasks[0].cancel()
        with pytest.raises(asyncio.CancelledError):
            await op
        assert op.cancelled()
        assert await after == "after"
        assert trace == ["after"]  # body never ran; its Var was released
        await engine.wait_for_all()


class TestCancelRunningSync:
    """A running sync op cannot be cancelled and holds its Vars until fn returns."""

    async def test_cancel_returns_false_and_vars_stay_held(
        self, threaded_engine: ae.Engine
    ) -> None:
        engine = threaded_engine
        x = engine.new_var("x")
        trace: list[str] = []
        started, release = threading.Event(), threading.Event()

        def work(rctx: ae.RunContext) -> str:
            trace.append("work:start")
            started.set()
            assert release.wait(10)
            trace.append("work:end")
            return "work"

        op = engine.push_sync(work, mutate_vars=[x])
        after = push_probe(engine, trace, "after", mutate=[x])
        await wait_thread_event(started)
        assert op.cancel() is False
        assert not op.cancelled()
        await asyncio.sleep(0.02)  # give a wrong implementation the chance to release x
        assert not op.done()
        assert not after.done()
        release.set()
        assert await op == "work"
        assert await after == "after"
        assert trace == ["work:start", "work:end", "after"]
        assert x.version == 2

    async def test_cancel_from_inside_fn(self, engine: ae.Engine) -> None:
        """The op is running while its own fn runs, in both modes: cancel() is False."""
        box: list[ae.Operation[bool]] = []
        ready = threading.Event()

        def fn(rctx: ae.RunContext) -> bool:
            assert ready.wait(10)
            return box[0].cancel()

        op = engine.push_sync(fn, mutate_vars=[engine.new_var("x")])
        box.append(op)
        ready.set()
        assert await op is False
        assert not op.cancelled()


class TestCancelStartedCallback:
    """A callback-style op that has started cannot be cancelled."""

    async def test_cancel_returns_false_until_on_complete(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        tokens: list[ae.OnComplete] = []
        started = threading.Event()
        trace: list[str] = []

        def fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            trace.append("fn")
            tokens.append(on_complete)
            started.set()

        op = engine.push_async(fn, mutate_vars=[x])
        after = push_probe(engine, trace, "after", mutate=[x])
        await wait_thread_event(started)
        assert op.cancel() is False
        assert not op.cancelled()
        await asyncio.sleep(0.01)  # give a wrong implementation the chance to release x
        assert not after.done()
        await asyncio.to_thread(tokens[0])
        await op
        assert op.result() is None
        assert await after == "after"
        assert trace == ["fn", "after"]
        assert x.version == 2


class TestCancelDone:
    """Cancelling a finished op does nothing and returns False."""

    async def test_done(self, engine: ae.Engine) -> None:
        trace: list[str] = []
        op = push_probe(engine, trace, "op", mutate=[engine.new_var("x")])
        assert await op == "op"
        assert op.cancel() is False
        assert not op.cancelled()
        assert op.result() == "op"

    async def test_failed(self, engine: ae.Engine) -> None:
        exc = Boom()

        def fn(rctx: ae.RunContext) -> None:
            raise exc

        op = engine.push_sync(fn, mutate_vars=[engine.new_var("x")])
        with pytest.raises(Boom):
            await op
        assert op.cancel() is False
        assert op.exception() is exc
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()


class TestCancelAwaitingTask:
    """Cancelling a task that awaits an op stops the wait only."""

    async def test_op_still_runs(self, engine: ae.Engine) -> None:
        x, trace, blocker = blocked_var(engine)
        op = push_probe(engine, trace, "op", mutate=[x])
        entered = asyncio.Event()

        async def waiter() -> Any:
            entered.set()
            return await op

        task = asyncio.create_task(waiter())
        await entered.wait()
        await asyncio.sleep(0)  # the task is now suspended in `await op`
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not op.cancelled()
        blocker.release()
        assert await op == "op"
        assert trace == ["block:start", "block:end", "op"]

    async def test_wait_for_timeout_does_not_cancel_the_op(self, engine: ae.Engine) -> None:
        x, trace, blocker = blocked_var(engine)
        op = push_probe(engine, trace, "op", mutate=[x])
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(op, timeout=0.01)
        assert not op.done()
        blocker.release()
        assert await op == "op"
        assert not op.cancelled()


class TestContextManagerBodyRaises:
    """``async with`` whose body raises: cancel what has not started, close, re-raise."""

    async def test_not_started_cancelled_running_finishes(self, serial: bool) -> None:
        engine = ae.Engine(cpu_workers=2, serial=serial)
        err = RuntimeError("body failed")
        trace: list[str] = []
        x = engine.new_var("x")
        running = Blocker(engine, trace, mutate=[x], name="running")
        pending = [push_probe(engine, trace, f"p{i}", mutate=[x]) for i in range(3)]

        async def body() -> None:
            async with engine:
                await running.started.wait()
                asyncio.get_running_loop().call_soon(running.release)  # ends during the exit
                raise err

        with pytest.raises(RuntimeError) as info:
            await body()
        assert info.value is err
        assert engine.closed
        assert running.op.result() == "running"
        assert all(op.cancelled() for op in pending)
        assert trace == ["running:start", "running:end"]
        with pytest.raises(ae.EngineClosedError):
            push_probe(engine, trace, "late")

    async def test_body_exception_wins_over_op_failures(self, serial: bool) -> None:
        """A failure recorded while closing does not replace the body's exception."""
        engine = ae.Engine(cpu_workers=2, serial=serial)
        err = KeyError("body")
        exc = Boom()

        def fail(rctx: ae.RunContext) -> None:
            raise exc

        async def body() -> None:
            async with engine:
                op = engine.push_sync(fail, mutate_vars=[engine.new_var("x")])
                with pytest.raises(Boom):
                    await op
                raise err

        with pytest.raises(KeyError) as info:
            await body()
        assert info.value is err
        assert engine.closed


class TestAcloseCancel:
    """``aclose(cancel=True)``: not-started ops are cancelled, running ones finish."""

    async def test_aclose_cancel(self, engine: ae.Engine) -> None:
        x, y = engine.new_var("x"), engine.new_var("y")
        trace: list[str] = []
        running = Blocker(engine, trace, mutate=[x], name="running")
        pending = [
            push_probe(engine, trace, "px", mutate=[x]),
            push_probe(engine, trace, "py", kind="coroutine", const=[x], mutate=[y]),
        ]
        await running.started.wait()
        asyncio.get_running_loop().call_soon(running.release)
        await engine.aclose(cancel=True)  # cancelled ops are not failures: no raise
        assert engine.closed
        assert running.op.result() == "running"
        assert [op.cancelled() for op in pending] == [True, True]
        assert trace == ["running:start", "running:end"]
        assert (x.version, y.version) == (1, 0)
        with pytest.raises(ae.EngineClosedError):
            push_probe(engine, trace, "late")


class TestWaitTimeout:
    """Waits with ``timeout=`` raise TimeoutError and leave the engine working."""

    async def test_wait_for_var_timeout(self, engine: ae.Engine) -> None:
        x, trace, blocker = blocked_var(engine)
        with pytest.raises(TimeoutError):
            await engine.wait_for_var(x, timeout=0.02)
        after = push_probe(engine, trace, "after", mutate=[x])
        reader = push_probe(engine, trace, "reader", const=[x])
        blocker.release()
        assert await after == "after"
        assert await reader == "reader"
        await engine.wait_for_var(x, timeout=10)
        await engine.wait_for_all(timeout=10)
        assert trace == ["block:start", "block:end", "after", "reader"]
        assert x.version == 2

    async def test_failure_survives_a_timed_out_wait_for_var(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        gate = asyncio.Event()
        exc = Boom()

        async def fail_later(rctx: ae.RunContext) -> None:
            await gate.wait()
            raise exc

        engine.push_async(fail_later, mutate_vars=[x])
        with pytest.raises(TimeoutError):
            await engine.wait_for_var(x, timeout=0.02)
        gate.set()
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(x)
        assert info.value is exc
        await engine.wait_for_all()

    async def test_wait_for_all_timeout_keeps_failures(self, engine: ae.Engine) -> None:
        x, y = engine.new_var("x"), engine.new_var("y")
        exc = Boom()

        def fail(rctx: ae.RunContext) -> None:
            raise exc

        with pytest.raises(Boom):
            await engine.push_sync(fail, mutate_vars=[y])
        trace: list[str] = []
        blocker = Blocker(engine, trace, mutate=[x])
        with pytest.raises(TimeoutError):
            await engine.wait_for_all(timeout=0.02)
        after = push_probe(engine, trace, "after", mutate=[x])
        blocker.release()
        with pytest.raises(ExceptionGroup) as info:
            await engine.wait_for_all(timeout=10)
        assert info.value.exceptions == (exc,)
        assert after.result() == "after"
        await engine.wait_for_all()
        assert trace == ["block:start", "block:end", "after"]

    async def test_cancel_task_blocked_in_wait_for_all(self, engine: ae.Engine) -> None:
        x, trace, blocker = blocked_var(engine)
        waiter = asyncio.create_task(engine.wait_for_all())
        for _ in range(3):
            await asyncio.sleep(0)  # let it block
        assert not waiter.done()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        after = push_probe(engine, trace, "after", mutate=[x])
        second = asyncio.create_task(engine.wait_for_all())
        blocker.release()
        await second
        assert after.done()
        assert not blocker.op.cancelled()
        assert trace == ["block:start", "block:end", "after"]
        assert engine.pending == 0

    async def test_cancel_task_blocked_in_wait_for_var(self, engine: ae.Engine) -> None:
        x, trace, blocker = blocked_var(engine)
        waiter = asyncio.create_task(engine.wait_for_var(x))
        for _ in range(3):
            await asyncio.sleep(0)
        assert not waiter.done()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        after = push_probe(engine, trace, "after", mutate=[x])
        blocker.release()
        await engine.wait_for_var(x)
        assert after.result() == "after"
        assert trace == ["block:start", "block:end", "after"]
