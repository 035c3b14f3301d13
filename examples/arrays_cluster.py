"""A 2-D heat-diffusion stencil whose chunks live on a Dask cluster.

See ``docs/howto/arrays-cluster.md``.

The same program a NumPy user writes, with ``device=ae.remote()``: the grid is cut into chunks
of rows on the workers, each step is one Dask task per chunk (the stencil's expression fused
into its in-place write, reading one halo row of each neighbour chunk), and only the checks
come back to this process. Checked against NumPy.
"""

import asyncio

import distributed
import numpy as np

import aioengine as ae
import aioengine.array as aa


def step(u, alpha=0.1):
    u[1:-1, 1:-1] = u[1:-1, 1:-1] + alpha * (
        u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
    )


async def main(n=256, steps=20):
    grid = np.zeros((n, n))
    grid[n // 4 : n // 2, n // 4 : n // 2] = 100.0  # a hot square
    async with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0",
            asynchronous=True,
        ) as cluster,
        ae.Engine(cluster=cluster) as engine,
    ):  # fmt: skip
        xp = aa.namespace(engine, chunk_bytes=64 * 1024)  # small chunks: 8 of 32 rows here
        u = xp.asarray(grid, device=ae.remote())
        for _ in range(steps):
            step(u)
        heat = await xp.sum(u)  # one partial per chunk, then one number to this process
        hottest = await xp.max(u)
        result = await u  # the whole grid, gathered once, to check it
    want = grid.copy()
    for _ in range(steps):
        step(want)
    assert np.allclose(result, want)
    print(f"{u.chunks} chunks, heat {float(heat):.1f}, hottest {float(hottest):.2f}: as NumPy")


if __name__ == "__main__":
    asyncio.run(main())
