"""Fusion: inline elementwise operations that read the pending result of the operation pushed
just before them join it instead of making pushes of their own (``aioengine/array/_push.py``).

What a user relies on: the values are those of the unfused program (NumPy's), the rule still
orders every write against the fused reads, a fused step's failure is that step's (and its
dependents'), raised once, and pushes are in fact saved.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import aioengine as ae
import aioengine.array as aa
from aioengine.array import _push
from aioengine.instrument import Instrument


class _Pushes(Instrument):
    def __init__(self) -> None:
        self.names: list[str] = []

    def on_push(self, op: Any) -> None:
        self.names.append(op.name)


async def test_a_chain_fuses_into_few_pushes_and_computes_what_numpy_does() -> None:
    async with ae.Engine() as engine:
        xp = aa.namespace(engine)
        c = xp.asarray(np.zeros(4))
        b = xp.asarray(np.arange(4.0))
        await c
        pushes = _Pushes()
        engine.add_instrument(pushes)
        for _ in range(500):
            c = c + b
            c = c * 1.0
        value = await c
        engine.remove_instrument(pushes)
        np.testing.assert_array_equal(value, 500 * np.arange(4.0))
        ops = [n for n in pushes.names if n != "await"]
        # 1,000 operations: one push per FUSE_MAX + 1 of them, not one each.
        assert len(ops) <= 1000 // (_push.FUSE_MAX + 1) + 2, len(ops)


async def test_an_in_place_write_between_is_ordered_before_what_follows() -> None:
    async with ae.Engine() as engine:
        xp = aa.namespace(engine)
        a = xp.asarray(np.ones(3))
        b = xp.asarray(np.full(3, 10.0))
        await a
        c1 = a + b  # the operation later ones could join
        b += 1.0  # a write on b, pushed between: ends the segment
        c2 = c1 + b  # must read b after the write
        c3 = c2 * b
        np.testing.assert_array_equal(await c2, [22.0] * 3)
        np.testing.assert_array_equal(await c3, [22.0 * 11.0] * 3)
        np.testing.assert_array_equal(await c1, [11.0] * 3)


async def test_a_raw_write_on_a_handed_out_var_between_is_ordered_too() -> None:
    async with ae.Engine() as engine:
        xp = aa.namespace(engine)
        memory = np.full(3, 10.0)
        a = xp.asarray(np.ones(3))
        b = xp.asarray(memory)  # shares memory (copy=None)
        await a
        c1 = a + b
        var = b.var  # handed out: raw pushes may name it

        def bump(rctx: ae.RunContext) -> None:
            memory[...] += 5.0

        engine.push_sync(bump, ae.cpu(), [], [var], prop=ae.FnProperty.ASYNC)
        c2 = c1 + b  # after the raw write, in push order
        np.testing.assert_array_equal(await c1, [11.0] * 3)
        np.testing.assert_array_equal(await c2, [26.0] * 3)


@pytest.mark.parametrize("await_the_failure", [True, False])
async def test_a_fused_step_that_raises_fails_it_and_its_dependents_only(
    await_the_failure: bool,
) -> None:
    async with ae.Engine() as engine:
        xp = aa.namespace(engine)
        a = xp.asarray(np.array([2, 3], dtype=np.int64))
        e = xp.asarray(np.array([-1, -1], dtype=np.int64))
        await a
        pushes = _Pushes()
        engine.add_instrument(pushes)
        h = a + e  # reads a and e: later steps reading h, a and e may join it
        bad = h**e  # joins; raises when it runs (negative integer powers)
        fine = h * a  # joins; reads no failed step
        after = bad + a  # joins; reads the failed step
        engine.remove_instrument(pushes)
        assert [n for n in pushes.names if n != "await"] == ["add"]  # all fused into h's
        np.testing.assert_array_equal(await fine, [2, 6])
        np.testing.assert_array_equal(await h, [1, 2])
        with pytest.raises(ae.DependencyError) as dep:
            await after
        assert isinstance(dep.value.__cause__, ValueError)
        if await_the_failure:
            with pytest.raises(ValueError, match="negative integer powers"):
                await bad
            with pytest.raises(ValueError, match="negative integer powers"):
                await bad  # for good
            await engine.wait_for_all()  # thrown once, by the await: not again
        else:
            with pytest.raises(ExceptionGroup) as group:
                await engine.wait_for_all()  # recorded once, as for a pushed operation
            assert [type(x) for x in group.value.exceptions] == [ValueError]


async def test_a_failure_of_the_first_fails_the_whole_group() -> None:
    async with ae.Engine() as engine:
        xp = aa.namespace(engine)
        a = xp.asarray(np.array([2, 3], dtype=np.int64))
        e = xp.asarray(np.array([-1, -1], dtype=np.int64))
        await a
        bad = a**e  # the first: raises
        later = bad + a  # joins
        with pytest.raises(ValueError, match="negative integer powers"):
            await bad
        with pytest.raises(ae.DependencyError) as dep:
            await later
        assert isinstance(dep.value.__cause__, ValueError)
        await engine.wait_for_all()
