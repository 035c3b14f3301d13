"""``ae.Abort``: a function refuses its work without poisoning its Vars.

The operation fails for its awaiter with the Abort (unchanged), and its Vars are left as they
were, as by a rolled-back transaction: no failure is recorded on what it mutates, the
operations after it run on the unchanged values, no wait raises it again and
``Var.version`` does not count it. Every way a function runs is covered: thread pool, inline
on the loop, coroutine, callback-style (raising or passing it to ``on_complete``), a bulk
segment's member, a concurrent group's member, the simulated GPU, and the ergonomic layer
(``submit(..., out=)``, ``@engine.op``, ``accumulate=``).

And the other half of issue 35's life cycle item: an engine garbage collected unclosed with
failures that no wait raised says so, once.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
import threading
import warnings
from typing import Any

import pytest

import aioengine as ae

KINDS = ("sync", "inline", "coroutine", "callback-raises", "on_complete-exc")


class InsufficientFunds(ae.Abort):
    """A user's refusal, as a subclass: it aborts the same way."""


def push_aborting(
    engine: ae.Engine,
    exc: BaseException,
    kind: str,
    *,
    const: tuple[ae.Var, ...] = (),
    mutate: tuple[ae.Var, ...] = (),
) -> ae.Operation[Any]:
    """Push an operation of ``kind`` that fails with ``exc``."""
    if kind in ("sync", "inline"):

        def fn(rctx: ae.RunContext) -> None:
            raise exc

        prop = ae.FnProperty.ASYNC if kind == "inline" else ae.FnProperty.NORMAL
        return engine.push_sync(fn, const_vars=const, mutate_vars=mutate, prop=prop)
    if kind == "coroutine":

        async def afn(rctx: ae.RunContext) -> None:
            await asyncio.sleep(0)
            raise exc

        return engine.push_async(afn, const_vars=const, mutate_vars=mutate)
    if kind == "callback-raises":

        def cfn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            raise exc

        return engine.push_async(cfn, const_vars=const, mutate_vars=mutate)
    assert kind == "on_complete-exc"

    def tfn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
        threading.Thread(target=on_complete, args=(exc,)).start()

    return engine.push_async(tfn, const_vars=const, mutate_vars=mutate)


async def assert_aborted(op: ae.Operation[Any], exc: BaseException) -> None:
    """``op`` failed with ``exc`` itself, for its awaiter."""
    with pytest.raises(ae.Abort) as info:
        await op
    assert info.value is exc
    assert op.state is ae.OpState.FAILED
    assert op.exception() is exc


@pytest.mark.parametrize("kind", KINDS)
async def test_abort_fails_only_the_operation(kind: str) -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        a = engine.new_var("a", value=1)
        b = engine.new_var("b", value=2)
        exc = ae.Abort("refused")
        op = push_aborting(engine, exc, kind, const=(a,), mutate=(b,))
        after = engine.push_sync(lambda rctx: (a._value, b._value), const_vars=[a, b])
        writer = engine.submit(lambda x: x + 10, b, out=b)
        await assert_aborted(op, exc)
        assert await after == (1, 2)  # ran, on the unchanged values
        assert await writer == 12
        assert b.version == 1  # the writer's write; the abort is none
        assert a.statistics().failed is False
        assert b.statistics().failed is False
        await engine.wait_for_var(b)  # nothing to raise
        await engine.wait_for_all()
        assert engine.statistics().failed == 1
    # aclose() (the async with) raised nothing either.
    assert await b.get() == 12


async def test_dependents_pushed_before_the_abort_finishes_run() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        v = engine.new_var("v", value=0)
        gate = threading.Event()

        def refuse(rctx: ae.RunContext) -> None:
            gate.wait(5)
            raise ae.Abort

        op = engine.push_sync(refuse, mutate_vars=[v])
        readers = [engine.push_sync(lambda r: v._value, const_vars=[v]) for _ in range(3)]
        writer = engine.push_sync(lambda r: setattr(v, "_value", 5), mutate_vars=[v])
        gate.set()
        with pytest.raises(ae.Abort):
            await op
        assert [await r for r in readers] == [0, 0, 0]
        await writer
        assert await v.get() == 5


async def test_a_subclass_reaches_the_awaiter_as_itself() -> None:
    async with ae.Engine() as engine:
        a = engine.new_var("a", value=3)
        exc = InsufficientFunds("need 5, have 3")
        op = push_aborting(engine, exc, "sync", mutate=(a,))
        with pytest.raises(InsufficientFunds, match="need 5, have 3") as info:
            await op
        assert info.value is exc
        assert str(exc) == "need 5, have 3"
        assert repr(ae.Abort("reason")) == "Abort('reason')"
        assert await a.get() == 3
        assert not a.statistics().failed


async def test_an_ordinary_exception_still_poisons() -> None:
    """The exception to the rule is Abort only, not an exception that wraps one."""
    wrapped = ExceptionGroup("several", [ae.Abort("inside")])
    engine = ae.Engine()
    a = engine.new_var("a", value=1)
    op = push_aborting(engine, wrapped, "sync", mutate=(a,))
    with pytest.raises(ExceptionGroup):
        await op
    with pytest.raises(ae.DependencyError) as info:
        await a.get()
    assert info.value.__cause__ is wrapped
    with pytest.raises(ExceptionGroup) as group:
        await engine.aclose()
    assert group.value.exceptions == (wrapped,)


async def test_abort_leaves_an_earlier_failure_where_it_was() -> None:
    """A NO_SKIP operation that inherited a failure and aborts passes nothing on, and a Var
    that carried a failure before keeps it (its state as it was)."""
    engine = ae.Engine()
    a = engine.new_var("a", value=1)
    b = engine.new_var("b", value=2)
    boom = ValueError("boom")
    failed = push_aborting(engine, boom, "sync", mutate=(a,))

    def refuse(rctx: ae.RunContext) -> None:
        raise ae.Abort

    op = engine.push_sync(refuse, const_vars=[a], mutate_vars=[b], prop=ae.FnProperty.NO_SKIP)
    with pytest.raises(ValueError):
        await failed
    with pytest.raises(ae.Abort):
        await op
    assert not b.statistics().failed  # the inherited failure was not passed on
    assert await b.get() == 2
    assert a.statistics().failed  # still carries its writer's failure
    with pytest.raises(ExceptionGroup) as group:
        await engine.aclose()
    assert group.value.exceptions == (boom,)


async def test_submit_with_out_keeps_the_values() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        a = engine.new_var("a", value=10)
        b = engine.new_var("b", value=0)

        def transfer(x: int, y: int, amount: int) -> tuple[int, int]:
            if x < amount:
                raise InsufficientFunds(f"{x} < {amount}")
            return x - amount, y + amount

        async def atransfer(x: int, y: int, amount: int) -> tuple[int, int]:
            await asyncio.sleep(0)
            return transfer(x, y, amount)

        ops = [
            engine.submit(transfer, a, b, 30, out=(a, b)),
            engine.submit(atransfer, a, b, 30, out=(a, b)),
            engine.submit(transfer, a, b, 4, out=(a, b)),
            engine.submit(transfer, a, b, 30, out=(a, b), prop=ae.FnProperty.ASYNC),
            engine.submit(atransfer, a, b, 4, out=(a, b)),
        ]
        results = await asyncio.gather(*ops, return_exceptions=True)
        assert isinstance(results[0], InsufficientFunds)
        assert isinstance(results[1], InsufficientFunds)
        assert results[2] == (6, 4)
        assert isinstance(results[3], InsufficientFunds)
        assert results[4] == (2, 8)
        assert (await a.get(), await b.get()) == (2, 8)
        assert (a.version, b.version) == (2, 2)
    assert (await a.get(), await b.get()) == (2, 8)  # after aclose(), which raised nothing


async def test_decorated_op_with_out_keeps_the_value() -> None:
    async with ae.Engine() as engine:
        total = engine.new_var("total", value=100)

        @engine.op(out=total)
        def spend(current: int, amount: int) -> int:
            if amount > current:
                raise ae.Abort(f"cannot spend {amount} of {current}")
            return current - amount

        first = spend(total, 500)
        second = spend(total, 40)
        with pytest.raises(ae.Abort, match="cannot spend 500 of 100"):
            await first
        assert await second == 60
        assert await total.get() == 60


@pytest.mark.parametrize("ordered", [False, True])
async def test_accumulate_skips_an_aborted_call(ordered: bool) -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        acc = engine.new_var("acc", value=0)

        def part(i: int) -> int:
            if i == 2:
                raise ae.Abort(f"part {i}")
            return i

        ops = [engine.submit(part, i, accumulate=acc, ordered=ordered) for i in range(5)]
        results = await asyncio.gather(*ops, return_exceptions=True)
        assert results[:2] == [0, 1]
        assert isinstance(results[2], ae.Abort)
        assert str(results[2]) == "part 2"
        assert results[3:] == [3, 4]
        assert await acc.get() == 0 + 1 + 3 + 4


async def test_accumulate_of_a_cancelled_call_merges_nothing() -> None:
    async with ae.Engine(cpu_workers=1) as engine:
        acc = engine.new_var("acc", value=1)
        gate = engine.new_var("gate")
        hold = asyncio.Event()

        async def blocker() -> None:
            await hold.wait()

        engine.submit(blocker, writes=[gate])
        merge = engine.submit(lambda: 5, reads=[gate], accumulate=acc, name="part")
        [call] = [op for op in engine._core.live.values() if op.name == "part"]
        assert call.cancel()
        hold.set()
        with pytest.raises(asyncio.CancelledError):
            await merge
        assert merge.cancelled()
        assert await acc.get() == 1
        assert not acc.statistics().failed


async def test_bulk_member_aborts_alone() -> None:
    async with ae.Engine() as engine:
        v = engine.new_var("v", value=0)
        seen: list[int] = []

        def add(n: int) -> Any:
            def fn(rctx: ae.RunContext) -> None:
                if n == 2:
                    raise ae.Abort("two")
                v._value += n
                seen.append(n)

            return fn

        with engine.bulk(8):
            ops = [
                engine.push_sync(add(n), mutate_vars=[v], prop=ae.FnProperty.ASYNC)
                for n in range(5)
            ]
        results = await asyncio.gather(*ops, return_exceptions=True)
        assert isinstance(results[2], ae.Abort)
        assert seen == [0, 1, 3, 4]
        assert await v.get() == 8
        assert v.version == 4  # the four writes that ran
        assert not v.statistics().failed


async def test_concurrent_member_aborts_alone() -> None:
    async with ae.Engine(cpu_workers=4) as engine:
        v = engine.new_var("v", value=0)
        lock = threading.Lock()

        def add(n: int) -> Any:
            def fn(rctx: ae.RunContext) -> int:
                if n == 1:
                    raise ae.Abort("one")
                with lock:
                    v._value += n
                return n

            return fn

        ops = [engine.push_sync(add(n), concurrent_vars=[v]) for n in range(4)]
        after = engine.push_sync(lambda r: v._value, const_vars=[v])
        results = await asyncio.gather(*ops, return_exceptions=True)
        assert isinstance(results[1], ae.Abort)
        assert [results[0], *results[2:]] == [0, 2, 3]
        assert await after == 5
        assert v.version == 3
        assert not v.statistics().failed


async def test_commute_member_aborts_alone() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        v = engine.new_var("v", value=0)

        def add(n: int) -> Any:
            def fn(rctx: ae.RunContext) -> None:
                if n == 3:
                    raise ae.Abort
                v._value += n

            return fn

        ops = [engine.push_sync(add(n), commute_vars=[v]) for n in range(5)]
        results = await asyncio.gather(*ops, return_exceptions=True)
        assert [type(r) for r in results].count(ae.Abort) == 1
        assert await v.get() == 0 + 1 + 2 + 4


async def test_abort_on_the_simulated_gpu() -> None:
    async with ae.Engine(gpu_backend=ae.SimulatedGPU()) as engine:
        v = engine.new_var("v", value=7)

        def refuse(rctx: ae.RunContext) -> None:
            raise ae.Abort("gpu")

        op = engine.push_sync(refuse, ae.gpu(0), mutate_vars=[v])
        after = engine.push_sync(lambda r: v._value, ae.gpu(0), const_vars=[v])
        with pytest.raises(ae.Abort, match="gpu"):
            await op
        assert await after == 7
        assert not v.statistics().failed
        assert v.version == 0


async def test_blocking_engine_submit_abort() -> None:
    def run() -> tuple[Any, int]:
        with ae.BlockingEngine() as engine:
            a = engine.new_var("a", value=1)

            def refuse(x: int) -> int:
                raise ae.Abort(f"keep {x}")

            future = engine.submit(refuse, a, out=a)
            try:
                future.result(10)
            except ae.Abort as exc:
                caught: Any = exc
            return caught, engine.get(a)

    caught, value = await asyncio.to_thread(run)
    assert isinstance(caught, ae.Abort)
    assert str(caught) == "keep 1"
    assert value == 1


def test_abort_is_exported_and_documented() -> None:
    assert "Abort" in ae.__all__
    assert issubclass(ae.Abort, Exception)
    assert not issubclass(ae.Abort, ae.EngineError)  # the user's, not the engine's
    assert ae.Abort.__doc__
    assert "rolled-back" in ae.Abort.__doc__


# -- an engine collected unclosed with failures nobody observed ---------------------------


async def _drop_with_failure(message: str, *, wait: bool) -> None:
    engine = ae.Engine(cpu_workers=1)
    v = engine.new_var("v")

    def fail(rctx: ae.RunContext) -> None:
        raise ValueError(message)

    op = engine.push_sync(fail, mutate_vars=[v])
    second = engine.push_sync(fail, mutate_vars=[engine.new_var("w")])
    with pytest.raises(ValueError):
        await op
    with pytest.raises(ValueError):
        await second
    if wait:
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()
    del op, second, v, engine


def _categories(record: list[warnings.WarningMessage]) -> list[type[Warning]]:
    return [w.category for w in record]


async def test_collected_unclosed_with_unobserved_failures_warns_once() -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        await _drop_with_failure("lost one", wait=False)
        gc.collect()
    assert _categories(record) == [RuntimeWarning]  # once, and not a ResourceWarning too
    message = str(record[0].message)
    assert "garbage collected without being closed" in message
    assert "losing 2 failure(s)" in message
    assert "the first: ValueError: lost one" in message


async def test_collected_unclosed_after_the_failures_were_raised_says_only_unclosed() -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        await _drop_with_failure("seen", wait=True)
        gc.collect()
    assert _categories(record) == [ResourceWarning]
    assert "without being closed" in str(record[0].message)


async def test_collected_unclosed_with_only_aborts_says_only_unclosed() -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        engine = ae.Engine(cpu_workers=1)
        op = push_aborting(engine, ae.Abort(), "sync", mutate=(engine.new_var(),))
        with pytest.raises(ae.Abort):
            await op
        del engine, op
        gc.collect()
    assert _categories(record) == [ResourceWarning]


async def test_closed_engine_with_failures_does_not_warn() -> None:
    engine = ae.Engine()
    push_aborting(engine, ValueError("raised by aclose"), "inline", mutate=(engine.new_var(),))
    with pytest.raises(ExceptionGroup):
        await engine.aclose()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del engine
        gc.collect()


def test_the_warning_is_shown_by_default_in_a_script() -> None:
    """Under Python's default filters (a RuntimeWarning is shown; a ResourceWarning is not)."""
    script = textwrap.dedent(
        """
        import asyncio, gc
        import aioengine as ae

        async def main():
            engine = ae.Engine()
            def fail(rctx):
                raise KeyError("nobody looked")
            engine.push_sync(fail, mutate_vars=[engine.new_var()], prop=ae.FnProperty.ASYNC)
            await asyncio.sleep(0.05)

        asyncio.run(main())
        gc.collect()
        print("end")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "end"
    assert done.stderr.count("RuntimeWarning") >= 1
    assert "losing 1 failure(s)" in done.stderr
    assert "KeyError: 'nobody looked'" in done.stderr
