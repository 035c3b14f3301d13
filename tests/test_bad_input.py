"""Bad input: every public call refuses it clearly, queues nothing, and leaves the engine usable.

Each case of ``ENGINE_CASES`` runs while one operation is pending (so "nothing was queued" is
checked against a non-empty engine) and asserts (a) the exception type and an anchored
message, (b) that ``engine.pending`` and every Var's queue are unchanged, and (c) that the
engine still runs an operation afterwards. Settings, contexts, a second event loop, huge Var
lists and re-entrant use (pushing and waiting from inside running operations) follow.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

import aioengine as ae

HAS_CUPY = importlib.util.find_spec("cupy") is not None


def noop(rctx: ae.RunContext) -> None:
    """A sync fn (its name, ``noop``, shows up in messages)."""


async def anoop(rctx: ae.RunContext) -> None:
    """A coroutine fn."""


def cbnoop(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
    """A callback-style fn."""
    on_complete()


@dataclass
class World:
    """An engine with a pending op, and every kind of object a bad call can name."""

    engine: ae.Engine
    a: ae.Var
    b: ae.Var
    busy: ae.Var  # held by the pending op
    gone: ae.Var  # deleted
    foreign: ae.Var  # a Var of another engine
    handle: ae.OprHandle[Any]  # live, mutates a
    dead_handle: ae.OprHandle[Any]  # deleted
    stale_handle: ae.OprHandle[Any]  # live, but its Var was deleted since
    foreign_handle: ae.OprHandle[Any]
    closed: ae.Engine  # closed engine
    closed_var: ae.Var  # a Var of the closed engine
    closed_handle: ae.OprHandle[Any]

    def snapshot(self) -> tuple[object, ...]:
        return (
            self.engine.pending,
            self.closed.pending,
            *(v.statistics() for v in (self.a, self.b, self.busy, self.gone)),
        )


@pytest.fixture
async def world(engine: ae.Engine) -> AsyncIterator[World]:
    foreign_engine = ae.Engine(serial=engine.serial)
    closed = ae.Engine(serial=engine.serial)
    a, b, busy = engine.new_var("a"), engine.new_var("b"), engine.new_var("busy")
    gone, doomed = engine.new_var("gone"), engine.new_var("doomed")
    dead_handle = engine.new_operator(noop, (), [b], name="h")
    engine.delete_operator(dead_handle)
    stale_handle = engine.new_operator(noop, [doomed], (), name="stale")
    await engine.delete_var(gone)
    await engine.delete_var(doomed)
    closed_var = closed.new_var("c")
    closed_handle = closed.new_operator(noop, (), [closed_var], name="ch")
    await closed.aclose()
    foreign = foreign_engine.new_var("foreign")
    w = World(
        engine=engine,
        a=a,
        b=b,
        busy=busy,
        gone=gone,
        foreign=foreign,
        handle=engine.new_operator(noop, (), [a], name="live"),
        dead_handle=dead_handle,
        stale_handle=stale_handle,
        foreign_handle=foreign_engine.new_operator(noop, (), [foreign], name="fh"),
        closed=closed,
        closed_var=closed_var,
        closed_handle=closed_handle,
    )
    try:
        yield w
    finally:
        await foreign_engine.aclose()


Call = Callable[[World], object]


def case(id: str, call: Call, exc: type[BaseException], match: str) -> Any:
    return pytest.param(call, exc, match, id=id)


CLOSED = r"^<aioengine\.Engine closed pending=0 .*> is closed; create a new Engine$"
NOT_VAR = r"^{arg}\[{i}\] is {obj}, not an aioengine\.Var$"
FOREIGN = r"^{arg}\[{i}\] <Var 'foreign' .*> belongs to another Engine$"
SINGLE = r"^{arg} must be a list of Vars, not a single Var; use \[a\]$"
GONE_PUSH = r"^<Var 'gone' deleted .*> was deleted; operation '{name}' cannot use it$"
NO_CUPY = (
    r"^cannot run on gpu\(0\): CuPy is not installed; install it with "
    r"'pip install aioengine\[gpu\]' .* or push to aioengine\.cpu\(\)$"
)
NOT_CALLABLE = r"^fn must be callable, got 42$"

ENGINE_CASES = [
    # -- push_sync ------------------------------------------------------------------------
    case("push_sync-fn-not-callable", lambda w: w.engine.push_sync(42), TypeError, NOT_CALLABLE),
    case(
        "push_sync-coroutine-fn",
        lambda w: w.engine.push_sync(anoop),
        TypeError,
        r"^anoop is a coroutine function; push it with push_async\(\)$",
    ),
    case(
        "push_sync-const-non-var-at-1",
        lambda w: w.engine.push_sync(noop, ae.cpu(), [w.a, "x"]),
        TypeError,
        NOT_VAR.format(arg="const_vars", i=1, obj="'x'"),
    ),
    case(
        "push_sync-mutate-non-var-at-2",
        lambda w: w.engine.push_sync(noop, ae.cpu(), (), [w.a, w.b, None]),
        TypeError,
        NOT_VAR.format(arg="mutate_vars", i=2, obj="None"),
    ),
    case(
        "push_sync-const-single-var",
        lambda w: w.engine.push_sync(noop, ae.cpu(), w.a),
        TypeError,
        SINGLE.format(arg="const_vars"),
    ),
    case(
        "push_sync-mutate-single-var",
        lambda w: w.engine.push_sync(noop, mutate_vars=w.a),
        TypeError,
        SINGLE.format(arg="mutate_vars"),
    ),
    case(
        "push_sync-const-str",
        lambda w: w.engine.push_sync(noop, const_vars="ab"),
        TypeError,
        r"^const_vars must be an iterable of aioengine\.Var, got 'ab'$",
    ),
    case(
        "push_sync-mutate-int",
        lambda w: w.engine.push_sync(noop, mutate_vars=3),
        TypeError,
        r"^mutate_vars must be an iterable of aioengine\.Var, got 3$",
    ),
    case(
        "push_sync-const-generator-non-var",
        lambda w: w.engine.push_sync(noop, const_vars=(v for v in (w.a, w.b, 1.5))),
        TypeError,
        NOT_VAR.format(arg="const_vars", i=2, obj=r"1\.5"),
    ),
    case(
        "push_sync-const-foreign-var",
        lambda w: w.engine.push_sync(noop, const_vars=[w.foreign]),
        ValueError,
        FOREIGN.format(arg="const_vars", i=0),
    ),
    case(
        "push_sync-mutate-foreign-var-at-1",
        lambda w: w.engine.push_sync(noop, mutate_vars=[w.a, w.foreign]),
        ValueError,
        FOREIGN.format(arg="mutate_vars", i=1),
    ),
    case(
        "push_sync-ctx-str",
        lambda w: w.engine.push_sync(noop, "cpu", [w.a]),
        TypeError,
        r"^ctx must be an aioengine\.Context \(cpu\(i\) or gpu\(i\)\), got 'cpu'$",
    ),
    case(
        "push_sync-ctx-none",
        lambda w: w.engine.push_sync(noop, None, [w.a]),
        TypeError,
        r"^ctx must be an aioengine\.Context \(cpu\(i\) or gpu\(i\)\), got None$",
    ),
    case(
        "push_sync-prop-int",
        lambda w: w.engine.push_sync(noop, mutate_vars=[w.a], prop=7),
        TypeError,
        r"^prop must be an aioengine\.FnProperty, got 7$",
    ),
    case(
        "push_sync-prop-str",
        lambda w: w.engine.push_sync(noop, mutate_vars=[w.a], prop="NO_SKIP"),
        TypeError,
        r"^prop must be an aioengine\.FnProperty, got 'NO_SKIP'$",
    ),
    case(
        "push_sync-priority-float",
        lambda w: w.engine.push_sync(noop, mutate_vars=[w.a], priority=1.5),
        TypeError,
        r"^priority must be an int, got 1\.5 \(float\)$",
    ),
    case(
        "push_sync-priority-str",
        lambda w: w.engine.push_sync(noop, mutate_vars=[w.a], priority="high"),
        TypeError,
        r"^priority must be an int, got 'high' \(str\)$",
    ),
    case(
        "push_sync-priority-none",
        lambda w: w.engine.push_sync(noop, mutate_vars=[w.a], priority=None),
        TypeError,
        r"^priority must be an int, got None \(NoneType\)$",
    ),
    case(
        "push_sync-name-int",
        lambda w: w.engine.push_sync(noop, mutate_vars=[w.a], name=3),
        TypeError,
        r"^name must be a str or None, got 3$",
    ),
    case(
        "push_sync-deleted-var",
        lambda w: w.engine.push_sync(noop, ae.cpu(), [w.a, w.gone]),
        ae.VarDeletedError,
        GONE_PUSH.format(name="noop"),
    ),
    case(
        "push_sync-closed-engine",
        lambda w: w.closed.push_sync(noop, mutate_vars=[w.closed_var]),
        ae.EngineClosedError,
        CLOSED,
    ),
    pytest.param(
        lambda w: w.engine.push_sync(noop, ae.gpu(0), [w.a]),
        ae.DeviceUnavailableError,
        NO_CUPY,
        id="push_sync-gpu-without-cupy",
        marks=pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed"),
    ),
    # -- push_async -----------------------------------------------------------------------
    case("push_async-fn-not-callable", lambda w: w.engine.push_async(42), TypeError, NOT_CALLABLE),
    case(
        "push_async-const-non-var-at-1",
        lambda w: w.engine.push_async(anoop, ae.cpu(), [w.a, object]),
        TypeError,
        NOT_VAR.format(arg="const_vars", i=1, obj="<class 'object'>"),
    ),
    case(
        "push_async-mutate-single-var",
        lambda w: w.engine.push_async(cbnoop, mutate_vars=w.a),
        TypeError,
        SINGLE.format(arg="mutate_vars"),
    ),
    case(
        "push_async-mutate-foreign-var",
        lambda w: w.engine.push_async(anoop, mutate_vars=[w.foreign]),
        ValueError,
        FOREIGN.format(arg="mutate_vars", i=0),
    ),
    case(
        "push_async-ctx-int",
        lambda w: w.engine.push_async(anoop, 0, [w.a]),
        TypeError,
        r"^ctx must be an aioengine\.Context \(cpu\(i\) or gpu\(i\)\), got 0$",
    ),
    case(
        "push_async-prop-none",
        lambda w: w.engine.push_async(cbnoop, prop=None),
        TypeError,
        r"^prop must be an aioengine\.FnProperty, got None$",
    ),
    case(
        "push_async-priority-float",
        lambda w: w.engine.push_async(anoop, priority=0.0),
        TypeError,
        r"^priority must be an int, got 0\.0 \(float\)$",
    ),
    case(
        "push_async-name-bytes",
        lambda w: w.engine.push_async(anoop, name=b"x"),
        TypeError,
        r"^name must be a str or None, got b'x'$",
    ),
    case(
        "push_async-deleted-var",
        lambda w: w.engine.push_async(anoop, mutate_vars=[w.a, w.gone]),
        ae.VarDeletedError,
        GONE_PUSH.format(name="anoop"),
    ),
    case(
        "push_async-closed-engine",
        lambda w: w.closed.push_async(anoop, const_vars=[w.closed_var]),
        ae.EngineClosedError,
        CLOSED,
    ),
    pytest.param(
        lambda w: w.engine.push_async(anoop, ae.gpu(0), [w.a]),
        ae.DeviceUnavailableError,
        NO_CUPY,
        id="push_async-coroutine-gpu-without-cupy",
        marks=pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed"),
    ),
    pytest.param(
        lambda w: w.engine.push_async(cbnoop, ae.gpu(0), [w.a]),
        ae.DeviceUnavailableError,
        NO_CUPY,
        id="push_async-callback-gpu-without-cupy",
        marks=pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed"),
    ),
    # -- new_operator / push / delete_operator --------------------------------------------
    case(
        "new_operator-fn-not-callable",
        lambda w: w.engine.new_operator(42),
        TypeError,
        NOT_CALLABLE,
    ),
    case(
        "new_operator-coroutine-with-is_async-false",
        lambda w: w.engine.new_operator(anoop, is_async=False),
        TypeError,
        r"^anoop is a coroutine function but is_async=False; pass is_async=None or True$",
    ),
    case(
        "new_operator-is_async-str",
        lambda w: w.engine.new_operator(noop, is_async="yes"),
        TypeError,
        r"^is_async must be True, False or None, got 'yes'$",
    ),
    case(
        "new_operator-const-non-var-at-0",
        lambda w: w.engine.new_operator(noop, ["a"]),
        TypeError,
        NOT_VAR.format(arg="const_vars", i=0, obj="'a'"),
    ),
    case(
        "new_operator-mutate-single-var",
        lambda w: w.engine.new_operator(noop, (), w.a),
        TypeError,
        SINGLE.format(arg="mutate_vars"),
    ),
    case(
        "new_operator-foreign-var",
        lambda w: w.engine.new_operator(noop, (), [w.foreign]),
        ValueError,
        FOREIGN.format(arg="mutate_vars", i=0),
    ),
    case(
        "new_operator-deleted-var",
        lambda w: w.engine.new_operator(noop, [w.gone]),
        ae.VarDeletedError,
        r"^<Var 'gone' deleted .*> was deleted; create a new Var$",
    ),
    case(
        "new_operator-prop-str",
        lambda w: w.engine.new_operator(noop, prop="ASYNC"),
        TypeError,
        r"^prop must be an aioengine\.FnProperty, got 'ASYNC'$",
    ),
    case(
        "new_operator-name-int",
        lambda w: w.engine.new_operator(noop, name=1),
        TypeError,
        r"^name must be a str or None, got 1$",
    ),
    case(
        "new_operator-closed-engine",
        lambda w: w.closed.new_operator(noop),
        ae.EngineClosedError,
        CLOSED,
    ),
    case(
        "push-not-a-handle",
        lambda w: w.engine.push(noop),
        TypeError,
        r"^handle must be an aioengine\.OprHandle, got <function noop at .*>$",
    ),
    case(
        "push-foreign-handle",
        lambda w: w.engine.push(w.foreign_handle),
        ValueError,
        r"^<OprHandle 'fh' reads=0 writes=1> belongs to another Engine$",
    ),
    case(
        "push-deleted-handle",
        lambda w: w.engine.push(w.dead_handle),
        ae.OperatorDeletedError,
        r"^<OprHandle 'h' deleted reads=0 writes=1> was deleted; build a new one$",
    ),
    case(
        "push-handle-with-deleted-var",
        lambda w: w.engine.push(w.stale_handle),
        ae.VarDeletedError,
        r"^<Var 'doomed' deleted .*> was deleted; operation 'stale' cannot use it$",
    ),
    case(
        "push-handle-ctx-str",
        lambda w: w.engine.push(w.handle, "cpu"),
        TypeError,
        r"^ctx must be an aioengine\.Context \(cpu\(i\) or gpu\(i\)\), got 'cpu'$",
    ),
    case(
        "push-handle-priority-str",
        lambda w: w.engine.push(w.handle, priority="1"),
        TypeError,
        r"^priority must be an int, got '1' \(str\)$",
    ),
    case(
        "push-handle-closed-engine",
        lambda w: w.closed.push(w.closed_handle),
        ae.EngineClosedError,
        CLOSED,
    ),
    pytest.param(
        lambda w: w.engine.push(w.handle, ae.gpu(0)),
        ae.DeviceUnavailableError,
        NO_CUPY,
        id="push-handle-gpu-without-cupy",
        marks=pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed"),
    ),
    case(
        "delete_operator-not-a-handle",
        lambda w: w.engine.delete_operator("h"),
        TypeError,
        r"^handle must be an aioengine\.OprHandle, got 'h'$",
    ),
    case(
        "delete_operator-foreign-handle",
        lambda w: w.engine.delete_operator(w.foreign_handle),
        ValueError,
        r"^<OprHandle 'fh' reads=0 writes=1> belongs to another Engine$",
    ),
    case(
        "delete_operator-twice",
        lambda w: w.engine.delete_operator(w.dead_handle),
        ae.OperatorDeletedError,
        r"^<OprHandle 'h' deleted reads=0 writes=1> was already deleted$",
    ),
    # -- delete_var -----------------------------------------------------------------------
    case(
        "delete_var-not-a-var",
        lambda w: w.engine.delete_var("a"),
        TypeError,
        r"^var must be an aioengine\.Var, got 'a'$",
    ),
    case(
        "delete_var-foreign-var",
        lambda w: w.engine.delete_var(w.foreign),
        ValueError,
        r"^.*<Var 'foreign' .*> belongs to another Engine$",
    ),
    case(
        "delete_var-twice",
        lambda w: w.engine.delete_var(w.gone),
        ae.VarDeletedError,
        GONE_PUSH.format(name=r"delete_var\(gone\)"),
    ),
    case(
        "delete_var-delete_fn-not-callable",
        lambda w: w.engine.delete_var(w.a, 42),
        TypeError,
        r"^delete_fn must be callable or None, got 42$",
    ),
    case(
        "delete_var-delete_fn-coroutine",
        lambda w: w.engine.delete_var(w.a, anoop),
        TypeError,
        r"^delete_fn must be a plain function, not a coroutine function$",
    ),
    case(
        "delete_var-ctx-str",
        lambda w: w.engine.delete_var(w.a, None, "cpu"),
        TypeError,
        r"^ctx must be an aioengine\.Context \(cpu\(i\) or gpu\(i\)\), got 'cpu'$",
    ),
    case(
        "delete_var-closed-engine",
        lambda w: w.closed.delete_var(w.closed_var),
        ae.EngineClosedError,
        CLOSED,
    ),
    pytest.param(
        lambda w: w.engine.delete_var(w.a, None, ae.gpu(0)),
        ae.DeviceUnavailableError,
        NO_CUPY,
        id="delete_var-gpu-without-cupy",
        marks=pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed"),
    ),
    # -- new_var and the waits ------------------------------------------------------------
    case(
        "new_var-name-int",
        lambda w: w.engine.new_var(3),
        TypeError,
        r"^name must be a str or None, got 3$",
    ),
    case(
        "wait_for_var-not-a-var",
        lambda w: w.engine.wait_for_var("a"),
        TypeError,
        r"^var must be an aioengine\.Var, got 'a'$",
    ),
    case(
        "wait_for_var-var-list",
        lambda w: w.engine.wait_for_var([w.a]),
        TypeError,
        r"^var must be an aioengine\.Var, got \[<Var 'a' .*>\]$",
    ),
    case(
        "wait_for_var-foreign-var",
        lambda w: w.engine.wait_for_var(w.foreign),
        ValueError,
        r"^<Var 'foreign' .*> belongs to another Engine$",
    ),
    case(
        "wait_for_var-deleted-var",
        lambda w: w.engine.wait_for_var(w.gone),
        ae.VarDeletedError,
        r"^<Var 'gone' deleted .*> was deleted; nothing to wait for$",
    ),
    case(
        "wait_for_var-closed-engine",
        lambda w: w.closed.wait_for_var(w.closed_var),
        ae.EngineClosedError,
        CLOSED,
    ),
    case(
        "wait_for_all-closed-engine",
        lambda w: w.closed.wait_for_all(),
        ae.EngineClosedError,
        CLOSED,
    ),
    case(
        "wait_for_var-str-timeout",
        lambda w: w.engine.wait_for_var(w.b, timeout="1"),  # b is idle: it would return
        TypeError,
        r"^timeout must be a number of seconds or None, got '1' \(str\)$",
    ),
    case(
        "wait_for_all-str-timeout",
        lambda w: w.engine.wait_for_all(timeout="1"),
        TypeError,
        r"^timeout must be a number of seconds or None, got '1' \(str\)$",
    ),
    case(
        "wait_for_all-nan-timeout",
        lambda w: w.engine.wait_for_all(timeout=float("nan")),
        ValueError,
        r"^timeout must be a number of seconds or None, got nan$",
    ),
    case(
        "aclose-bool-timeout",
        lambda w: w.engine.aclose(timeout=True),
        TypeError,
        r"^timeout must be a number of seconds or None, got True \(bool\)$",
    ),
]


async def call(fn: Call, w: World) -> object:
    """Make the call; await it if it returned an awaitable (the waits are coroutines)."""
    result = fn(w)
    if inspect.isawaitable(result):
        return await result
    return result


async def assert_still_works(w: World) -> None:
    version = w.a.version
    op = w.engine.push_sync(lambda rctx: "ok", ae.cpu(), [w.b], [w.a], name="after")
    assert await op == "ok"
    assert w.a.version == version + 1
    assert await w.engine.wait_for_all() is None


class TestBadArguments:
    @pytest.mark.parametrize(("fn", "exc", "match"), ENGINE_CASES)
    async def test_refused_nothing_queued_engine_usable(
        self, world: World, fn: Call, exc: type[BaseException], match: str
    ) -> None:
        gate = asyncio.Event()

        async def hold(rctx: ae.RunContext) -> str:
            await gate.wait()
            return "held"

        pending = world.engine.push_async(hold, ae.cpu(), [world.a], [world.busy], name="hold")
        before = world.snapshot()
        assert before[0] == 1
        with pytest.raises(exc, match=match) as info:
            await call(fn, world)
        assert type(info.value) is exc
        assert world.snapshot() == before
        gate.set()
        assert await pending == "held"
        await assert_still_works(world)

    async def test_push_while_closing_is_refused(self, engine: ae.Engine) -> None:
        """Pushes raise as soon as aclose() starts; what was pending still runs."""
        v = engine.new_var("v")
        gate = asyncio.Event()

        async def hold(rctx: ae.RunContext) -> str:
            await gate.wait()
            return "held"

        held = engine.push_async(hold, mutate_vars=[v])
        started = asyncio.Event()

        async def close() -> None:
            started.set()  # aclose() then runs up to its first suspension: the engine closes
            await engine.aclose()

        closing = asyncio.ensure_future(close())
        await started.wait()
        before = (engine.pending, v.statistics())
        with pytest.raises(
            ae.EngineClosedError,
            match=r"^<aioengine\.Engine closing pending=1 .*> is closing; create a new Engine$",
        ):
            engine.push_sync(noop, mutate_vars=[v])
        with pytest.raises(ae.EngineClosedError, match=r"is closing; create a new Engine$"):
            engine.new_operator(noop)
        assert (engine.pending, v.statistics()) == before
        gate.set()
        await closing
        assert held.result() == "held"
        assert engine.closed
        with pytest.raises(ae.EngineClosedError, match=CLOSED):
            async with engine:
                pass

    async def test_every_engine_error_is_an_engine_error(self) -> None:
        for exc in (
            ae.EngineClosedError,
            ae.DependencyError,
            ae.VarDeletedError,
            ae.OperatorDeletedError,
            ae.DeviceUnavailableError,
        ):
            assert issubclass(exc, ae.EngineError)
            assert issubclass(exc, Exception)


class TestEngineSettings:
    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            pytest.param({"cpu_workers": 0}, r"^cpu_workers must be >= 1, got 0$", id="workers-0"),
            pytest.param(
                {"cpu_workers": -2}, r"^cpu_workers must be >= 1, got -2$", id="workers-negative"
            ),
            pytest.param(
                {"cpu_workers": "2"},
                r"^cpu_workers must be an int >= 1 or None, got '2' \(str\)$",
                id="workers-str",
            ),
            pytest.param(
                {"cpu_workers": 2.0},
                r"^cpu_workers must be an int >= 1 or None, got 2\.0 \(float\)$",
                id="workers-float",
            ),
            pytest.param(
                {"cpu_priority_workers": 0},
                r"^cpu_priority_workers must be >= 1, got 0$",
                id="priority-workers-0",
            ),
            pytest.param(
                {"cpu_priority_workers": "four"},
                r"^cpu_priority_workers must be an int >= 1 or None, got 'four' \(str\)$",
                id="priority-workers-str",
            ),
            pytest.param(
                {"serial": "yes"},
                r"^serial must be True, False or None, got 'yes'$",
                id="serial-str",
            ),
            pytest.param(
                {"serial": 1}, r"^serial must be True, False or None, got 1$", id="serial-int"
            ),
        ],
    )
    def test_bad_argument_names_it(self, kwargs: dict[str, object], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            ae.Engine(**kwargs)  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        ("env", "value", "match"),
        [
            pytest.param(
                "AIOENGINE_CPU_WORKERS",
                "abc",
                r"^environment variable AIOENGINE_CPU_WORKERS='abc' is not an integer; "
                r"set it to a whole number >= 1 or unset it$",
                id="workers-not-int",
            ),
            pytest.param(
                "AIOENGINE_CPU_WORKERS",
                "0",
                r"^environment variable AIOENGINE_CPU_WORKERS='0' must be >= 1$",
                id="workers-0",
            ),
            pytest.param(
                "AIOENGINE_CPU_WORKERS",
                "1.5",
                r"^environment variable AIOENGINE_CPU_WORKERS='1\.5' is not an integer",
                id="workers-float",
            ),
            pytest.param(
                "AIOENGINE_CPU_PRIORITY_WORKERS",
                "-1",
                r"^environment variable AIOENGINE_CPU_PRIORITY_WORKERS='-1' must be >= 1$",
                id="priority-workers-negative",
            ),
            pytest.param(
                "AIOENGINE_CPU_PRIORITY_WORKERS",
                "many",
                r"^environment variable AIOENGINE_CPU_PRIORITY_WORKERS='many' is not an integer",
                id="priority-workers-not-int",
            ),
            pytest.param(
                "AIOENGINE_SERIAL",
                "maybe",
                r"^environment variable AIOENGINE_SERIAL='maybe' is not a boolean; "
                r"use 1 or 0 \(or unset it\)$",
                id="serial-not-bool",
            ),
        ],
    )
    def test_bad_environment_variable_names_it(
        self, monkeypatch: pytest.MonkeyPatch, env: str, value: str, match: str
    ) -> None:
        monkeypatch.setenv(env, value)
        with pytest.raises(ValueError, match=match):
            ae.Engine()

    def test_environment_is_read_and_arguments_win(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AIOENGINE_CPU_WORKERS", "3")
        monkeypatch.setenv("AIOENGINE_CPU_PRIORITY_WORKERS", "2")
        monkeypatch.setenv("AIOENGINE_SERIAL", "1")
        engine = ae.Engine()
        assert (engine.cpu_workers, engine.cpu_priority_workers, engine.serial) == (3, 2, True)
        engine = ae.Engine(cpu_workers=5, cpu_priority_workers=1, serial=False)
        assert (engine.cpu_workers, engine.cpu_priority_workers, engine.serial) == (5, 1, False)
        # An explicit argument means the (bad) variable is never read.
        monkeypatch.setenv("AIOENGINE_CPU_WORKERS", "abc")
        monkeypatch.setenv("AIOENGINE_SERIAL", "maybe")
        assert ae.Engine(cpu_workers=2, serial=True).cpu_workers == 2


class TestContext:
    @pytest.mark.parametrize(
        ("make", "exc", "match"),
        [
            pytest.param(
                lambda: ae.Context(ae.DeviceType.CPU, -1),
                ValueError,
                r"^device_id must be >= 0, got -1$",
                id="negative-id",
            ),
            pytest.param(
                lambda: ae.cpu(-3), ValueError, r"^device_id must be >= 0, got -3$", id="cpu(-3)"
            ),
            pytest.param(
                lambda: ae.gpu(-1), ValueError, r"^device_id must be >= 0, got -1$", id="gpu(-1)"
            ),
            pytest.param(
                lambda: ae.Context(ae.DeviceType.CPU, 1.0),
                TypeError,
                r"^device_id is 1\.0, not an int$",
                id="float-id",
            ),
            pytest.param(
                lambda: ae.cpu("0"), TypeError, r"^device_id is '0', not an int$", id="str-id"
            ),
            pytest.param(
                lambda: ae.Context(ae.DeviceType.GPU, True),
                TypeError,
                r"^device_id is True, not an int$",
                id="bool-id",
            ),
            pytest.param(
                lambda: ae.Context("cpu", 0),
                TypeError,
                r"^device_type is 'cpu', not an aioengine\.DeviceType; "
                r"use aioengine\.cpu\(i\) or aioengine\.gpu\(i\)$",
                id="str-device-type",
            ),
        ],
    )
    def test_bad_context(
        self, make: Callable[[], object], exc: type[Exception], match: str
    ) -> None:
        with pytest.raises(exc, match=match):
            make()

    def test_a_failed_call_is_not_cached(self) -> None:
        with pytest.raises(ValueError, match=r"^device_id must be >= 0"):
            ae.cpu(-1)
        assert ae.cpu(1) == ae.Context(ae.DeviceType.CPU, 1)
        assert ae.cpu(1) is ae.cpu(1)


class TestSecondLoop:
    """An engine serves the loop it was first used on; any other loop gets RuntimeError."""

    @pytest.mark.parametrize(
        "use",
        [
            pytest.param(lambda e, v, op: e.push_sync(noop, mutate_vars=[v]), id="push_sync"),
            pytest.param(lambda e, v, op: e.push_async(anoop, mutate_vars=[v]), id="push_async"),
            pytest.param(lambda e, v, op: e.push_async(cbnoop, const_vars=[v]), id="callback"),
            pytest.param(lambda e, v, op: e.wait_for_var(v), id="wait_for_var"),
            pytest.param(lambda e, v, op: e.wait_for_all(), id="wait_for_all"),
            pytest.param(lambda e, v, op: e.aclose(), id="aclose"),
            pytest.param(lambda e, v, op: op, id="await-operation"),
        ],
    )
    async def test_use_from_another_loop_raises(
        self, engine: ae.Engine, use: Callable[[ae.Engine, ae.Var, ae.Operation[Any]], object]
    ) -> None:
        v = engine.new_var("v")
        done = engine.push_sync(lambda rctx: "first", mutate_vars=[v])
        assert await done == "first"
        gate = asyncio.Event()

        async def hold(rctx: ae.RunContext) -> str:
            await gate.wait()
            return "held"

        held = engine.push_async(hold, mutate_vars=[v])

        async def elsewhere() -> None:
            result = use(engine, v, held)
            if inspect.isawaitable(result):
                await result

        with pytest.raises(RuntimeError, match=r"^<aioengine\.Engine open .*> is bound to another"):
            await asyncio.to_thread(asyncio.run, elsewhere())
        assert engine.pending == 1
        assert v.statistics().waiting == 0
        gate.set()
        assert await held == "held"
        assert v.version == 2
        assert await engine.push_sync(lambda rctx: "ok", mutate_vars=[v]) == "ok"
        assert await engine.wait_for_all() is None


class TestHugeVarLists:
    async def test_ten_thousand_vars(self, engine: ae.Engine) -> None:
        reads = [engine.new_var(f"r{i}") for i in range(10_000)]
        writes = [engine.new_var(f"w{i}") for i in range(10_000)]
        seen: list[int] = []
        first = engine.push_sync(lambda rctx: "wrote", ae.cpu(), reads, writes)
        # As generators, with every Var twice, and the written ones also in the reads.
        second = engine.push_sync(
            lambda rctx: seen.append(1),
            ae.cpu(),
            (v for v in reads + writes + reads),
            (v for v in reads + reads),
        )
        third = engine.push_sync(lambda rctx: "read", ae.cpu(), writes + reads, ())
        assert await first == "wrote"
        assert await second is None
        assert await third == "read"
        assert seen == [1]
        assert {v.version for v in writes} == {1}
        assert {v.version for v in reads} == {1}
        assert await engine.wait_for_all() is None
        for v in (*reads[:100], *writes[:100]):
            v._check_invariants()

    async def test_ten_thousand_duplicates_of_one_var(self, engine: ae.Engine) -> None:
        v = engine.new_var("v")
        op = engine.push_sync(lambda rctx: "ok", ae.cpu(), [v] * 10_000, [v] * 10_000)
        assert await op == "ok"
        assert v.version == 1


class TestOnCompleteMisuse:
    async def test_second_call_raises_and_first_wins(self, engine: ae.Engine) -> None:
        errors: list[BaseException] = []

        returned = threading.Event()  # fn may still run after the op completed

        def fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            on_complete()
            try:
                on_complete(ValueError("late"))
            except RuntimeError as exc:
                errors.append(exc)
            returned.set()

        v = engine.new_var("v")
        op = engine.push_async(fn, mutate_vars=[v], name="twice")
        assert await op is None
        await asyncio.to_thread(returned.wait)
        assert [str(e) for e in errors] == ["on_complete() for 'twice' was already called"]
        assert await engine.wait_for_all() is None
        assert v.version == 1

    async def test_second_call_from_another_thread_raises(self, engine: ae.Engine) -> None:
        errors: list[BaseException] = []

        def fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            def complete_twice() -> None:
                on_complete()
                try:
                    on_complete()
                except RuntimeError as exc:
                    errors.append(exc)

            thread = threading.Thread(target=complete_twice)
            threads.append(thread)
            thread.start()

        threads: list[threading.Thread] = []
        op = engine.push_async(fn, name="threaded")
        assert await op is None
        await asyncio.to_thread(threads[0].join)
        assert [str(e) for e in errors] == ["on_complete() for 'threaded' was already called"]
        assert await engine.wait_for_all() is None

    async def test_a_call_after_the_function_raised_says_so(self, engine: ae.Engine) -> None:
        """The function raised before calling on_complete: the operation failed with that
        exception, and a late call (a timer it had started, say) is told why it is refused."""
        tokens: list[ae.OnComplete] = []

        def fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            tokens.append(on_complete)
            raise ValueError("setup failed")

        op = engine.push_async(fn, name="raiser")
        with pytest.raises(ValueError, match="setup failed"):
            await op
        with pytest.raises(
            RuntimeError,
            match=r"^on_complete\(\) for 'raiser' came after its function raised "
            r"ValueError: setup failed: the operation failed with that exception$",
        ):
            tokens[0]()
        assert "raised" in repr(tokens[0])
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()

    async def test_non_exception_argument_is_refused(self, engine: ae.Engine) -> None:
        errors: list[str] = []

        def fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            try:
                on_complete("boom")  # type: ignore[arg-type]
            except TypeError as exc:
                errors.append(str(exc))
            on_complete()

        assert await engine.push_async(fn) is None
        assert errors == ["on_complete() takes an exception or None, not 'boom'"]


class TestReentrancy:
    """Pushing and waiting from inside running operations: it works and nothing is lost."""

    async def test_push_from_a_running_sync_op(self, engine: ae.Engine) -> None:
        a, b = engine.new_var("a"), engine.new_var("b")
        trace: list[str] = []

        def inner(rctx: ae.RunContext) -> str:
            trace.append("inner")
            return "inner"

        def outer(rctx: ae.RunContext) -> tuple[ae.Operation[str], ae.Operation[str]]:
            trace.append("outer:start")
            held = engine.push_sync(inner, mutate_vars=[a])  # waits for outer, which holds a
            free = engine.push_sync(lambda rctx: "free", const_vars=[b])
            trace.append("outer:end")
            return held, free

        held, free = await engine.push_sync(outer, mutate_vars=[a])
        assert await held == "inner"
        assert await free == "free"
        assert trace == ["outer:start", "outer:end", "inner"]
        assert (a.version, b.version) == (2, 0)
        assert await engine.wait_for_all() is None
        assert engine.pending == 0

    async def test_push_from_a_running_coroutine_op(self, engine: ae.Engine) -> None:
        a, b = engine.new_var("a"), engine.new_var("b")
        trace: list[str] = []

        async def inner(rctx: ae.RunContext) -> str:
            trace.append("inner")
            return "inner"

        async def outer(rctx: ae.RunContext) -> tuple[ae.Operation[str], ae.Operation[None]]:
            trace.append("outer:start")
            held = engine.push_async(inner, mutate_vars=[a])
            free = engine.push_async(cbnoop, mutate_vars=[b])
            await asyncio.sleep(0)
            trace.append("outer:end")
            return held, free

        held, free = await engine.push_async(outer, mutate_vars=[a])
        assert await held == "inner"
        assert await free is None
        assert trace == ["outer:start", "outer:end", "inner"]
        assert (a.version, b.version) == (2, 1)
        assert await engine.wait_for_all() is None

    async def test_coroutine_op_awaits_an_op_it_pushed_on_other_vars(
        self, threaded_engine: ae.Engine
    ) -> None:
        """Threaded only: in serial mode an op pushed later cannot run before this one ends."""
        engine = threaded_engine
        a, b = engine.new_var("a"), engine.new_var("b")

        async def outer(rctx: ae.RunContext) -> str:
            inner = engine.push_sync(lambda rctx: "inner", mutate_vars=[b])
            return f"outer saw {await inner}"

        assert await engine.push_async(outer, mutate_vars=[a]) == "outer saw inner"
        assert (a.version, b.version) == (1, 1)
        assert await engine.wait_for_all() is None

    async def test_wait_for_var_inside_a_coroutine_op(self, engine: ae.Engine) -> None:
        a, b = engine.new_var("a"), engine.new_var("b")
        trace: list[str] = []
        gate = asyncio.Event()
        waiting = asyncio.Event()

        async def writer(rctx: ae.RunContext) -> None:
            trace.append("writer:start")
            await gate.wait()
            trace.append("writer:end")

        async def waiter(rctx: ae.RunContext) -> str:
            trace.append("waiter:start")
            waiting.set()
            await engine.wait_for_var(b)  # b is not held by this op
            trace.append("waiter:waited")
            return "waited"

        w = engine.push_async(writer, mutate_vars=[b])
        op = engine.push_async(waiter, mutate_vars=[a])
        if not engine.serial:  # threaded: the waiter runs while the writer of b still runs
            await waiting.wait()
        gate.set()
        assert await op == "waited"
        assert w.done()
        if engine.serial:
            assert trace == ["writer:start", "writer:end", "waiter:start", "waiter:waited"]
        else:
            assert trace == ["writer:start", "waiter:start", "writer:end", "waiter:waited"]
        assert await engine.wait_for_all() is None
        assert engine.pending == 0

    async def test_wait_for_var_inside_an_op_throws_the_failure_once(
        self, engine: ae.Engine
    ) -> None:
        a, b = engine.new_var("a"), engine.new_var("b")
        boom = ValueError("boom")

        def fail(rctx: ae.RunContext) -> None:
            raise boom

        failed = engine.push_sync(fail, mutate_vars=[b])

        async def waiter(rctx: ae.RunContext) -> BaseException | None:
            try:
                await engine.wait_for_var(b)
            except ValueError as exc:
                return exc
            return None

        assert await engine.push_async(waiter, mutate_vars=[a]) is boom
        assert failed.exception() is boom
        assert await engine.wait_for_all() is None  # already thrown by the inner wait

    async def test_wait_for_all_inside_an_op_is_refused(self, threaded_engine: ae.Engine) -> None:
        """wait_for_all returns when *no* op is pending, the caller included, so inside an op
        it could never return: it raises at once and the engine stays intact."""
        engine = threaded_engine
        a, b = engine.new_var("a"), engine.new_var("b")
        other = engine.push_sync(lambda rctx: "other", mutate_vars=[b])

        async def waiter(rctx: ae.RunContext) -> str:
            with pytest.raises(RuntimeError, match="inside operation 'waiter' would wait for"):
                await engine.wait_for_all()
            return "refused"

        assert await engine.push_async(waiter, mutate_vars=[a], name="waiter") == "refused"
        assert await other == "other"
        assert await engine.wait_for_all() is None
        assert engine.pending == 0
        assert (a.version, b.version) == (1, 1)


def test_a_context_pickled_in_another_process_hashes_as_ours() -> None:
    """The hash of a str differs between processes: an unpickled Context must not keep the
    sender's, or it would be equal to ours and still miss in a dict."""
    code = "import pickle, sys, aioengine as ae; sys.stdout.buffer.write(pickle.dumps(ae.gpu(1)))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # surely not this process's seed
    sent = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, check=True)
    ctx = pickle.loads(sent.stdout)
    assert ctx == ae.gpu(1)
    assert hash(ctx) == hash(ae.gpu(1))
    assert {ae.gpu(1): "found"}.get(ctx) == "found"
