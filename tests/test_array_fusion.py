"""Fusion: inline elementwise operations that read the pending result of the operation pushed
just before them join it instead of making pushes of their own (``aioengine/array/_push.py``).

What a user relies on: the values are those of the unfused program (NumPy's), the rule still
orders every write against the fused reads, a fused step's failure is that step's (and its
dependents'), raised once, and pushes are in fact saved.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import aioengine as ae
import aioengine.array as aa
from aioengine.array import _push

from .helpers import Pushes, chain


async def test_a_chain_fuses_into_few_pushes_and_computes_what_numpy_does() -> None:
    async with ae.Engine() as engine:
        xp = aa.namespace(engine)
        c = xp.asarray(np.zeros(4))
        b = xp.asarray(np.arange(4.0))
        await c
        with Pushes(engine) as pushes:
            for _ in range(500):
                c = c + b
                c = c * 1.0
            value = await c
        np.testing.assert_array_equal(value, 500 * np.arange(4.0))
        ops = pushes.ops()
        # 1,000 operations: one push per FUSE_MAX + 1 of them, not one each.
        assert len(ops) <= 1000 // (_push.FUSE_MAX + 1) + 2, len(ops)


async def test_a_loop_of_small_operations_that_never_yields_computes_groups_as_they_fill() -> None:
    # The loop does not turn while the coroutine records (no await): a full group is
    # computed at once (its turn has come), so few operations are pending at any time, not
    # every one pushed (memory), and the values are the unfused program's.
    async with ae.Engine() as engine:
        xp = aa.namespace(engine)
        b = xp.asarray(np.arange(4.0))
        c = xp.asarray(np.zeros(4))
        await c
        await b
        group = _push.FUSE_MAX + 1
        kept = []
        for i in range(5 * group):
            c = c + b
            if i % group == 0:
                kept.append(c)
        assert [x.ready for x in kept] == [True] * 4 + [False]  # the last group is pending
        stats = engine.statistics()
        assert stats.waiting + stats.queued <= 2, stats  # the last group's push, at most
        np.testing.assert_array_equal(await c, 5 * group * np.arange(4.0))
        for k, x in enumerate(kept):
            np.testing.assert_array_equal(await x, (k * group + 1) * np.arange(4.0))


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
        with Pushes(engine) as pushes:
            h = a + e  # reads a and e: later steps reading h, a and e may join it
            bad = h**e  # joins; raises when it runs (negative integer powers)
            fine = h * a  # joins; reads no failed step
            after = bad + a  # joins; reads the failed step
        assert pushes.ops() == ["add"]  # all fused into h's
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


async def test_a_chain_of_unary_functions_and_inputs_it_read_before_fuses() -> None:
    async with ae.Engine() as engine:
        xp = aa.namespace(engine)
        an = np.linspace(-2.0, 2.0, 100)
        bn = np.linspace(1.0, 3.0, 100)
        a, b = xp.asarray(an), xp.asarray(bn)
        await a
        with Pushes(engine) as pushes:
            value = await chain(xp, a, b)
        np.testing.assert_array_equal(value, chain(np, an, bn))
        # 14 operations: ``a * 0.5`` reads no result of the group, so it and the
        # subtraction after it start groups of their own; every other step joins.
        assert pushes.ops() == ["multiply", "multiply", "subtract"]


async def test_a_write_on_an_input_read_without_a_turn_waits_for_that_read() -> None:
    async with ae.Engine() as engine:
        xp = aa.namespace(engine)
        g = xp.asarray(np.ones(3))
        b = xp.asarray(np.full(3, 10.0))
        await b
        gate = asyncio.Event()

        async def late(rctx: ae.RunContext) -> None:
            await gate.wait()

        # The group's first operation waits for a raw write on g's Var (held back).
        engine.push_async(late, ae.cpu(), [], [g.var])
        a = g * 1.0  # pending until the gate opens
        d = a + b  # joins a's operation, reading b (computed) without a turn on b's Var
        b += 5.0  # must wait for that read
        e = b * 1.0
        # An operation ready at once, pushed after the write: the loop runs its ready inline
        # operations in push order, so an unordered write would have run by the time it has.
        await (xp.asarray(np.zeros(1)) + 1.0)
        assert not d.ready
        gate.set()
        np.testing.assert_array_equal(await d, [11.0] * 3)  # d read b before the write
        np.testing.assert_array_equal(await e, [15.0] * 3)


async def test_inputs_read_by_every_iteration_keep_a_short_list_of_readers() -> None:
    for chunk_bytes, n in ((None, 100), (8192, 20_000)):  # inline, then chunked
        async with ae.Engine() as engine:
            xp = aa.namespace(engine, chunk_bytes=chunk_bytes)
            a = xp.asarray(np.ones(n))
            b = xp.asarray(np.full(n, 2.0))
            await a
            for _ in range(200):
                c = xp.sqrt(a * 1.5) + b
                await c
            buf = b._buf
            # Each iteration registers one reader a chunk of c; the finished ones go.
            per_iteration = 1 if chunk_bytes is None else -(-n // (chunk_bytes // 8))
            assert len(buf.readers or ()) <= 2 * per_iteration, len(buf.readers or ())
            b += 1.0  # waits for no reader left behind
            np.testing.assert_array_equal(await (a + b), np.full(n, 4.0))


async def test_a_unary_function_that_returns_its_input_gives_a_new_array() -> None:
    async with ae.Engine() as engine:
        xp = aa.namespace(engine)
        x = xp.asarray(np.arange(3.0))
        y = xp.real(x)  # NumPy returns x itself
        y += 1.0
        np.testing.assert_array_equal(await x, [0.0, 1.0, 2.0])
        np.testing.assert_array_equal(await y, [1.0, 2.0, 3.0])
