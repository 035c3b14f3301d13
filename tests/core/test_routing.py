"""Routing (``aioengine/routing.py``): which executor runs an operation, the thread pools made
on first use, the cached route of each context, the loop's RunContexts, and the GPU and
remote collaborators opened through the façade's opener.

The unit tests drive a :class:`Routes` of their own with a stand-in scheduler (what ``route``
reads of it: the lock, the settings, the runner and the two collaborator fields); the rest
goes through a real Engine (``engine._core.routes``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import aioengine as ae
from aioengine.context import Context, RunContext
from aioengine.executors import Executor
from aioengine.executors.threads import ThreadExecutor
from aioengine.gpu_sync import GpuSync
from aioengine.kinds import _CORO, _SYNC
from aioengine.routing import Routes
from aioengine.settings import Settings

from ..conftest import Hold

F = ae.FnProperty
CPU0, CPU1 = ae.cpu(0), ae.cpu(1)


class StubSeam:
    """A GPU or remote collaborator that routes everything to one executor and records the
    devices it was asked to check."""

    def __init__(self, executor: Executor | None) -> None:
        self.executor = executor
        self.checked: list[Context] = []

    def route(self, ctx: Context, prop: F, kind: int) -> Executor | None:
        return self.executor

    def devices_for(self, ctx: Context) -> object:
        self.checked.append(ctx)
        return self


class StubCore:
    """What :class:`Routes` reads of its scheduler, and openers that attach a
    :class:`StubSeam` as the façade's do (counting how often each was called)."""

    def __init__(self, *, serial: bool = False) -> None:
        self.lock = threading.Lock()
        self.settings = Settings.resolve(cpu_workers=2, cpu_priority_workers=1, serial=serial)
        self.gpu: StubSeam | None = None
        self.remote: StubSeam | None = None
        self.opened: list[str] = []
        self.ran: list[tuple[object, bool]] = []
        self.routes = Routes(self.open_gpu, self.open_remote)  # type: ignore[arg-type]

    def open_gpu(self, core: Any, ctx: Context) -> StubSeam:
        assert core is self
        self.opened.append(f"gpu:{ctx!r}")
        self.gpu = StubSeam(None)
        return self.gpu

    def open_remote(self, core: Any, ctx: Context) -> StubSeam:
        assert core is self
        self.opened.append(f"remote:{ctx!r}")
        self.remote = StubSeam(None)
        return self.remote

    def execute(self, item: object, rctx: RunContext) -> None:
        """The pools' runner: records the item and whether it runs on a worker."""
        self.ran.append((item, self.routes.on_worker_thread(self)))  # type: ignore[arg-type]

    def route(self, ctx: Context, prop: F = F.NORMAL, kind: int = _SYNC) -> Executor | None:
        return self.routes.route(self, ctx, prop, kind)  # type: ignore[arg-type]


@pytest.fixture
def stub() -> Iterator[StubCore]:
    """A stand-in scheduler; its pools are forgotten and joined after the test."""
    core = StubCore()
    yield core
    for executor in core.routes.forget_locked():
        executor.shutdown(True)


class TestCpuRoutes:
    """A CPU context's operations go to its own pool, made on first use, and its route is
    remembered."""

    def test_each_cpu_context_gets_a_pool_of_its_own(self, stub: StubCore) -> None:
        first, second = stub.route(CPU0), stub.route(CPU1)
        assert isinstance(first, ThreadExecutor)
        assert isinstance(second, ThreadExecutor)
        assert first is not second
        assert stub.routes.executors == {"cpu0": first, "cpu1": second}
        assert (first.ctx, second.ctx) == (CPU0, CPU1)
        assert first.workers == second.workers == stub.settings.cpu_workers
        assert stub.opened == []  # no collaborator is opened for the CPU

    def test_cpu_prioritized_operations_share_one_pool(self, stub: StubCore) -> None:
        """Every CPU context's prioritized operations go to the one ``cpu-priority`` pool,
        with its own number of workers."""
        prio0, prio1 = stub.route(CPU0, F.CPU_PRIORITIZED), stub.route(CPU1, F.CPU_PRIORITIZED)
        assert isinstance(prio0, ThreadExecutor)
        assert prio1 is prio0
        assert stub.routes.executors == {"cpu-priority": prio0}
        assert prio0.workers == stub.settings.cpu_priority_workers
        assert stub.route(CPU0) is not prio0

    @pytest.mark.parametrize("serial", [False, True], ids=["threaded", "serial"])
    def test_the_loop_runs_async_functions_coroutines_and_serial_mode(self, serial: bool) -> None:
        """None means the event-loop thread; no pool is made for what runs there."""
        core = StubCore(serial=serial)
        assert core.route(CPU0, F.ASYNC) is None
        assert core.route(CPU1, F.NORMAL, _CORO) is None
        if serial:
            assert core.route(CPU0) is None
            assert core.route(CPU1, F.CPU_PRIORITIZED) is None
        assert core.routes.executors == {}
        assert core.routes.forget_locked() == []

    def test_a_route_is_taken_once_and_then_read_back(self, stub: StubCore) -> None:
        first = stub.route(CPU0)
        loop_route = stub.route(CPU0, F.ASYNC)
        del stub.routes.executors["cpu0"]  # a second lookup would make a new pool
        assert stub.route(CPU0) is first
        assert stub.route(CPU0, F.ASYNC) is loop_route is None
        assert stub.routes.executors == {}
        stub.routes.executors["cpu0"] = first  # (for the fixture to join it)

    def test_forget_locked_hands_back_every_executor_and_route(self, stub: StubCore) -> None:
        made = [stub.route(CPU0), stub.route(CPU1), stub.route(CPU0, F.CPU_PRIORITIZED)]
        stub.route(CPU0, F.ASYNC)
        forgotten = stub.routes.forget_locked()
        assert sorted(map(id, forgotten)) == sorted(map(id, made))
        assert stub.routes.executors == {}
        assert stub.routes.forget_locked() == []
        # Forgotten routes are taken afresh: a new pool for the same context.
        again = stub.route(CPU0)
        assert again is not made[0]
        assert stub.routes.executors == {"cpu0": again}
        for executor in forgotten:
            executor.shutdown(True)


class TestRunContext:
    def test_one_run_context_per_context_made_on_first_use(self, stub: StubCore) -> None:
        routes = stub.routes
        rctx = routes.run_context(CPU0)
        assert isinstance(rctx, RunContext)
        assert rctx.ctx is CPU0
        assert rctx.stream is None
        assert routes.run_context(CPU0) is rctx
        other = routes.run_context(CPU1)
        assert other is not rctx
        assert other.ctx is CPU1
        assert routes.run_context(ae.cpu(1)) is other


class TestOnWorkerThread:
    def test_true_on_a_pool_thread_only(self, stub: StubCore) -> None:
        pool = stub.route(CPU0)
        assert isinstance(pool, ThreadExecutor)
        assert not stub.routes.on_worker_thread(stub)  # type: ignore[arg-type]
        assert pool.submit("item", 1)
        pool.shutdown(True)  # runs what is queued, then joins the worker
        assert stub.ran == [("item", True)]
        assert not stub.routes.on_worker_thread(stub)  # type: ignore[arg-type]

    async def test_inside_an_engines_operations(self, engine: ae.Engine) -> None:
        """True inside a sync operation on a pool thread; False on the loop thread, in an
        operation that runs there, and everywhere in serial mode."""
        core = engine._core

        def where(rctx: ae.RunContext) -> bool:
            return core.routes.on_worker_thread(core)

        async def coro(rctx: ae.RunContext) -> bool:
            return core.routes.on_worker_thread(core)

        assert await engine.push_sync(where) is not engine.serial
        assert await engine.push_sync(where, CPU1, prop=F.CPU_PRIORITIZED) is not engine.serial
        assert await engine.push_sync(where, prop=F.ASYNC) is False
        assert await engine.push_async(coro) is False
        assert core.routes.on_worker_thread(core) is False
        core.validate_state()


class TestThroughTheEngine:
    async def test_a_push_routes_to_its_contexts_pool_and_remembers_the_route(
        self, threaded_engine: ae.Engine
    ) -> None:
        """The scheduler keeps the last CPU route taken (``_last_route``), and the pool's
        threads run the operations."""
        engine = threaded_engine
        core = engine._core
        name = await engine.push_sync(lambda r: threading.current_thread().name, CPU1)
        pool = core.routes.executors["cpu1"]
        assert name.startswith("aioengine-cpu1")
        assert core._last_route == (CPU1, F.NORMAL, pool)
        assert core.routes.route(core, CPU1, F.NORMAL, _SYNC) is pool

        async def coro(rctx: ae.RunContext) -> None:
            pass

        await engine.push_async(coro, CPU0)
        assert core._last_route == (CPU1, F.NORMAL, pool)  # a coroutine takes no CPU route
        await engine.push_sync(lambda r: None, CPU0, prop=F.ASYNC)
        assert core._last_route == (CPU0, F.ASYNC, None)
        assert set(core.routes.executors) == {"cpu1"}
        core.validate_state()

    async def test_closing_forgets_the_pools_and_the_last_route(self) -> None:
        engine = ae.Engine(cpu_workers=1)
        core = engine._core
        await engine.push_sync(lambda r: None)
        await engine.push_sync(lambda r: None, CPU1, prop=F.CPU_PRIORITIZED)
        assert set(core.routes.executors) == {"cpu0", "cpu-priority"}
        await engine.aclose()
        assert core.routes.executors == {}
        assert core._last_route == (None, None, None)
        core.validate_state()


class TestNotSubmitted:
    """A READY operation whose pool refuses it is cancelled, never left pending."""

    async def test_an_operation_for_a_pool_shut_down_is_cancelled(
        self, threaded_engine: ae.Engine
    ) -> None:
        engine = threaded_engine
        core = engine._core
        x = engine.new_var("x")
        await engine.push_sync(lambda r: None, mutate_vars=[x])  # the pool exists, routed
        pool = core.routes.executors["cpu0"]
        hold = Hold(engine, x)
        ran: list[str] = []
        first = engine.push_sync(lambda r: ran.append("first"), mutate_vars=[x])
        second = engine.push_sync(lambda r: ran.append("second"), const_vars=[x])

        async def after(rctx: ae.RunContext) -> str:
            return "after"

        on_loop = engine.push_async(after, const_vars=[x])
        pool.shutdown(True)  # between their admission and their turn
        await hold.release()
        assert await asyncio.wait_for(on_loop, 10) == "after"
        assert first.state is second.state is ae.OpState.CANCELLED
        with pytest.raises(asyncio.CancelledError):
            await first
        assert ran == []
        assert engine.pending == 0
        core.validate_state()
        await engine.wait_for_all()  # a cancellation records no failure

    async def test_a_chain_for_an_abandoned_pool_is_cancelled_in_a_loop(
        self, threaded_engine: ae.Engine
    ) -> None:
        """At interpreter exit (the pool abandoned) what a cancellation makes ready for the
        same pool is cancelled too, in a loop: a chain longer than the recursion limit."""
        engine = threaded_engine
        core = engine._core
        x = engine.new_var("x")
        pool = core.routes.route(core, CPU0, F.NORMAL, _SYNC)
        assert isinstance(pool, ThreadExecutor)
        hold = Hold(engine, x)
        chain = [engine.push_sync(lambda r: None, mutate_vars=[x]) for _ in range(1500)]
        assert pool._abandon() == []  # nothing was queued: the chain waits behind the hold
        assert pool.abandoned

        async def after(rctx: ae.RunContext) -> str:
            return "after"

        on_loop = engine.push_async(after, const_vars=[x])
        await hold.release()
        assert await asyncio.wait_for(on_loop, 10) == "after"
        assert all(op.state is ae.OpState.CANCELLED for op in chain)
        assert engine.pending == 0
        core.validate_state()


class TestCollaborators:
    """A GPU or remote context's first push opens its collaborator through the façade's
    opener; later routes ask the open one."""

    def test_the_opener_is_called_until_a_collaborator_is_attached(self, stub: StubCore) -> None:
        assert stub.route(ae.gpu(0)) is None
        assert stub.gpu is not None
        assert stub.route(ae.gpu(1), F.NORMAL, _CORO) is None  # the device is checked
        assert stub.gpu.checked == [ae.gpu(1)]
        remote = ae.remote()
        assert stub.route(remote) is None
        assert stub.route(remote, F.NORMAL, _CORO) is None
        assert stub.opened == ["gpu:" + repr(ae.gpu(0)), "remote:" + repr(remote)]
        assert stub.routes.executors == {}  # neither route is a CPU pool

    async def test_two_threads_racing_open_one_simulated_gpu(self) -> None:
        """Both threads find no collaborator and call the opener: one GpuSync is made and
        attached, and both get its executor."""
        engine = ae.Engine(cpu_workers=1, gpu_backend=ae.SimulatedGPU())
        core = engine._core
        try:
            await engine.push_sync(lambda r: None, CPU1)  # binds the loop
            opener = core.routes._open_gpu
            both = threading.Barrier(2, timeout=10)
            calls: list[int] = []
            made: list[GpuSync] = []
            init = GpuSync.__init__

            def opening(core_: Any, ctx: Context) -> Any:
                calls.append(threading.get_ident())
                both.wait()  # both threads saw no collaborator and call the opener
                return opener(core_, ctx)

            def counting_init(self: GpuSync, *args: Any, **kwargs: Any) -> None:
                made.append(self)
                init(self, *args, **kwargs)

            routes: list[Executor | None] = []

            def push_route() -> None:
                routes.append(core.routes.route(core, ae.gpu(0), F.NORMAL, _SYNC))

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(core.routes, "_open_gpu", opening)
                patch.setattr(GpuSync, "__init__", counting_init)
                threads = [threading.Thread(target=push_route) for _ in range(2)]
                for t in threads:
                    t.start()
                await asyncio.to_thread(lambda: [t.join(10) for t in threads])
            assert len(calls) == 2
            assert len(made) == 1
            assert core.gpu is made[0]
            assert core.may_hold
            assert len(routes) == 2
            assert routes[0] is routes[1] is not None
            assert routes[0] in core.routes.executors.values()
            assert core.routes.gpu_for(core, ae.gpu(0)) is made[0]
            await engine.push_sync(lambda r: None, ae.gpu(0))
            assert core._last_route == (CPU1, F.NORMAL, core.routes.executors["cpu1"])
            assert core.gpu is made[0]
            core.validate_state()
        finally:
            await engine.aclose()

    async def test_without_a_cluster_a_remote_push_is_refused(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("AIOENGINE_CLUSTER", raising=False)
        async with ae.Engine(cpu_workers=1) as engine:
            core = engine._core
            for _ in range(2):  # refused each time, nothing attached
                with pytest.raises(ae.DeviceUnavailableError, match="no cluster"):
                    engine.push_sync(lambda r: None, ae.remote())
                assert core.remote is None
                assert not core.may_hold
            assert engine.pending == 0
            assert await engine.push_sync(lambda r: "local") == "local"
            core.validate_state()
