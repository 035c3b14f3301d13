"""BlockingEngine (synchronous code, other threads) and ae.run."""

from __future__ import annotations

import _thread
import asyncio
import concurrent.futures
import signal
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import aioengine as ae
from aioengine import blocking

from .conftest import Monitor
from .test_shutdown import run_script


@pytest.fixture(params=[pytest.param(False, id="threaded"), pytest.param(True, id="serial")])
def be(request: pytest.FixtureRequest) -> Iterator[ae.BlockingEngine]:
    with ae.BlockingEngine(cpu_workers=2, serial=request.param) as engine:
        yield engine


def test_pushes_return_concurrent_futures_in_rule_order(be: ae.BlockingEngine) -> None:
    x = be.new_var("x")
    trace: list[str] = []
    first = be.push_sync(lambda r: trace.append("w1") or 1, mutate_vars=[x])
    reads = [be.push_sync(lambda r: len(trace), const_vars=[x]) for _ in range(3)]
    be.push_sync(lambda r: trace.append("w2"), mutate_vars=[x])
    assert isinstance(first, concurrent.futures.Future)
    assert isinstance(first.operation, ae.Operation)  # type: ignore[attr-defined]
    be.wait_for_var(x)
    assert trace == ["w1", "w2"]
    assert first.result() == 1
    assert [f.result(timeout=5) for f in reads] == [1, 1, 1]
    assert x.version == 2


def test_async_callback_operator_and_delete(be: ae.BlockingEngine) -> None:
    x = be.new_var("x")

    async def coro(rctx: ae.RunContext) -> str:
        await asyncio.sleep(0)
        return "coro"

    def callback(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
        on_complete()

    h = be.new_operator(lambda r: "handle", [x], [])
    futs = [be.push_async(coro, mutate_vars=[x]), be.push_async(callback), be.push(h)]
    assert [f.result(timeout=5) for f in futs] == ["coro", None, "handle"]
    be.delete_operator(h)
    with pytest.raises(ae.OperatorDeletedError):
        be.push(h)
    deleted: list[str] = []
    be.delete_var(x, lambda r: deleted.append("freed")).result(timeout=5)
    assert deleted == ["freed"]
    with pytest.raises(ae.VarDeletedError):
        be.push_sync(lambda r: None, const_vars=[x])


def test_many_threads_at_once_keep_the_rule(monitor: Monitor) -> None:
    with ae.BlockingEngine(cpu_workers=4) as be:
        vars_ = [be.new_var(f"v{i}") for i in range(4)]
        counts = [0] * 4

        def worker(t: int) -> None:
            for k in range(50):
                i, j = (t + k) % 4, (t + 2 * k + 1) % 4
                reads, writes = ((vars_[j],) if j != i else ()), (vars_[i],)

                def fn(
                    r: ae.RunContext,
                    i: int = i,
                    reads: tuple[ae.Var, ...] = reads,
                    writes: tuple[ae.Var, ...] = writes,
                ) -> None:
                    monitor.enter("op", reads, writes)
                    counts[i] += 1
                    monitor.exit(reads, writes)

                be.push_sync(fn, const_vars=reads, mutate_vars=writes)
                if k % 10 == 0:
                    be.wait_for_var(vars_[i], timeout=10)
            be.wait_for_all(timeout=10)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        be.wait_for_all(timeout=10)
    assert sum(counts) == 300
    assert monitor.violations == []


def test_failures_and_throw_once(be: ae.BlockingEngine) -> None:
    x = be.new_var("x")
    err = ValueError("boom")

    def fail(r: ae.RunContext) -> None:
        raise err

    f = be.push_sync(fail, mutate_vars=[x])
    skipped = be.push_sync(lambda r: None, const_vars=[x])
    assert f.exception(timeout=5) is err
    assert isinstance(skipped.exception(timeout=5), ae.DependencyError)
    with pytest.raises(ValueError, match="boom"):
        be.wait_for_var(x)
    be.wait_for_var(x)  # thrown once
    be.push_sync(fail)
    with pytest.raises(ExceptionGroup) as info:
        be.wait_for_all()
    assert info.value.exceptions == (err,)


def test_timeouts_and_cancel() -> None:
    with ae.BlockingEngine(cpu_workers=1) as be:
        x = be.new_var("x")
        gate = threading.Event()
        running = be.push_sync(lambda r: gate.wait(5), mutate_vars=[x])
        queued_ran: list[int] = []
        queued = be.push_sync(lambda r: queued_ran.append(1), const_vars=[x])
        with pytest.raises(TimeoutError, match="timed out"):
            be.wait_for_var(x, timeout=0.05)
        with pytest.raises(TimeoutError):
            be.wait_for_all(timeout=0.05)
        assert queued.cancel()
        assert queued.cancelled()
        assert not running.cancel()  # a running thread cannot be interrupted
        with pytest.raises(concurrent.futures.TimeoutError):
            running.result(timeout=0.01)
        gate.set()
        be.wait_for_all(timeout=5)
        assert running.result() is True
        assert queued_ran == []
        assert not queued.cancel()  # already done


def test_cancel_racing_the_loop_that_settles_the_future(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The operation is cancelled, and the loop thread cancels the future before cancel()
    goes on (a thread switch there): the future is cancelled once, with no error."""
    futures: list[concurrent.futures.Future[Any]] = []
    cancel = ae.Operation.cancel

    def cancel_then_let_the_loop_settle(op: ae.Operation[Any], msg: object = None) -> bool:
        cancelled = cancel(op, msg)
        concurrent.futures.wait(futures, timeout=10)  # the loop settled it meanwhile
        return cancelled

    monkeypatch.setattr(ae.Operation, "cancel", cancel_then_let_the_loop_settle)
    with ae.BlockingEngine(cpu_workers=1) as be:
        x = be.new_var("x")
        gate = threading.Event()
        running = be.push_sync(lambda r: gate.wait(5), mutate_vars=[x])
        futures.append(be.push_sync(lambda r: None, mutate_vars=[x]))
        assert futures[0].cancel()
        assert futures[0].cancelled()
        gate.set()
        assert running.result(timeout=5) is True
    assert [r.getMessage() for r in caplog.records if r.levelname == "CRITICAL"] == []


def test_cancel_of_a_running_coroutine_follows_how_it_ends() -> None:
    """A running coroutine is asked to stop; its future then reports how it really ended."""
    with ae.BlockingEngine(cpu_workers=1) as be:
        started = threading.Event()

        async def stubborn(rctx: ae.RunContext) -> int:
            started.set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                return 42  # it handles the cancellation and finishes
            return -1

        fut = be.push_async(stubborn)
        assert started.wait(5)
        assert fut.cancel()  # asked
        assert fut.result(timeout=5) == 42
        assert not fut.cancelled()
        assert fut.operation.state is ae.OpState.DONE


def hold_in_thread(
    monkeypatch: pytest.MonkeyPatch, owner: Any, method: str
) -> tuple[threading.Event, threading.Event]:
    """Pause thread "T" right after ``owner.method`` returns (a thread switch there): it
    signals ``in_window`` and goes on when ``go`` is set."""
    in_window, go = threading.Event(), threading.Event()
    real = getattr(owner, method)

    def held(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if threading.current_thread().name == "T":
            in_window.set()
            assert go.wait(10)
        return result

    monkeypatch.setattr(owner, method, held)
    return in_window, go


def test_a_push_accepted_just_before_close_gets_its_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The push is accepted and its op runs; close() drains and closes the loop before the
    pushing thread attaches its future: the future still settles (no 'loop is closed')."""
    in_window, go = hold_in_thread(monkeypatch, blocking._OpFuture, "__init__")
    be = ae.BlockingEngine(cpu_workers=1).__enter__()
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(be.push_sync(lambda r: 42)), name="T")
    thread.start()
    assert in_window.wait(10)
    be.close()
    go.set()
    thread.join(10)
    assert [fut.result(timeout=5) for fut in out] == [42]


def test_a_wait_racing_close_raises_engine_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    in_window, go = hold_in_thread(monkeypatch, ae.BlockingEngine, "_portal_or_raise")
    be = ae.BlockingEngine(cpu_workers=1).__enter__()
    x = be.new_var("x")
    out: list[BaseException] = []

    def wait() -> None:
        try:
            be.wait_for_var(x)
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=wait, name="T")
    thread.start()
    assert in_window.wait(10)
    be.close()
    go.set()
    thread.join(10)
    assert [type(exc) for exc in out] == [ae.EngineClosedError]


def test_ctrl_c_while_close_drains_leaves_it_closing_and_close_can_finish() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("SIGINT handling needs the main thread")
    # Other engines' loop threads (aioengine.array_api's process-wide one) may run meanwhile.
    others = {t for t in threading.enumerate() if t.name == "aioengine-loop"}
    be = ae.BlockingEngine(cpu_workers=1).__enter__()
    release = threading.Event()
    # Long enough that the operation still runs when the interrupt lands on a loaded machine
    # (CI saw a 10 s wait run out); released right after, so it never takes that long.
    running = be.push_sync(lambda r: release.wait(60))
    draining = threading.Event()
    aclose = be.engine.aclose

    async def traced_aclose() -> None:
        draining.set()
        await aclose()

    def interrupt() -> None:
        # As long as the operation's wait: a loaded CI machine saw 10 s pass before close()
        # began to drain, and then no interrupt was sent at all.
        assert draining.wait(60)
        main = threading.main_thread().ident
        assert main is not None
        signal.pthread_kill(main, signal.SIGINT)  # to the thread blocked in close()

    threading.Thread(target=interrupt).start()
    be.engine.aclose = traced_aclose  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        be.close()
    # While the drain goes on (a signal landing as close()'s wait began once surfaced only
    # after the 60 s: see test_a_ctrl_c_that_lands_as_a_wait_begins_still_interrupts_it).
    assert not running.done()
    assert not be.closed
    release.set()
    be.close()
    assert be.closed
    assert running.result() is True
    assert not [t for t in threading.enumerate() if t.name == "aioengine-loop" and t not in others]


@pytest.mark.parametrize("wait", ["result", "close"])
def test_a_ctrl_c_that_lands_as_a_wait_begins_still_interrupts_it(wait: str) -> None:
    """A signal that arrives as the main thread's lock wait begins interrupts nothing: its
    handler runs only when the interpreter next checks. ``_thread.interrupt_main`` has that
    effect at any time (it notes the signal, it sends none): the Ctrl-C must still surface
    while the operation runs, not once the wait is over."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("SIGINT handling needs the main thread")
    be = ae.BlockingEngine(cpu_workers=1).__enter__()
    release = threading.Event()
    running = be.push_sync(lambda r: release.wait(30))

    def interrupt() -> None:
        # Whether the main thread is in its wait by then or not, the interrupt is due.
        release.wait(0.2)
        _thread.interrupt_main()

    threading.Thread(target=interrupt).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            running.result() if wait == "result" else be.close()
        assert not running.done()  # interrupted as it ran, not when its wait ended
    finally:
        release.set()
        be.close()
    assert be.closed
    assert running.result() is True


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_an_operation_raised_is_reraised_and_the_engine_goes_on(
    raised: type[BaseException],
) -> None:
    """An operation that raises ``KeyboardInterrupt`` on a worker: recorded, then raised by
    ``wait_for_all`` (in a group). The engine's loop thread survives it: later pushes run
    and later waits return (the portal once stopped its loop, and every later call failed)."""

    def interrupted(rctx: ae.RunContext) -> None:
        raise raised

    with ae.BlockingEngine(cpu_workers=1) as be:
        x = be.new_var("x")
        be.push_sync(interrupted, mutate_vars=[x])
        with pytest.raises(BaseExceptionGroup) as info:
            be.wait_for_all(timeout=30)
        assert info.group_contains(raised)
        y = be.new_var("y")
        later = be.push_sync(lambda r: 42, mutate_vars=[y])
        assert later.result(timeout=30) == 42
        be.wait_for_all(timeout=30)
        assert be.wait_for_var(y, timeout=30) is None
    assert be.closed


def test_blocking_on_the_loop_thread_raises_instead_of_deadlocking() -> None:
    with ae.BlockingEngine(cpu_workers=1) as be:
        x = be.new_var("x")
        gate = threading.Event()
        pending = be.push_sync(lambda r: gate.wait(5), mutate_vars=[x])

        async def in_coroutine(rctx: ae.RunContext) -> None:
            be.wait_for_var(x)

        def inline(rctx: ae.RunContext) -> None:
            pending.result()

        def inline_all(rctx: ae.RunContext) -> None:
            be.wait_for_all()

        errors = [
            be.push_async(in_coroutine).exception(timeout=5),
            be.push_sync(inline, prop=ae.FnProperty.ASYNC).exception(timeout=5),
            be.push_sync(inline_all, prop=ae.FnProperty.ASYNC).exception(timeout=5),
        ]
        gate.set()
        for exc in errors:
            assert isinstance(exc, RuntimeError)
            assert "own event-loop thread" in str(exc)
        with pytest.raises(ExceptionGroup):
            be.wait_for_all(timeout=5)


@pytest.mark.parametrize("wait", ["wait_for_var", "wait_for_all", "get", "result"])
def test_blocking_inside_a_worker_operation_raises_instead_of_deadlocking(wait: str) -> None:
    """MXNet deadlocks when an operation waits for the engine; here the wait raises."""
    with ae.BlockingEngine(cpu_workers=1) as be:
        x = be.new_var("x", value=1)
        later = be.new_var("later")

        def waits(rctx: ae.RunContext) -> None:
            behind = be.push_sync(lambda r: None, mutate_vars=[later])  # queued behind us
            calls: dict[str, Callable[[], object]] = {
                "wait_for_var": lambda: be.wait_for_var(x),  # we hold x
                "wait_for_all": be.wait_for_all,  # waits for us
                "get": lambda: be.get(x),  # a read behind our write
                "result": behind.result,  # the one worker is ours
            }
            calls[wait]()

        exc = be.push_sync(waits, mutate_vars=[x]).exception(timeout=10)
        assert isinstance(exc, RuntimeError)
        assert "inside an operation, on one of the engine's worker threads" in str(exc)
        with pytest.raises(ExceptionGroup):
            be.wait_for_all(timeout=10)
        # From a plain thread the same waits block as usual.
        be.wait_for_var(x, timeout=10)
        assert be.get(x, timeout=10) == 1


def test_serial_mode_ops_run_on_the_loop_thread_and_cannot_block() -> None:
    with ae.BlockingEngine(serial=True) as be:
        x = be.new_var("x")
        fut = be.push_sync(lambda r: be.wait_for_var(x))
        assert isinstance(fut.exception(timeout=5), RuntimeError)
        with pytest.raises(ExceptionGroup):
            be.wait_for_all()


def test_push_from_a_thread_running_its_own_loop() -> None:
    with ae.BlockingEngine(cpu_workers=1) as be:

        async def other_app() -> int:
            fut = be.push_sync(lambda r: 41)
            return await asyncio.wrap_future(fut) + 1

        assert asyncio.run(other_app()) == 42


def test_lifecycle_errors() -> None:
    be = ae.BlockingEngine(cpu_workers=1)
    assert "not started" in repr(be)
    with pytest.raises(RuntimeError, match="not started"):
        be.push_sync(lambda r: None)
    with be:
        assert "running" in repr(be)
        with pytest.raises(RuntimeError, match="already entered"):
            be.__enter__()
    assert be.closed
    be.close()  # idempotent
    with pytest.raises(ae.EngineClosedError):
        be.wait_for_all()
    with pytest.raises(ae.EngineClosedError):
        be.__enter__()
    with pytest.raises(ValueError, match="cpu_workers"):
        ae.BlockingEngine(cpu_workers=0)


def test_a_raising_body_cancels_what_has_not_started() -> None:
    ran: list[int] = []
    futures: list[concurrent.futures.Future[object]] = []

    def body() -> None:
        with ae.BlockingEngine(cpu_workers=1) as be:
            x = be.new_var("x")
            gate = threading.Event()
            be.push_sync(lambda r: gate.wait(5), mutate_vars=[x])
            futures.append(be.push_sync(lambda r: ran.append(1), mutate_vars=[x]))
            gate.set()
            raise KeyError("body")

    with pytest.raises(KeyError, match="body"):
        body()
    assert futures[0].cancelled() or ran == [1]


def test_values_submit_and_op() -> None:
    with ae.BlockingEngine(cpu_workers=2) as be:
        total = be.new_var("total", value=0)

        @be.op(out=total)
        def add(current: int, k: int) -> int:
            return current + k

        futs = [add(total, k) for k in range(10)]
        assert be.get(total, timeout=5) == 45
        assert futs[-1].result() == 45
        assert be.submit(lambda t: t * 2, total).result(timeout=5) == 90


def test_get_timeout_cancels_the_read_and_says_why_the_var_is_busy() -> None:
    """Regression test for #6: the message carries wait_for_var's "why it is busy" dump."""
    with ae.BlockingEngine(cpu_workers=1) as be:
        x = be.new_var("x", value=1)
        gate = threading.Event()
        be.push_sync(lambda r: gate.wait(5), mutate_vars=[x], name="slow_writer")
        with pytest.raises(TimeoutError, match=r"^get\(<Var 'x'.*timed out after 0.05 s") as info:
            be.get(x, timeout=0.05)
        message = str(info.value)
        assert "why it is busy:" in message
        assert "slow_writer" in message
        assert "get(x)" not in message  # the read was cancelled before the dump
        gate.set()
        assert be.get(x) == 1


def test_a_failed_get_is_thrown_once(be: ae.BlockingEngine) -> None:
    """Regression test for #6: a get that fails raises to its caller, not again at the end."""
    empty = be.new_var("empty")
    with pytest.raises(ValueError, match=r"^<Var 'empty'.*carries no value"):
        be.get(empty, timeout=5)
    be.wait_for_all(timeout=5)  # nothing recorded
    x = be.new_var("x", value=1)
    err = ValueError("boom")

    def fail(r: ae.RunContext) -> None:
        raise err

    be.push_sync(fail, mutate_vars=[x])
    with pytest.raises(ae.DependencyError) as info:
        be.get(x, timeout=5)
    assert info.value.__cause__ is err
    with pytest.raises(ValueError, match="boom"):  # the writer's failure, thrown once
        be.wait_for_var(x)
    be.wait_for_all(timeout=5)
    assert be.get(x, timeout=5) == 1


def test_op_passes_every_keyword_to_the_function(be: ae.BlockingEngine) -> None:
    """Regression test for #6: ``name=`` and ``ctx=`` of a call are the function's."""

    @be.op(name="labelled")
    def label(x: int, name: str, ctx: str) -> str:
        return f"{name}/{ctx}/{x}"

    fut = label(1, name="n", ctx="c")
    assert fut.result(timeout=5) == "n/c/1"
    assert fut.operation.name == "labelled"  # type: ignore[attr-defined]


def test_uvloop_loop_thread() -> None:
    pytest.importorskip("uvloop")
    with ae.BlockingEngine(uvloop=True, cpu_workers=1) as be:

        async def loop_type(rctx: ae.RunContext) -> str:
            return type(asyncio.get_running_loop()).__module__

        assert be.push_async(loop_type).result(timeout=5).startswith("uvloop")


def test_run_returns_mains_result() -> None:
    async def main() -> str:
        async with ae.Engine(cpu_workers=1) as engine:
            return await engine.push_sync(lambda r: "done")

    assert ae.run(main) == "done"
    assert ae.run(main()) == "done"


def test_run_on_uvloop() -> None:
    pytest.importorskip("uvloop")

    async def main() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert ae.run(main, uvloop=True).startswith("uvloop")


def test_run_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match="async def"):
        ae.run(lambda: 1)  # type: ignore[arg-type,return-value]
    monkeypatch.setitem(sys.modules, "uvloop", None)

    async def main() -> None:
        pass

    coro = main()
    with pytest.raises(ImportError, match=r"aioengine\[uvloop\]"):
        ae.run(coro, uvloop=True)
    coro.close()


_UNCLOSED_AT_EXIT = {
    "idle": """
        x = be.new_var("x")
        assert be.push_sync(lambda r: 7, mutate_vars=[x]).result(5) == 7
    """,
    "pending": """
        x = be.new_var("x")

        async def forever(rctx):
            await asyncio.sleep(3600)

        assert be.push_sync(lambda r: 7).result(5) == 7
        be.push_async(forever, mutate_vars=[x])
        be.push_sync(lambda r: time.sleep(0.2))  # running at exit: finishes
        be.push_sync(lambda r: print("queued: dropped at exit"))  # behind it on the one worker
    """,
}


@pytest.mark.parametrize("case", sorted(_UNCLOSED_AT_EXIT))
def test_interpreter_exit_with_an_unclosed_blocking_engine_does_not_hang(case: str) -> None:
    """An entered, never closed BlockingEngine used to hang the interpreter at exit."""
    body = (
        "import asyncio, time\n"
        "import aioengine as ae\n"
        "be = ae.BlockingEngine(cpu_workers=1).__enter__()\n"
        + textwrap.dedent(_UNCLOSED_AT_EXIT[case])
        + "print('leaving', flush=True)\n"
    )
    done = run_script(body, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "leaving\n"
    assert "Task was destroyed" not in done.stderr


def test_closing_in_a_thread_while_the_interpreter_exits() -> None:
    """The main thread has ended; a thread's engine then drains and joins its workers."""
    body = textwrap.dedent(
        """
        import concurrent.futures.thread, threading, time
        import aioengine as ae

        running = threading.Event()

        def after_main_ends(rctx):
            running.set()
            # Python's exit has begun: thread pools take no new work (a private flag, the
            # only sign of it that a worker can wait for).
            while not concurrent.futures.thread._shutdown:
                time.sleep(0.01)
            return 7

        def user_thread():
            with ae.BlockingEngine(cpu_workers=1) as be:
                fut = be.push_sync(after_main_ends)
            print("closed", fut.result(), flush=True)

        threading.Thread(target=user_thread).start()
        assert running.wait(10)
        """
    )
    assert_prints(body, "closed 7\n")


def test_a_thread_still_using_the_engine_when_the_main_thread_ends() -> None:
    """Python joins non-daemon threads at exit; the engine serves them until then, except
    that its pools take no new work (as concurrent.futures'): that work is cancelled, so
    the thread waiting for it wakes instead of hanging the exit."""
    body = textwrap.dedent(
        """
        import concurrent.futures, concurrent.futures.thread, threading, time
        import aioengine as ae

        be = ae.BlockingEngine(cpu_workers=1).__enter__()
        x = be.new_var("x", value=0)
        running = threading.Event()

        def until_exit_begins(v):
            running.set()
            while not concurrent.futures.thread._shutdown:  # see the test above
                time.sleep(0.01)
            return v + 1

        def user_thread():
            be.submit(until_exit_begins, x, out=x)
            queued = be.submit(lambda v: v * 10, x, out=x)  # for the pool, behind it
            try:
                queued.result(timeout=20)
            except concurrent.futures.CancelledError:
                print("cancelled", flush=True)
            print("get", be.get(x, timeout=20), flush=True)  # inline on the loop: it runs
            be.close()
            print("closed", flush=True)

        threading.Thread(target=user_thread).start()
        assert running.wait(10)
        """
    )
    assert_prints(body, "cancelled\nget 1\nclosed\n")


def assert_prints(body: str, expected: str) -> None:
    """Run ``body`` in a fresh interpreter: it exits 0, prints ``expected`` and no error."""
    done = run_script(body, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected
    assert done.stderr == ""


@pytest.mark.parametrize("serial", [False, True])
def test_get_with_timeout_zero_returns_the_value_of_an_idle_var(serial: bool) -> None:
    """As wait_for_var(timeout=0): the timeout bounds the wait for earlier writes, and on an
    idle Var there is none, even though the loop runs the read a moment later."""
    with ae.BlockingEngine(cpu_workers=1, serial=serial) as be:
        x = be.new_var("x", value=1)
        for i in range(50):
            assert be.get(x, timeout=0) == i + 1
            be.submit(lambda v: v + 1, x, out=x).result(timeout=5)
        be.wait_for_var(x, timeout=0)
        gate = threading.Event()
        be.push_sync(lambda r: gate.wait(5), mutate_vars=[x], name="slow_writer")
        with pytest.raises(TimeoutError, match="slow_writer"):
            be.get(x, timeout=0)
        gate.set()
        assert be.get(x, timeout=5) == 51
