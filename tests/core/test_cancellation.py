"""Cancellation (``aioengine/cancellation.py``): ``cancel`` (``Operation.cancel``),
``cancel_not_started`` (``aclose(cancel=True)``) and ``cancel_marker`` (a ``wait_for_var``
that gives up), at each stage an operation can be in.

What a user relies on: an operation that has not started is finished CANCELLED at once (its
function never runs, later operations on its Vars move up, its awaiter's ``CancelledError``
carries the message); a running coroutine operation's task is cancelled, from any thread; a
running function on a thread cannot be interrupted (False); a final one is left alone (False).
After every scenario the scheduler's invariants hold (``validate_state()``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest

import aioengine as ae

from ..conftest import Hold
from ..helpers import Boom

_PENDING = ae.OpState.PENDING
_READY = ae.OpState.READY
_RUNNING = ae.OpState.RUNNING


def recorder(trace: list[str], name: str) -> Callable[[ae.RunContext], str]:
    """A sync function that appends ``name`` to ``trace`` and returns it."""

    def fn(rctx: ae.RunContext) -> str:
        trace.append(name)
        return name

    return fn


async def wait_thread_event(event: threading.Event) -> None:
    """Wait for a ``threading.Event`` without blocking the loop (bounded)."""
    assert await asyncio.to_thread(event.wait, 10), "timed out waiting for a thread event"


class TestNotStarted:
    """PENDING or READY: finished CANCELLED at once, its requests withdrawn."""

    async def test_a_pending_operation_is_withdrawn_and_the_next_moves_up(
        self, engine: ae.Engine
    ) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        hold = Hold(engine, x)
        victim = engine.push_sync(recorder(trace, "victim"), mutate_vars=[x], name="victim")
        after = engine.push_sync(recorder(trace, "after"), mutate_vars=[x], name="after")
        assert victim.state is _PENDING
        assert victim.cancel("not needed") is True
        assert victim.cancelled()
        assert x.statistics().waiting == 1  # only "after" is left queued behind the hold
        engine._core.validate_state()
        with pytest.raises(asyncio.CancelledError, match=r"^not needed$"):
            await victim
        with pytest.raises(asyncio.CancelledError, match=r"^not needed$"):
            victim.result()
        assert victim.cancel("again") is False  # final now
        await hold.release()
        assert await after == "after"
        assert trace == ["after"]
        assert x.version == 2  # the hold and "after": a cancelled write does not count
        engine._core.validate_state()

    async def test_a_pending_operation_frees_each_of_its_vars(
        self, threaded_engine: ae.Engine
    ) -> None:
        """Held back on x, it queued on y too: a reader of y behind it runs at once (threaded
        mode: serial mode orders every operation after the hold anyway)."""
        engine = threaded_engine
        x, y = engine.new_var("x"), engine.new_var("y")
        trace: list[str] = []
        hold = Hold(engine, x)
        victim = engine.push_sync(recorder(trace, "victim"), mutate_vars=[x, y])
        reader = engine.push_sync(recorder(trace, "reader"), const_vars=[y])
        assert reader.state is _PENDING
        assert victim.cancel() is True
        assert await asyncio.wait_for(reader, 10) == "reader"
        assert not hold.op.done()
        engine._core.validate_state()
        await hold.release()
        assert trace == ["reader"]
        assert (x.version, y.version) == (1, 0)
        engine._core.validate_state()

    async def test_a_ready_operation_in_the_loop_queue_never_runs(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        op = engine.push_sync(recorder(trace, "inline"), prop=ae.FnProperty.ASYNC, mutate_vars=[x])
        later = engine.push_sync(recorder(trace, "later"), prop=ae.FnProperty.ASYNC)
        assert op.state is _READY  # its turn came; the loop has not run it yet
        assert op.cancel("dropped") is True
        engine._core.validate_state()  # the loop queue's invariants too
        assert await later == "later"
        await engine.wait_for_all()
        assert trace == ["later"]
        assert op.cancelled()
        assert x.version == 0
        engine._core.validate_state()

    async def test_a_ready_operation_in_a_pool_queue_never_runs(
        self, threaded_engine: ae.Engine
    ) -> None:
        """Both workers busy: an operation whose Vars are free waits READY in the pool."""
        engine = threaded_engine
        release = threading.Event()
        started = [threading.Event(), threading.Event()]

        def hog(i: int) -> Callable[[ae.RunContext], int]:
            def fn(rctx: ae.RunContext) -> int:
                started[i].set()
                assert release.wait(10)
                return i

            return fn

        hogs = [engine.push_sync(hog(i)) for i in range(2)]
        for event in started:
            await wait_thread_event(event)
        trace: list[str] = []
        queued = engine.push_sync(recorder(trace, "queued"), mutate_vars=[engine.new_var("x")])
        assert queued.state is _READY
        assert queued.cancel() is True
        engine._core.validate_state()
        release.set()
        assert await asyncio.gather(*hogs) == [0, 1]
        await engine.wait_for_all()
        assert trace == []
        assert queued.cancelled()
        engine._core.validate_state()

    async def test_a_cancel_inside_a_critical_section_is_deferred_to_its_end(
        self, engine: ae.Engine
    ) -> None:
        """As a finalizer's would be (it runs on the thread holding the lock): the answer is
        whether the operation is not final yet, and the cancel happens at the unlock."""
        core = engine._core
        done = engine.push_sync(lambda r: None)
        await done
        x = engine.new_var("x")
        hold = Hold(engine, x)
        victim = engine.push_sync(lambda r: None, mutate_vars=[x])
        with core.lock:
            assert victim.cancel("deferred") is True
            assert done.cancel() is False
            assert victim.state is _PENDING  # not yet
        assert victim.cancelled()
        with pytest.raises(asyncio.CancelledError, match=r"^deferred$"):
            victim.result()
        assert not done.cancelled()
        await hold.release()
        core.validate_state()

    async def test_a_cancel_in_a_forked_child_raises(self, engine: ae.Engine) -> None:
        """``forked`` (set by hand here, as ``os.fork()``'s hook sets it in the child)."""
        core = engine._core
        hold = Hold(engine, engine.new_var("x"))
        core.forked = True
        try:
            with pytest.raises(RuntimeError, match=r"os\.fork\(\)"):
                hold.op.cancel()
        finally:
            core.forked = False
        assert not hold.op.done()
        await hold.release()
        core.validate_state()


class TestDeleteVar:
    """A deletion cancelled before it ran did not happen: its Var is usable again."""

    async def test_a_cancelled_deletion_leaves_the_var_usable(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        deleted: list[str] = []
        hold = Hold(engine, x)
        deletion = engine.delete_var(x, lambda r: deleted.append("x"))
        with pytest.raises(ae.VarDeletedError):
            engine.push_sync(lambda r: None, mutate_vars=[x])
        assert deletion.cancel() is True
        assert "deleted" not in repr(x)
        engine._core.validate_state()
        after = engine.push_sync(lambda r: "after", mutate_vars=[x])
        await hold.release()
        assert await after == "after"
        await engine.wait_for_var(x)
        assert deleted == []
        assert x.version == 2  # the hold and "after"
        # It can be deleted again, for good this time.
        await engine.delete_var(x, lambda r: deleted.append("x"))
        assert deleted == ["x"]
        with pytest.raises(ae.VarDeletedError):
            engine.push_sync(lambda r: None, const_vars=[x])
        engine._core.validate_state()


class TestRunning:
    """RUNNING: a coroutine's task is cancelled; a function on a thread is not interrupted."""

    async def test_a_running_coroutine_is_cancelled_from_the_loop_thread(
        self, engine: ae.Engine
    ) -> None:
        x = engine.new_var("x")
        started = asyncio.Event()
        seen: list[str] = []

        async def body(rctx: ae.RunContext) -> None:
            started.set()
            try:
                await asyncio.Event().wait()  # until cancelled
            except asyncio.CancelledError as exc:
                seen.append(str(exc))
                raise

        op = engine.push_async(body, mutate_vars=[x])
        after = engine.push_sync(lambda r: "after", mutate_vars=[x])
        await started.wait()
        assert op.cancel("stop") is True
        assert op.state is _RUNNING  # its task receives the CancelledError at its next step
        with pytest.raises(asyncio.CancelledError, match=r"^stop$"):
            await op
        assert seen == ["stop"]
        assert await after == "after"
        assert x.version == 1
        engine._core.validate_state()

    async def test_a_running_coroutine_is_cancelled_from_another_thread_through_the_loop(
        self, engine: ae.Engine
    ) -> None:
        """From another thread the cancel is handed to the loop (``call_soon_threadsafe``):
        True at once, the task cancelled when the loop runs again."""
        started = asyncio.Event()

        async def body(rctx: ae.RunContext) -> None:
            started.set()
            await asyncio.Event().wait()

        op = engine.push_async(body, mutate_vars=[engine.new_var("x")])
        await started.wait()
        answers: list[object] = []

        def canceller() -> None:
            answers.append(op.cancel("from a thread"))
            answers.append(op.state)

        thread = threading.Thread(target=canceller)
        thread.start()
        thread.join(10)  # blocks the loop for as long as the cancel takes: it cannot act yet
        assert not thread.is_alive()
        assert answers == [True, _RUNNING]
        with pytest.raises(asyncio.CancelledError, match=r"^from a thread$"):
            await asyncio.wait_for(op, 10)
        assert op.cancelled()
        engine._core.validate_state()

    async def test_a_coroutine_that_swallows_the_cancel_ends_as_it_returns(
        self, engine: ae.Engine
    ) -> None:
        started = asyncio.Event()

        async def body(rctx: ae.RunContext) -> str:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                return "kept going"
            return "never"

        op = engine.push_async(body)
        await started.wait()
        assert op.cancel() is True
        assert await op == "kept going"
        assert not op.cancelled()
        assert op.state is ae.OpState.DONE
        engine._core.validate_state()

    async def test_a_running_function_on_a_thread_is_not_interrupted(
        self, threaded_engine: ae.Engine
    ) -> None:
        engine = threaded_engine
        x = engine.new_var("x")
        started, release = threading.Event(), threading.Event()

        def work(rctx: ae.RunContext) -> str:
            started.set()
            assert release.wait(10)
            return "finished"

        op = engine.push_sync(work, mutate_vars=[x])
        after = engine.push_sync(lambda r: "after", mutate_vars=[x])
        await wait_thread_event(started)
        assert op.cancel("too late") is False
        assert await asyncio.to_thread(op.cancel) is False  # from another thread too
        assert op.state is _RUNNING
        assert after.state is _PENDING  # x stays held
        engine._core.validate_state()
        release.set()
        assert await op == "finished"
        assert await after == "after"
        assert x.version == 2
        engine._core.validate_state()

    async def test_a_running_function_on_a_thread_asks_the_remote_collaborator(
        self, threaded_engine: ae.Engine
    ) -> None:
        """With a remote collaborator attached, a running function on a thread is offered to
        it (``withdraw_locked``: a remote value operation whose result nobody took yet); its
        answer is the cancel's. A stand-in here, attached while the function runs and
        detached before anything else is dispatched."""
        engine = threaded_engine
        core = engine._core
        started, release = threading.Event(), threading.Event()
        asked: list[tuple[object, object]] = []

        class Remote:
            def withdraw_locked(self, op: ae.Operation[Any], msg: object) -> bool:
                asked.append((op, msg))
                return True

        def work(rctx: ae.RunContext) -> str:
            started.set()
            assert release.wait(10)
            return "finished"

        op = engine.push_sync(work)
        await wait_thread_event(started)
        try:
            with core.lock:
                core.attach_locked(remote=cast(Any, Remote()))
            assert op.cancel("withdraw") is True
        finally:
            with core.lock:
                core.remote = None
                core.may_hold = False
        assert asked == [(op, "withdraw")]
        release.set()
        assert await op == "finished"  # the stand-in withdrew nothing
        core.validate_state()


class TestFinal:
    """A final operation is left as it is."""

    async def test_a_finished_operation_is_not_cancelled(self, engine: ae.Engine) -> None:
        def fail(rctx: ae.RunContext) -> None:
            raise Boom()

        done = engine.push_sync(lambda r: "done")
        failed = engine.push_sync(fail, mutate_vars=[engine.new_var("y")])
        assert await done == "done"
        with pytest.raises(Boom):
            await failed
        assert done.cancel() is False
        assert failed.cancel() is False
        assert await asyncio.to_thread(done.cancel) is False
        assert done.result() == "done"
        assert isinstance(failed.exception(), Boom)
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()
        engine._core.validate_state()


class TestCancelNotStarted:
    """``aclose(cancel=True)``: what has not started is cancelled, saying the engine was
    closed; what runs finishes."""

    async def test_not_started_operations_are_cancelled_and_running_ones_finish(
        self, serial: bool
    ) -> None:
        engine = ae.Engine(cpu_workers=2, serial=serial)
        x, y = engine.new_var("x"), engine.new_var("y")
        trace: list[str] = []
        hold = Hold(engine, x, effect=lambda: trace.append("hold"))
        await hold.started.wait()
        pending = [
            engine.push_sync(recorder(trace, "writer"), mutate_vars=[x], name="writer"),
            engine.push_sync(recorder(trace, "reader"), const_vars=[x], name="reader"),
        ]
        ready = engine.push_sync(
            recorder(trace, "inline"), prop=ae.FnProperty.ASYNC, mutate_vars=[y], name="inline"
        )
        assert [op.state for op in pending] == [_PENDING, _PENDING]
        assert ready.state is (_PENDING if serial else _READY)  # serial: behind the hold
        asyncio.get_running_loop().call_soon(hold.gate.set)  # ends while aclose drains
        async with asyncio.timeout(10):  # (not wait_for: its task would start on a later step)
            await engine.aclose(cancel=True)
        assert engine.closed
        assert hold.op.result() is None
        assert trace == ["hold"]
        for op in [*pending, ready]:
            assert op.cancelled()
            with pytest.raises(asyncio.CancelledError) as caught:
                op.result()
            assert str(caught.value) == (
                f"{op.name!r} was cancelled before it started: the engine was closed "
                "(aclose(cancel=True))"
            )
        assert (x.version, y.version) == (1, 0)
        engine._core.validate_state()

    async def test_the_open_bulk_segment_is_flushed_and_its_members_cancelled(
        self, engine: ae.Engine
    ) -> None:
        core = engine._core
        trace: list[str] = []
        with engine.bulk(8):
            members = [
                engine.push_sync(recorder(trace, f"m{i}"), prop=ae.FnProperty.ASYNC)
                for i in range(3)
            ]
            assert core.segments.open is not None
            async with asyncio.timeout(10):
                await engine.aclose(cancel=True)
        assert core.segments.open is None
        assert all(op.cancelled() for op in members)
        assert trace == []
        core.validate_state()


class TestCancelMarker:
    """A ``wait_for_var`` that gives up takes its marker back: nothing waits behind it."""

    @pytest.mark.parametrize("how", ["timeout", "task.cancel"])
    async def test_a_wait_that_gives_up_leaves_no_request_on_the_var(
        self, engine: ae.Engine, how: str
    ) -> None:
        x = engine.new_var("x")
        hold = Hold(engine, x)
        if how == "timeout":
            with pytest.raises(TimeoutError):
                await engine.wait_for_var(x, timeout=0.01)
        else:
            waiter = asyncio.ensure_future(engine.wait_for_var(x))
            await asyncio.sleep(0)  # its first step queues the marker on x
            assert x.statistics().waiting == 1
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
        assert x.statistics().waiting == 0  # the marker is a tombstone, not a request
        engine._core.validate_state()
        trace: list[str] = []
        writer = engine.push_sync(recorder(trace, "writer"), mutate_vars=[x])
        assert x.statistics().waiting_modes == ("write",)  # the writer is next after the hold
        engine._core.validate_state()
        await hold.release()
        assert await writer == "writer"
        await engine.wait_for_var(x, timeout=10)
        assert trace == ["writer"]
        assert x.version == 2
        engine._core.validate_state()
