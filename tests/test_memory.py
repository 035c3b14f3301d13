"""Memory: the engine keeps nothing of finished work, and a pending operation is small.

* No growth: after a warm-up, tens of thousands of operations (every kind, with failures,
  skips, cancellations and deleted Vars) leave the traced memory where it was.
* Freed: Vars deleted while they carry a failure, and skipped and cancelled operations, are
  garbage (weakrefs die); MXNet leaks the memory of deleted Vars that carry an error.
  (Completed and failed operations and plain deleted Vars: ``test_delete.py``.)
* Pending cost: 100,000 operations queued behind a blocker cost at most 1 KiB each, and all of
  it is returned once they have run.

tracemalloc makes allocation slow, so these run on the default loop only.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

import aioengine as ae

from .helpers import Boom

ONE_LOOP = pytest.mark.asyncio(loop_factories=["asyncio"])


def noop(rctx: ae.RunContext) -> None:
    """A sync fn."""


async def anoop(rctx: ae.RunContext) -> None:
    """A coroutine fn."""


def cbnoop(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
    """A callback-style fn."""
    on_complete()


def boom(rctx: ae.RunContext) -> None:
    raise Boom("boom")


@pytest.fixture
def traced() -> Iterator[None]:
    """Trace allocations (the tests turn the loop's debug mode off: its stacks dominate)."""
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def traced_now() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


async def batch(engine: ae.Engine, vars_: list[ae.Var], handle: ae.OprHandle[Any], i: int) -> None:
    """1,000 ops of every kind on rotating Vars, one failure, one cancel, one deleted Var."""
    n = len(vars_)
    for j in range(250):
        a, b = vars_[(i + j) % n], vars_[(i + 3 * j + 1) % n]
        engine.push_sync(noop, const_vars=[a], mutate_vars=[b])
        engine.push_async(anoop, const_vars=[b], mutate_vars=[a])
        engine.push_async(cbnoop, const_vars=[a, b])
        engine.push(handle)
    engine.push_sync(boom, mutate_vars=[vars_[0]])
    engine.push_sync(noop, const_vars=[vars_[0]], mutate_vars=[vars_[1]]).cancel()
    engine.delete_var(vars_[2])
    vars_[2] = engine.new_var()
    with pytest.raises(ExceptionGroup):
        await engine.wait_for_all()


class TestNoGrowth:
    @ONE_LOOP
    @pytest.mark.timeout(300)  # tracemalloc slows every allocation ~10x
    # Run without coverage's tracer (pytest-cov's marker), which more than doubled its time
    # in CI; the push and run paths it drives are measured by the rest of the suite.
    @pytest.mark.no_cover
    async def test_many_ops_leave_traced_memory_flat(
        self, threaded_engine: ae.Engine, traced: None
    ) -> None:
        asyncio.get_running_loop().set_debug(False)
        engine = threaded_engine
        vars_ = [engine.new_var(f"v{i}") for i in range(16)]
        handle = engine.new_operator(noop, [vars_[3]], [vars_[4]])
        for i in range(10):  # warm-up: pools, caches, interned names
            await batch(engine, vars_, handle, i)
        before = traced_now()
        for i in range(25):  # 25,000 operations (the benchmark runs 1,000,000 and checks RSS)
            await batch(engine, vars_, handle, i)
        growth = traced_now() - before
        assert growth < 64 * 1024, f"grew {growth} bytes over 25,000 operations"


class TestFreed:
    """Finished, skipped and cancelled ops and deleted Vars are garbage, failures or not."""

    @pytest.mark.parametrize("thrown", [False, True], ids=["failure-unthrown", "failure-thrown"])
    async def test_deleted_var_carrying_a_failure(self, engine: ae.Engine, thrown: bool) -> None:
        x = engine.new_var("x")
        ref = weakref.ref(x)
        failing = engine.push_sync(boom, mutate_vars=[x])
        skipped = engine.push_sync(noop, const_vars=[x], mutate_vars=[x])
        deleted = engine.delete_var(x)
        op_refs = [weakref.ref(failing), weakref.ref(skipped), weakref.ref(deleted)]
        await deleted
        assert isinstance(skipped.exception(), ae.DependencyError)
        del x, failing, skipped, deleted
        if thrown:
            with pytest.raises(ExceptionGroup):
                await engine.wait_for_all()
        await asyncio.sleep(0)
        gc.collect()
        assert ref() is None, "a deleted Var carrying a failure is still referenced"
        assert [r() for r in op_refs] == [None, None, None]
        if not thrown:  # the failure itself stays recorded until thrown
            with pytest.raises(ExceptionGroup) as info:
                await engine.wait_for_all()
            assert [str(e) for e in info.value.exceptions] == ["boom"]

    async def test_cancelled_op_and_its_fn(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        gate = asyncio.Event()

        async def block(rctx: ae.RunContext) -> None:
            await gate.wait()

        class Payload:
            pass

        payload = Payload()
        payload_ref = weakref.ref(payload)
        blocker = engine.push_async(block, mutate_vars=[x])
        op = engine.push_sync(lambda r, p=payload: p, mutate_vars=[x])
        op_ref = weakref.ref(op)
        assert op.cancel()
        del op, payload
        gate.set()
        await blocker
        await asyncio.sleep(0)
        gc.collect()
        assert op_ref() is None
        assert payload_ref() is None, "a cancelled op's fn is still referenced"


class TestPendingCost:
    @ONE_LOOP
    @pytest.mark.timeout(300)  # tracemalloc (and coverage) slow every allocation ~10x
    async def test_pending_ops_cost_at_most_1_kib_each(self, threaded_engine: ae.Engine) -> None:
        asyncio.get_running_loop().set_debug(False)
        engine = threaded_engine
        x = engine.new_var("x")
        vars_ = [engine.new_var(f"v{i}") for i in range(8)]
        gate = asyncio.Event()

        async def block(rctx: ae.RunContext) -> None:
            await gate.wait()

        await engine.push_sync(noop, mutate_vars=[x])  # warm-up: the pool exists
        blocker = engine.push_async(block, mutate_vars=[x])
        n = 40_000  # the benchmark measures 100,000; the cost per op does not depend on n
        samples: list[weakref.ref[ae.Operation[None]]] = []
        tracemalloc.start()
        try:
            before = traced_now()
            for i in range(n):  # each op waits on x and names one more Var
                op = engine.push_sync(noop, const_vars=[x], mutate_vars=[vars_[i % 8]])
                if i % 1000 == 0:
                    samples.append(weakref.ref(op))
            del op
            per_op = (traced_now() - before) / n
        finally:
            tracemalloc.stop()
        assert engine.pending == n + 1
        assert per_op <= 1024, f"a pending operation costs {per_op:.0f} bytes"
        gate.set()
        await blocker
        await engine.wait_for_all()
        gc.collect()
        assert [r() for r in samples] == [None] * len(samples), "finished ops are kept"
