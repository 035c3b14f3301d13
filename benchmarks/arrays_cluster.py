"""Remote arrays (chunks on a Dask cluster) against idiomatic dask.array, on one cluster, in
one run (issue 43's targets).

Five measurements. Two on ``LocalCluster(processes=True, n_workers=2, threads_per_worker=1)``
(whose scheduler runs in this process):

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

Two on a ``dask scheduler`` and a ``dask worker`` (two worker processes of one thread)
started as processes of their own, so that this process is the client and nothing else:

* ``client_cpu``: this process's CPU time (``time.process_time``: every thread of the client
  and the engine) per chunk operation, from the first push until the result is gathered, for
  ``--cpu-steps`` steps over ``--cpu-chunks`` chunks of a few KiB (the workers' time is not
  counted): remote arrays running a stencil step written in place and a short fused
  elementwise step (``x = x * 0.5 + 0.25``, one flush per step), per chunk and step, and per
  remote operation the engine pushed; the engine's remote value operation
  (``engine.submit(fn, var, out=var, ctx=ae.remote())``, one Var per chunk); and Dask's
  ``client.submit`` (a chain of futures per chunk), per task.
* ``sum_bytes``: the bytes that pass through this process (read and written on its TCP
  comms, counted by wrapping ``distributed.comm.tcp``: with the scheduler and the workers
  elsewhere, every comm here is the client's) while ``float(xp.sum(x))`` runs on a remote
  array of ``--sum-bytes`` (1 GiB; created on the workers by ``xp.ones``, measured apart),
  beside the array's size and its chunks times one partial's size.

One on an in-process ``LocalCluster(processes=False, n_workers=W, threads_per_worker=1)``:

* ``weak_scaling`` (simulated): one chunk per worker, W in 1, 2, 4, 8, 16, and ``--ws-steps``
  (50) steps of a 1-D stencil with halo reads whose every chunk operation sleeps (GIL
  released: 100 ms, and 20 ms) before a small NumPy step. ``xp.apply`` on remote arrays
  gives a function its chunk's rows without a halo, so the aioengine side is built on the
  engine's remote value operations directly: one Var per chunk, two generations (each step
  reads the previous generation's left neighbour, own and right neighbour chunks, and
  writes the other's).
  dask.array: ``map_overlap`` of the sleeping block function (``boundary="nearest"``),
  persisted every step. Efficiency: T(1 worker, 1 chunk) / T(W workers, W chunks), for each
  side; both checked against NumPy.

Run: python benchmarks/arrays_cluster.py [--quick] [--out PATH] [--reps N] [--sum-bytes N]
(``nox -s bench`` runs it; ``--quick``: 8 chunks, 10 steps, smaller chunks, one pair; 16 MiB
summed; weak scaling at W in 1, 2, 5 steps of 20 ms). Only the full mode writes
``results/arrays-cluster.json`` by default (``--quick``: ``results/quick/``, not committed).
Timings are printed, never asserted: the targets (aioengine at most 0.5x dask.array's wall
time on the stencil, at most 1 task per chunk per fused step, client CPU per chunk operation
at most the remote value operation's, one partial per chunk through the client, weak-scaling
efficiency at least 90 % and at least dask.array's) are judged by a person.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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

    # The chunks scattered to the workers (as the engine's asarray sends them), not the array
    # embedded in the graph (which Dask warns about, and which made its first runs slow).
    # Under new keys each run (hash=False): keys named by the data's hash are the same in every
    # run, so a run could find the last one's results still on the cluster (a 7 s run beside
    # 83 s ones in an earlier full run).
    parts = await client.scatter([u0[i : i + n] for i in range(0, len(u0), n)], hash=False)
    u = da.concatenate(
        [
            da.from_delayed(f, shape=(min(n, len(u0) - i * n),), dtype=u0.dtype)
            for i, f in enumerate(parts)
        ]
    )
    u = client.persist(u)
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


# -- client CPU and bytes: a scheduler and workers out of this process ---------------------


@contextmanager
def command_line_cluster(n_workers: int) -> Iterator[str]:
    """A ``dask scheduler`` and a ``dask worker`` of ``n_workers`` one-thread processes,
    started from the command line on 127.0.0.1 (this checkout first on their path): the
    scheduler's address; both stopped at the end, the worker first (a worker whose scheduler
    went first waits seconds to reconnect)."""
    import distributed

    cli = os.path.join(os.path.dirname(sys.executable), "dask")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    quiet: dict[str, Any] = {
        "env": dict(os.environ, PYTHONPATH=path),
        "stdout": subprocess.DEVNULL,
        "stderr": subprocess.DEVNULL,
    }
    with tempfile.TemporaryDirectory() as folder:
        file = os.path.join(folder, "scheduler.json")
        common = ["--scheduler-file", file, "--no-dashboard"]
        host = ["--host", "127.0.0.1"]
        procs = [subprocess.Popen([cli, "scheduler", *host, "--port", "0", *common], **quiet)]
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(file):
                if time.monotonic() > deadline:
                    raise RuntimeError("the dask scheduler did not start")
                time.sleep(0.05)
            worker = [cli, "worker", *host, "--nworkers", str(n_workers), "--nthreads", "1"]
            procs.append(subprocess.Popen([*worker, *common], **quiet))
            with distributed.Client(scheduler_file=file, timeout=60) as client:
                client.wait_for_workers(n_workers, timeout=60)
                address: str = client.scheduler.address
            yield address
        finally:
            for proc in reversed(procs):
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def scale(v: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """One chunk operation of the CPU measurement (a new array: value operations never
    modify their inputs)."""
    return v * 0.5 + 0.25


def filled(n: int) -> np.ndarray[Any, Any]:
    """A chunk made on a worker."""
    return np.ones(n)


async def client_cpu(address: str, chunks: int, steps: int, n: int) -> dict[str, float]:
    """This process's CPU time per chunk operation (µs), each side from its first push until
    its result is here (see the module docstring)."""
    import distributed

    out: dict[str, float] = {"chunks": chunks, "steps": steps}

    async def measured(program: Callable[[], Any]) -> float:
        cpu0 = time.process_time()
        await program()
        return (time.process_time() - cpu0) / (chunks * steps) * 1e6

    async with ae.Engine(cluster=address) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * n)
        want = np.ones(chunks * n)
        for _ in range(steps):
            step_numpy(want)

        async def stencil() -> None:
            u = xp.ones(chunks * n, device=ae.remote())
            for _ in range(steps):
                u[1:-1] = u[1:-1] + ALPHA * (u[:-2] - 2 * u[1:-1] + u[2:])
            if not np.allclose(await u, want):
                raise AssertionError("client_cpu: the stencil differs from NumPy's")

        async def chain() -> None:
            x = xp.ones(chunks * n, device=ae.remote())
            for _ in range(steps):
                x = x * 0.5 + 0.25
                await asyncio.sleep(0)  # the step's chain is sent: one task per chunk
            if not np.allclose(await x, 0.5 + 0.5 ** (steps + 1)):
                raise AssertionError("client_cpu: the chain differs from NumPy's")

        await stencil()  # warm: the workers' imports, the engine's connection
        for name, program in (("array_stencil", stencil), ("array_chain", chain)):
            ops = remote_pushed(engine)
            out[f"{name}_us_per_chunk_step"] = await measured(program)
            out[f"{name}_ops_per_chunk_step"] = (remote_pushed(engine) - ops) / (chunks * steps)

        vs = [engine.new_var(f"c{i}") for i in range(chunks)]

        async def value_ops() -> None:
            for v in vs:
                engine.submit(filled, n, out=v, ctx=ae.remote())
            for _ in range(steps):
                for v in vs:
                    engine.submit(scale, v, out=v, ctx=ae.remote())
            for v in vs:
                await v.get()

        await value_ops()
        out["value_op_us"] = await measured(value_ops)

    async with distributed.Client(address, asynchronous=True) as client:

        async def submits() -> None:
            futures = [client.submit(filled, n, pure=False) for _ in range(chunks)]
            for _ in range(steps):
                futures = [client.submit(scale, f, pure=False) for f in futures]
            await client.gather(futures)

        await submits()
        out["client_submit_us"] = await measured(submits)
    return out


class CommBytes:
    """The bytes read and written on this process's TCP (and TLS) comms while installed: a
    wrapper of ``distributed.comm.tcp``'s frame decoding (the frames of every message read)
    and of ``TCP.write`` (which returns the bytes it wrote)."""

    def __init__(self) -> None:
        self.read = 0
        self.written = 0

    def install(self) -> Callable[[], None]:
        """Start counting; the function that stops."""
        from distributed.comm import tcp
        from distributed.utils import nbytes

        from_frames, write = tcp.from_frames, tcp.TCP.write

        async def counted_from_frames(frames: Any, *args: Any, **kwargs: Any) -> Any:
            self.read += sum(nbytes(f) for f in frames)
            return await from_frames(frames, *args, **kwargs)

        async def counted_write(comm: Any, *args: Any, **kwargs: Any) -> int:
            n: int = await write(comm, *args, **kwargs)
            self.written += n
            return n

        tcp.from_frames, tcp.TCP.write = counted_from_frames, counted_write

        def uninstall() -> None:
            tcp.from_frames, tcp.TCP.write = from_frames, write

        return uninstall


async def sum_bytes(address: str, total: int, chunk_bytes: int) -> dict[str, float]:
    """The bytes through this process for creating a remote array of ``total`` bytes on the
    workers, and for ``float(xp.sum(x))`` on it."""
    counter = CommBytes()
    uninstall = counter.install()
    try:
        async with ae.Engine(cluster=address) as engine:
            xp = aa.namespace(engine, chunk_bytes=chunk_bytes)
            await xp.ones(16, device=ae.remote())  # warm (connections, imports): not counted
            mark = counter.read, counter.written
            x = xp.ones(total // 8, device=ae.remote())
            await engine.wait_for_all()
            created = counter.read - mark[0], counter.written - mark[1]
            mark = counter.read, counter.written
            value = float(await xp.sum(x))
            summed = counter.read - mark[0], counter.written - mark[1]
            if value != total // 8:
                raise AssertionError(f"sum_bytes: the sum is {value}, not {total // 8}")
            chunks = x.chunks
            del x
    finally:
        uninstall()
    return {
        "array_bytes": total,
        "chunks": chunks,
        "chunks_times_partial_bytes": chunks * 8,
        "create_read_bytes": created[0],
        "create_written_bytes": created[1],
        "sum_read_bytes": summed[0],
        "sum_written_bytes": summed[1],
    }


# -- weak scaling, simulated -------------------------------------------------------------------


def halo_step(
    delay: float,
    left: np.ndarray[Any, Any] | None,
    me: np.ndarray[Any, Any],
    right: np.ndarray[Any, Any] | None,
) -> np.ndarray[Any, Any]:
    """One chunk operation: sleep ``delay`` (the GIL released), then one stencil step of the
    chunk with a halo element of each neighbour (the chunk's own edge at the array's ends)."""
    time.sleep(delay)
    lo = me[:1] if left is None else left[-1:]
    hi = me[-1:] if right is None else right[:1]
    ext = np.concatenate([lo, me, hi])
    return me + ALPHA * (ext[:-2] - 2 * me + ext[2:])


def sleeping_block(delay: float, b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """dask.array's block function: the same sleep and step on a block with its halo."""
    time.sleep(delay)
    return step_block(b)


def weak_reference(w: int, n: int, steps: int) -> np.ndarray[Any, Any]:
    """The weak-scaling program on NumPy (the ends replicate their edge element)."""
    u = np.linspace(0.0, 1.0, w * n)
    for _ in range(steps):
        ext = np.concatenate([u[:1], u, u[-1:]])
        u = u + ALPHA * (ext[:-2] - 2 * u + ext[2:])
    return u


def start(w: int, n: int, i: int) -> np.ndarray[Any, Any]:
    """Chunk ``i`` of the weak-scaling array (made on a worker)."""
    return np.linspace(0.0, 1.0, w * n)[i * n : (i + 1) * n]


async def weak_engine(
    cluster: Any, w: int, n: int, steps: int, delay: float, pinned: bool = False
) -> float:
    """The aioengine side: the wall time of ``steps`` steps over ``w`` chunk Vars; with
    ``pinned``, chunk ``i``'s operations prefer worker ``i`` (``ae.remote(workers=...,
    allow_other_workers=True)``: the placement a user states, where Dask's own ties among a
    task's three equal inputs)."""
    addresses = sorted(cluster.scheduler_info["workers"])
    places = [
        ae.remote(workers=addresses[i % len(addresses)], allow_other_workers=True)
        if pinned
        else ae.remote()
        for i in range(w)
    ]
    async with ae.Engine(cluster=cluster) as engine:
        gens = [[engine.new_var(f"{g}{i}") for i in range(w)] for g in "ab"]
        for i, v in enumerate(gens[0]):
            engine.submit(start, w, n, i, out=v, ctx=places[i])
        await engine.wait_for_all()
        t0 = time.perf_counter()
        for k in range(steps):
            src, dst = gens[k % 2], gens[(k + 1) % 2]
            for i in range(w):
                left = src[i - 1] if i > 0 else None
                right = src[i + 1] if i + 1 < w else None
                engine.submit(halo_step, delay, left, src[i], right, out=dst[i], ctx=places[i])
        got = np.concatenate([await v.get() for v in gens[steps % 2]])
        wall = time.perf_counter() - t0
    if not np.allclose(got, weak_reference(w, n, steps)):
        raise AssertionError("weak scaling: aioengine's result differs from NumPy's")
    return wall


async def weak_dask(client: Any, w: int, n: int, steps: int, delay: float) -> float:
    """The dask.array side: ``map_overlap`` persisted every step; the wall time."""
    import dask.array as da

    u = client.persist(da.from_array(np.linspace(0.0, 1.0, w * n), chunks=n))
    await client.gather(list(client.futures_of(u)))
    t0 = time.perf_counter()
    for _ in range(steps):
        u = client.persist(
            u.map_overlap(
                lambda b: sleeping_block(delay, b), depth=1, boundary="nearest", dtype=u.dtype
            )
        )
    got = await client.compute(u)
    wall = time.perf_counter() - t0
    if not np.allclose(got, weak_reference(w, n, steps)):
        raise AssertionError("weak scaling: dask.array's result differs from NumPy's")
    return wall


async def weak_scaling(
    widths: list[int], steps: int, delays: list[tuple[str, float]]
) -> dict[str, Any]:
    """Per side and delay, the wall time at each width and the efficiency T(1) / T(W)."""
    import distributed

    n = 1000
    walls: dict[str, dict[int, float]] = {side: {} for side, _ in delays}
    for w in widths:
        async with (
            distributed.LocalCluster(
                processes=False, n_workers=w, threads_per_worker=1, dashboard_address=":0",
                asynchronous=True,
            ) as cluster,
            distributed.Client(cluster, asynchronous=True) as client,
        ):  # fmt: skip
            await weak_engine(cluster, w, n, 1, 0.0)  # warm
            for side, delay in delays:
                if side.startswith("aioengine"):
                    pinned = "pinned" in side
                    walls[side][w] = await weak_engine(cluster, w, n, steps, delay, pinned)
                else:
                    walls[side][w] = await weak_dask(client, w, n, steps, delay)
    return {
        "cluster": "LocalCluster(processes=False, n_workers=W, threads_per_worker=1)",
        "steps": steps,
        "elements_per_chunk": n,
        "delays_s": dict(delays),
        "wall_s": {side: {str(w): t for w, t in ts.items()} for side, ts in walls.items()},
        "efficiency": {
            side: {str(w): ts[widths[0]] / t for w, t in ts.items()} for side, ts in walls.items()
        },
        "target": ">= 0.9 (aioengine, 100 ms), and >= dask.array's at 20 ms",
    }


async def out_of_process(args: argparse.Namespace, address: str) -> dict[str, Any]:
    """The measurements on the command-line cluster at ``address``."""
    cpu = await client_cpu(
        address, 8 if args.quick else args.cpu_chunks, 5 if args.quick else args.cpu_steps, 512
    )
    total = args.sum_bytes or (16 << 20 if args.quick else 1 << 30)
    moved = await sum_bytes(address, total, 1 << 20 if args.quick else 8 << 20)
    where = "dask scheduler + dask worker --nworkers 2 --nthreads 1 (processes)"
    return {
        "client_cpu": {
            "cluster": where,
            **cpu,
            "target": "array ops <= value_op_us, reported beside client_submit_us",
        },
        "sum_bytes": {"cluster": where, **moved, "target": "one partial per chunk, not the array"},
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
    if args.quick:
        scaling = await weak_scaling(
            [1, 2],
            5,
            [("aioengine_20ms", 0.02), ("aioengine_pinned_20ms", 0.02), ("dask_20ms", 0.02)],
        )
    else:
        scaling = await weak_scaling(
            [1, 2, 4, 8, 16],
            args.ws_steps,
            [
                ("aioengine_100ms", 0.1),
                ("aioengine_pinned_100ms", 0.1),
                ("aioengine_20ms", 0.02),
                ("aioengine_pinned_20ms", 0.02),
                ("dask_20ms", 0.02),
                ("dask_100ms", 0.1),
            ],
        )
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
        "weak_scaling": scaling,
        "versions": {
            "numpy": np.__version__,
            "distributed": distributed.__version__,
            "python": sys.version.split()[0],
        },
    }


def report(out: dict[str, Any]) -> str:
    s, t = out["stencil"], out["tasks_per_chunk"]
    c, b, ws = out["client_cpu"], out["sum_bytes"], out["weak_scaling"]
    med = s["median_wall_s"]
    scaling = [
        f"    {side}: "
        + ", ".join(f"W={w} {e:.0%} ({ws['wall_s'][side][w]:.2f} s)" for w, e in effs.items())
        for side, effs in ws["efficiency"].items()
    ]
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
            f"  client CPU per chunk operation, {c['chunks']} chunks x {c['steps']} steps on "
            f"{c['cluster']}: remote array stencil step {c['array_stencil_us_per_chunk_step']:.0f}"
            f" us ({c['array_stencil_ops_per_chunk_step']:.2f} engine ops), fused chain step "
            f"{c['array_chain_us_per_chunk_step']:.0f} us "
            f"({c['array_chain_ops_per_chunk_step']:.2f} engine ops); engine remote value op "
            f"{c['value_op_us']:.0f} us; client.submit {c['client_submit_us']:.0f} us",
            f"  bytes through the client for float(xp.sum(x)), {b['array_bytes']} bytes in "
            f"{b['chunks']} chunks: read {b['sum_read_bytes']}, written "
            f"{b['sum_written_bytes']} (chunks x partial: {b['chunks_times_partial_bytes']}); "
            f"creating it on the workers: read {b['create_read_bytes']}, written "
            f"{b['create_written_bytes']}",
            f"  weak scaling, simulated, {ws['steps']} steps, efficiency T(1)/T(W) on "
            f"{ws['cluster']}:",
            *scaling,
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reduced sizes (smoke)")
    parser.add_argument("--chunks", type=int, default=64, help="chunks of the array (64)")
    parser.add_argument("--steps", type=int, default=100, help="stencil steps (100)")
    parser.add_argument("--reps", type=int, default=2, help="timed pairs (sides alternate)")
    parser.add_argument("--cpu-chunks", type=int, default=64, help="client CPU: chunks (64)")
    parser.add_argument("--cpu-steps", type=int, default=20, help="client CPU: steps (20)")
    parser.add_argument("--sum-bytes", type=int, default=0,
                        help="bytes of the summed array (1 GiB; --quick: 16 MiB)")  # fmt: skip
    parser.add_argument("--ws-steps", type=int, default=50, help="weak scaling: steps (50)")
    parser.add_argument("--out", help="JSON output (default: results/arrays-cluster.json, or "
                        "results/quick/ with --quick)")  # fmt: skip
    ns = parser.parse_args()
    result = asyncio.run(main(ns))
    # This process is the client only: the scheduler and the workers are processes of their own.
    with command_line_cluster(2) as scheduler_address:
        result.update(asyncio.run(out_of_process(ns, scheduler_address)))
    print(report(result))
    path = ns.out or os.path.join(RESULTS, *(["quick"] if ns.quick else []), "arrays-cluster.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
