"""Live operations and Python's cycle collector (collector.py).

The compiled core takes a pushed operation out of the cycle collector until it completes.
In both builds, garbage is still freed: a completed operation in a reference cycle, and an
engine dropped with operations that can never finish. Compiled, these tests also pin which
objects are hidden, and when they come back.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
import weakref
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import pytest

import aioengine as ae

from .conftest import COMPILED

compiled_only = pytest.mark.skipif(not COMPILED, reason="the pure-Python engine hides nothing")


async def test_a_completed_operation_in_a_cycle_is_collected(engine: ae.Engine) -> None:
    def push() -> ae.Operation[list[Any]]:
        box: list[Any] = []
        op = engine.push_sync(lambda r: box, mutate_vars=[engine.new_var("x")])
        box.append(op)  # op -> its result -> box -> op
        return op

    op = push()
    assert (await op)[0] is op
    ref = weakref.ref(op)
    del op
    gc.collect()
    assert ref() is None


async def test_a_failed_operation_in_a_cycle_is_collected(engine: ae.Engine) -> None:
    """A failure's traceback holds the frame that raised it, whose locals hold the operation."""
    x = engine.new_var("x")

    def push() -> ae.Operation[None]:
        holder: list[Any] = []

        def fail(r: ae.RunContext) -> None:
            me = holder[0]  # a local of the frame that the traceback keeps
            raise ValueError(me.name)

        op = engine.push_sync(fail, mutate_vars=[x], name="fail")
        holder.append(op)
        return op

    op = push()
    with pytest.raises(ValueError, match="fail"):
        await op
    ref = weakref.ref(op)
    del op
    with pytest.raises(ValueError, match="fail"):
        await engine.wait_for_var(x)  # the failure stays on x until thrown
    gc.collect()
    assert ref() is None


async def test_an_engine_dropped_with_stuck_operations_is_collected_and_warns() -> None:
    """Its operations wait on one that never completes: garbage, found by a full collection."""
    before = set(threading.enumerate())

    async def abandon() -> weakref.ref[ae.Engine]:
        engine = ae.Engine(cpu_workers=1)
        x = engine.new_var("x")
        started = threading.Event()
        tokens: list[ae.OnComplete] = []  # never called: its operation never completes

        def stuck(r: ae.RunContext, done: ae.OnComplete) -> None:
            tokens.append(done)
            started.set()

        engine.push_async(stuck, mutate_vars=[x])
        for _ in range(3):
            engine.push_sync(lambda r: None, const_vars=[x], mutate_vars=[engine.new_var("y")])
        assert await asyncio.to_thread(started.wait, 10)
        return weakref.ref(engine)

    ref = await abandon()
    threads = [t for t in set(threading.enumerate()) - before if t.name.startswith("aioengine")]
    assert threads
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert ref() is None
    found = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert len(found) == 1
    assert "pending=4" in str(found[0].message)
    for t in threads:
        await asyncio.to_thread(t.join, 10)
    assert not any(t.is_alive() for t in threads)


Held = tuple[ae.Engine, ae.Var, ae.Var, Callable[[], None]]


@pytest.fixture
async def held() -> AsyncIterator[Held]:
    """An engine, a Var ``x`` that an operation mutates until ``release()`` (or the end of
    the test), and a free Var ``y``."""
    started = threading.Event()
    tokens: list[ae.OnComplete] = []

    def hold(r: ae.RunContext, done: ae.OnComplete) -> None:
        tokens.append(done)
        started.set()

    def release() -> None:
        if tokens:
            tokens.pop()()

    async with ae.Engine(cpu_workers=1) as engine:
        x, y = engine.new_var("x"), engine.new_var("y")
        engine.push_async(hold, mutate_vars=[x])
        assert await asyncio.to_thread(started.wait, 10)
        try:
            yield engine, x, y, release
        finally:
            release()  # a failed assertion must not leave the engine's close waiting


@compiled_only
async def test_a_pending_operation_is_hidden_until_it_completes(held: Held) -> None:
    engine, x, y, release = held
    both = engine.push_sync(lambda r: 1, const_vars=[y], mutate_vars=[x])
    own = both._vars  # built by the push: reads, then writes
    mine = (x,)
    writes = engine.push_sync(lambda r: 2, mutate_vars=mine)
    assert writes._vars is mine
    assert not gc.is_tracked(both)
    assert not gc.is_tracked(own)
    assert not gc.is_tracked(writes)
    assert gc.is_tracked(mine)  # the caller's tuple is never hidden
    release()
    assert await both == 1
    assert await writes == 2
    assert gc.is_tracked(both)
    assert gc.is_tracked(own)
    assert gc.is_tracked(writes)
    assert gc.is_tracked(mine)


@compiled_only
async def test_a_full_collection_shows_live_operations_and_a_young_one_does_not(
    held: Held,
) -> None:
    engine, x, y, release = held
    op = engine.push_sync(lambda r: 3, const_vars=[y], mutate_vars=[x])
    gc.collect(0)
    assert not gc.is_tracked(op)
    gc.collect()
    assert gc.is_tracked(op)
    assert gc.is_tracked(op._vars)
    release()
    assert await op == 3  # shown already: completing it tracks nothing twice
    assert gc.is_tracked(op)


async def test_full_collections_on_another_thread_while_operations_run(serial: bool) -> None:
    """Tracking an object twice is a fatal error: completions on worker threads and the
    hook before each full collection must never both track one operation."""
    stop = threading.Event()

    def collect() -> None:
        while not stop.is_set():
            gc.collect()

    n_vars, n_ops = 8, 3000
    counts = [0] * n_vars

    def bump(k: int, r: ae.RunContext) -> int:
        counts[k] += 1
        return counts[k]

    collector = threading.Thread(target=collect, name="collector")
    collector.start()
    try:
        async with ae.Engine(cpu_workers=2, serial=serial) as engine:
            vs = [engine.new_var(f"v{k}") for k in range(n_vars)]
            ops = [
                engine.push_sync(
                    partial(bump, i % n_vars),
                    const_vars=[vs[(i + 1) % n_vars]],
                    mutate_vars=[vs[i % n_vars]],
                )
                for i in range(n_ops)
            ]
            await engine.wait_for_all()
    finally:
        stop.set()
        await asyncio.to_thread(collector.join, 30)
    # Each Var's writers ran one at a time, in push order.
    assert [op.result() for op in ops] == [i // n_vars + 1 for i in range(n_ops)]
    assert all(gc.is_tracked(op) for op in ops)
