"""A 2-D heat-diffusion stencil whose chunks live on a Dask cluster.

See ``docs/howto/arrays-cluster.md``.

The same program a NumPy user writes, with ``device=ae.remote()``: the grid is cut into chunks
of rows on the workers, each step is one Dask task per chunk (the stencil's expression fused
into its in-place write, reading one halo row of each neighbour chunk), and only the checks
come back to this process. Checked against NumPy. The engine's trace of the steps (written to
``arrays_cluster_trace.json`` with ``--trace``; open it in ui.perfetto.dev) has a lane per Dask
worker with the chunk operations it ran: the run prints how many each worker took.
"""

import asyncio
import collections
import sys

import distributed
import numpy as np

import aioengine as ae
import aioengine.array as aa


def step(u, alpha=0.1):
    u[1:-1, 1:-1] = u[1:-1, 1:-1] + alpha * (
        u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
    )


def per_worker(trace):
    """The remote operations in a trace, counted by the Dask worker that ran them."""
    lanes = {
        e["tid"]: e["args"]["name"].split(" #")[0]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e["name"] == "thread_name"
    }
    ran = collections.Counter(
        lanes.get(e["tid"], "?") for e in trace["traceEvents"] if e.get("cat") == "op"
    )
    # ("remote ops": one whose worker the trace did not learn, a key released too soon)
    return {k: v for k, v in sorted(ran.items()) if k.startswith(("worker ", "remote ops"))}


async def main(n=256, steps=20, trace_path=None):
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
        async with engine.trace(trace_path) as session:
            for _ in range(steps):
                step(u)
            await engine.wait_for_all()  # the steps end inside the trace
        heat = await xp.sum(u)  # one partial per chunk, then one number to this process
        hottest = await xp.max(u)
        result = await u  # the whole grid, gathered once, to check it
    want = grid.copy()
    for _ in range(steps):
        step(want)
    assert np.allclose(result, want)
    print(f"{u.chunks} chunks, heat {float(heat):.1f}, hottest {float(hottest):.2f}: as NumPy")
    workers = per_worker(session.trace)
    assert sum(workers.values()) == u.chunks * steps  # one operation per chunk and step
    for lane, k in workers.items():
        print(f"  {lane}: {k} chunk operations")


if __name__ == "__main__":
    asyncio.run(main(trace_path="arrays_cluster_trace.json" if "--trace" in sys.argv else None))
