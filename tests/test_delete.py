"""Deleting Vars and operators, pre-built operators, and what the engine keeps alive.

``delete_var(v, delete_fn)`` is a write on ``v`` that runs after every op pushed on ``v`` so
far, even when ``v`` carries a failure (MXNet skips it then and leaks: ``docs/mxnet.md``,
failure case 8); from the call on, naming ``v`` raises ``VarDeletedError``. ``new_operator``
builds an ``OprHandle`` once to ``push`` many times; ``delete_operator`` retires it after its
pending pushes.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import aioengine as ae

from .conftest import Blocker, blocked_var
from .helpers import Boom


class Payload:
    """Something a fn's closure holds, to watch with a weakref."""


def push_recorder(
    engine: ae.Engine,
    trace: list[str],
    name: str,
    *,
    const: Sequence[ae.Var] = (),
    mutate: Sequence[ae.Var] = (),
) -> ae.Operation[str]:
    def fn(rctx: ae.RunContext) -> str:
        trace.append(name)
        return name

    return engine.push_sync(fn, const_vars=const, mutate_vars=mutate, name=name)


class TestDeleteVar:
    """``delete_var`` runs ``delete_fn`` after every op pushed on the Var so far."""

    async def test_runs_after_every_earlier_reader_and_writer(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        w1 = Blocker(engine, trace, mutate=[x], name="w1")
        r1 = push_recorder(engine, trace, "r1", const=[x])
        r2 = Blocker(engine, trace, const=[x], name="r2")  # a reader that holds on
        w2 = push_recorder(engine, trace, "w2", mutate=[x])
        r3 = Blocker(engine, trace, const=[x], name="r3")

        def delete_fn(rctx: ae.RunContext) -> None:
            trace.append("delete")

        deleted = engine.delete_var(x, delete_fn)
        assert isinstance(deleted, ae.Operation)
        w1.release()
        await r1
        await r2.started.wait()
        await asyncio.sleep(0.01)  # give a wrong implementation the chance to run delete_fn
        assert not w2.done()
        r2.release()
        await w2
        await r3.started.wait()
        await asyncio.sleep(0.01)
        assert "delete" not in trace
        r3.release()
        await deleted
        assert deleted.result() is None
        assert trace[:2] == ["w1:start", "w1:end"]
        assert sorted(trace[2:4]) == ["r1", "r2:start"]
        assert trace[4:] == ["r2:end", "w2", "r3:start", "r3:end", "delete"]
        await engine.wait_for_all()

    async def test_delete_fn_gets_a_run_context(self, engine: ae.Engine) -> None:
        seen: list[ae.RunContext] = []
        x = engine.new_var("x")
        deleted = engine.delete_var(x, seen.append, ae.cpu(1))
        await deleted
        assert deleted.result() is None
        assert seen == [ae.RunContext(ae.cpu(1))]
        assert seen[0].stream is None

    async def test_without_delete_fn(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        push_recorder(engine, trace, "w", mutate=[x])
        op = engine.delete_var(x)
        assert isinstance(op, ae.Operation)
        await op
        assert op.result() is None
        assert op.done()
        assert trace == ["w"]
        await engine.wait_for_all()

    async def test_runs_even_if_the_var_carries_a_failure(self, engine: ae.Engine) -> None:
        """MXNet skips the delete here (and leaks); the failure stays recorded."""
        x, y = engine.new_var("x"), engine.new_var("y")
        exc = Boom()

        def fail(rctx: ae.RunContext) -> None:
            raise exc

        engine.push_sync(fail, mutate_vars=[x])
        trace: list[str] = []
        push_recorder(engine, trace, "x->y", const=[x], mutate=[y])  # skipped: y carries it too
        ops = [
            engine.delete_var(x, lambda rctx: trace.append("delete x")),
            engine.delete_var(y, lambda rctx: trace.append("delete y")),
        ]
        await asyncio.gather(*ops)
        assert [op.result() for op in ops] == [None, None]
        assert sorted(trace) == ["delete x", "delete y"]
        with pytest.raises(ExceptionGroup) as info:
            await engine.wait_for_all()
        assert info.value.exceptions == (exc,)

    async def test_delete_fn_raising_is_a_failure(self, engine: ae.Engine) -> None:
        exc = Boom()

        def delete_fn(rctx: ae.RunContext) -> None:
            raise exc

        op = engine.delete_var(engine.new_var("x"), delete_fn)
        with pytest.raises(ExceptionGroup) as info:
            await engine.wait_for_all()
        assert info.value.exceptions == (exc,)
        assert op.exception() is exc

    async def test_delete_twice(self, engine: ae.Engine) -> None:
        x = engine.new_var("weights")
        op = engine.delete_var(x)
        with pytest.raises(ae.VarDeletedError, match=r"'weights'"):
            engine.delete_var(x)
        await op
        with pytest.raises(ae.VarDeletedError, match=r"'weights'"):
            engine.delete_var(x)

    async def test_cancelling_it_before_it_runs_cancels_the_deletion(
        self, engine: ae.Engine
    ) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        holder = Blocker(engine, trace, mutate=[x], name="holder")
        await holder.started.wait()
        # An operation of the user's own with prop=DELETE_VAR deletes nothing: cancelling it
        # leaves the deletion alone.
        own = engine.push_sync(lambda r: None, mutate_vars=[x], prop=ae.FnProperty.DELETE_VAR)
        freed: list[str] = []
        deletion = engine.delete_var(x, lambda r: freed.append("first"))
        assert own.cancel()
        with pytest.raises(ae.VarDeletedError):
            engine.push_sync(lambda r: None, mutate_vars=[x])
        assert deletion.cancel()
        after = push_recorder(engine, trace, "after", mutate=[x])  # x is usable again
        holder.release()
        assert await after == "after"
        assert trace == ["holder:start", "holder:end", "after"]
        assert freed == []
        await engine.delete_var(x, lambda r: freed.append("second"))  # and can be deleted
        assert freed == ["second"]
        await engine.wait_for_all()

    async def test_bad_arguments(self, engine: ae.Engine) -> None:
        other = ae.Engine(cpu_workers=1)
        with pytest.raises(TypeError):
            engine.delete_var("x")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            engine.delete_var(other.new_var("foreign"))
        x = engine.new_var("x")
        with pytest.raises(TypeError):
            engine.delete_var(x, delete_fn=42)  # type: ignore[arg-type]
        await engine.delete_var(x)  # nothing was queued by the bad calls


def _use_push_sync_const(engine: ae.Engine, v: ae.Var) -> object:
    return engine.push_sync(lambda rctx: None, const_vars=[v])


def _use_push_sync_mutate(engine: ae.Engine, v: ae.Var) -> object:
    return engine.push_sync(lambda rctx: None, mutate_vars=[engine.new_var("other"), v])


def _use_push_async(engine: ae.Engine, v: ae.Var) -> object:
    async def fn(rctx: ae.RunContext) -> None:
        pass

    return engine.push_async(fn, const_vars=[v])


def _use_new_operator(engine: ae.Engine, v: ae.Var) -> object:
    return engine.new_operator(lambda rctx: None, mutate_vars=[v])


USES: list[Any] = [
    pytest.param(_use_push_sync_const, id="push_sync-const"),
    pytest.param(_use_push_sync_mutate, id="push_sync-mutate"),
    pytest.param(_use_push_async, id="push_async"),
    pytest.param(_use_new_operator, id="new_operator"),
]


class TestUseAfterDelete:
    """From the ``delete_var`` call on, naming the Var raises VarDeletedError."""

    @pytest.mark.parametrize("use", USES)
    @pytest.mark.parametrize("when", ["delete-pending", "delete-done"])
    async def test_push_raises(
        self, engine: ae.Engine, use: Callable[[ae.Engine, ae.Var], object], when: str
    ) -> None:
        x = engine.new_var("weights")
        trace: list[str] = []
        blocker = Blocker(engine, trace, mutate=[x])
        deleted = engine.delete_var(x)
        if when == "delete-done":
            blocker.release()
            await deleted
        with pytest.raises(ae.VarDeletedError, match=r"'weights'"):
            use(engine, x)
        blocker.release()
        await engine.wait_for_all()  # nothing half-queued by the failed push
        assert engine.pending == 0
        assert trace == ["block:start", "block:end"]

    async def test_push_of_a_handle_built_before(self, engine: ae.Engine) -> None:
        x = engine.new_var("weights")
        handle = engine.new_operator(lambda rctx: None, const_vars=[x])
        await engine.push(handle)
        await engine.delete_var(x)
        with pytest.raises(ae.VarDeletedError, match=r"'weights'"):
            engine.push(handle)

    async def test_wait_for_var_raises(self, engine: ae.Engine) -> None:
        x = engine.new_var("weights")
        await engine.delete_var(x)
        with pytest.raises(ae.VarDeletedError, match=r"'weights'"):
            await engine.wait_for_var(x)

    async def test_engine_still_usable(self, engine: ae.Engine) -> None:
        x, y = engine.new_var("x"), engine.new_var("y")
        await engine.delete_var(x)
        with pytest.raises(ae.VarDeletedError):
            _use_push_sync_mutate(engine, x)
        trace: list[str] = []
        assert await push_recorder(engine, trace, "y", mutate=[y]) == "y"
        await engine.wait_for_all()


class TestNewOperator:
    """``new_operator`` builds an OprHandle once; ``push`` runs it many times."""

    async def test_sync_pushed_many_times(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[int] = []

        def step(rctx: ae.RunContext) -> int:
            trace.append(len(trace))
            return len(trace)

        handle = engine.new_operator(step, mutate_vars=[x])
        assert isinstance(handle, ae.OprHandle)
        ops = [engine.push(handle) for _ in range(5)]
        assert [await op for op in ops] == [1, 2, 3, 4, 5]
        assert trace == [0, 1, 2, 3, 4]
        assert x.version == 5
        assert handle.name == step.__qualname__
        assert all(op.name == step.__qualname__ for op in ops)

    async def test_readers_between_writers(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[str] = []
        write = engine.new_operator(lambda rctx: trace.append("w"), mutate_vars=[x])
        read = engine.new_operator(lambda rctx: trace.append("r"), const_vars=[x])
        for handle in (write, read, read, write, read):
            engine.push(handle)
        await engine.wait_for_all()
        assert trace == ["w", "r", "r", "w", "r"]
        assert x.version == 2

    @pytest.mark.parametrize("is_async", [None, True])
    async def test_coroutine(self, engine: ae.Engine, is_async: bool | None) -> None:
        x = engine.new_var("x")
        trace: list[int] = []

        async def step(rctx: ae.RunContext) -> int:
            await asyncio.sleep(0)
            trace.append(len(trace))
            return len(trace)

        handle = engine.new_operator(step, mutate_vars=[x], is_async=is_async, name="step")
        ops = [engine.push(handle) for _ in range(3)]
        assert [await op for op in ops] == [1, 2, 3]
        assert [op.name for op in ops] == ["step"] * 3

    async def test_callback_style(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        trace: list[int] = []

        def step(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            trace.append(len(trace))
            on_complete()

        handle = engine.new_operator(step, mutate_vars=[x], is_async=True)
        ops = [engine.push(handle) for _ in range(3)]
        assert [await op for op in ops] == [None, None, None]
        assert trace == [0, 1, 2]
        assert x.version == 3

    async def test_is_async_none_picks_sync_for_a_plain_function(self, engine: ae.Engine) -> None:
        """A plain function is called as ``fn(rctx)``: it is not mistaken for callback-style."""

        def step(rctx: ae.RunContext) -> ae.Context:
            return rctx.ctx

        handle = engine.new_operator(step, is_async=None)
        assert await engine.push(handle, ae.cpu(1)) == ae.cpu(1)

    async def test_is_async_false_with_a_coroutine_function(self, engine: ae.Engine) -> None:
        async def step(rctx: ae.RunContext) -> None:
            pass

        with pytest.raises(TypeError, match=r"is_async"):
            engine.new_operator(step, is_async=False)

    async def test_not_callable(self, engine: ae.Engine) -> None:
        with pytest.raises(TypeError):
            engine.new_operator(42)  # type: ignore[arg-type]

    async def test_failure_of_one_push(self, engine: ae.Engine) -> None:
        """Pushes of one handle share Vars, so a failed push skips the next ones."""
        x = engine.new_var("x")
        exc = Boom()
        calls: list[int] = []

        def step(rctx: ae.RunContext) -> None:
            calls.append(len(calls))
            if len(calls) == 2:
                raise exc

        handle = engine.new_operator(step, mutate_vars=[x])
        ops = [engine.push(handle) for _ in range(3)]
        await ops[0]
        with pytest.raises(Boom):
            await ops[1]
        with pytest.raises(ae.DependencyError) as info:
            await ops[2]
        assert info.value.__cause__ is exc
        assert calls == [0, 1]
        with pytest.raises(Boom):
            await engine.wait_for_var(x)
        assert await engine.push(handle) is None
        assert calls == [0, 1, 2]


class TestDeleteOperator:
    """``delete_operator`` takes effect after the handle's pending pushes."""

    async def test_pending_pushes_still_run(self, engine: ae.Engine) -> None:
        x, trace, blocker = blocked_var(engine)
        handle = engine.new_operator(lambda rctx: trace.append("step"), mutate_vars=[x])
        ops = [engine.push(handle) for _ in range(3)]
        engine.delete_operator(handle)
        with pytest.raises(ae.OperatorDeletedError):
            engine.push(handle)
        blocker.release()
        await asyncio.gather(*ops)
        assert trace == ["block:start", "block:end", "step", "step", "step"]
        with pytest.raises(ae.OperatorDeletedError):
            engine.push(handle)

    async def test_delete_twice(self, engine: ae.Engine) -> None:
        handle = engine.new_operator(lambda rctx: None)
        await engine.push(handle)
        engine.delete_operator(handle)
        with pytest.raises(ae.OperatorDeletedError):
            engine.delete_operator(handle)

    async def test_bad_handle(self, engine: ae.Engine) -> None:
        with pytest.raises(TypeError):
            engine.delete_operator(lambda rctx: None)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            engine.push(lambda rctx: None)  # type: ignore[arg-type]


def make_fn(kind: str, fails: bool) -> tuple[Callable[..., Any], weakref.ref[Payload]]:
    """A fn of ``kind`` whose closure alone holds a Payload, and a weakref to that Payload."""
    payload = Payload()

    def check() -> None:
        assert isinstance(payload, Payload)
        if fails:
            raise Boom()

    def sync_fn(rctx: ae.RunContext) -> None:
        check()

    async def coro_fn(rctx: ae.RunContext) -> None:
        check()

    def callback_fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
        try:
            check()
        except Boom as exc:
            on_complete(exc)
        else:
            on_complete()

    fns: dict[str, Callable[..., Any]] = {
        "sync": sync_fn,
        "coroutine": coro_fn,
        "callback": callback_fn,
    }
    return fns[kind], weakref.ref(payload)


class TestReferences:
    """The engine keeps no reference to a finished op's Vars or fn (closures are freed)."""

    @pytest.mark.parametrize("kind", ["sync", "coroutine", "callback"])
    @pytest.mark.parametrize("fails", [False, True], ids=["done", "failed"])
    async def test_finished_op(self, engine: ae.Engine, kind: str, fails: bool) -> None:
        fn, payload_ref = make_fn(kind, fails)
        x, y = engine.new_var("x"), engine.new_var("y")
        var_refs = [weakref.ref(x), weakref.ref(y)]
        if kind == "sync":
            op: ae.Operation[Any] = engine.push_sync(fn, const_vars=[x], mutate_vars=[y])
        else:
            op = engine.push_async(fn, const_vars=[x], mutate_vars=[y])
        del fn, x, y
        try:
            await op
        except Boom:
            assert fails
        if fails:
            try:
                await engine.wait_for_all()  # throws (and forgets) the failure
            except ExceptionGroup:
                pass
            else:
                pytest.fail("wait_for_all did not raise")
        del op
        await asyncio.sleep(0)  # let done callbacks run
        gc.collect()
        assert payload_ref() is None, "the fn's closure is still referenced"
        assert [ref() for ref in var_refs] == [None, None], "a Var is still referenced"

    async def test_deleted_var(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        var_ref = weakref.ref(x)
        trace: list[str] = []
        await push_recorder(engine, trace, "w", mutate=[x])
        delete_fn, payload_ref = make_fn("sync", False)
        await engine.delete_var(x, delete_fn)
        del x, delete_fn
        await asyncio.sleep(0)
        gc.collect()
        assert payload_ref() is None, "delete_fn's closure is still referenced"
        assert var_ref() is None, "the deleted Var is still referenced"
