"""Operation: the awaitable handle a push returns, with asyncio.Future's interface.

Also the three kinds of function (sync, coroutine, callback-style with ``on_complete``), the
RunContext a function receives, and the context variables it sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

import aioengine as ae

from .conftest import COMPILED, blocked_var
from .helpers import Boom, until

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


def push_value(
    engine: ae.Engine, value: Any, *, mutate: Sequence[ae.Var] = (), name: str | None = None
) -> ae.Operation[Any]:
    def fn(rctx: ae.RunContext) -> Any:
        return value

    return engine.push_sync(fn, mutate_vars=mutate, name=name)


def push_kind(
    engine: ae.Engine,
    kind: str,
    body: Any,
    ctx: ae.Context | None = None,
    *,
    prop: ae.FnProperty = ae.FnProperty.NORMAL,
) -> tuple[ae.Operation[Any], list[Any]]:
    """Push ``body(rctx)`` wrapped as a fn of ``kind``; body's result lands in the list."""
    out: list[Any] = []
    ctx = ctx or ae.cpu()
    if kind == "sync":

        def fn(rctx: ae.RunContext) -> None:
            out.append(body(rctx))

        return engine.push_sync(fn, ctx, prop=prop), out
    if kind == "coroutine":

        async def afn(rctx: ae.RunContext) -> None:
            out.append(body(rctx))

        return engine.push_async(afn, ctx, prop=prop), out
    assert kind == "callback"

    def cfn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
        out.append(body(rctx))
        on_complete()

    return engine.push_async(cfn, ctx, prop=prop), out


KINDS = ["sync", "coroutine", "callback"]


class TestFutureInterface:
    """done / result / exception / cancelled / get_loop / name / repr."""

    @pytest.mark.parametrize(
        "args", [(), ("anything",), (None, None, 0, None, (), (), None, 0, "x", None)]
    )
    def test_an_operation_is_made_by_a_push_only(self, args: tuple[Any, ...]) -> None:
        """Constructing one directly raises a TypeError that says where they come from."""
        with pytest.raises(TypeError, match=r"cannot be created directly: push a function"):
            ae.Operation(*args)

    async def test_pending(self, engine: ae.Engine) -> None:
        x, _, blocker = blocked_var(engine)
        op = push_value(engine, 42, mutate=[x], name="answer")
        assert not op.done()
        assert not op.cancelled()
        with pytest.raises(asyncio.InvalidStateError):
            op.result()
        with pytest.raises(asyncio.InvalidStateError):
            op.exception()
        blocker.release()
        assert await op == 42
        assert op.done()
        assert not op.cancelled()
        assert op.result() == 42
        assert op.exception() is None

    async def test_failed(self, engine: ae.Engine) -> None:
        exc = Boom()

        def fn(rctx: ae.RunContext) -> None:
            raise exc

        op = engine.push_sync(fn)
        with pytest.raises(Boom):
            await op
        assert op.done()
        assert op.exception() is exc
        with pytest.raises(Boom) as info:
            op.result()
        assert info.value is exc
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()

    async def test_get_loop(self, engine: ae.Engine) -> None:
        op = push_value(engine, 1)
        assert op.get_loop() is asyncio.get_running_loop()
        await op

    @pytest.mark.parametrize("kind", KINDS)
    async def test_name(self, engine: ae.Engine, kind: str) -> None:
        def sync_fn(rctx: ae.RunContext) -> None:
            pass

        async def coro_fn(rctx: ae.RunContext) -> None:
            pass

        def callback_fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            on_complete()

        fn: Any = {"sync": sync_fn, "coroutine": coro_fn, "callback": callback_fn}[kind]
        push = engine.push_sync if kind == "sync" else engine.push_async
        unnamed = push(fn)
        named = push(fn, name="load weights")
        assert unnamed.name == fn.__qualname__
        assert named.name == "load weights"
        await asyncio.gather(unnamed, named)

    async def test_repr(self, engine: ae.Engine) -> None:
        x, _, blocker = blocked_var(engine)
        op = push_value(engine, 1, mutate=[x], name="load")
        assert repr(op).startswith("<Operation 'load' ")
        assert "pending" in repr(op)
        blocker.release()
        await op
        assert repr(op).startswith("<Operation 'load' ")
        assert "done" in repr(op)


class TestDoneCallbacks:
    """``add_done_callback``: called once, on the loop thread, with the op."""

    async def test_called_once_on_the_loop_thread(self, engine: ae.Engine) -> None:
        loop_thread = threading.get_ident()
        calls: list[tuple[ae.Operation[Any], int]] = []
        called = asyncio.Event()

        def callback(op: ae.Operation[Any]) -> None:
            calls.append((op, threading.get_ident()))
            called.set()

        x, _, blocker = blocked_var(engine)
        op = push_value(engine, 1, mutate=[x])
        op.add_done_callback(callback)
        blocker.release()
        await called.wait()
        for _ in range(3):
            await asyncio.sleep(0)  # a second call would show up here
        assert calls == [(op, loop_thread)]

    async def test_added_after_done(self, engine: ae.Engine) -> None:
        """As asyncio.Future: scheduled with call_soon, not called synchronously."""
        calls: list[ae.Operation[Any]] = []
        called = asyncio.Event()

        def callback(op: ae.Operation[Any]) -> None:
            calls.append(op)
            called.set()

        op = push_value(engine, 1)
        await op
        op.add_done_callback(callback)
        assert calls == []
        await called.wait()
        await asyncio.sleep(0)
        assert calls == [op]

    async def test_added_from_another_thread(self, engine: ae.Engine) -> None:
        loop_thread = threading.get_ident()
        threads: list[int] = []
        called = asyncio.Event()

        def callback(op: ae.Operation[Any]) -> None:
            threads.append(threading.get_ident())
            called.set()

        x, _, blocker = blocked_var(engine)
        op = push_value(engine, 1, mutate=[x])
        await asyncio.to_thread(op.add_done_callback, callback)
        blocker.release()
        await called.wait()
        assert threads == [loop_thread]

    async def test_remove_done_callback(self, engine: ae.Engine) -> None:
        calls: list[str] = []
        called = asyncio.Event()

        def removed(op: ae.Operation[Any]) -> None:
            calls.append("removed")

        def kept(op: ae.Operation[Any]) -> None:
            calls.append("kept")
            called.set()

        x, _, blocker = blocked_var(engine)
        op = push_value(engine, 1, mutate=[x])
        op.add_done_callback(removed)
        op.add_done_callback(kept)
        op.add_done_callback(removed)
        assert op.remove_done_callback(removed) == 2
        assert op.remove_done_callback(removed) == 0
        blocker.release()
        await called.wait()
        await asyncio.sleep(0)
        assert calls == ["kept"]

    async def test_order_kept_while_a_finish_on_a_worker_is_not_delivered_yet(
        self, threaded_engine: ae.Engine
    ) -> None:
        """The op finishes on a worker while the loop is busy: it is done, its callbacks not
        run yet. As with an asyncio.Future set from another thread, one added now (here or
        from another thread) runs after them, and none can be removed any more."""
        engine = threaded_engine
        order: list[str] = []
        op = engine.push_sync(lambda r: None, mutate_vars=[engine.new_var("x")])
        op.add_done_callback(lambda o: order.append("first"))
        op.add_done_callback(removed := lambda o: order.append("due"))
        await asyncio.sleep(0)  # the loop wakes a worker (a push defers that to the loop)
        deadline = time.monotonic() + 10
        while not op.done():  # the loop is blocked here: nothing is delivered meanwhile
            assert time.monotonic() < deadline
            time.sleep(0.001)  # noqa: ASYNC251 - blocking the loop on purpose
        helper = threading.Thread(
            target=op.add_done_callback, args=(lambda o: order.append("from a thread"),)
        )
        helper.start()
        helper.join(10)
        last = asyncio.Event()
        op.add_done_callback(lambda o: (order.append("on the loop"), last.set()))
        assert op.remove_done_callback(removed) == 0
        await asyncio.wait_for(last.wait(), 10)
        assert order == ["first", "due", "from a thread", "on the loop"]

    async def test_a_callback_added_before_await_has_run_when_it_returns(
        self, engine: ae.Engine
    ) -> None:
        ran: list[int] = []
        op = push_value(engine, 1, mutate=[engine.new_var("x")])
        op.add_done_callback(lambda o: ran.append(o.result()))
        assert await op == 1
        assert ran == [1]

    @pytest.mark.parametrize("outcome", ["failed", "skipped", "cancelled"])
    async def test_called_for_every_outcome(self, engine: ae.Engine, outcome: str) -> None:
        x, _, blocker = blocked_var(engine)
        exc = Boom()

        def fail(rctx: ae.RunContext) -> None:
            raise exc

        failing = engine.push_sync(fail, mutate_vars=[x])
        op = failing if outcome == "failed" else push_value(engine, 1, mutate=[x])
        seen: list[ae.Operation[Any]] = []
        called = asyncio.Event()

        def callback(done: ae.Operation[Any]) -> None:
            seen.append(done)
            called.set()

        op.add_done_callback(callback)
        if outcome == "cancelled":
            assert op.cancel() is True
        blocker.release()
        await called.wait()
        assert seen == [op]
        assert op.done()
        if outcome == "cancelled":
            assert op.cancelled()
        elif outcome == "skipped":
            assert isinstance(op.exception(), ae.DependencyError)
        else:
            assert op.exception() is exc
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()

    async def test_not_callable(self, engine: ae.Engine) -> None:
        op = push_value(engine, 1)
        with pytest.raises(TypeError):
            op.add_done_callback(42)  # type: ignore[arg-type]
        await op


class TestAwait:
    """An Operation is awaitable from any number of tasks on the engine's loop."""

    async def test_several_tasks_await_one_op(self, engine: ae.Engine) -> None:
        x, _, blocker = blocked_var(engine)
        op = push_value(engine, "v", mutate=[x])

        async def waiter() -> Any:
            return await op

        tasks = [asyncio.create_task(waiter()) for _ in range(3)]
        await asyncio.sleep(0)
        blocker.release()
        assert await asyncio.gather(*tasks) == ["v", "v", "v"]
        assert await op == "v"  # awaiting again gives the same result

    async def test_several_tasks_see_the_same_exception(self, engine: ae.Engine) -> None:
        exc = Boom()

        def fail(rctx: ae.RunContext) -> None:
            raise exc

        op = engine.push_sync(fail)
        results = await asyncio.gather(op, op, return_exceptions=True)
        assert list(results) == [exc, exc]
        assert all(r is exc for r in results)
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()

    async def test_gather(self, engine: ae.Engine) -> None:
        ops = [push_value(engine, i) for i in range(5)]
        assert await asyncio.gather(*ops) == [0, 1, 2, 3, 4]

    async def test_await_from_another_loop(self, engine: ae.Engine) -> None:
        x, _, blocker = blocked_var(engine)
        op = push_value(engine, 1, mutate=[x])

        async def foreign() -> Any:
            return await op

        with pytest.raises(RuntimeError, match=r"loop"):
            await asyncio.to_thread(asyncio.run, foreign())
        blocker.release()
        assert await op == 1  # the engine is unaffected


class TestAwaitInsideAnOperation:
    """Awaits inside a coroutine operation that could only deadlock raise at once."""

    @pytest.mark.parametrize(
        ("mine", "theirs"),
        [
            pytest.param("mutate", "const", id="they-read-what-I-write"),
            pytest.param("mutate", "mutate", id="they-write-what-I-write"),
            pytest.param("const", "mutate", id="they-write-what-I-read"),
        ],
    )
    async def test_awaiting_an_op_queued_behind_it(
        self, engine: ae.Engine, mine: str, theirs: str
    ) -> None:
        x = engine.new_var("x")
        later: list[ae.Operation[None]] = []

        async def outer(rctx: ae.RunContext) -> None:
            await later[0]

        op = engine.push_async(outer, **{f"{mine}_vars": [x]})  # type: ignore[arg-type]
        later.append(engine.push_sync(lambda r: None, **{f"{theirs}_vars": [x]}))  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match=r"would deadlock"):
            await op
        # It runs once outer failed (skipped when outer wrote x: x carries the failure).
        with contextlib.suppress(ae.DependencyError):
            await later[0]
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()

    async def test_awaiting_itself(self, engine: ae.Engine) -> None:
        me: list[ae.Operation[None]] = []

        async def outer(rctx: ae.RunContext) -> None:
            await me[0]

        me.append(engine.push_async(outer))
        with pytest.raises(RuntimeError, match=r"awaits itself"):
            await me[0]
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()

    async def test_readers_and_unrelated_ops_can_be_awaited(
        self, threaded_engine: ae.Engine
    ) -> None:
        engine = threaded_engine
        x, y = engine.new_var("x"), engine.new_var("y")
        later: list[ae.Operation[str]] = []

        async def outer(rctx: ae.RunContext) -> str:
            return await later[0] + await later[1]

        op = engine.push_async(outer, const_vars=[x])
        later.append(engine.push_sync(lambda r: "read", const_vars=[x]))  # readers overlap
        later.append(engine.push_sync(lambda r: "+other", mutate_vars=[y]))
        assert await op == "read+other"

    async def test_awaiting_an_op_queued_behind_it_through_others(
        self, threaded_engine: ae.Engine
    ) -> None:
        """d holds x and queues behind outer on y; e queues behind d on x: awaiting e, or
        waiting for x, inside outer could only deadlock too."""
        engine = threaded_engine
        x, y = engine.new_var("x"), engine.new_var("y")
        later: list[ae.Operation[str]] = []
        refused: list[str] = []

        async def outer(rctx: ae.RunContext) -> None:
            d = engine.push_sync(lambda r: "d", mutate_vars=[x, y], name="d")
            later.extend([d, engine.push_sync(lambda r: "e", mutate_vars=[x], name="e")])
            with pytest.raises(RuntimeError, match=r"awaits 'e'.*through the operations"):
                await later[1]
            refused.append("e")
            with pytest.raises(RuntimeError, match=r"would wait for 'd', which is queued"):
                await engine.wait_for_var(x)
            refused.append("x")

        await engine.push_async(outer, mutate_vars=[y])
        assert refused == ["e", "x"]
        assert [await op for op in later] == ["d", "e"]

    async def test_readers_granted_together_are_not_held_back_by_the_other(
        self, threaded_engine: ae.Engine
    ) -> None:
        """e's read of x queues behind d's (both behind a writer), and d waits for outer on
        y; but reads are granted together, so e only waits for the writer: no deadlock."""
        engine = threaded_engine
        x, y = engine.new_var("x"), engine.new_var("y")
        release = threading.Event()
        writer = engine.push_sync(lambda r: release.wait(10), mutate_vars=[x], name="writer")
        loop = asyncio.get_running_loop()

        async def outer(rctx: ae.RunContext) -> str:
            d = engine.push_sync(lambda r: "d", const_vars=[x], mutate_vars=[y], name="d")
            e = engine.push_sync(lambda r: "e", const_vars=[x], name="e")
            assert e.state is ae.OpState.PENDING
            loop.call_soon(release.set)  # after the check of the await below
            result = await e
            assert not d.done()
            # A wait for x would queue behind d's read: that one could only deadlock.
            with pytest.raises(RuntimeError, match=r"would wait for 'd'"):
                await engine.wait_for_var(x)
            return result

        assert await engine.push_async(outer, mutate_vars=[y]) == "e"
        assert await writer is True


class TestCallbackStyle:
    """``def fn(rctx, on_complete)``: done when on_complete() is called, from any thread."""

    async def test_ended_with_cancelled_error_is_cancelled_with_its_message(
        self, engine: ae.Engine
    ) -> None:
        """As a task that raises CancelledError("why") is cancelled with "why": for a
        callback-style op passing it to on_complete, and a sync op raising it."""

        def callback_style(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            on_complete(asyncio.CancelledError("upstream request cancelled"))

        def sync(rctx: ae.RunContext) -> None:
            raise asyncio.CancelledError("sync msg")

        for op, message in [
            (engine.push_async(callback_style), "upstream request cancelled"),
            (engine.push_sync(sync), "sync msg"),
        ]:
            with pytest.raises(asyncio.CancelledError, match=f"^{message}$"):
                await op
            assert op.cancelled()
            with pytest.raises(asyncio.CancelledError, match=f"^{message}$"):
                op.result()
        await engine.wait_for_all()  # a cancellation is not a failure

    async def test_completed_from_another_thread(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        timers: list[threading.Timer] = []

        def fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            trace.append("fn")

            def complete() -> None:
                trace.append("on_complete")
                on_complete()

            timer = threading.Timer(0.01, complete)
            timers.append(timer)
            timer.start()

        op = engine.push_async(fn, mutate_vars=[x])
        after = engine.push_sync(lambda rctx: trace.append("after"), mutate_vars=[x])
        await op
        assert op.result() is None
        await after
        assert trace == ["fn", "on_complete", "after"]
        assert x.version == 2
        timers[0].join()

    async def test_second_call_raises(self, engine: ae.Engine) -> None:
        tokens: list[ae.OnComplete] = []
        started = threading.Event()

        def fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            tokens.append(on_complete)
            started.set()

        op = engine.push_async(fn)
        assert await asyncio.to_thread(started.wait, 10)
        tokens[0]()
        with pytest.raises(RuntimeError):
            tokens[0]()
        with pytest.raises(RuntimeError):
            tokens[0](Boom())
        await op
        assert op.result() is None
        await engine.wait_for_all()  # the rejected Boom was not recorded

    async def test_non_exception_argument(self, engine: ae.Engine) -> None:
        tokens: list[ae.OnComplete] = []
        started = threading.Event()

        def fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            tokens.append(on_complete)
            started.set()

        op = engine.push_async(fn)
        assert await asyncio.to_thread(started.wait, 10)
        with pytest.raises(TypeError):
            tokens[0]("oops")  # type: ignore[arg-type]
        assert not op.done()
        tokens[0]()  # the bad call did not count
        await op
        assert op.result() is None

    async def test_fn_raising_before_on_complete_fails_the_op(self, engine: ae.Engine) -> None:
        exc = Boom()

        def fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            raise exc

        op = engine.push_async(fn)
        with pytest.raises(Boom) as info:
            await op
        assert info.value is exc
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()


class TestFunctionKinds:
    """push_sync takes plain functions only; a sync fn must not return a coroutine."""

    async def test_sync_fn_returning_a_coroutine_fails(self, engine: ae.Engine) -> None:
        async def work() -> int:
            return 1

        def fn(rctx: ae.RunContext) -> Any:
            return work()

        op = engine.push_sync(fn, mutate_vars=[engine.new_var("x")])
        with pytest.raises(TypeError):
            await op
        with pytest.raises(ExceptionGroup) as info:
            await engine.wait_for_all()
        assert info.value.exceptions == (op.exception(),)

    @pytest.mark.parametrize("how", ["pool", "inline", "bulk", "callback"])
    @pytest.mark.parametrize("which", ["wait_for_all", "Var.get"])
    async def test_sync_fn_returning_one_of_aioengine_s_own_coroutines_fails(
        self, engine: ae.Engine, how: str, which: str
    ) -> None:
        """The compiled core's async methods return Cython coroutines, not Python ones: a
        forgotten ``async def`` around them must fail the operation all the same."""
        x = engine.new_var("x", value=1)

        def coroutine() -> Any:
            return engine.wait_for_all() if which == "wait_for_all" else x.get()

        prop = ae.FnProperty.NORMAL if how == "pool" else ae.FnProperty.ASYNC
        if how == "callback":
            handle = engine.new_operator(lambda rctx, done: coroutine(), is_async=True)
            op = engine.push(handle)
        elif how == "bulk":
            with engine.bulk(8):
                op = engine.push_sync(lambda rctx: coroutine(), prop=prop)
        else:
            op = engine.push_sync(lambda rctx: coroutine(), prop=prop)
        with pytest.raises(TypeError, match=r"returned a coroutine; declare it 'async def'"):
            await op
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()

    async def test_push_sync_of_a_coroutine_function(self, engine: ae.Engine) -> None:
        async def fn(rctx: ae.RunContext) -> None:
            pass

        with pytest.raises(TypeError, match=r"push_async"):
            engine.push_sync(fn)
        assert engine.pending == 0

    @pytest.mark.parametrize("push", ["push_sync", "push_async"])
    async def test_not_callable(self, engine: ae.Engine, push: str) -> None:
        with pytest.raises(TypeError):
            getattr(engine, push)(42)
        assert engine.pending == 0


class TestAwaitableFunctions:
    """push_async runs a function of (rctx) that returns any awaitable, not only coroutines."""

    async def test_a_future_returned_by_fn_is_awaited(self, engine: ae.Engine) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        called = asyncio.Event()

        def fn(rctx: ae.RunContext) -> asyncio.Future[int]:
            called.set()
            return fut

        op = engine.push_async(fn, mutate_vars=[engine.new_var("x")])
        await called.wait()  # it is awaiting fut now
        assert op.state is ae.OpState.RUNNING
        fut.set_result(7)
        assert await op == 7

    async def test_a_function_returning_no_awaitable_fails_the_op(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        op = engine.push_async(lambda rctx: 42, mutate_vars=[x])
        with pytest.raises(TypeError, match=r"did not return an awaitable, got 42"):
            await op
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()
        assert await engine.push_sync(lambda r: "usable", mutate_vars=[x]) == "usable"


def test_keyboard_interrupt_in_a_coroutine_op_is_recorded_and_stops_the_loop() -> None:
    """As for an inline sync op: the failure is recorded and the loop still stops."""
    with asyncio.Runner() as runner:
        engine = ae.Engine()
        ops: list[ae.Operation[None]] = []

        async def interrupt(rctx: ae.RunContext) -> None:
            raise KeyboardInterrupt

        async def main() -> None:
            ops.append(engine.push_async(interrupt, mutate_vars=[engine.new_var("x")]))
            await asyncio.sleep(1)

        with pytest.raises(KeyboardInterrupt):
            runner.run(main())
        assert ops[0].done()
        assert isinstance(ops[0].exception(), KeyboardInterrupt)

        async def close() -> None:
            with pytest.raises(BaseExceptionGroup) as info:
                await engine.aclose()
            assert info.value.exceptions == (ops[0].exception(),)

        runner.run(close())


@pytest.mark.parametrize("how", ["inline", "serial", "bulk"])
def test_keyboard_interrupt_in_an_inline_op_leaves_the_loop_queue_running(how: str) -> None:
    """The loop stops, and the operations queued behind the interrupt (and later ones) still
    run (or are skipped, behind its failure) on the loop once it runs again: the loop's queue
    of operations is not left stuck, and neither is a bulk segment's rest."""
    with asyncio.Runner() as runner:
        engine = ae.Engine(serial=how == "serial")
        prop = ae.FnProperty.NORMAL if how == "serial" else ae.FnProperty.ASYNC
        ops: list[ae.Operation[Any]] = []

        def interrupt(rctx: ae.RunContext) -> None:
            raise KeyboardInterrupt

        async def main() -> None:
            x, y = engine.new_var("x"), engine.new_var("y")
            with engine.bulk(4) if how == "bulk" else contextlib.nullcontext():
                ops.append(engine.push_sync(interrupt, mutate_vars=[x], prop=prop))
                ops.append(engine.push_sync(lambda r: "behind", mutate_vars=[y], prop=prop))
                ops.append(engine.push_sync(lambda r: "skipped", const_vars=[x], prop=prop))
            await asyncio.sleep(1)

        with pytest.raises(KeyboardInterrupt):
            runner.run(main())
        assert isinstance(ops[0].exception(), KeyboardInterrupt)

        async def later() -> None:
            fresh = engine.push_sync(
                lambda r: "later", mutate_vars=[engine.new_var("z")], prop=prop
            )
            async with asyncio.timeout(10):
                assert await ops[1] == "behind"
                with pytest.raises(ae.DependencyError):
                    await ops[2]
                assert await fresh == "later"
            with pytest.raises(BaseExceptionGroup) as info:
                await engine.aclose()
            assert info.value.exceptions == (ops[0].exception(),)

        runner.run(later())


def test_a_coroutine_op_closed_with_its_loop_does_not_complain() -> None:
    """A task destroyed with its loop closes its coroutine: GeneratorExit passes through."""
    loop = asyncio.new_event_loop()
    engine = ae.Engine()
    started = asyncio.Event()

    async def forever(rctx: ae.RunContext) -> None:
        started.set()
        await asyncio.Event().wait()

    async def main() -> ae.Operation[None]:
        op = engine.push_async(forever)
        await started.wait()
        return op

    op = loop.run_until_complete(main())
    loop.close()
    task = op.task
    assert task is not None
    task.get_coro().close()  # what destroying the pending task does
    assert op.state is ae.OpState.RUNNING  # never finished: its loop is gone


class TestRunContext:
    """``rctx.ctx`` is the context pushed to; ``rctx.stream`` is None on the CPU."""

    @pytest.mark.parametrize("kind", KINDS)
    @pytest.mark.parametrize(
        "prop", [ae.FnProperty.NORMAL, ae.FnProperty.CPU_PRIORITIZED, ae.FnProperty.ASYNC]
    )
    @pytest.mark.parametrize("ctx", [ae.cpu(0), ae.cpu(1)], ids=["cpu0", "cpu1"])
    async def test_run_context(
        self, engine: ae.Engine, kind: str, prop: ae.FnProperty, ctx: ae.Context
    ) -> None:
        op, out = push_kind(engine, kind, lambda rctx: rctx, ctx, prop=prop)
        await op
        [rctx] = out
        assert isinstance(rctx, ae.RunContext)
        assert rctx.ctx == ctx
        assert rctx.stream is None


class TestContextVars:
    """Context variables set by the pusher are visible inside fn."""

    @pytest.mark.parametrize("kind", KINDS)
    async def test_pusher_context_is_visible(self, engine: ae.Engine, kind: str) -> None:
        token = request_id.set("req-1")
        try:
            op, out = push_kind(engine, kind, lambda rctx: request_id.get())
        finally:
            request_id.reset(token)
        await op
        assert out == ["req-1"]

    @pytest.mark.parametrize("kind", KINDS)
    async def test_each_pusher_sees_its_own(self, engine: ae.Engine, kind: str) -> None:
        async def push_as(value: str) -> Any:
            request_id.set(value)
            op, out = push_kind(engine, kind, lambda rctx: request_id.get())
            await op
            return out[0]

        results = await asyncio.gather(push_as("a"), push_as("b"), push_as("c"))
        assert list(results) == ["a", "b", "c"]
        assert request_id.get() == "unset"


# -- run_here: a queued operation run on the loop's thread ------------------------------------


async def _queued_behind_a_busy_worker(
    engine: ae.Engine, gate: threading.Event, var: ae.Var | None = None
) -> tuple[ae.Operation[Any], ae.Operation[Any], list[int]]:
    """A pool of one worker, busy until ``gate`` is set, and a ready operation queued behind
    it (writing ``var``): (the busy one, the queued one, the thread idents it ran on)."""
    started = threading.Event()

    def busy(rctx: ae.RunContext) -> None:
        started.set()
        gate.wait(10)

    ran: list[int] = []

    def queued(rctx: ae.RunContext) -> str:
        ran.append(threading.get_ident())
        return "done"

    first = engine.push_sync(busy, name="busy")
    await until(started.is_set)  # the worker has it (woken at the loop's next iteration)
    second = engine.push_sync(queued, mutate_vars=() if var is None else (var,), name="queued")
    await asyncio.sleep(0)
    assert second.state is ae.OpState.READY
    return first, second, ran


async def test_run_here_runs_a_queued_operation_on_the_loop_thread() -> None:
    gate = threading.Event()
    async with ae.Engine(cpu_workers=1) as engine:
        v = engine.new_var("v")
        busy, op, ran = await _queued_behind_a_busy_worker(engine, gate, v)
        after = engine.push_sync(lambda rctx: "after", const_vars=(v,), name="after")
        assert op.run_here() is True
        assert ran == [threading.get_ident()]  # the loop's thread, while the worker is busy
        assert op.done()
        assert op.result() == "done"
        assert after.state is ae.OpState.READY  # its Var released: the reader behind it
        assert op.run_here() is False  # done: nothing to run
        gate.set()
        assert await after == "after"
        await busy


async def test_run_here_leaves_what_it_cannot_run_unchanged() -> None:
    gate = threading.Event()
    async with ae.Engine(cpu_workers=1) as engine:
        v = engine.new_var("v")
        busy, op, ran = await _queued_behind_a_busy_worker(engine, gate, v)
        assert busy.run_here() is False  # running on the worker
        waiting = engine.push_sync(lambda rctx: 1, mutate_vars=(v,), name="waiting")
        assert waiting.state is ae.OpState.PENDING
        assert waiting.run_here() is False  # not ready: its turn on v has not come

        async def coro(rctx: ae.RunContext) -> int:
            return 2

        coroutine_op = engine.push_async(coro, name="coroutine")
        assert coroutine_op.run_here() is False  # not a sync operation of a pool
        inline = engine.push_sync(lambda rctx: 3, mutate_vars=(v,), prop=ae.FnProperty.ASYNC)
        assert inline.run_here() is False  # a loop operation, but not ready (not queued yet)

        assert op.state is ae.OpState.READY  # still queued, untouched
        assert ran == []
        gate.set()
        assert (await op, await waiting, await coroutine_op, await inline) == ("done", 1, 2, 3)
        assert len(ran) == 1
        assert ran[0] != threading.get_ident()  # the worker ran it


async def test_run_here_runs_an_inline_operation_queued_for_the_loop_now() -> None:
    # On the loop's thread a READY inline operation runs at the call, not at the loop's next
    # turn; its successors are released as when the loop runs it. Off the loop: False.
    async with ae.Engine(cpu_workers=1) as engine:
        v = engine.new_var("v")
        order: list[str] = []
        first = engine.push_sync(
            lambda rctx: order.append("first"), mutate_vars=(v,), prop=ae.FnProperty.ASYNC
        )
        op = engine.push_sync(
            lambda rctx: order.append("op") or threading.get_ident(),
            const_vars=(v,),
            prop=ae.FnProperty.ASYNC,
        )
        assert op.run_here() is False  # not ready: first holds v
        assert first.state is ae.OpState.READY
        other: list[bool] = []
        thread = threading.Thread(target=lambda: other.append(first.run_here()))
        thread.start()
        thread.join()
        assert other == [False]  # another thread never runs the loop's operations
        assert first.run_here() is True
        assert order == ["first"]
        assert first.done()
        assert op.state is ae.OpState.READY  # released by first, as the loop would
        assert op.run_here() is True
        assert op.result() == threading.get_ident()
        assert order == ["first", "op"]
        assert op.run_here() is False  # done: nothing to run
        await asyncio.sleep(0)  # the loop's run of its queue finds nothing
        assert order == ["first", "op"]
        engine._core.validate_state()  # the loop queue's invariants among them


async def test_run_here_of_a_skipped_inline_operation_runs_nothing() -> None:
    async with ae.Engine(cpu_workers=1) as engine:
        v = engine.new_var("v")

        def boom(rctx: ae.RunContext) -> None:
            raise ValueError("boom")

        failed = engine.push_sync(boom, mutate_vars=(v,), prop=ae.FnProperty.ASYNC)
        reader = engine.push_sync(lambda rctx: 1, const_vars=(v,), prop=ae.FnProperty.ASYNC)
        assert failed.run_here() is True  # it ran (and failed)
        assert isinstance(failed.exception(), ValueError)
        assert reader.run_here() is False  # skipped at its start: its function never ran
        with pytest.raises(ae.DependencyError):
            await reader
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()


@pytest.mark.skipif(COMPILED, reason="patches the scheduler, a Python class in the pure build")
async def test_run_here_of_an_inline_operation_interrupted_before_its_start_requeues_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A Ctrl-C that lands between taking the operation out of the loop's queue and starting
    # it: the caller gets it, and the operation is queued again (else it would hold its Vars
    # for ever, and aclose() would hang).
    async with ae.Engine(cpu_workers=1) as engine:
        v = engine.new_var("v")
        op = engine.push_sync(lambda rctx: 7, mutate_vars=(v,), prop=ae.FnProperty.ASYNC)
        core = engine._core
        real = type(core).start_locked

        def interrupted(self: Any, op: Any, todo: Any) -> bool:
            monkeypatch.setattr(type(core), "start_locked", real)
            raise KeyboardInterrupt

        monkeypatch.setattr(type(core), "start_locked", interrupted)
        with pytest.raises(KeyboardInterrupt):
            op.run_here()
        assert op.state is ae.OpState.READY
        core.validate_state()
        await until(op.done)  # the loop's queue runs it
        assert op.result() == 7


async def test_run_here_runs_on_a_thread_of_the_users() -> None:
    gate = threading.Event()
    async with ae.Engine(cpu_workers=1) as engine:
        busy, op, ran = await _queued_behind_a_busy_worker(engine, gate)
        mine: list[bool] = []
        thread = threading.Thread(target=lambda: mine.append(op.run_here()))
        thread.start()
        thread.join()
        assert mine == [True]
        assert ran == [thread.ident]  # on the thread that asked, while the worker is busy
        assert op.result() == "done"
        gate.set()
        await busy


async def test_run_here_inside_an_operation_leaves_it_to_the_pool() -> None:
    async with ae.Engine(cpu_workers=1) as engine:
        pushed = threading.Event()
        box: list[ae.Operation[Any]] = []

        def nested(rctx: ae.RunContext) -> bool:
            pushed.wait(10)
            return box[0].run_here()  # on the pool's one worker, the other queued behind it

        outer = engine.push_sync(nested, name="outer")
        await until(lambda: outer.state is ae.OpState.RUNNING)
        queued = engine.push_sync(lambda rctx: "queued", name="queued")
        box.append(queued)
        await asyncio.sleep(0)
        assert queued.state is ae.OpState.READY
        pushed.set()
        assert await outer is False
        assert await queued == "queued"


async def test_run_here_of_an_operation_skipped_at_its_start_ran_nothing() -> None:
    gate = threading.Event()
    async with ae.Engine(cpu_workers=1) as engine:
        v = engine.new_var("v")

        def boom(rctx: ae.RunContext) -> None:
            raise Boom("the input failed")

        busy, failing, ran = await _queued_behind_a_busy_worker(engine, gate)
        failed = engine.push_sync(boom, mutate_vars=(v,), name="failed")
        reader = engine.push_sync(lambda rctx: ran.append(0), const_vars=(v,), name="reader")
        assert failed.run_here() is True  # it ran (and failed)
        assert reader.state is ae.OpState.READY  # queued: skipped only as it starts
        assert reader.run_here() is False  # skipped at its start: its function never ran
        assert reader.state is ae.OpState.SKIPPED
        gate.set()
        await busy
        await failing
        with contextlib.suppress(BaseException):
            await engine.wait_for_all()


async def test_run_here_raises_an_interrupt_its_function_raised_on_the_callers_thread() -> None:
    gate = threading.Event()
    async with ae.Engine(cpu_workers=1) as engine:

        def interrupted(rctx: ae.RunContext) -> None:
            raise KeyboardInterrupt

        busy, _, _ = await _queued_behind_a_busy_worker(engine, gate)
        op = engine.push_sync(interrupted, name="interrupted")
        await asyncio.sleep(0)
        got: list[BaseException] = []

        def user_thread() -> None:
            try:
                op.run_here()
            except BaseException as exc:
                got.append(exc)

        thread = threading.Thread(target=user_thread)
        thread.start()
        thread.join()
        assert [type(e) for e in got] == [KeyboardInterrupt]  # raised there, as on the loop
        assert op.state is ae.OpState.FAILED  # and recorded, as on a worker
        gate.set()
        await busy
        with pytest.raises(BaseExceptionGroup) as group:
            await engine.wait_for_all()
        assert group.value.subgroup(KeyboardInterrupt) is not None
