"""Remote arrays (chunks on a Dask cluster) against idiomatic dask.array, on one cluster, in
one run (issue 43's targets).

Two measurements on ``LocalCluster(processes=True, n_workers=2, threads_per_worker=1)``:

* ``stencil``: ``--steps`` (100) steps of a 1-D heat stencil with an in-place update,
  ``u[1:-1] = u[1:-1] + a * (u[:-2] - 2 * u[1:-1] + u[2:])``, over ``--chunks`` (64) chunks
  sized so that one chunk's NumPy step takes about 1 ms (calibrated at start). aioengine:
  the program as written, on ``xp.asarray(u0, device=ae.remote())``, then ``await u``.
  dask.array: ``u = u.map_overlap(step, depth=1, boundary="none")`` each step, persisted
  (as its docs advise for iterative programs: the graph does not grow), then computed. Both
  start from the same NumPy array on the client and end with the value gathered; both must
  equal NumPy's. The sides take turns at going first (``--reps`` pairs, 2); the ratio is
  aioengine's time over dask's, the median of the pairs'. ``client_cpu_s``: this process's
  CPU time over the run (the client, and the scheduler, which a LocalCluster runs here).
* ``tasks``: per chunk, for one step of the stencil (a fused write) and for a fused
  elementwise chain of eight operations (``xp.sin(x) * 2 + x ...``) on a remote array: the
  engine's remote operations pushed, and the Dask tasks that ran (counted by a scheduler
  plugin: an operation with several outputs adds a ``getitem`` task per output). Beside
  them, the tasks that ran for one persisted ``map_overlap`` step of dask.array.

Run: python benchmarks/arrays_cluster.py [--quick] [--out PATH] [--reps N]
(``nox -s bench`` runs it; ``--quick``: 8 chunks, 10 steps, smaller chunks, one pair).
Timings are printed, never asserted: the target (aioengine at most 0.5x dask.array's wall
time on the stencil, at most 1 task per chunk per fused step) is judged by a person.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
from distributed.diagnostics.plugin import SchedulerPlugin

import aioengine as ae
import aioengine.array as aa

ALPHA = 0.1
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def step_numpy(u: np.ndarray[Any, Any]) -> None:
    """One step in place (the program, on NumPy: the reference)."""
    u[1:-1] = u[1:-1] + ALPHA * (u[:-2] - 2 * u[1:-1] + u[2:])


def step_block(b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """One step of a block with its halo (dask.array's ``map_overlap`` function)."""
    out = b.copy()
    out[1:-1] = b[1:-1] + ALPHA * (b[:-2] - 2 * b[1:-1] + b[2:])
    return out


def calibrate(target_s: float) -> int:
    """The elements of a chunk whose NumPy step (``step_block``) takes about ``target_s``."""
    n = 1 << 14
    while True:
        b = np.random.default_rng(0).random(n)
        best = min(_timed(step_block, b) for _ in range(5))
        if best >= target_s or n >= 1 << 24:
            return max(1024, int(n * target_s / best))
        n *= 2


def _timed(fn: Any, *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


async def run_engine(engine: ae.Engine, u0: np.ndarray[Any, Any], n: int, steps: int) -> Any:
    xp = aa.namespace(engine, chunk_bytes=8 * n)
    u = xp.asarray(u0, device=ae.remote())
    for _ in range(steps):
        u[1:-1] = u[1:-1] + ALPHA * (u[:-2] - 2 * u[1:-1] + u[2:])
    return await u


async def run_dask(client: Any, u0: np.ndarray[Any, Any], n: int, steps: int) -> Any:
    import dask.array as da

    u = client.persist(da.from_array(u0, chunks=n))
    for _ in range(steps):
        u = client.persist(u.map_overlap(step_block, depth=1, boundary="none", dtype=u.dtype))
    return await client.compute(u)


def remote_pushed(engine: ae.Engine) -> int:
    pools = engine.statistics().pools
    return pools["remote"].pushed if "remote" in pools else 0


class TaskCount(SchedulerPlugin):  # type: ignore[misc]
    """A scheduler plugin: the tasks that started running (each key once per run)."""

    name = "aioengine-bench-task-count"

    def __init__(self) -> None:
        self.started = 0

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish == "processing":
            self.started += 1


async def count_tasks(
    engine: ae.Engine, client: Any, scheduler: Any, u0: np.ndarray[Any, Any], n: int
) -> dict[str, float]:
    """Per chunk: the engine's remote operations and the Dask tasks that ran, for a stencil
    step and an eight-operation chain; the Dask tasks of one map_overlap step."""
    import dask.array as da

    counter = TaskCount()
    scheduler.add_plugin(counter)
    xp = aa.namespace(engine, chunk_bytes=8 * n)
    u = xp.asarray(u0, device=ae.remote())
    await u
    chunks = u.chunks

    async def measured(program: Any) -> tuple[float, float]:
        await engine.wait_for_all()
        ops, tasks = remote_pushed(engine), counter.started
        await program()
        await engine.wait_for_all()
        return (remote_pushed(engine) - ops) / chunks, (counter.started - tasks) / chunks

    async def stencil() -> None:
        u[1:-1] = u[1:-1] + ALPHA * (u[:-2] - 2 * u[1:-1] + u[2:])
        await u

    async def chain() -> None:
        y = xp.sin(u) * 2.0 + u
        y = xp.where(y > 0.5, y, -y)
        y = xp.abs(xp.exp(-y * y) - 1.0)
        await y  # one live result per chunk: the others were rebound

    stencil_ops, stencil_tasks = await measured(stencil)
    chain_ops, chain_tasks = await measured(chain)
    v = client.persist(da.from_array(u0, chunks=n))
    await client.gather(list(client.futures_of(v)))
    tasks = counter.started
    w = client.persist(v.map_overlap(step_block, depth=1, boundary="none", dtype=v.dtype))
    await client.gather(list(client.futures_of(w)))
    dask_tasks = (counter.started - tasks) / chunks
    scheduler.remove_plugin(name=counter.name)
    return {
        "chunks": chunks,
        "stencil_step_ops": stencil_ops,
        "stencil_step_dask_tasks": stencil_tasks,
        "chain_of_8_ops": chain_ops,
        "chain_of_8_dask_tasks": chain_tasks,
        "dask_map_overlap_step_tasks": dask_tasks,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import distributed

    chunks = 8 if args.quick else args.chunks
    steps = 10 if args.quick else args.steps
    reps = 1 if args.quick else args.reps
    n = calibrate(0.0002 if args.quick else 0.001)
    u0 = np.random.default_rng(1).random(chunks * n)
    want = u0.copy()
    for _ in range(steps):
        step_numpy(want)
    async with (
        distributed.LocalCluster(
            processes=True, n_workers=2, threads_per_worker=1, dashboard_address=":0",
            asynchronous=True,
        ) as cluster,
        distributed.Client(cluster, asynchronous=True) as client,
        ae.Engine(cluster=cluster) as engine,
    ):  # fmt: skip
        # Warm both (worker imports, the engine's first connection) before timing.
        await run_engine(engine, u0[: 4 * n], n, 2)
        await run_dask(client, u0[: 4 * n], n, 2)
        runs: dict[str, list[dict[str, float]]] = {"aioengine": [], "dask": []}
        for rep in range(reps):
            order = ["aioengine", "dask"] if rep % 2 == 0 else ["dask", "aioengine"]
            for side in order:
                await engine.wait_for_all()
                cpu0, t0 = time.process_time(), time.perf_counter()
                if side == "aioengine":
                    got = await run_engine(engine, u0, n, steps)
                else:
                    got = await run_dask(client, u0, n, steps)
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                if not np.allclose(got, want):
                    raise AssertionError(f"{side}: the stencil differs from NumPy's")
                runs[side].append({"wall_s": wall, "client_cpu_s": cpu})
        tasks = await count_tasks(engine, client, cluster.scheduler, u0, n)
    ratios = [
        a["wall_s"] / d["wall_s"] for a, d in zip(runs["aioengine"], runs["dask"], strict=True)
    ]
    return {
        "cluster": "LocalCluster(processes=True, n_workers=2, threads_per_worker=1)",
        "quick": args.quick,
        "stencil": {
            "chunks": chunks,
            "steps": steps,
            "elements_per_chunk": n,
            "runs": runs,
            "median_wall_s": {
                side: statistics.median(r["wall_s"] for r in rs) for side, rs in runs.items()
            },
            "ratio_aioengine_over_dask": statistics.median(ratios),
            "ratios": ratios,
            "target": "<= 0.5",
        },
        "tasks_per_chunk": {**tasks, "target": "<= 1 per chunk per fused step"},
        "versions": {
            "numpy": np.__version__,
            "distributed": distributed.__version__,
            "python": sys.version.split()[0],
        },
    }


def report(out: dict[str, Any]) -> str:
    s, t = out["stencil"], out["tasks_per_chunk"]
    med = s["median_wall_s"]
    return "\n".join(
        [
            f"remote arrays vs dask.array on {out['cluster']}",
            f"  stencil, {s['steps']} steps x {s['chunks']} chunks of {s['elements_per_chunk']} "
            f"elements: aioengine {med['aioengine']:.2f} s, dask.array {med['dask']:.2f} s, "
            f"ratio {s['ratio_aioengine_over_dask']:.2f} (target {s['target']}; pairs "
            + ", ".join(f"{r:.2f}" for r in s["ratios"])
            + ")",
            f"  per chunk, engine operations (Dask tasks that ran): stencil step "
            f"{t['stencil_step_ops']:.2f} ({t['stencil_step_dask_tasks']:.2f}), chain of 8 "
            f"{t['chain_of_8_ops']:.2f} ({t['chain_of_8_dask_tasks']:.2f}) (target "
            f"{t['target']}); dask.array's map_overlap step: "
            f"{t['dask_map_overlap_step_tasks']:.2f} tasks",
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reduced sizes (smoke)")
    parser.add_argument("--chunks", type=int, default=64, help="chunks of the array (64)")
    parser.add_argument("--steps", type=int, default=100, help="stencil steps (100)")
    parser.add_argument("--reps", type=int, default=2, help="timed pairs (sides alternate)")
    parser.add_argument("--out", help="JSON output (default: results/arrays-cluster.json, or "
                        "results/quick/ with --quick)")  # fmt: skip
    ns = parser.parse_args()
    result = asyncio.run(main(ns))
    print(report(result))
    path = ns.out or os.path.join(RESULTS, *(["quick"] if ns.quick else []), "arrays-cluster.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
