"""A port of MXNet's ``RandSumExpr`` engine test, plus pushes from several threads.

MXNet (``tests/cpp/engine/threaded_engine_test.cc``): 100 Vars holding 1.0; random workloads
each write one random Var and read 2-19 random Vars (duplicates allowed; the written Var is
dropped from the read list but the body still reads it), ``data[w] = sum(reads) / (n + 1)``
with a tiny sleep now and then; push them all, ``WaitForAll``, repeat; every value must be
bit-identical to a serial replay. Any reordering of two operations that share a written Var
changes some value, so equality proves the rule on thousands of random conflicts.

Across threads there is no push order to replay, so the threaded tests replay the order in
which operations *started*: an operation starts only after every conflicting operation pushed
before it finished, so that order is a serial schedule with the same result.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import aioengine as ae

N_VARS = 100
N_WORKLOADS = 1500
N_REPEATS = 3


@dataclass(frozen=True, slots=True)
class Workload:
    reads: tuple[int, ...]  # as drawn: duplicates allowed, may include ``write``
    write: int
    sleep: bool


def generate(rng: random.Random, n: int) -> list[Workload]:
    return [
        Workload(
            reads=tuple(rng.randrange(N_VARS) for _ in range(rng.randrange(2, 20))),
            write=rng.randrange(N_VARS),
            sleep=rng.randrange(64) == 0,
        )
        for _ in range(n)
    ]


def evaluate(wl: Workload, data: list[float]) -> None:
    """MXNet's ``EvaluateWorkload``: the body of every operation and of the serial replay."""
    total = 0.0
    for i in wl.reads:
        total += data[i]
    data[wl.write] = total / (len(wl.reads) + 1)


def replay(workloads: list[Workload], repeats: int = 1) -> list[float]:
    data = [1.0] * N_VARS
    for _ in range(repeats):
        for wl in workloads:
            evaluate(wl, data)
    return data


def var_lists(wl: Workload, vars_: list[ae.Var]) -> tuple[list[ae.Var], list[ae.Var]]:
    """MXNet drops the written Var from the reads; duplicate reads are pushed as drawn."""
    return [vars_[i] for i in wl.reads if i != wl.write], [vars_[wl.write]]


def body(wl: Workload, data: list[float]) -> Callable[[ae.RunContext], None]:
    def fn(rctx: ae.RunContext) -> None:
        if wl.sleep:
            time.sleep(1e-5)
        evaluate(wl, data)

    return fn


class Pusher:
    """Pushes one workload in one of the styles MXNet's test and aioengine offer."""

    def __init__(self, engine: ae.Engine, style: str) -> None:
        self.engine = engine
        self.style = style
        self.threads: list[threading.Thread] = []

    def push(self, wl: Workload, vars_: list[ae.Var], data: list[float]) -> ae.Operation[Any]:
        const, mutate = var_lists(wl, vars_)
        fn = body(wl, data)
        if self.style == "push_sync":
            return self.engine.push_sync(fn, ae.cpu(), const, mutate)
        if self.style == "push_sync-ASYNC":
            return self.engine.push_sync(fn, ae.cpu(), const, mutate, prop=ae.FnProperty.ASYNC)
        if self.style == "callback":
            # MXNet's PushAsync: completed inline, or now and then from another thread.
            def callback(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
                if not wl.sleep:
                    fn(rctx)
                    on_complete()
                    return

                def later() -> None:
                    fn(rctx)
                    on_complete()

                thread = threading.Thread(target=later)
                self.threads.append(thread)
                thread.start()

            return self.engine.push_async(callback, ae.cpu(), const, mutate)
        assert self.style == "coroutine"

        async def coro(rctx: ae.RunContext) -> None:
            if wl.sleep:
                await asyncio.sleep(0)
            evaluate(wl, data)

        return self.engine.push_async(coro, ae.cpu(), const, mutate)

    def join(self) -> None:
        for thread in self.threads:
            thread.join()


ENGINES = {
    "threaded-1": {"cpu_workers": 1},
    "threaded-2": {"cpu_workers": 2},
    "threaded-4": {"cpu_workers": 4},
    "serial": {"serial": True},
}
# Coroutine operations cost a Task each (and debug-mode bookkeeping): two engines suffice.
CASES = [
    pytest.param(ENGINES[engine], style, id=f"{engine}-{style}")
    for style in ("push_sync", "callback", "coroutine")
    for engine in ENGINES
    if style != "coroutine" or engine in ("threaded-2", "serial")
]


class TestRandSumExpr:
    @pytest.mark.parametrize(("settings", "style"), CASES)
    async def test_bit_identical_to_serial_replay(
        self, settings: dict[str, Any], style: str
    ) -> None:
        workloads = generate(random.Random(f"{settings}-{style}"), N_WORKLOADS)
        expected = replay(workloads, N_REPEATS)
        data = [1.0] * N_VARS
        async with ae.Engine(**settings) as engine:
            vars_ = [engine.new_var(f"v{i}") for i in range(N_VARS)]
            pusher = Pusher(engine, style)
            for _ in range(N_REPEATS):
                ops = [pusher.push(wl, vars_, data) for wl in workloads]
                await engine.wait_for_all()
                assert all(op.done() and op.exception() is None for op in ops)
            pusher.join()
            writes = [0] * N_VARS
            for wl in workloads:
                writes[wl.write] += N_REPEATS
            assert [v.version for v in vars_] == writes
        assert data == expected  # bit-identical: float ==, as MXNet's EXPECT_EQ
        assert data != [1.0] * N_VARS

    async def test_fn_property_async_runs_inline_and_matches(self) -> None:
        """FnProperty.ASYNC runs sync fns on the loop thread, still in dependency order."""
        workloads = generate(random.Random("async-prop"), N_WORKLOADS)
        data = [1.0] * N_VARS
        loop_thread = threading.get_ident()
        threads: set[int] = set()
        async with ae.Engine(cpu_workers=2) as engine:
            vars_ = [engine.new_var(f"v{i}") for i in range(N_VARS)]
            for _ in range(N_REPEATS):
                for wl in workloads:
                    const, mutate = var_lists(wl, vars_)

                    def fn(rctx: ae.RunContext, wl: Workload = wl) -> None:
                        threads.add(threading.get_ident())
                        evaluate(wl, data)

                    engine.push_sync(fn, ae.cpu(), const, mutate, prop=ae.FnProperty.ASYNC)
                await engine.wait_for_all()
        assert threads == {loop_thread}
        assert data == replay(workloads, N_REPEATS)


class StartLog:
    """Records the order in which operations start (a valid serial schedule)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.order: list[tuple[int, int]] = []  # (pusher, index in its program)

    def body(
        self, key: tuple[int, int], wl: Workload, data: list[float]
    ) -> Callable[[ae.RunContext], None]:
        def fn(rctx: ae.RunContext) -> None:
            with self._lock:
                self.order.append(key)
            evaluate(wl, data)

        return fn


def push_program(
    engine: ae.Engine,
    vars_: list[ae.Var],
    program: list[Workload],
    who: int,
    log: StartLog,
    data: list[float],
) -> list[ae.Operation[None]]:
    ops = []
    for i, wl in enumerate(program):
        const, mutate = var_lists(wl, vars_)
        ops.append(engine.push_sync(log.body((who, i), wl, data), ae.cpu(), const, mutate))
    return ops


def conflict(a: Workload, b: Workload) -> bool:
    return a.write == b.write or a.write in b.reads or b.write in a.reads


def check_start_order(programs: list[list[Workload]], log: StartLog, data: list[float]) -> None:
    """Check what any interleaving of the pushers must give.

    Every op started exactly once; two conflicting ops pushed by one thread started in the
    order that thread pushed them; replaying the start order serially gives the engine's
    result bit for bit.
    """
    assert sorted(log.order) == [(w, i) for w, p in enumerate(programs) for i in range(len(p))]
    assert data == replay([programs[w][i] for w, i in log.order])
    position = {key: n for n, key in enumerate(log.order)}
    for who, program in enumerate(programs):
        inverted = [
            (i, j)
            for j, later in enumerate(program)
            for i in range(j)
            if position[who, i] > position[who, j] and conflict(program[i], later)
        ]
        assert inverted == [], f"pusher {who} conflicting ops started out of push order"


class TestPushFromThreads:
    async def test_four_threads_share_vars(self, engine: ae.Engine) -> None:
        programs = [generate(random.Random(f"thread{w}"), 400) for w in range(4)]
        data = [1.0] * N_VARS
        log = StartLog()
        vars_ = [engine.new_var(f"v{i}") for i in range(N_VARS)]
        await engine.wait_for_all()  # binds the engine to this loop before threads push
        pushed = await asyncio.gather(
            *(
                asyncio.to_thread(push_program, engine, vars_, p, w, log, data)
                for w, p in enumerate(programs)
            )
        )
        async with asyncio.timeout(60):  # a deadlock fails here, not at pytest's timeout
            await engine.wait_for_all()
        assert all(op.done() and op.exception() is None for ops in pushed for op in ops)
        check_start_order(programs, log, data)
        assert sum(v.version for v in vars_) == sum(map(len, programs))

    async def test_threads_and_loop_share_vars(self, engine: ae.Engine) -> None:
        programs = [generate(random.Random(f"mixed{w}"), 400) for w in range(3)]
        data = [1.0] * N_VARS
        log = StartLog()
        vars_ = [engine.new_var(f"v{i}") for i in range(N_VARS)]
        await engine.wait_for_all()
        threads = [
            asyncio.to_thread(push_program, engine, vars_, p, w, log, data)
            for w, p in enumerate(programs[1:], start=1)
        ]

        async def from_loop() -> list[ae.Operation[None]]:
            ops = []
            for i, wl in enumerate(programs[0]):
                const, mutate = var_lists(wl, vars_)
                ops.append(engine.push_sync(log.body((0, i), wl, data), ae.cpu(), const, mutate))
                if i % 50 == 0:
                    await asyncio.sleep(0)  # let the threads' pushes interleave with ours
            return ops

        pushed = await asyncio.gather(from_loop(), *threads)
        async with asyncio.timeout(60):  # a deadlock fails here, not at pytest's timeout
            await engine.wait_for_all()
        assert all(op.done() and op.exception() is None for ops in pushed for op in ops)
        check_start_order(programs, log, data)

    @pytest.mark.parametrize(
        "mode",
        [
            pytest.param("write-write", id="both-mutate"),
            pytest.param("read-write", id="read-mutate"),
        ],
    )
    async def test_opposite_order_pushes_never_deadlock(
        self, engine: ae.Engine, monitor: Any, mode: str
    ) -> None:
        """MXNet 1.9.1 deadlocks here: each push is atomic across its Vars, so no cycle."""
        a, b = engine.new_var("a"), engine.new_var("b")
        n = 1500
        counts = {"a": 0, "b": 0}
        await engine.wait_for_all()

        def pusher(first: ae.Var, second: ae.Var) -> list[ae.Operation[None]]:
            const: tuple[ae.Var, ...]
            mutate: tuple[ae.Var, ...]
            if mode == "write-write":
                const, mutate = (), (first, second)
            else:
                const, mutate = (first,), (second,)
            reads = tuple(v.name for v in const)
            writes = tuple(v.name for v in mutate)

            def fn(rctx: ae.RunContext) -> None:
                monitor.enter(f"{first.name}{second.name}", reads, writes)
                for name in writes:
                    counts[name] += 1
                monitor.exit(reads, writes)

            return [engine.push_sync(fn, ae.cpu(), list(const), list(mutate)) for _ in range(n)]

        pushed = await asyncio.gather(
            asyncio.to_thread(pusher, a, b), asyncio.to_thread(pusher, b, a)
        )
        async with asyncio.timeout(60):  # a deadlock fails here, not at pytest's timeout
            await engine.wait_for_all()
        assert all(op.done() and op.exception() is None for ops in pushed for op in ops)
        assert monitor.violations == []
        if mode == "write-write":
            assert counts == {"a": 2 * n, "b": 2 * n}
            assert (a.version, b.version) == (2 * n, 2 * n)
        else:
            assert counts == {"a": n, "b": n}
            assert (a.version, b.version) == (n, n)
