"""Views and in-place writes of a chunked array hold only the chunks they touch
(``aioengine/array/_buffer.py`` has the rule).

What a user relies on: ``x[:10] += 1`` and a read of ``x[:10]`` do not wait for work on the
other chunks of ``x``; a write on a chunk still comes after every read of that chunk pushed
before it; a view across a chunk boundary reads (or writes) both chunks; what ``await``
returned never changes; and any program of views, in-place writes, elementwise operations and
awaits gives NumPy's values exactly. Chunks here hold more than ``INLINE_COST`` elements, so a
whole-chunk operation runs on the (held) workers while a small one runs inline on the loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioengine as ae
import aioengine.array as aa
from aioengine.array import _push

from .test_array_chunks import HeldWorkers

C = 20_000  # elements of a chunk: a whole chunk is more than INLINE_COST, goes to the pool
N = 4 * C
assert C > _push.INLINE_COST


async def chunked(engine: ae.Engine, xp: Any, values: np.ndarray[Any, Any]) -> Any:
    """A chunked array of ``values`` (made by an elementwise operation), computed, and no
    value of it handed out yet (an ``await`` would make a later write copy it whole)."""
    x = xp.asarray(values) * 1.0
    assert len(aa._array.buffer_of(x).vars) == 4
    await engine.wait_for_all()
    return x


async def turns(n: int = 10) -> None:
    """Let the loop run ``n`` times: an inline operation whose turn came runs in one."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_the_first_chunk_is_written_and_read_while_the_last_is_held() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * C)
        xn = np.arange(N, dtype=np.float64)
        x = await chunked(engine, xp, xn)
        held = HeldWorkers(engine, 2)  # nothing runs on the pool before the release
        last = x[-C:]
        last *= 2.0  # a whole chunk: on the pool, queued behind the held workers
        x[:10] += 1.0  # inline, on the first chunk only
        head = await asyncio.wait_for(x[:10], 10)  # completes while the last chunk is held
        np.testing.assert_array_equal(head, xn[:10] + 1.0)
        assert x[:10].ready
        assert not x[-C:].ready
        assert not x.ready
        await held.release()
        want = xn + 0.0
        want[-C:] *= 2.0
        want[:10] += 1.0
        np.testing.assert_array_equal(await x, want)
        np.testing.assert_array_equal(head, xn[:10] + 1.0)  # what await returned never changes


async def test_a_write_on_a_chunk_waits_for_the_readers_of_that_chunk_only() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * C)
        xn = np.arange(N, dtype=np.float64)
        x = await chunked(engine, xp, xn)
        held = HeldWorkers(engine, 2)
        r = x[:C] + 0.0  # reads the first chunk, on the pool: held
        x[:10] = -5.0  # inline, on the first chunk: after r, which was pushed before
        x[2 * C : 2 * C + 10] = 7.0  # inline, on the third chunk: nothing to wait for
        await turns()
        assert x[2 * C : 2 * C + 10].ready
        assert not x[:10].ready
        await held.release()
        np.testing.assert_array_equal(await r, xn[:C])  # the write came after it
        want = xn.copy()
        want[:10] = -5.0
        want[2 * C : 2 * C + 10] = 7.0
        np.testing.assert_array_equal(await x, want)


async def test_a_view_across_a_chunk_boundary_reads_and_writes_both_chunks() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * C)
        xn = np.arange(N, dtype=np.float64)
        x = await chunked(engine, xp, xn)
        held = HeldWorkers(engine, 2)
        second = x[C : 2 * C]
        second *= 3.0  # the second chunk, on the pool: held
        straddling = asyncio.ensure_future(x[C - 5 : C + 5])  # must see that write
        before = await asyncio.wait_for(x[C - 10 : C - 5], 10)  # the first chunk only
        await turns()
        assert not straddling.done()
        await held.release()
        np.testing.assert_array_equal(before, xn[C - 10 : C - 5])
        np.testing.assert_array_equal(
            await straddling, np.concatenate([xn[C - 5 : C], xn[C : C + 5] * 3.0])
        )

        held = HeldWorkers(engine, 2)
        r = x[C : 2 * C] + 0.0  # reads the second chunk: held
        x[C - 5 : C + 5] = -1.0  # writes both: after r
        await held.release()
        np.testing.assert_array_equal(await r, xn[C : 2 * C] * 3.0)
        want = xn.copy()
        want[C : 2 * C] *= 3.0
        want[C - 5 : C + 5] = -1.0
        np.testing.assert_array_equal(await x, want)


async def test_a_write_on_chunks_an_await_handed_out_copies_them_first() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * C)
        xn = np.arange(N, dtype=np.float64)
        x = await chunked(engine, xp, xn)
        head = await x[C - 10 : C + 10]  # spans two chunks of the allocation
        x[-10:] = 4.0  # another chunk: in place, and head does not change
        x[C : C + 10] += 1.0  # a chunk head shows: the write copies the array first
        x[:10] = 2.0  # nothing handed out any more: in place again
        want = xn.copy()
        want[-10:] = 4.0
        want[C : C + 10] += 1.0
        want[:10] = 2.0
        np.testing.assert_array_equal(await x, want)
        np.testing.assert_array_equal(head, xn[C - 10 : C + 10])


def test_the_synchronous_namespace_reads_a_view_while_another_chunk_is_written() -> None:
    with ae.BlockingEngine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * C)
        xn = np.arange(N, dtype=np.float64)
        x = xp.asarray(xn) * 1.0
        x[:10] = 3.0
        x[-10:] += 1.0
        want = xn.copy()
        want[:10] = 3.0
        want[-10:] += 1.0
        np.testing.assert_array_equal(np.asarray(x[:20]), want[:20])
        np.testing.assert_array_equal(np.asarray(x), want)


# -- random programs against NumPy -------------------------------------------------------------

M = 5 * 8192 + 17  # 6 chunks of 8,192 elements (the last one short)
ROWS, COLS = 97, M // 97  # a 2-D view of the first ROWS * COLS elements
KEYS = ("slice", "step", "reverse", "int", "2d", "2d-col", "2d-T")


def _key(data: st.DataObject) -> tuple[str, Any]:
    kind = data.draw(st.sampled_from(KEYS))
    lo = data.draw(st.integers(0, M - 1))
    hi = data.draw(st.integers(lo, M))
    if kind == "slice":
        return kind, slice(lo, hi)
    if kind == "step":
        return kind, slice(lo, hi, data.draw(st.sampled_from([2, 3, 8191])))
    if kind == "reverse":
        return kind, slice(hi - 1, lo - 1 if lo else None, -data.draw(st.sampled_from([1, 5])))
    if kind == "int":
        return kind, lo
    r = data.draw(st.integers(0, ROWS - 1))
    return kind, (slice(r, r + data.draw(st.integers(1, 3))), slice(lo % COLS, None))


def _view(xp: Any, x: Any, kind: str, key: Any) -> Any:
    if kind.startswith("2d"):
        grid = xp.reshape(x[: ROWS * COLS], (ROWS, COLS))
        if kind == "2d-col":
            return grid[:, key[1].start]
        if kind == "2d-T":
            return grid.T[key[1], key[0]]
        return grid[key]
    if kind == "int":
        return x[key, ...]  # a 0-d view (NumPy's x[i] is a copy)
    return x[key]


def _program(data: st.DataObject) -> list[tuple[Any, ...]]:
    steps = []
    for _ in range(data.draw(st.integers(4, 14), label="length")):
        kind = data.draw(
            st.sampled_from(
                ["set", "iadd", "imul", "copy", "binary", "viewop", "await", "await-all", "iall"]
            )
        )
        i, j = data.draw(st.integers(0, 7)), data.draw(st.integers(0, 7))
        s = data.draw(st.sampled_from([0.5, 1.25, -2.0]))
        steps.append((kind, i, j, s, _key(data)))
    return steps


async def _run(
    xp: Any, vals: list[Any], steps: list[tuple[Any, ...]], is_np: bool
) -> tuple[list[Any], list[tuple[Any, Any]]]:
    held = list(vals)  # arrays of shape (M,)
    outs = []  # results of operations on views
    seen = []
    handed: list[tuple[Any, Any]] = []  # what await returned, and a copy of it then
    for kind, i, j, s, (kkind, key) in steps:
        x, y = held[i % len(held)], held[j % len(held)]
        v = _view(xp, x, kkind, key)
        if kind == "set":
            if kkind.startswith("2d"):
                v[...] = s
            else:
                x[key] = s
        elif kind == "iadd":
            v += s
        elif kind == "imul":
            v *= s
        elif kind == "copy":  # between arrays, or two views of one (NumPy's overlap rules)
            v[...] = _view(xp, y, kkind, key)
        elif kind == "binary":
            held.append(x * s + y)
        elif kind == "viewop":
            outs.append(v * s)
        elif kind == "await":
            got = v if is_np else await v
            seen.append(np.array(got))
            if not is_np:
                handed.append((got, np.array(got)))
        elif kind == "await-all":
            got = x if is_np else await x
            seen.append(np.array(got))
            if not is_np:
                handed.append((got, np.array(got)))
        elif kind == "iall":
            x += s
    for x in held + outs:
        seen.append(np.array(x if is_np else await x))
    return seen, handed


@pytest.mark.parametrize("mode", ["threaded", "serial"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
async def test_random_programs_of_views_and_writes_equal_numpy(
    mode: str, data: st.DataObject
) -> None:
    steps = _program(data)
    rng = np.random.default_rng(data.draw(st.integers(0, 3)))
    an, bn = rng.standard_normal(M), rng.standard_normal(M)
    want, _ = await _run(np, [an.copy(), bn.copy(), an * 1.0, bn * 1.0], steps, True)
    async with ae.Engine(cpu_workers=2, serial=mode == "serial") as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * 8192)
        a, b = xp.asarray(an.copy()), xp.asarray(bn.copy())
        got, handed = await _run(xp, [a, b, a * 1.0, b * 1.0], steps, False)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(g, w, err_msg=f"value {k} of {steps}")
    for value, then in handed:  # what await returned never changes
        np.testing.assert_array_equal(value, then)


async def test_a_failed_write_on_one_chunk_fails_the_array() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * C)
        x = await chunked(engine, xp, np.arange(N, dtype=np.float64))
        bad = xp.asarray(np.ones(10, dtype=np.int64)) ** xp.asarray(-np.ones(10, dtype=np.int64))
        x[:10] = bad  # skipped: its input failed
        with pytest.raises(ValueError, match="negative integer powers"):
            await bad
        with pytest.raises(ae.DependencyError):
            await x[:10]
        with pytest.raises(ae.DependencyError):
            await x  # the failure is the whole array's
        with pytest.raises(ae.DependencyError):
            await (x[-10:] + 1.0)  # pushed after it: sees it


async def test_a_raw_push_on_x_var_comes_after_the_writes_on_its_chunks() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * C)
        xn = np.arange(N, dtype=np.float64)
        x = await chunked(engine, xp, xn)
        held = HeldWorkers(engine, 2)
        last = x[-C:]
        last += 1.0  # held
        x[:10] = 0.0
        seen: list[float] = []
        # x.var merges the chunks into one Var, after every write on any of them.
        engine.push_sync(lambda r: seen.append(float(np.sum(x.to_numpy()))), const_vars=[x.var])
        await held.release()
        await engine.wait_for_all()
        want = xn.copy()
        want[-C:] += 1.0
        want[:10] = 0.0
        assert seen == [float(np.sum(want))]
