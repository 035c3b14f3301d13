"""Cluster: the same Vars and the same rule, with the NumPy work on a Dask cluster.

A small blocked computation: each block of ``x`` is smoothed on the cluster many times, the
blocks are mixed pairwise, and the result is checked against the same computation run
locally. Every step is a *value operation* (``engine.submit(..., ctx=ae.remote())``): its
inputs reach the worker as the Dask futures of the versions it must see, its result stays on
the cluster as the next version of its ``out`` Var, and the engine releases the Vars as soon
as the step is submitted, so the whole graph reaches the Dask scheduler at once. A local
operation in the middle (the norm report) gets the gathered value; a side-effect operation
(``push_sync`` on ``ae.remote()``) holds its Var until it has finished on the worker.

Run: python examples/cluster.py                       (an in-process LocalCluster)
     python examples/cluster.py --scheduler tcp://10.0.0.5:8786   (a running scheduler)
Needs: pip install 'aioengine[dask]'
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

import numpy as np

import aioengine as ae

SMALL = os.environ.get("AIOENGINE_EXAMPLE_SMALL") == "1"
BLOCKS = 4 if SMALL else 16
ROUNDS = 3 if SMALL else 10
SIZE = 64 if SMALL else 256


def smooth(block: np.ndarray) -> np.ndarray:
    """One smoothing step; it returns a new array (value operations never modify inputs)."""
    return (block + np.roll(block, 1, axis=0) + np.roll(block, -1, axis=1)) / 3.0


def mix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Combine two blocks."""
    return 0.5 * (a + b.T)


def norm(block: np.ndarray) -> float:
    return float(np.linalg.norm(block))


def worker_info(rctx: ae.RunContext) -> str:
    """A side-effect operation: it runs on a worker and reports where."""
    return f"{os.getpid()} on {rctx.ctx!r}"


def reference(blocks: list[np.ndarray]) -> float:
    """The same computation, locally, for the check."""
    blocks = [b.copy() for b in blocks]
    for _ in range(ROUNDS):
        blocks = [smooth(b) for b in blocks]
        blocks = [mix(blocks[i], blocks[(i + 1) % BLOCKS]) for i in range(BLOCKS)]
    return float(sum(b.sum() for b in blocks))


async def main(scheduler: str | None) -> None:
    rng = np.random.default_rng(0)
    data = [rng.standard_normal((SIZE, SIZE)) for _ in range(BLOCKS)]
    cluster: Any = scheduler if scheduler is not None else "local"
    remote = ae.remote()
    async with ae.Engine(cluster=cluster) as engine:
        xs = [engine.new_var(f"x{i}", value=block) for i, block in enumerate(data)]
        tmp = [engine.new_var(f"t{i}") for i in range(BLOCKS)]
        for _ in range(ROUNDS):
            for x in xs:
                engine.submit(smooth, x, out=x, ctx=remote)
            for i in range(BLOCKS):
                engine.submit(mix, xs[i], xs[(i + 1) % BLOCKS], out=tmp[i], ctx=remote)
            for i in range(BLOCKS):
                engine.submit(np.copy, tmp[i], out=xs[i], ctx=remote)
        first_norm = engine.submit(norm, xs[0])  # local: it gets the gathered value
        where = engine.push_sync(worker_info, remote, [xs[0]], [])
        total = engine.submit(lambda *bs: float(sum(b.sum() for b in bs)), *xs, ctx=remote)
        result = await total
        print(f"{BLOCKS} blocks x {ROUNDS} rounds on the cluster: checksum {result:.6f}")
        print(f"norm of x0 (computed locally): {await first_norm:.3f}")
        print(f"a side-effect operation ran in process {await where}")
    expected = reference(data)
    assert abs(result - expected) <= 1e-9 * max(1.0, abs(expected)), (result, expected)
    print(f"matches the local computation ({expected:.6f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", help="a Dask scheduler address (default: LocalCluster)")
    asyncio.run(main(parser.parse_args().scheduler))
