"""Wake-ups (``aioengine/wakeups.py``): the loop futures of ``wait_for_all`` (idle waiters) and
of the backpressured pushes (capacity waiters), the inbox through which other threads wake
them and an operation's awaiters (one drain scheduled per batch), and the order of an
operation's wake-up (callbacks before awaiters).

The unit tests drive a :class:`Wakeups` of their own with a stand-in scheduler (what it reads
of one: the lock, the loop and its thread, the live operations, ``max_pending``, and the call
that schedules a drain) and stand-in final operations; the rest goes through a real Engine
(``engine._core.wakeups``)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest

import aioengine as ae
from aioengine.instrument import Instrument
from aioengine.wakeups import Wakeups, wake_locked

from ..conftest import Hold, _open_gates


class StubCore:
    """What :class:`Wakeups` reads of its scheduler; ``drains`` counts the drains scheduled
    (``call_soon_locked(drain_wakeups)``), which the test runs itself."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_pending: int | None = None) -> None:
        self.lock = threading.Lock()
        self.loop = loop
        self.loop_thread = threading.get_ident()
        self.live: dict[int, object] = {}
        self.settings = SimpleNamespace(max_pending=max_pending)
        self.wakeups = Wakeups()
        self.drains = 0

    def call_soon_locked(self, callback: Callable[[], None]) -> None:
        assert callback == self.drain_wakeups
        self.drains += 1

    def drain_wakeups(self) -> None:
        self.wakeups.drain(self)  # type: ignore[arg-type]

    def on_other_thread(self, fn: Callable[[Wakeups, Any], None]) -> None:
        """Call ``fn(wakeups, self)`` with the lock held, on a thread that is not the loop's."""
        failed: list[BaseException] = []

        def run() -> None:
            try:
                with self.lock:
                    fn(self.wakeups, self)
            except BaseException as exc:  # reported on the test's thread
                failed.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(10)
        assert not thread.is_alive()
        if failed:
            raise failed[0]


class FinalOp:
    """A final operation as :func:`wake_locked` reads it: its awaiters and callbacks."""

    def __init__(self, loop: asyncio.AbstractEventLoop, trace: list[str], name: str) -> None:
        self.waiter: asyncio.Future[None] = loop.create_future()
        self.waiters: list[asyncio.Future[None]] | None = [self.waiter]
        self.callbacks: list[tuple[Callable[[Any], None], contextvars.Context]] | None = [
            (lambda op: trace.append(f"{name}:callback"), contextvars.copy_context())
        ]


@pytest.fixture
async def stub() -> StubCore:
    """A stand-in scheduler on the test's loop (this thread is its loop thread)."""
    return StubCore(asyncio.get_running_loop())


async def recorder(fut: asyncio.Future[None], trace: list[str], name: str) -> None:
    await fut
    trace.append(f"{name}:awaiter")


class TestCheck:
    def test_an_inbox_with_no_drain_scheduled_is_reported(self) -> None:
        wakeups = Wakeups()
        wakeups.check()
        wakeups.inbox.append(object())  # type: ignore[arg-type]
        with pytest.raises(AssertionError, match="inbox not scheduled"):
            wakeups.check()
        wakeups.scheduled = True
        wakeups.check()
        wakeups.inbox.clear()
        wakeups.check()  # a drain scheduled with nothing to wake is fine


class TestInbox:
    """Another thread leaves final operations in the inbox; the loop's drain wakes them."""

    async def test_one_drain_is_scheduled_per_batch(self, stub: StubCore) -> None:
        loop = asyncio.get_running_loop()
        trace: list[str] = []
        ops = [FinalOp(loop, trace, f"op{i}") for i in range(3)]
        for op in ops:
            stub.on_other_thread(lambda w, core, op=op: w.post_locked(core, op))
        assert stub.drains == 1
        assert stub.wakeups.scheduled
        assert stub.wakeups.inbox == ops
        stub.wakeups.check()
        stub.drain_wakeups()
        assert stub.wakeups.inbox == []
        assert not stub.wakeups.scheduled
        assert all(op.waiter.done() for op in ops)
        assert all(op.waiters is None and op.callbacks is None for op in ops)
        await asyncio.sleep(0)  # the callbacks were scheduled with call_soon
        assert trace == ["op0:callback", "op1:callback", "op2:callback"]
        stub.on_other_thread(lambda w, core: w.post_locked(core))  # a post with no operation
        assert stub.drains == 2
        assert stub.wakeups.inbox == []
        stub.drain_wakeups()
        stub.wakeups.check()

    async def test_wake_locked_schedules_callbacks_before_resolving_awaiters(self) -> None:
        """As with an asyncio.Future: a callback added before ``await op`` has run when the
        await returns."""
        loop = asyncio.get_running_loop()
        trace: list[str] = []
        op = FinalOp(loop, trace, "op")
        awaiter = asyncio.ensure_future(recorder(op.waiter, trace, "op"))
        await asyncio.sleep(0)  # the awaiter waits on the future
        wake_locked(loop, op)  # type: ignore[arg-type]
        assert op.waiter.done()
        assert trace == []  # both only scheduled
        await awaiter
        assert trace == ["op:callback", "op:awaiter"]
        wake_locked(loop, op)  # type: ignore[arg-type]  # woken once: nothing left
        await asyncio.sleep(0)
        assert trace == ["op:callback", "op:awaiter"]


class TestIdleWaiters:
    async def test_the_loop_thread_wakes_idle_waiters_at_once(self, stub: StubCore) -> None:
        wakeups = stub.wakeups
        futs = [wakeups.idle_waiter_locked(stub.loop) for _ in range(2)]
        wakeups.became_idle_locked(stub)  # type: ignore[arg-type]
        assert all(f.done() for f in futs)
        assert wakeups.idle == []
        assert stub.drains == 0

    async def test_another_thread_leaves_them_to_the_drain(self, stub: StubCore) -> None:
        wakeups = stub.wakeups
        fut = wakeups.idle_waiter_locked(stub.loop)
        stub.on_other_thread(lambda w, core: w.became_idle_locked(core))
        assert wakeups.idle_due
        assert stub.drains == 1
        assert not fut.done()
        stub.drain_wakeups()
        assert fut.done()
        assert not wakeups.idle_due
        assert wakeups.idle == []

    async def test_the_drain_wakes_none_once_an_operation_was_pushed_meanwhile(
        self, stub: StubCore
    ) -> None:
        wakeups = stub.wakeups
        fut = wakeups.idle_waiter_locked(stub.loop)
        stub.on_other_thread(lambda w, core: w.became_idle_locked(core))
        stub.live[1] = object()  # pushed before the drain ran
        stub.drain_wakeups()
        assert not fut.done()
        assert wakeups.idle == [fut]
        assert not wakeups.idle_due  # the next completion that empties live says it again
        wakeups.drop_waiter_locked(fut)
        assert wakeups.idle == []


class TestCapacityWaiters:
    async def test_woken_only_below_the_bound(self) -> None:
        stub = StubCore(asyncio.get_running_loop(), max_pending=2)
        wakeups = stub.wakeups
        futs = [wakeups.capacity_waiter_locked(stub.loop) for _ in range(2)]
        stub.live = {1: object(), 2: object()}
        wakeups.capacity_freed_locked(stub)  # type: ignore[arg-type]
        assert not any(f.done() for f in futs)
        assert wakeups.capacity == futs
        del stub.live[2]
        wakeups.capacity_freed_locked(stub)  # type: ignore[arg-type]
        assert all(f.done() for f in futs)  # every one, each re-checks the bound
        assert wakeups.capacity == []
        assert stub.drains == 0

    async def test_another_thread_leaves_them_to_the_drain(self) -> None:
        stub = StubCore(asyncio.get_running_loop(), max_pending=1)
        wakeups = stub.wakeups
        fut = wakeups.capacity_waiter_locked(stub.loop)
        stub.on_other_thread(lambda w, core: w.capacity_freed_locked(core))
        assert wakeups.capacity_due
        assert stub.drains == 1
        assert not fut.done()
        stub.drain_wakeups()
        assert fut.done()
        assert not wakeups.capacity_due

    async def test_a_dropped_waiter_is_forgotten(self, stub: StubCore) -> None:
        wakeups = stub.wakeups
        idle = wakeups.idle_waiter_locked(stub.loop)
        capacity = [wakeups.capacity_waiter_locked(stub.loop) for _ in range(2)]
        wakeups.drop_waiter_locked(capacity[0])
        wakeups.drop_waiter_locked(stub.loop.create_future())  # not a waiter: nothing
        assert wakeups.capacity == capacity[1:]
        assert wakeups.idle == [idle]
        wakeups.drop_waiter_locked(idle)
        assert wakeups.idle == []


class FinishGate(Instrument):
    """Sets ``finished`` once ``n`` operations reached a final state (in the critical section
    that finishes the n-th, which also leaves its wake-ups in the inbox)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.finished = threading.Event()

    def on_finish(self, op: ae.Operation[Any]) -> None:
        self.n -= 1
        if self.n == 0:
            self.finished.set()


@pytest.fixture
async def make_engine() -> AsyncIterator[Callable[..., ae.Engine]]:
    """Makes engines (``ae.Engine(**kwargs)``) closed after the test as the ``engine``
    fixture's are: the Holds' gates opened first, so that a failed test never hangs."""
    made: list[ae.Engine] = []

    def make(**kwargs: Any) -> ae.Engine:
        engine = ae.Engine(**kwargs)
        made.append(engine)
        return engine

    yield make
    _open_gates()
    for engine in made:
        if not engine.closed:
            try:
                await engine.aclose(cancel=True, timeout=30)
            except BaseExceptionGroup:
                pass


class TestThroughTheEngine:
    async def test_a_worker_finishing_the_last_operation_wakes_wait_for_all_through_the_inbox(
        self, make_engine: Callable[..., ae.Engine]
    ) -> None:
        """The workers leave every wake-up of a batch in the inbox, behind one scheduled
        drain; the loop's drain then runs the callbacks and wakes ``wait_for_all``."""
        engine = make_engine(cpu_workers=1)
        core, wakeups = engine._core, engine._core.wakeups
        gate = threading.Event()
        engine.push_sync(lambda r: gate.wait(10))
        ops = [engine.push_sync(lambda r, i=i: i) for i in range(4)]
        trace: list[int] = []
        for op in ops:
            op.add_done_callback(lambda op: trace.append(op.result()))
        waiter = asyncio.ensure_future(engine.wait_for_all())
        for _ in range(100):  # bounded: it needs a few loop iterations
            if wakeups.idle:
                break
            await asyncio.sleep(0)
        assert len(wakeups.idle) == 1
        gate_seen = FinishGate(5)
        engine.add_instrument(gate_seen)
        # The loop thread blocks here: no drain can run while the workers finish.
        gate.set()
        assert gate_seen.finished.wait(10)
        with core.lock:  # the last finish's critical section is over
            assert core.live == {}
            assert wakeups.scheduled
            assert wakeups.idle_due
            assert wakeups.inbox == ops  # only the operations someone waits for
            assert not waiter.done()
        core.validate_state()
        await asyncio.wait_for(waiter, 10)
        assert trace == [0, 1, 2, 3]
        assert wakeups.inbox == []
        assert wakeups.idle == []
        assert not wakeups.scheduled
        assert not wakeups.idle_due
        core.validate_state()

    async def test_a_cancelled_wait_for_all_leaves_no_waiter(self, engine: ae.Engine) -> None:
        hold = Hold(engine, engine.new_var("x"))
        wakeups = engine._core.wakeups
        waiter = asyncio.ensure_future(engine.wait_for_all())
        for _ in range(100):
            if wakeups.idle:
                break
            await asyncio.sleep(0)
        (fut,) = wakeups.idle
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert wakeups.idle == []
        assert fut.cancelled()
        engine._core.validate_state()
        await hold.release()
        await engine.wait_for_all()
        engine._core.validate_state()

    async def test_capacity_waiters_wake_only_below_max_pending(
        self, make_engine: Callable[..., ae.Engine]
    ) -> None:
        engine = make_engine(cpu_workers=1, max_pending=2)
        core, wakeups = engine._core, engine._core.wakeups
        holds = [Hold(engine, engine.new_var(f"v{i}")) for i in range(3)]
        assert engine.pending == 3  # plain pushes are never refused
        pushed = asyncio.ensure_future(engine.push_sync_wait(lambda r: "late"))
        for _ in range(100):
            if wakeups.capacity:
                break
            await asyncio.sleep(0)
        (fut,) = wakeups.capacity
        await holds[0].release()
        assert engine.pending == 2
        assert not fut.done()  # still at the bound
        assert wakeups.capacity == [fut]
        core.validate_state()
        await holds[1].release()
        assert fut.done()
        assert wakeups.capacity == []
        late = await asyncio.wait_for(pushed, 10)
        assert await late == "late"
        await holds[2].release()
        core.validate_state()

    async def test_a_worker_frees_capacity_through_the_drain(
        self, make_engine: Callable[..., ae.Engine]
    ) -> None:
        engine = make_engine(cpu_workers=1, max_pending=1)
        wakeups = engine._core.wakeups
        gate = threading.Event()
        first = engine.push_sync(lambda r: gate.wait(10))
        pushed = asyncio.ensure_future(engine.push_sync_wait(lambda r: "second"))
        for _ in range(100):
            if wakeups.capacity:
                break
            await asyncio.sleep(0)
        assert len(wakeups.capacity) == 1
        threading.Thread(target=gate.set).start()
        second = await asyncio.wait_for(pushed, 10)
        assert await first is True
        assert await second == "second"
        assert not wakeups.capacity_due
        assert wakeups.capacity == []
        engine._core.validate_state()

    async def test_a_cancelled_capacity_wait_leaves_no_waiter(
        self, make_engine: Callable[..., ae.Engine]
    ) -> None:
        engine = make_engine(cpu_workers=1, max_pending=1)
        wakeups = engine._core.wakeups
        hold = Hold(engine, engine.new_var("x"))
        waiter = asyncio.ensure_future(engine.wait_for_capacity())
        for _ in range(100):
            if wakeups.capacity:
                break
            await asyncio.sleep(0)
        (fut,) = wakeups.capacity
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert wakeups.capacity == []
        assert fut.cancelled()
        engine._core.validate_state()
        await hold.release()
        engine._core.validate_state()

    @pytest.mark.parametrize(
        "prop", [ae.FnProperty.NORMAL, ae.FnProperty.ASYNC], ids=["pool", "loop"]
    )
    async def test_a_done_callback_added_before_await_has_run_when_it_returns(
        self, engine: ae.Engine, prop: ae.FnProperty
    ) -> None:
        """Whether a worker (threaded, NORMAL) or the loop finishes the operation: its
        callbacks are scheduled before its awaiters are woken, as an asyncio.Future's."""
        x = engine.new_var("x")
        hold = Hold(engine, x)  # the callback and the awaiter are in place before it runs
        op = engine.push_sync(lambda r: "ran", const_vars=[x], prop=prop)
        trace: list[str] = []
        op.add_done_callback(lambda op: trace.append("callback"))
        release = asyncio.ensure_future(hold.release())
        assert await op == "ran"  # directly: a task around it would resume later anyway
        trace.append("await returned")
        assert trace == ["callback", "await returned"]
        await release
        engine._core.validate_state()
