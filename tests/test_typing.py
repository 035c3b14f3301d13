"""Static types of the public API, pinned with assert_type (checked by ``nox -s mypy``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future
from typing import assert_type

import aioengine as ae


async def fetch(n: int) -> bytes:
    await asyncio.sleep(0)
    return b"x" * n


def double_of(n: int) -> int:
    return 2 * n


async def triple_of(n: int) -> int:
    await asyncio.sleep(0)
    return 3 * n


async def test_operation_types_follow_the_function() -> None:
    async with ae.Engine() as engine:
        x = engine.new_var("x")

        def sync(rctx: ae.RunContext) -> int:
            return 1

        async def coro(rctx: ae.RunContext) -> str:
            await asyncio.sleep(0)
            return "s"

        def callback(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            on_complete()

        a = engine.push_sync(sync, ae.cpu(), [x])
        b = engine.push_async(coro, ae.cpu(), mutate_vars=[x])
        c = engine.push_async(callback, ae.cpu(), [x])
        assert_type(a, ae.Operation[int])
        assert_type(b, ae.Operation[str])
        assert_type(c, ae.Operation[None])
        assert_type(await a, int)
        assert_type(await b, str)
        assert (await a, await b) == (1, "s")
        await c
        assert_type(engine.new_operator(sync, [x]), ae.OprHandle[int])
        assert_type(engine.delete_var(x), ae.Operation[None])


async def test_ergonomic_operation_types_follow_the_function() -> None:
    """Engine.submit, Engine.op and Var.set are typed as push_sync and push_async are."""
    async with ae.Engine(cpu_workers=1) as engine:
        v = engine.new_var("v", value=2)
        double = engine.op(double_of)
        triple = engine.op(out=v)(triple_of)

        assert_type(double, Callable[..., ae.Operation[int]])
        assert_type(triple, Callable[..., ae.Operation[int]])
        assert await assert_type(engine.submit(len, [1, 2]), ae.Operation[int]) == 2
        assert await assert_type(engine.submit(fetch, v), ae.Operation[bytes]) == b"xx"
        assert await double(v) == 4
        assert await triple(v) == 6  # and writes v
        assert await assert_type(v.set(5), ae.Operation[int]) == 5
        assert await v.get() == 5


def test_blocking_future_types_follow_the_function() -> None:
    """BlockingEngine's futures are typed as the Engine's operations (push_async overloads)."""
    with ae.BlockingEngine(cpu_workers=1) as be:
        v = be.new_var("v", value=2)

        async def coro(rctx: ae.RunContext) -> str:
            await asyncio.sleep(0)
            return "s"

        def callback(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
            on_complete()

        double = be.op(double_of)
        triple = be.op(out=v)(triple_of)

        a = be.push_async(coro)
        c = be.push_async(callback, ae.cpu(), [v])
        assert_type(a, Future[str])
        assert_type(c, Future[None])
        assert_type(be.push_sync(lambda r: 1.5), Future[float])
        assert_type(be.submit(len, [1, 2]), Future[int])
        assert_type(be.submit(fetch, v), Future[bytes])
        assert_type(double, Callable[..., Future[int]])
        assert_type(triple, Callable[..., Future[int]])
        assert (a.result(5), c.result(5)) == ("s", None)
        assert be.submit(fetch, v).result(5) == b"xx"
        assert double(v).result(5) == 4
        assert triple(v).result(5) == 6
