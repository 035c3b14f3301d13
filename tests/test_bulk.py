"""Bulk execution (``with engine.bulk(n):``): inline operations grouped into segments.

A segment holds the union of its members' Vars and runs them in push order; each member keeps
its own result, failure, skip and cancellation. Tests that a segment formed observe its one
visible cost, granularity: a member waits for every Var of its segment. Those run on a threaded
engine only: serial mode runs every operation in push order anyway, so there they could not fail.
The random programs of ``test_model.py`` also run inside bulk scopes against the sequential model.
"""

from __future__ import annotations

import asyncio
import gc
import random
import threading
import weakref
from typing import Any

import pytest

import aioengine as ae

from .conftest import Blocker
from .helpers import Boom

ASYNC = ae.FnProperty.ASYNC


def record(trace: list[str], name: str) -> Any:
    def fn(rctx: ae.RunContext) -> str:
        trace.append(name)
        return name

    return fn


def inline(
    engine: ae.Engine,
    fn: Any,
    *,
    const: list[ae.Var] | None = None,
    mutate: list[ae.Var] | None = None,
    name: str | None = None,
) -> ae.Operation[Any]:
    return engine.push_sync(
        fn, const_vars=const or [], mutate_vars=mutate or [], prop=ASYNC, name=name
    )


async def hold_x(engine: ae.Engine) -> tuple[ae.Var, ae.Var, list[str], Blocker]:
    """Vars x and y, and a running blocker that holds x until released (trace shared)."""
    x, y = engine.new_var("x"), engine.new_var("y")
    trace: list[str] = []
    blocker = Blocker(engine, trace, mutate=[x])
    await blocker.started.wait()
    return x, y, trace, blocker


async def settle_loop_queue(engine: ae.Engine) -> None:
    """Push an inline op on a fresh Var and await it: the loop runs its ready inline ops in
    push order, so every one that was ready before this push has run when it returns."""
    await inline(engine, lambda rctx: None, mutate=[engine.new_var("probe")])


async def test_random_inline_program_matches_push_order(engine: ae.Engine) -> None:
    """Each op sees exactly the writes pushed before it; every write counts in version."""
    rng = random.Random(7)
    vs = [engine.new_var(f"v{k}") for k in range(6)]
    values = [0] * len(vs)
    expected_values = [0] * len(vs)
    seen: dict[int, tuple[int, ...]] = {}
    expected_seen: dict[int, tuple[int, ...]] = {}
    writes = [0] * len(vs)
    ops = []
    with engine.bulk(16):
        for i in range(500):
            reads = rng.sample(range(len(vs)), rng.randint(0, 2))
            wr = rng.sample(range(len(vs)), rng.randint(1, 2))

            def fn(
                rctx: ae.RunContext, i: int = i, reads: list[int] = reads, wr: list[int] = wr
            ) -> int:
                seen[i] = tuple(values[k] for k in (*reads, *wr))
                for k in wr:
                    values[k] = i
                return i

            expected_seen[i] = tuple(expected_values[k] for k in (*reads, *wr))
            for k in wr:
                expected_values[k] = i
                writes[k] += 1
            ops.append(inline(engine, fn, const=[vs[k] for k in reads], mutate=[vs[k] for k in wr]))
    await engine.wait_for_all()
    assert [await op for op in ops] == list(range(500))
    assert seen == expected_seen
    assert values == expected_values
    assert [v.version for v in vs] == writes


async def test_a_member_waits_for_every_var_of_its_segment(threaded_engine: ae.Engine) -> None:
    """The segment formed: ``b`` (on y only) waits for x, which ``a`` in its segment needs."""
    engine = threaded_engine
    x, y, trace, blocker = await hold_x(engine)
    with engine.bulk(2):
        a = inline(engine, record(trace, "a"), mutate=[x])
        b = inline(engine, record(trace, "b"), mutate=[y])
    await settle_loop_queue(engine)
    assert not b.done()
    assert trace == ["block:start"]
    blocker.release()
    assert await b == "b"
    assert await a == "a"
    assert trace == ["block:start", "block:end", "a", "b"]


async def test_without_bulk_the_same_op_does_not_wait(threaded_engine: ae.Engine) -> None:
    """The control for the test above: unbulked, ``b`` runs while x is held."""
    engine = threaded_engine
    x, y, trace, blocker = await hold_x(engine)
    a = inline(engine, record(trace, "a"), mutate=[x])
    b = inline(engine, record(trace, "b"), mutate=[y])
    assert await b == "b"
    blocker.release()
    assert await a == "a"


async def test_a_later_op_waits_for_the_whole_segment(threaded_engine: ae.Engine) -> None:
    engine = threaded_engine
    x, y, trace, blocker = await hold_x(engine)
    with engine.bulk(8):
        inline(engine, record(trace, "a"), mutate=[x])
        inline(engine, record(trace, "b"), mutate=[y])
    later = inline(engine, record(trace, "later"), const=[y])  # after b, so after the segment
    blocker.release()
    await later
    assert trace == ["block:start", "block:end", "a", "b", "later"]


async def test_awaiting_a_member_inside_the_block_does_not_hang(engine: ae.Engine) -> None:
    x = engine.new_var("x")
    with engine.bulk(1000):
        ops = [inline(engine, lambda rctx, i=i: i, mutate=[x]) for i in range(3)]
        assert await asyncio.wait_for(ops[1], 10) == 1
        assert ops[0].done()
    assert await ops[2] == 2


async def test_segments_close_on_the_next_loop_iteration(engine: ae.Engine) -> None:
    """No await of a member is needed: an open segment is queued one iteration later."""
    x = engine.new_var("x")
    done = asyncio.Event()
    with engine.bulk(1000):
        op = inline(engine, lambda rctx: done.set(), mutate=[x])
        await asyncio.wait_for(done.wait(), 10)
        assert op.done()


async def test_segments_let_the_loop_breathe_by_their_members(engine: ae.Engine) -> None:
    """Every member counts towards the loop's batch of inline work, not each segment once:
    ten segments of 100 ops do not keep the loop's other callbacks waiting for all 1000."""
    trace: list[str] = []
    with engine.bulk(100):
        for i in range(1000):
            inline(engine, lambda rctx, i=i: trace.append(f"op{i}"), mutate=[engine.new_var()])
    asyncio.get_running_loop().call_soon(trace.append, "callback")
    await engine.wait_for_all()
    assert len(trace) == 1001
    assert 0 < trace.index("callback") < 1000
    assert [t for t in trace if t != "callback"] == [f"op{i}" for i in range(1000)]


async def test_a_failure_skips_later_members_that_use_its_writes(engine: ae.Engine) -> None:
    x, y = engine.new_var("x"), engine.new_var("y")
    ran: list[str] = []

    def boom(rctx: ae.RunContext) -> None:
        ran.append("boom")
        raise Boom("x is bad")

    with engine.bulk(10):
        failed = inline(engine, boom, mutate=[x], name="boom")
        reader = inline(engine, record(ran, "reader"), const=[x])
        other = inline(engine, record(ran, "other"), mutate=[y])
        nosk = engine.push_sync(
            record(ran, "noskip"),
            const_vars=[x],
            mutate_vars=[y],
            prop=ae.FnProperty.NO_SKIP if engine.serial else ASYNC,
        )
    with pytest.raises(ExceptionGroup) as caught:
        await engine.wait_for_all()
    assert [type(e) for e in caught.value.exceptions] == [Boom]
    assert isinstance(failed.exception(), Boom)
    err = reader.exception()
    assert isinstance(err, ae.DependencyError)
    assert err.__cause__ is failed.exception()
    assert await other == "other"
    if engine.serial:  # NO_SKIP runs on the loop in serial mode, so it joins the segment
        assert await nosk == "noskip"
        assert ran == ["boom", "other", "noskip"]
    else:
        assert isinstance(nosk.exception(), ae.DependencyError)
        assert ran == ["boom", "other"]
    assert (x.version, y.version) == (1, 2)  # a failed or skipped write counts too


async def test_a_failure_keeps_no_other_member_alive(engine: ae.Engine) -> None:
    """A failure's traceback reaches the frame that ran the segment: the frame must not keep
    the results and Vars of the members that ran after the failed one, as without bulk."""

    class Big:
        """Stands for a large result (an array)."""

    results: list[weakref.ref[Big]] = []
    var_refs: list[weakref.ref[ae.Var]] = []

    def ok(rctx: ae.RunContext) -> Big:
        big = Big()
        results.append(weakref.ref(big))
        return big

    def boom(rctx: ae.RunContext) -> None:
        raise Boom

    ops = []
    with engine.bulk(8):
        for fn in (ok, boom, ok):
            v = engine.new_var()
            var_refs.append(weakref.ref(v))
            ops.append(inline(engine, fn, mutate=[v]))
    del v
    await asyncio.wait(ops)
    failed = ops[1]
    del ops
    with pytest.raises(ExceptionGroup):
        await engine.wait_for_all()
    gc.collect()
    assert isinstance(failed.exception(), Boom)  # held, with its traceback
    assert [r() for r in results] == [None, None]
    assert [r() for r in var_refs] == [None, None, None]


async def test_a_cancelled_member_never_runs(engine: ae.Engine) -> None:
    x, _, trace, blocker = await hold_x(engine)
    with engine.bulk(10):
        a = inline(engine, record(trace, "a"), mutate=[x])
        b = inline(engine, record(trace, "b"), mutate=[x])
        c = inline(engine, record(trace, "c"), mutate=[x])
    assert b.cancel() is True
    blocker.release()
    assert await c == "c"
    assert await a == "a"
    assert b.cancelled()
    assert trace == ["block:start", "block:end", "a", "c"]
    assert x.version == 3  # the blocker, a and c; a cancelled write does not count


async def test_a_member_is_finished_before_the_next_one_starts(engine: ae.Engine) -> None:
    """A segment completes each member (result, state, Var version) before it starts the
    next: one critical section does both, and the next member sees the whole completion."""
    x, _, trace, blocker = await hold_x(engine)
    seen: list[tuple[bool, object, int]] = []
    ops: list[ae.Operation[Any]] = []

    def look(rctx: ae.RunContext) -> None:
        first = ops[0]
        seen.append((first.done(), first.result() if first.done() else None, x.version))

    with engine.bulk(10):
        ops.append(inline(engine, record(trace, "a"), mutate=[x]))
        ops.append(inline(engine, look, const=[x]))
    blocker.release()
    await ops[1]
    assert seen == [(True, "a", 2)]  # the blocker's write and a's


async def test_a_member_cancelled_by_an_earlier_member_never_runs(engine: ae.Engine) -> None:
    x, _, trace, blocker = await hold_x(engine)
    ops: list[ae.Operation[Any]] = []

    def cancel_next(rctx: ae.RunContext) -> str:
        trace.append("a")
        assert ops[1].cancel() is True  # queued in the running segment: not started yet
        return "a"

    with engine.bulk(10):
        ops.append(inline(engine, cancel_next, mutate=[x]))
        ops.append(inline(engine, record(trace, "b"), mutate=[x]))
        ops.append(inline(engine, record(trace, "c"), mutate=[x]))
    blocker.release()
    assert await ops[2] == "c"
    assert ops[1].cancelled()
    assert trace == ["block:start", "block:end", "a", "c"]


async def test_a_segment_whose_members_were_all_cancelled_is_dropped(engine: ae.Engine) -> None:
    x = engine.new_var("x")
    trace: list[str] = []
    with engine.bulk(10):
        ops = [inline(engine, record(trace, f"m{i}"), mutate=[x]) for i in range(3)]
        assert all(op.cancel() for op in ops)
    await engine.wait_for_all()
    await engine.wait_for_var(x)
    assert trace == []
    assert x.version == 0
    assert engine.pending == 0


async def test_other_operations_are_not_grouped(threaded_engine: ae.Engine) -> None:
    """Thread-pool and coroutine operations inside the block run as usual, in push order."""
    engine = threaded_engine
    x = engine.new_var("x")
    order: list[str] = []
    loop_thread = threading.get_ident()

    def on_pool(rctx: ae.RunContext) -> int:
        order.append("pool")
        return threading.get_ident()

    async def coro(rctx: ae.RunContext) -> None:
        order.append("coro")

    with engine.bulk(10):
        a = inline(engine, record(order, "a"), mutate=[x])
        pool = engine.push_sync(on_pool, mutate_vars=[x])
        co = engine.push_async(coro, mutate_vars=[x])
        b = inline(engine, record(order, "b"), mutate=[x])
    await asyncio.gather(a, pool, co, b)
    assert order == ["a", "pool", "coro", "b"]
    assert pool.result() != loop_thread


async def test_the_scope_covers_its_own_task_only(threaded_engine: ae.Engine) -> None:
    engine = threaded_engine
    x, y, trace, blocker = await hold_x(engine)
    pushed = asyncio.Event()
    proceed = asyncio.Event()
    outside: list[ae.Operation[Any]] = []

    async def other_task() -> None:
        await proceed.wait()
        outside.append(inline(engine, record(trace, "outside"), mutate=[y]))
        pushed.set()

    task = asyncio.create_task(other_task())
    with engine.bulk(100):
        inline(engine, record(trace, "a"), mutate=[x])
        proceed.set()
        await pushed.wait()  # the other task pushes while this block is open
        # Not held back by x: not in the segment (were it, this would time out, not hang).
        assert await asyncio.wait_for(outside[0], 10) == "outside"
    blocker.release()
    await engine.wait_for_all()
    await task
    assert trace == ["block:start", "outside", "block:end", "a"]


async def test_tasks_and_coroutine_ops_started_in_the_block_are_not_grouped(
    threaded_engine: ae.Engine,
) -> None:
    """They copy the block's context, but are other tasks: their pushes queue on their own
    Vars, not in a segment that waits for x."""
    engine = threaded_engine
    x, y, trace, blocker = await hold_x(engine)

    async def child() -> str:
        result: str = await inline(engine, record(trace, "child"), mutate=[y])
        return result

    async def coro_op(rctx: ae.RunContext) -> str:
        result: str = await inline(engine, record(trace, "from coroutine op"), mutate=[y])
        return result

    with engine.bulk(100):
        # Both start before the segment opened by "a" closes (at the end of this iteration).
        task = asyncio.create_task(child())
        op = engine.push_async(coro_op, name="coro_op")
        inline(engine, record(trace, "a"), mutate=[x])
        # Neither waits for x (in the segment, they would, until the blocker is released).
        assert await asyncio.wait_for(task, 10) == "child"
        assert await asyncio.wait_for(op, 10) == "from coroutine op"
    blocker.release()
    await engine.wait_for_all()
    assert trace == ["block:start", "child", "from coroutine op", "block:end", "a"]


async def test_wait_for_var_inside_the_block_waits_for_the_open_segment(
    engine: ae.Engine,
) -> None:
    x = engine.new_var("x")
    with engine.bulk(1000):
        ops = [inline(engine, lambda rctx, i=i: i, mutate=[x]) for i in range(5)]
        await engine.wait_for_var(x)
        assert all(op.done() for op in ops)
    assert x.version == 5


async def test_dump_inside_the_block_shows_the_members(engine: ae.Engine) -> None:
    x, _, trace, blocker = await hold_x(engine)
    with engine.bulk(10):
        inline(engine, record(trace, "m1"), mutate=[x], name="m1")
        inline(engine, record(trace, "m2"), const=[x], name="m2")
        dump = engine.dump()
    text = str(dump)
    assert "m1" in text
    assert "m2" in text
    info = {op.name: op for op in dump.ops}
    assert info["m1"].waits == (("x", "write"),)
    assert info["m2"].waits == (("x", "read"),)
    (xinfo,) = [v for v in dump.vars if v.name == "x"]
    waiting = {seq for seq, _ in xinfo.waiters}
    assert {info["m1"].seq, info["m2"].seq} <= waiting
    blocker.release()
    await engine.wait_for_all()


async def test_a_member_shows_the_vars_its_segment_waits_for(engine: ae.Engine) -> None:
    """m2 uses only y, but its segment waits for x: dump() and a wait_for_var timeout must
    lead from m2 to x's holder, the real reason m2 has not run."""
    x, y, trace, blocker = await hold_x(engine)
    with engine.bulk(10):
        inline(engine, record(trace, "m1"), mutate=[x], name="m1")
        inline(engine, record(trace, "m2"), mutate=[y], name="m2")
    info = {op.name: op for op in engine.dump().ops}
    assert info["m2"].holds == (("y", "write"),)
    assert info["m2"].waits == (("x", "via its bulk segment"),)
    with pytest.raises(TimeoutError) as timed_out:
        await engine.wait_for_var(y, timeout=0.01)
    message = str(timed_out.value)
    assert "waits for 'x' (via its bulk segment)" in message
    assert "'block' running" in message  # the operation holding x
    blocker.release()
    await engine.wait_for_all()
    assert trace == ["block:start", "block:end", "m1", "m2"]


async def test_a_trace_shows_every_member(engine: ae.Engine) -> None:
    x = engine.new_var("x")
    engine.start_trace()
    with engine.bulk(4):
        for i in range(10):
            inline(engine, lambda rctx: None, mutate=[x], name=f"m{i}")
    await engine.wait_for_all()
    trace = engine.stop_trace()
    names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert {f"m{i}" for i in range(10)} <= names
    assert not any("bulk" in n for n in names)
    assert engine.statistics().done == 10


async def test_awaiting_a_member_that_waits_for_the_awaiting_op_raises(
    threaded_engine: ae.Engine,
) -> None:
    """The deadlock check looks at the member's segment: its other member needs x."""
    engine = threaded_engine
    x, y = engine.new_var("x"), engine.new_var("y")

    async def outer(rctx: ae.RunContext) -> str:
        with engine.bulk(10):
            inline(engine, lambda rctx: None, mutate=[x])
            mine = inline(engine, lambda rctx: None, mutate=[y])
            with pytest.raises(RuntimeError, match="deadlock"):
                await mine
        return "ok"

    assert await engine.push_async(outer, mutate_vars=[x]) == "ok"
    await engine.wait_for_all()


async def test_bulk_rejects_bad_sizes(engine: ae.Engine) -> None:
    for make in (engine.bulk, lambda size: ae.Bulk(engine, size)):  # built directly, too
        for bad in (1.5, "2", None, True):
            with pytest.raises(TypeError, match="size must be an int"):
                make(bad)
        for bad in (0, -3):
            with pytest.raises(ValueError, match="at least 1"):
                make(bad)


async def test_any_int_size_is_a_size(engine: ae.Engine) -> None:
    """A size past what a C integer holds is only a large size (the compiled core keeps it
    a Python int): everything pushed in the block runs, in push order."""
    x = engine.new_var("x")
    trace: list[str] = []
    names = [f"op{i}" for i in range(5)]
    with engine.bulk(2**70) as scope:
        assert scope.size == 2**70
        ops = [inline(engine, record(trace, n), mutate=[x]) for n in names]
    assert [await op for op in ops] == names
    assert trace == names


async def test_a_scope_is_entered_once(engine: ae.Engine) -> None:
    scope = engine.bulk(4)
    with scope:
        pass
    with pytest.raises(RuntimeError, match="entered already"), scope:
        pass


async def test_bulk_off_the_loop_thread_raises(engine: ae.Engine) -> None:
    engine.new_var()
    await engine.wait_for_all()  # bind the engine to this loop

    def enter() -> None:
        with engine.bulk(4):
            pass

    with pytest.raises(RuntimeError, match="event-loop thread"):
        await asyncio.to_thread(enter)


async def test_bulk_on_a_closed_engine_raises() -> None:
    engine = ae.Engine(cpu_workers=1)
    await engine.aclose()
    with pytest.raises(ae.EngineClosedError), engine.bulk(4):
        pass


def test_bulk_without_a_running_loop_raises() -> None:
    engine = ae.Engine(cpu_workers=1)
    with pytest.raises(RuntimeError, match="not bound"), engine.bulk(4):
        pass


async def test_size_one_groups_nothing(threaded_engine: ae.Engine) -> None:
    """bulk(1), even inside a larger scope, leaves ``b`` free to run while x is held."""
    engine = threaded_engine
    x, y, trace, blocker = await hold_x(engine)
    with engine.bulk(8), engine.bulk(1):
        a = inline(engine, record(trace, "a"), mutate=[x])
        b = inline(engine, record(trace, "b"), mutate=[y])
    assert await b == "b"
    blocker.release()
    assert await a == "a"


async def test_an_inner_scope_ending_restores_the_outer_one(
    threaded_engine: ae.Engine,
) -> None:
    engine = threaded_engine
    x, y, trace, blocker = await hold_x(engine)
    with engine.bulk(8):
        with engine.bulk(1):
            pass
        a = inline(engine, record(trace, "a"), mutate=[x])
        b = inline(engine, record(trace, "b"), mutate=[y])
    await settle_loop_queue(engine)
    assert not b.done()  # grouped with a again: the outer bulk(8) applies
    blocker.release()
    assert await b == "b"
    assert await a == "a"
