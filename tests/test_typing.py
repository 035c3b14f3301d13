"""Static types of the public API, pinned with assert_type (checked by ``nox -s mypy``)."""

from __future__ import annotations

import asyncio
from typing import assert_type

import aioengine as ae


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
