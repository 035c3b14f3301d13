"""Remote operations under faults and misuse (issue 35): a read of a value the cluster lost,
cancelling a running remote operation, keys left after a local overwrite, a remote
``delete_var``, coroutine results, ``NO_SKIP``, ``Var.version``, ``KeyboardInterrupt`` on a
worker, a blocking cluster object, an unreachable scheduler.

Each test would hang or give a wrong answer before its fix; the ones that could hang are
bounded by ``asyncio.wait_for``. In-process clusters (``processes=False``): their workers are
threads of this process, so a function of this module can block on a ``threading.Event``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioengine as ae
from aioengine.remote import RemoteBackend

from .helpers import engine_keys, in_process_cluster, no_keys_left, until

distributed = pytest.importorskip("distributed")
dask = pytest.importorskip("dask")

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

BOUND = 30  # seconds: what "never returns" is cut at


@pytest.fixture
async def cluster() -> AsyncIterator[Any]:
    """Two workers of one thread each, in this process."""
    async with in_process_cluster(2, 1) as c:
        yield c


def inc(x: int) -> int:
    return x + 1


def fail(x: int) -> int:
    raise KeyError(f"bad {x}")


def tag(x: int) -> str:
    return f"ran on {x}"


def nothing(rctx: ae.RunContext) -> None:
    return None


_EVENTS: dict[str, threading.Event] = {}
_LOGS: dict[str, list[str]] = {}


@pytest.fixture
def gate(request: pytest.FixtureRequest) -> Iterator[str]:
    name = request.node.nodeid
    _EVENTS[name] = threading.Event()
    _LOGS[name] = []
    yield name
    _EVENTS.pop(name).set()
    _LOGS.pop(name)


def gated_writer(name: str, rctx: ae.RunContext) -> None:
    _LOGS[name].append("a:start")
    assert _EVENTS[name].wait(BOUND)
    _LOGS[name].append("a:end")


def writer(name: str, rctx: ae.RunContext) -> None:
    _LOGS[name].append("b")


def gated_inc(name: str, x: int) -> int:
    _LOGS[name].append("start")
    assert _EVENTS[name].wait(BOUND)
    return x + 1


class TestLostValues:
    async def test_a_version_lost_with_its_worker_fails_the_read(self, cluster: Any) -> None:
        """Its input was scattered to the same worker, so Dask cannot recompute it: the read
        raises (it used to spin for ever), wait_for_var throws the failure, aclose returns."""
        async with ae.Engine(cluster=cluster) as engine:
            v = engine.new_var("v", value=1)
            await engine.submit(inc, v, out=v, ctx=ae.remote())
            key = v._value.future.key
            holders = {ws.address for ws in cluster.scheduler.tasks[key].who_has}
            for worker in list(cluster.workers.values()):
                if worker.address in holders:
                    await worker.close()
            with pytest.raises(ae.DependencyError, match="could not be gathered") as info:
                await asyncio.wait_for(v.get(), BOUND)
            assert isinstance(info.value.__cause__, RuntimeError)
            assert key in str(info.value.__cause__)
            with pytest.raises(RuntimeError, match="lost with the worker"):
                await asyncio.wait_for(engine.wait_for_var(v), BOUND)
            assert "0 pending operation(s)" in str(engine.dump())
            # Thrown: the Var can be written again, and then read.
            await engine.submit(inc, 41, out=v)
            assert await asyncio.wait_for(v.get(), BOUND) == 42


class TestCancel:
    async def test_a_running_side_effect_operation_holds_its_vars_until_it_ended(
        self, cluster: Any, gate: str
    ) -> None:
        """cancel() of a running remote operation cannot stop its function: the next writer
        waits for the function's end, as it does behind a running local operation."""
        async with ae.Engine(cluster=cluster) as engine:
            v = engine.new_var("v")
            a = engine.push_sync(lambda r: gated_writer(gate, r), ae.remote(), [], [v])
            await until(lambda: "a:start" in _LOGS[gate], BOUND)
            assert a.cancel()
            b = engine.push_sync(lambda r: writer(gate, r), ae.remote(), [], [v])
            await asyncio.sleep(0.2)  # room for b to overlap, were it let in
            assert _LOGS[gate] == ["a:start"]
            assert not b.done()
            _EVENTS[gate].set()
            await asyncio.wait_for(b, BOUND)
            assert _LOGS[gate] == ["a:start", "a:end", "b"]
            assert a.cancelled()


class TestKeys:
    async def test_a_local_overwrite_releases_the_scattered_copy(self, cluster: Any) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            v = engine.new_var("v", value=1)
            r = engine.new_var("r")
            await engine.submit(inc, v, out=r, ctx=ae.remote())  # v's value is scattered
            assert any(key.startswith("v-") for key in engine_keys(cluster, engine))
            await engine.submit(inc, v, out=v)  # a local write: the copy is stale
            assert await r.get() == 2  # gathered here, then written locally
            await engine.submit(inc, r, out=r)
            await no_keys_left(cluster, engine)
            assert (await v.get(), await r.get()) == (2, 3)
            # The next remote reader sends the new value.
            assert await engine.submit(inc, v, ctx=ae.remote()) == 3

    async def test_an_in_place_local_write_is_sent_again(self, cluster: Any) -> None:
        """A push_sync that mutates the Var's array in place leaves the same object: the copy
        on the cluster is stale all the same."""
        np = pytest.importorskip("numpy")
        async with ae.Engine(cluster=cluster) as engine:
            a = np.zeros(3)
            v = engine.new_var("v", value=a)
            assert await engine.submit(np.sum, v, ctx=ae.remote()) == 0

            def bump(rctx: ae.RunContext) -> None:
                a[:] += 1

            engine.push_sync(bump, mutate_vars=[v])
            assert await engine.submit(np.sum, v, ctx=ae.remote()) == 3


class TestDeleteVar:
    @pytest.mark.parametrize("with_fn", [True, False], ids=["delete_fn", "no_delete_fn"])
    async def test_delete_var_on_the_cluster(self, cluster: Any, with_fn: bool) -> None:
        engine = ae.Engine(cluster=cluster)
        d = engine.new_var("d", value=3)
        await engine.submit(inc, d, out=d, ctx=ae.remote())
        if with_fn:
            assert await engine.delete_var(d, nothing, ae.remote()) is None
        else:
            assert await engine.delete_var(d) is None
        await no_keys_left(cluster, engine)
        await engine.aclose()  # nothing raised again

    async def test_a_cancelled_deletion_keeps_the_value(self, cluster: Any, gate: str) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            d = engine.new_var("d", value=3)
            await engine.submit(inc, d, out=d, ctx=ae.remote())
            blocker = engine.push_sync(lambda r: gated_writer(gate, r), ae.remote(), [], [d])
            deletion = engine.delete_var(d)
            assert deletion.cancel()
            _EVENTS[gate].set()
            await blocker
            assert await d.get() == 4


async def seven() -> int:
    await asyncio.sleep(0)
    return 7


class TestFunctions:
    async def test_push_async_of_a_function_returning_a_coroutine(self, cluster: Any) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            assert await engine.push_async(lambda rctx: seven(), ae.remote()) == 7

    @pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
    async def test_keyboard_interrupt_and_system_exit_fail_only_the_operation(
        self, cluster: Any, exc: type[BaseException]
    ) -> None:
        def effect(rctx: ae.RunContext) -> None:
            raise exc("from the worker")

        def value(x: int) -> int:
            raise exc("from the worker")

        engine = ae.Engine(cluster=cluster)
        x = engine.new_var("x", value=1)
        op = engine.push_sync(effect, ae.remote(), [], [x])
        with pytest.raises(exc, match="from the worker"):
            await op
        with pytest.raises(exc):
            await engine.wait_for_var(x)
        y = engine.submit(value, x, ctx=ae.remote())
        with pytest.raises(exc, match="from the worker"):
            await y
        # The loop kept running: the engine still works and closes cleanly.
        assert await engine.submit(inc, x, ctx=ae.remote()) == 2
        with pytest.raises(BaseExceptionGroup):
            await engine.aclose()  # y's failure, never thrown by a wait


class TestNoSkip:
    async def test_no_skip_runs_right_after_a_failing_writer(self, cluster: Any) -> None:
        """Pushed before the failure settled it used to be skipped; after, it ran."""
        async with ae.Engine(cluster=cluster) as engine:
            w = engine.new_var("w", value=1)
            failing = engine.submit(fail, w, out=w, ctx=ae.remote())
            early = engine.submit(tag, w, ctx=ae.remote(), prop=ae.FnProperty.NO_SKIP)
            assert await early == "ran on 1"  # the value the failed write left
            with pytest.raises(KeyError):
                await failing
            late = engine.submit(tag, w, ctx=ae.remote(), prop=ae.FnProperty.NO_SKIP)
            assert await late == "ran on 1"
            with pytest.raises(KeyError):
                await engine.wait_for_var(w)


class TestVersion:
    async def test_a_remote_write_counts_once_completed(self, cluster: Any, gate: str) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            v = engine.new_var("v", value=1)
            op = engine.submit(lambda x: gated_inc(gate, x), v, out=v, ctx=ae.remote())
            await until(lambda: _LOGS[gate] == ["start"], BOUND)  # submitted, running on a worker
            assert v.version == 0
            _EVENTS[gate].set()
            await op
            assert v.version == 1
            failing = engine.submit(fail, v, out=v, ctx=ae.remote())
            with pytest.raises(KeyError):
                await failing
            assert v.version == 2  # a failed write counts too, as locally
            with pytest.raises(KeyError):
                await engine.wait_for_var(v)


class TestConnecting:
    def test_a_blocking_cluster_object(self) -> None:
        """The first thing a newcomer types: a LocalCluster made without asynchronous=True,
        in an Engine and in a BlockingEngine (both used to hang for ever)."""
        with distributed.LocalCluster(
            processes=False, n_workers=1, threads_per_worker=1, dashboard_address=":0"
        ) as c:

            async def main() -> int:
                async with ae.Engine(cluster=c) as engine:
                    v = engine.new_var("v", value=1)
                    await engine.submit(inc, v, out=v, ctx=ae.remote())
                    return int(await v.get())

            assert asyncio.run(asyncio.wait_for(main(), BOUND)) == 2
            with ae.BlockingEngine(cluster=c) as blocking:
                w = blocking.new_var("w", value=5)
                assert blocking.submit(inc, w, ctx=ae.remote()).result(BOUND) == 6

    async def test_an_unreachable_scheduler_fails_once(self) -> None:
        with dask.config.set({"distributed.comm.timeouts.connect": "0.5s"}):
            engine = ae.Engine(cluster="tcp://127.0.0.1:1")
            vs = [engine.new_var(f"v{i}", value=i) for i in range(20)]
            ops = [engine.submit(inc, v, out=v, ctx=ae.remote()) for v in vs]
            ops.append(engine.push_sync(nothing, ae.remote(), [], [engine.new_var("w")]))
            v = vs[0]
            for op in ops:
                with pytest.raises(ae.DeviceUnavailableError):
                    await asyncio.wait_for(op, BOUND)
            with pytest.raises(ae.DeviceUnavailableError, match=r"127\.0\.0\.1:1.* within 0\.5 s"):
                engine.submit(inc, v, ctx=ae.remote())  # at once, at the push
            with pytest.raises(BaseExceptionGroup) as info:
                await engine.aclose()
            assert len(info.value.exceptions) == 1
            (error,) = info.value.exceptions
            assert isinstance(error, ae.DeviceUnavailableError)
            assert "tcp://127.0.0.1:1" in str(error)

    def test_the_demo_on_an_unreachable_scheduler_prints_one_line(self) -> None:
        env = dict(
            os.environ,
            DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT="0.5s",
            PYTHONPATH=str(Path(ae.__file__).parent.parent),  # the build under test
        )
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "aioengine", "demo"),
                *("--cluster", "tcp://127.0.0.1:1", "--records", "4", "--no-progress"),
                "--no-trace",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tempfile.gettempdir(),
        )
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert "error: could not connect to the Dask cluster at 'tcp://127.0.0.1:1'" in lines[0]


def refuse(x: int) -> int:
    raise ae.Abort(f"refused {x}")


def refuse_effect(rctx: ae.RunContext) -> None:
    raise ae.Abort("refused")


class TestAbort:
    async def test_abort_on_a_worker_leaves_the_vars_as_they_were(self, cluster: Any) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            v = engine.new_var("v", value=1)
            await engine.submit(inc, v, out=v, ctx=ae.remote())
            with pytest.raises(ae.Abort, match="refused 2"):
                await engine.submit(refuse, v, out=v, ctx=ae.remote())
            with pytest.raises(ae.Abort, match="refused"):
                await engine.push_sync(refuse_effect, ae.remote(), [], [v])
            assert v.version == 1
            await engine.wait_for_var(v)  # nothing recorded
            assert await engine.submit(inc, v, out=v, ctx=ae.remote()) is None
            assert await v.get() == 3
        # ... and aclose() raised nothing


class TestWithdraw:
    async def test_a_submitted_value_operation_is_cancelled_until_its_result_is_used(
        self, cluster: Any, gate: str
    ) -> None:
        """It waits on the scheduler behind a slow writer: cancel() used to return False and
        its result landed in the Var. Now it is cancelled while nothing read its result."""
        async with ae.Engine(cluster=cluster) as engine:
            v = engine.new_var("v", value=1)
            slow = engine.submit(lambda x: gated_inc(gate, x), v, out=v, ctx=ae.remote())
            alone = engine.submit(inc, v, ctx=ae.remote())  # no out: nobody reads it
            queued = engine.submit(inc, v, out=v, ctx=ae.remote())
            await until(lambda: _LOGS[gate] == ["start"], BOUND)
            assert queued.state is ae.OpState.RUNNING  # submitted to Dask
            assert not slow.cancel()  # queued was given its result
            assert queued.cancel("not needed")
            assert alone.cancel()
            _EVENTS[gate].set()
            with pytest.raises(asyncio.CancelledError, match="not needed"):
                await asyncio.wait_for(queued, BOUND)
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(alone, BOUND)
            await slow
            assert await v.get() == 2  # the cancelled write never landed
            assert v.version == 1
            # What comes next reads the value before it, remote or local.
            assert await engine.submit(inc, v, ctx=ae.remote()) == 3
            await engine.submit(inc, v, out=v, ctx=ae.remote())
            assert await v.get() == 3
        await no_keys_left(cluster, engine)


# -- a worker killed at a random point of a random program -----------------------------------

_INTERVALS: dict[str, list[tuple[int, str, float]]] = {}


def model_value(tag: int, *xs: int) -> int:
    return sum(xs) + tag


def model_effect(run: str, tag: int, rctx: ae.RunContext) -> int:
    log = _INTERVALS[run]
    log.append((tag, "start", time.perf_counter()))
    time.sleep(0.002)
    log.append((tag, "end", time.perf_counter()))
    return tag


@st.composite
def faulty_programs(draw: st.DrawFn) -> tuple[list[tuple[Any, ...]], int]:
    """Up to 12 operations on 3 Vars, (kind, remote, reads, writes) each, and the number of
    them pushed before a worker is closed."""
    ops = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["value", "effect"]))
        reads = tuple(sorted(draw(st.sets(st.integers(0, 2), max_size=2))))
        writes = tuple(sorted(draw(st.sets(st.integers(0, 2), min_size=1, max_size=2))))
        if kind == "value":
            writes = writes[:1]
        ops.append((kind, draw(st.booleans()) or kind == "effect", reads, writes))
    return ops, draw(st.integers(0, len(ops)))


class TestWorkerKilled:
    @settings(
        max_examples=10,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(program=faulty_programs())
    def test_every_operation_ends_the_rule_holds_no_key_is_left(
        self, program: tuple[list[tuple[Any, ...]], int]
    ) -> None:
        ops_spec, kill_at = program
        run = f"run-{id(program)}"
        _INTERVALS[run] = []

        async def main() -> None:
            async with in_process_cluster(2, 2) as c:
                engine = ae.Engine(cluster=c)
                vs = [engine.new_var(f"v{i}", value=i) for i in range(3)]
                ops = []
                for tag, (kind, remote, reads, writes) in enumerate(ops_spec):
                    if tag == kill_at:
                        await next(iter(c.workers.values())).close()
                    ctx = ae.remote() if remote else ae.cpu()
                    if kind == "value":
                        args = [vs[r] for r in reads]
                        ops.append(
                            engine.submit(model_value, tag, *args, out=vs[writes[0]], ctx=ctx)
                        )
                    else:
                        fn = functools.partial(model_effect, run, tag)
                        ops.append(
                            engine.push_sync(
                                fn,
                                ctx,
                                [vs[r] for r in reads if r not in writes],
                                [vs[w] for w in writes],
                            )
                        )
                    await asyncio.sleep(0)
                if kill_at == len(ops_spec):
                    await next(iter(c.workers.values())).close()
                # Every operation ends: a result or an exception, never a hang.
                await asyncio.wait_for(asyncio.gather(*ops, return_exceptions=True), BOUND)
                with contextlib.suppress(BaseExceptionGroup):
                    await asyncio.wait_for(engine.aclose(), BOUND)
                if engine._core.remote is not None:
                    await no_keys_left(c, engine)

        asyncio.run(main())
        # The rule, on the side-effect operations (their last run, should Dask have run one
        # again on the other worker): conflicting ones never overlap, and run in push order.
        spans: dict[int, list[float]] = {}
        for tag, _, at in _INTERVALS.pop(run):
            spans.setdefault(tag, []).append(at)
        for a, b in itertools.combinations(sorted(spans), 2):
            _, _, ra, wa = ops_spec[a]
            _, _, rb, wb = ops_spec[b]
            if set(wa) & (set(rb) | set(wb)) or set(wb) & set(ra):
                assert spans[a][-1] <= spans[b][-2], (a, b, ops_spec, kill_at)


def refuse_if_odd(x: int) -> int:
    if x % 2:
        raise ae.Abort(f"odd {x}")
    return x


class TestAbortDependents:
    async def test_remote_readers_of_an_aborted_write_run_on_the_value_before(
        self, cluster: Any, gate: str
    ) -> None:
        """A chain sent at once: b's write aborts, so c (which read b's result) and d
        (which read c's) run on the value a had, as they would locally; nothing is poisoned."""
        async with ae.Engine(cluster=cluster) as engine:
            v = engine.new_var("v", value=2)
            first = engine.submit(lambda x: gated_inc(gate, x), v, out=v, ctx=ae.remote())  # 3
            aborted = engine.submit(refuse_if_odd, v, out=v, ctx=ae.remote())  # 3 is odd
            reader = engine.submit(inc, v, out=v, ctx=ae.remote())  # on 3: 4
            after = engine.submit(inc, v, out=v, ctx=ae.remote())  # 5
            value = engine.submit(tag, v, ctx=ae.remote())  # 'ran on 5'
            await until(lambda: _LOGS[gate] == ["start"], BOUND)
            _EVENTS[gate].set()
            await first
            with pytest.raises(ae.Abort, match="odd 3"):
                await aborted
            assert await reader is None
            assert await after is None
            assert await value == "ran on 5"
            assert await v.get() == 5
            assert v.version == 3  # first, reader, after
            await engine.wait_for_var(v)  # nothing recorded
            remote = engine._core.remote
            assert isinstance(remote, RemoteBackend)
            assert remote._resent >= 2  # reader and after were sent again (value too, maybe)

    async def test_a_local_value_before_the_abort_is_sent(self, cluster: Any) -> None:
        async with ae.Engine(cluster=cluster) as engine:
            v = engine.new_var("v", value=7)
            aborted = engine.submit(refuse_if_odd, v, out=v, ctx=ae.remote())
            reader = engine.submit(inc, v, ctx=ae.remote())
            with pytest.raises(ae.Abort):
                await aborted
            assert await reader == 8
            remote = engine._core.remote
            assert isinstance(remote, RemoteBackend)
            assert remote._resent == 1
        await no_keys_left(cluster, engine)
