"""GPU arrays on the simulated device: work enqueued on the streams, fused chains, ordering.

On ``ae.SimulatedGPU`` an array operation does on its GPU worker what a CuPy call does (the
result allocated at once) and launches its computation on the operation's stream; copies go to
the h2d and d2h streams (``aioengine/array/_kernel.py``). The device runs the streams' items in
a random order, so these tests check what users rely on: the values are NumPy's whatever the
streams' interleaving (cross-stream reads after writes, writes after reads, writes after
writes), the streams did run the work, a chain of elementwise operations is one kernel, and a
failure found on the device is the array's, not the device's. The random-program test bites:
without the engine's cross-stream waits, some programs go wrong.
"""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import numpy as np
import pytest

import aioengine as ae
import aioengine.array as aa

from .helpers import until

GPU0 = ae.gpu(0)
N = 130  # (N, N) float64 is above INLINE_COST: elementwise operations on it are fused chains


class HeldGpuWorkers:
    """GPU operations that keep ``n`` compute workers busy (enqueuing nothing) until
    :meth:`release`: nothing queued behind them starts before (a synchronisation, not a
    sleep)."""

    def __init__(self, engine: ae.Engine, n: int) -> None:
        self.event = threading.Event()
        self.ops = [
            engine.push_sync(lambda r: self.event.wait(30), GPU0, name="hold") for _ in range(n)
        ]

    async def release(self) -> None:
        self.event.set()
        for op in self.ops:
            await op


def kernels(sim: ae.SimulatedGPU, family: ae.StreamFamily) -> int:
    """The kernels the device ran on the streams of ``family``."""
    return sum(s.kernels for s in sim.streams if s.family is family)


async def drive(engine: ae.Engine, sim: ae.SimulatedGPU, rng: random.Random) -> None:
    """Step a manual device a few random items at a time until the engine is idle."""
    while engine.pending:
        sim.step(rng.randint(1, 3))
        await asyncio.sleep(0)
        if not sim.queued:
            await asyncio.sleep(0.001)


def values(seed: int, shape: tuple[int, ...] = (N, N)) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).random(shape)


# -- work on the streams ----------------------------------------------------------------------


async def test_array_work_and_copies_run_on_the_streams() -> None:
    sim = ae.SimulatedGPU(seed=3)
    async with ae.Engine(cpu_workers=2, gpu_backend=sim) as engine:
        xp = aa.namespace(engine)
        an = values(0, (4, 5))
        a = xp.asarray(an).to_device(GPU0)  # one h2d copy
        y = xp.sin(a) * 2 + a.T.T  # three operations on the compute stream
        s = xp.sum(y, axis=0)
        back = s.to_device(ae.cpu())  # one d2h copy
        np.testing.assert_allclose(await back, np.sum(np.sin(an) * 2 + an, axis=0))
        assert kernels(sim, ae.StreamFamily.H2D) == 1
        assert kernels(sim, ae.StreamFamily.D2H) == 1
        assert kernels(sim, ae.StreamFamily.COMPUTE) == 4
        assert not sim.error_causes


async def test_an_operation_returns_once_enqueued_and_its_value_waits_for_the_device() -> None:
    sim = ae.SimulatedGPU(seed=1, manual=True)
    async with ae.Engine(cpu_workers=2, gpu_backend=sim) as engine:
        xp = aa.namespace(engine)
        a = xp.ones((3, 3), device=GPU0)
        b = a + 1
        c = b * b
        reading = asyncio.ensure_future(_value(c))
        # Both operations get enqueued (each waits for nothing but the one before it on its
        # stream), but nothing is computed before the device runs it.
        await until(lambda: sim.queued == 3)
        assert not c.ready
        assert not reading.done()
        sim.run_until_idle()
        np.testing.assert_array_equal(await reading, np.full((3, 3), 4.0))
        assert kernels(sim, ae.StreamFamily.COMPUTE) == 3


async def _value(x: Any) -> Any:
    return await x


async def test_a_chain_of_gpu_operations_is_one_kernel_and_equals_numpy() -> None:
    sim = ae.SimulatedGPU(seed=2)
    async with ae.Engine(cpu_workers=2, gpu_backend=sim, gpu_workers=2) as engine:
        xp = aa.namespace(engine)
        an, bn = values(1), values(2)
        a, b = xp.asarray(an).to_device(GPU0), xp.asarray(bn).to_device(GPU0)
        await a
        await b
        before = kernels(sim, ae.StreamFamily.COMPUTE)
        held = HeldGpuWorkers(engine, 2)  # the chain's kernel waits: every step joins it
        c = a * 1.5 + b
        c = c * c - a
        d = xp.sin(c) / (b + 1.0)
        await held.release()
        cn = an * 1.5 + bn
        cn = cn * cn - an
        np.testing.assert_array_equal(await c, cn)
        np.testing.assert_array_equal(await d, np.sin(cn) / (bn + 1.0))
        assert kernels(sim, ae.StreamFamily.COMPUTE) - before == 1  # seven operations
        # Small arrays are not chained: one kernel per operation.
        e = xp.ones(8, device=GPU0) * 2 + 1
        await e
        assert kernels(sim, ae.StreamFamily.COMPUTE) - before == 4


async def test_a_data_dependent_shape_waits_for_its_stream() -> None:
    sim = ae.SimulatedGPU(seed=4, manual=True)
    async with ae.Engine(cpu_workers=2, gpu_backend=sim, gpu_workers=2) as engine:
        xp = aa.namespace(engine)
        an = values(3, (6, 7))
        a = xp.asarray(an).to_device(GPU0)
        rows, cols = xp.nonzero(a > 0.5)
        picked = a[a > 0.5] * 10
        total = xp.sum(rows + cols)
        await asyncio.wait_for(drive(engine, sim, random.Random(4)), 30)
        nr, nc = np.nonzero(an > 0.5)
        np.testing.assert_array_equal(await rows, nr)
        np.testing.assert_array_equal(await cols, nc)
        np.testing.assert_array_equal(await picked, an[an > 0.5] * 10)
        assert int(await total) == int(np.sum(nr + nc))


# -- failures ---------------------------------------------------------------------------------


async def test_a_failure_found_on_the_device_is_the_arrays_not_the_devices() -> None:
    sim = ae.SimulatedGPU(seed=5)
    async with ae.Engine(cpu_workers=2, gpu_backend=sim) as engine:
        xp = aa.namespace(engine)
        bad = xp.linalg.inv(xp.zeros((N, N), device=GPU0))  # found only when computed
        small = bad[:2, :2] + 1  # an operation reading it
        chained = bad * 2 + 1  # a fused chain reading it
        with pytest.raises(np.linalg.LinAlgError) as ei:
            await bad
        for dependent in (small, chained):
            with pytest.raises(ae.DependencyError) as d:
                await dependent
            assert d.value.__cause__ is ei.value
        await engine.wait_for_all()  # reported once, by the await
        assert not sim.error_causes  # the device works on
        np.testing.assert_array_equal(await (xp.ones(3, device=GPU0) + 1), [2.0, 2.0, 2.0])


async def test_an_unawaited_failure_on_the_device_is_reported_at_close() -> None:
    sim = ae.SimulatedGPU(seed=6, manual=True)
    engine = ae.Engine(cpu_workers=2, gpu_backend=sim)
    xp = aa.namespace(engine)
    xp.linalg.inv(xp.zeros((2, 2), device=GPU0))
    await until(lambda: sim.queued == 2)  # the zeros, then the inverse
    sim.run_until_idle()
    with pytest.raises(ExceptionGroup) as eg:
        await engine.aclose()
    assert eg.group_contains(np.linalg.LinAlgError)
    assert not sim.error_causes


async def test_a_failure_found_on_the_device_while_closing_is_logged_and_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = ae.SimulatedGPU(seed=6, manual=True)
    engine = ae.Engine(cpu_workers=2, gpu_backend=sim)
    xp = aa.namespace(engine)
    bad = xp.linalg.inv(xp.zeros((2, 2), device=GPU0))
    await until(lambda: sim.queued == 2)
    closing = asyncio.ensure_future(engine.aclose())
    await until(lambda: engine._core.state.value != "open")
    sim.run_until_idle()  # the inverse fails now: no push can carry it into the engine
    await closing
    assert "linalg.inv" in caplog.text
    assert "LinAlgError" in caplog.text
    with pytest.raises(np.linalg.LinAlgError):
        await bad  # a ready array stays readable after the close


# -- ordering: random programs against NumPy ------------------------------------------------

OPS = ("add", "chain", "unary", "iadd", "setitem", "view", "sum", "roundtrip", "nonzero", "await")


def program(seed: int, length: int) -> list[tuple[Any, ...]]:
    """A random program over a pool of (N, N) GPU arrays: steps that read and write them
    (in place, through views), copy them to the CPU and back, reduce them, and read one
    with ``await`` mid-way (its next write then copies first)."""
    rng = random.Random(seed)
    steps: list[tuple[Any, ...]] = []
    pool = 3
    for _ in range(length):
        op = rng.choice(OPS)
        i, j = rng.randrange(pool), rng.randrange(pool)
        k = rng.randint(1, 4)
        steps.append((op, i, j, k))
        if op in ("add", "chain", "unary", "view", "roundtrip"):
            pool += 1
    return steps


async def run_program(steps: list[tuple[Any, ...]], xp: Any, pool: list[Any]) -> list[Any]:
    """Run ``steps`` with namespace ``xp`` (ours or NumPy) on ``pool`` (updated in place);
    return the results of the reductions, data-dependent steps and reads."""
    out = []
    gpu = xp is not np
    for op, i, j, k in steps:
        x, y = pool[i], pool[j]
        if op == "add":
            pool.append(x + y * k)
        elif op == "chain":
            z = x * 1.5 + y
            pool.append(z * z - x / k)
        elif op == "unary":
            pool.append(xp.sin(x) + xp.exp(-y))
        elif op == "iadd":
            x += y * 0.5  # through a view if x is one
        elif op == "setitem":
            x[k : k + 40] = y[k : k + 40]
        elif op == "view":
            pool.append(x.T if k % 2 else x[::-1])
        elif op == "sum":
            out.append(xp.sum(x))
        elif op == "roundtrip":
            host = x.to_device(ae.cpu()) if gpu else x.copy()
            host = host * 2.0 - 1.0
            pool.append(host.to_device(GPU0) if gpu else host)
        elif op == "nonzero":
            out.append(xp.nonzero(x > 0.75)[1])
        else:
            out.append(np.array(await x) if gpu else x.copy())
    return out


async def run_on_gpu(
    steps: list[tuple[Any, ...]], seed: int, *, sync: str = "event", skip_waits: bool = False
) -> tuple[list[np.ndarray[Any, Any]], list[np.ndarray[Any, Any]]]:
    sim = ae.SimulatedGPU(seed=seed, manual=True)
    engine = ae.Engine(cpu_workers=2, gpu_backend=sim, gpu_workers=2, gpu_sync=sync)
    rng = random.Random(seed)
    building = True

    async def step_while_building() -> None:  # the device runs while the program is pushed
        while building:
            sim.step(rng.randint(0, 2))
            await asyncio.sleep(0.0005)

    stepper = asyncio.ensure_future(step_while_building())
    try:
        if skip_waits:  # drop the cross-stream waits (a broken engine: the test must bite)
            await engine.push_sync(lambda r: None, GPU0)
            assert engine._core.gpu is not None
            engine._core.gpu.skip_waits = True
        xp = aa.namespace(engine)
        pool = [xp.asarray(values(seed * 10 + n)).to_device(GPU0) for n in range(3)]
        out = await asyncio.wait_for(run_program(steps, xp, pool), 60)
        building = False
        await stepper
        await asyncio.wait_for(drive(engine, sim, rng), 60)
        got = [np.asarray(await a) for a in pool], [await read(r) for r in out]
    finally:
        building = False
        await stepper
        sim.fail(0)  # nothing may hang at close: whatever is still queued fails
        try:
            await engine.aclose(cancel=True, timeout=10)
        except BaseExceptionGroup:
            pass
    return got


async def read(x: Any) -> np.ndarray[Any, Any]:
    """``x``'s value: awaited if it is an engine array (a step's result already read is
    NumPy's)."""
    return x if isinstance(x, np.ndarray) else np.asarray(await x)


async def expected(
    steps: list[tuple[Any, ...]], seed: int
) -> tuple[list[np.ndarray[Any, Any]], list[np.ndarray[Any, Any]]]:
    pool = [values(seed * 10 + n) for n in range(3)]
    out = await run_program(steps, np, pool)
    return pool, [np.asarray(r) for r in out]


def same(
    got: tuple[list[np.ndarray[Any, Any]], list[np.ndarray[Any, Any]]],
    want: tuple[list[np.ndarray[Any, Any]], list[np.ndarray[Any, Any]]],
) -> bool:
    return all(
        a.shape == b.shape and np.allclose(a, b, rtol=1e-12, atol=0, equal_nan=True)
        for a, b in zip(got[0] + got[1], want[0] + want[1], strict=True)
    )


@pytest.mark.parametrize("seed", range(10))
async def test_random_gpu_array_programs_equal_numpy(seed: int) -> None:
    steps = program(seed, 16)
    want = await expected(steps, seed)
    assert same(await run_on_gpu(steps, seed), want)
    assert same(await run_on_gpu(steps, seed, sync="host"), want)


async def test_random_gpu_array_programs_without_the_waits_go_wrong() -> None:
    """The test above bites: drop the engine's cross-stream waits and some programs go
    wrong (a reader's work runs before the writer's on another stream, or a write before a
    read)."""
    wrong = 0
    for seed in range(100, 108):
        steps = program(seed, 16)
        want = await expected(steps, seed)
        assert same(await run_on_gpu(steps, seed), want)
        try:
            broken = await run_on_gpu(steps, seed, skip_waits=True)
        except Exception:  # garbage read as input may fail a step outright (exp overflows)
            wrong += 1
            continue
        wrong += not same(broken, want)
    assert wrong > 0
