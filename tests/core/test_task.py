"""The task of a coroutine operation (``aioengine/task.py``): ``run_coroutine`` runs the
function and finishes the operation whatever happens to the task, ``current_op`` names the
operation whose task runs, and the task's frames stay ordinary coroutine frames that
``engine.dump()`` walks."""

from __future__ import annotations

import asyncio
import traceback
import weakref
from typing import Any

import pytest

import aioengine as ae
from aioengine.task import current_op

from ..helpers import Boom


def running() -> ae.Operation[Any] | None:
    """The operation :data:`current_op` names here, if any."""
    ref = current_op.get()
    return ref() if ref is not None else None


class TestCurrentOp:
    async def test_a_coroutine_operation_sees_itself_and_nothing_else_does(
        self, engine: ae.Engine
    ) -> None:
        seen: dict[str, object] = {}
        pushed: list[ae.Operation[None]] = []

        async def inner(rctx: ae.RunContext) -> None:
            seen["inner"] = running()

        async def outer(rctx: ae.RunContext) -> None:
            seen["outer"] = running()
            pushed.append(engine.push_async(inner))
            await asyncio.sleep(0)
            seen["outer after"] = running()

        def sync(rctx: ae.RunContext) -> None:
            seen["sync"] = running()

        op = engine.push_async(outer)
        await op
        await pushed[0]
        await engine.push_sync(sync)
        assert seen["outer"] is op
        assert seen["outer after"] is op
        assert seen["inner"] is pushed[0]
        assert seen["sync"] is None  # the pusher's context: no operation's
        assert running() is None

    async def test_it_holds_the_operation_weakly(self, engine: ae.Engine) -> None:
        refs: list[object] = []

        async def fn(rctx: ae.RunContext) -> None:
            refs.append(current_op.get())

        await engine.push_async(fn)
        (ref,) = refs
        assert isinstance(ref, weakref.ref)  # the context outlives the operation


class TestRunCoroutine:
    async def test_the_result_of_the_function_is_the_operations(self, engine: ae.Engine) -> None:
        async def fn(rctx: ae.RunContext) -> str:
            await asyncio.sleep(0)
            return "value"

        assert await engine.push_async(fn) == "value"

    async def test_an_awaitable_that_is_not_a_coroutine_is_awaited(self, engine: ae.Engine) -> None:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        op = engine.push_async(lambda rctx: fut)
        await asyncio.sleep(0.01)
        assert not op.done()
        fut.set_result(3)
        assert await op == 3

    async def test_a_function_that_returns_no_awaitable_fails_its_operation(
        self, engine: ae.Engine
    ) -> None:
        op = engine.push_async(lambda rctx: 42, name="plain")
        with pytest.raises(TypeError, match="'plain' did not return an awaitable, got 42"):
            await op
        assert op.state is ae.OpState.FAILED
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()

    async def test_a_failure_is_recorded_without_the_engines_frames(
        self, engine: ae.Engine
    ) -> None:
        async def fn(rctx: ae.RunContext) -> None:
            await asyncio.sleep(0)
            raise Boom("x")

        op = engine.push_async(fn)
        with pytest.raises(Boom):
            await op
        exc = op.exception()
        assert isinstance(exc, Boom)
        names = [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
        assert "fn" in names
        assert "run_coroutine" not in names  # it would keep the operation alive
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()

    async def test_a_cancelled_task_cancels_its_operation_with_the_message(
        self, engine: ae.Engine
    ) -> None:
        started = asyncio.Event()

        async def fn(rctx: ae.RunContext) -> None:
            started.set()
            await asyncio.Event().wait()

        op = engine.push_async(fn)
        await started.wait()
        assert op.cancel("enough")
        with pytest.raises(asyncio.CancelledError, match="enough"):
            await op
        assert op.state is ae.OpState.CANCELLED
        await engine.wait_for_all()  # a cancellation is no failure

    async def test_a_cancellation_while_queued_never_runs_the_function(
        self, engine: ae.Engine
    ) -> None:
        ran = []

        async def fn(rctx: ae.RunContext) -> None:
            ran.append(1)

        op = engine.push_async(fn)
        assert op.cancel()
        with pytest.raises(asyncio.CancelledError):
            await op
        assert op.state is ae.OpState.CANCELLED
        assert ran == []
        assert engine.pending == 0

    async def test_a_cancellation_before_the_tasks_first_step_finishes_the_operation(
        self, engine: ae.Engine
    ) -> None:
        """The engine runs the coroutine up to its hand-off before creating the task, so a
        cancellation that lands before the task's first step still finishes the operation."""
        ran = []
        states = []

        async def fn(rctx: ae.RunContext) -> None:
            ran.append(1)

        op = engine.push_async(fn)

        def cancel() -> None:  # after the run of the loop queue, before the task's step
            states.append(op.state)
            op.cancel("early")

        asyncio.get_running_loop().call_soon(cancel)
        with pytest.raises(asyncio.CancelledError, match="early"):
            await op
        assert states == [ae.OpState.RUNNING]
        assert op.state is ae.OpState.CANCELLED
        assert ran == []
        assert engine.pending == 0
        engine._core.validate_state()


class TestFrames:
    async def test_a_dump_shows_where_a_coroutine_operation_is_suspended(
        self, engine: ae.Engine
    ) -> None:
        started = asyncio.Event()
        gate = asyncio.Event()

        async def parked_here(rctx: ae.RunContext) -> None:
            started.set()
            await gate.wait()

        op = engine.push_async(parked_here)
        await started.wait()
        text = str(engine.dump())
        gate.set()
        await op
        assert "suspended in:" in text
        assert "in parked_here" in text
        assert "run_coroutine" not in text  # the engine's frame is left out
