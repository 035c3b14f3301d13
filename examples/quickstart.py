"""Quickstart: a tiny SGD loop whose steps the engine orders through two Vars.

Gradient computations only *read* the weights, so those of one step run in parallel on the
CPU pool; the update *mutates* the weights, so it waits for every gradient pushed before it,
and the next step's gradients wait for it. A coroutine operation logs the loss the way an
I/O-bound reporter would, overlapping with the next step's work.

Run: python examples/quickstart.py
"""

from __future__ import annotations

import asyncio
import os

import numpy as np

import aioengine as ae

SMALL = os.environ.get("AIOENGINE_EXAMPLE_SMALL") == "1"
STEPS = 5 if SMALL else 50
SHARDS = 4


async def main() -> None:
    rng = np.random.default_rng(0)
    true_w = rng.standard_normal(8)
    shards = [rng.standard_normal((256, 8)) for _ in range(SHARDS)]
    targets = [x @ true_w for x in shards]
    w = np.zeros(8)
    grads = [np.zeros(8) for _ in range(SHARDS)]
    losses: dict[int, float] = {}  # by step: the log operations may finish in any order

    async with ae.Engine() as engine:
        weights = engine.new_var("weights")
        grad_vars = [engine.new_var(f"grad{i}") for i in range(SHARDS)]

        def gradient(i: int) -> ae.OprHandle[None]:
            def fn(rctx: ae.RunContext) -> None:
                err = shards[i] @ w - targets[i]
                grads[i][:] = shards[i].T @ err / len(err)

            # Built once, pushed every step: reads the weights, writes its gradient buffer.
            return engine.new_operator(fn, [weights], [grad_vars[i]], name=f"grad{i}")

        def update(rctx: ae.RunContext) -> float:
            w[:] -= 0.1 * sum(grads)  # in place: safe, the engine gave us exclusive access
            errors = [x @ w - y for x, y in zip(shards, targets, strict=True)]
            return float(np.mean([np.mean(e**2) for e in errors]))

        async def log_loss(rctx: ae.RunContext, step: int, loss: ae.Operation[float]) -> None:
            value = await loss
            await asyncio.sleep(0.001)  # e.g. an HTTP call to a metrics service
            losses[step] = value

        handles = [gradient(i) for i in range(SHARDS)]
        for step in range(STEPS):
            for h in handles:
                engine.push(h)
            loss = engine.push_sync(update, const_vars=grad_vars, mutate_vars=[weights])
            engine.push_async(lambda rctx, s=step, op=loss: log_loss(rctx, s, op), name="log")
        await engine.wait_for_var(weights)

    first, last = losses[0], losses[STEPS - 1]
    print(f"{STEPS} steps: loss {first:.4f} -> {last:.6f}")
    print(f"weights error {np.abs(w - true_w).max():.2e}")
    assert last < first


if __name__ == "__main__":
    asyncio.run(main())
