"""Backpressure: with ``max_pending=N`` the awaitable pushes keep a producer within N ops.

``push_sync_wait``, ``push_async_wait`` and ``push_wait`` wait (``wait_for_capacity``) while N
operations are pending, so a producer cannot outrun memory; plain pushes are never refused.
The bound is sampled from inside every operation and after every push.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import aioengine as ae


class Sampler:
    """Records ``engine.pending`` from inside operations (any thread)."""

    def __init__(self, engine: ae.Engine) -> None:
        self.engine = engine
        self.max_seen = 0
        self.runs = 0
        self._lock = threading.Lock()

    def sample(self) -> None:
        with self._lock:
            self.runs += 1
            self.max_seen = max(self.max_seen, self.engine.pending)


class TestBoundedProducer:
    @pytest.mark.parametrize("how", ["push_sync_wait", "push_async_wait", "push_wait", "mixed"])
    async def test_never_more_than_max_pending(self, serial: bool, how: str) -> None:
        asyncio.get_running_loop().set_debug(False)  # a volume test: debug mode's stacks dominate
        limit = 16
        async with ae.Engine(cpu_workers=2, serial=serial, max_pending=limit) as engine:
            assert engine.max_pending == limit
            sampler = Sampler(engine)
            vars_ = [engine.new_var(f"v{i}") for i in range(4)]

            def sync_op(rctx: ae.RunContext) -> None:
                sampler.sample()

            async def coro_op(rctx: ae.RunContext) -> None:
                sampler.sample()
                await asyncio.sleep(0)

            def callback_op(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
                sampler.sample()
                on_complete()

            handle = engine.new_operator(sync_op, [vars_[0]], [vars_[1]])
            after_push: list[int] = []
            ops: list[ae.Operation[Any]] = []
            for i in range(2000):
                v = [vars_[i % 4]]
                choice = how if how != "mixed" else ("push_sync_wait", "push_async_wait")[i % 2]
                if how == "mixed" and i % 5 == 0:
                    choice = "push_wait"
                if choice == "push_sync_wait":
                    op: ae.Operation[Any] = await engine.push_sync_wait(sync_op, mutate_vars=v)
                elif choice == "push_async_wait":
                    fn = coro_op if i % 3 else callback_op
                    op = await engine.push_async_wait(fn, mutate_vars=v)
                else:
                    op = await engine.push_wait(handle)
                ops.append(op)
                after_push.append(engine.pending)
            await engine.wait_for_all()
        assert sampler.runs == 2000
        assert max(after_push) <= limit
        assert sampler.max_seen <= limit
        assert all(op.done() and not op.cancelled() for op in ops)

    async def test_plain_pushes_are_never_refused(self) -> None:
        async with ae.Engine(cpu_workers=2, max_pending=2) as engine:
            x = engine.new_var("x")
            gate = asyncio.Event()

            async def block(rctx: ae.RunContext) -> None:
                await gate.wait()

            engine.push_async(block, mutate_vars=[x])
            ops = [engine.push_sync(lambda r: None, mutate_vars=[x]) for _ in range(10)]
            assert engine.pending == 11
            gate.set()
            await asyncio.gather(*ops)


class TestWaitForCapacity:
    async def test_returns_at_once_when_unbounded(self, engine: ae.Engine) -> None:
        assert engine.max_pending is None
        x = engine.new_var("x")
        gate = asyncio.Event()

        async def block(rctx: ae.RunContext) -> None:
            await gate.wait()

        engine.push_async(block, mutate_vars=[x])
        for _ in range(100):
            engine.push_sync(lambda r: None, mutate_vars=[x])
        await returns_without_yielding(engine.wait_for_capacity())
        gate.set()

    async def test_returns_at_once_below_the_bound(self) -> None:
        async with ae.Engine(cpu_workers=2, max_pending=3) as engine:
            x = engine.new_var("x")
            gate = asyncio.Event()

            async def block(rctx: ae.RunContext) -> None:
                await gate.wait()

            engine.push_async(block, mutate_vars=[x])
            engine.push_sync(lambda r: None, mutate_vars=[x])
            assert engine.pending == 2
            await returns_without_yielding(engine.wait_for_capacity())
            engine.push_sync(lambda r: None, mutate_vars=[x])
            waiter = asyncio.create_task(engine.wait_for_capacity())
            for _ in range(5):
                await asyncio.sleep(0)
            assert not waiter.done()  # at the bound: it waits
            gate.set()
            await waiter


async def returns_without_yielding(awaitable: Any) -> None:
    """Drive ``awaitable`` one step: it must finish without suspending."""
    coro = awaitable.__await__()
    with pytest.raises(StopIteration):
        coro.send(None)


class TestCancelledProducer:
    async def test_cancelling_a_blocked_producer_leaves_the_engine_consistent(
        self, serial: bool
    ) -> None:
        async with ae.Engine(cpu_workers=2, serial=serial, max_pending=2) as engine:
            x = engine.new_var("x")
            gate = asyncio.Event()
            ran: list[str] = []

            async def block(rctx: ae.RunContext) -> None:
                await gate.wait()

            engine.push_async(block, mutate_vars=[x])
            engine.push_sync(lambda r: ran.append("queued"), mutate_vars=[x])

            async def producer() -> None:
                await engine.push_sync_wait(lambda r: ran.append("never"), mutate_vars=[x])

            task = asyncio.create_task(producer())
            for _ in range(5):
                await asyncio.sleep(0)
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert engine.pending == 2  # the cancelled producer pushed nothing
            gate.set()
            await engine.wait_for_all()
            op = await engine.push_sync_wait(lambda r: ran.append("after"), mutate_vars=[x])
            await op
            assert ran == ["queued", "after"]
            assert engine.pending == 0


class TestWaitingForItself:
    """A wait for room inside an operation that only that operation could make raises
    RuntimeError at once (a silent deadlock before), as ``wait_for_var`` on a Var the
    operation holds does; a wait that others can end still waits."""

    @pytest.mark.parametrize("how", ["push_sync_wait", "push_async_wait", "push_wait", "wait"])
    async def test_the_only_pending_operation(self, serial: bool, how: str) -> None:
        async with ae.Engine(cpu_workers=2, serial=serial, max_pending=1) as engine:
            handle = engine.new_operator(lambda r: "pushed")
            pushed: list[ae.Operation[Any]] = []

            async def produce(rctx: ae.RunContext) -> None:
                if how == "push_sync_wait":
                    pushed.append(await engine.push_sync_wait(lambda r: "pushed"))
                elif how == "push_async_wait":
                    pushed.append(await engine.push_async_wait(lambda r, done: done()))
                elif how == "push_wait":
                    pushed.append(await engine.push_wait(handle))
                else:
                    await engine.wait_for_capacity()

            op = engine.push_async(produce, name="producer")
            name = "wait_for_capacity" if how == "wait" else how
            with pytest.raises(RuntimeError, match=rf"^{name}\(\) inside operation 'producer'"):
                await asyncio.wait_for(op, 10)
            assert pushed == []
            assert "max_pending=1" in str(op.exception())
            with pytest.raises(ExceptionGroup):  # the producer's failure, recorded
                await engine.wait_for_all()

    async def test_operations_queued_behind_it_fill_the_bound(self, serial: bool) -> None:
        """Pending ops that wait for the producer (on its Var, or through another op) do not
        count as room to come."""
        async with ae.Engine(cpu_workers=2, serial=serial, max_pending=3) as engine:
            x, y = engine.new_var("x"), engine.new_var("y")
            started = asyncio.Event()

            async def produce(rctx: ae.RunContext) -> None:
                started.set()
                await asyncio.sleep(0)
                await engine.push_sync_wait(lambda r: None)

            op = engine.push_async(produce, mutate_vars=[x], name="producer")
            await started.wait()
            engine.push_sync(lambda r: None, const_vars=[x], mutate_vars=[y])  # behind it on x
            engine.push_sync(lambda r: None, const_vars=[y])  # behind that one on y
            with pytest.raises(RuntimeError, match=r"3 pending operation\(s\)"):
                await asyncio.wait_for(op, 10)
            with pytest.raises(ExceptionGroup):
                await engine.wait_for_all()

    async def test_room_others_can_make_is_waited_for(self) -> None:
        """An independent pending operation will finish: the producer waits for it."""
        async with ae.Engine(cpu_workers=2, max_pending=2) as engine:
            gate = asyncio.Event()

            async def independent(rctx: ae.RunContext) -> None:
                await gate.wait()

            async def produce(rctx: ae.RunContext) -> str:
                waiting = asyncio.ensure_future(engine.push_sync_wait(lambda r: "pushed"))
                await asyncio.sleep(0.01)
                assert not waiting.done()  # at the bound: waits for independent
                gate.set()
                return await (await waiting)

            engine.push_async(independent, mutate_vars=[engine.new_var("x")])
            assert await asyncio.wait_for(engine.push_async(produce), 10) == "pushed"


class TestSetting:
    def test_environment_variable(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AIOENGINE_MAX_PENDING", "7")
        assert ae.Engine().max_pending == 7
        assert ae.Engine(max_pending=3).max_pending == 3  # the argument wins
        monkeypatch.delenv("AIOENGINE_MAX_PENDING")
        assert ae.Engine().max_pending is None

    @pytest.mark.parametrize("value", [0, -1, 1.5, "8", True])
    def test_bad_argument_names_it(self, value: object) -> None:
        with pytest.raises(ValueError, match=r"^max_pending must be"):
            ae.Engine(max_pending=value)  # type: ignore[arg-type]

    @pytest.mark.parametrize("raw", ["0", "-3", "many", "1.5"])
    def test_bad_environment_variable_names_it(
        self, monkeypatch: pytest.MonkeyPatch, raw: str
    ) -> None:
        monkeypatch.setenv("AIOENGINE_MAX_PENDING", raw)
        with pytest.raises(ValueError, match=r"^environment variable AIOENGINE_MAX_PENDING="):
            ae.Engine()
