"""Remote operations on a Dask cluster (remote.py): the same rule, across local and remote.

Most tests use an in-process ``LocalCluster(processes=False)`` (workers are threads of this
process, so a test can block a remote function on a ``threading.Event`` and see its effects);
one module-scoped ``processes=True`` cluster checks real pickling and a worker's death, and
one cluster runs over TLS.
"""

# ruff: noqa: ASYNC110  (polling Dask's scheduler state, which has no events to await)
from __future__ import annotations

import asyncio
import functools
import importlib
import operator
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioengine as ae
from aioengine.remote import RemoteBackend
from aioengine.remote.placement import Placement

from .helpers import (
    Outcome,
    SequentialModel,
    command_line_cluster,
    engine_keys,
    in_process_cluster,
    no_keys_left,
    until,
)

# The module of Dask's private names (``aioengine.remote`` as an attribute is the ``remote()``
# function, so the package's modules are imported by name).
dask_api = importlib.import_module("aioengine.remote.dask_api")

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


@pytest.fixture
async def cluster() -> AsyncIterator[Any]:
    """One worker with two threads, in this process (fast to start: ~50 ms); the engine's
    checks in debug mode are the other tests'."""
    async with in_process_cluster(1, 2) as c:
        yield c


def inc(x: int) -> int:
    return x + 1


def add(x: int, y: int) -> int:
    return x + y


def fail(x: int) -> int:
    raise KeyError(f"bad {x}")


# In-process workers call the functions of this module by reference (Dask pickles them by
# name), so these share state with the test; a closure would be copied by value.
_GATES: dict[str, threading.Event] = {}
_LOGS: dict[str, list[str]] = {}


@pytest.fixture
def gate(request: pytest.FixtureRequest) -> Iterator[str]:
    """The name of a fresh Event that the functions below wait for; set at the end."""
    name = request.node.nodeid
    _GATES[name] = threading.Event()
    _LOGS[name] = []
    yield name
    _GATES.pop(name).set()
    _LOGS.pop(name)


def wait_gate(name: str, *args: Any) -> None:
    """Block (a worker thread) until the test opens gate ``name``."""
    assert _GATES[name].wait(10)


def log(name: str, item: str, *args: Any) -> None:
    _LOGS[name].append(item)


def wait_then_log(name: str, item: str, *args: Any) -> None:
    log(name, f"{item}:start")
    wait_gate(name)
    log(name, f"{item}:end")


def slow_inc(name: str, x: int) -> int:
    wait_gate(name)
    return x + 1


def logged_inc(name: str, item: str, x: int) -> int:
    log(name, item)
    return x + 1


def slow_copy(name: str, v: list[int]) -> list[int]:
    wait_gate(name)
    return list(v)


class TestContext:
    def test_equal_arguments_give_equal_contexts(self) -> None:
        a = ae.remote(resources={"GPU": 1}, workers=["w1"], retries=2)
        b = ae.remote(resources={"GPU": 1.0}, workers=("w1",), retries=2)
        assert a == b
        assert hash(a) == hash(b)
        assert a.device_type is ae.DeviceType.REMOTE
        assert ae.remote() != a
        assert ae.remote() == ae.remote()
        assert ae.remote() != ae.cpu(0)
        # The same object, as cpu()'s: a push loop that calls remote() each time makes none.
        assert a is b
        assert ae.remote() is ae.remote() is ae.remote(resources=None, workers=None, retries=0)
        assert ae.remote() == ae.remote(resources={}, workers=None)
        assert repr(a) == "remote(resources={'GPU': 1.0}, workers=['w1'], retries=2)"
        loose = ae.remote(workers="w1", allow_other_workers=True)
        assert loose != ae.remote(workers="w1")
        assert loose is ae.remote(workers=["w1"], allow_other_workers=True)
        assert repr(loose) == "remote(workers=['w1'], allow_other_workers=True)"

    @pytest.mark.parametrize(
        ("kwargs", "error"),
        [
            ({"resources": ["GPU"]}, TypeError),
            ({"resources": {"GPU": "1"}}, TypeError),
            ({"workers": 3}, TypeError),
            ({"retries": 1.0}, TypeError),
            ({"retries": 0.0}, TypeError),
            ({"retries": False}, TypeError),
            ({"retries": -1}, ValueError),
            ({"allow_other_workers": 1}, TypeError),
            ({"allow_other_workers": True}, ValueError),  # a preference needs workers=
        ],
    )
    def test_bad_arguments(self, kwargs: dict[str, Any], error: type[Exception]) -> None:
        with pytest.raises(error):
            ae.remote(**kwargs)


class TestConfiguration:
    async def test_no_cluster_configured(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("AIOENGINE_CLUSTER", raising=False)
        async with ae.Engine() as engine:
            with pytest.raises(ae.DeviceUnavailableError, match=r"Engine\(cluster=\.\.\.\)") as e:
                engine.push_sync(lambda rctx: None, ae.remote())
            assert "AIOENGINE_CLUSTER" in str(e.value)

    async def test_without_distributed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(__import__("sys").modules, "distributed", None)
        async with ae.Engine(cluster="tcp://127.0.0.1:1") as engine:
            with pytest.raises(ae.DeviceUnavailableError, match=r"aioengine\[dask\]"):
                engine.submit(inc, 1, ctx=ae.remote())

    async def test_callback_style_is_a_type_error(self, cluster: Any) -> None:
        async with ae.Engine(cluster=cluster) as engine:

            def callback_style(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
                on_complete()

            with pytest.raises(TypeError, match="callback-style"):
                engine.push_async(callback_style, ae.remote())

    async def test_environment_variable(
        self, cluster: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("AIOENGINE_CLUSTER", cluster.scheduler_address)
        async with ae.Engine() as engine:
            assert await engine.submit(add, 1, 2, ctx=ae.remote()) == 3

    async def test_local_cluster_of_its_own(self) -> None:
        async with ae.Engine(cluster="local") as engine:
            x = engine.new_var("x", value=1)
            engine.submit(inc, x, out=x, ctx=ae.remote())
            assert await x.get() == 2
            remote = engine._core.remote
            assert isinstance(remote, RemoteBackend)
            own = remote._link.own_cluster
        assert own.status.name == "closed"

    async def test_user_client_is_used_and_not_closed(self, cluster: Any) -> None:
        async with distributed.Client(cluster, asynchronous=True, set_as_default=False) as client:
            async with ae.Engine(cluster=client) as engine:
                x = engine.new_var("x", value=10)
                engine.submit(inc, x, out=x, ctx=ae.remote())
                assert await x.get() == 11
            await no_keys_left(cluster, engine)
            assert client.status == "running"
            assert await client.submit(inc, 1) == 2


class TestSideEffectOperations:
    async def test_push_sync_and_push_async_run_on_a_worker(self, cluster: Any) -> None:
        async def coro(rctx: ae.RunContext) -> str:
            await asyncio.sleep(0)
            return f"async on {rctx.ctx!r}"

        async with ae.Engine(cluster=cluster) as engine:
            where = await engine.push_sync(
                lambda rctx: (rctx.ctx, threading.current_thread().name), ae.remote(retries=1)
            )
            assert where[0] == ae.remote(retries=1)
            assert not where[1].startswith("aioengine")  # a worker's thread, not the engine's
            assert await engine.push_async(coro, ae.remote()) == "async on remote()"

    async def test_closure_that_cannot_be_pickled_fails_the_operation(self, cluster: Any) -> None:
        lock = threading.Lock()
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x")
            with pytest.raises(TypeError, match="serialize"):
                await engine.push_sync(lambda rctx: lock.locked(), ae.remote(), [], [x])
            with pytest.raises(TypeError):
                await engine.wait_for_var(x)

    async def test_holds_its_vars_until_the_task_finished(self, cluster: Any, gate: str) -> None:
        trace = _LOGS[gate]
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x")
            first = engine.push_sync(
                functools.partial(wait_then_log, gate, "remote"), ae.remote(), [], [x]
            )
            local = engine.push_sync(lambda rctx: trace.append("local"), ae.cpu(), [x], [])
            while not trace:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)  # the local reader had every chance to run too early
            assert local.state is ae.OpState.PENDING
            _GATES[gate].set()
            await local
            assert first.state is ae.OpState.DONE
            assert trace == ["remote:start", "remote:end", "local"]

    async def test_failure_is_unchanged_recorded_and_skips_dependents(self, cluster: Any) -> None:
        def boom(rctx: ae.RunContext) -> None:
            raise ValueError("on the worker")

        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x")
            bad = engine.push_sync(boom, ae.remote(), [], [x])
            after = engine.push_sync(lambda rctx: 1, ae.remote(), [x], [])
            with pytest.raises(ValueError, match=r"^on the worker$"):
                await bad
            with pytest.raises(ae.DependencyError) as info:
                await after
            assert isinstance(info.value.__cause__, ValueError)
            with pytest.raises(ValueError, match=r"^on the worker$"):
                await engine.wait_for_var(x)

    async def test_cancel_before_the_task_started(self, cluster: Any, gate: str) -> None:
        """The worker's two threads are busy: a cancelled operation's Dask task never runs."""
        ran = _LOGS[gate]
        busy = functools.partial(wait_gate, gate)
        async with ae.Engine(cluster=cluster) as engine:
            a, b, x = engine.new_var("a"), engine.new_var("b"), engine.new_var("x")
            blockers = [
                engine.push_sync(busy, ae.remote(), [], [a]),
                engine.push_sync(busy, ae.remote(), [], [b]),
            ]
            victim = engine.push_sync(functools.partial(log, gate, "victim"), ae.remote(), [], [x])
            while victim.state is not ae.OpState.RUNNING:
                await asyncio.sleep(0.005)
            key = engine._core.remote.key_of(victim)  # type: ignore[union-attr]
            while key not in cluster.scheduler.tasks:
                await asyncio.sleep(0.005)
            assert victim.cancel()
            with pytest.raises(asyncio.CancelledError):
                await victim
            # Dask sends cancellations in batches: once the worker has dropped the task, a
            # free thread cannot start it any more.
            (worker,) = cluster.workers.values()
            while key in cluster.scheduler.tasks or key in worker.state.tasks:
                await asyncio.sleep(0.005)
            _GATES[gate].set()
            await asyncio.gather(*blockers)
            after = engine.push_sync(functools.partial(log, gate, "after"), ae.remote(), [], [x])
            await after
            assert ran == ["after"]


class TestValueOperations:
    async def test_chain_reaches_the_scheduler_at_once(self, cluster: Any, gate: str) -> None:
        """Value operations release their Vars when submitted: the whole chain is RUNNING
        (submitted to Dask) while its first operation still blocks on the worker."""
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=0)
            first = engine.submit(slow_inc, gate, x, out=x, ctx=ae.remote())
            chain = [engine.submit(inc, x, out=x, ctx=ae.remote()) for _ in range(20)]
            while any(op.state is not ae.OpState.RUNNING for op in chain):
                await asyncio.sleep(0.005)
            assert first.state is ae.OpState.RUNNING
            _GATES[gate].set()
            assert await x.get() == 21
            assert await chain[-1] is None  # with out=, the value stays on the cluster
            assert await engine.submit(add, x, 100, ctx=ae.remote()) == 121

    async def test_versions_keep_readers_consistent(self, cluster: Any, gate: str) -> None:
        """A reader submitted before a writer sees the old version, even if it runs later."""
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=[0])
            engine.submit(lambda v: [v[0] + 1], x, out=x, ctx=ae.remote())
            seen = engine.new_var("seen")
            engine.submit(slow_copy, gate, x, out=seen, ctx=ae.remote())
            for _ in range(5):
                engine.submit(lambda v: [v[0] + 10], x, out=x, ctx=ae.remote())
            await asyncio.sleep(0.02)
            _GATES[gate].set()
            assert await seen.get() == [1]
            assert await x.get() == [51]

    async def test_local_and_remote_in_both_directions(self, cluster: Any) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=1)
            for i in range(12):
                ctx = ae.remote() if i % 3 else ae.cpu()
                engine.submit(lambda v, i=i: v * 2 + i, x, out=x, ctx=ctx)
            expected = 1
            for i in range(12):
                expected = expected * 2 + i
            assert await x.get() == expected
            # A local writer after remote ones; a remote reader after it.
            engine.submit(inc, x, out=x, ctx=ae.remote())
            engine.submit(lambda v: v - 1, x, out=x)
            y = engine.new_var("y")
            engine.submit(add, x, 5, out=y, ctx=ae.remote())
            assert await y.get() == expected + 5

    async def test_a_bulk_segment_reads_gathered_values(self, cluster: Any) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=1)
            y = engine.new_var("y", value=0)
            engine.submit(inc, x, out=x, ctx=ae.remote())
            with engine.bulk(4):
                for _ in range(3):
                    engine.submit(add, x, y, out=y, prop=ae.FnProperty.ASYNC)
            assert await y.get() == 6

    async def test_multiple_outs_and_keyword_vars(self, cluster: Any) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            a, b = engine.new_var("a"), engine.new_var("b")
            n = engine.new_var("n", value=7)
            engine.submit(lambda k: (k, k * 2), k=n, out=(a, b), ctx=ae.remote())
            assert (await a.get(), await b.get()) == (7, 14)
            bad = engine.submit(lambda: (1, 2, 3), out=(a, b), ctx=ae.remote())
            with pytest.raises(ValueError, match=r"3 value\(s\) for out= of 2"):
                await bad
            with pytest.raises(ValueError):
                await engine.wait_for_var(a)

    async def test_coroutine_function_runs_on_the_worker_loop(self, cluster: Any) -> None:
        async def double(v: int) -> int:
            await asyncio.sleep(0)
            return v * 2

        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=4)
            engine.submit(double, x, out=x, ctx=ae.remote())
            assert await x.get() == 8

    async def test_one_transfer_per_version(
        self, cluster: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        gathers: list[object] = []
        scatters: list[object] = []
        original_gather = RemoteBackend._gather
        original_arg = RemoteBackend._remote_arg

        async def counting_gather(self: RemoteBackend, version: Any) -> None:
            gathers.append(version)
            await original_gather(self, version)

        monkeypatch.setattr(RemoteBackend, "_gather", counting_gather)
        async with distributed.Client(cluster, asynchronous=True, set_as_default=False) as client:
            real_scatter = client.scatter

            def counting_scatter(*args: Any, **kwargs: Any) -> Any:
                scatters.append(args)
                return real_scatter(*args, **kwargs)

            monkeypatch.setattr(client, "scatter", counting_scatter)
            async with ae.Engine(cluster=client) as engine:
                x = engine.new_var("x", value=5)
                outs = [engine.new_var(f"o{i}") for i in range(4)]
                for o in outs:  # four remote readers of one local version: one scatter
                    engine.submit(inc, x, out=o, ctx=ae.remote())
                assert [await o.get() for o in outs] == [6] * 4
                assert len(scatters) == 1
                engine.submit(inc, x, out=x, ctx=ae.remote())
                local = [engine.submit(lambda v: v, x) for _ in range(4)]
                assert await asyncio.gather(*local) == [6] * 4
                assert await x.get() == 6
                gathered = len(gathers)
                assert gathered == 5  # four o's and x: one per version
                # Gathered: it is local now, and its future is remembered (no new scatter).
                assert await engine.submit(inc, x, ctx=ae.remote()) == 7
                assert len(scatters) == 1
        assert original_arg is RemoteBackend._remote_arg

    async def test_failure_through_value_operations(self, cluster: Any) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=1)
            y = engine.new_var("y")
            engine.submit(inc, x, out=x, ctx=ae.remote())
            bad = engine.submit(fail, x, out=x, ctx=ae.remote())
            remote_after = engine.submit(inc, x, out=y, ctx=ae.remote())
            local_after = engine.submit(inc, x)
            with pytest.raises(KeyError, match="bad 2"):
                await bad
            for op in (remote_after, local_after):
                with pytest.raises(ae.DependencyError, match="'x' carries a failure") as info:
                    await op
                assert isinstance(info.value.__cause__, KeyError)
            # The skipped writer's out shares the failure (one record, thrown once).
            with pytest.raises(KeyError):
                await engine.wait_for_var(y)
            await engine.wait_for_var(x)
            assert await x.get() == 2  # the failed write left the value as it was

    async def test_cancel_while_waiting_for_vars(self, cluster: Any, gate: str) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=1)
            blocker = engine.push_sync(functools.partial(wait_gate, gate), ae.remote(), [], [x])
            victim = engine.submit(inc, x, out=x, ctx=ae.remote())
            assert victim.cancel()
            _GATES[gate].set()
            await blocker
            with pytest.raises(asyncio.CancelledError):
                await victim
            assert await x.get() == 1
            assert not any("inc" in str(k) for k in cluster.scheduler.tasks)

    async def test_delete_var_and_aclose_leave_no_key(self, cluster: Any) -> None:
        engine = ae.Engine(cluster=cluster)
        async with engine:
            x = engine.new_var("x", value=1)
            y = engine.new_var("y", value=2)
            for _ in range(3):
                engine.submit(add, x, y, out=x, ctx=ae.remote())
            engine.submit(inc, y, out=y, ctx=ae.remote())
            await engine.wait_for_all()
            assert engine_keys(cluster, engine)
            await engine.delete_var(x)
            for _ in range(200):
                keys = engine_keys(cluster, engine)
                if not any(k.startswith(("add", "x-")) for k in keys):
                    break
                await asyncio.sleep(0.01)
            assert [k for k in engine_keys(cluster, engine) if k.startswith(("add", "x-"))] == []
            assert engine_keys(cluster, engine)  # y's are still there
        await no_keys_left(cluster, engine)

    async def test_priority_becomes_dask_priority(self, cluster: Any, gate: str) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=1)
            engine.push_sync(functools.partial(wait_gate, gate), ae.remote(), [], [])
            engine.push_sync(functools.partial(wait_gate, gate), ae.remote(), [], [])
            op = engine.submit(inc, x, out=x, ctx=ae.remote(), priority=7)
            remote = engine._core.remote
            assert isinstance(remote, RemoteBackend)
            while op.state is not ae.OpState.RUNNING:
                await asyncio.sleep(0.005)
            key = remote.key_of(op)
            while key not in cluster.scheduler.tasks:
                await asyncio.sleep(0.005)
            assert cluster.scheduler.tasks[key].priority[0] == -7
            text = str(engine.dump())
            assert repr(key) in text
            # Its reader gets a future as argument: sent in a graph, with its own priority.
            after = engine.submit(inc, x, out=x, ctx=ae.remote(), priority=5)
            after_key = remote.key_of(after)
            while after_key not in cluster.scheduler.tasks:
                await asyncio.sleep(0.005)
            assert cluster.scheduler.tasks[after_key].priority[0] == -5
            assert repr(after_key) in str(engine.dump())
            _GATES[gate].set()
            assert await x.get() == 3


def _tasks_but_comms() -> int:
    """The loop's tasks, but distributed's handlers of its connections (``Server._handle_comm``
    and tornado's own): they come and go with the cluster's messages (6 more in one CI run)."""
    count = 0
    for task in asyncio.all_tasks():
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None)
        filename = code.co_filename if code is not None else ""
        if getattr(coro, "__qualname__", "") != "Server._handle_comm" and (
            f"{os.sep}tornado{os.sep}" not in filename
        ):
            count += 1
    return count


class TestBatches:
    """Value operations started in one loop iteration reach Dask as one graph."""

    async def test_a_long_chain_pushed_at_once_is_sent_without_recursion(
        self, cluster: Any
    ) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=0)
            await engine.submit(inc, x, ctx=ae.remote())  # connected
            gate = asyncio.Event()

            async def hold(rctx: ae.RunContext) -> None:
                await gate.wait()

            engine.push_async(hold, ae.cpu(), [], [x])
            # 250 links, all waiting for the local writer; each submission releases the next:
            # deeper than the recursion limit, were each started inside the last.
            ops = [engine.submit(inc, x, out=x, ctx=ae.remote()) for _ in range(250)]
            gate.set()
            while ops[-1].task is not None or ops[-1].state < ae.OpState.RUNNING:
                await asyncio.sleep(0.001)
            # All left the engine together, in one cascade.
            assert all(op.task is None for op in ops)
            assert await x.get() == 250
            await no_keys_left_but_versions(cluster, engine, 1)

    async def test_an_unpicklable_function_fails_only_its_operation_and_dependents(
        self, cluster: Any
    ) -> None:
        lock = threading.Lock()
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=1)
            y = engine.new_var("y", value=1)
            await engine.submit(inc, x, ctx=ae.remote())  # connected
            before = engine.submit(inc, x, out=x, ctx=ae.remote())
            bad = engine.submit(lambda v: lock.locked() or v, x, out=x, ctx=ae.remote())
            after = engine.submit(inc, x, out=x, ctx=ae.remote())
            other = engine.submit(inc, y, out=y, ctx=ae.remote())
            await before
            with pytest.raises(TypeError, match="serialize"):
                await bad
            with pytest.raises(ae.DependencyError, match="'x' carries a failure"):
                await after
            await other
            with pytest.raises(TypeError):
                await engine.wait_for_var(x)
            assert await x.get() == 2  # the failed write left the value as it was
            assert await y.get() == 2

    async def test_without_dask_internals_each_operation_is_sent_by_client_submit(
        self, cluster: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A Dask without the graph API the batches use: the engine falls back to one
        # client.submit per value operation, with the same results and the same rule.
        monkeypatch.setattr(dask_api, "batch_api", lambda: None)

        def no_graph(*args: Any) -> None:
            raise AssertionError("a graph was sent without the graph API")

        monkeypatch.setattr(RemoteBackend, "_send", no_graph)
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=1)
            y = engine.new_var("y", value=10)
            remote = ae.remote()
            for _ in range(20):
                engine.submit(inc, x, out=x, ctx=remote)
            total = engine.submit(operator.add, x, y, out=y, ctx=remote)
            engine.push_sync(lambda rctx: None, ae.cpu(), [x], [])  # a local reader between
            engine.submit(inc, y, out=y, ctx=remote)
            await total
            assert await x.get() == 21
            assert await y.get() == 32
            await no_keys_left_but_versions(cluster, engine, 2)

    async def test_a_collected_operation_has_no_task_of_its_own(
        self, cluster: Any, gate: str
    ) -> None:
        # The common path: a value operation sent in a graph is completed by its future's
        # state telling its record, not by an asyncio task per operation; the results, the
        # skips after a failure and the order are those of the rule.
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=0)
            ys = [engine.new_var(f"y{i}") for i in range(40)]
            await engine.submit(inc, x, ctx=ae.remote())  # connected, x scattered
            tasks = _tasks_but_comms()
            first = engine.submit(slow_inc, gate, x, out=x, ctx=ae.remote())
            readers = [engine.submit(add, x, i, out=y, ctx=ae.remote()) for i, y in enumerate(ys)]
            bad = engine.submit(fail, x, out=x, ctx=ae.remote())
            skipped = engine.submit(inc, x, out=x, ctx=ae.remote())
            while skipped.state < ae.OpState.RUNNING:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)  # sent, and pending on the cluster
            assert _tasks_but_comms() - tasks < 5  # not one per operation
            _GATES[gate].set()
            await first
            assert [await y.get() for y in ys] == [1 + i for i in range(40)]
            assert all(op.state is ae.OpState.DONE for op in readers)
            with pytest.raises(KeyError, match="bad 1"):
                await bad
            with pytest.raises(ae.DependencyError, match="'x' carries a failure"):
                await skipped
            with pytest.raises(KeyError):
                await engine.wait_for_var(x)
            assert await x.get() == 1
            await no_keys_left_but_versions(cluster, engine, 41)

    async def test_without_watched_future_states_a_task_awaits_each_operation(
        self, cluster: Any, monkeypatch: pytest.MonkeyPatch, gate: str
    ) -> None:
        # A Dask whose future states cannot be watched: each collected operation is awaited
        # by a task instead, with the same results, skips and withdrawals.
        monkeypatch.setattr(dask_api, "_watched_state", False)
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=1)
            y = engine.new_var("y", value=10)
            await engine.submit(inc, x, ctx=ae.remote())  # connected
            remote = ae.remote()
            for _ in range(10):
                engine.submit(inc, x, out=x, ctx=remote)
            total = engine.submit(operator.add, x, y, out=y, ctx=remote)
            bad = engine.submit(fail, y, out=y, ctx=remote)
            skipped = engine.submit(inc, y, out=y, ctx=remote)
            held = engine.submit(slow_inc, gate, x, out=x, ctx=remote)
            withdrawn = engine.submit(inc, x, out=x, ctx=remote)
            while withdrawn.state < ae.OpState.RUNNING:
                await asyncio.sleep(0.005)
            assert withdrawn.cancel("not wanted")
            _GATES[gate].set()
            await total
            with pytest.raises(KeyError):
                await bad
            with pytest.raises(ae.DependencyError):
                await skipped
            with pytest.raises(asyncio.CancelledError):
                await withdrawn
            await held
            assert await x.get() == 12
            with pytest.raises(KeyError):
                await engine.wait_for_var(y)
            assert await y.get() == 21

    @pytest.mark.parametrize("module", ["dask._expr", "dask._task_spec", "distributed.spans"])
    def test_the_graph_api_is_missing_when_a_module_of_it_is(
        self, module: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        assert dask_api.batch_api() is not None  # this Dask has it
        monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ImportError
        assert dask_api.batch_api() is None

    def test_every_private_dask_name_the_engine_uses_is_there(self) -> None:
        """A Dask upgrade that moves one of them fails here, by name (dask_api.py is the
        one file to read then)."""
        assert dask_api.missing() == []


async def no_keys_left_but_versions(cluster: Any, engine: ae.Engine, n: int) -> None:
    """Wait (bounded) until only the ``n`` keys of the Vars' current versions are left."""
    for _ in range(200):
        if len(engine_keys(cluster, engine)) <= n:
            return
        await asyncio.sleep(0.01)
    assert len(engine_keys(cluster, engine)) <= n


# Commute members add into a total of the test's, non-atomically (read, sleep, write), so two
# that overlapped would lose an addition; their starts and ends go to the test's log.
_TOTALS: dict[str, int] = {}


def add_into(name: str, k: int, rctx: ae.RunContext) -> None:
    log(name, "start")
    total = _TOTALS.get(name, 0)
    time.sleep(0.002)
    _TOTALS[name] = total + k
    log(name, "end")


def total_of(name: str, rctx: ae.RunContext) -> int:
    return _TOTALS.get(name, 0)


def as_list(x: int) -> list[int]:
    return [x]


class TestAccessModes:
    """On a remote context commute and concurrent accesses run as writes (push order is one
    of the orders they allow); mixed with local ones on the same Vars, the rule holds."""

    async def test_commute_members_remote_and_local_run_one_at_a_time(
        self, cluster: Any, gate: str
    ) -> None:
        trace = _LOGS[gate]
        async with ae.Engine(cluster=cluster, cpu_workers=2) as engine:
            acc = engine.new_var("acc")
            members = [
                engine.push_sync(
                    functools.partial(add_into, gate, k),
                    ae.remote() if k % 2 else ae.cpu(),
                    commute_vars=[acc],
                )
                for k in range(1, 9)
            ]
            # A write after the group (remote, then local) sees every addition.
            seen_remote = engine.push_sync(
                functools.partial(total_of, gate), ae.remote(), [], [acc]
            )
            seen_local = engine.push_sync(functools.partial(total_of, gate), ae.cpu(), [acc], [])
            assert await seen_remote == sum(range(1, 9))
            assert await seen_local == sum(range(1, 9))
            assert all(m.state is ae.OpState.DONE for m in members)
            assert trace == ["start", "end"] * 8  # never two members at once
        _TOTALS.pop(gate, None)

    async def test_concurrent_members_remote_and_local_then_a_write(
        self, cluster: Any, gate: str
    ) -> None:
        trace = _LOGS[gate]
        _GATES[gate].set()
        async with ae.Engine(cluster=cluster, cpu_workers=2) as engine:
            log_var = engine.new_var("log")
            for k in range(6):
                engine.push_sync(
                    functools.partial(wait_then_log, gate, f"c{k}"),
                    ae.remote() if k % 2 else ae.cpu(),
                    concurrent_vars=[log_var],
                )
            after = engine.push_sync(
                functools.partial(log, gate, "write"), ae.remote(), mutate_vars=[log_var]
            )
            await after
            assert sorted(trace[:-1]) == sorted(
                f"c{k}:{e}" for k in range(6) for e in ("start", "end")
            )
            assert trace[-1] == "write"
            await engine.wait_for_var(log_var)

    async def test_accumulate_from_remote_and_local_calls(self, cluster: Any) -> None:
        async with ae.Engine(cluster=cluster, cpu_workers=2) as engine:
            acc = engine.new_var("acc", value=0)
            xs = [engine.new_var(f"x{i}") for i in range(10)]
            for i, x in enumerate(xs):  # inputs written remotely and locally, in any order
                engine.submit(inc, i, out=x, ctx=ae.remote() if i % 3 else ae.cpu())
            for i, x in enumerate(xs):
                engine.submit(inc, x, accumulate=acc, ctx=ae.remote() if i % 2 else ae.cpu())
            # A remote write after the group reads every addition (the sequential sum).
            engine.submit(add, acc, 1000, out=acc, ctx=ae.remote())
            for i in range(5):  # and a second group on top of a remote version
                engine.submit(inc, i, accumulate=acc, ctx=ae.cpu() if i % 2 else ae.remote())
            assert await acc.get() == sum(i + 2 for i in range(10)) + 1000 + sum(
                i + 1 for i in range(5)
            )

    async def test_ordered_accumulate_from_remote_and_local_calls(self, cluster: Any) -> None:
        async with ae.Engine(cluster=cluster, cpu_workers=2) as engine:
            acc = engine.new_var("acc", value=[])
            for i in range(8):
                engine.submit(
                    as_list, i, accumulate=acc, ordered=True, ctx=ae.remote() if i % 2 else ae.cpu()
                )
            assert await acc.get() == list(range(8))


class TestEngineFeatures:
    async def test_max_pending_counts_remote_operations(self, cluster: Any, gate: str) -> None:
        busy = functools.partial(wait_gate, gate)
        async with ae.Engine(cluster=cluster, max_pending=2) as engine:
            ops = [engine.push_sync(busy, ae.remote()) for _ in range(2)]
            waiting = asyncio.ensure_future(engine.push_sync_wait(lambda rctx: 3, ae.remote()))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            assert engine.pending == 2
            _GATES[gate].set()
            assert await (await waiting) == 3
            await asyncio.gather(*ops)

    async def test_serial_mode_sends_one_at_a_time_in_push_order(
        self, cluster: Any, gate: str
    ) -> None:
        trace = _LOGS[gate]
        _GATES[gate].set()
        async with ae.Engine(cluster=cluster, serial=True) as engine:
            x = engine.new_var("x", value=0)
            for i in range(4):
                # No Vars in common: ordered by serial mode alone.
                engine.push_sync(functools.partial(wait_then_log, gate, f"e{i}"), ae.remote())
                engine.submit(logged_inc, gate, f"v{i}", x, out=x, ctx=ae.remote())
            await engine.wait_for_all()
            assert trace == [s for i in range(4) for s in (f"e{i}:start", f"e{i}:end", f"v{i}")]
            assert await x.get() == 4

    async def test_statistics_and_trace(self, cluster: Any) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=0)
            with engine.trace() as session:
                for _ in range(3):
                    engine.submit(inc, x, out=x, ctx=ae.remote())
                engine.push_sync(lambda rctx: None, ae.remote())
                await engine.wait_for_all()
            stats = engine.statistics()
            assert stats.pools["remote"].done == 4
            events = session.trace["traceEvents"]
            names = {e.get("args", {}).get("name") for e in events if e.get("ph") == "M"}
            (worker,) = cluster.scheduler.workers  # the fixture's one worker
            assert any(n and n.startswith(f"worker {worker} #") for n in names)


def worker_address(*_: Any) -> str:
    """The address of the Dask worker running this (a value or side-effect operation)."""
    return str(distributed.get_worker().address)


class TestTraceLanes:
    async def test_each_remote_op_shows_on_a_lane_of_the_worker_that_ran_it(self) -> None:
        asyncio.get_running_loop().set_debug(False)
        async with (
            distributed.LocalCluster(
                processes=False,
                n_workers=2,
                threads_per_worker=1,
                dashboard_address=":0",
                asynchronous=True,
            ) as c,
            ae.Engine(cluster=c) as engine,
        ):
            workers = sorted(c.scheduler.workers)
            x = engine.new_var("x", value=0)
            with engine.trace() as session:
                ops = []
                for i in range(12):
                    ctx = ae.remote(workers=[workers[i % 2]]) if i < 4 else ae.remote()
                    if i % 3:
                        ops.append(engine.submit(worker_address, x, ctx=ctx))
                    else:
                        ops.append(engine.push_sync(worker_address, ctx, [x], []))
                ran = [await op for op in ops]
                y = engine.new_var("y")
                bad = engine.submit(fail, 1, out=y, ctx=ae.remote())
                with pytest.raises(KeyError):
                    await bad
                with pytest.raises(KeyError):
                    await engine.wait_for_var(y)  # thrown: handled
            assert set(ran[:4]) == set(workers)
            events = session.trace["traceEvents"]
            lanes = {
                e["tid"]: e["args"]["name"]
                for e in events
                if e.get("ph") == "M" and e["name"] == "thread_name"
            }
            slices = {e["args"]["seq"]: lanes[e["tid"]] for e in events if e.get("cat") == "op"}
            for op, address in zip(ops, ran, strict=True):
                assert slices[op.seq].startswith(f"worker {address} #")
            assert slices[bad.seq].startswith("remote ops #")  # failed: no worker holds it
            assert {lanes[t].rsplit(" #", 1)[0] for t in lanes} >= {f"worker {w}" for w in workers}


class TestBlocking:
    def test_blocking_client_blocking_engine_and_op_decorator(self) -> None:
        with (
            distributed.LocalCluster(
                processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0"
            ) as c,
            distributed.Client(c, set_as_default=False) as client,
        ):
            with ae.BlockingEngine(cluster=client) as engine:
                x = engine.new_var("x", value=1)

                @engine.op(out=x, ctx=ae.remote())
                def double(v: int) -> int:
                    return v * 2

                for _ in range(3):
                    double(x)
                assert engine.get(x) == 8
                assert engine.push_sync(lambda rctx: 5, ae.remote()).result(10) == 5
            assert client.status == "running"


def visited(*chunks: list[str] | None) -> list[str]:
    """A halo step that records where it ran: the middle chunk's workers, and this one."""
    middle = chunks[len(chunks) // 2] if chunks else None
    return [*(middle or []), worker_address()]


def on_resource(x: int, _: object) -> tuple[int, str]:
    return x + 1, worker_address()


class _Graphs(distributed.SchedulerPlugin):  # type: ignore[misc,name-defined]
    """Counts the graphs a scheduler receives (one ``update_graph`` per message)."""

    def __init__(self) -> None:
        self.graphs = 0

    def update_graph(self, scheduler: Any, **kwargs: Any) -> None:
        self.graphs += 1


class TestPlacement:
    async def test_halo_steps_run_one_chunk_per_worker_and_stay_with_their_chunk(self) -> None:
        """Each step reads three equal chunks, so Dask alone ties among three workers and
        crowds some (a step then waits for another on the same thread): the engine places
        each chunk's steps on one worker, the chunks on different workers."""
        import dask

        w = 4
        with dask.config.set({"distributed.scheduler.work-stealing": False}):
            async with in_process_cluster(w, 1) as cluster, ae.Engine(cluster=cluster) as engine:
                a = [engine.new_var(f"a{i}") for i in range(w)]
                b = [engine.new_var(f"b{i}") for i in range(w)]
                for i in range(w):
                    engine.submit(visited, out=a[i], ctx=ae.remote())
                await engine.wait_for_all()
                for step in range(6):
                    src, dst = (a, b) if step % 2 == 0 else (b, a)
                    for i in range(w):
                        left = src[i - 1] if i > 0 else None
                        right = src[i + 1] if i + 1 < w else None
                        engine.submit(visited, left, src[i], right, out=dst[i], ctx=ae.remote())
                paths = [await v.get() for v in a]
        assert all(len(path) == 7 and len(set(path)) == 1 for path in paths), paths
        assert len({path[0] for path in paths}) == w

    async def test_a_resource_restriction_is_kept_wherever_the_data_is(self) -> None:
        """Placement prefers the worker holding the data, but never drops ``resources=``:
        an operation that needs a resource runs on a worker that has it, wherever its input
        was placed (a preference with resources would let Dask ignore them)."""
        async with (
            in_process_cluster(1, 1) as cluster,
            distributed.Worker(cluster.scheduler_address, nthreads=1, resources={"R": 1}) as gpu,
            ae.Engine(cluster=cluster) as engine,
        ):
            await until(lambda: len(cluster.scheduler.workers) >= 2)
            xs = [engine.new_var(f"x{i}") for i in range(2)]
            for x in xs:  # two at once: placed on the two workers
                engine.submit(worker_address, out=x, ctx=ae.remote())
            await engine.wait_for_all()
            ys = [engine.new_var(f"y{i}") for i in range(2)]
            for x, y in zip(xs, ys, strict=True):
                engine.submit(on_resource, 1, x, out=y, ctx=ae.remote(resources={"R": 1}))
            got = [await asyncio.wait_for(y.get(), 20) for y in ys]
            assert len({await x.get() for x in xs}) == 2
            assert [where for _, where in got] == [gpu.address, gpu.address]

    async def test_the_choice_follows_the_data_and_leaves_unknown_data_to_dask(self) -> None:
        """The rule itself (:class:`Placement`), on versions of its own."""

        class Version:  # what the backend passes: a weakly referable version
            pass

        async def workers() -> list[str]:
            return ["w0", "w1", "w2"]

        placement = Placement(asyncio.get_running_loop(), workers)
        await placement.known()
        made = [Version() for _ in range(3)]
        for version in made:  # reading nothing: the least busy worker, in turn
            where = placement.choose([], [None])
            assert where is not None
            placement.home(version, where)
        assert [placement.choose([], [None]) for _ in range(3)] == ["w0", "w1", "w2"]
        # A step over (0, 1, 2) that overwrites 1 stays with 1; one that writes a new Var
        # goes to its least busy input.
        assert placement.choose(made, made[1:2]) == "w1"
        placement.settled("w0")
        assert placement.choose(made, [None]) == "w0"
        # A value without a home (sent by this process, or placed by Dask): Dask decides.
        assert placement.choose([made[0], None], [made[0]]) is None
        assert placement.choose([Version()], [None]) is None
        # A home whose worker left is no home.
        placement._workers, placement._present = ("w1",), frozenset({"w1"})
        assert placement.choose([made[0]], [None]) is None
        assert placement.choose([], [made[0]]) == "w1"
        await placement.aclose()

    async def test_operations_pushed_one_at_a_time_go_round_the_workers(self) -> None:
        async def workers() -> list[str]:
            return ["w0", "w1", "w2"]

        placement = Placement(asyncio.get_running_loop(), workers)
        await placement.known()
        chosen = []
        for _ in range(6):  # each settled before the next: no worker is busier
            where = placement.choose([], [None])
            assert where is not None
            chosen.append(where)
            placement.settled(where)
        assert chosen == ["w0", "w1", "w2", "w0", "w1", "w2"]
        await placement.aclose()

    def test_a_placement_outside_the_running_loop_asks_on_the_engines_loop(self) -> None:
        """A push on the loop's thread before the loop runs (run_until_complete between
        calls) places too: the question to the scheduler is a task of the engine's loop."""
        loop = asyncio.new_event_loop()
        asked = []

        async def workers() -> list[str]:
            asked.append(True)
            return ["w0"]

        try:
            placement = Placement(loop, workers)
            assert placement.choose([], [None]) is None  # no worker known yet, no error
            loop.run_until_complete(placement.known())
            assert asked
            assert placement.choose([], [None]) == "w0"
            loop.run_until_complete(placement.aclose())
        finally:
            loop.close()

    async def test_operations_on_different_workers_are_sent_as_one_graph(
        self, cluster: Any
    ) -> None:
        plugin = _Graphs()
        cluster.scheduler.add_plugin(plugin, name="graphs")
        elsewhere = [f"tcp://192.0.2.{i}:1" for i in range(1, 4)]
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=1)
            await engine.submit(inc, x, out=x, ctx=ae.remote())  # connected, x sent
            before = plugin.graphs
            ops = [
                engine.submit(inc, x, out=x, ctx=ae.remote(workers=where, allow_other_workers=True))
                for where in [*elsewhere, *elsewhere]
            ]
            await asyncio.wait_for(asyncio.gather(*ops), 20)
            assert plugin.graphs == before + 1
            assert await x.get() == 8

    async def test_a_preferred_worker_that_is_not_there_does_not_strand_the_work(
        self, cluster: Any
    ) -> None:
        # workers= alone would wait for the worker for ever; allow_other_workers=True makes
        # it a preference, for side-effect and value operations (sent in one graph) alike.
        where = ae.remote(workers="tcp://192.0.2.1:1", allow_other_workers=True)
        async with ae.Engine(cluster=cluster) as engine:
            x = engine.new_var("x", value=1)
            for _ in range(3):
                engine.submit(inc, x, out=x, ctx=where)
            assert await asyncio.wait_for(engine.push_sync(lambda rctx: 7, where), 20) == 7
            assert await asyncio.wait_for(x.get(), 20) == 4


class TestTLS:
    async def test_over_tls(self) -> None:
        pytest.importorskip("cryptography")
        security = distributed.security.Security.temporary()
        async with distributed.LocalCluster(
            processes=False,
            n_workers=1,
            dashboard_address=":0",
            asynchronous=True,
            protocol="tls://",
            security=security,
        ) as c:
            assert c.scheduler_address.startswith("tls://")
            async with ae.Engine(cluster=c.scheduler_address, security=security) as engine:
                x = engine.new_var("x", value=20)
                engine.submit(inc, x, out=x, ctx=ae.remote())
                assert await x.get() == 21


@pytest.fixture(scope="module")
def process_cluster() -> Iterator[Any]:
    """A worker process (real pickling); a task whose worker dies fails at once."""
    import dask

    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        distributed.LocalCluster(
            processes=True, n_workers=1, threads_per_worker=1, dashboard_address=":0"
        ) as c,
    ):
        yield c


def where(x: int) -> tuple[int, int]:
    """A function of this module, pickled by reference to the worker processes."""
    return os.getpid(), x + 1


def die(rctx: ae.RunContext) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class TestProcesses:
    """Sync tests (run once, not once per loop): worker processes are slow to start."""

    def test_functions_of_this_module_are_pickled(self, process_cluster: Any) -> None:
        with ae.BlockingEngine(cluster=process_cluster.scheduler_address) as engine:
            x = engine.new_var("x", value=1)
            pid, value = engine.submit(where, x, ctx=ae.remote()).result(30)
            assert pid != os.getpid()
            assert value == 2

    def test_a_dead_worker_fails_the_operation(self, process_cluster: Any) -> None:
        with ae.BlockingEngine(cluster=process_cluster.scheduler_address) as engine:
            x = engine.new_var("x")
            op = engine.push_sync(die, ae.remote(), [], [x])
            with pytest.raises(Exception, match=r"KilledWorker|died|worker") as info:
                op.result(30)
            with pytest.raises(type(info.value)):
                engine.wait_for_var(x)


def unpicklable(x: int) -> Any:
    """A result that cannot be sent back from a worker process."""
    return threading.Lock()


def die_once(marker: str, x: int) -> int:
    """Kill the worker process the first time (``marker`` does not exist yet)."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)
    return x + 1


class TestProcessesFaults:
    def test_a_worker_dying_with_a_value_sent_from_here(
        self, process_cluster: Any, tmp_path: Any
    ) -> None:
        """The worker held the only copy of x's value: the next operation sends it again
        (it used to fail for ever with a FutureCancelledError that named nothing)."""
        with ae.BlockingEngine(cluster=process_cluster.scheduler_address) as engine:
            x = engine.new_var("x", value=5)
            marker = str(tmp_path / "died")
            first = engine.submit(die_once, marker, x, ctx=ae.remote())
            with pytest.raises(Exception, match=r"KilledWorker|died|lost"):
                first.result(60)
            assert engine.submit(die_once, marker, x, ctx=ae.remote()).result(60) == 6
            with pytest.raises(BaseExceptionGroup):
                engine.wait_for_all()  # the first one's failure, thrown once

    def test_the_error_names_the_lost_value_and_its_worker(self, tmp_path: Any) -> None:
        """With retries left, Dask cancels the task whose input died with its worker: the
        error says which value was lost, and on which worker."""
        import dask

        with (
            dask.config.set({"distributed.scheduler.allowed-failures": 3}),
            distributed.LocalCluster(
                processes=True, n_workers=1, threads_per_worker=1, dashboard_address=":0"
            ) as c,
            ae.BlockingEngine(cluster=c.scheduler_address) as engine,
        ):
            x = engine.new_var("x", value=5)
            marker = str(tmp_path / "died")
            first = engine.submit(die_once, marker, x, ctx=ae.remote())
            with pytest.raises(RuntimeError, match=r"'x' \(key .*, on worker tcp://.*died"):
                first.result(60)
            assert engine.submit(die_once, marker, x, ctx=ae.remote()).result(60) == 6
            with pytest.raises(BaseExceptionGroup):
                engine.wait_for_all()

    def test_a_result_that_cannot_be_sent_here_fails_the_read(self, process_cluster: Any) -> None:
        """The version lives on the worker, but a local reader can never have it: the read
        fails at once (it used to retry for ever) and so does wait_for_var; close returns."""
        with ae.BlockingEngine(cluster=process_cluster.scheduler_address) as engine:
            x = engine.new_var("x", value=1)
            engine.submit(unpicklable, x, out=x, ctx=ae.remote()).result(30)
            with pytest.raises(ae.DependencyError, match="could not be gathered"):
                engine.get(x, timeout=30)
            with pytest.raises(RuntimeError, match="could not be gathered"):
                engine.wait_for_var(x, timeout=30)


class TestCommandLineCluster:
    """A ``dask scheduler`` and a ``dask worker`` started from the command line, as a team
    moving to a cluster starts them, on 127.0.0.1."""

    def test_value_and_side_effect_operations(self, tmp_path: Any) -> None:
        with (
            command_line_cluster(str(tmp_path)) as address,
            ae.BlockingEngine(cluster=address) as engine,
        ):
            x = engine.new_var("x", value=1)
            for _ in range(3):
                engine.submit(inc, x, out=x, ctx=ae.remote())
            pid, value = engine.submit(where, x, ctx=ae.remote()).result(30)
            assert pid != os.getpid()
            assert value == 5
            assert engine.get(x, timeout=30) == 4
            assert engine.push_sync(lambda r: "ran", ae.remote(), [], [x]).result(30) == "ran"


# -- random programs against the sequential model -------------------------------------------


def combine(tag: str, fails: bool, *xs: int) -> int:
    """A value operation of the model test: the sum of its inputs plus its number."""
    if fails:
        raise ValueError(tag)
    return sum(xs) + int(tag[2:])


def effect(tag: str, fails: bool, rctx: ae.RunContext) -> str:
    """A side-effect operation of the model test."""
    if fails:
        raise ValueError(tag)
    return tag


@st.composite
def programs(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """Up to 10 operations on 3 Vars: (kind, remote, reads, writes, fails, cancel)."""
    n = draw(st.integers(1, 10))
    ops = []
    for _ in range(n):
        kind = draw(st.sampled_from(["value", "effect"]))
        reads = tuple(sorted(draw(st.sets(st.integers(0, 2), max_size=2))))
        if kind == "value":
            writes: tuple[int, ...] = (draw(st.integers(0, 2)),)
        else:
            writes = tuple(sorted(draw(st.sets(st.integers(0, 2), max_size=2))))
        remote = draw(st.booleans())
        fails = draw(st.integers(0, 5)) == 0
        cancel = draw(st.integers(0, 6)) == 0
        ops.append((kind, remote, reads, writes, fails, cancel))
    return ops


class TestAgainstSequentialModel:
    @settings(
        max_examples=12,
        # One test per event-loop implementation (conftest.py): each example is independent.
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
        ],
    )
    @given(program=programs())
    async def test_random_program_matches_model(
        self, cluster: Any, program: list[tuple[Any, ...]]
    ) -> None:
        async with ae.Engine(cluster=cluster, cpu_workers=2) as engine:
            xs = [engine.new_var(f"v{i}", value=i) for i in range(3)]
            pushed = []
            for k, (kind, remote, reads, writes, fails, cancel) in enumerate(program):
                tag = f"op{k}"
                ctx = ae.remote() if remote else ae.cpu()
                if kind == "value":
                    args = [xs[i] for i in reads]
                    op = engine.submit(combine, tag, fails, *args, out=xs[writes[0]], ctx=ctx)
                else:
                    fn = functools.partial(effect, tag, fails)
                    op = engine.push_sync(fn, ctx, [xs[i] for i in reads], [xs[i] for i in writes])
                cancelled = op.cancel() if cancel else False
                pushed.append((op, cancelled))
            outcomes = []
            for op, _ in pushed:
                try:
                    outcomes.append(("done", await op))
                except asyncio.CancelledError:
                    outcomes.append(("cancelled", None))
                except ae.DependencyError:
                    outcomes.append(("skipped", None))
                except ValueError as exc:
                    outcomes.append(("failed", str(exc)))
            try:
                await engine.wait_for_all()
                thrown: set[str] = set()
            except ExceptionGroup as group:
                thrown = {str(e) for e in group.exceptions}
            values = [await x.get() for x in xs]

        # The sequential model (helpers.py): push order, a failed or skipped operation leaves
        # its Vars' values as they were and records its failure on what it writes.
        model_values = [0, 1, 2]

        def body(k: int, kind: str, remote: bool, reads: Any, writes: Any, fails: bool) -> object:
            if fails:
                raise ValueError(f"op{k}")
            if kind != "value":
                return f"op{k}"
            result = sum(model_values[i] for i in reads) + k
            model_values[writes[0]] = result
            return None if remote else result

        seq = SequentialModel()
        expected = []
        for k, (kind, remote, reads, writes, fails, _) in enumerate(program):
            fn = functools.partial(body, k, kind, remote, reads, writes, fails)
            outcome, detail = seq.push(fn, reads, writes, cancelled=pushed[k][1])
            if outcome is Outcome.FAILED:
                expected.append(("failed", str(detail)))
            elif outcome is Outcome.DONE:
                expected.append(("done", detail))
            else:
                expected.append((outcome.value, None))
        assert outcomes == expected
        assert thrown == {tag for outcome, tag in expected if outcome == "failed"}
        assert values == model_values
