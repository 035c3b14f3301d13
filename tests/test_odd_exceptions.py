"""Odd exceptions raised by an operation's function: GeneratorExit, KeyboardInterrupt,
SystemExit and StopIteration.

Whatever a function raises is its operation's failure, of every kind (sync on a worker or
inline, coroutine, callback-style, simulated GPU) and in both modes: recorded, its dependents
skipped, raised again by ``wait_for_all`` and ``aclose``. A ``KeyboardInterrupt`` or
``SystemExit`` raised on the event-loop thread also stops the loop, as asyncio does for a
task; nothing is ever printed about the engine's own tasks. See ``docs/guarantees.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable
from typing import Any

import pytest

import aioengine as ae
from aioengine import OpState

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is in the test group
    uvloop = None

LOOPS: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
if uvloop is not None:
    LOOPS.append(pytest.param(uvloop.new_event_loop, id="uvloop"))

# Every kind of operation, and whether its function runs on the loop thread (in threaded
# mode; serial mode runs every CPU kind there).
KINDS = {
    "sync": False,
    "sync-inline": True,
    "coroutine": True,
    "callback": False,
    "callback-inline": True,
    "gpu": False,  # a simulated GPU's worker thread
}


def push_raising(
    engine: ae.Engine, kind: str, make: Callable[[], BaseException], x: ae.Var
) -> ae.Operation[Any]:
    """Push an operation of ``kind`` whose function raises ``make()``, mutating ``x``."""
    prop = ae.FnProperty.ASYNC if kind.endswith("-inline") else ae.FnProperty.NORMAL

    def fn(rctx: ae.RunContext) -> None:
        raise make()

    async def afn(rctx: ae.RunContext) -> None:
        await asyncio.sleep(0)
        raise make()

    def cfn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
        raise make()

    if kind in ("sync", "sync-inline"):
        return engine.push_sync(fn, mutate_vars=[x], prop=prop)
    if kind == "coroutine":
        return engine.push_async(afn, mutate_vars=[x])
    if kind in ("callback", "callback-inline"):
        return engine.push_async(cfn, mutate_vars=[x], prop=prop)
    assert kind == "gpu"
    return engine.push_sync(fn, ae.gpu(0), mutate_vars=[x])


def run_failing_op(
    kind: str, serial: bool, make: Callable[[], BaseException], loop_factory: Any
) -> tuple[OpState, type[BaseException], bool, list[dict[str, Any]]]:
    """Run an operation of ``kind`` raising ``make()`` and a reader behind it, on a loop of
    ``loop_factory``; check that the reader is skipped and that ``aclose`` raises the failure.

    Returns the operation's state, its exception's type, whether it stopped the loop, and
    what the loop's exception handler was given, collected once the operation (and its task)
    have been garbage collected.
    """
    handled: list[dict[str, Any]] = []
    state, exc_type, stopped = _run_failing_op(kind, serial, make, loop_factory, handled)
    gc.collect()
    return state, exc_type, stopped, handled


def _run_failing_op(
    kind: str,
    serial: bool,
    make: Callable[[], BaseException],
    loop_factory: Any,
    handled: list[dict[str, Any]],
) -> tuple[OpState, type[BaseException], bool]:
    ops: list[ae.Operation[Any]] = []
    stopped: BaseException | None = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.get_loop().set_exception_handler(lambda loop, context: handled.append(context))
        backend = ae.SimulatedGPU() if kind == "gpu" else None
        engine = ae.Engine(serial=serial, cpu_workers=2, gpu_backend=backend)

        async def main() -> None:
            x, y = engine.new_var("x"), engine.new_var("y")
            ops.append(push_raising(engine, kind, make, x))
            ops.append(engine.push_sync(lambda r: "ran", const_vars=[x], mutate_vars=[y]))
            with contextlib.suppress(ae.DependencyError):
                await ops[1]

        try:
            runner.run(main())
        except (KeyboardInterrupt, SystemExit) as exc:
            stopped = exc

        async def close() -> None:
            async with asyncio.timeout(10):
                with pytest.raises(ae.DependencyError) as skipped:
                    await ops[1]
                assert skipped.value.__cause__ is ops[0].exception()
                with pytest.raises(BaseExceptionGroup) as group:
                    await engine.aclose()
            assert group.value.exceptions == (ops[0].exception(),)

        runner.run(close())
        assert engine.closed
    exc = ops[0].exception()
    assert exc is not None
    return ops[0].state, type(exc), stopped is exc


# KeyboardInterrupt on every loop; SystemExit takes the same paths (on asyncio's loop).
INTERRUPTS = [
    pytest.param(KeyboardInterrupt, loop.values[0], id=f"KeyboardInterrupt-{loop.id}")
    for loop in LOOPS
] + [pytest.param(SystemExit, asyncio.new_event_loop, id="SystemExit-asyncio")]


@pytest.mark.parametrize("serial", [False, True], ids=["threaded", "serial"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(("exc_type", "loop_factory"), INTERRUPTS)
def test_interrupt_or_exit_is_the_operations_failure(
    kind: str,
    serial: bool,
    exc_type: type[BaseException],
    loop_factory: Any,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Recorded as the failure (dependents skipped, aclose raises it); raised on the loop
    thread it stops the loop as well; no message about the engine's tasks either way."""
    state, exc, stopped, handled = run_failing_op(kind, serial, exc_type, loop_factory)
    assert state is ae.OpState.FAILED
    assert exc is exc_type
    assert stopped is (KINDS[kind] or (serial and kind != "gpu"))
    assert handled == []  # no "Task exception was never retrieved", nothing else either
    assert "never retrieved" not in capfd.readouterr().err


# The coroutine kind on every loop (its task is where GeneratorExit used to hang); the
# others take the loop's callbacks only to wake their awaiters.
GENERATOR_EXIT_CASES = [
    pytest.param(kind, loop.values[0], id=f"{kind}-{loop.id}")
    for kind in KINDS
    for loop in LOOPS
    if kind == "coroutine" or loop.id == "asyncio"
]


@pytest.mark.parametrize("serial", [False, True], ids=["threaded", "serial"])
@pytest.mark.parametrize(("kind", "loop_factory"), GENERATOR_EXIT_CASES)
def test_generator_exit_fails_the_operation(kind: str, serial: bool, loop_factory: Any) -> None:
    """GeneratorExit raised by the function is a failure like any other: the operation
    finishes (a coroutine operation used to stay RUNNING for ever) and nothing stops."""
    state, exc, stopped, handled = run_failing_op(kind, serial, GeneratorExit, loop_factory)
    assert state is ae.OpState.FAILED
    assert exc is GeneratorExit
    assert not stopped
    assert handled == []


class TestGeneratorExitWaits:
    """The waits of the issue's report return once a coroutine op raised GeneratorExit."""

    async def test_wait_for_var_wait_for_all_and_aclose(self, serial: bool) -> None:
        engine = ae.Engine(serial=serial)
        x = engine.new_var("x")

        async def fn(rctx: ae.RunContext) -> None:
            raise GeneratorExit

        op = engine.push_async(fn, mutate_vars=[x])
        async with asyncio.timeout(10):
            with pytest.raises(GeneratorExit):
                await op
            with pytest.raises(GeneratorExit):
                await engine.wait_for_var(x)
            engine.push_async(fn, mutate_vars=[x])
            with pytest.raises(BaseExceptionGroup) as group:
                await engine.wait_for_all()
            assert [type(e) for e in group.value.exceptions] == [GeneratorExit]
            engine.push_async(fn)
            with pytest.raises(BaseExceptionGroup):
                await engine.aclose()
        assert engine.closed


class TestStopIteration:
    """PEP 479 inside ``await``: ``op.exception()`` is the StopIteration itself, and ``await
    op`` raises ``RuntimeError('generator raised StopIteration')`` caused by it (a coroutine
    function's own StopIteration is already that RuntimeError, as Python makes it)."""

    @pytest.mark.parametrize("kind", ["sync", "sync-inline", "callback", "callback-inline"])
    async def test_await_raises_runtime_error_caused_by_it(
        self, engine: ae.Engine, kind: str
    ) -> None:
        x = engine.new_var("x")
        op = push_raising(engine, kind, StopIteration, x)
        with pytest.raises(RuntimeError, match=r"^generator raised StopIteration$") as info:
            await op
        original = op.exception()
        assert type(original) is StopIteration
        assert info.value.__cause__ is original
        with pytest.raises(StopIteration):
            op.result()
        with pytest.raises(ExceptionGroup) as group:  # recorded as the original
            await engine.wait_for_all()
        assert group.value.exceptions == (original,)

    async def test_a_coroutine_functions_stop_iteration(self, engine: ae.Engine) -> None:
        op = push_raising(engine, "coroutine", StopIteration, engine.new_var("x"))
        with pytest.raises(RuntimeError, match=r"^coroutine raised StopIteration$") as info:
            await op
        assert info.value is op.exception()
        assert type(info.value.__cause__) is StopIteration
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()
