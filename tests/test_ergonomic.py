"""The ergonomic layer: submit(), @engine.op and Vars that carry values."""

from __future__ import annotations

import asyncio
import functools
import operator
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import aioengine as ae


async def test_submit_passes_ordinary_arguments(engine: ae.Engine) -> None:
    assert await engine.submit(pow, 2, 10) == 1024
    assert await engine.submit(sorted, [3, 1, 2], reverse=True) == [3, 2, 1]


async def test_var_arguments_are_passed_by_value_and_read(engine: ae.Engine) -> None:
    a = engine.new_var("a", value=np.arange(4.0))
    assert a.has_value
    assert not engine.new_var("b").has_value
    total = await engine.submit(np.sum, a)
    assert total == 6.0
    assert await engine.submit(lambda x, scale: x * scale, a, scale=a) is not None


async def test_writes_mutate_values_in_place_in_push_order(engine: ae.Engine) -> None:
    w = engine.new_var("w", value=np.zeros(3))
    g = engine.new_var("g", value=np.ones(3))
    seen: list[float] = []

    @engine.op(mutate_vars=[w])
    def step(w: np.ndarray, g: np.ndarray, lr: float = 1.0) -> None:
        w -= lr * g

    def observe(w: np.ndarray) -> None:
        seen.append(float(w[0]))

    for _ in range(5):
        step(w, g)
        engine.submit(observe, w)
    assert list(await w.get()) == [-5.0, -5.0, -5.0]
    await engine.wait_for_var(w)  # get() is a reader: it may finish before the last observe
    assert seen == [-1.0, -2.0, -3.0, -4.0, -5.0]
    assert w.version == 5
    assert g.version == 0


async def test_out_replaces_values(engine: ae.Engine) -> None:
    count = engine.new_var("count", value=0)

    @engine.op(out=count)
    async def increment(n: int) -> int:
        await asyncio.sleep(0)
        return n + 1

    ops = [increment(count) for _ in range(10)]
    assert await count.get() == 10
    assert [await op for op in ops] == list(range(1, 11))
    lo, hi = engine.new_var("lo"), engine.new_var("hi")
    await engine.submit(lambda xs: (min(xs), max(xs)), [4, 1, 9], out=[lo, hi])
    assert (await lo.get(), await hi.get()) == (1, 9)
    await count.set("replaced")
    assert await count.get() == "replaced"


async def test_reads_and_writes_add_dependencies(threaded_engine: ae.Engine) -> None:
    engine = threaded_engine
    x = engine.new_var("x")
    barrier = threading.Barrier(2, timeout=5)
    trace: list[str] = []
    engine.submit(trace.append, "write", writes=[x])
    engine.submit(barrier.wait, reads=[x])  # both readers overlap
    engine.submit(barrier.wait, reads=[x])
    engine.submit(trace.append, "write 2", writes=[x])
    await engine.wait_for_var(x)
    assert trace == ["write", "write 2"]


async def test_decorator_without_arguments_and_async(engine: ae.Engine) -> None:
    v = engine.new_var("v", value=[1, 2])

    @engine.op
    async def total(xs: list[int]) -> int:
        await asyncio.sleep(0)
        return sum(xs)

    assert total.__name__ == "total"
    op = total(v)
    assert op.name.endswith("total")
    assert await op == 3
    assert (await engine.submit(str, 5, name="named")) == "5"


async def test_an_object_with_an_async_call_runs_as_a_coroutine(engine: ae.Engine) -> None:
    class AddOne:
        async def __call__(self, x: int) -> int:
            await asyncio.sleep(0)
            return x + 1

    v = engine.new_var("v", value=1)
    assert await engine.submit(AddOne(), v, out=v) == 2
    assert await v.get() == 2


async def test_failures_flow_through_values(engine: ae.Engine) -> None:
    v = engine.new_var("v", value=1)

    def fail(x: int) -> int:
        raise ValueError("bad")

    op = engine.submit(fail, v, out=v)
    with pytest.raises(ValueError, match="bad"):
        await op
    with pytest.raises(ae.DependencyError) as info:
        await v.get()
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(ValueError, match="bad"):
        await engine.wait_for_var(v)
    assert await v.get() == 1  # the failed op did not replace the value


async def test_a_forgotten_async_def_leaves_the_out_var_as_it_was(engine: ae.Engine) -> None:
    v = engine.new_var("v", value=0)

    async def job() -> int:
        return 1

    op = engine.submit(lambda: job(), out=v, name="forgot")
    with pytest.raises(TypeError, match="returned a coroutine"):
        await op
    with pytest.raises(TypeError):
        await engine.wait_for_var(v)
    assert await v.get() == 0


async def test_a_value_that_is_a_coroutine_object_can_be_read(engine: ae.Engine) -> None:
    """The read returns the value as it is, whatever it is; nothing is recorded."""

    async def job() -> int:
        return 1

    coro = job()
    v = engine.new_var("v", value=coro)
    try:
        assert await v.get() is coro
        await engine.wait_for_all()
    finally:
        coro.close()


async def test_bad_inputs(engine: ae.Engine) -> None:
    empty = engine.new_var("empty")
    with pytest.raises(ValueError, match="carries no value"):
        await engine.submit(len, empty)
    with pytest.raises(ExceptionGroup):
        await engine.wait_for_all()
    with pytest.raises(TypeError, match="callable"):
        engine.submit(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="out must be"):
        engine.submit(len, [], out="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs a function"):
        engine.op(const_vars=[empty])(42)
    pair = [engine.new_var("p"), engine.new_var("q")]
    with pytest.raises(ValueError, match="returned 3 value"):
        await engine.submit(lambda: (1, 2, 3), out=pair)
    with pytest.raises(ExceptionGroup):
        await engine.wait_for_all()
    other = ae.Engine(cpu_workers=1)
    with pytest.raises(ValueError, match=r"args\[0\] .* another Engine"):
        engine.submit(len, other.new_var("o", value=[]))
    with pytest.raises(RuntimeError, match="belongs to no Engine"):
        await ae.Var(None, "orphan").get()


async def test_bad_var_arguments_are_named_as_written(engine: ae.Engine) -> None:
    """Errors name the argument the caller wrote, not a position in the engine's lists."""
    a, b = engine.new_var("a", value=1), engine.new_var("b", value=2)
    other = ae.Engine(cpu_workers=1).new_var("o", value=0)
    refused: list[tuple[type[Exception], str, Callable[[], object]]] = [
        (
            TypeError,
            r"reads must be a list of Vars, not a single Var; use \[a\]",
            lambda: engine.submit(len, reads=a),  # type: ignore[call-overload]
        ),
        (
            TypeError,
            r"writes must be an iterable",
            lambda: engine.submit(len, writes="ab"),  # type: ignore[call-overload]
        ),
        (
            TypeError,
            r"reads\[1\] is 3, not an aioengine.Var",
            lambda: engine.submit(len, reads=[a, 3]),  # type: ignore[call-overload]
        ),
        (ValueError, r"writes\[0\] .* another Engine", lambda: engine.submit(len, writes=[other])),
        (ValueError, r"argument x .* another Engine", lambda: engine.submit(len, x=other)),
        (ValueError, r"out\[1\] .* another Engine", lambda: engine.submit(len, out=[a, other])),
        (TypeError, r"non-empty", lambda: engine.submit(lambda: 5, out=[])),
        (ValueError, r"out names a Var twice", lambda: engine.submit(lambda: (1, 2), out=[a, a])),
        (TypeError, r"args\[0\] is a dict that contains", lambda: engine.submit(list, {b: 1})),
    ]
    for error, message, call in refused:
        with pytest.raises(error, match=message):
            call()
    assert engine.pending == 0  # nothing was pushed
    assert (await a.get(), await b.get()) == (1, 2)


@pytest.mark.parametrize(
    ("args", "kwargs", "where"),
    [
        pytest.param(lambda a, b: ([a, b],), lambda a, b: {}, r"args\[0\] is a list", id="list"),
        pytest.param(lambda a, b: (1, (a,)), lambda a, b: {}, r"args\[1\] is a tuple", id="tuple"),
        pytest.param(lambda a, b: (), lambda a, b: {"xs": {a}}, "xs is a set", id="set-kwarg"),
        pytest.param(lambda a, b: ({"k": b},), lambda a, b: {}, r"args\[0\] is a dict", id="dict"),
        pytest.param(
            lambda a, b: ([[1, 2], {"k": (3, [b])}],),
            lambda a, b: {},
            r"args\[0\] is a list",
            id="deep",
        ),
        pytest.param(
            lambda a, b: (), lambda a, b: {"m": {1: [{a}]}}, "m is a dict", id="deep-kwarg"
        ),
    ],
)
async def test_a_var_inside_a_container_argument_is_refused(
    engine: ae.Engine, args: Any, kwargs: Any, where: str
) -> None:
    """Regression test for #6: such a Var would reach the function unread, with no turn."""
    a, b = engine.new_var("a", value=1), engine.new_var("b", value=2)
    ran: list[object] = []
    pattern = rf"^argument {where} that contains <Var '[ab]'"
    with pytest.raises(TypeError, match=pattern):
        engine.submit(lambda *xs, **kw: ran.append(xs), *args(a, b), **kwargs(a, b))
    with pytest.raises(TypeError, match=pattern):
        engine.op(lambda *xs, **kw: ran.append(xs))(*args(a, b), **kwargs(a, b))
    await engine.wait_for_all()  # nothing was queued
    assert ran == []
    assert (a.version, b.version) == (0, 0)
    # Bound with functools.partial, the Var objects are passed on purpose.
    assert await engine.submit(functools.partial(lambda vs: vs, [a, b])) == [a, b]
    assert await engine.submit(len, [1, 2, "three"]) == 3  # containers of values are fine
    loop: list[object] = [1, [2]]
    loop.append(loop)  # a container that holds itself is looked through once
    assert await engine.submit(len, loop) == 3


async def test_submit_keywords_are_submits_own(engine: ae.Engine) -> None:
    """``name=`` (and the other options) go to submit; partial or @engine.op pass them on."""

    def label(x: int, name: str = "default") -> str:
        return f"{name}:{x}"

    op = engine.submit(label, 1, name="the_op")
    assert (await op, op.name) == ("default:1", "the_op")
    assert await engine.submit(functools.partial(label, name="mine"), 1) == "mine:1"
    assert await engine.op(label)(1, name="mine") == "mine:1"


async def test_plain_push_still_works_with_values(engine: ae.Engine) -> None:
    v = engine.new_var("v", value=[0])
    engine.push_sync(lambda r: v._value.append(1), mutate_vars=[v])
    assert await v.get() == [0, 1]


async def test_a_failed_get_is_thrown_once(engine: ae.Engine) -> None:
    """Regression test for #6: get()'s ValueError is not reported again by wait_for_all()."""
    empty = engine.new_var("empty")
    with pytest.raises(ValueError, match=r"^<Var 'empty'.*carries no value"):
        await empty.get()
    await engine.wait_for_all()  # nothing recorded
    await empty.set(3)
    assert await empty.get() == 3


async def test_get_after_aclose_returns_the_final_value() -> None:
    """Nothing can change a Var's value once its engine is closed: get() returns it, rather
    than refusing with EngineClosedError (issue 35); one that carries none still says so."""
    engine = ae.Engine()
    total = engine.new_var("total", value=0)
    empty = engine.new_var("empty")
    for i in range(5):
        engine.submit(operator.add, total, i, out=total)
    bad = engine.new_var("bad", value=1)
    engine.submit(operator.truediv, bad, 0, out=bad)
    with pytest.raises(ExceptionGroup):
        await engine.aclose()  # raises the ZeroDivisionError, once
    assert engine.closed
    assert await total.get() == 10
    assert await bad.get() == 1  # the failed write replaced nothing; its failure was thrown
    with pytest.raises(ValueError, match="no value"):
        await empty.get()


async def test_var_arguments_in_any_position_and_keyword_are_replaced_in_place(
    engine: ae.Engine,
) -> None:
    # submit's one pass over the arguments remembers where each Var is; the call gets the
    # values there, the other arguments untouched, and the out Var the result.
    a = engine.new_var("a", value=2)
    b = engine.new_var("b", value=10)
    out = engine.new_var("out")

    def f(x: int, y: str, z: int, *, k: int, plain: str) -> tuple[int, str, int, int, str]:
        return (x, y, z, k, plain)

    expected = (2, "y", 10, 2, "p")
    assert await engine.submit(f, a, "y", b, k=a, plain="p", out=out) == expected
    assert await out.get() == expected

    async def g(x: int, *, k: int) -> int:
        return x * k

    assert await engine.submit(g, b, k=a, out=out) == 20
    assert await out.get() == 20


async def test_a_submit_keeps_no_closure_alive_after_it_finishes(engine: ae.Engine) -> None:
    # The call record is dropped with the operation's function when it finishes: the
    # arguments it held (a large array, say) are freed then, not when the engine goes.
    import gc
    import weakref

    class Payload:
        pass

    payload = Payload()
    ref = weakref.ref(payload)
    v = engine.new_var("v", value=0)
    await engine.submit(lambda x, p: x + 1, v, payload, out=v)
    del payload
    gc.collect()
    assert ref() is None
    assert await v.get() == 1


def test_is_coroutine_function_remembers_classes_but_keeps_no_object_made_per_call() -> None:
    import weakref

    from aioengine.functions import is_coroutine_function

    class Slotted:
        __slots__ = ("__weakref__",)

        async def __call__(self) -> None:
            pass

    class Plain:
        def __call__(self) -> None:
            pass

    class Async:
        async def __call__(self) -> None:
            pass

    # Decided right, the first time and the next (remembered per class for slotted ones).
    for _ in range(2):
        assert is_coroutine_function(Slotted())
        assert not is_coroutine_function(Plain())
        assert is_coroutine_function(Async())
        assert not is_coroutine_function(np.add)
        assert not is_coroutine_function(functools.partial(np.add, 1))
        assert not is_coroutine_function(print)
        # A class called itself makes an instance: remembered apart from its instances.
        assert not is_coroutine_function(Slotted)
        assert is_coroutine_function(Slotted())
    # Instances with a __dict__ and partials are made per call: none is kept.
    made: list[Any] = [Plain(), Async(), functools.partial(np.add, 1), Slotted()]
    refs = [weakref.ref(x) for x in made]
    for x in made:
        is_coroutine_function(x)
    del made, x
    assert [r() for r in refs] == [None] * 4
