"""Trace export: valid Chrome trace-event JSON, nesting tracks, flows to the right operations."""

from __future__ import annotations

import asyncio
import gc
import json
import pathlib
import threading
import time
import types
import weakref
from collections import Counter
from typing import Any

import pytest

import aioengine as ae
from aioengine.observe import trace as trace_module
from aioengine.observe.history import DepTracker
from aioengine.var import COMMUTE, CONCURRENT, Var

from .helpers import Boom

PHASES = {"X", "i", "s", "f", "M"}


def check_format(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Assert the Chrome trace event format; return the events."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    events = trace["traceEvents"]
    assert isinstance(events, list)
    for e in events:
        assert e["ph"] in PHASES, e
        assert isinstance(e["name"], str)
        assert isinstance(e["pid"], int)
        if e["ph"] == "M":
            continue
        assert isinstance(e["tid"], int)
        assert isinstance(e["ts"], float), e
        assert e["ts"] >= 0, e
        if e["ph"] == "X":
            assert e["dur"] >= 0
        if e["ph"] in "sf":
            assert isinstance(e["id"], int)
    json.dumps(trace)  # serializable
    return events


def slices_by_track(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    tracks: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e["ph"] == "X":
            tracks.setdefault(e["tid"], []).append(e)
    return tracks


def check_nesting(events: list[dict[str, Any]]) -> None:
    """Slices on one track nest properly and never partly overlap."""
    for tid, slices in slices_by_track(events).items():
        stack: list[tuple[float, float]] = []
        for e in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
            start, end = e["ts"], e["ts"] + e["dur"]
            while stack and stack[-1][1] <= start + 1e-6:  # touching is fine (float error)
                stack.pop()
            if stack:
                assert end <= stack[-1][1] + 1e-6, f"slice {e} overlaps its parent on {tid}"
            stack.append((start, end))


def enclosing_op(events: list[dict[str, Any]], tid: int, ts: float) -> dict[str, Any]:
    """The operation slice (cat 'op') on track ``tid`` that contains ``ts``."""
    found = [
        e
        for e in events
        if e["ph"] == "X" and e["cat"] == "op" and e["tid"] == tid
        if e["ts"] <= ts <= e["ts"] + e["dur"]
    ]
    assert len(found) == 1, (tid, ts, found)
    return found[0]


def flows(events: list[dict[str, Any]]) -> Counter[tuple[str, str, str]]:
    """(source op, destination op, var) of every flow arrow."""
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == ends.keys()
    result: Counter[tuple[str, str, str]] = Counter()
    for fid, s in starts.items():
        f = ends[fid]
        assert f["bp"] == "e"
        src = enclosing_op(events, s["tid"], s["ts"])
        dst = enclosing_op(events, f["tid"], f["ts"])
        assert s["name"] == f["name"]
        assert s["name"].startswith("waits on ")
        result[src["name"], dst["name"], s["name"].removeprefix("waits on ")] += 1
    return result


async def program(engine: ae.Engine) -> None:
    """A gate, then a small diamond of sync, coroutine and callback-style operations."""
    x, y = engine.new_var("x"), engine.new_var("y")
    gate = asyncio.Event()

    async def opener(rctx: ae.RunContext) -> None:
        await gate.wait()

    async def fetch(rctx: ae.RunContext) -> int:
        await asyncio.sleep(0.002)
        await asyncio.sleep(0)
        return 1

    def later(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
        threading.Timer(0.002, on_complete).start()

    engine.push_async(opener, mutate_vars=[x], name="open")
    engine.push_sync(lambda r: None, const_vars=[x], name="read")
    engine.push_async(fetch, const_vars=[x], mutate_vars=[y], name="fetch")
    engine.push_sync(lambda r: None, const_vars=[y], mutate_vars=[x], name="combine", priority=3)
    engine.push_async(later, mutate_vars=[y], name="later")
    gate.set()
    await engine.wait_for_all()


EXPECTED_FLOWS = Counter(
    {
        ("open", "read", "x"): 1,
        ("open", "fetch", "x"): 1,
        ("open", "combine", "x"): 1,
        ("read", "combine", "x"): 1,
        ("fetch", "combine", "x"): 1,
        ("fetch", "combine", "y"): 1,
        ("fetch", "later", "y"): 1,
        ("combine", "later", "y"): 1,
    }
)


async def push_held(engine: ae.Engine, name: str) -> tuple[ae.Operation[None], asyncio.Event]:
    """Push coroutine op ``name`` and wait until it runs; it ends once the event is set."""
    started, release = asyncio.Event(), asyncio.Event()

    async def held(rctx: ae.RunContext) -> None:
        started.set()
        await release.wait()

    op = engine.push_async(held, name=name)
    await started.wait()
    return op, release


class TestTrace:
    async def test_trace_is_valid_and_flows_connect_the_right_ops(
        self, engine: ae.Engine, tmp_path: pathlib.Path
    ) -> None:
        path = tmp_path / "run.json"
        async with engine.trace(path) as session:
            await program(engine)
        trace = json.loads(path.read_text())
        assert trace == session.trace
        events = check_format(trace)
        check_nesting(events)
        assert flows(events) == EXPECTED_FLOWS
        ops = {e["name"]: e for e in events if e["ph"] == "X" and e["cat"] == "op"}
        assert set(ops) == {"open", "read", "fetch", "combine", "later"}
        combine = ops["combine"]["args"]
        assert combine["const_vars"] == ["y"]
        assert combine["mutate_vars"] == ["x"]
        assert combine["priority"] == 3
        assert combine["outcome"] == "done"
        assert combine["kind"] == "sync"

    async def test_async_block_writes_the_file_off_the_loop_and_keeps_a_trace_it_cannot_write(
        self, engine: ae.Engine, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        writers: list[int] = []
        write = trace_module._write

        def spy(trace: dict[str, object], path: pathlib.Path) -> None:
            writers.append(threading.get_ident())
            write(trace, path)

        monkeypatch.setattr(trace_module, "_write", spy)
        async with engine.trace(tmp_path / "run.json") as session:
            await program(engine)
        assert json.loads((tmp_path / "run.json").read_text()) == session.trace
        assert writers
        assert threading.get_ident() not in writers
        with pytest.raises(IsADirectoryError):
            async with engine.trace(tmp_path) as failed:
                await program(engine)
        assert failed.trace is not None
        assert len(check_format(failed.trace)) > 0

    async def test_tracks(self, threaded_engine: ae.Engine) -> None:
        engine = threaded_engine
        engine.start_trace()
        await program(engine)
        events = check_format(engine.stop_trace())
        names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
        ops = {e["name"]: e for e in events if e["ph"] == "X" and e["cat"] == "op"}
        assert names[ops["read"]["tid"]].startswith("aioengine-cpu0")
        assert names[ops["fetch"]["tid"]].startswith("coroutine ops #")
        assert names[ops["later"]["tid"]].startswith("callback ops #")
        # Every track with slices is named.
        assert {e["tid"] for e in events if e["ph"] == "X"} <= set(names)

    async def test_coroutine_run_and_await_slices(self, threaded_engine: ae.Engine) -> None:
        engine = threaded_engine

        async def napper(rctx: ae.RunContext) -> None:
            for _ in range(3):
                await asyncio.sleep(0.002)

        with engine.trace() as session:
            await engine.push_async(napper)
        assert session.trace is not None
        events = check_format(session.trace)
        (op,) = [e for e in events if e["ph"] == "X" and e["cat"] == "op"]
        children = [e for e in events if e["ph"] == "X" and e["cat"] != "op"]
        runs = [e for e in children if e["name"] == "run"]
        awaits = [e for e in children if e["name"] == "await"]
        assert len(runs) == 4
        assert len(awaits) == 3
        assert all(
            e["tid"] == op["tid"] and e["args"]["seq"] == op["args"]["seq"] for e in children
        )
        assert sum(e["dur"] for e in awaits) >= 3 * 1500  # microseconds
        assert sum(e["dur"] for e in runs) < op["dur"]
        check_nesting(events)

    async def test_outcomes(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")

        def boom(rctx: ae.RunContext) -> None:
            raise ValueError("boom")

        engine.start_trace()
        failed = engine.push_sync(boom, mutate_vars=[x], name="boom")
        skipped = engine.push_sync(lambda r: None, const_vars=[x], name="skipped")
        with pytest.raises(ValueError, match="boom"):
            await failed
        with pytest.raises(ae.DependencyError):
            await skipped
        with pytest.raises(ValueError, match="boom"):
            await engine.wait_for_var(x)
        events = check_format(engine.stop_trace())
        by_name = {e["name"]: e for e in events if e.get("cat") == "op"}
        assert by_name["boom"]["args"]["outcome"] == "failed"
        assert by_name["boom"]["args"]["error"] == "ValueError: boom"
        assert by_name["skipped"]["ph"] == "i"
        assert by_name["skipped"]["args"]["outcome"] == "skipped"

    async def test_unfinished_ops_are_closed_at_stop(self, threaded_engine: ae.Engine) -> None:
        engine = threaded_engine
        engine.start_trace()
        op, release = await push_held(engine, "waiter")
        events = check_format(engine.stop_trace())
        (e,) = [e for e in events if e.get("cat") == "op"]
        assert e["args"]["outcome"] == "unfinished (trace stopped)"
        release.set()
        await op
        check_nesting(events)

    async def test_an_op_started_before_the_trace_says_so(self, threaded_engine: ae.Engine) -> None:
        engine = threaded_engine
        op, release = await push_held(engine, "early")
        engine.start_trace()
        release.set()
        await op
        events = check_format(engine.stop_trace())
        (e,) = [e for e in events if e.get("cat") == "op"]
        assert (e["ph"], e["args"]["outcome"]) == ("i", "done (started before the trace)")

    async def test_a_coroutine_running_on_after_the_trace_stops_keeps_no_timings(
        self, threaded_engine: ae.Engine
    ) -> None:
        """Its steps were timed into a list the trace held; after stop, nothing grows."""
        engine = threaded_engine
        started, release = asyncio.Event(), asyncio.Event()

        async def spinner(rctx: ae.RunContext) -> int:
            started.set()
            steps = 0
            while not release.is_set():
                await asyncio.sleep(0)
                steps += 1
            return steps

        engine.start_trace()
        op = engine.push_async(spinner, name="spinner")
        await started.wait()
        log = engine._core.tracelog
        assert log is not None
        (steps,) = log.steps.values()
        engine.stop_trace()
        at_stop = len(steps)
        for _ in range(200):
            await asyncio.sleep(0)
        release.set()
        assert await op >= 200
        assert len(steps) == at_stop

    async def test_no_flow_from_an_operation_finished_before_the_push(
        self, engine: ae.Engine
    ) -> None:
        """An arrow says that an operation waited: not for a dependency already done."""
        x = engine.new_var("x")
        async with engine.trace() as session:
            await engine.push_sync(lambda r: None, mutate_vars=[x], name="first")
            await engine.push_sync(lambda r: None, const_vars=[x], name="second")
        assert session.trace is not None
        events = check_format(session.trace)
        assert {e["name"] for e in events if e.get("cat") == "op"} == {"first", "second"}
        assert not flows(events)

    async def test_a_running_trace_keeps_no_operation_result_or_var_alive(
        self, threaded_engine: ae.Engine
    ) -> None:
        engine = threaded_engine

        class Result:
            pass

        def fail(rctx: ae.RunContext) -> None:
            raise Boom("boom")

        engine.start_trace()
        v = engine.new_var("v")
        op = engine.push_sync(lambda r: Result(), mutate_vars=[v], name="make")
        result = await op
        failed = engine.push_sync(fail, name="fail")
        with pytest.raises(Boom) as caught:
            await failed
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()  # which throws (and so forgets) the failure
        refs = [weakref.ref(x) for x in (result, v, op, failed, caught.value)]
        del result, v, op, failed, caught
        gc.collect()
        assert [r() for r in refs] == [None] * len(refs)
        events = check_format(engine.stop_trace())
        by_name = {e["name"]: e for e in events if e.get("cat") == "op"}
        assert by_name["make"]["args"]["mutate_vars"] == ["v"]
        assert by_name["fail"]["args"]["error"] == "Boom: boom"

    async def test_start_twice_and_stop_without_start(self, threaded_engine: ae.Engine) -> None:
        engine = threaded_engine
        with pytest.raises(RuntimeError, match="is not tracing"):
            engine.stop_trace()
        engine.start_trace()
        with pytest.raises(RuntimeError, match="already tracing"):
            engine.start_trace()
        engine.stop_trace()

    async def test_a_var_that_reuses_a_dead_vars_id_gets_no_arrow_of_the_dead_one(
        self, threaded_engine: ae.Engine
    ) -> None:
        """The trace's log knows a Var by its ``id()``: a Var created where a dead one was
        must not inherit the dead one's users as its dependencies."""
        engine = threaded_engine
        ids = set()
        gate = threading.Event()
        async with engine.trace() as session:
            for i in range(100):
                v = engine.new_var(f"v{i}")
                ids.add(id(v))
                # The writer waits for the gate, so the reader is pushed while it is pending.
                w = engine.push_sync(lambda r: gate.wait(5), mutate_vars=[v], name=f"w{i}")
                rd = engine.push_sync(lambda r: None, const_vars=[v], name=f"r{i}")
                gate.set()
                await rd
                await w
                gate.clear()
                del v, w, rd
        assert len(ids) < 100  # ids were reused (else this test shows nothing)
        assert session.trace is not None
        arrows = flows(check_format(session.trace))
        assert arrows == Counter({(f"w{i}", f"r{i}", f"v{i}"): 1 for i in range(100)})

    async def test_arrows_of_a_commute_group_follow_its_rules(
        self, threaded_engine: ae.Engine
    ) -> None:
        """Members of a commute group wait for what the group follows, not for each other,
        and a reader after the group waits for every member (as graph() draws them)."""
        engine = threaded_engine
        x = engine.new_var("x")
        gate = threading.Event()
        async with engine.trace() as session:
            first = engine.push_sync(lambda r: gate.wait(5), mutate_vars=[x], name="write")
            engine.push_sync(lambda r: None, commute_vars=[x], name="c1")
            engine.push_sync(lambda r: None, commute_vars=[x], name="c2")
            engine.push_sync(lambda r: None, const_vars=[x], name="read")
            gate.set()
            await first
            await engine.wait_for_all()
        assert session.trace is not None
        assert flows(check_format(session.trace)) == Counter(
            {
                ("write", "c1", "x"): 1,
                ("write", "c2", "x"): 1,
                ("c1", "read", "x"): 1,
                ("c2", "read", "x"): 1,
            }
        )

    async def test_nothing_left_on_the_core_when_not_tracing(
        self, threaded_engine: ae.Engine
    ) -> None:
        """A trace records through the core's log while it runs, and through nothing else:
        no instrument (whose hooks the core would call per operation), no log after it."""
        engine = threaded_engine
        assert engine._core.tracelog is None
        async with engine.trace():
            assert engine._core.tracelog is not None
            assert engine._core.instruments == ()
        assert engine._core.tracelog is None


async def test_gpu_ops_span_launch_to_fence_on_lanes_where_they_never_cross() -> None:
    """A stream worker launches the next operation before the last one's work is done, so
    GPU slices (start to fence) cannot share the worker's track: they go on lanes."""
    sim = ae.SimulatedGPU()
    kernel_done: dict[str, int] = {}
    async with ae.Engine(gpu_backend=sim) as engine:
        xs = [engine.new_var(f"x{i}") for i in range(6)]
        with engine.trace() as session:
            log = engine._core.tracelog
            assert log is not None
            for i, x in enumerate(xs):

                def kernel(name: str = f"k{i}") -> None:
                    time.sleep(0.005)
                    kernel_done[name] = trace_module._now()

                engine.push_sync(lambda r, k=kernel: r.launch(k), ae.gpu(0), [], [x], name=f"k{i}")
            await engine.wait_for_all()
    assert session.trace is not None
    events = check_format(session.trace)
    check_nesting(events)
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    ops = [e for e in events if e["ph"] == "X" and e["cat"] == "op"]
    assert sorted(e["name"] for e in ops) == [f"k{i}" for i in range(6)]
    assert all(names[e["tid"]].startswith("gpu0-compute ops #") for e in ops)
    for e in ops:  # each slice lasts until its work is done, not until it was launched
        assert e["ts"] + e["dur"] >= (kernel_done[e["name"]] - log.t0) / 1000 - 0.01


class TestDependencyTracking:
    """The dependencies that traces, graphs and the history draw (history.DepTracker)."""

    @staticmethod
    def push(tracker: DepTracker, seq: int, const: tuple[Var, ...], mutate: tuple[Var, ...]) -> Any:
        op = types.SimpleNamespace(seq=seq, vars=const + mutate, nreads=len(const), modes=None)
        return tracker.push(op)  # type: ignore[arg-type]

    def test_readers_depend_on_the_writer_and_a_writer_on_both(self) -> None:
        tracker = DepTracker()
        x = Var(None, "x")
        assert self.push(tracker, 1, (), (x,)) == ()
        assert self.push(tracker, 2, (x,), ()) == ((1, "x"),)
        assert self.push(tracker, 3, (x,), ()) == ((1, "x"),)
        assert self.push(tracker, 4, (), (x,)) == ((1, "x"), (2, "x"), (3, "x"))
        assert self.push(tracker, 5, (), (x,)) == ((4, "x"),)

    def test_a_replay_by_key_finds_what_the_pushes_found(self) -> None:
        """A trace replays its pushes from the keys its log recorded: the same answers as
        live pushes of the same program, commute and concurrent groups included."""
        x, y = Var(None, "x"), Var(None, "y")
        program: list[tuple[tuple[Var, ...], tuple[Var, ...], tuple[int, ...] | None]] = [
            ((), (x,), None),
            ((x,), (y,), None),
            ((x, y), (), None),
            ((), (x, y), (COMMUTE, CONCURRENT)),
            ((), (x,), (COMMUTE,)),
            ((y,), (x,), None),
        ]
        live, replayed = DepTracker(), DepTracker()
        for seq, (const, mutate, modes) in enumerate(program, 1):
            op = types.SimpleNamespace(seq=seq, vars=const + mutate, nreads=len(const), modes=modes)
            expected = live.push(op)  # type: ignore[arg-type]
            keys = [id(v) for v in const + mutate]
            names = [v.name for v in const + mutate]
            assert replayed.replay(seq, keys, names, len(const), modes) == expected
        assert expected == ((4, "y"), (1, "x"), (4, "x"), (5, "x"))  # the last push's

    def test_a_dead_var_is_forgotten_and_its_id_gives_no_dependency(self) -> None:
        tracker = DepTracker()
        for seq in range(1, 200):  # new Vars, often at a dead one's address (id)
            v = Var(None, f"v{seq}")
            assert self.push(tracker, seq, (), (v,)) == ()
            del v
        gc.collect()
        assert tracker._tracks == {}
