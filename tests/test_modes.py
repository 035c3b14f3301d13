"""Commute and concurrent access modes through the engine: ordering, overlap, failures,
threads, serial mode and a random-program model test (hypothesis)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import aioengine as ae

from .helpers import Boom


class Spans:
    """Start and end ticks of every operation body, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tick = 0
        self.start: dict[str, int] = {}
        self.end: dict[str, int] = {}

    def enter(self, name: str) -> None:
        with self._lock:
            self._tick += 1
            self.start[name] = self._tick

    def leave(self, name: str) -> None:
        with self._lock:
            self._tick += 1
            self.end[name] = self._tick

    def before(self, a: str, b: str) -> bool:
        return self.end[a] < self.start[b]

    def apart(self, a: str, b: str) -> bool:
        return self.before(a, b) or self.before(b, a)


def run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(), 30))


def test_commute_members_run_as_their_inputs_become_ready_one_at_a_time() -> None:
    async def main() -> None:
        engine = ae.Engine(cpu_workers=4)
        acc = engine.new_var("acc")
        inputs = [engine.new_var(f"in{k}") for k in range(4)]
        gates = [asyncio.Event() for _ in inputs]
        for gate, v in zip(gates, inputs, strict=True):
            engine.push_async(lambda rctx, g=gate: g.wait(), mutate_vars=[v])
        spans = Spans()
        order: list[int] = []

        added = [asyncio.Event() for _ in inputs]
        loop = asyncio.get_running_loop()

        def add(rctx: ae.RunContext, k: int) -> None:
            spans.enter(f"c{k}")
            time.sleep(0.002)
            order.append(k)
            spans.leave(f"c{k}")
            loop.call_soon_threadsafe(added[k].set)

        ops = [
            engine.push_sync(
                lambda rctx, k=k: add(rctx, k), const_vars=[inputs[k]], commute_vars=[acc]
            )
            for k in range(4)
        ]
        after = engine.push_sync(
            lambda rctx: spans.enter("r") or spans.leave("r"), const_vars=[acc]
        )
        for k in (3, 1, 2, 0):  # inputs ready in another order than push order
            gates[k].set()
            await added[k].wait()
        await asyncio.gather(*ops, after)
        assert order == [3, 1, 2, 0]
        names = [f"c{k}" for k in range(4)]
        for i, a in enumerate(names):
            assert spans.before(a, "r")
            for b in names[i + 1 :]:
                assert spans.apart(a, b)
        assert acc.version == 4
        await engine.aclose()

    run(main)


def test_concurrent_members_overlap_and_a_read_waits_for_the_group() -> None:
    async def main() -> None:
        engine = ae.Engine(cpu_workers=3)
        log = engine.new_var("log")
        barrier = threading.Barrier(3, timeout=10)  # breaks unless all three run together
        spans = Spans()

        def member(rctx: ae.RunContext, k: int) -> None:
            spans.enter(f"k{k}")
            barrier.wait()
            spans.leave(f"k{k}")

        ops = [
            engine.push_sync(lambda rctx, k=k: member(rctx, k), concurrent_vars=[log])
            for k in range(3)
        ]
        reader = engine.push_sync(
            lambda rctx: spans.enter("r") or spans.leave("r"), const_vars=[log]
        )
        await asyncio.gather(*ops, reader)
        assert all(spans.before(f"k{k}", "r") for k in range(3))
        await engine.aclose()

    run(main)


def test_var_in_two_modes_counts_as_a_write_and_duplicates_are_dropped() -> None:
    async def main() -> None:
        engine = ae.Engine()
        x, y = engine.new_var("x"), engine.new_var("y")
        gate = asyncio.Event()
        op = engine.push_async(
            lambda rctx: gate.wait(),
            const_vars=[x],
            commute_vars=[x, y, y],
            concurrent_vars=[],
        )
        assert x.statistics().pending_write
        assert x.statistics().mode == "write"
        assert y.statistics().mode == "commute"
        assert y.statistics().pending_reads == 1
        gate.set()
        await op
        handle = engine.new_operator(lambda rctx: None, commute_vars=[y], concurrent_vars=[x])
        assert handle.commute_vars == (y,)
        assert handle.concurrent_vars == (x,)
        assert handle.mutate_vars == ()
        assert handle.const_vars == ()
        await engine.push(handle)
        assert (x.version, y.version) == (2, 2)
        await engine.aclose()

    run(main)


def test_failed_commute_member_skips_unstarted_members_and_later_ops_until_waited() -> None:
    async def main() -> None:
        engine = ae.Engine(cpu_workers=2)
        acc = engine.new_var("acc")
        first = engine.push_sync(lambda rctx: _raise(), commute_vars=[acc])
        rest = [engine.push_sync(lambda rctx: None, commute_vars=[acc]) for _ in range(3)]
        later = engine.push_sync(lambda rctx: None, const_vars=[acc])
        with pytest.raises(Boom):
            await first
        for op in (*rest, later):
            with pytest.raises(ae.DependencyError):
                await op
        with pytest.raises(Boom):
            await engine.wait_for_var(acc)
        assert await engine.push_sync(lambda rctx: 7, const_vars=[acc]) == 7
        await engine.aclose()

    run(main)


def _raise() -> None:
    raise Boom("boom")


def test_opposite_order_multi_var_commute_pushes_from_two_threads_never_deadlock() -> None:
    async def main() -> None:
        engine = ae.Engine(cpu_workers=4)
        x, y = engine.new_var("x"), engine.new_var("y")
        counts = {"x": 0, "y": 0}
        busy = threading.Lock()
        overlaps: list[int] = []

        def body(rctx: ae.RunContext) -> None:
            if not busy.acquire(blocking=False):  # both tokens held: nobody else inside
                overlaps.append(1)
                return
            counts["x"] += 1
            counts["y"] += 1
            busy.release()

        ops: list[ae.Operation[None]] = []
        lock = threading.Lock()

        def pusher(order: list[ae.Var]) -> None:
            for _ in range(300):
                op = engine.push_sync(body, commute_vars=order)
                with lock:
                    ops.append(op)

        for _ in range(3):
            threads = [
                threading.Thread(target=pusher, args=([x, y],)),
                threading.Thread(target=pusher, args=([y, x],)),
            ]
            for t in threads:
                t.start()
            for t in threads:
                await asyncio.to_thread(t.join)
            await asyncio.wait_for(engine.wait_for_all(), 20)
            engine._core.validate_state()
        assert not overlaps
        assert counts == {"x": 1800, "y": 1800}
        await engine.aclose()

    run(main)


def test_serial_mode_runs_commute_and_concurrent_one_at_a_time_in_push_order() -> None:
    async def main() -> None:
        engine = ae.Engine(serial=True)
        x = engine.new_var("x")
        order: list[int] = []
        for k in range(6):
            mode = {"commute_vars": [x]} if k % 2 else {"concurrent_vars": [x]}
            engine.push_sync(lambda rctx, k=k: order.append(k), **mode)
        await engine.wait_for_all()
        assert order == list(range(6))
        await engine.aclose()

    run(main)


def test_gpu_context_runs_commute_and_concurrent_as_writes_in_push_order() -> None:
    """On a GPU context the modes run as writes (push order, one of the orders they allow):
    the device work of each is fenced after the previous one's."""

    async def main() -> None:
        engine = ae.Engine(gpu_backend=ae.SimulatedGPU(devices=1), gpu_workers=2)
        acc = engine.new_var("acc")
        data = np.zeros(1)
        steps: list[tuple[str, Any, int]] = [
            ("commute_vars", np.add, 1),
            ("concurrent_vars", np.add, 2),
            ("mutate_vars", np.multiply, 3),
            ("commute_vars", np.add, 4),
            ("concurrent_vars", np.multiply, 5),
        ]
        for mode, ufunc, k in steps:
            engine.push_sync(
                lambda r, u=ufunc, k=k: r.launch(u, data, k, data), ae.gpu(0), **{mode: [acc]}
            )
            assert acc.statistics().mode in ("write", None)
        got = await engine.push_sync(lambda r: float(data[0]), const_vars=[acc])
        assert got == ((0 + 1 + 2) * 3 + 4) * 5
        assert acc.version == 5
        await engine.aclose()

    run(main)


# -- the model test -------------------------------------------------------------------

MODES = ("none", "read", "write", "commute", "concurrent")
KINDS = ("sync", "coro", "callback")


@dataclass(frozen=True)
class Op:
    name: str
    modes: tuple[str, ...]  # per Var
    kind: str
    raises: bool
    cancel: bool


ops_strategy = st.builds(
    Op,
    name=st.just(""),
    # Weighted towards the new modes, so that groups of several members are common.
    modes=st.tuples(*[st.sampled_from((*MODES, "commute", "commute", "concurrent"))] * 3),
    kind=st.sampled_from(KINDS),
    raises=st.sampled_from([False] * 5 + [True]),
    cancel=st.sampled_from([False] * 6 + [True]),
)


def groups(program: list[Op]) -> dict[tuple[int, str], int]:
    """The group of every (op, Var) access: consecutive same set modes share one."""
    out: dict[tuple[int, str], int] = {}
    for var in range(3):
        gid, last = 0, None
        for i, op in enumerate(program):
            mode = op.modes[var]
            if mode == "none" or op.cancel:
                continue
            if mode == "write" or mode != last:
                gid += 1
            last = mode
            out[i, str(var)] = gid
    return out


async def run_program(program: list[Op], serial: bool) -> None:
    engine = ae.Engine(cpu_workers=3, serial=serial)
    vs = [engine.new_var(f"v{k}") for k in range(3)]
    values = [0, 0, 0]
    spans = Spans()
    locks = [threading.Lock() for _ in range(3)]
    gate = asyncio.Event()
    engine.push_async(lambda rctx: gate.wait(), mutate_vars=vs, prop=ae.FnProperty.NO_SKIP)

    def effect(i: int, op: Op) -> None:
        """Writes are not commutative (x*3+i), commute and concurrent add i+1; a commute
        read-modify-write spans a sleep, so two members that overlapped would lose one."""
        for var, mode in enumerate(op.modes):
            if mode == "write":
                values[var] = values[var] * 3 + i
            elif mode == "commute":
                old = values[var]
                time.sleep(0.001)
                values[var] = old + i + 1
            elif mode == "concurrent":
                with locks[var]:
                    values[var] += i + 1

    async def effect_async(i: int, op: Op) -> None:
        """:func:`effect` for a coroutine: its commute read-modify-write spans an await."""
        for var, mode in enumerate(op.modes):
            if mode == "commute":
                old = values[var]
                await asyncio.sleep(0.001)
                values[var] = old + i + 1
        effect(
            i,
            Op(op.name, tuple("none" if m == "commute" else m for m in op.modes), "", False, False),
        )

    ops: list[ae.Operation[Any]] = []
    for i, op in enumerate(program):
        name = f"op{i}"
        lists: dict[str, list[ae.Var]] = {m: [] for m in MODES}
        for var, mode in enumerate(op.modes):
            lists[mode].append(vs[var])
        kw: dict[str, Any] = {
            "const_vars": lists["read"],
            "mutate_vars": lists["write"],
            "commute_vars": lists["commute"],
            "concurrent_vars": lists["concurrent"],
        }

        def sync_body(rctx: ae.RunContext, i: int = i, op: Op = op, name: str = name) -> None:
            spans.enter(name)
            effect(i, op)
            spans.leave(name)
            if op.raises:
                raise Boom(name)

        async def coro_body(rctx: ae.RunContext, i: int = i, op: Op = op, name: str = name) -> None:
            spans.enter(name)
            await effect_async(i, op)
            spans.leave(name)
            if op.raises:
                raise Boom(name)

        def cb_body(
            rctx: ae.RunContext, done: ae.OnComplete, i: int = i, op: Op = op, name: str = name
        ) -> None:
            spans.enter(name)
            effect(i, op)
            spans.leave(name)
            done(Boom(name) if op.raises else None)

        if op.kind == "sync":
            pushed = engine.push_sync(sync_body, name=name, **kw)
        elif op.kind == "coro":
            pushed = engine.push_async(coro_body, name=name, **kw)
        else:
            pushed = engine.push_async(cb_body, name=name, **kw)
        if op.cancel:
            pushed.cancel()
        ops.append(pushed)
    engine._core.validate_state()  # groups admitted and queued behind the blocker
    gate.set()
    outcome: dict[int, str] = {}
    for i, pushed in enumerate(ops):
        engine._core.validate_state()  # while members run, park and wake
        try:
            await asyncio.wait_for(asyncio.shield(pushed), 10)  # nothing hangs
            outcome[i] = "ran"
        except Boom:
            outcome[i] = "failed"
        except ae.DependencyError:
            outcome[i] = "skipped"
        except asyncio.CancelledError:
            outcome[i] = "cancelled"
    with pytest.raises(Exception) if any(o == "failed" for o in outcome.values()) else _nothing():
        await asyncio.wait_for(engine.wait_for_all(), 10)
    engine._core.validate_state()
    await engine.aclose()
    check(program, outcome, spans, values)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def check(program: list[Op], outcome: dict[int, str], spans: Spans, values: list[int]) -> None:
    group = groups(program)
    ran = [i for i, o in outcome.items() if o in ("ran", "failed")]
    # Ordering: accesses in different groups of a Var run in push order; members of one
    # commute group never overlap.
    for a in ran:
        for b in ran:
            if a >= b:
                continue
            for var in map(str, range(3)):
                if (a, var) not in group or (b, var) not in group:
                    continue
                if group[a, var] != group[b, var]:
                    assert spans.before(f"op{a}", f"op{b}"), (a, b, var)
                elif program[a].modes[int(var)] == "commute":
                    assert spans.apart(f"op{a}", f"op{b}"), (a, b, var)
    for i, op in enumerate(program):
        if op.cancel:
            assert outcome[i] == "cancelled"
    # The sequential program, with the fates observed for the members of a group where a
    # failure happened (they may have run before it or been skipped after it) and checked
    # for everyone else.
    failed_vars: set[int] = set()
    uncertain = {
        (var, group[i, str(var)])
        for i, op in enumerate(program)
        for var in range(3)
        if (i, str(var)) in group
        and op.modes[var] in ("commute", "concurrent")
        and outcome[i] != "ran"
    }
    expect = [0, 0, 0]
    for i, op in enumerate(program):
        if op.cancel:
            continue
        touched = [var for var, m in enumerate(op.modes) if m != "none"]
        free = not any(
            op.modes[var] in ("commute", "concurrent") and (var, group[i, str(var)]) in uncertain
            for var in touched
        )
        fate = (
            "skipped"
            if any(var in failed_vars for var in touched)
            else ("failed" if op.raises else "ran")
        )
        if free:
            assert outcome[i] == fate, (i, outcome[i], fate)
        else:
            fate = outcome[i]
            assert fate in ("ran", "failed", "skipped"), (i, fate)
        if fate in ("ran", "failed"):
            for var, mode in enumerate(op.modes):
                if mode == "write":
                    expect[var] = expect[var] * 3 + i
                elif mode in ("commute", "concurrent"):
                    expect[var] += i + 1
        if fate != "ran":
            failed_vars.update(var for var in touched if op.modes[var] not in ("none", "read"))
    assert values == expect


@pytest.mark.parametrize("serial", [False, True], ids=["threaded", "serial"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(ops_strategy, min_size=1, max_size=10))
@example(program=[Op("", ("commute", "read", "none"), kind, False, False) for kind in KINDS * 2])
def test_random_programs_keep_group_order_exclusion_and_values(
    serial: bool, program: list[Op]
) -> None:
    asyncio.run(run_program(program, serial))


# -- reductions: submit(accumulate=) ---------------------------------------------------


def test_submit_accumulate_runs_calls_in_parallel_and_merges_each_once() -> None:
    async def main() -> None:
        engine = ae.Engine(cpu_workers=4)
        total = engine.new_var("total", value=0)
        barrier = threading.Barrier(4, timeout=10)  # the calls hold no turn on total

        def part(k: int) -> int:
            barrier.wait()
            return k

        ops = [engine.submit(part, k, accumulate=total) for k in range(1, 5)]
        assert [await op for op in ops] == [1, 2, 3, 4]
        assert await total.get() == 10
        await engine.aclose()

    run(main)


def test_submit_accumulate_ordered_merges_in_push_order() -> None:
    async def main() -> None:
        engine = ae.Engine(cpu_workers=4)
        gates = [asyncio.Event() for _ in range(4)]
        log = engine.new_var("log")  # no value yet: the first merge's result is taken as is

        async def part(k: int) -> list[int]:
            await gates[k].wait()
            return [k]

        unordered = engine.new_var("unordered", value=[])
        for k in range(4):
            engine.submit(part, k, accumulate=log, ordered=True)
            engine.submit(part, k, accumulate=unordered)
        for k in (2, 0, 3, 1):
            gates[k].set()
            await asyncio.sleep(0.01)
        assert await log.get() == [0, 1, 2, 3]
        assert sorted(await unordered.get()) == [0, 1, 2, 3]
        await engine.aclose()

    run(main)


def test_submit_accumulate_with_merge_and_op_decorator_and_failure() -> None:
    async def main() -> None:
        engine = ae.Engine(cpu_workers=2)
        best = engine.new_var("best", value=0)

        @engine.op(accumulate=best, merge=max)
        def score(x: int) -> int:
            if x < 0:
                raise Boom(x)
            return x * x

        for x in (3, 1, 2):
            score(x)
        assert await best.get() == 9
        failing = score(-1)
        with pytest.raises(ae.DependencyError):
            await failing  # the merge is skipped; fn's failure stays on best
        with pytest.raises(Boom):
            await engine.wait_for_var(best)
        with pytest.raises(TypeError):
            engine.submit(score, 1, accumulate=best, out=best)
        with pytest.raises(ValueError, match="accumulate"):
            engine.submit(lambda v: v, best, accumulate=best)
        await engine.aclose()

    run(main)


def test_statistics_dump_graph_and_trace_show_each_access_mode() -> None:
    async def main() -> None:
        engine = ae.Engine(cpu_workers=2)
        acc, log = engine.new_var("acc"), engine.new_var("log")
        gate = asyncio.Event()
        engine.push_async(lambda rctx: gate.wait(), mutate_vars=[acc, log], name="blocker")
        engine.push_sync(lambda rctx: None, commute_vars=[acc], name="c1")
        engine.push_sync(lambda rctx: None, commute_vars=[acc], concurrent_vars=[log], name="c2")
        engine.push_sync(lambda rctx: None, const_vars=[acc], name="r")
        assert acc.statistics().waiting_modes == ("commute", "commute", "read")
        dump = engine.dump()
        waits = {op.name: op.waits for op in dump.ops}
        assert waits["c2"] == (("acc", "commute"), ("log", "concurrent"))
        acc_row = next(v for v in dump.vars if v.name == "acc")
        assert [mode for _, mode in acc_row.waiters] == ["commute", "commute", "read"]
        assert "commute" in str(dump)
        graph = engine.graph()
        node = next(n for n in graph.nodes if n.name == "c2")
        assert node.modes_line == "commute: acc · concurrent: log"
        assert "commute: acc" in graph.to_dot()
        assert "commute: acc" in graph.to_mermaid()
        # groups: both commute members follow the blocker, the read follows both
        assert {("blocker", "c1", "acc"), ("blocker", "c2", "acc")} <= graph.named_edges()
        assert {("c1", "r", "acc"), ("c2", "r", "acc")} <= graph.named_edges()
        assert ("c1", "c2", "acc") not in graph.named_edges()
        with pytest.raises(TimeoutError, match="commute"):
            await engine.wait_for_var(acc, timeout=0.01)
        async with engine.trace() as session:
            gate.set()
            await engine.wait_for_all()
        args = {
            e["args"]["name"]: e["args"]
            for e in session.trace["traceEvents"]
            if e.get("ph") == "X" and "args" in e and "name" in e["args"]
        }
        assert args["c2"]["commute_vars"] == ["acc"]
        assert args["c2"]["concurrent_vars"] == ["log"]
        assert args["c2"]["mutate_vars"] == []
        assert "commute_vars" not in args["r"]
        await engine.aclose()

    run(main)


def test_wait_for_var_inside_a_commute_member_sees_a_contender_behind_it() -> None:
    """A contender parked for the token the running member holds cannot start before it:
    waiting inside the member for a Var that contender holds raises instead of hanging."""

    async def main() -> None:
        engine = ae.Engine()
        acc, y = engine.new_var("acc"), engine.new_var("y")

        async def member(rctx: ae.RunContext) -> None:
            with pytest.raises(RuntimeError, match="deadlock"):
                await engine.wait_for_var(y)

        first = engine.push_async(member, commute_vars=[acc])
        engine.push_sync(lambda rctx: None, mutate_vars=[y], commute_vars=[acc])
        await first
        await asyncio.wait_for(engine.wait_for_all(), 5)
        await engine.aclose()

    run(main)


def test_a_concurrent_member_awaits_a_child_that_joins_its_group() -> None:
    """A child pushed inside a concurrent member with the same concurrent_vars joins the
    running group (nothing is queued ahead of it), so awaiting it cannot deadlock (it was
    refused); a child queued behind a writer pushed in between would, and is refused; a
    commute child waits for the token its parent holds, and is refused."""

    async def main() -> None:
        async with ae.Engine() as engine:
            v = engine.new_var("v")

            async def child(rctx: ae.RunContext) -> str:
                return "child"

            async def joins(rctx: ae.RunContext) -> str:
                return await engine.push_async(child, concurrent_vars=[v])

            assert await asyncio.wait_for(engine.push_async(joins, concurrent_vars=[v]), 5) == (
                "child"
            )

            async def behind_a_writer(rctx: ae.RunContext) -> None:
                engine.push_sync(lambda r: None, mutate_vars=[v])
                late = engine.push_async(child, concurrent_vars=[v])
                with pytest.raises(RuntimeError, match="deadlock"):
                    await late

            await asyncio.wait_for(engine.push_async(behind_a_writer, concurrent_vars=[v]), 5)

            async def commute(rctx: ae.RunContext) -> None:
                with pytest.raises(RuntimeError, match="deadlock"):
                    await engine.push_async(child, commute_vars=[v])

            await asyncio.wait_for(engine.push_async(commute, commute_vars=[v]), 5)
            await asyncio.wait_for(engine.wait_for_all(), 5)

    run(main)
