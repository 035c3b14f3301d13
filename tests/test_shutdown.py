"""Shutdown: closing drains or cancels, interrupted waits leave the engine usable, exits are clean.

``aclose()`` runs everything queued (every kind of operation) and refuses new pushes while it
drains; ``aclose(cancel=True)`` cancels what has not started and waits for what runs. A task
cancelled (or a ``KeyboardInterrupt``) while awaiting ``wait_for_all`` or ``aclose`` leaves the
engine consistent. Scripts that leave the loop or the interpreter with operations pending run
in a subprocess, which must exit promptly and print no asyncio complaint. An engine garbage
collected without closing warns with ResourceWarning and its threads exit.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import aioengine as ae

from .helpers import Boom

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is in the test group
    uvloop = None  # type: ignore[assignment]

LOOPS = [pytest.param("asyncio", id="asyncio")]
if uvloop is not None:
    LOOPS.append(pytest.param("uvloop", id="uvloop"))


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "uvloop":
        assert uvloop is not None
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    return asyncio.new_event_loop


class Gate:
    """A coroutine operation holding its Vars until :meth:`open` (threaded and serial)."""

    def __init__(self, engine: ae.Engine, var: ae.Var, trace: list[str]) -> None:
        self.started = asyncio.Event()
        self._gate = asyncio.Event()

        async def gate(rctx: ae.RunContext) -> str:
            trace.append("gate:start")
            self.started.set()
            await self._gate.wait()
            trace.append("gate:end")
            return "gate"

        self.op = engine.push_async(gate, mutate_vars=[var], name="gate")

    def open(self) -> None:
        self._gate.set()


def push_each_kind(
    engine: ae.Engine, var: ae.Var, trace: list[str], fail: bool = False
) -> list[ae.Operation[Any]]:
    """Push a sync, a coroutine and a callback-style op (completed from a thread) on ``var``."""

    def sync(rctx: ae.RunContext) -> str:
        trace.append("sync")
        return "sync"

    async def coro(rctx: ae.RunContext) -> str:
        await asyncio.sleep(0)
        trace.append("coro")
        return "coro"

    def callback(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
        def later() -> None:
            trace.append("callback")
            on_complete(Boom("callback") if fail else None)

        threading.Thread(target=later).start()

    return [
        engine.push_sync(sync, mutate_vars=[var]),
        engine.push_async(coro, mutate_vars=[var]),
        engine.push_async(callback, mutate_vars=[var]),
    ]


async def let_it_block() -> None:
    """A few loop iterations, so a task can reach the await it blocks on."""
    for _ in range(5):
        await asyncio.sleep(0)


class TestAclose:
    """``aclose()``: everything queued runs; new pushes are refused while it drains."""

    async def test_drains_every_kind_and_refuses_pushes_while_draining(
        self, engine: ae.Engine
    ) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        gate = Gate(engine, x, trace)
        ops = push_each_kind(engine, x, trace)
        await gate.started.wait()
        closing = asyncio.create_task(engine.aclose())
        await let_it_block()
        assert not closing.done()
        assert not engine.closed
        with pytest.raises(ae.EngineClosedError, match="closing; create a new Engine"):
            engine.push_sync(lambda r: None)
        gate.open()
        await closing
        assert engine.closed
        assert engine.pending == 0
        assert [op.result() for op in ops] == ["sync", "coro", None]
        assert trace == ["gate:start", "gate:end", "sync", "coro", "callback"]
        assert x.version == 4

    async def test_raises_the_failures_after_draining(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        gate = Gate(engine, x, trace)
        ops = push_each_kind(engine, x, trace, fail=True)
        gate.open()
        with pytest.raises(ExceptionGroup) as info:
            await engine.aclose()
        assert [str(e) for e in info.value.exceptions] == ["callback"]
        assert engine.closed
        assert all(op.done() for op in ops)
        assert trace == ["gate:start", "gate:end", "sync", "coro", "callback"]


class TestTimedOutCloseOnAClosedLoop:
    """An aclose() that timed out leaves the engine closing, to be called again; once its
    loop has closed nothing can drain it any more, so the engine ends closed (it used to stay
    "closing" for ever), the operations left unfinished logged, and closing again is
    harmless, from any loop."""

    @pytest.mark.parametrize("cancel", [True, False], ids=["cancel", "drain"])
    @pytest.mark.parametrize("serial", [False, True], ids=["threaded", "serial"])
    def test_it_ends_closed(
        self, cancel: bool, serial: bool, caplog: pytest.LogCaptureFixture
    ) -> None:
        engine = ae.Engine(serial=serial)
        completions: list[ae.OnComplete] = []
        started: list[Callable[[], None]] = []

        def never(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            completions.append(on_complete)  # and never called
            started[0]()

        async def main() -> None:
            running = asyncio.Event()
            loop = asyncio.get_running_loop()
            started.append(lambda: loop.call_soon_threadsafe(running.set))
            x = engine.new_var("x")
            engine.push_async(never, mutate_vars=[x], name="never")
            await asyncio.wait_for(running.wait(), 10)  # running: aclose cannot cancel it
            behind = engine.push_sync(lambda r: None, mutate_vars=[x], name="behind")
            with pytest.raises(TimeoutError, match=r"^aclose\(\) timed out after 0\.05 s"):
                await engine.aclose(cancel=cancel, timeout=0.05)
            assert behind.cancelled() is cancel
            assert not engine.closed  # still closing: aclose() may be called again
            assert repr(engine).startswith("<aioengine.Engine closing ")

        asyncio.run(main())
        assert completions  # it ran
        with caplog.at_level("WARNING", logger="aioengine"):
            assert engine.closed
        unfinished = 1 if cancel else 2
        assert f"closed with {unfinished} operation(s) unfinished, first: 'never'" in caplog.text
        assert repr(engine).startswith("<aioengine.Engine closed ")
        asyncio.run(engine.aclose())  # harmless, on another loop
        with pytest.raises(RuntimeError, match=r"create a new Engine$"):
            engine.push_sync(lambda r: None)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # closed: its finalizer warns of nothing
            engine.__del__()


class TestAcloseCancel:
    """``aclose(cancel=True)``: not-started ops report cancelled, running ones finish."""

    async def test_not_started_of_every_kind_never_run(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        gate = Gate(engine, x, trace)
        queued = push_each_kind(engine, x, trace)
        reader = engine.push_sync(lambda r: trace.append("reader"), const_vars=[x])
        await gate.started.wait()
        closing = asyncio.create_task(engine.aclose(cancel=True))
        await let_it_block()
        # Cancelled at once, while the running op still holds x.
        assert [op.cancelled() for op in (*queued, reader)] == [True] * 4
        assert not closing.done()
        assert not gate.op.done()
        gate.open()
        await closing  # cancelled ops are not failures: no raise
        assert gate.op.result() == "gate"
        assert trace == ["gate:start", "gate:end"]
        assert x.version == 1
        assert engine.pending == 0

    async def test_waits_for_running_sync_and_callback_ops(
        self, threaded_engine: ae.Engine
    ) -> None:
        engine = threaded_engine
        x, y = engine.new_var("x"), engine.new_var("y")
        release = threading.Event()
        sync_started = threading.Event()
        completions: list[ae.OnComplete] = []
        callback_started = threading.Event()

        def running_sync(rctx: ae.RunContext) -> str:
            sync_started.set()
            assert release.wait(10)
            return "sync done"

        def running_callback(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            completions.append(on_complete)
            callback_started.set()

        sync_op = engine.push_sync(running_sync, mutate_vars=[x])
        callback_op = engine.push_async(running_callback, mutate_vars=[y])
        behind = [
            engine.push_sync(lambda r: pytest.fail("ran"), mutate_vars=[x]),
            engine.push_sync(lambda r: pytest.fail("ran"), const_vars=[y]),
        ]
        assert await asyncio.to_thread(sync_started.wait, 10)
        assert await asyncio.to_thread(callback_started.wait, 10)
        closing = asyncio.create_task(engine.aclose(cancel=True))
        await let_it_block()
        assert [op.cancelled() for op in behind] == [True, True]
        assert not sync_op.cancel()  # running on a thread: cannot be cancelled
        assert not closing.done()
        release.set()
        threading.Thread(target=completions[0]).start()
        await closing
        assert sync_op.result() == "sync done"
        assert callback_op.result() is None
        assert (x.version, y.version) == (1, 1)


class TestCloseRaces:
    """Closing while other threads push or complete operations, or from inside one."""

    @staticmethod
    def hold_hand_off(engine: ae.Engine) -> tuple[threading.Event, threading.Event]:
        """Pause thread "T" where it hands READY operations to their pool, in the pool's
        ``submit`` (the engine's lock is free there): it signals ``in_window`` and goes on
        when ``go`` is set."""
        in_window, go = threading.Event(), threading.Event()
        pool = engine._core.routes.executors["cpu0"]
        real = pool.submit

        def held(*args: Any) -> Any:
            if threading.current_thread().name == "T":
                in_window.set()
                assert go.wait(10)
            return real(*args)

        pool.submit = held  # type: ignore[method-assign]
        return in_window, go

    async def test_a_push_from_a_thread_cancelled_by_aclose_before_its_hand_off(self) -> None:
        engine = ae.Engine(cpu_workers=2)
        await engine.push_sync(lambda r: None)  # the pool exists
        in_window, go = self.hold_hand_off(engine)
        pushed: list[ae.Operation[Any]] = []
        thread = threading.Thread(
            target=lambda: pushed.append(engine.push_sync(lambda r: pytest.fail("ran"))),
            name="T",
        )
        thread.start()
        assert await asyncio.to_thread(in_window.wait, 10)
        await engine.aclose(cancel=True)
        go.set()
        await asyncio.to_thread(thread.join, 10)
        # The push was accepted before the close began; its hand-off raises nothing.
        assert [op.state for op in pushed] == [ae.OpState.CANCELLED]

    async def test_on_complete_from_a_thread_racing_aclose_cancel(self) -> None:
        engine = ae.Engine(cpu_workers=2)
        x = engine.new_var("x")
        await engine.push_sync(lambda r: None)  # the pool exists
        tokens: list[ae.OnComplete] = []
        started = threading.Event()

        def callback(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            tokens.append(on_complete)
            started.set()

        first = engine.push_async(callback, mutate_vars=[x])
        second = engine.push_sync(lambda r: pytest.fail("ran"), mutate_vars=[x])
        assert await asyncio.to_thread(started.wait, 10)
        in_window, go = self.hold_hand_off(engine)
        errors: list[BaseException] = []

        def complete() -> None:
            try:
                tokens[0]()
            except BaseException as exc:  # pragma: no cover - the failure this test catches
                errors.append(exc)

        thread = threading.Thread(target=complete, name="T")
        thread.start()
        assert await asyncio.to_thread(in_window.wait, 10)
        await engine.aclose(cancel=True)
        go.set()
        await asyncio.to_thread(thread.join, 10)
        assert errors == []
        assert (first.state, second.state) == (ae.OpState.DONE, ae.OpState.CANCELLED)
        assert x.version == 1

    async def test_pushes_from_a_thread_while_the_loop_closes(self) -> None:
        """Unhooked: every push either raises EngineClosedError or its op ends."""
        for _ in range(30):
            engine = ae.Engine(cpu_workers=2)
            await engine.push_sync(lambda r: None)
            outcome: list[object] = []
            go = threading.Event()

            def pushes(
                engine: ae.Engine = engine,
                outcome: list[object] = outcome,
                go: threading.Event = go,
            ) -> None:
                go.set()
                try:
                    while True:
                        outcome.append(engine.push_sync(lambda r: None))
                except BaseException as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=pushes)
            thread.start()
            assert await asyncio.to_thread(go.wait, 10)
            await engine.aclose(cancel=True)
            await asyncio.to_thread(thread.join, 10)
            *ops, last = outcome
            assert isinstance(last, ae.EngineClosedError), last
            assert all(op.done() for op in ops)  # type: ignore[attr-defined]

    async def test_aclose_inside_an_operation_is_refused(self, engine: ae.Engine) -> None:
        async def close_me(rctx: ae.RunContext) -> None:
            await engine.aclose()

        with pytest.raises(RuntimeError, match=r"aclose\(\) inside operation 'close_me'"):
            await engine.push_async(close_me, name="close_me")
        assert not engine.closed
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()

    async def test_the_loop_runs_while_aclose_joins_the_workers(
        self, threaded_engine: ae.Engine
    ) -> None:
        """A callback-style op is done at on_complete(); its function may go on and need
        the loop, which aclose must not block by joining the worker on it."""
        loop = asyncio.get_running_loop()
        answered: list[object] = []

        def callback(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            on_complete()
            answered.append(
                asyncio.run_coroutine_threadsafe(asyncio.sleep(0, "yes"), loop).result(10)
            )

        await threaded_engine.push_async(callback)
        await threaded_engine.aclose()
        assert answered == ["yes"]

    async def test_no_worker_starts_after_aclose(self) -> None:
        """A push from the loop wakes its pool on the next iteration; closing first wins."""
        before = set(threading.enumerate())
        engine = ae.Engine(cpu_workers=2)
        op = engine.push_sync(lambda r: pytest.fail("ran"))  # its pool's first operation
        await engine.aclose(cancel=True)  # without yielding to the loop before
        await let_it_block()
        assert op.cancelled()
        started = [t.name for t in set(threading.enumerate()) - before]
        assert not [name for name in started if name.startswith("aioengine")]


class TestInterruptedWaits:
    """Cancelling (or interrupting) the code awaiting a drain leaves the engine consistent."""

    async def test_cancelled_aclose_leaves_it_closing_and_a_later_aclose_completes(
        self, engine: ae.Engine
    ) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        gate = Gate(engine, x, trace)
        ops = push_each_kind(engine, x, trace)
        closing = asyncio.create_task(engine.aclose())
        await let_it_block()
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert not engine.closed
        with pytest.raises(ae.EngineClosedError):
            engine.push_sync(lambda r: None)
        gate.open()
        await engine.aclose()
        assert engine.closed
        assert [op.result() for op in ops] == ["sync", "coro", None]
        assert trace == ["gate:start", "gate:end", "sync", "coro", "callback"]

    async def test_cancelled_aclose_cancel_then_aclose(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        gate = Gate(engine, x, trace)
        ops = push_each_kind(engine, x, trace)
        await gate.started.wait()
        closing = asyncio.create_task(engine.aclose(cancel=True))
        await let_it_block()
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        gate.open()
        await engine.aclose()
        assert [op.cancelled() for op in ops] == [True, True, True]
        assert trace == ["gate:start", "gate:end"]
        assert engine.closed
        assert engine.pending == 0

    @pytest.mark.parametrize("interrupt", ["sigint", "callback-raises"])
    @pytest.mark.parametrize("loop_name", LOOPS)
    def test_keyboard_interrupt_while_awaiting_wait_for_all(
        self, loop_name: str, interrupt: str
    ) -> None:
        """Ctrl-C (as asyncio.Runner handles it) or a KeyboardInterrupt out of the loop."""
        if interrupt == "sigint" and threading.current_thread() is not threading.main_thread():
            pytest.skip("SIGINT handling needs the main thread")
        with asyncio.Runner(loop_factory=loop_factory(loop_name)) as runner:
            engine = ae.Engine(cpu_workers=2)
            release = threading.Event()
            started = threading.Event()
            trace: list[str] = []

            async def start() -> tuple[ae.Var, list[ae.Operation[Any]]]:
                x = engine.new_var("x")

                def blocker(rctx: ae.RunContext) -> None:
                    started.set()
                    assert release.wait(10)
                    trace.append("blocker")

                ops = [engine.push_sync(blocker, mutate_vars=[x])]
                ops += [
                    engine.push_sync(lambda r, i=i: trace.append(f"op{i}"), mutate_vars=[x])
                    for i in range(3)
                ]
                return x, ops

            x, ops = runner.run(start())
            waiting: list[asyncio.Task[None]] = []

            async def interrupted() -> None:
                assert await asyncio.to_thread(started.wait, 10)
                loop = asyncio.get_running_loop()
                if interrupt == "sigint":
                    loop.call_soon(signal.raise_signal, signal.SIGINT)
                    await engine.wait_for_all()
                else:

                    def raise_keyboard_interrupt() -> None:
                        raise KeyboardInterrupt

                    waiting.append(asyncio.create_task(engine.wait_for_all()))
                    await let_it_block()
                    loop.call_soon(raise_keyboard_interrupt)
                    await waiting[0]

            with pytest.raises(KeyboardInterrupt):
                runner.run(interrupted())
            assert engine.pending == 4  # nothing lost, nothing ran out of turn
            release.set()

            async def finish() -> None:
                for task in waiting:  # an orphaned waiter still completes
                    await task
                await engine.wait_for_all()
                assert [op.done() for op in ops] == [True] * 4
                y = engine.new_var("y")
                assert await engine.push_sync(lambda r: "still usable", mutate_vars=[x, y]) == (
                    "still usable"
                )
                await engine.aclose()

            runner.run(finish())
        assert trace == ["blocker", "op0", "op1", "op2"]
        assert x.version == 5


SCRIPT_HEADER = """
import asyncio, sys, threading, time
import aioengine as ae
LOOP = {loop!r}
def run(main):
    if LOOP == "uvloop":
        import uvloop
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main())
    return asyncio.run(main())
"""

PENDING_AT_LOOP_CLOSE = {
    "sync": """
        async def main():
            engine = ae.Engine(cpu_workers=2)
            x = engine.new_var("x")
            started = threading.Event()
            engine.push_sync(lambda r: (started.set(), time.sleep(0.2)), mutate_vars=[x])
            for _ in range(1000):
                engine.push_sync(lambda r: time.sleep(0.001), mutate_vars=[x])
            await asyncio.to_thread(started.wait, 10)
    """,
    "coroutine": """
        async def forever(rctx):
            await asyncio.sleep(3600)
        async def main():
            engine = ae.Engine(cpu_workers=2)
            x, y = engine.new_var("x"), engine.new_var("y")
            engine.push_async(forever, mutate_vars=[x])  # running when the loop stops
            for _ in range(100):  # queued behind it: they start as it is cancelled
                engine.push_async(forever, mutate_vars=[x])
                engine.push_async(forever, const_vars=[x], mutate_vars=[y])
            await asyncio.sleep(0)
    """,
    "callback": """
        def never(rctx, on_complete):
            pass  # on_complete is never called
        def later(rctx, on_complete):
            threading.Timer(0.2, on_complete).start()  # called after the loop closed
        async def main():
            engine = ae.Engine(cpu_workers=2)
            x, y = engine.new_var("x"), engine.new_var("y")
            engine.push_async(never, mutate_vars=[x])
            engine.push_async(later, mutate_vars=[y])
            for _ in range(100):
                engine.push_async(never, mutate_vars=[x])
                engine.push_async(later, mutate_vars=[y])
            await asyncio.sleep(0.05)
    """,
    "mixed-serial": """
        async def forever(rctx):
            await asyncio.sleep(3600)
        async def main():
            engine = ae.Engine(serial=True)
            x = engine.new_var("x")
            engine.push_async(forever, mutate_vars=[x])
            for _ in range(50):
                engine.push_sync(lambda r: None, mutate_vars=[x])
                engine.push_async(forever, mutate_vars=[x])
                engine.push_async(lambda r, done: done(), mutate_vars=[x])
            await asyncio.sleep(0)
    """,
}


def run_script(body: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a fresh interpreter; fail (not hang) if it does not exit in time."""
    try:
        return subprocess.run(
            [sys.executable, "-c", body], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the interpreter did not exit within {timeout} s: {exc.stderr!r}")


class TestLeavingWithPendingOps:
    """Leaving the loop or the interpreter with operations pending never hangs or complains."""

    @pytest.mark.parametrize("loop_name", LOOPS)
    @pytest.mark.parametrize("kind", list(PENDING_AT_LOOP_CLOSE))
    def test_loop_closed_with_pending_ops(self, kind: str, loop_name: str) -> None:
        body = SCRIPT_HEADER.format(loop=loop_name) + textwrap.dedent(PENDING_AT_LOOP_CLOSE[kind])
        body += "\nrun(main)\nprint('returned', flush=True)\n"
        proc = run_script(body)
        assert "Task was destroyed but it is pending" not in proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "returned\n"

    def test_unclosed_engine_used_from_threads_only(self) -> None:
        """An engine never bound to a loop, with queued work, does not hold the exit."""
        body = textwrap.dedent(
            """
            import threading, time
            import aioengine as ae
            engine = ae.Engine(cpu_workers=2)
            x = engine.new_var("x")
            started = threading.Event()
            engine.push_sync(lambda r: (started.set(), time.sleep(0.2)), mutate_vars=[x])
            for _ in range(10_000):
                engine.push_sync(lambda r: time.sleep(0.01), mutate_vars=[x])
            assert started.wait(10)
            print("exiting", flush=True)
            """
        )
        proc = run_script(body)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "exiting\n"
        assert proc.stderr == ""


class TestGarbageCollected:
    """An engine collected without closing warns and lets its threads go."""

    async def test_warns_and_its_threads_exit(self) -> None:
        before = set(threading.enumerate())
        engine = ae.Engine(cpu_workers=2, cpu_priority_workers=1)
        x = engine.new_var("x")
        barrier = threading.Barrier(2, timeout=10)
        readers: list[ae.Operation[Any]] = [
            engine.push_sync(lambda r: barrier.wait(), const_vars=[x]) for _ in range(2)
        ]
        readers.append(
            engine.push_sync(lambda r: None, prop=ae.FnProperty.CPU_PRIORITIZED, name="prio")
        )
        for op in readers:
            await op
        threads = [t for t in set(threading.enumerate()) - before if t.name.startswith("aioengine")]
        assert len(threads) == 3
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del engine, x, readers, op  # (refcounting may collect it right here)
            gc.collect()
        found = [w for w in caught if issubclass(w.category, ResourceWarning)]
        assert len(found) == 1
        assert "garbage collected without being closed" in str(found[0].message)
        assert found[0].filename == __file__  # the line that dropped it, compiled or not
        for t in threads:
            await asyncio.to_thread(t.join, 10)
        assert [t.is_alive() for t in threads] == [False] * 3


DROPPED_INSIDE_THE_SCHEDULER = {
    # A loop operation skipped (its input failed on the pool) after the engine was dropped:
    # claiming it drops the last reference to the engine with the lock held.
    "skipped": """
        import warnings
        warnings.simplefilter("ignore", ResourceWarning)

        def boom(rctx):
            raise ValueError("boom")

        async def main():
            engine = ae.Engine(cpu_workers=1)
            v = engine.new_var("v")
            gate = threading.Event()
            engine.push_sync(lambda r: gate.wait(), mutate_vars=[v], name="gate")
            engine.push_sync(boom, mutate_vars=[v], name="boom")
            engine.push_sync(lambda r: None, const_vars=[v], prop=ae.FnProperty.ASYNC)
            del engine, v
            gate.set()
            for _ in range(50):
                await asyncio.sleep(0.01)
            print("loop alive", flush=True)
    """,
    # GPU work in flight when the engine is dropped: settling its fence drops the operation,
    # and with it the last reference to the engine, with the lock held.
    "gpu-fence": """
        import warnings
        warnings.simplefilter("ignore", ResourceWarning)

        async def main():
            engine = ae.Engine(gpu_backend=ae.SimulatedGPU())
            v = engine.new_var("v")
            engine.push_sync(lambda r: None, ae.gpu(0), mutate_vars=[v])
            del engine, v
            for _ in range(50):
                await asyncio.sleep(0.01)
            print("loop alive", flush=True)
    """,
}


class TestDroppedInsideTheScheduler:
    """An engine whose last reference goes inside one of its scheduler's critical sections is
    finalized there: its finalizer must not wait for the lock that this thread holds."""

    @pytest.mark.parametrize("case", list(DROPPED_INSIDE_THE_SCHEDULER))
    def test_the_loop_goes_on_and_the_interpreter_exits(self, case: str) -> None:
        body = SCRIPT_HEADER.format(loop="asyncio") + textwrap.dedent(
            DROPPED_INSIDE_THE_SCHEDULER[case]
        )
        proc = run_script(body + "\nrun(main)\nprint('returned', flush=True)\n", timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["loop", "alive", "returned"]


async def test_aclose_cancel_tells_an_awaiter_the_engine_was_closed() -> None:
    """An operation cancelled by ``aclose(cancel=True)`` before it started: its awaiter's
    CancelledError says the engine was closed, not a bare cancellation (issue 35)."""
    engine = ae.Engine(cpu_workers=1)
    var = engine.new_var("v")
    gate = asyncio.Event()

    async def hold(rctx: ae.RunContext) -> None:
        await gate.wait()

    holder = engine.push_async(hold, mutate_vars=[var], name="hold")
    queued = engine.push_sync(lambda rctx: None, ae.cpu(), [var], [], name="queued")
    closing = asyncio.ensure_future(engine.aclose(cancel=True))
    with pytest.raises(
        asyncio.CancelledError,
        match="'queued' was cancelled before it started: the engine was closed",
    ):
        await queued
    gate.set()
    await holder
    await closing
