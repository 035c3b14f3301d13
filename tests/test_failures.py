"""Failures: an exception raised by a fn is recorded on the Vars it mutates and propagates.

The semantics are MXNet's (>= 1.5; ``docs/mxnet.md``, section "Failures, as MXNet has them"):
a failed op's exception is attached to every Var it *mutates*; later ops that read or mutate
such a Var are skipped (``DependencyError`` caused by the original exception) and pass it on
to their own mutated Vars; ``wait_for_var`` throws it once and clears it everywhere;
``wait_for_all`` throws every recorded failure in an ``ExceptionGroup`` and clears them all.
MXNet's own tests (``test_exc_handling.py``) and the numbered cases of that section are ported
in ``TestMXNetScenarios``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import aioengine as ae
from aioengine.lock import EngineLock, run_after

from .helpers import Boom

KINDS = ("sync", "coroutine", "callback-raises", "on_complete-exc")


def push_failing(
    engine: ae.Engine,
    exc: BaseException,
    *,
    kind: str = "sync",
    const: Sequence[ae.Var] = (),
    mutate: Sequence[ae.Var] = (),
    trace: list[str] | None = None,
    name: str = "fail",
) -> ae.Operation[Any]:
    """Push an op of the given kind that fails with ``exc``."""

    def note() -> None:
        if trace is not None:
            trace.append(name)

    if kind == "sync":

        def fn(rctx: ae.RunContext) -> None:
            note()
            raise exc

        return engine.push_sync(fn, const_vars=const, mutate_vars=mutate, name=name)
    if kind == "coroutine":

        async def afn(rctx: ae.RunContext) -> None:
            note()
            await asyncio.sleep(0)
            raise exc

        return engine.push_async(afn, const_vars=const, mutate_vars=mutate, name=name)
    if kind == "callback-raises":

        def cfn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            note()
            raise exc

        return engine.push_async(cfn, const_vars=const, mutate_vars=mutate, name=name)
    assert kind == "on_complete-exc"

    def tfn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
        note()
        threading.Thread(target=on_complete, args=(exc,)).start()

    return engine.push_async(tfn, const_vars=const, mutate_vars=mutate, name=name)


def push_recorder(
    engine: ae.Engine,
    trace: list[str],
    name: str,
    *,
    const: Sequence[ae.Var] = (),
    mutate: Sequence[ae.Var] = (),
    prop: ae.FnProperty = ae.FnProperty.NORMAL,
) -> ae.Operation[str]:
    """Push a sync op that appends ``name`` to ``trace`` and returns it."""

    def fn(rctx: ae.RunContext) -> str:
        trace.append(name)
        return name

    return engine.push_sync(fn, const_vars=const, mutate_vars=mutate, prop=prop, name=name)


async def assert_skipped(op: ae.Operation[Any], cause: BaseException) -> None:
    """``op`` was skipped because an input carried ``cause``."""
    with pytest.raises(ae.DependencyError) as info:
        await op
    assert info.value.__cause__ is cause
    assert op.done()
    assert not op.cancelled()
    assert op.exception() is info.value


async def assert_wait_all_raises(engine: ae.Engine, *excs: BaseException) -> None:
    """``wait_for_all`` raises exactly ``excs`` (by identity, in order) in one group."""
    with pytest.raises(ExceptionGroup) as info:
        await engine.wait_for_all()
    assert info.value.message == "unhandled errors in aioengine.Engine"
    assert len(info.value.exceptions) == len(excs)
    assert all(a is b for a, b in zip(info.value.exceptions, excs, strict=True))


class TestFailedOperation:
    """A fn that raises fails its own operation with that exception, unchanged."""

    @pytest.mark.parametrize("kind", KINDS)
    async def test_await_raises_the_exception_itself(self, engine: ae.Engine, kind: str) -> None:
        exc = Boom("bad input")
        x = engine.new_var("x")
        op = push_failing(engine, exc, kind=kind, mutate=[x])
        with pytest.raises(Boom) as info:
            await op
        assert info.value is exc
        assert op.done()
        assert not op.cancelled()
        assert op.exception() is exc
        with pytest.raises(Boom) as again:
            op.result()
        assert again.value is exc
        await assert_wait_all_raises(engine, exc)

    @pytest.mark.parametrize("kind", KINDS)
    async def test_every_mutated_var_records_the_failure(
        self, engine: ae.Engine, kind: str
    ) -> None:
        exc = Boom()
        x, y = engine.new_var("x"), engine.new_var("y")
        push_failing(engine, exc, kind=kind, mutate=[x, y])
        trace: list[str] = []
        from_x = push_recorder(engine, trace, "reads-x", const=[x])
        from_y = push_recorder(engine, trace, "writes-y", mutate=[y])
        await assert_skipped(from_x, exc)
        await assert_skipped(from_y, exc)
        assert trace == []
        await assert_wait_all_raises(engine, exc)

    async def test_read_only_inputs_are_not_marked(self, engine: ae.Engine) -> None:
        """Only mutated Vars carry the failure: the failed op's inputs stay usable."""
        exc = Boom()
        src, dst = engine.new_var("src"), engine.new_var("dst")
        failed = push_failing(engine, exc, const=[src], mutate=[dst])
        trace: list[str] = []
        assert await push_recorder(engine, trace, "reads-src", const=[src]) == "reads-src"
        assert await push_recorder(engine, trace, "writes-src", mutate=[src]) == "writes-src"
        await engine.wait_for_var(src)  # does not raise
        assert trace == ["reads-src", "writes-src"]
        assert failed.exception() is exc
        await assert_wait_all_raises(engine, exc)

    async def test_unrelated_vars_are_unaffected(self, engine: ae.Engine) -> None:
        exc = Boom()
        x, other = engine.new_var("x"), engine.new_var("other")
        push_failing(engine, exc, mutate=[x])
        trace: list[str] = []
        ops = [
            push_recorder(engine, trace, "w1", mutate=[other]),
            push_recorder(engine, trace, "r", const=[other]),
            push_recorder(engine, trace, "w2", mutate=[other]),
        ]
        assert [await op for op in ops] == ["w1", "r", "w2"]
        await engine.wait_for_var(other)
        assert trace == ["w1", "r", "w2"]
        await assert_wait_all_raises(engine, exc)


class TestSkip:
    """Ops that read or mutate a Var carrying a failure are skipped and pass it on."""

    async def test_reader_is_skipped_and_its_outputs_carry_the_failure(
        self, engine: ae.Engine
    ) -> None:
        exc = Boom()
        x, y = engine.new_var("x"), engine.new_var("y")
        trace: list[str] = []
        push_failing(engine, exc, mutate=[x], trace=trace)
        skipped = push_recorder(engine, trace, "x->y", const=[x], mutate=[y])
        await assert_skipped(skipped, exc)
        assert "'x->y'" in str(skipped.exception())
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(y)
        assert info.value is exc
        assert trace == ["fail"]

    async def test_overwrite_of_a_failed_var_is_skipped(self, engine: ae.Engine) -> None:
        """A pure write does not heal the Var: it is skipped too (MXNet failure case 3)."""
        exc = Boom()
        x = engine.new_var("x")
        trace: list[str] = []
        push_failing(engine, exc, mutate=[x], trace=trace)
        overwrite = push_recorder(engine, trace, "overwrite", mutate=[x])
        await assert_skipped(overwrite, exc)
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(x)
        assert info.value is exc
        after = push_recorder(engine, trace, "after", mutate=[x])
        assert await after == "after"
        assert trace == ["fail", "after"]

    @pytest.mark.parametrize("kind", ["sync", "coroutine", "callback"])
    async def test_skipped_fn_of_every_kind_never_runs(self, engine: ae.Engine, kind: str) -> None:
        exc = Boom()
        x = engine.new_var("x")
        push_failing(engine, exc, mutate=[x])
        ran: list[str] = []

        def sync_fn(rctx: ae.RunContext) -> None:
            ran.append("sync")

        async def coro_fn(rctx: ae.RunContext) -> None:
            ran.append("coroutine")

        def callback_fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            ran.append("callback")
            on_complete()

        if kind == "sync":
            op: ae.Operation[Any] = engine.push_sync(sync_fn, const_vars=[x])
        elif kind == "coroutine":
            op = engine.push_async(coro_fn, const_vars=[x])
        else:
            op = engine.push_async(callback_fn, const_vars=[x])
        await assert_skipped(op, exc)
        assert ran == []
        await assert_wait_all_raises(engine, exc)

    async def test_failure_propagates_along_a_chain(self, engine: ae.Engine) -> None:
        """a fails; b = f(a); c = g(b); d = h(c): all skipped, all carry the same exception."""
        exc = Boom()
        a, b, c, d = (engine.new_var(n) for n in "abcd")
        trace: list[str] = []
        push_failing(engine, exc, mutate=[a], trace=trace)
        ops = [
            push_recorder(engine, trace, "a->b", const=[a], mutate=[b]),
            push_recorder(engine, trace, "b->c", const=[b], mutate=[c]),
            push_recorder(engine, trace, "c->d", const=[c], mutate=[d]),
        ]
        for op in ops:
            await assert_skipped(op, exc)
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(d)
        assert info.value is exc
        # Thrown once: cleared from every Var of the chain.
        for v in (a, b, c, d):
            await engine.wait_for_var(v)
        await engine.wait_for_all()
        assert trace == ["fail"]

    async def test_failure_propagates_along_an_inline_chain(self, engine: ae.Engine) -> None:
        """The same on the loop thread: each skip, decided as the loop queue is claimed,
        releases the next inline operation into the queue being claimed; it runs (is
        skipped) then too, and nothing is left queued."""
        exc = Boom()
        vs = [engine.new_var(f"v{i}") for i in range(5)]
        trace: list[str] = []

        def fail(rctx: ae.RunContext) -> None:
            trace.append("fail")
            raise exc

        first = engine.push_sync(fail, mutate_vars=[vs[0]], prop=ae.FnProperty.ASYNC)
        ops = [
            push_recorder(
                engine, trace, f"v{i}->v{i + 1}", const=[vs[i]], mutate=[vs[i + 1]],
                prop=ae.FnProperty.ASYNC,
            )
            for i in range(4)
        ]  # fmt: skip
        with pytest.raises(Boom):
            await first
        for op in ops:
            await assert_skipped(op, exc)
        await assert_wait_all_raises(engine, exc)
        assert trace == ["fail"]

    async def test_skipped_ops_are_not_separate_failures(self, engine: ae.Engine) -> None:
        exc = Boom()
        x, y, z = engine.new_var("x"), engine.new_var("y"), engine.new_var("z")
        push_failing(engine, exc, mutate=[x])
        trace: list[str] = []
        for i, out in enumerate((y, z, x)):
            push_recorder(engine, trace, f"skip{i}", const=[x], mutate=[out])
        await assert_wait_all_raises(engine, exc)
        assert trace == []

    async def test_failure_is_taken_when_the_op_starts(self, engine: ae.Engine) -> None:
        """An op pushed before the writer failed is still skipped: the check is at start."""
        x, y = engine.new_var("x"), engine.new_var("y")
        gate = asyncio.Event()
        exc = Boom()

        async def fail_later(rctx: ae.RunContext) -> None:
            await gate.wait()
            raise exc

        failing = engine.push_async(fail_later, mutate_vars=[x])
        trace: list[str] = []
        reader = push_recorder(engine, trace, "x->y", const=[x], mutate=[y])
        assert not reader.done()
        gate.set()
        with pytest.raises(Boom):
            await failing
        await assert_skipped(reader, exc)
        assert trace == []
        await assert_wait_all_raises(engine, exc)

    async def test_no_skip_runs_and_its_outputs_still_carry_the_failure(
        self, engine: ae.Engine
    ) -> None:
        """FnProperty.NO_SKIP runs on a failed input; as in MXNet its outputs keep E."""
        exc = Boom()
        x, y = engine.new_var("x"), engine.new_var("y")
        trace: list[str] = []
        push_failing(engine, exc, mutate=[x], trace=trace)
        cleanup = push_recorder(
            engine, trace, "cleanup", const=[x], mutate=[y], prop=ae.FnProperty.NO_SKIP
        )
        assert await cleanup == "cleanup"
        downstream = push_recorder(engine, trace, "downstream", const=[y])
        await assert_skipped(downstream, exc)
        assert trace == ["fail", "cleanup"]
        await assert_wait_all_raises(engine, exc)


class TestWaitForVar:
    """``wait_for_var(v)`` raises the failure ``v`` carries, once."""

    async def test_raises_and_clears(self, engine: ae.Engine) -> None:
        exc = Boom()
        x = engine.new_var("x")
        push_failing(engine, exc, mutate=[x])
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(x)
        assert info.value is exc
        await engine.wait_for_var(x)  # thrown once
        await engine.wait_for_all()  # and no longer recorded

    async def test_throw_once_clears_every_var_carrying_it(self, engine: ae.Engine) -> None:
        exc = Boom()
        a, b = engine.new_var("a"), engine.new_var("b")
        push_failing(engine, exc, mutate=[a, b])
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(a)
        assert info.value is exc
        await engine.wait_for_var(b)
        await engine.wait_for_all()

    async def test_ops_pushed_after_the_raise_run_normally(self, engine: ae.Engine) -> None:
        exc = Boom()
        x, y = engine.new_var("x"), engine.new_var("y")
        trace: list[str] = []
        push_failing(engine, exc, mutate=[x], trace=trace)
        with pytest.raises(Boom):
            await engine.wait_for_var(x)
        assert await push_recorder(engine, trace, "reads-x", const=[x], mutate=[y]) == "reads-x"
        assert await push_recorder(engine, trace, "writes-x", mutate=[x]) == "writes-x"
        await engine.wait_for_var(y)
        await engine.wait_for_all()
        assert trace == ["fail", "reads-x", "writes-x"]

    async def test_only_the_waited_failure_is_cleared(self, engine: ae.Engine) -> None:
        first, second = Boom("first"), Boom("second")
        x, y = engine.new_var("x"), engine.new_var("y")
        push_failing(engine, first, mutate=[x])
        push_failing(engine, second, mutate=[y])
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(x)
        assert info.value is first
        await assert_wait_all_raises(engine, second)

    async def test_waits_for_the_failing_writer(self, engine: ae.Engine) -> None:
        """The wait covers a writer still running when it is called, then raises its error."""
        exc = Boom()
        x = engine.new_var("x")
        gate = asyncio.Event()

        async def fail_later(rctx: ae.RunContext) -> None:
            await gate.wait()
            raise exc

        engine.push_async(fail_later, mutate_vars=[x])
        waiter = asyncio.create_task(engine.wait_for_var(x))
        await asyncio.sleep(0.01)  # give a wrong implementation the chance to return early
        assert not waiter.done()
        gate.set()
        with pytest.raises(Boom) as info:
            await waiter
        assert info.value is exc

    async def test_a_failure_of_a_later_op_is_not_the_waits(self, engine: ae.Engine) -> None:
        """The wait reports what ``x`` carried when its earlier users had finished.

        An op pushed after the wait may run (and fail) before the waiting task resumes: here
        the earlier user completes from another thread, which resumes the waiter through the
        loop's queue, behind nothing but ahead of nobody. Its failure is left for a later
        wait, not thrown (and cleared) by this one.
        """
        exc = Boom("later")
        x = engine.new_var("x")
        started = asyncio.Event()
        calls: list[ae.OnComplete] = []

        def hold(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            calls.append(on_complete)
            started.set()

        engine.push_async(hold, mutate_vars=[x], prop=ae.FnProperty.ASYNC)
        await asyncio.wait_for(started.wait(), 10)
        waiter = asyncio.create_task(engine.wait_for_var(x))
        await asyncio.sleep(0)  # one step of the waiter: it queues its marker behind hold
        assert x.statistics().waiting == 1

        def fail(rctx: ae.RunContext) -> None:
            raise exc

        later = engine.push_sync(fail, mutate_vars=[x], prop=ae.FnProperty.ASYNC)
        thread = threading.Thread(target=calls[0])
        thread.start()
        thread.join()
        await asyncio.wait_for(waiter, 10)  # hold succeeded: nothing to raise
        with pytest.raises(Boom):
            await later
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(x)  # still recorded: thrown by the wait that covers it
        assert info.value is exc

    async def test_on_an_idle_var_a_failure_of_a_later_op_is_not_the_waits(
        self, threaded_engine: ae.Engine
    ) -> None:
        """The same on an idle Var: the wait takes its failure before it lets go of the
        engine's lock, after which an op pushed from another thread may fail on it (on a
        worker: in serial mode it would run on the loop, after the wait)."""
        engine = threaded_engine
        exc = Boom("later")
        x = engine.new_var("x")
        await engine.push_sync(lambda r: None, mutate_vars=[x])  # the engine is bound
        later: list[ae.Operation[None]] = []

        def fail(rctx: ae.RunContext) -> None:
            raise exc

        def push_and_fail() -> None:
            later.append(engine.push_sync(fail, mutate_vars=[x]))
            for _ in range(10_000):  # its failure is recorded on x before the wait goes on
                if later[0].done():
                    return
                time.sleep(0.001)

        real = engine._core.lock
        engine._core._use_lock(AfterRelease(real, push_and_fail))  # type: ignore[arg-type]
        try:
            await engine.wait_for_var(x)  # x was idle and carried nothing
            assert later[0].done()
        finally:
            engine._core._use_lock(real)  # before the fixture closes the engine
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(x)  # still recorded: thrown by the wait that covers it
        assert info.value is exc


class TestThrowOnceKeepsEarlierSkips:
    """Throwing a failure clears it only for the operations pushed after the throw: every
    operation pushed before it still sees the failure of the inputs it was pushed behind,
    however late it starts (with worker threads, B below used to run on a ``y`` that A never
    wrote). Deterministic: C holds ``z`` until the wait has thrown."""

    @pytest.mark.parametrize("prop", [ae.FnProperty.NORMAL, ae.FnProperty.ASYNC], ids=str)
    @pytest.mark.parametrize("kind", ["sync", "coroutine", "callback"])
    async def test_an_op_pushed_before_the_wait_stays_skipped(
        self, engine: ae.Engine, kind: str, prop: ae.FnProperty
    ) -> None:
        exc = Boom()
        x, y, z, w = (engine.new_var(n) for n in "xyzw")
        release = asyncio.Event()
        ran: list[str] = []

        def fail(rctx: ae.RunContext) -> None:
            raise exc

        async def hold(rctx: ae.RunContext) -> None:
            await release.wait()

        def note(rctx: ae.RunContext) -> None:
            ran.append("B")

        async def anote(rctx: ae.RunContext) -> None:
            ran.append("B")

        def cnote(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            ran.append("B")
            on_complete()

        a = engine.push_sync(fail, mutate_vars=[x, y], prop=prop, name="A")
        engine.push_async(hold, mutate_vars=[z], name="C")
        reads = [y, z]
        if kind == "sync":
            b = engine.push_sync(note, const_vars=reads, mutate_vars=[w], prop=prop, name="B")
        elif kind == "coroutine":
            b = engine.push_async(anote, const_vars=reads, mutate_vars=[w], name="B")
        else:
            b = engine.push_async(cnote, const_vars=reads, mutate_vars=[w], prop=prop, name="B")
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(x)
        assert info.value is exc
        assert b.state is ae.OpState.PENDING  # still behind C on z
        after = push_recorder(engine, ran, "after", const=[y], prop=prop)
        release.set()
        await assert_skipped(b, exc)
        assert await after == "after"  # pushed after the throw: y no longer fails it
        assert ran == ["after"]
        await engine.wait_for_var(w)  # B's output carries the failure already thrown
        await engine.wait_for_all()
        assert a.exception() is exc
        assert not y.statistics().failed
        assert not w.statistics().failed

    @pytest.mark.parametrize("prop", [ae.FnProperty.NORMAL, ae.FnProperty.ASYNC], ids=str)
    async def test_a_failure_passed_on_after_the_throw(
        self, engine: ae.Engine, prop: ae.FnProperty
    ) -> None:
        """A NO_SKIP op pushed before the throw runs after it and passes the failure on to
        its output: the readers of that output pushed before the throw are skipped, those
        pushed after it run. (MXNet's test_exc_symbolic shape: forward, a failing op, then
        the backward ops, one output waited for in between.)"""
        exc = Boom()
        x, h, z, out, grad = (engine.new_var(n) for n in ("x", "h", "z", "out", "grad"))
        release = asyncio.Event()
        trace: list[str] = []

        async def hold(rctx: ae.RunContext) -> None:
            await release.wait()

        push_failing(engine, exc, mutate=[x, h], name="fwd")
        engine.push_async(hold, mutate_vars=[z], name="held")
        keep = push_recorder(
            engine, trace, "keep", const=[h, z], mutate=[out], prop=ae.FnProperty.NO_SKIP
        )
        bwd = push_recorder(engine, trace, "bwd", const=[out], mutate=[grad], prop=prop)
        with pytest.raises(Boom):
            await engine.wait_for_var(x)
        later = push_recorder(engine, trace, "later", const=[out], prop=prop)
        release.set()
        assert await keep == "keep"
        await assert_skipped(bwd, exc)
        assert await later == "later"
        assert trace == ["keep", "later"]
        await engine.wait_for_all()  # thrown once


class AfterRelease(EngineLock):
    """A lock that runs ``hook`` on a thread once, right after the first release by the
    thread that made it (the loop's): an interleaving a thread switch could produce. An
    EngineLock by type, as the compiled core's hot paths require, with its own calls."""

    def __init__(self, inner: Any, hook: Callable[[], None]) -> None:
        self._inner = inner
        self._hook: Callable[[], None] | None = hook
        self._owner = threading.get_ident()
        self.owner = 0  # EngineLock's discipline (lock.py), kept by acquire and release
        self.after: list[object] = []
        # The calls the hot paths' critical sections make (EngineLock.enter and leave).
        self.take = self.acquire
        self.give = self.release

    def unlock(self) -> None:
        self.release()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        taken = bool(self._inner.acquire(blocking, timeout))
        if taken:
            self.owner = threading.get_ident()
        return taken

    def release(self) -> None:
        self.owner = 0
        after, self.after = self.after, []
        self._inner.release()
        run_after(after)
        hook = self._hook
        if hook is not None and threading.get_ident() == self._owner:
            self._hook = None
            thread = threading.Thread(target=hook)
            thread.start()
            thread.join()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def locked(self) -> bool:
        return bool(self._inner.locked())


class TestWaitForAll:
    """``wait_for_all()`` raises every recorded failure in one ExceptionGroup, then clears."""

    async def test_raises_every_failure_in_order_then_clears(self, engine: ae.Engine) -> None:
        excs = [Boom("one"), Boom("two"), Boom("three")]
        for i, exc in enumerate(excs):
            op = push_failing(engine, exc, mutate=[engine.new_var(f"v{i}")])
            with pytest.raises(Boom):
                await op  # awaiting an op does not clear its recorded failure
        await assert_wait_all_raises(engine, *excs)
        await engine.wait_for_all()

    async def test_group_is_an_exception_group(self, engine: ae.Engine) -> None:
        push_failing(engine, Boom(), mutate=[engine.new_var("x")])
        with pytest.raises(ExceptionGroup) as info:
            await engine.wait_for_all()
        assert type(info.value) is ExceptionGroup
        assert str(info.value).startswith("unhandled errors in aioengine.Engine")

    async def test_waits_for_every_op_before_raising(self, engine: ae.Engine) -> None:
        exc = Boom()
        x, y = engine.new_var("x"), engine.new_var("y")
        gate = asyncio.Event()
        trace: list[str] = []

        async def slow(rctx: ae.RunContext) -> None:
            await gate.wait()
            trace.append("slow")

        push_failing(engine, exc, mutate=[x], trace=trace)
        slow_op = engine.push_async(slow, mutate_vars=[y])
        waiter = asyncio.create_task(engine.wait_for_all())
        await asyncio.sleep(0.01)  # give a wrong implementation the chance to raise early
        assert not waiter.done()
        gate.set()
        with pytest.raises(ExceptionGroup) as info:
            await waiter
        assert info.value.exceptions == (exc,)
        assert slow_op.done()
        assert sorted(trace) == ["fail", "slow"]  # unrelated Vars: unordered

    async def test_no_failures_no_raise(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        push_recorder(engine, trace, "ok", mutate=[x])
        await engine.wait_for_all()
        assert trace == ["ok"]

    async def test_clears_the_vars_too(self, engine: ae.Engine) -> None:
        """After wait_for_all, Vars that carried a failure are usable again."""
        exc = Boom()
        x = engine.new_var("x")
        push_failing(engine, exc, mutate=[x])
        await assert_wait_all_raises(engine, exc)
        await engine.wait_for_var(x)
        trace: list[str] = []
        assert await push_recorder(engine, trace, "reads-x", const=[x]) == "reads-x"
        assert trace == ["reads-x"]


class TestOnComplete:
    """A callback-style op fails when its fn passes an exception to ``on_complete``."""

    async def test_on_complete_exc_from_another_thread(self, engine: ae.Engine) -> None:
        exc = Boom()
        x, y = engine.new_var("x"), engine.new_var("y")
        timer: list[threading.Timer] = []

        def fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            t = threading.Timer(0.01, on_complete, args=(exc,))
            timer.append(t)
            t.start()

        op = engine.push_async(fn, mutate_vars=[x])
        trace: list[str] = []
        skipped = push_recorder(engine, trace, "x->y", const=[x], mutate=[y])
        with pytest.raises(Boom) as info:
            await op
        assert info.value is exc
        await assert_skipped(skipped, exc)
        assert trace == []
        await assert_wait_all_raises(engine, exc)
        timer[0].join()

    async def test_on_complete_exc_inline(self, engine: ae.Engine) -> None:
        exc = Boom()

        def fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            on_complete(exc)

        op = engine.push_async(fn, mutate_vars=[engine.new_var("x")])
        with pytest.raises(Boom) as info:
            await op
        assert info.value is exc
        await assert_wait_all_raises(engine, exc)


class TestVersion:
    """``Var.version`` counts completed writes: run, failed or skipped; not reads or waits."""

    async def test_reads_do_not_count(self, engine: ae.Engine) -> None:
        """MXNet's VarVersion test (T7): 10 reads -> 0, 10 writes -> 10."""
        r, w = engine.new_var("r"), engine.new_var("w")
        trace: list[str] = []
        for i in range(10):
            push_recorder(engine, trace, f"r{i}", const=[r])
            push_recorder(engine, trace, f"w{i}", mutate=[w])
        await engine.wait_for_all()
        assert (r.version, w.version) == (0, 10)

    async def test_failed_and_skipped_writes_count(self, engine: ae.Engine) -> None:
        exc = Boom()
        x = engine.new_var("x")
        trace: list[str] = []
        await push_recorder(engine, trace, "ok", mutate=[x])
        assert x.version == 1
        push_failing(engine, exc, mutate=[x])
        skipped = push_recorder(engine, trace, "skipped", mutate=[x])
        await assert_skipped(skipped, exc)
        assert x.version == 3
        with pytest.raises(Boom):
            await engine.wait_for_var(x)
        assert x.version == 3  # waiting is not a write
        assert trace == ["ok"]

    async def test_skipped_reader_bumps_only_its_outputs(self, engine: ae.Engine) -> None:
        exc = Boom()
        x, y = engine.new_var("x"), engine.new_var("y")
        push_failing(engine, exc, mutate=[x])
        trace: list[str] = []
        await assert_skipped(push_recorder(engine, trace, "x->y", const=[x], mutate=[y]), exc)
        assert (x.version, y.version) == (1, 1)
        await assert_wait_all_raises(engine, exc)


class TestMXNetScenarios:
    """MXNet's exception tests (``test_exc_handling.py``) and failure cases, on Vars."""

    async def test_t15_no_raise_without_sync(self, engine: ae.Engine) -> None:
        """test_exc_imperative: pushing a failing op and its consumer raises nothing."""
        exc = Boom()
        a, c = engine.new_var("a"), engine.new_var("c")
        push_failing(engine, exc, mutate=[a])  # a = normal(0, -1)
        trace: list[str] = []
        push_recorder(engine, trace, "dot", const=[a], mutate=[c])  # c = dot(a, a)
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(c)  # c.asnumpy()
        assert info.value is exc
        assert trace == []

    async def test_t16_failure_inside_a_graph_raises_on_waitall(self, engine: ae.Engine) -> None:
        """test_exc_symbolic / gluon: a mid-graph failure surfaces at waitall."""
        exc = Boom()
        x, h, out, grad = (engine.new_var(n) for n in ("x", "h", "out", "grad"))
        trace: list[str] = []
        push_recorder(engine, trace, "fwd1", const=[x], mutate=[h])
        push_failing(engine, exc, const=[h], mutate=[out], trace=trace, name="fwd2")
        push_recorder(engine, trace, "bwd", const=[out, h], mutate=[grad])
        await assert_wait_all_raises(engine, exc)
        assert trace == ["fwd1", "fwd2"]

    async def test_t17_successive_failures_each_raise(self, engine: ae.Engine) -> None:
        """test_exc_multiple_waits: two independent failures, a wait after each."""
        first, second = Boom("first"), Boom("second")
        a, b = engine.new_var("a"), engine.new_var("b")
        push_failing(engine, first, mutate=[a])
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(a)
        assert info.value is first
        push_failing(engine, second, mutate=[b])
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(b)
        assert info.value is second
        await engine.wait_for_all()

    async def test_t18_shared_var_throws_once(self, engine: ae.Engine) -> None:
        """test_exc_post_fail: two outputs of one failure; the second wait does not raise."""
        exc = Boom()
        a, b = engine.new_var("a"), engine.new_var("b")
        push_failing(engine, exc, mutate=[a, b])
        with pytest.raises(Boom):
            await engine.wait_for_var(a)
        await engine.wait_for_var(b)
        await engine.wait_for_all()

    async def test_t19_propagation_through_a_mutable_var(self, engine: ae.Engine) -> None:
        """test_exc_mutable_var_fail: failed a; a = dot(a, a); wait a raises; waitall clean."""
        exc = Boom()
        a = engine.new_var("a")
        trace: list[str] = []
        push_failing(engine, exc, mutate=[a])
        dot = push_recorder(engine, trace, "dot", const=[a], mutate=[a])
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(a)
        assert info.value is exc
        await assert_skipped(dot, exc)
        await engine.wait_for_all()
        assert trace == []

    async def test_t20_second_waitall_does_not_raise(self, engine: ae.Engine) -> None:
        """test_multiple_waitalls, and case 5: waitall twice, then wait x: only the first raises."""
        exc = Boom()
        x = engine.new_var("x")
        push_failing(engine, exc, mutate=[x])
        await assert_wait_all_raises(engine, exc)
        await engine.wait_for_all()
        await engine.wait_for_var(x)

    async def test_dependent_wait_then_source_wait(self, engine: ae.Engine) -> None:
        """Cases 1 and 2: x fails; op reads x writes y; wait y raises; then wait x does not."""
        exc = Boom()
        x, y = engine.new_var("x"), engine.new_var("y")
        trace: list[str] = []
        push_failing(engine, exc, mutate=[x])
        push_recorder(engine, trace, "x->y", const=[x], mutate=[y])
        with pytest.raises(Boom) as info:
            await engine.wait_for_var(y)
        assert info.value is exc
        await engine.wait_for_var(x)
        assert trace == []

    async def test_waitall_then_both_vars_are_clean(self, engine: ae.Engine) -> None:
        """Case 6: x1, x2 fail; waitall raises once (both); wait x1, x2 do not raise."""
        e1, e2 = Boom("x1"), Boom("x2")
        x1, x2 = engine.new_var("x1"), engine.new_var("x2")
        with pytest.raises(Boom):
            await push_failing(engine, e1, mutate=[x1])
        push_failing(engine, e2, mutate=[x2])
        await assert_wait_all_raises(engine, e1, e2)
        await engine.wait_for_var(x1)
        await engine.wait_for_var(x2)

    async def test_engine_still_usable_after_failures(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        push_failing(engine, Boom(), mutate=[x])
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()
        trace: list[str] = []
        ops = [push_recorder(engine, trace, f"w{i}", mutate=[x]) for i in range(3)]
        assert [await op for op in ops] == ["w0", "w1", "w2"]
        await engine.wait_for_all()
        assert trace == ["w0", "w1", "w2"]
