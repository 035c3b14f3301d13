"""Chunks and fused chains (``aioengine/array/_chain.py``): a large elementwise operation runs
one kernel per chunk, each chunk with a Var of its own, and later elementwise operations join a
chunk's kernel while it has not started.

What a user relies on: the values are NumPy's (exactly, for these operations), whatever joined
what; a write pushed between two operations is seen by the second; a raw push on ``x.var``, a
view across chunks, an in-place write, ``await`` in the middle and a failing step behave as
unfused operations do; results nobody holds are not allocated. The namespaces here use small
chunks (``chunk_bytes``) so that arrays of a few tens of thousands of elements have many.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import threading
import time
import tracemalloc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioengine as ae
import aioengine.array as aa
from aioengine.array import _burst, _push
from aioengine.array._array import buffer_of
from aioengine.array._burst import WAKER

from .helpers import Pushes, chain, until

N = 5 * 8192 + 17  # 5 chunks of 8,192 elements and a short one, above the inline threshold
CHUNK = 8192 * 8
assert N > _push.INLINE_COST


def rng_values(seed: int, n: int = N) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n), rng.standard_normal(n)


class HeldWorkers:
    """Operations that keep ``n`` CPU workers busy until :meth:`release`: nothing queued
    behind them starts before (a synchronisation, not a sleep)."""

    def __init__(self, engine: ae.Engine, n: int) -> None:
        self.event = threading.Event()
        self.ops = [engine.push_sync(lambda r: self.event.wait(30), name="hold") for _ in range(n)]

    async def release(self) -> None:
        self.event.set()
        for op in self.ops:
            await op


def arrays(xp: Any, *values: np.ndarray[Any, Any]) -> list[Any]:
    """Engine arrays of copies of ``values`` (in-place writes must not change the originals)."""
    return [xp.asarray(v.copy()) for v in values]


async def computed(xp: Any, *values: np.ndarray[Any, Any]) -> list[Any]:
    """:func:`arrays`, each awaited: inputs already computed when the test's chain is pushed."""
    made = arrays(xp, *values)
    for x in made:
        await x
    return made


async def test_a_chain_is_chunked_and_equals_numpy_exactly() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, bn = rng_values(0)
        a, b = arrays(xp, an, bn)
        c = chain(xp, a, b)
        assert len(aa._array.buffer_of(c).vars) == 6  # one Var per chunk
        np.testing.assert_array_equal(await c, chain(np, an, bn))


async def test_awaiting_a_chain_of_one_chunk_computes_it_on_the_loop_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller waits anyway: its kernel runs where it waits, without the hand-offs to a
    worker and back. A chain of several chunks is the workers'; a kernel a worker took
    already is left to it; the values are NumPy's in every case."""
    from aioengine.array import _chain

    ran: list[tuple[int, int]] = []  # (chunks of the program, the thread)
    call = _chain.ChainKernel.__call__

    def recorded(self: Any, rctx: ae.RunContext) -> None:
        ran.append((self.program.n, threading.get_ident()))
        call(self, rctx)

    monkeypatch.setattr(_chain.ChainKernel, "__call__", recorded)
    loop_thread = threading.get_ident()
    an, bn = rng_values(2, 2 * _push.INLINE_COST)  # one chunk of the default chunk_bytes
    async with ae.Engine(cpu_workers=2) as engine:
        xp1 = aa.namespace(engine)
        a, b = await computed(xp1, an, bn)
        workers = HeldWorkers(engine, 2)  # (so that no worker could take a kernel first)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(ticker())
        with Pushes(engine) as pushes:
            for _ in range(3):
                np.testing.assert_array_equal(await chain(xp1, a, b), chain(np, an, bn))
        assert ran == [(1, loop_thread)] * 3
        assert "await" not in pushes.names  # computed here: read without pushing a read
        assert ticks >= 3  # each await let the loop's other tasks run, as a push's would
        other.cancel()
        await workers.release()

        ran.clear()
        workers = HeldWorkers(engine, 1)  # a kernel the other worker takes first is its
        c = chain(xp1, a, b)
        await until(lambda: len(ran) == 1)
        await workers.release()
        np.testing.assert_array_equal(await c, chain(np, an, bn))
        assert ran[0][1] != loop_thread

    ran.clear()
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        a2, b2 = await computed(xp, *rng_values(3))
        np.testing.assert_array_equal(await chain(xp, a2, b2), chain(np, *rng_values(3)))
        assert len(ran) == 6
        assert all(n == 6 and thread != loop_thread for n, thread in ran)


def _kernel_threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The threads chunk kernels run on from now on (the list fills as they run)."""
    from aioengine.array import _chain

    ran: list[int] = []
    call = _chain.ChainKernel.__call__

    def recorded(self: Any, rctx: ae.RunContext) -> None:
        ran.append(threading.get_ident())
        call(self, rctx)

    monkeypatch.setattr(_chain.ChainKernel, "__call__", recorded)
    return ran


async def test_awaiting_a_reduction_of_one_chunk_computes_its_kernel_on_the_loop_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``await xp.sum(a * b)`` of one chunk: the partials' kernel runs where the caller
    waits (both workers are held: nothing else could compute it), the combine and the read
    on the loop; NumPy's value, within rounding."""
    ran = _kernel_threads(monkeypatch)
    an, bn = rng_values(6, 2 * _push.INLINE_COST)
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine)
        a, b = await computed(xp, an, bn)
        workers = HeldWorkers(engine, 2)
        total = await asyncio.wait_for(xp.sum(a * b), 10)
        mean = await asyncio.wait_for(xp.mean((a - b) ** 2), 10)
        assert ran == [threading.get_ident()] * 2
        await workers.release()
    np.testing.assert_allclose(total, np.sum(an * bn), rtol=1e-12)
    np.testing.assert_allclose(mean, np.mean((an - bn) ** 2), rtol=1e-12)


async def test_a_reduction_result_dropped_unrun_is_freed_without_the_collector() -> None:
    """A reduction cancelled before its combine ran: its result's Buffer goes with the last
    reference to it (no reference cycle waits for ``gc``), as any array's."""
    an, bn = rng_values(8, 2 * _push.INLINE_COST)
    gc.disable()
    try:
        engine = ae.Engine(cpu_workers=2)
        xp = aa.namespace(engine)
        a, b = await computed(xp, an, bn)
        workers = HeldWorkers(engine, 2)
        s = xp.sum(a * b)
        held = weakref.ref(aa._array.buffer_of(s))
        await engine.aclose(cancel=True)
        workers.event.set()
        del s
        assert held() is None
    finally:
        gc.enable()


async def test_a_write_pushed_while_a_reduction_is_awaited_comes_after_the_read() -> None:
    """A task awaiting a reduction of one chunk (computed on the loop's thread) reads it
    before a write another task pushes once the await began: push order, as for any read."""
    an = np.ones(2 * _push.INLINE_COST)
    for chunk_bytes in (1 << 20, CHUNK):  # one chunk (computed here), several (workers)
        async with ae.Engine(cpu_workers=2) as engine:
            xp = aa.namespace(engine, chunk_bytes=chunk_bytes)
            (a,) = await computed(xp, an)
            s = xp.sum(a * 2.0)

            async def write(s: Any = s) -> None:
                s[...] = -1.0

            writer = asyncio.get_running_loop().create_task(write())
            got = float(await s)
            await writer
            assert got == 2.0 * an.size
            assert float(await s) == -1.0


@contextlib.contextmanager
def _held_blocking_engine(
    seed: int,
) -> Iterator[tuple[Any, Any, tuple[Any, Any], tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]]:
    """A BlockingEngine whose two workers are held until the block ends (nothing but the
    calling thread can compute a queued kernel), its namespace, and two computed arrays of
    one chunk (of the default ``chunk_bytes``) with their NumPy values."""
    an, bn = rng_values(seed, 2 * _push.INLINE_COST)
    hold = threading.Event()
    with ae.BlockingEngine(cpu_workers=2) as engine:
        xp = aa.namespace(engine)
        held = [engine.push_sync(lambda rctx: hold.wait(30), name="hold") for _ in range(2)]
        try:
            yield engine, xp, (xp.asarray(an), xp.asarray(bn)), (an, bn)
        finally:
            hold.set()
        assert all(op.result(10) for op in held)


def test_a_sync_point_on_a_chain_of_one_chunk_computes_it_on_the_callers_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Synchronous code reaching a sync point (``np.asarray``) on a chain of one chunk that
    no worker took computes it on its own thread, and reads it there."""
    ran = _kernel_threads(monkeypatch)
    with _held_blocking_engine(4) as (_, xp, (a, b), (an, bn)):
        for _ in range(3):
            np.testing.assert_array_equal(np.asarray(chain(xp, a, b)), chain(np, an, bn))
        assert ran == [threading.get_ident()] * 3


def test_a_sync_point_on_a_reduction_of_one_chunk_computes_its_kernel_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``float(xp.sum(a * b))`` in synchronous code, both workers held: the kernel runs on
    the caller's thread (the combine on the loop), and the value is NumPy's."""
    ran = _kernel_threads(monkeypatch)
    with _held_blocking_engine(7) as (_, xp, (a, b), (an, bn)):
        for _ in range(2):
            np.testing.assert_allclose(float(xp.sum(a * b)), np.sum(an * bn), rtol=1e-12)
    assert ran == [threading.get_ident()] * 2


@pytest.mark.parametrize("raised", [KeyboardInterrupt, MemoryError])
def test_a_kernel_that_raises_on_the_callers_thread_fails_its_chain_clearly(
    monkeypatch: pytest.MonkeyPatch, raised: type[BaseException]
) -> None:
    """A kernel run at a sync point on the caller's thread that raises as a whole (an
    interrupt in the user's code it calls; an allocation failing): an interrupt is raised
    there, and the chain's value is never read as if computed: every later read raises the
    failure, and other chains compute. (The interrupt stays in the engine's record, which
    ``wait_for_all()`` would raise.)"""
    from aioengine.array import _chain

    evaluate = _chain.ChainKernel._evaluate
    calls: list[bool] = []

    def interrupted(self: Any, *args: Any) -> None:
        if not calls:
            calls.append(True)
            raise raised("landed in the kernel")
        evaluate(self, *args)

    monkeypatch.setattr(_chain.ChainKernel, "_evaluate", interrupted)
    with _held_blocking_engine(5) as (_, xp, (a, b), (an, bn)):
        c = chain(xp, a, b)
        expected = KeyboardInterrupt if raised is KeyboardInterrupt else ae.DependencyError
        with pytest.raises(expected):
            np.asarray(c)
        for _ in range(2):
            with pytest.raises(ae.DependencyError):
                np.asarray(c)  # never the value of a chunk nobody computed
        np.testing.assert_array_equal(np.asarray(chain(xp, a, b)), chain(np, an, bn))


def test_the_synchronous_namespace_chunks_too() -> None:
    with ae.BlockingEngine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, bn = rng_values(1)
        c = chain(xp, xp.asarray(an), xp.asarray(bn))
        np.testing.assert_array_equal(np.asarray(c), chain(np, an, bn))


async def test_chunk_bytes_is_settable_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    async with ae.Engine() as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        assert xp.chunk_bytes == CHUNK
        assert aa.namespace(engine) is xp
        with pytest.raises(ValueError, match="chunk_bytes"):
            aa.namespace(engine, chunk_bytes=2 * CHUNK)
    async with ae.Engine() as engine:
        monkeypatch.setenv("AIOENGINE_ARRAY_CHUNK_BYTES", str(4 * CHUNK))
        assert aa.namespace(engine).chunk_bytes == 4 * CHUNK
    async with ae.Engine() as engine:
        monkeypatch.setenv("AIOENGINE_ARRAY_CHUNK_BYTES", "lots")
        with pytest.raises(ValueError, match="AIOENGINE_ARRAY_CHUNK_BYTES"):
            aa.namespace(engine)
    async with ae.Engine() as engine:
        monkeypatch.delenv("AIOENGINE_ARRAY_CHUNK_BYTES")
        with pytest.raises(ValueError, match="at least 8"):
            aa.namespace(engine, chunk_bytes=0)
        assert aa.namespace(engine).chunk_bytes == aa.CHUNK_BYTES


async def test_a_write_pushed_between_is_seen_by_what_follows() -> None:
    async with ae.Engine(cpu_workers=1) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, bn = rng_values(2)
        a, b = arrays(xp, an, bn)
        held = HeldWorkers(engine, 1)  # the only worker: nothing starts yet
        c1 = a + b
        a += 5.0  # a write on an input of c1's kernels, pushed before c2
        c2 = c1 * a  # must read a after the write: it may not join c1's kernels
        b[N // 2 :] = 0.0  # a write through a view straddling chunks
        c3 = c2 - b
        await held.release()
        an2 = an + 5.0
        bn2 = bn.copy()
        bn2[N // 2 :] = 0.0
        np.testing.assert_array_equal(await c1, an + bn)
        np.testing.assert_array_equal(await c2, (an + bn) * an2)
        np.testing.assert_array_equal(await c3, (an + bn) * an2 - bn2)


async def test_an_in_place_write_on_a_fused_result_is_ordered() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, bn = rng_values(3)
        a, b = arrays(xp, an, bn)
        c1 = a * 2.0
        c2 = c1 + b
        c1 += 1.0  # c2 was computed from c1 before this write
        c3 = c1 * 3.0  # and this after it
        np.testing.assert_array_equal(await c2, an * 2.0 + bn)
        np.testing.assert_array_equal(await c3, (an * 2.0 + 1.0) * 3.0)
        np.testing.assert_array_equal(await c1, an * 2.0 + 1.0)


async def test_a_raw_push_on_the_var_of_a_chunked_array_is_ordered() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, bn = rng_values(4)
        a, b = arrays(xp, an, bn)
        c = a + b
        seen: list[float] = []
        # Reading x.var orders the raw push after every chunk's write, and later array
        # operations after it.
        engine.push_sync(lambda r: seen.append(1.0), const_vars=[c.var])
        d = c * 2.0
        np.testing.assert_array_equal(await d, (an + bn) * 2.0)
        await engine.wait_for_all()
        assert seen == [1.0]


async def test_the_var_of_one_result_of_a_one_chunk_chain_goes_with_it_alone() -> None:
    """The results of a fused chain of one chunk share its kernel's Var: handing one's Var out
    (``b.var``) gives it a Var of its own, deleted when it goes, while the others go on."""
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine)
        an = np.arange(20_000.0)  # one chunk of the default size, above INLINE_COST
        a = xp.asarray(an)
        await a
        b = a * 2.0
        c = b + 1.0  # joins b's program: one kernel, one Var
        np.testing.assert_array_equal(await c, an * 2.0 + 1.0)
        seen: list[float] = []
        engine.push_sync(lambda r: seen.append(1.0), const_vars=[b.var])
        assert b.var is not c.var
        del b
        gc.collect()  # b's Var is deleted after the raw push
        np.testing.assert_array_equal(await (c * 3.0), (an * 2.0 + 1.0) * 3.0)
        await engine.wait_for_all()
        assert seen == [1.0]


async def test_await_in_the_middle_and_views_across_chunks() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, bn = rng_values(5)
        a, b = arrays(xp, an, bn)
        c = a - b
        first = await c
        d = c * c
        window = d[8000:20000]  # straddles two chunk boundaries
        total = xp.sum(d)
        np.testing.assert_array_equal(first, an - bn)
        np.testing.assert_array_equal(await window, ((an - bn) ** 2)[8000:20000])
        assert float(await total) == pytest.approx(float(np.sum((an - bn) ** 2)), rel=1e-12)
        c += 1.0  # what await returned never changes
        await c
        np.testing.assert_array_equal(first, an - bn)


async def test_a_failing_step_fails_its_dependents_only_and_is_raised_once() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x = xp.asarray(np.arange(N, dtype=np.int64) % 7)
        e = xp.asarray(-np.ones(N, dtype=np.int64))
        ok = x + 1
        bad = ok**e  # integers to negative integer powers: NumPy raises
        worse = bad + 1
        fine = ok * 2
        np.testing.assert_array_equal(await fine, (np.arange(N) % 7 + 1) * 2)
        with pytest.raises(ValueError, match="negative integer powers") as info:
            await bad
        assert any("pow" in note for note in getattr(info.value, "__notes__", []))
        with pytest.raises(ae.DependencyError):
            await worse
        np.testing.assert_array_equal(await ok, np.arange(N) % 7 + 1)
        await engine.wait_for_all()  # thrown by await already: not again


async def test_a_failure_nobody_awaits_is_reported_by_wait_for_all() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x = xp.asarray(np.ones(N, dtype=np.int64))
        bad = x ** xp.asarray(-np.ones(N, dtype=np.int64))
        with pytest.raises(ExceptionGroup) as info:
            await engine.wait_for_all()
        (only,) = info.value.exceptions  # once, not once per chunk
        assert isinstance(only, ValueError)
        assert "negative integer powers" in str(only)
        with pytest.raises(ValueError, match="negative integer powers"):
            await bad


async def test_results_nobody_holds_are_not_allocated() -> None:
    n = 2_000_000
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine)  # the default chunk size
        an, bn = rng_values(6, n)
        a, b = await computed(xp, an, bn)
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            c = chain(xp, a, b)
            value = await c
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        np.testing.assert_array_equal(value, chain(np, an, bn))
        # NumPy's own chain peaks at 3 results; the fused chain at the result and the
        # intermediates of the chunks that had started before the rest of it was pushed.
        assert peak < 2.5 * value.nbytes, peak / value.nbytes


async def test_a_step_after_some_chunks_started_makes_a_new_chain_ordered_after_them() -> None:
    # One worker held: the other runs the first chunks' kernels while the rest wait. A step
    # pushed then joins no chunk (its program has started): its own kernels read the earlier
    # results with a turn, on every chunk.
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, bn = rng_values(13)
        a, b = await computed(xp, an, bn)
        held = HeldWorkers(engine, 1)
        c = a * 1.5 + b
        cbuf = aa._array.buffer_of(c)
        program = cbuf.chunked.program
        # A probe that reads the first chunk runs once that chunk's kernel has (on the loop).
        await engine.push_sync(lambda r: None, const_vars=[cbuf.vars[0]], prop=ae.FnProperty.ASYNC)
        assert program.started
        d = c * c - a
        assert aa._array.buffer_of(d).chunked.program is not program
        await held.release()
        cn = an * 1.5 + bn
        np.testing.assert_array_equal(await d, cn * cn - an)
        np.testing.assert_array_equal(await c, cn)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # nan, inf and overflow are the point
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "complex128"])
async def test_powers_by_cheaper_functions_equal_numpys_power(dtype: str) -> None:
    # ``x ** 2``, ``x ** 0.5`` and ``x ** -1`` in a chain are computed by square, sqrt and
    # reciprocal where that gives the same bits (float32, float64): specials included.
    rng = np.random.default_rng(14)
    xn = (rng.standard_normal(N) * 10).astype(dtype)
    if dtype[0] in "fc":
        xn[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30]
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x = xp.asarray(xn)
        for c in (2, 2.0, 0.5, -1, -1.0, 3):
            if dtype == "int32" and c in (-1, 0.5, -1.0):
                continue
            got = await ((x + 0) ** c)
            with np.errstate(all="ignore"):
                want = np.power(xn + 0, c)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want, err_msg=f"{dtype} ** {c!r}")


async def test_a_chain_pushed_inside_an_operation_equals_numpy() -> None:
    # Inside an operation there is no burst: each chunk's kernel may start (and the other
    # worker run them all) while the chain's later steps are still being pushed.
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, bn = rng_values(15)
        a, b = await computed(xp, an, bn)

        def inside(rctx: ae.RunContext) -> Any:
            c = a * 1.5 + b
            for _ in range(12):
                c = c * 0.5 + a
            return c

        want = an * 1.5 + bn
        for _ in range(12):
            want = want * 0.5 + an
        for _ in range(20):
            c = await engine.push_sync(inside, name="inside")
            np.testing.assert_array_equal(await c, want)


async def test_steps_writing_over_an_operand_they_read_last_equal_numpy() -> None:
    # A step may write its result into the scratch block of an operand it reads for the last
    # time: ``c * c`` reads that block twice, a comparison or ``astype`` changes the dtype (no
    # reuse), ``where`` is no ufunc, and a broadcast row is read beside the block.
    def program(xp: Any, a: Any, b: Any, row: Any) -> Any:
        c = a * 1.5 + b
        c = c * c - a
        m = c > 0.5
        d = xp.where(m, c, -c) + row
        e = xp.astype(d * 100.0, xp.int64) % 7
        f = xp.astype(e, xp.float64) * d - xp.astype(xp.astype(b, xp.float32) * 2, xp.float64)
        return f * f + xp.sqrt(xp.abs(f))

    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, bn = rng_values(11, 8192 * 6)
        an, bn = an.reshape(-1, 64), bn.reshape(-1, 64)
        rown = np.linspace(-1.0, 1.0, 64)
        a, b, row = arrays(xp, an, bn, rown)
        for _ in range(3):  # the second and third runs take warm scratch blocks
            np.testing.assert_array_equal(await program(xp, a, b, row), program(np, an, bn, rown))


async def test_scratch_kept_between_kernels_is_bounded() -> None:
    # A program with many intermediates alive at once takes many scratch blocks; a worker keeps
    # only a few of them for the next kernel, and a second run allocates none anew.
    def program(xp: Any, a: Any, b: Any) -> Any:
        terms = [a * float(k) + b for k in range(16)]
        while len(terms) > 1:
            terms = [x * y - x for x, y in zip(terms[::2], terms[1::2], strict=True)]
        return terms[0]

    n = 1 << 20  # 8 chunks of the default size
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine)
        an, bn = rng_values(12, n)
        a, b = await computed(xp, an, bn)
        expected = program(np, an, bn)
        gc.collect()
        tracemalloc.start()
        try:
            np.testing.assert_array_equal(await program(xp, a, b), expected)
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0]
            np.testing.assert_array_equal(await program(xp, a, b), expected)
            gc.collect()
            again = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        scratch = aa._chain.SCRATCH_KEPT * aa._chain.SCRATCH_ELEMS * 8
        assert kept < 2 * scratch + (1 << 20), kept  # two workers' blocks, and some change
        assert again - kept < 1 << 20, again - kept


def test_a_chain_pushed_off_the_loop_fuses_before_its_kernels_start() -> None:
    # The synchronous namespace pushes from the caller's thread, which wakes the workers at
    # once: its kernels wait for the rest of the chain until the caller's sync point.
    n = 2_000_000
    with ae.BlockingEngine(cpu_workers=2) as engine:
        xp = aa.namespace(engine)
        an, bn = rng_values(16, n)
        a, b = arrays(xp, an, bn)
        np.asarray(a), np.asarray(b)
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            value = np.asarray(chain(xp, a, b))
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        np.testing.assert_array_equal(value, chain(np, an, bn))
        assert peak < 2.5 * value.nbytes, peak / value.nbytes


# -- random programs against NumPy -------------------------------------------------------------

_UNARY: dict[str, Callable[[Any, Any], Any]] = {
    "abs": lambda xp, x: xp.abs(x),
    "neg": lambda xp, x: -x,
    "sqrt_abs": lambda xp, x: xp.sqrt(xp.abs(x)),
    "square": lambda xp, x: x * x,
    "tanh": lambda xp, x: xp.tanh(x),
}
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "max": lambda x, y: x * (x > y) + y * (x <= y),
}


def _program(data: st.DataObject) -> list[tuple[Any, ...]]:
    steps = []
    for _ in range(data.draw(st.integers(4, 14), label="length")):
        kind = data.draw(
            st.sampled_from(["unary", "binary", "scalar", "inplace", "setitem", "await", "drop"])
        )
        i = data.draw(st.integers(0, 7))
        j = data.draw(st.integers(0, 7))
        name = data.draw(st.sampled_from(sorted(_UNARY if kind == "unary" else _BINARY)))
        lo = data.draw(st.integers(0, N - 1))
        hi = data.draw(st.integers(lo, N))
        s = data.draw(st.sampled_from([0.5, 1.25, -2.0]))
        steps.append((kind, i, j, name, lo, hi, s))
    return steps


async def _run(xp: Any, vals: list[Any], steps: list[tuple[Any, ...]], is_np: bool) -> list[Any]:
    held = list(vals)
    seen = []
    for kind, i, j, name, lo, hi, s in steps:
        x, y = held[i % len(held)], held[j % len(held)]
        if kind == "unary":
            held.append(_UNARY[name](xp, x))
        elif kind == "binary":
            held.append(_BINARY[name](x, y))
        elif kind == "scalar":
            held.append(_BINARY[name](x, s))
        elif kind == "inplace":
            x += s
        elif kind == "setitem":
            x[lo:hi] = s
        elif kind == "await":
            seen.append(np.array(x if is_np else await x))
        elif kind == "drop" and len(held) > 2:
            held.pop(i % len(held))
    for x in held:
        seen.append(np.array(x if is_np else await x))
    return seen


@pytest.mark.parametrize("mode", ["threaded", "serial"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
async def test_random_chunked_programs_equal_numpy(mode: str, data: st.DataObject) -> None:
    steps = _program(data)
    an, bn = rng_values(data.draw(st.integers(0, 3)))
    want = await _run(np, [an.copy(), bn.copy()], steps, True)
    async with ae.Engine(cpu_workers=2, serial=mode == "serial") as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        got = await _run(xp, arrays(xp, an, bn), steps, False)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, rtol=1e-13, atol=0, err_msg=f"value {k} of {steps}")


# -- reductions at the end of a chain -----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("sum", "float64"),
        ("sum", "int32"),
        ("sum", "bool"),
        ("prod", "float64"),
        ("mean", "float64"),
        ("mean", "float32"),
        ("mean", "int64"),
        ("max", "float64"),
        ("min", "int16"),
    ],
)
async def test_a_reduction_of_a_chain_equals_numpys(name: str, dtype: str) -> None:
    rng = np.random.default_rng(7)
    if dtype == "bool":
        xn = rng.random(N) > 0.5
    elif np.dtype(dtype).kind == "f":
        xn = (rng.random(N) * 0.01 + 0.995).astype(dtype)  # a product in range
    else:
        xn = rng.integers(-50, 50, N).astype(dtype)
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x = xp.asarray(xn.copy())
        y = x if name == "prod" else (x * x if dtype == "bool" else x + x)
        got = await getattr(xp, name)(y)
        yn = xn if name == "prod" else (xn * xn if dtype == "bool" else xn + xn)
        want = getattr(np, name)(yn)
        assert got.dtype == want.dtype
        assert got.shape == ()
        if np.dtype(dtype).kind == "f" or name == "mean":
            rtol = 1e-5 if want.dtype == np.float32 else 1e-12
            np.testing.assert_allclose(got, want, rtol=rtol)
        else:
            assert got == want  # integer and max/min reductions are exact
        if name == "sum":
            kept = await xp.sum(y, keepdims=True, dtype=xp.float64)
            assert kept.shape == (1,)
            np.testing.assert_allclose(kept, np.sum(yn, keepdims=True, dtype=np.float64))


async def test_a_fused_reduction_is_ordered_with_writes_and_makes_no_product_array() -> None:
    async with ae.Engine(cpu_workers=1) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, bn = rng_values(8)
        a, b = arrays(xp, an, bn)
        held = HeldWorkers(engine, 1)
        total = xp.sum(a * b)  # reads a before the write below
        a += 1.0
        after = xp.sum(a * b)
        await held.release()
        assert float(await total) == pytest.approx(float(np.sum(an * bn)), rel=1e-12)
        assert float(await after) == pytest.approx(float(np.sum((an + 1.0) * bn)), rel=1e-12)
        # The product nobody holds is not allocated: only the two partial lists are.
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            await xp.sum(a * b)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert peak < an.nbytes / 2, peak


async def test_a_failed_input_fails_the_reduction() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x = xp.asarray(np.ones(N, dtype=np.int64))
        bad = x ** xp.asarray(-np.ones(N, dtype=np.int64))
        total = xp.sum(bad)
        with pytest.raises(ValueError, match="negative integer powers"):
            await bad
        with pytest.raises(ae.DependencyError) as info:
            await total
        assert isinstance(info.value.__cause__, ValueError)


async def test_a_chunked_array_from_a_failed_input_fails_and_its_writes_too() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)

        def bad(v: Any) -> Any:
            raise KeyError("load")

        x = xp.apply(bad, xp.asarray(np.ones(N)), shape=(N,), dtype=xp.float64)
        y = x + 1.0  # its kernels are skipped by the engine: x carries a failure
        for _ in range(50):
            y += 1.0  # writes keep one record of the kernels, not one more per write
        assert len(aa._array.buffer_of(y).chunked.writers) == 6
        with pytest.raises(KeyError):
            await x
        with pytest.raises(ae.DependencyError) as info:
            await y
        assert isinstance(info.value.__cause__, KeyError)


async def test_cancelling_a_consumer_leaves_the_chain_and_its_value_intact() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, bn = rng_values(9)
        a, b = arrays(xp, an, bn)
        held = HeldWorkers(engine, 2)
        c = chain(xp, a, b)
        consumer = asyncio.ensure_future(_value(c))
        await asyncio.sleep(0)  # the consumer waits for c, which cannot start
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        await held.release()
        np.testing.assert_array_equal(await c, chain(np, an, bn))


async def _value(x: Any) -> Any:
    return await x


async def test_closing_with_cancel_fails_pending_chunks_clearly() -> None:
    engine = ae.Engine(cpu_workers=1)
    xp = aa.namespace(engine, chunk_bytes=CHUNK)
    an, bn = rng_values(10)
    a, b = arrays(xp, an, bn)
    held = HeldWorkers(engine, 1)
    c = chain(xp, a, b)  # queued behind the held worker
    closing = asyncio.ensure_future(engine.aclose(cancel=True))
    await asyncio.sleep(0)  # the close cancels what has not started
    held.event.set()
    await closing
    with pytest.raises(RuntimeError, match="cancelled"):
        np.asarray(c)  # failed for good, never a hang or garbage


async def test_a_chain_computes_while_its_caller_keeps_the_loop_busy() -> None:
    """A chain pushed by a caller that then blocks the loop thread (``time.sleep``: no
    ``await``, so the loop never iterates) is computed meanwhile: the waker pushes one no-op
    from its own thread once the caller has been quiet, which wakes the workers. A chain
    awaited at once needs no wake-up."""
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        a = xp.asarray(np.arange(N, dtype=np.float64))
        await a

        def pushed() -> int:
            return engine.statistics().pushed

        before = pushed()
        value = await (xp.sqrt(a * 2.0 + 1.0) - a)
        np.testing.assert_array_equal(value, np.sqrt(np.arange(N) * 2.0 + 1.0) - np.arange(N))
        await until(lambda: not WAKER.armed)  # the waker pushed what it would
        awaited = pushed() - before  # the kernels (one per chunk) and the await
        for _ in range(3):
            before = pushed()
            c = xp.sqrt(a * 2.0 + 1.0) - a
            for _ in range(10_000):  # at most 10 s, without yielding to the loop
                if c.ready:
                    break
                time.sleep(0.001)  # noqa: ASYNC251  (blocking the loop is the point)
            assert c.ready
            np.testing.assert_array_equal(await c, value)
            await until(lambda: not WAKER.armed)  # the waker pushed what it would
            # At most the waker's one no-op more: a worker that finds the caller quiet by
            # itself (the caller's CPU clock) may start the chain before the waker pushes.
            assert pushed() - before in (awaited, awaited + 1)


def test_a_kernel_waiting_for_its_burst_starts_as_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The end of a burst (a sync point off the loop, the loop's next iteration on it) wakes
    the kernels waiting for it at once: they do not wait for their next look at whether the
    caller is quiet (made an hour apart here, and the caller never quiet)."""
    monkeypatch.setattr(_burst, "LOOK", 3600.0)
    monkeypatch.setattr(_burst.Burst, "quiet", lambda self: False)
    for on_loop in (False, True):
        burst = _burst.Burst(on_loop=on_loop)
        gen = burst.gen
        waiting = threading.Event()

        def wait(burst: Any = burst, gen: int = gen, waiting: threading.Event = waiting) -> None:
            waiting.set()
            burst.wait(gen)

        waiter = threading.Thread(target=wait)
        waiter.start()
        waiting.wait()
        deadline = time.monotonic() + 30  # a bound for a hang, not a timing
        while not burst.ended._waiters and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.001)  # until it sleeps in the Condition, where only a wake-up ends it
        if on_loop:
            burst.open = True
            burst._end()  # what the loop's next iteration calls
        else:
            burst.end()
        waiter.join(30)  # a bound for a hang, not a timing
        assert not waiter.is_alive()
        assert burst.gen == gen + 1


def _burst_of_a_thread(
    behave: Callable[[threading.Event], None],
) -> tuple[Any, threading.Event, threading.Thread]:
    """A burst entered from a thread of its own, which then ``behave``s until the event."""
    burst = _burst.Burst(on_loop=False)
    entered, done = threading.Event(), threading.Event()

    def caller() -> None:
        burst.enter(None, None)  # type: ignore[arg-type]  # off the loop: only recorded
        burst.touch()  # its pushes done
        entered.set()
        behave(done)

    thread = threading.Thread(target=caller)
    thread.start()
    entered.wait()
    return burst, done, thread


async def test_a_caller_blocked_after_its_push_is_quiet_soon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller blocked in a system call (``time.sleep``, a read) is quiet once
    ``QUIET_BLOCKED`` has passed, not only after ``QUIET_MAX`` (made an hour here, so that
    only the blocked rule can say so)."""
    if sys.platform != "linux" or _burst._FUTEX is None:
        pytest.skip("the system call a thread is in cannot be read here")
    monkeypatch.setattr(_burst, "QUIET_MAX", 3600.0)

    def sleeps(done: threading.Event) -> None:
        while not done.is_set():
            time.sleep(0.01)

    read, write = os.pipe()

    def reads(done: threading.Event) -> None:
        os.read(read, 1)

    try:
        for behave in (sleeps, reads):
            burst, done, thread = _burst_of_a_thread(behave)
            try:
                await until(burst.quiet)
            finally:
                done.set()
                os.write(write, b"x")
                thread.join()
    finally:
        os.close(read)
        os.close(write)


def _spin(done: threading.Event) -> None:
    while not done.is_set():
        pass


@pytest.mark.parametrize("behave", ["waits_for_a_lock", "spins"])
async def test_a_caller_waiting_for_a_lock_or_busy_in_python_is_not_quiet_by_the_blocked_rule(
    monkeypatch: pytest.MonkeyPatch, behave: str
) -> None:
    """A futex wait is how a thread waits for the GIL between two pushes of a chain (for up
    to a switch interval while another thread runs Python): it must not start the chain's
    kernels before the rest of it joins. A lock's wait looks the same, and is left to
    ``QUIET_MAX``; a thread running Python is in no system call at all."""
    monkeypatch.setattr(_burst, "QUIET_MAX", 3600.0)
    monkeypatch.setattr(_burst, "QUIET", 3600.0)
    spins = behave == "spins"
    burst, done, thread = _burst_of_a_thread(_spin if spins else lambda done: done.wait())
    try:
        for _ in range(20):  # 20 x 5 ms, each far above QUIET_BLOCKED
            await asyncio.sleep(0.005)
            assert not burst.quiet()
    finally:
        done.set()
        thread.join()


def _burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time in Python."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_caller_is_not_quiet_while_it_pushes_a_chunked_operation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A program's first step pushes a kernel per chunk, which takes the caller a while (more
    than ``QUIET`` of CPU time under a tracer): the kernels it pushed first must not take that
    for other work and start before the rest of the chain joins. Its CPU time counts from the
    end of its latest push."""
    if _burst._cpu_clock() is None:
        pytest.skip("a thread's CPU clock cannot be read here: only QUIET_MAX applies")
    monkeypatch.setattr(_burst, "QUIET_MAX", 3600.0)
    monkeypatch.setattr(_burst, "QUIET_RUNNABLE", 3600.0)
    # (The caller asks about itself here: descheduled a while, it would see itself blocked in
    # the read of its own /proc entry.)
    monkeypatch.setattr(_burst, "QUIET_BLOCKED", 3600.0)
    burst = _burst.Burst(on_loop=False)
    burst.enter(None, None)  # type: ignore[arg-type]  # off the loop: only recorded
    _burn(3 * _burst.QUIET)  # pushing
    assert not burst.quiet()
    burst.touch()  # the pushes are done
    assert not burst.quiet()
    _burn(3 * _burst.QUIET)  # other work
    assert burst.quiet()


async def test_a_chunked_push_that_fails_leaves_its_caller_not_pushing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller is not quiet while it pushes a chunked operation: one that raised (a failed
    allocation, say) must not leave the burst's kernels waiting for ``QUIET_RUNNABLE``."""
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine)
        a = xp.asarray(np.ones(1 << 18))  # two chunks of the default size
        await a

        def fails(*args: Any, **kwargs: Any) -> Any:
            raise MemoryError("no room for the program")

        monkeypatch.setattr(aa._chain, "_program_for", fails)
        for push in (lambda: a * 2.0, lambda: xp.sum(a)):  # join_or_push, reduce_chunks
            with pytest.raises(MemoryError):
                push()
            assert not xp._burst.pushing


def test_a_caller_waiting_for_a_core_is_quiet_only_after_quiet_runnable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loaded machine may deschedule the caller mid-chain for longer than ``QUIET_MAX``: it
    is runnable (Linux's ``R``), spends no CPU time, and is not quiet before
    ``QUIET_RUNNABLE``; a caller waiting for a lock is quiet after ``QUIET_MAX``."""
    if sys.platform != "linux":
        pytest.skip("a thread's state cannot be read here")
    assert _burst._runnable(threading.get_native_id())  # this thread runs
    monkeypatch.setattr(_burst, "QUIET_MAX", 0.0)
    monkeypatch.setattr(_burst, "QUIET_RUNNABLE", 3600.0)
    burst, done, thread = _burst_of_a_thread(lambda done: done.wait())
    try:
        deadline = time.monotonic() + 30  # a bound for a hang, not a timing
        while _burst._runnable(burst.thread) and time.monotonic() < deadline:
            time.sleep(0.001)  # until it waits for the event
        assert not _burst._runnable(burst.thread)
        assert burst.quiet()
        monkeypatch.setattr(_burst, "_runnable", lambda thread: True)  # descheduled, say
        assert not burst.quiet()
        monkeypatch.setattr(_burst, "QUIET_RUNNABLE", 0.0)
        assert burst.quiet()
    finally:
        done.set()
        thread.join()


# -- broadcast operands: a bias row, a column, a scalar array, an outer product -----------------

ROWS, COLS = 8192 * 5 // 64, 64  # chunks of 128 rows (CHUNK): every chunk whole rows


def _matrices(seed: int) -> tuple[np.ndarray[Any, Any], ...]:
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((ROWS, COLS))
    return (
        z,
        rng.standard_normal(COLS),
        rng.standard_normal((ROWS, 1)),
        rng.standard_normal((COLS, 1)),
    )


async def test_a_broadcast_operand_joins_the_chain_over_chunks() -> None:
    # tanh(z + bias), a column times a transposed row, a 0-d array: each step of the chains
    # is one pass per chunk, the small operands read whole by every kernel.
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        zn, bn, gn, wn = _matrices(16)
        z, b, g, w, s = arrays(xp, zn, bn, gn, wn, np.array(2.5))
        for x in (z, b, g, w, s):
            await x
        with Pushes(engine) as pushes:
            h = xp.tanh(z + b)
            o = (g * xp.matrix_transpose(w)) * (1.0 - h * h)
            q = h * s + b
            got = [await h, await o, await q]
        hn = np.tanh(zn + bn)
        for value, want in zip(
            got, [hn, (gn * wn.T) * (1.0 - hn * hn), hn * 2.5 + bn], strict=True
        ):
            np.testing.assert_array_equal(value, want)
        n = len(aa._array.buffer_of(h).vars)
        assert n == 5
        # Kernels only: one per chunk for each program (no operation over the whole array).
        assert set(pushes.ops()) <= {"add", "multiply", "subtract", "tanh"}, pushes.ops()
        assert len(pushes.ops()) % n == 0, pushes.ops()


@pytest.mark.parametrize(
    ("cols", "chunk_rows", "same_bits"),
    [
        (64, 256, True),  # blocks of whole rows are whole 2,048s
        (1000, 300, True),  # blocks of 256 rows: whole rows and whole 2,048s (lcm)
        (3000, 100, True),  # no such block fits: one block per chunk
        (3000, 200, False),  # neither fits (a chunk of 4.8 MB): a partial per block
    ],
)
async def test_a_sum_over_a_chain_with_a_broadcast_row(
    cols: int, chunk_rows: int, same_bits: bool
) -> None:
    """``xp.sum((z + b) ** 2)`` with ``b`` a row, and a sum along axis 0 joined too: the
    program computes on blocks of whole rows; the sum's partials are per 2,048 elements, the
    same bits as the sum of the same values alone, wherever a block of whole rows and whole
    2,048s or the whole chunk fits in four times the usual block; else a partial per block.
    NumPy's values within rounding in every case (a short last chunk included)."""
    rng = np.random.default_rng(17)
    rows = 1030
    zn, bn = rng.standard_normal((rows, cols)), rng.standard_normal(cols)
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * cols * chunk_rows)
        z, b = await computed(xp, zn, bn)
        y = z + b
        total = xp.sum(y * y)
        mean = xp.mean(y * y)
        columns = xp.sum(y * y, axis=0)
        got = await total
        yn = zn + bn
        np.testing.assert_allclose(got, np.sum(yn**2), rtol=1e-12)
        np.testing.assert_allclose(await mean, np.mean(yn**2), rtol=1e-12)
        np.testing.assert_allclose(await columns, np.sum(yn**2, axis=0), rtol=1e-12)
        (y2,) = await computed(xp, np.asarray(await y))
        alone = await xp.sum(y2 * y2)
        if same_bits:
            assert got.tobytes() == alone.tobytes()


async def test_writes_on_a_broadcast_operand_are_ordered_with_the_chain() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        zn, bn, _, _ = _matrices(17)
        z, b = arrays(xp, zn, bn)
        await b
        held = HeldWorkers(engine, 2)  # nothing computes before every push is made
        c = z + b  # reads b before the write
        b += 1.0  # waits for c's kernels
        d = z * 2.0 + b  # reads b after it: a program of its own
        e = xp.tanh(c) + b  # c's program read b before the write: no join with the new b
        await held.release()
        np.testing.assert_array_equal(await c, zn + bn)
        np.testing.assert_array_equal(await d, zn * 2.0 + (bn + 1.0))
        np.testing.assert_array_equal(await e, np.tanh(zn + bn) + (bn + 1.0))
        np.testing.assert_array_equal(await b, bn + 1.0)


@pytest.mark.parametrize("cols", [7, 8])
async def test_rows_that_straddle_chunks_or_are_short_fall_back(cols: int) -> None:
    # 7 columns: chunks of 8,192 elements are no whole rows; 8: rows shorter than MIN_ROW
    # (NumPy broadcasts them slowly in blocks). The results are NumPy's all the same.
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        rng = np.random.default_rng(18)
        zn, rown = rng.standard_normal((6000, cols)), rng.standard_normal(cols)
        z, row = arrays(xp, zn, rown)
        c = xp.sqrt(xp.abs(z + row)) * row
        value = await c
        np.testing.assert_array_equal(value, np.sqrt(np.abs(zn + rown)) * rown)
        np.testing.assert_array_equal(await xp.max(c, axis=0), np.max(value, axis=0))


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
async def test_an_outer_product_matmul_equals_numpys(dtype: str) -> None:
    # (n, 1) @ (1, m), also stacked: each element one product, computed elementwise over chunks.
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        rng = np.random.default_rng(19)
        gn = (rng.standard_normal((ROWS, 1)) * 100).astype(dtype)
        wn = (rng.standard_normal((1, COLS)) * 100).astype(dtype)
        sn = (rng.standard_normal((3, 700, 1)) * 100).astype(dtype)
        g, w, s = arrays(xp, gn, wn, sn)
        np.testing.assert_array_equal(await (g @ w), gn @ wn)
        np.testing.assert_array_equal(await ((g @ w) * 2 + 1), (gn @ wn) * 2 + 1)
        np.testing.assert_array_equal(await (s @ w), sn @ wn)
        assert len(aa._array.buffer_of(g @ w).vars) > 1  # chunked


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
async def test_random_programs_with_broadcast_operands_equal_numpy(data: st.DataObject) -> None:
    zn, bn, gn, _ = _matrices(data.draw(st.integers(0, 3)))
    small = {"row": bn, "col": gn, "scalar": np.array(-0.75)}
    steps = []
    for _ in range(data.draw(st.integers(3, 10), label="length")):
        kind = data.draw(st.sampled_from(["bcast", "unary", "binary", "write", "await"]))
        name = data.draw(st.sampled_from(sorted(_BINARY)))
        which = data.draw(st.sampled_from(sorted(small)))
        i, j = data.draw(st.integers(0, 5)), data.draw(st.integers(0, 5))
        steps.append((kind, name, which, i, j))

    async def run(xp: Any, full: list[Any], parts: dict[str, Any], is_np: bool) -> list[Any]:
        seen = []
        for kind, name, which, i, j in steps:
            x, y = full[i % len(full)], full[j % len(full)]
            if kind == "bcast":
                full.append(_BINARY[name](x, parts[which]))
            elif kind == "unary":
                full.append(xp.tanh(x))
            elif kind == "binary":
                full.append(_BINARY[name](x, y))
            elif kind == "write":
                parts[which] += 0.5  # a write on a broadcast operand, between reads of it
            else:
                seen.append(np.array(x if is_np else await x))
        for x in full:
            seen.append(np.array(x if is_np else await x))
        return seen

    want = await run(np, [zn.copy()], {k: v.copy() for k, v in small.items()}, True)
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        parts = dict(zip(small, arrays(xp, *small.values()), strict=True))
        got = await run(xp, arrays(xp, zn), parts, False)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(g, w, err_msg=f"value {k} of {steps}")


# -- reductions along the first axis: a partial row per block ------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "uint8"])
@pytest.mark.parametrize("keepdims", [False, True])
async def test_reductions_along_the_first_axis_equal_numpys(dtype: str, keepdims: bool) -> None:
    rng = np.random.default_rng(20)
    zn = (rng.standard_normal((ROWS, 2, COLS // 2)) * 10).astype(dtype)
    zn[3, 1, 5] = 100  # a maximum in the middle of a chunk
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        (z,) = arrays(xp, zn)
        with Pushes(engine) as pushes:
            got = {
                "sum": await xp.sum(z, axis=0, keepdims=keepdims),
                "max": await xp.max(z, axis=0, keepdims=keepdims),
                "min": await xp.min(-z, axis=0, keepdims=keepdims),
            }
            if dtype.startswith("float"):
                got["mean"] = await xp.mean(z * 2, axis=0, keepdims=keepdims)
        want = {
            "sum": np.sum(zn, axis=0, keepdims=keepdims, dtype=got["sum"].dtype),
            "max": np.max(zn, axis=0, keepdims=keepdims),
            "min": np.min(-zn, axis=0, keepdims=keepdims),
            "mean": np.mean(zn * 2, axis=0, keepdims=keepdims),
        }
        for name, value in got.items():
            assert value.shape == want[name].shape, name
            assert value.dtype == want[name].dtype, name
            if dtype.startswith("float") and name in ("sum", "mean"):
                # Within the error bound of a sum of ROWS terms (NumPy's own, adding rows in
                # order, is within it too) of the float64 result.
                x = zn.astype(np.float64) * (2 if name == "mean" else 1)
                exact = np.sum(x, axis=0, keepdims=keepdims) / (ROWS if name == "mean" else 1)
                bound = ROWS * np.finfo(dtype).eps * np.sum(np.abs(x), axis=0, keepdims=keepdims)
                assert np.all(np.abs(value - exact) <= bound / (ROWS if name == "mean" else 1))
            else:
                np.testing.assert_array_equal(value, want[name], err_msg=name)
        # A step per chunk (of the kernels, joined by the negation and the doubling) and one
        # combine each: no operation reduces the whole array.
        assert pushes.ops().count("sum") == 5 + 1, pushes.ops()


async def test_a_reduction_along_the_first_axis_fuses_and_is_ordered_with_writes() -> None:
    async with ae.Engine(cpu_workers=1) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        zn, _, gn, _ = _matrices(21)
        z, g = arrays(xp, zn, gn)
        held = HeldWorkers(engine, 1)
        col = xp.sum(z * g, axis=0)  # reads z before the write below
        z += 1.0
        after = xp.mean(xp.tanh(z), axis=0)
        await held.release()
        np.testing.assert_allclose(await col, np.sum(zn * gn, axis=0), rtol=1e-12)
        np.testing.assert_allclose(await after, np.mean(np.tanh(zn + 1.0), axis=0), rtol=1e-12)
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            await xp.sum(z * g, axis=0)  # the product nobody holds is not allocated
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert peak < zn.nbytes / 2, peak


async def test_matmuls_that_are_no_outer_products_stay_matrix_products() -> None:
    # A contracted length of 0, or one known only once computed, is no outer product.
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        empty = await (xp.zeros((200, 0)) @ xp.zeros((0, 200)))
        np.testing.assert_array_equal(empty, np.zeros((200, 200)))
        xn = np.arange(-300.0, 300.0) + 0.5  # 300 positive values
        bn = np.random.default_rng(22).standard_normal((300, 300))
        x = xp.asarray(xn)
        a = x[x > 0] * xp.ones((300, 1))  # shape (300, None): 300 columns once computed
        an = xn[xn > 0] * np.ones((300, 1))
        np.testing.assert_allclose(await (a @ xp.asarray(bn)), an @ bn, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
async def test_a_large_matrix_product_is_computed_in_chunks_of_rows_equal_to_numpys(
    dtype: str,
) -> None:
    """``(n, k) @ (k, m)`` with whole rows per chunk: a product per chunk of rows, each a
    BLAS call of its own (NumPy's values, within the rounding of a BLAS call over fewer
    rows), ragged last chunk too; what follows reads it chunk by chunk."""
    rng = np.random.default_rng(31)
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        for rows in (ROWS, ROWS + 37):
            xn = rng.standard_normal((rows, 48)).astype(dtype)
            wn = rng.standard_normal((48, COLS)).astype(dtype)
            bn = rng.standard_normal(COLS).astype(dtype)
            x, w, b = xp.asarray(xn), xp.asarray(wn), xp.asarray(bn)
            z = x @ w
            assert buffer_of(z).chunked is not None
            # Two BLAS calls may round a dot product of 48 terms apart by a few units of the
            # dtype times the sum of its terms' magnitudes (not of the result, which can
            # cancel to near zero: which kernel the CPU gets decides), and tanh no more.
            eps = 1e-5 if dtype == "float32" else 1e-12
            bound = eps * (np.abs(xn).astype(np.float64) @ np.abs(wn).astype(np.float64))
            got = await z
            assert np.all(np.abs(got - xn @ wn) <= bound)
            h = xp.tanh(x @ w + b)
            got = await h
            assert np.all(np.abs(got - np.tanh(xn @ wn + bn)) <= bound)
            assert got.dtype == np.dtype(dtype)


async def test_a_chunked_matrix_product_reads_its_operands_as_they_were_pushed() -> None:
    """Writes pushed after the product, into either operand, do not reach it; a product
    pushed after a write sees it."""
    rng = np.random.default_rng(32)
    xn = rng.standard_normal((ROWS, 40))
    wn = rng.standard_normal((40, COLS))
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x, w = xp.asarray(xn.copy()), xp.asarray(wn.copy())
        before = x @ w
        x[: ROWS // 2] = 0.0  # the first chunks of x
        w[0] = 1.0
        after = x @ w
        xn2, wn2 = xn.copy(), wn.copy()
        xn2[: ROWS // 2] = 0.0
        wn2[0] = 1.0
        np.testing.assert_allclose(await before, xn @ wn, rtol=1e-12)
        np.testing.assert_allclose(await after, xn2 @ wn2, rtol=1e-12)


async def test_a_chunk_of_a_matrix_product_that_raises_fails_the_whole_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its other chunks computed, the result still never reads as a value: awaiting it,
    a chain on it and a view of it raise; the first chunk's error is the one."""
    from aioengine.array import _products

    def failing(fn: Any) -> Any:
        def call(a: Any, b: Any, out: Any) -> Any:
            if out.shape[0] < 128:  # the short last chunk
                raise FloatingPointError("BLAS")
            return fn(a, b, out=out)

        return call

    monkeypatch.setattr(_products, "blas_call", failing)
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        z = xp.asarray(np.ones((ROWS + 37, 8))) @ xp.asarray(np.ones((8, COLS)))
        assert buffer_of(z).chunked is not None
        with pytest.raises(FloatingPointError, match="BLAS"):
            await z
        with pytest.raises(ae.DependencyError, match="BLAS"):
            await (z + 1.0)
        with pytest.raises((FloatingPointError, ae.DependencyError), match="BLAS"):
            await z[:2, :3]


async def test_short_wide_and_data_dependent_products_stay_one_blas_call() -> None:
    """Few rows per chunk (each chunk would read all of ``x2``): one operation, as before;
    values and errors as NumPy's."""
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an = np.random.default_rng(33).standard_normal((16, 40))
        bn = np.random.default_rng(34).standard_normal((40, 4096))
        z = xp.asarray(an) @ xp.asarray(bn)
        assert buffer_of(z).chunked is None
        np.testing.assert_allclose(await z, an @ bn, rtol=1e-12)
        w = xp.asarray(np.ones((40, COLS)))
        short = w[xp.asarray(np.arange(40) < 30)]  # 30 rows
        with pytest.raises(ValueError, match="mismatch"):
            await (xp.ones((ROWS, 40)) @ short)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
async def test_a_product_over_chunked_rows_adds_partial_products_in_order(dtype: str) -> None:
    """``a.T @ g`` with ``g`` chunked in whole rows (a weight gradient over the samples): a
    partial product per chunk of rows, added in chunk order: NumPy's values within rounding,
    the same result whichever block finishes first; ``a`` chunked or not, or ``g`` itself."""
    rng = np.random.default_rng(35)
    r = 1e-5 if dtype == "float32" else 1e-12

    def close(got: Any, want: Any) -> None:  # sums of terms of both signs: atol by magnitude
        np.testing.assert_allclose(got, want, rtol=r, atol=r * float(np.abs(want).max()))

    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        for rows in (ROWS, ROWS + 37):
            an = rng.standard_normal((rows, 48)).astype(dtype)
            gn = rng.standard_normal((rows, COLS)).astype(dtype)
            small = rng.standard_normal((rows, 3)).astype(dtype)  # one chunk: unchunked
            a, s = xp.asarray(an), xp.asarray(small)
            g = xp.asarray(gn) * 1.0  # computed in chunks, as a gradient is
            a2 = a + 0.0  # a chunked one too
            assert buffer_of(g).chunked is not None
            assert buffer_of(a2).chunked is not None
            got = await (xp.matrix_transpose(a) @ g)
            close(got, an.T @ gn)
            assert got.dtype == np.dtype(dtype)
            close(await (s.mT @ g), small.T @ gn)
            close(await (g.mT @ g), gn.T @ gn)
            close(await (a2.mT @ g), an.T @ gn)
            g = xp.asarray(gn) * 1.0
            # Pushed before writes into both operands: it reads them as they were.
            want = an.T @ gn  # (asarray shares the NumPy arrays: the writes reach them)
            before = xp.matrix_transpose(a) @ g
            a[:5] = 0.0
            g[-5:] = 1.0
            close(await before, want)
            an[:5], gn[-5:] = 0.0, 1.0
            after = await (xp.matrix_transpose(a) @ g)
            close(after, an.T @ gn)


async def test_products_over_rows_that_are_not_taken_in_blocks_equal_numpys() -> None:
    """``g`` whose chunks were merged (its Var handed out), or a wide ``a`` (its partials
    would outgrow a quarter of ``g``): one BLAS call, NumPy's values."""
    rng = np.random.default_rng(36)
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, gn = rng.standard_normal((ROWS, 40)), rng.standard_normal((ROWS, COLS))
        g = xp.asarray(gn) * 1.0
        g.var  # noqa: B018  (merges its chunks into one Var)
        np.testing.assert_allclose(await (xp.asarray(an).mT @ g), an.T @ gn, rtol=1e-12)
        wide = rng.standard_normal((ROWS, 33))  # 4 * 33 > 128 rows per chunk
        g2 = xp.asarray(gn) * 1.0
        np.testing.assert_allclose(await (xp.asarray(wide).mT @ g2), wide.T @ gn, rtol=1e-12)


async def test_a_block_of_a_product_over_chunked_rows_that_raises_fails_the_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aioengine.array import _products

    def failing(fn: Any) -> Any:
        def call(a: Any, b: Any) -> Any:
            if a.shape[1] < 128:  # the short last block
                raise FloatingPointError("BLAS")
            return fn(a, b)

        return call

    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        a = xp.asarray(np.ones((ROWS + 37, 8)))
        g = xp.asarray(np.ones((ROWS + 37, COLS))) * 1.0  # in chunks
        await a
        await g
        monkeypatch.setattr(_products, "blas_call", failing)
        z = xp.matrix_transpose(a) @ g
        with pytest.raises((FloatingPointError, ae.DependencyError), match="BLAS"):
            await z
        with pytest.raises(ae.DependencyError, match="BLAS"):
            await (z + 1.0)
        monkeypatch.undo()
        bad = xp.apply(lambda v: 1 / 0, g, shape=g.shape, dtype=g.dtype)
        with pytest.raises(ae.DependencyError, match="division"):
            await (xp.matrix_transpose(a) @ bad)
        np.testing.assert_array_equal(
            await (xp.matrix_transpose(a) @ g), np.full((8, COLS), float(ROWS + 37))
        )


async def test_a_failed_operand_of_a_chunked_matrix_product_fails_what_reads_it() -> None:
    def bad(v: Any) -> Any:
        raise KeyError("load")

    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x = xp.apply(bad, xp.asarray(np.ones((ROWS, 8))), shape=(ROWS, 8), dtype=xp.float64)
        z = x @ xp.asarray(np.ones((8, COLS)))
        with pytest.raises(ae.DependencyError, match="load"):
            await (z + 1.0)
        with pytest.raises(ae.DependencyError):
            await z
        good = xp.asarray(np.ones((ROWS, 8))) @ xp.asarray(np.ones((8, COLS)))
        np.testing.assert_array_equal(await good, np.full((ROWS, COLS), 8.0))
        await engine.wait_for_all()  # the failure was thrown by the awaits


async def test_an_outer_product_has_the_signed_zeros_of_numpys_matmul() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        gn = np.tile([[0.0], [1.0], [-0.0]], (ROWS, 1))
        wn = np.tile([-1.0, 2.0, -0.0, np.inf], COLS // 4)[None, :]
        with np.errstate(invalid="ignore"):
            want = gn @ wn
        got = await (xp.asarray(gn) @ xp.asarray(wn))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf * 0
async def test_an_operation_pushed_before_a_chains_input_fails_fails_only_if_it_reads_it() -> None:
    # Pushed while the input is still pending, so that the operations may fuse with the
    # chain: one that reads none of the failed input's data computes (a kernel skipped for
    # the failure must not be its), one that does fails; the chain's fusion stays whole.
    gate = threading.Event()

    def late_failure(v: Any) -> Any:
        gate.wait(10.0)
        raise KeyError("load")

    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an = np.linspace(0.0, 1.0, N)
        a = xp.asarray(an)
        await a
        b = xp.apply(late_failure, xp.asarray(an), shape=(N,), dtype=xp.float64)
        ab = a * b  # a program whose kernels hold a turn on a and on b
        half = a * 0.5  # reads a, not b
        both = ab + half
        lone = xp.sum(xp.asarray(np.ones(N)) + 1.0)  # reads neither
        c1 = a * 1.5 + 2.0  # a program holding a alone: a later step reading a joins it
        c = c1 * c1 - a * 0.5
        program = buffer_of(c).chunked.program  # type: ignore[union-attr]
        assert program is buffer_of(c1).chunked.program  # type: ignore[union-attr]
        gate.set()
        np.testing.assert_array_equal(await half, an * 0.5)
        assert float(await lone) == 2.0 * N
        cn = an * 1.5 + 2.0
        np.testing.assert_array_equal(await c, cn * cn - an * 0.5)
        for failed in (ab, both, b):
            with pytest.raises((KeyError, ae.DependencyError)):
                await failed
        with contextlib.suppress(BaseException):
            await engine.wait_for_all()


async def test_steps_on_computed_inputs_join_one_program_whatever_they_read() -> None:
    # Inputs computed, no write pending: nothing can skip the kernels, so a step reading
    # one of them alone still joins the program (no pass over memory of its own).
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, bn = np.linspace(0.0, 1.0, N), np.linspace(1.0, 2.0, N)
        a, b = xp.asarray(an), xp.asarray(bn)
        await a
        await b
        t1 = a * b
        t2 = a * 0.5  # reads a alone
        d = t1 - t2
        program = buffer_of(t1).chunked.program  # type: ignore[union-attr]
        assert buffer_of(t2).chunked.program is program  # type: ignore[union-attr]
        assert buffer_of(d).chunked.program is program  # type: ignore[union-attr]
        np.testing.assert_array_equal(await d, an * bn - an * 0.5)


async def test_a_failed_input_of_a_chain_does_not_fail_a_later_chain() -> None:
    # The engine skips the kernels of a chain whose input failed (a bias here): a later
    # operation on the other input joins no skipped kernel, it computes.
    def bad(v: Any) -> Any:
        raise KeyError("load")

    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        zn, _, _, _ = _matrices(23)
        (z,) = arrays(xp, zn)
        await z
        bias = xp.apply(bad, xp.asarray(np.ones(COLS)), shape=(COLS,), dtype=xp.float64)
        same = xp.apply(bad, xp.asarray(zn), shape=zn.shape, dtype=xp.float64)
        y = z + bias
        y2 = same + 1.0
        with pytest.raises(ae.DependencyError):
            await y
        with pytest.raises(ae.DependencyError):
            await y2
        np.testing.assert_array_equal(await (z * 2.0), zn * 2.0)
        np.testing.assert_array_equal(await (z - 1.0), zn - 1.0)
        await engine.wait_for_all()  # both failures were thrown by the awaits, once
