"""Remote operations against hand-written Dask, on the same cluster, in one run.

Four measurements (``docs/howto/cluster.md`` describes the mechanism):

* ``dag``: a seeded random DAG of value operations over Vars (each reads 1-3 Vars and writes
  one), each about 2 ms of NumPy, pushed with ``engine.submit(..., ctx=ae.remote())``, against
  the same DAG written by hand with ``client.submit`` and futures as arguments (the same
  edges). Both are timed from the first submission until every operation has finished, and
  the final values must agree.
* ``chain``: N dependent value operations on one Var, against Dask's own submit-everything
  chain; beside them, the submit-then-await pattern (one round trip per step) that a program
  without the engine's versions would need.
* ``independent``: N operations on N Vars against ``client.map``.
* ``overhead``: the engine's client-side cost per remote operation, in µs: the time from the
  first push until every operation (no Var inputs, so nothing to scatter) has been sent to
  Dask, per operation (``engine_us``), beside what Dask's client itself takes per task for the
  same tasks, sent one ``client.submit`` each (``submit_us``) or by one ``client.map``
  (``map_us``); ``per_op_us`` is what the engine adds to the latter (the engine sends the
  value operations pushed in one loop iteration as one graph, as ``client.map`` does);
  ``total_added_us``, what it adds over the whole life of an operation (sent, run, and
  completed: until ``wait_for_all()``), against ``client.map`` and ``distributed.wait``.
* ``tracked``: the objects the garbage collector tracks per *pending* remote operation: N
  value operations wait on the cluster (each reads the version of a gate operation that
  blocks on a ``distributed.Event``) while the collector's objects are counted, beside the
  same N tasks sent by ``client.map`` and by ``client.submit`` with the gate's future as
  argument. Every figure includes Dask's share (the client's future and its state, and the
  scheduler's records, in this process); ``added`` is the engine's minus ``client.map``'s:
  what the engine adds per operation.

``--busy [N]`` runs N processes (default: one per core) beside the benchmark, each spinning in
a pure-Python loop from after the calibration to the end, as other work on a shared machine
would: the client's costs then compete for the CPU with them (the issue's figures on a busy
machine).

Each shape is timed ``--reps`` times (4) on each side, the two sides taking turns at going
first, each side starting on an idle cluster (:func:`settle`); the ratio reported is the median
of the pairs' ratios, with every pair's ratio beside it. On a small machine the cluster's own
work (scheduler, worker and client share the process and its GIL) dominates the time, and a
single pair's ratio moves by 10-15 %.

Run: python benchmarks/remote.py [--quick] [--busy [N]] [--reps N] [--scheduler ADDRESS]
[--json PATH]
(``nox -s bench`` runs it). Timings are printed, never asserted: the targets (aioengine's time
at most 1.1x Dask's) are judged by a person, on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import distributed
import numpy as np

import aioengine as ae

_SIZE = 48  # arrays of _SIZE x _SIZE floats: small, so the transfers stay cheap


def _kernel(x: np.ndarray, rounds: int) -> np.ndarray:
    m = np.full((_SIZE, _SIZE), 1.0 / _SIZE)
    for _ in range(rounds):
        x = np.tanh(x @ m + 0.01)
    return x


def work(rounds: int, *inputs: np.ndarray) -> np.ndarray:
    """One operation: about 2 ms of NumPy (``rounds`` is calibrated) on the sum of its inputs;
    a new array (value operations never modify their inputs)."""
    return _kernel(sum(inputs[1:], inputs[0]), rounds)


def calibrate(target_s: float = 0.002) -> int:
    """The ``rounds`` that make :func:`work` take about ``target_s`` here."""
    x = np.ones((_SIZE, _SIZE))
    rounds = 8
    while True:
        t0 = time.perf_counter()
        for _ in range(5):
            work(rounds, x)
        each = (time.perf_counter() - t0) / 5
        if each >= target_s / 2 or rounds > 1 << 16:
            return max(1, round(rounds * target_s / each))
        rounds *= 2


def random_dag(n_ops: int, n_vars: int, seed: int) -> list[tuple[tuple[int, ...], int]]:
    rng = random.Random(seed)
    return [
        (tuple(rng.sample(range(n_vars), rng.randint(1, 3))), rng.randrange(n_vars))
        for _ in range(n_ops)
    ]


def initial(n_vars: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((_SIZE, _SIZE)) for _ in range(n_vars)]


async def dag_engine(
    cluster: Any, dag: list[tuple[tuple[int, ...], int]], n_vars: int, rounds: int
) -> tuple[float, list[np.ndarray], float]:
    async with ae.Engine(cluster=cluster) as engine:
        xs = [engine.new_var(f"x{i}", value=v) for i, v in enumerate(initial(n_vars))]
        await engine.submit(work, rounds, xs[0], ctx=ae.remote())  # connected, warmed
        remote = ae.remote()
        c0 = time.process_time()
        t0 = time.perf_counter()
        for reads, write in dag:
            engine.submit(work, rounds, *(xs[r] for r in reads), out=xs[write], ctx=remote)
        await engine.wait_for_all()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        values = [await x.get() for x in xs]
    return wall, values, cpu


async def dag_dask(
    client: Any, dag: list[tuple[tuple[int, ...], int]], n_vars: int, rounds: int
) -> tuple[float, list[np.ndarray], float]:
    current = [await client.scatter(v, hash=False) for v in initial(n_vars)]
    await client.submit(work, rounds, current[0], pure=False)
    c0 = time.process_time()
    t0 = time.perf_counter()
    futures = []
    for reads, write in dag:
        fut = client.submit(work, rounds, *(current[r] for r in reads), pure=False)
        current[write] = fut
        futures.append(fut)
    await distributed.wait(futures)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return wall, await client.gather(current), cpu


def inc(x: int) -> int:
    """One step of the chain."""
    return x + 1


async def chain_engine(cluster: Any, n: int) -> float:
    async with ae.Engine(cluster=cluster) as engine:
        x = engine.new_var("x", value=0)
        await engine.submit(inc, x, ctx=ae.remote())
        t0 = time.perf_counter()
        for _ in range(n):
            engine.submit(inc, x, out=x, ctx=ae.remote())
        assert await x.get() == n
        return time.perf_counter() - t0


async def chain_dask(client: Any, n: int) -> float:
    t0 = time.perf_counter()
    fut = client.submit(inc, 0, pure=False)
    for _ in range(n - 1):
        fut = client.submit(inc, fut, pure=False)
    assert await fut == n
    return time.perf_counter() - t0


async def chain_round_trips(client: Any, n: int) -> float:
    t0 = time.perf_counter()
    value = 0
    for _ in range(n):
        value = await client.submit(inc, value, pure=False)
    return time.perf_counter() - t0


async def independent_engine(cluster: Any, n: int, rounds: int) -> float:
    async with ae.Engine(cluster=cluster) as engine:
        src = engine.new_var("src", value=initial(1)[0])
        outs = [engine.new_var(f"o{i}") for i in range(n)]
        await engine.submit(work, rounds, src, ctx=ae.remote())
        t0 = time.perf_counter()
        for o in outs:
            engine.submit(work, rounds, src, out=o, ctx=ae.remote())
        await engine.wait_for_all()
        return time.perf_counter() - t0


async def independent_dask(client: Any, n: int, rounds: int) -> float:
    src_f = await client.scatter(initial(1)[0], hash=False)
    t0 = time.perf_counter()
    futures = client.map(work, [rounds] * n, [src_f] * n, pure=False)
    await distributed.wait(futures)
    return time.perf_counter() - t0


async def overhead(cluster: Any, client: Any, n: int, reps: int) -> dict[str, float]:
    """The client-side cost per operation (see the module docstring): the median of ``reps``
    measurements of each figure, each of ``n`` operations."""

    def ident(x: int) -> int:
        return x

    engine: list[float] = []
    submit: list[float] = []
    mapped: list[float] = []
    engine_total: list[float] = []
    map_total: list[float] = []
    for _ in range(reps):
        async with ae.Engine(cluster=cluster) as eng:
            xs = [eng.new_var(f"x{i}") for i in range(n)]
            await eng.submit(ident, 1, ctx=ae.remote())
            t0 = time.perf_counter()
            ops = [eng.submit(ident, i, out=x, ctx=ae.remote()) for i, x in enumerate(xs)]
            # Submitted: a value operation drops its task reference once its Dask task exists
            # (collected into the loop iteration's graph, sent at the next iteration).
            await _until_sent(ops[-1])
            engine.append(time.perf_counter() - t0)
            await eng.wait_for_all()
            engine_total.append(time.perf_counter() - t0)
            del ops
        await settle(client)
        t0 = time.perf_counter()
        futures = [client.submit(ident, i, pure=False) for i in range(n)]
        submit.append(time.perf_counter() - t0)
        await distributed.wait(futures)
        del futures
        await settle(client)
        t0 = time.perf_counter()
        futures = client.map(ident, range(n), pure=False)
        mapped.append(time.perf_counter() - t0)
        await distributed.wait(futures)
        map_total.append(time.perf_counter() - t0)
        del futures
        await settle(client)
    engine_s, submit_s, map_s = (statistics.median(x) for x in (engine, submit, mapped))
    return {
        "per_op_us": (engine_s - map_s) / n * 1e6,
        "engine_us": engine_s / n * 1e6,
        "submit_us": submit_s / n * 1e6,
        "map_us": map_s / n * 1e6,
        "engine_us_runs": [round(x / n * 1e6, 1) for x in engine],
        # From the first push (the client.map call) until every operation has completed
        # (wait_for_all; distributed.wait): the same tasks on the same cluster, so the
        # difference is what the engine's client side adds over a whole operation's life
        # (sending and completing), per operation.
        "total_added_us": (statistics.median(engine_total) - statistics.median(map_total))
        / n
        * 1e6,
    }


def gate(name: str) -> int:
    """A task that blocks until the ``distributed.Event`` ``name`` is set (on a worker)."""
    distributed.Event(name).wait()
    return 0


def _counted() -> int:
    gc.collect()
    return len(gc.get_objects())


async def _until_sent(op: Any) -> None:
    """Return once value operation ``op`` (and those pushed before it) reached Dask."""
    while op.state < ae.OpState.RUNNING or op.task is not None:  # noqa: ASYNC110
        await asyncio.sleep(0)
    await asyncio.sleep(0)  # the graph is sent


async def tracked(cluster: Any, client: Any, n: int) -> dict[str, float]:
    """Objects the collector tracks per pending remote operation: the engine's, and those of
    the same tasks sent by ``client.map`` and by ``client.submit``; counted once the loop has
    run what the sending queued (the scheduler, in this process, then holds its share of
    each task, on both sides)."""

    def ident(x: Any) -> Any:
        return x

    async def counted_after(sent: Awaitable[Any]) -> int:
        await sent
        await asyncio.sleep(0.1)  # the loop runs what the sending queued
        return _counted()

    async with ae.Engine(cluster=cluster) as engine:
        g = engine.new_var("g")
        xs = [engine.new_var(f"x{i}") for i in range(n)]
        for i, x in enumerate(xs):  # each Var written once already: a program's steady state
            engine.submit(ident, i, out=x, ctx=ae.remote())
        await engine.wait_for_all()
        name = f"gate-{time.monotonic_ns()}"
        engine.submit(gate, name, out=g, ctx=ae.remote())
        base = _counted()
        ops = [engine.submit(ident, g, out=x, ctx=ae.remote()) for x in xs]
        last = ops[-1]
        del ops
        engine_n = await counted_after(_until_sent(last))
        del last
        await distributed.Event(name, client=client).set()
        await engine.wait_for_all()
    results = {"engine": (engine_n - base) / n}
    for how in ("map", "submit"):
        await settle(client)
        name = f"gate-{time.monotonic_ns()}"
        gate_f = client.submit(gate, name, pure=False)
        base = _counted()
        if how == "map":
            futures = client.map(ident, [gate_f] * n, pure=False)
        else:
            futures = [client.submit(ident, gate_f, pure=False) for _ in range(n)]
        results[how] = (await counted_after(asyncio.sleep(0)) - base) / n
        await distributed.Event(name, client=client).set()
        await distributed.wait(futures)
        del futures, gate_f
    results["added"] = results["engine"] - results["map"]
    return results


async def settle(client: Any) -> None:
    """Wait until the scheduler holds no task, then collect garbage: each timed side starts on
    an idle cluster, not while the previous side's keys are still being released (which slowed
    whichever side went second by 10-20 %). On a shared scheduler (``--scheduler``) whose
    other clients keep tasks, it gives up waiting after 30 seconds."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:  # polls a count on the scheduler: no event to await
        if await client.run_on_scheduler(_scheduler_tasks) == 0:
            break
        await asyncio.sleep(0.02)
    gc.collect()


def _scheduler_tasks(dask_scheduler: Any) -> int:
    return len(dask_scheduler.tasks)


async def pairs(
    client: Any,
    reps: int,
    engine_side: Callable[[], Awaitable[Any]],
    dask_side: Callable[[], Awaitable[Any]],
) -> tuple[list[Any], list[Any]]:
    """``reps`` timings of each side, the sides taking turns at going first."""
    engine_runs: list[Any] = []
    dask_runs: list[Any] = []
    for rep in range(reps):
        sides = [(engine_side, engine_runs), (dask_side, dask_runs)]
        for side, runs in sides if rep % 2 == 0 else sides[::-1]:
            await settle(client)
            runs.append(await side())
    return engine_runs, dask_runs


def summary(engine_runs: list[float], dask_runs: list[float]) -> dict[str, Any]:
    ratios = [e / d for e, d in zip(engine_runs, dask_runs, strict=True)]
    return {
        "engine_s": statistics.median(engine_runs),
        "dask_s": statistics.median(dask_runs),
        "ratio": statistics.median(ratios),
        "ratios": [round(r, 3) for r in ratios],
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    n_ops, n_vars = (400, 40) if quick else (2000, 200)
    n_chain = 50 if quick else 200
    n_independent = 400 if quick else 2000
    reps = 1 if quick else args.reps
    rounds = calibrate()  # before the spinner starts: the same work, quiet or busy
    spawn = multiprocessing.get_context("spawn")
    spinners = [spawn.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for spinner in spinners:
        spinner.start()
    cluster: Any
    own = None
    if args.scheduler is None:
        own = cluster = await distributed.LocalCluster(
            processes=False, dashboard_address=":0", asynchronous=True
        )
    else:
        cluster = args.scheduler
    results: dict[str, Any] = {
        "rounds": rounds,
        "quick": quick,
        "reps": reps,
        "busy": args.busy,
        "gc_enabled": gc.isenabled(),
        "gc_frozen": gc.get_freeze_count(),
    }
    try:
        # The default client: distributed.wait() looks it up.
        async with distributed.Client(cluster, asynchronous=True) as client:
            dag = random_dag(n_ops, n_vars, seed=1)
            engine_runs, dask_runs = await pairs(
                client,
                reps,
                lambda: dag_engine(cluster, dag, n_vars, rounds),
                lambda: dag_dask(client, dag, n_vars, rounds),
            )
            pairs_ = zip(engine_runs[0][1], dask_runs[0][1], strict=True)
            same = all(np.array_equal(a, b) for a, b in pairs_)
            results["dag"] = {
                "ops": n_ops,
                "vars": n_vars,
                **summary([r[0] for r in engine_runs], [r[0] for r in dask_runs]),
                "same_values": same,
                # CPU time of the whole process (client, scheduler and in-process workers)
                # per operation, the engine's minus Dask's: median over the pairs.
                "cpu_us_added": statistics.median(
                    (e[2] - d[2]) / n_ops * 1e6 for e, d in zip(engine_runs, dask_runs, strict=True)
                ),
            }
            chain_runs = await pairs(
                client,
                reps,
                lambda: chain_engine(cluster, n_chain),
                lambda: chain_dask(client, n_chain),
            )
            await settle(client)
            results["chain"] = {
                "ops": n_chain,
                **summary(*chain_runs),
                "submit_then_await_s": await chain_round_trips(client, n_chain),
            }
            independent_runs = await pairs(
                client,
                reps,
                lambda: independent_engine(cluster, n_independent, rounds),
                lambda: independent_dask(client, n_independent, rounds),
            )
            results["independent"] = {"ops": n_independent, **summary(*independent_runs)}
            await settle(client)
            results["overhead"] = {"ops": 500, **await overhead(cluster, client, 500, 5)}
            await settle(client)
            results["tracked"] = {"ops": 1000, **await tracked(cluster, client, 1000)}
    finally:
        if own is not None:
            await own.close()
        for spinner in spinners:
            spinner.terminate()
            spinner.join()
    return results


def spin() -> None:
    """The ``--busy`` process: a pure-Python loop that never sleeps, until terminated."""
    n = 0
    while True:
        n += 1


def report(results: dict[str, Any]) -> str:
    lines = [
        f"remote operations vs Dask (work: {results['rounds']} rounds, ~2 ms; "
        f"{f'busy: {b} spinning processes beside it' if (b := results['busy']) else 'quiet'}; "
        f"collector "
        f"{'on' if results['gc_enabled'] else 'off'}, {results['gc_frozen']} frozen)"
    ]
    for name in ("dag", "chain", "independent"):
        r = results[name]
        lines.append(
            f"  {name:12} {r['ops']:5} ops: aioengine {r['engine_s']:.3f} s, "
            f"dask {r['dask_s']:.3f} s, ratio {r['ratio']:.2f}x "
            f"(pairs: {', '.join(f'{x:.2f}' for x in r['ratios'])})"
        )
    lines.append(
        f"  dag values equal: {results['dag']['same_values']}; process CPU per op, aioengine "
        f"minus dask: {results['dag']['cpu_us_added']:.0f} µs"
    )
    c = results["chain"]
    lines.append(f"  chain, submit-then-await by hand: {c['submit_then_await_s']:.3f} s")
    o = results["overhead"]
    lines.append(
        f"  client side per remote op: aioengine {o['engine_us']:.0f} µs, dask client.submit "
        f"{o['submit_us']:.0f} µs, client.map {o['map_us']:.0f} µs: the engine adds "
        f"{o['per_op_us']:.0f} µs (aioengine runs: {o['engine_us_runs']}); sent, run and "
        f"completed: the engine adds {o['total_added_us']:.0f} µs to client.map's"
    )
    t = results["tracked"]
    lines.append(
        f"  tracked objects per pending remote op: aioengine {t['engine']:.1f}, dask client.map "
        f"{t['map']:.1f}, client.submit {t['submit']:.1f}: the engine adds {t['added']:.1f}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reduced sizes (smoke)")
    parser.add_argument("--scheduler", help="a Dask scheduler address (default: LocalCluster)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--reps", type=int, default=4, help="timed pairs per shape (the sides alternate first)"
    )
    parser.add_argument(
        "--busy",
        type=int,
        nargs="?",
        const=os.cpu_count() or 1,
        default=0,
        metavar="N",
        help="run N CPU-bound processes beside it (a busy machine; default N: one per core)",
    )
    ns = parser.parse_args()
    out = asyncio.run(main(ns))
    print(report(out))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(out, f, indent=2)
