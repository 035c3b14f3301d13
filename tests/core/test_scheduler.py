"""The scheduler (``aioengine/scheduler.py``): the cycle every operation goes through
(admission, grant, dispatch, run, finish and release), seen through the Engine, and the
scheduler's own check of its state, ``validate_state()`` (with the ``AIOENGINE_VALIDATE``
flag of ``tests/conftest.py`` that runs it after every test)."""

from __future__ import annotations

import ast
import asyncio
import gc
import inspect
import pathlib
import threading
from typing import Any

import pytest

import aioengine as ae

from ..conftest import COMPILED, VALIDATE, EngineRecorder, Hold, Monitor


def push_recorder(engine: ae.Engine, trace: list[str], name: str, **kw: Any) -> ae.Operation[None]:
    """A sync operation that appends its name to ``trace`` when it runs."""
    return engine.push_sync(lambda rctx: trace.append(name), name=name, **kw)


class TestAdmission:
    """A push takes the next number and queues on all its Vars at once."""

    async def test_conflicting_operations_run_in_push_order(self, engine: ae.Engine) -> None:
        x, y = engine.new_var("x"), engine.new_var("y")
        hold = Hold(engine, x)  # everything below is admitted before anything runs
        trace: list[str] = []
        for i in range(12):
            if i % 3 == 0:
                push_recorder(engine, trace, f"w{i}", mutate_vars=[x])
            else:  # readers of x that also write y: ordered among themselves through y
                push_recorder(engine, trace, f"r{i}", const_vars=[x], mutate_vars=[y])
        await hold.release()
        await engine.wait_for_all()
        assert trace == [f"{'w' if i % 3 == 0 else 'r'}{i}" for i in range(12)]

    async def test_a_push_is_atomic_across_its_vars(
        self, threaded_engine: ae.Engine, monitor: Monitor
    ) -> None:
        """Two threads pushing writers on the same Vars in opposite orders build no cycle
        (MXNet 1.9.1 deadlocks there): every operation finishes, none overlaps another."""
        engine = threaded_engine
        a, b = engine.new_var("a"), engine.new_var("b")
        ops: list[ae.Operation[None]] = []
        ops_lock = threading.Lock()

        def body(rctx: ae.RunContext, name: str) -> None:
            monitor.enter(name, (), (a, b))
            monitor.exit((), (a, b))

        def pusher(order: list[ae.Var], tag: str) -> None:
            for i in range(200):
                op = engine.push_sync(lambda r, n=f"{tag}{i}": body(r, n), mutate_vars=order)
                with ops_lock:
                    ops.append(op)

        threads = [
            threading.Thread(target=pusher, args=([a, b], "ab")),
            threading.Thread(target=pusher, args=([b, a], "ba")),
        ]
        for t in threads:
            t.start()
        await asyncio.to_thread(lambda: [t.join() for t in threads])
        await asyncio.wait_for(engine.wait_for_all(), 30)
        assert len(ops) == 400
        assert all(op.done() and op.exception() is None for op in ops)
        assert monitor.violations == []
        assert a.version == b.version == 400

    async def test_pending_counts_the_admitted_operations_until_they_finish(
        self, engine: ae.Engine
    ) -> None:
        x = engine.new_var("x")
        hold = Hold(engine, x)
        for _ in range(3):
            engine.push_sync(lambda r: None, const_vars=[x])
        assert engine.pending == 4
        engine._core.validate_state()
        await hold.release()
        await engine.wait_for_all()
        assert engine.pending == 0

    async def test_no_push_is_admitted_once_the_engine_closes(self) -> None:
        engine = ae.Engine(cpu_workers=1)
        x = engine.new_var("x")
        done = engine.push_sync(lambda r: 1, mutate_vars=[x])
        assert not engine._core.closed
        await engine.aclose()
        assert engine._core.closed
        assert done.result() == 1  # drained before closing
        with pytest.raises(ae.EngineClosedError):
            engine.push_sync(lambda r: None, mutate_vars=[x])
        assert engine.pending == 0
        engine._core.validate_state()


class TestGrant:
    """Readers of a Var share it; a writer has it alone, in its turn."""

    async def test_readers_run_together_and_a_writer_waits_for_them(
        self, threaded_engine: ae.Engine
    ) -> None:
        engine = threaded_engine  # two workers
        x = engine.new_var("x")
        both = threading.Barrier(2, timeout=10)
        trace: list[str] = []

        def reader(rctx: ae.RunContext, name: str) -> None:
            both.wait()  # returns only if the other reader runs at the same time
            trace.append(name)

        engine.push_sync(lambda r: reader(r, "r1"), const_vars=[x])
        engine.push_sync(lambda r: reader(r, "r2"), const_vars=[x])
        push_recorder(engine, trace, "w", mutate_vars=[x])
        push_recorder(engine, trace, "r3", const_vars=[x])
        await asyncio.wait_for(engine.wait_for_all(), 20)
        assert sorted(trace[:2]) == ["r1", "r2"]
        assert trace[2:] == ["w", "r3"]

    async def test_an_operation_starts_once_its_last_var_is_granted(
        self, engine: ae.Engine
    ) -> None:
        x, y = engine.new_var("x"), engine.new_var("y")
        hold_x, hold_y = Hold(engine, x), Hold(engine, y)
        op = engine.push_sync(lambda r: "ran", const_vars=[x], mutate_vars=[y])
        await hold_x.release()
        await asyncio.sleep(0.01)
        assert op.state is ae.OpState.PENDING  # y is still held
        engine._core.validate_state()
        await hold_y.release()
        assert await op == "ran"


class TestDispatch:
    """A READY operation goes to its executor: a worker pool, or the loop queue."""

    async def test_each_kind_runs_where_its_executor_is(self, engine: ae.Engine) -> None:
        loop_thread = threading.get_ident()

        async def coro(rctx: ae.RunContext) -> int:
            return threading.get_ident()

        def sync(rctx: ae.RunContext) -> int:
            return threading.get_ident()

        assert await engine.push_async(coro) == loop_thread
        assert await engine.push_sync(sync, prop=ae.FnProperty.ASYNC) == loop_thread
        on_worker = await engine.push_sync(sync)
        # Serial mode runs everything on the loop thread; otherwise a worker runs it.
        assert (on_worker == loop_thread) is engine.serial

    async def test_the_loop_runs_other_callbacks_between_long_runs_of_inline_operations(
        self, engine: ae.Engine
    ) -> None:
        """Inline operations run in batches: a loop callback scheduled after a thousand of
        them became READY runs before the last of them does."""
        finished = 0

        def count(rctx: ae.RunContext) -> None:
            nonlocal finished
            finished += 1

        ops = [engine.push_sync(count, prop=ae.FnProperty.ASYNC) for _ in range(1000)]
        seen: list[int] = []
        asyncio.get_running_loop().call_soon(lambda: seen.append(finished))
        await asyncio.gather(*ops)
        assert len(seen) == 1
        assert 0 < seen[0] < 1000

    async def test_a_worker_that_finishes_a_writer_wakes_the_loop_for_a_coroutine_reader(
        self, threaded_engine: ae.Engine
    ) -> None:
        """The release on a worker thread makes a loop operation READY and wakes the loop
        (nobody awaits the reader)."""
        engine = threaded_engine
        x = engine.new_var("x")
        gate = threading.Event()
        ran = asyncio.Event()
        engine.push_sync(lambda r: gate.wait(10), mutate_vars=[x])

        async def reader(rctx: ae.RunContext) -> None:
            ran.set()

        engine.push_async(reader, const_vars=[x])
        await asyncio.sleep(0.01)
        assert not ran.is_set()
        threading.Thread(target=gate.set).start()
        await asyncio.wait_for(ran.wait(), 10)


class TestFinish:
    """A finish records the outcome, releases the Vars and dispatches what became ready."""

    async def test_a_failure_skips_the_operations_that_read_its_outputs(
        self, engine: ae.Engine
    ) -> None:
        x, y = engine.new_var("x"), engine.new_var("y")

        def fail(rctx: ae.RunContext) -> None:
            raise KeyError("k")

        failed = engine.push_sync(fail, mutate_vars=[x])
        skipped = engine.push_sync(lambda r: None, const_vars=[x], mutate_vars=[y])
        independent = engine.push_sync(lambda r: "ok", const_vars=[engine.new_var("z")])
        with pytest.raises(KeyError):
            await failed
        with pytest.raises(ae.DependencyError) as caught:
            await skipped
        assert caught.value.__cause__ is failed.exception()
        assert await independent == "ok"
        engine._core.validate_state()
        with pytest.raises(ExceptionGroup) as group:
            await engine.wait_for_all()
        assert group.value.exceptions == (failed.exception(),)
        await engine.wait_for_all()  # thrown once
        engine._core.validate_state()


class TestValidateFlag:
    """``AIOENGINE_VALIDATE=1`` (tests/conftest.py): every Engine a test creates is checked
    after it."""

    @pytest.mark.skipif(COMPILED, reason="the compiled Engine's __init__ cannot be wrapped")
    def test_the_recorder_sees_every_engine_created_and_keeps_none_alive(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        signature = inspect.signature(ae.Engine)
        recorder = EngineRecorder()
        recorder.record(monkeypatch)
        assert inspect.signature(ae.Engine) == signature  # wrapped, not changed
        engine = ae.Engine(cpu_workers=1)
        assert recorder.engines() == [engine]
        assert recorder.validate() == 1
        engine._core.loop_queue.heap.append(7)  # a key with no operation
        with pytest.raises(AssertionError, match="heap and its ops"):
            recorder.validate()
        engine._core.loop_queue.heap.pop()
        del engine
        gc.collect()
        assert recorder.engines() == []
        assert recorder.validate() == 0

    @pytest.mark.skipif(not VALIDATE, reason="AIOENGINE_VALIDATE is not set")
    async def test_with_the_flag_the_engines_of_a_test_are_recorded(
        self, validated_engines: EngineRecorder, engine: ae.Engine
    ) -> None:
        mine = ae.Engine(cpu_workers=1)
        assert validated_engines.engines() == [engine, mine]
        await mine.push_sync(lambda r: None)
        assert validated_engines.validate() == 2
        await mine.aclose()

    def test_ci_sets_the_flag_in_the_pure_python_session_only(self) -> None:
        noxfile = pathlib.Path(__file__).parents[2] / "noxfile.py"
        sessions = {
            node.name: ast.unparse(node)
            for node in ast.parse(noxfile.read_text()).body
            if isinstance(node, ast.FunctionDef)
        }
        assert "'AIOENGINE_VALIDATE': '1'" in sessions["tests"]
        assert "AIOENGINE_VALIDATE" not in sessions["tests_compiled"]
