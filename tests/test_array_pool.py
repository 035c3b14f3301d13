"""Recycled memory for large results (``aioengine/array/_pool.py``): a dropped result's memory
is handed out again, never while the result or any view of it is alive, within the limit.

The pool's threshold is lowered for these tests (its default, 1 MiB, would make every test
allocate tens of megabytes); the rule does not depend on it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioengine as ae
import aioengine.array as aa
from aioengine.array import _pool

N = 40_000  # 320 kB of float64: above the lowered threshold
CHUNK = 8 * 10_000  # four chunks


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[_pool.Pool]:
    fresh = _pool.Pool(4 * 8 * N)
    monkeypatch.setattr(_pool, "POOL", fresh)
    monkeypatch.setattr(_pool, "MIN_BYTES", 8 * N // 2)
    return fresh


def address(value: np.ndarray[Any, Any]) -> int:
    return int(value.__array_interface__["data"][0])


def chain(xp: Any, a: Any, b: Any) -> Any:
    c = a * 1.5 + b
    return xp.sqrt(xp.abs(c * c - a)) + 2.0


def test_a_free_base_is_reused_and_a_held_one_is_not(pool: _pool.Pool) -> None:
    dt = np.dtype(np.float64)
    first = pool.empty((N,), dt)
    held = first[10:20]  # a view keeps the base in use
    del first
    second = pool.empty((N,), dt)
    assert address(second) != address(held) - 80
    assert pool.kept == 2 * 8 * N
    del held
    gc.collect()
    third = pool.empty((N // 2, 2), dt)  # any shape of the size, C-contiguous
    assert third.flags.c_contiguous
    assert third.shape == (N // 2, 2)
    assert pool.kept == 2 * 8 * N  # reused, not allocated
    del second, third
    small = pool.empty((10,), dt)  # below the threshold: a plain allocation
    assert small.base is None
    assert len(pool.bases) == 2


def test_a_small_result_does_not_take_a_base_more_than_twice_its_size(
    pool: _pool.Pool,
) -> None:
    dt = np.dtype(np.float64)
    big = pool.empty((2 * N,), dt)
    big_at = address(big)
    del big  # free, but four times the next request
    small = pool.empty((N // 2,), dt)
    assert address(small) != big_at
    assert len(pool.bases) == 2
    del small
    again = pool.empty((2 * N,), dt)  # the large base is still there for a large result
    assert address(again) == big_at


def test_the_limit_evicts_free_bases_and_never_one_in_use(pool: _pool.Pool) -> None:
    dt = np.dtype(np.float64)
    live = [pool.empty((N,), dt) for _ in range(4)]  # the limit: four
    extra = pool.empty((N,), dt)  # nothing free to evict: plain
    assert extra.base is None
    assert pool.kept == 4 * 8 * N
    del live[:2]
    bigger = pool.empty((2 * N,), dt)  # no free base is large enough: evicts both free ones
    assert bigger.base is not None
    assert len(pool.bases) == 3
    assert pool.kept == 4 * 8 * N
    assert all(np.shares_memory(x, b) for x, b in zip([*live, bigger], pool.bases, strict=True))
    off = _pool.Pool(0)
    assert off.empty((N,), dt).base is None
    assert off.kept == 0


def test_the_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIOENGINE_ARRAY_POOL_BYTES", "lots")
    with pytest.raises(ValueError, match="AIOENGINE_ARRAY_POOL_BYTES"):
        _pool._pool_bytes()
    monkeypatch.setenv("AIOENGINE_ARRAY_POOL_BYTES", "-1")
    with pytest.raises(ValueError, match=">= 0"):
        _pool._pool_bytes()
    monkeypatch.setenv("AIOENGINE_ARRAY_POOL_BYTES", "0")
    assert _pool._pool_bytes() == 0


async def test_chains_reuse_the_memory_of_dropped_results(pool: _pool.Pool) -> None:
    rng = np.random.default_rng(0)
    an, bn = rng.standard_normal(N), rng.standard_normal(N)
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        a, b = xp.asarray(an), xp.asarray(bn)
        kept = await chain(xp, a, b)  # held: its memory is never handed out again
        want = chain(np, an, bn)
        for _ in range(6):
            value = await chain(xp, a, b)
            assert not np.shares_memory(value, kept)
            np.testing.assert_array_equal(value, want)
            del value
        np.testing.assert_array_equal(kept, want)
        assert len(pool.bases) == 2  # the held result's, and one reused for the rest


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
async def test_held_values_never_change_while_results_recycle(
    pool: _pool.Pool, data: st.DataObject
) -> None:
    # Random programs: chains awaited, some values kept (whole or a view), some arrays kept,
    # in-place writes on kept arrays; every value kept must stay what it was.
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    an, bn = rng.standard_normal(N), rng.standard_normal(N)
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        a, b = xp.asarray(an), xp.asarray(bn)
        held: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []
        arrays: list[tuple[Any, np.ndarray[Any, Any]]] = []
        for step in range(data.draw(st.integers(2, 8))):
            c = chain(xp, a, b) + float(step)
            expect = chain(np, an, bn) + float(step)
            action = data.draw(st.sampled_from(["drop", "keep value", "keep view", "keep array"]))
            if action == "keep array":
                arrays.append((c, expect))
                if data.draw(st.booleans()):
                    c[:5] += 1.0
                    expect = expect.copy()
                    expect[:5] += 1.0
                    arrays[-1] = (c, expect)
            value = await c
            if action == "keep value":
                held.append((value, value.copy()))
            elif action == "keep view":
                held.append((value[N // 3 : N // 2], value[N // 3 : N // 2].copy()))
            del c, value
            gc.collect()
        for got, copy in held:
            np.testing.assert_array_equal(got, copy)
        for array, expect in arrays:
            np.testing.assert_array_equal(await array, expect)
