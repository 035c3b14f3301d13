"""The rule, the pools and the engine's lifecycle."""

from __future__ import annotations

import asyncio
import functools
import gc
import itertools
import threading
import time
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioengine as ae
from aioengine.var import checked_reads, checked_writes

from .conftest import Monitor, ci_examples


def recorder(trace: list[str], name: str, result: Any = None) -> Any:
    def fn(rctx: ae.RunContext) -> Any:
        trace.append(name)
        return result

    return fn


class TestTheRule:
    async def test_writes_run_in_push_order(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        for i in range(50):
            engine.push_sync(recorder(trace, f"w{i}"), mutate_vars=[x])
        await engine.wait_for_all()
        assert trace == [f"w{i}" for i in range(50)]
        assert x.version == 50

    async def test_reads_between_writes_see_the_writes_before_them(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        value = [0]
        seen: list[tuple[int, int]] = []

        def write(rctx: ae.RunContext, n: int) -> None:
            value[0] = n

        def read(rctx: ae.RunContext, i: int) -> None:
            seen.append((i, value[0]))

        expected = []
        for i in range(30):
            if i % 3 == 0:
                engine.push_sync(lambda r, n=i: write(r, n), mutate_vars=[x])
                current = i
            else:
                engine.push_sync(lambda r, i=i: read(r, i), const_vars=[x])
                expected.append((i, current))
        await engine.wait_for_all()
        assert sorted(seen) == expected

    async def test_readers_overlap(self, threaded_engine: ae.Engine) -> None:
        """Two readers of one Var run at the same time: a 2-party barrier only passes then."""
        x = threaded_engine.new_var("x")
        barrier = threading.Barrier(2, timeout=10)
        ops = [
            threaded_engine.push_sync(lambda r: barrier.wait(), const_vars=[x]) for _ in range(2)
        ]
        assert sorted(await asyncio.gather(*ops)) == [0, 1]

    async def test_writer_excludes_readers_and_writers(
        self, threaded_engine: ae.Engine, monitor: Monitor
    ) -> None:
        x, y = threaded_engine.new_var("x"), threaded_engine.new_var("y")

        def body(name: str, reads: tuple[str, ...], writes: tuple[str, ...]) -> Any:
            def fn(rctx: ae.RunContext) -> None:
                monitor.enter(name, reads, writes)
                time.sleep(0.0005)  # gives a wrong engine the chance to overlap
                monitor.exit(reads, writes)

            return fn

        for i in range(200):
            kind = i % 4
            if kind == 0:
                threaded_engine.push_sync(body(f"w{i}", (), ("x",)), mutate_vars=[x])
            elif kind == 1:
                threaded_engine.push_sync(body(f"r{i}", ("x", "y"), ()), const_vars=[x, y])
            elif kind == 2:
                threaded_engine.push_sync(
                    body(f"m{i}", ("x",), ("y",)), const_vars=[x], mutate_vars=[y]
                )
            else:
                threaded_engine.push_sync(body(f"r{i}", ("y",), ()), const_vars=[y])
        await threaded_engine.wait_for_all()
        assert monitor.violations == []

    async def test_disjoint_vars_run_concurrently(self, threaded_engine: ae.Engine) -> None:
        x, y = threaded_engine.new_var("x"), threaded_engine.new_var("y")
        barrier = threading.Barrier(2, timeout=10)
        a = threaded_engine.push_sync(lambda r: barrier.wait(), mutate_vars=[x])
        b = threaded_engine.push_sync(lambda r: barrier.wait(), mutate_vars=[y])
        assert sorted(await asyncio.gather(a, b)) == [0, 1]

    async def test_duplicates_are_ignored_and_both_lists_means_mutated(
        self, engine: ae.Engine
    ) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        engine.push_sync(recorder(trace, "a"), const_vars=[x, x], mutate_vars=[x, x])
        engine.push_sync(recorder(trace, "b"), const_vars=[x, x])
        await engine.wait_for_all()
        assert trace == ["a", "b"]
        assert x.version == 1  # the op that listed x in both lists wrote it once

    @pytest.mark.parametrize("n", [1, 2, 3, 9, 20])
    async def test_var_lists_of_any_length_are_deduplicated(
        self, engine: ae.Engine, n: int
    ) -> None:
        """Short and long lists take different paths; both count each Var once, as a write
        if it is listed as one."""
        vs = [engine.new_var(f"v{i}") for i in range(n)]
        extra = engine.new_var("read-only")
        gate = asyncio.Event()

        async def hold(rctx: ae.RunContext) -> None:
            await gate.wait()

        engine.push_async(hold, mutate_vars=[extra])  # op waits behind it: its lists stay
        op = engine.push_sync(
            lambda r: None, const_vars=[*vs, extra, *vs, extra], mutate_vars=[*vs, *vs]
        )
        assert op.const_vars == (extra,)
        assert op.mutate_vars == tuple(vs)
        gate.set()
        await op
        assert [v.version for v in vs] == [1] * n
        assert extra.version == 1  # the gate's write only: op read it

    async def test_short_var_lists_match_a_dictionary_deduplication(
        self, engine: ae.Engine
    ) -> None:
        """Every list of up to three reads and two writes over four Vars (the short lists
        are checked pairwise by identity, not through a dict): each Var once, in first-seen
        order, and a Var in both lists only among the writes."""
        pool = [engine.new_var(f"p{i}") for i in range(4)]
        for nc in range(4):
            for reads in itertools.product(pool[:3], repeat=nc):
                for nm in range(3):
                    for writes in itertools.product(pool[1:], repeat=nm):
                        mutate = checked_writes(engine, list(writes))
                        const = checked_reads(engine, list(reads), mutate)
                        want_mutate = tuple(dict.fromkeys(writes))
                        want_const = tuple(v for v in dict.fromkeys(reads) if v not in writes)
                        assert (const, mutate) == (want_const, want_mutate), (reads, writes)

    async def test_coroutine_ops_are_ordered_like_sync_ops(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[str] = []

        async def slow(rctx: ae.RunContext) -> str:
            trace.append("slow:start")
            for _ in range(5):
                await asyncio.sleep(0)
            trace.append("slow:end")
            return "slow"

        first = engine.push_async(slow, mutate_vars=[x])
        engine.push_sync(recorder(trace, "sync"), const_vars=[x])
        assert await first == "slow"
        await engine.wait_for_all()
        assert trace == ["slow:start", "slow:end", "sync"]

    async def test_io_coroutines_overlap(self, engine: ae.Engine) -> None:
        """Coroutine ops on disjoint Vars wait together: 20 sleeps take about one."""
        gate = asyncio.Event()
        started = 0

        async def io(rctx: ae.RunContext) -> None:
            nonlocal started
            started += 1
            if started == 20:
                gate.set()
            await gate.wait()

        ops = [engine.push_async(io, mutate_vars=[engine.new_var()]) for _ in range(20)]
        if engine.serial:
            # Serial mode runs one at a time: the first can never see the others start.
            with pytest.raises(TimeoutError):
                await engine.wait_for_all(timeout=0.2)
            gate.set()
        await asyncio.gather(*ops)

    async def test_wait_for_var_waits_for_readers_too(self, threaded_engine: ae.Engine) -> None:
        x = threaded_engine.new_var("x")
        release = threading.Event()
        reader = threaded_engine.push_sync(lambda r: release.wait(10), const_vars=[x])
        waiter = asyncio.ensure_future(threaded_engine.wait_for_var(x))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        release.set()
        await waiter
        assert reader.done()

    async def test_wait_for_var_ignores_later_pushes(self, threaded_engine: ae.Engine) -> None:
        x = threaded_engine.new_var("x")
        hold = threading.Event()
        first = threaded_engine.push_sync(lambda r: hold.wait(10), mutate_vars=[x])
        waiter = asyncio.ensure_future(threaded_engine.wait_for_var(x))
        await asyncio.sleep(0)  # the wait starts (and is queued on x) before the next push
        release = threading.Event()
        later = threaded_engine.push_sync(lambda r: release.wait(10), mutate_vars=[x])
        hold.set()
        await waiter
        assert first.done()
        assert not later.done()
        release.set()
        await later

    async def test_wait_for_idle_var_returns_at_once(self, engine: ae.Engine) -> None:
        await engine.wait_for_var(engine.new_var())

    async def test_ops_without_vars_run(self, engine: ae.Engine) -> None:
        assert await engine.push_sync(lambda r: 7) == 7

    async def test_wait_for_all_waits_for_every_pending_op(self, engine: ae.Engine) -> None:
        done: list[int] = []
        for i in range(20):
            engine.push_sync(lambda r, i=i: done.append(i), mutate_vars=[engine.new_var()])
        await engine.wait_for_all()
        assert sorted(done) == list(range(20))
        assert engine.pending == 0


class TestPools:
    async def test_sync_ops_run_on_the_context_pool(self, threaded_engine: ae.Engine) -> None:
        names = await asyncio.gather(
            threaded_engine.push_sync(lambda r: threading.current_thread().name),
            threaded_engine.push_sync(lambda r: threading.current_thread().name, ae.cpu(1)),
        )
        assert names[0].startswith("aioengine-cpu0")
        assert names[1].startswith("aioengine-cpu1")

    async def test_cpu_prioritized_runs_on_the_priority_pool(
        self, threaded_engine: ae.Engine
    ) -> None:
        op = threaded_engine.push_sync(
            lambda r: (threading.current_thread().name, r.ctx),
            ae.cpu(3),
            prop=ae.FnProperty.CPU_PRIORITIZED,
        )
        name, ctx = await op
        assert name.startswith("aioengine-cpu-priority")
        assert ctx == ae.cpu(3)

    @pytest.mark.parametrize(
        "prop",
        [
            ae.FnProperty.COPY_FROM_GPU,
            ae.FnProperty.COPY_TO_GPU,
            ae.FnProperty.GPU_PRIORITIZED,
            ae.FnProperty.NO_SKIP,
        ],
    )
    async def test_gpu_properties_behave_as_normal_on_cpu(
        self, threaded_engine: ae.Engine, prop: ae.FnProperty
    ) -> None:
        name = await threaded_engine.push_sync(lambda r: threading.current_thread().name, prop=prop)
        assert name.startswith("aioengine-cpu0")

    async def test_async_property_runs_inline_on_the_loop_thread(
        self, threaded_engine: ae.Engine
    ) -> None:
        loop_thread = threading.get_ident()
        ident = await threaded_engine.push_sync(
            lambda r: threading.get_ident(), prop=ae.FnProperty.ASYNC
        )
        assert ident == loop_thread

    async def test_serial_mode_runs_sync_fns_on_the_loop_thread(self) -> None:
        async with ae.Engine(serial=True) as engine:
            ident = await engine.push_sync(lambda r: threading.get_ident())
        assert ident == threading.get_ident()

    async def test_workers_never_exceed_the_setting(self) -> None:
        async with ae.Engine(cpu_workers=3) as engine:
            lock = threading.Lock()
            running = peak = started = 0
            meet = threading.Barrier(3, timeout=10)  # the first three overlap for sure

            def body(rctx: ae.RunContext) -> None:
                nonlocal running, peak, started
                with lock:
                    running += 1
                    peak = max(peak, running)
                    started += 1
                    first = started <= 3
                if first:
                    meet.wait()
                time.sleep(0.002)
                with lock:
                    running -= 1

            for _ in range(60):
                engine.push_sync(body, mutate_vars=[engine.new_var()])
            await engine.wait_for_all()
        assert peak == 3

    async def test_threads_are_released_on_close(self) -> None:
        before = {t.ident for t in threading.enumerate()}
        engine = ae.Engine(cpu_workers=2)
        await engine.push_sync(lambda r: None)
        await engine.aclose()
        leftover = [
            t for t in threading.enumerate() if t.ident not in before and t.name.startswith("aio")
        ]
        assert leftover == []


class TestPriority:
    @pytest.mark.parametrize(
        "prop", [ae.FnProperty.NORMAL, ae.FnProperty.CPU_PRIORITIZED, ae.FnProperty.ASYNC]
    )
    async def test_ready_ops_run_highest_priority_first(self, prop: ae.FnProperty) -> None:
        async with ae.Engine(cpu_workers=1, cpu_priority_workers=1) as engine:
            trace: list[int] = []
            gate = threading.Event()
            blocker = engine.new_var("blocker")
            # Hold the single worker (or the loop, for ASYNC) so the ops queue up ready.
            if prop is ae.FnProperty.ASYNC:
                engine.push_sync(lambda r: None, prop=prop, mutate_vars=[blocker], priority=100)
            else:
                engine.push_sync(lambda r: gate.wait(10), prop=prop, mutate_vars=[blocker])
            for p in (1, 5, 3, -2, 4, 5):
                engine.push_sync(
                    lambda r, p=p: trace.append(p),
                    prop=prop,
                    priority=p,
                    mutate_vars=[engine.new_var()],
                )
            gate.set()
            await engine.wait_for_all()
        assert trace == [5, 5, 4, 3, 1, -2]

    @given(
        # Long enough for the FIFO to drop its claimed prefix (past 64 entries) mid-run.
        priorities=st.lists(st.sampled_from([0, 0, 0, 1, -1, 7]), max_size=150),
        late=st.lists(st.sampled_from([0, 0, 2, -3]), max_size=40),
        gate=st.sampled_from([0, -2, 5]),
    )
    def test_the_loop_runs_its_ready_ops_best_first(
        self, priorities: list[int], late: list[int], gate: int
    ) -> None:
        """Inline ops run best first (priority, then push order) among those READY, whether
        their keys reach the loop queue in order (its FIFO part) or not (its heap), and when
        more become ready while others are queued: checked against a model priority queue."""
        pushed = [("gate", gate)] + [("early", p) for p in priorities]
        pushed += [("late", p) for p in late]

        async def main() -> list[int]:
            trace: list[int] = []
            async with ae.Engine() as engine:
                blocker = engine.new_var("blocker")

                def push(i: int, kind: str, p: int) -> None:
                    engine.push_sync(
                        lambda r: trace.append(i),
                        const_vars=[blocker] if kind == "late" else [],
                        mutate_vars=[blocker] if kind == "gate" else [engine.new_var()],
                        prop=ae.FnProperty.ASYNC,
                        priority=p,
                    )

                # The first op pushes the rest: they are all queued before the loop queue
                # runs again; the late ones wait for the gate op, which writes 'blocker'.
                def fill(r: ae.RunContext) -> None:
                    for i, (kind, p) in enumerate(pushed):
                        push(i, kind, p)

                engine.push_sync(fill, prop=ae.FnProperty.ASYNC)
                await engine.wait_for_all()
            return trace

        expected: list[int] = []
        ready = [(-p, i) for i, (kind, p) in enumerate(pushed) if kind != "late"]
        while ready:
            ready.sort()
            _, i = ready.pop(0)
            expected.append(i)
            if pushed[i][0] == "gate":
                ready += [(-p, j) for j, (kind, p) in enumerate(pushed) if kind == "late"]
        assert asyncio.run(main()) == expected

    # 30 fixed examples in CI (100 took 15 s of the pure build, 21 s under coverage);
    # ``nox -s fuzz`` draws new ones, 1,500 a round.
    @ci_examples(30)
    @given(data=st.data())
    def test_the_loop_queue_matches_a_priority_queue(self, data: st.DataObject) -> None:
        """The loop queue, driven directly: operations made READY in any order (in its slots,
        behind its head, past its end by a little or by a lot; with priorities; some
        cancelled while queued) are claimed best first, as from a model priority queue."""
        from aioengine.kinds import _SYNC
        from aioengine.operation import OpState, new_operation

        n = data.draw(st.integers(1, 300))
        priorities = data.draw(st.lists(st.sampled_from([0] * 6 + [1, -2]), min_size=n, max_size=n))
        # Numbers between two operations were taken by others that never reach the loop
        # queue (a pool's): the padding to reach the next one may be short or long.
        steps = data.draw(
            st.lists(st.sampled_from([1] * 20 + [3, 70, 500]), min_size=n, max_size=n)
        )
        # The order in which they become READY: push order, locally shuffled or not at all.
        window = data.draw(st.sampled_from([1, 2, 5, 20, 80, n]))
        keys = [i // window * window + data.draw(st.integers(0, window - 1)) for i in range(n)]
        # Some are made READY late (by a pool's operation, say), once later ones were claimed.
        keys = [k + data.draw(st.sampled_from([0] * 6 + [10, 50])) for k in keys]
        order = sorted(range(n), key=lambda i: (keys[i], i))
        after = data.draw(st.lists(st.sampled_from("rrrccx"), min_size=n, max_size=n))

        async def main() -> None:
            async with ae.Engine() as engine:
                engine._core.loop_queue.scheduled = True  # claimed here, not by the loop
                ops = []
                seq = 0
                for p, step in zip(priorities, steps, strict=True):
                    seq += step
                    op = new_operation(
                        engine._core,
                        engine,
                        None,
                        _SYNC,
                        ae.cpu(),
                        (),
                        (),
                        ae.FnProperty.ASYNC,
                        p,
                        "op",
                    )
                    op.seq = seq
                    op.key = seq - (p << 64) if p else seq
                    ops.append(op)
                model: dict[Any, int] = {}  # queued -> key; a cancelled one leaves it

                def claim() -> None:
                    best = min(model, key=model.__getitem__, default=None)
                    assert engine._core.claim_loop_op_locked([]) is best
                    if best is not None:
                        assert best._state is OpState.RUNNING
                        del model[best]

                for i, then in zip(order, after, strict=True):
                    with engine._core.lock:
                        ops[i]._state = OpState.READY
                        engine._core.enqueue_loop_locked(ops[i])
                        model[ops[i]] = ops[i].key
                        if then == "c":
                            claim()
                        elif then == "x":  # cancelled while queued: skipped by a claim
                            victim = data.draw(st.sampled_from(sorted(model, key=model.get)))
                            victim._state = OpState.CANCELLED
                            del model[victim]
                        fifo, head = engine._core.loop_queue.fifo, engine._core.loop_queue.head
                        assert sorted(engine._core.loop_queue.heap) == sorted(
                            engine._core.loop_queue.heap_ops
                        )
                        assert head == len(fifo) or fifo[-1] is not None
                        for j, op in enumerate(fifo[head:], head):
                            assert op is None or op.seq == engine._core.loop_queue.base + j
                with engine._core.lock:
                    while model:
                        claim()
                    claim()  # None: empty
                assert engine._core.loop_queue.head == len(engine._core.loop_queue.fifo)
                assert not engine._core.loop_queue.heap
                assert not engine._core.loop_queue.heap_ops

        asyncio.run(main())

    async def test_coroutine_ops_made_ready_together_start_highest_priority_first(
        self, threaded_engine: ae.Engine
    ) -> None:
        """Readers released by one writer start (are called) in priority order."""
        engine = threaded_engine
        x = engine.new_var("x")
        trace: list[int] = []
        gate = asyncio.Event()

        async def writer(rctx: ae.RunContext) -> None:
            await gate.wait()

        async def reader(rctx: ae.RunContext, p: int) -> None:
            trace.append(p)

        engine.push_async(writer, mutate_vars=[x])
        for p in (1, 5, 3, -2, 4):
            engine.push_async(functools.partial(reader, p=p), const_vars=[x], priority=p)
        await asyncio.sleep(0)
        gate.set()
        await engine.wait_for_all()
        assert trace == [5, 4, 3, 1, -2]

    async def test_a_burst_of_inline_ops_lets_the_loop_breathe(self) -> None:
        """Inline operations run in batches: other callbacks run between them."""
        async with ae.Engine() as engine:
            trace: list[str] = []
            for i in range(1000):
                engine.push_sync(
                    lambda r, i=i: trace.append(f"op{i}"),
                    prop=ae.FnProperty.ASYNC,
                    mutate_vars=[engine.new_var()],
                )
            asyncio.get_running_loop().call_soon(trace.append, "callback")
            await engine.wait_for_all()
        assert len(trace) == 1001
        assert 0 < trace.index("callback") < 1000
        assert [t for t in trace if t != "callback"] == [f"op{i}" for i in range(1000)]

    async def test_any_integer_is_a_priority(self, serial: bool) -> None:
        """NumPy's integers too (numbers.Integral), on every kind of push; the queue orders
        them as ints."""
        async with ae.Engine(cpu_workers=1, serial=serial) as engine:
            trace: list[int] = []
            gate = asyncio.Event()

            async def hold(rctx: ae.RunContext) -> None:
                await gate.wait()

            blocker = engine.new_var("blocker")
            engine.push_async(hold, mutate_vars=[blocker])  # the others queue behind it
            handle = engine.new_operator(lambda r: trace.append(2), [blocker])
            ops = [
                engine.push_sync(
                    lambda r: trace.append(1), const_vars=[blocker], priority=np.int8(1)
                ),
                engine.push(handle, priority=np.int64(2)),
                engine.submit(lambda: trace.append(3), reads=[blocker], priority=np.uint16(3)),
                engine.push_sync(
                    lambda r: trace.append(0), const_vars=[blocker], priority=np.int32(0)
                ),
            ]
            assert [type(op.priority) for op in ops] == [int] * 4
            gate.set()
            await engine.wait_for_all()
        # Serial mode runs in push order: priority orders only what is ready together.
        assert trace == ([1, 2, 3, 0] if serial else [3, 2, 1, 0])

    @pytest.mark.parametrize(
        ("priority", "type_name"), [(True, "bool"), (np.float64(1.0), "float64"), (1.0, "float")]
    )
    async def test_a_bad_priority_names_its_type(
        self, engine: ae.Engine, priority: object, type_name: str
    ) -> None:
        with pytest.raises(TypeError, match=rf"^priority must be an int, got .* \({type_name}\)$"):
            engine.push_sync(lambda r: None, priority=priority)  # type: ignore[arg-type]
        assert engine.pending == 0

    async def test_priority_never_reorders_across_dependencies(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        engine.push_sync(recorder(trace, "low"), mutate_vars=[x], priority=-10)
        engine.push_sync(recorder(trace, "high"), const_vars=[x], priority=10)
        await engine.wait_for_all()
        assert trace == ["low", "high"]


class TestThreads:
    async def test_opposite_order_pushes_from_two_threads_never_deadlock(
        self, threaded_engine: ae.Engine
    ) -> None:
        """MXNet 1.9.1 deadlocks here every time: pushes must be atomic across Vars."""
        a, b = threaded_engine.new_var("a"), threaded_engine.new_var("b")
        counts = {"a": 0, "b": 0}

        def pusher(first: ae.Var, second: ae.Var) -> None:
            for _ in range(500):
                threaded_engine.push_sync(
                    lambda r: counts.__setitem__("a", counts["a"] + 1), mutate_vars=[first, second]
                )

        threads = [
            threading.Thread(target=pusher, args=(a, b)),
            threading.Thread(target=pusher, args=(b, a)),
        ]
        for t in threads:
            t.start()
        await asyncio.to_thread(lambda: [t.join() for t in threads])
        await threaded_engine.wait_for_all(timeout=30)
        assert counts["a"] == 1000
        assert a.version == b.version == 1000

    async def test_pushes_from_threads_keep_each_threads_order(
        self, threaded_engine: ae.Engine
    ) -> None:
        x = threaded_engine.new_var("x")
        trace: list[tuple[int, int]] = []

        def pusher(t: int) -> None:
            for i in range(200):
                threaded_engine.push_sync(lambda r, t=t, i=i: trace.append((t, i)), mutate_vars=[x])

        threads = [threading.Thread(target=pusher, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        await asyncio.to_thread(lambda: [t.join() for t in threads])
        await threaded_engine.wait_for_all(timeout=30)
        assert len(trace) == 800
        for t in range(4):
            assert [i for tt, i in trace if tt == t] == list(range(200))

    async def test_push_from_a_worker_thread(self, threaded_engine: ae.Engine) -> None:
        x = threaded_engine.new_var("x")

        def parent(rctx: ae.RunContext) -> ae.Operation[int]:
            return threaded_engine.push_sync(lambda r: 42, const_vars=[x])

        child = await threaded_engine.push_sync(parent, mutate_vars=[x])
        assert await child == 42

    async def test_await_from_thread_without_loop_is_refused(
        self, threaded_engine: ae.Engine
    ) -> None:
        op = threaded_engine.push_sync(lambda r: 1)
        await op

        def other_loop() -> None:
            async def main() -> None:
                await threaded_engine.push_sync(lambda r: 2)

            asyncio.run(main())

        with pytest.raises(RuntimeError, match="bound to another event loop"):
            await asyncio.to_thread(other_loop)


class TestLifecycle:
    def test_engine_binds_lazily(self) -> None:
        engine = ae.Engine()  # no loop running: construction must not need one

        async def main() -> int:
            result: int = await engine.push_sync(lambda r: 3)
            await engine.aclose()
            return result

        assert asyncio.run(main()) == 3

    def test_use_from_a_second_loop_raises(self) -> None:
        engine = ae.Engine()

        async def first() -> None:
            await engine.push_sync(lambda r: None)

        async def second() -> None:
            with pytest.raises(RuntimeError, match="bound to another event loop"):
                engine.push_sync(lambda r: None)
            with pytest.raises(RuntimeError, match="bound to another event loop"):
                await engine.wait_for_all()

        asyncio.run(first())
        asyncio.run(second())
        engine._core.shutdown_executors(wait=True)
        engine._core.state = engine._core.state.CLOSED

    @pytest.mark.parametrize("policy", ["asyncio", "uvloop", "subclass"])
    def test_the_running_check_answers_as_is_running(self, policy: str) -> None:
        """Every push from the loop's thread asks whether the bound loop runs, through the
        cheapest equivalent of ``loop.is_running()`` (``corestate._is_running``): it must
        answer the same before, during and after a run, for asyncio's loops, uvloop's, and
        a loop class that answers ``is_running`` its own way."""
        from aioengine.corestate import _is_running

        if policy == "uvloop":
            uvloop = pytest.importorskip("uvloop")
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        elif policy == "subclass":

            class Stopped(asyncio.SelectorEventLoop):
                def is_running(self) -> bool:
                    return False  # its own answer, whatever _thread_id says

            loop = Stopped()
        else:
            loop = asyncio.new_event_loop()
        running = _is_running(loop)

        async def probe() -> tuple[bool, bool]:
            return bool(running()), loop.is_running()

        try:
            assert bool(running()) is loop.is_running() is False
            inside, expected = loop.run_until_complete(probe())
            assert inside is expected is (policy != "subclass")
            assert bool(running()) is loop.is_running() is False
        finally:
            loop.close()

    async def test_aclose_drains_then_refuses_pushes(self, engine: ae.Engine) -> None:
        done: list[int] = []
        x = engine.new_var()
        for i in range(10):
            engine.push_sync(lambda r, i=i: done.append(i), mutate_vars=[x])
        await engine.aclose()
        assert done == list(range(10))
        assert engine.closed
        with pytest.raises(ae.EngineClosedError, match="closed; create a new Engine"):
            engine.push_sync(lambda r: None)
        await engine.aclose()  # closing twice is harmless

    async def test_aclose_raises_unthrown_failures(self) -> None:
        engine = ae.Engine()
        err = ValueError("boom")

        def fail(rctx: ae.RunContext) -> None:
            raise err

        engine.push_sync(fail, mutate_vars=[engine.new_var()])
        with pytest.raises(ExceptionGroup) as info:
            await engine.aclose()
        assert info.value.exceptions == (err,)
        assert engine.closed

    async def test_async_with_clean_exit_drains(self) -> None:
        trace: list[str] = []
        async with ae.Engine() as engine:
            engine.push_sync(recorder(trace, "a"))
        assert trace == ["a"]
        assert engine.closed

    async def test_async_with_body_error_propagates_unchanged(self) -> None:
        err = KeyError("body")
        gate = threading.Event()
        ran: list[str] = []
        ops: list[ae.Operation[Any]] = []
        engines: list[ae.Engine] = []

        async def body() -> None:
            async with ae.Engine(cpu_workers=1) as engine:
                engines.append(engine)
                x = engine.new_var()
                ops.append(engine.push_sync(lambda r: gate.wait(10), mutate_vars=[x]))
                ops.append(engine.push_sync(lambda r: ran.append("queued"), mutate_vars=[x]))
                await asyncio.sleep(0.01)
                gate.set()
                raise err

        with pytest.raises(KeyError) as info:
            await body()
        running, queued = ops
        engine = engines[0]
        assert info.value is err
        assert running.done()
        assert queued.cancelled()
        assert ran == []
        assert engine.closed

    async def test_garbage_collected_engine_warns_and_releases_threads(self) -> None:
        engine = ae.Engine(cpu_workers=1)
        await engine.push_sync(lambda r: None)
        executors = list(engine._core.routes.executors.values())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del engine
            gc.collect()
        assert any(issubclass(w.category, ResourceWarning) for w in caught)
        for executor in executors:
            assert executor._closing  # type: ignore[attr-defined]

    async def test_repr(self) -> None:
        async with ae.Engine(cpu_workers=2) as engine:
            assert repr(engine) == "<aioengine.Engine open pending=0 cpu_workers=2>"
        assert repr(ae.Engine(serial=True)) == "<aioengine.Engine open pending=0 serial>"


class TestSchedulerState:
    """``Scheduler.validate_state()`` (used by the model tests) sees a broken invariant."""

    async def test_a_consistent_engine_passes_and_a_broken_one_fails(self) -> None:
        async with ae.Engine() as engine:
            x = engine.new_var("x")
            gate = asyncio.Event()

            async def hold(rctx: ae.RunContext) -> None:
                await gate.wait()

            engine.push_async(hold, mutate_vars=[x])
            engine.push_sync(lambda r: None, const_vars=[x], prop=ae.FnProperty.ASYNC)
            await asyncio.sleep(0)
            core = engine._core
            core.validate_state()
            core.loop_queue.heap.append(7)  # a key with no operation
            with pytest.raises(AssertionError, match="heap and its ops"):
                core.validate_state()
            core.loop_queue.heap.pop()
            core.validate_state()
            gate.set()
