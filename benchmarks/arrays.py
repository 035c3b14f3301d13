"""Engine-backed arrays (``aioengine.array``) against NumPy, numexpr, MXNet's NDArray, JAX and
dask.array.

Twelve measurements, each peer side by side in one run (the ratios are taken within the run):

* ``tiny``: a chain of 20,000 ``c = c + b`` on 4-element float64 arrays, awaited at the end:
  what one operation costs when there is no work in it. Peers: aioengine arrays
  (``namespace(engine)`` in ``async with ae.Engine()``, ``await c`` at the end), MXNet 1.9.1's
  ``mx.nd`` NDArray (``wait_to_read()`` at the end; in the MXNet venv that ``run.py`` builds,
  ``.venv-mxnet``), JAX's eager dispatch on the CPU (``jax.numpy`` with float64 enabled,
  ``block_until_ready()`` at the end), NumPy (the floor: no engine at all) and, for
  information, the blocking namespace ``aioengine.array_api`` called from a plain thread.
  MXNet and JAX each run in a process of their own that stays up for the whole benchmark and
  times one chain per request, so the peers take turns (the first to go rotating from one
  repetition to the next) while JAX's and MXNet's runtime threads stay out of this process.
  Each chain is preceded by an untimed 500-operation warm-up in the same process; the figure
  is the best of the repetitions (the median is in the JSON). Targets: aioengine >= 4x
  MXNet's operations per second and >= 1.5x JAX's.
* ``branches``: four independent chains of 20 elementwise operations (``sin``, ``* 1.0001``,
  ``+ 0.5``, ``cos``, repeated) on 8 MB float64 arrays (1M elements): aioengine arrays on
  ``Engine(cpu_workers=2)`` against plain NumPy running the chains one after the other and
  against the same program in ``dask.array`` (``dask.compute(..., scheduler="threads",
  num_workers=2)``; one, two and four chunks per array, the best reported). dask's graph
  construction is timed (it is where a dask user pays for what the engine does at push time);
  its arrays are made with ``name=False``, so no 8 MB input is hashed. Beside them, for
  reference, what two threads can do on this machine: each chain whole on a thread of a plain
  ``ThreadPoolExecutor(2)`` (``threads-floor``). Every peer's four results must equal NumPy's.
  Targets: >= 1.6x NumPy, >= 1.2x the best dask.
* ``overlap``: a coroutine producer awaits simulated I/O (``asyncio.sleep``) before each chunk
  and pushes a chain of array operations on it; a consumer awaits each chunk's result and
  sums it. The I/O takes 1 s in all (50 chunks of 2 MB, 20 ms each), and so does the compute
  on the engine's two workers: the operations per chunk are calibrated so that NumPy, on one
  core, takes 2 s for all of them. The run's time is compared with the larger of "I/O
  alone" (the same program without the array operations) and "compute alone" (without the
  sleeps), all three on the engine; a 1 ms ``asyncio.sleep`` heartbeat measures the event
  loop's lag throughout. For reference, the same program with NumPy called in the producer
  coroutine (the loop blocked while it computes). Targets: time <= 1.15x max(I/O alone,
  compute alone); lag p99 <= 5 ms.
* ``memory``: ``a = a * 0.5 + 1`` on 1 MB arrays (131,072 float64), 100,000 iterations,
  ``await a`` every 256, in a fresh process: the growth of the resident set (peak, sampled by
  a thread every 2 ms, minus the RSS after a warm-up). Beside it the same loop on
  ``Engine(max_pending=512)`` with ``await engine.wait_for_capacity()`` each iteration instead
  of the periodic ``await``. The run stops early (and says so) if the growth passes 2 GiB.
  Target: growth <= 64 MiB.

The programs of issue 45 ("arrays faster than NumPy on the programs people write"). Each is
written once against ``xp``; the peers take turns (the first to go rotating from one
repetition to the next), every result is checked against NumPy's, and the figure is the
median of the repetitions; a ratio ``vs X`` is X's time over the peer's within each
repetition, the median of those (> 1: faster than X). The async peer (``aioengine``) is
``namespace(engine)`` on an ``Engine()`` with default settings whose loop runs on a thread of
its own for the whole measurement (each run timed inside its coroutine, ``await`` at the end);
``aioengine.array_api`` is the synchronous namespace (``np.asarray`` / ``float`` at the end).
Inputs are made, and awaited, before the clock starts.

* ``chain``: the 10-step elementwise chain ``c = a * 1.5 + b; c = c * c - a; c =
  xp.sqrt(xp.abs(c)) + 2.0; c = c * b - a * 0.5; c = xp.exp(-c * c) + c`` on 1e3, 2e4, 1e5,
  1e6 and 8e6 float64 elements (the issue's three sizes, and two mid sizes of one chunk each;
  a run times ``200,000 // n`` chains, at least three, each awaited before the next; at 1e6
  and 8e6 a run follows an untimed one of the same peer, so that no peer is timed waking the
  cores the one before it left idle). Peers: NumPy (the same code), numexpr (one
  ``evaluate`` per statement, its default threads) and, from 1e6 elements, the physical floor
  (``floor``): ``np.add(a_chunk, b_chunk, out=out_chunk)`` on a ``ThreadPoolExecutor`` of
  ``os.cpu_count()`` threads, i.e. the inputs read once and a fresh output written once on
  every core. Results equal NumPy's to ``rtol=1e-12`` (``atol``: 1e-12 times the largest
  magnitude, for the elements that a cancellation leaves near zero). Targets: >= 3x NumPy and
  >= 1x numexpr at 1e6 and 8e6; at 1e3 <= 3x NumPy's time; the synchronous namespace within
  1.2x of the async one's time at every size (the mid sizes have no other target: they are
  reported to show where the engine stands between the issue's sizes).
* ``reductions``: ``xp.sum(a * b)`` and ``xp.mean((a - b) ** 2)`` on 8e6 float64; peers NumPy
  and numexpr (``sum(a * b)``; numexpr has no ``mean``: ``sum((a - b) ** 2)`` over n).
  Results equal NumPy's to ``rtol=1e-10`` (the peers sum in different orders). Target: >= 2.5x
  NumPy.
* ``chain_memory``: the peak memory of the 8e6 chain above its inputs (``tracemalloc``, started
  once the inputs exist and a 1,000-element warm-up chain ran), as a multiple of the result's
  size (61 MiB), a fresh process per peer (aioengine, array_api, NumPy, numexpr). tracemalloc
  traces every thread's NumPy allocations: each process checks that it sees an array made on
  another thread, and a peak below the result's size is reported as invisible allocations.
  Target: <= 1.25x (NumPy: 3x).
* ``chain_lag``: the event loop's lag (a 1 ms ``asyncio.sleep`` heartbeat, as in ``overlap``)
  while five 8e6 chains run back to back on the engine, each awaited; beside it, for
  reference, NumPy called in the coroutine. The worst p99 of three runs. Target: <= 5 ms.
* ``chain_busy``: does a chain start without a sync point? The 1e6 and 8e6 chain pushed on a
  fresh engine (a fresh ``asyncio.run`` per run), then, without awaiting, ``c.ready`` polled
  in a pure-Python loop (``spin``) or between 0.5 ms ``time.sleep`` calls (``sleep``); for
  reference the chain awaited at once (``awaited``). The time from the first operation's push
  until an operation of the chain was first seen running or done (``began_s``: the engine's
  statistics, polled in the same loop; the issue asks for 1 ms) and until the value is ready
  (capped at 2 s: "never"), median of 5, the modes taking turns, and each mode's time over
  ``awaited``'s and its excess (``late``) within each repetition; every value checked against
  NumPy's. Under the GIL a worker takes the GIL from a spinning caller only after the
  interpreter's switch interval (5 ms), so a chain that starts without a sync point and runs
  at full speed is late by at most about 7 ms; where the machine has no core to spare, the
  spinning caller also takes one from the workers, and ``late`` includes that. Target:
  ``spin`` late by <= 7 ms.
* ``mlp``: a 2-layer MLP (64 -> 128 tanh -> 1, mean squared error), 200 steps of full-batch
  gradient descent on 20,000 x 64 float64 samples (fixed seed), the loss read every 20 steps
  (as a training loop that logs does) and the final weights' loss at the end, on NumPy, the
  async namespace and ``aioengine.array_api``, default BLAS settings (OpenBLAS's own thread
  count; threadpoolctl reports it in the versions); the losses equal NumPy's to ``rtol=1e-9``.
  ``mlp_two``: two such models (seeds 7 and 8) trained at once on the engine (two coroutines;
  on ``array_api``, their steps interleaved in one loop) against NumPy training them in turn.
  Median of 3. Targets: >= 1x NumPy (async and synchronous); two at once >= 1.6x NumPy in turn.
* ``kmeans``: ``examples/arrays.py`` at its default size (200,000 points, 4 restarts), its
  ``on_engine()`` against its ``on_numpy()`` (imported from the example, timed in turns in a
  process of their own with default BLAS threads, as a user runs it), checked as its ``main()``
  checks them. Median of 3. Target: >= 1.5x NumPy.

``--busy [N]`` runs N CPU-bound processes (default 1), each spinning in a pure-Python loop,
beside the whole run: the busy-machine figures.

``--quick`` (the smoke run in ``nox -s bench_smoke``) shrinks everything: 2,000-operation
chains, 1 MB arrays, 0.1 s of I/O, 2,000 iterations, chains of 1e3, 1e5 and 1e6 elements,
1e6-element reductions, memory, lag and chain_busy, a 2,000-sample MLP for 20 steps, the
example's small k-means, two repetitions (one for overlap, chain_lag and kmeans).

Usage::

    python benchmarks/arrays.py                 # everything (about 20 minutes on 2 cores)
    python benchmarks/arrays.py --quick         # smoke: small sizes, under a minute
    python benchmarks/arrays.py --only tiny,branches --reps 9
    python benchmarks/arrays.py --only chain,mlp,mlp_two --busy --no-mxnet

Prints the peers' figures and a table of the targets; writes ``benchmarks/results/arrays.json``
(``--out``). Timings are reported, never judged: the exit status is 1 only when a result is
wrong or a peer crashed. MXNet is skipped, with a note, when its venv cannot be made
(``--no-mxnet`` skips it outright); JAX and numexpr when they do not import. The versions
say which aioengine ran (this tree's sources, or an installed one, which takes precedence)
and which BLAS, with its thread count.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
OUT = BENCH / "results" / "arrays.json"
# Where --quick writes by default: an ignored folder (.gitignore), never the committed figures.
QUICK_OUT = BENCH / "results" / "quick" / "arrays.json"
WARMUP_OPS = 500  # untimed operations before each timed chain, in the chain's own process
HEARTBEAT_S = 0.001
SHAPES = (
    "tiny",
    "branches",
    "overlap",
    "memory",
    "chain",
    "reductions",
    "chain_memory",
    "chain_lag",
    "chain_busy",
    "mlp",
    "mlp_two",
    "kmeans",
)
CHILD_TIMEOUT_S = 600.0  # a peer process that answers no request in this long is killed

# The elementwise step of ``branches`` and ``overlap``, cycled: ``xp`` is numpy, dask.array
# or an aioengine namespace; ``y`` one of its arrays. Bounded values: sin and cos keep every
# element in [-1, 1], the affine steps barely move it.


def _sin(xp: Any, y: Any) -> Any:
    return xp.sin(y)


def _scale(xp: Any, y: Any) -> Any:
    return y * 1.0001


def _shift(xp: Any, y: Any) -> Any:
    return y + 0.5


def _cos(xp: Any, y: Any) -> Any:
    return xp.cos(y)


STEPS: tuple[Callable[[Any, Any], Any], ...] = (_sin, _scale, _shift, _cos)


def chain(xp: Any, y: Any, n_ops: int) -> Any:
    """``n_ops`` elementwise operations on ``y``, the steps of :data:`STEPS` in turn."""
    for i in range(n_ops):
        y = STEPS[i % len(STEPS)](xp, y)
    return y


def _clock() -> tuple[float, float]:
    """Wall and CPU (every thread of this process) clocks, after a collection: the timed region
    does not pay for the garbage of the setup before it."""
    gc.collect()
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    return time.perf_counter() - start[0], time.process_time() - start[1]


def _timing(start: tuple[float, float], value: Any) -> dict[str, Any]:
    wall, cpu = _since(start)
    return {"wall_s": wall, "cpu_s": cpu, "value": np.asarray(value).tolist()}


# --------------------------------------------------------------------------------------------
# tiny: one chain of ``c = c + b`` per peer


def tiny_numpy(n_ops: int, size: int) -> dict[str, Any]:
    b, c = np.ones(size), np.zeros(size)
    for _ in range(WARMUP_OPS):
        c = c + b
    c = np.zeros(size)
    start = _clock()
    for _ in range(n_ops):
        c = c + b
    return _timing(start, c)


async def _tiny_aioengine(n_ops: int, size: int) -> dict[str, Any]:
    import aioengine as ae
    from aioengine.array import namespace

    async with ae.Engine() as engine:
        xp = namespace(engine)
        b = xp.asarray(np.ones(size))
        c = xp.asarray(np.zeros(size))
        for _ in range(WARMUP_OPS):
            c = c + b
        await c
        c = xp.asarray(np.zeros(size))
        start = _clock()
        for _ in range(n_ops):
            c = c + b
        value = await c
        timing = _timing(start, value)
        await engine.wait_for_all()
    return timing


def tiny_aioengine(n_ops: int, size: int) -> dict[str, Any]:
    return asyncio.run(_tiny_aioengine(n_ops, size))


def tiny_array_api(n_ops: int, size: int) -> dict[str, Any]:
    """The blocking namespace, from this (non-loop) thread: its engine runs on its own thread."""
    import aioengine.array_api as xp

    b = xp.asarray(np.ones(size))
    c = xp.asarray(np.zeros(size))
    for _ in range(WARMUP_OPS):
        c = c + b
    np.asarray(c)
    c = xp.asarray(np.zeros(size))
    start = _clock()
    for _ in range(n_ops):
        c = c + b
    return _timing(start, np.asarray(c))


class _MxnetTiny:
    """MXNet 1.9.1's NDArray (the default ThreadedEnginePerDevice), in the MXNet venv."""

    def __init__(self) -> None:
        import mxnet as mx

        self.mx = mx
        self.version = str(mx.__version__)

    def run(self, n_ops: int, size: int) -> dict[str, Any]:
        nd = self.mx.nd
        b = nd.array(np.ones(size), dtype="float64")
        c = nd.zeros(size, dtype="float64")
        for _ in range(WARMUP_OPS):
            c = c + b
        c.wait_to_read()
        c = nd.zeros(size, dtype="float64")
        c.wait_to_read()
        start = _clock()
        for _ in range(n_ops):
            c = c + b
        c.wait_to_read()
        return _timing(start, c.asnumpy())


class _JaxTiny:
    """JAX's eager dispatch on the CPU backend, float64."""

    def __init__(self) -> None:
        import jax

        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp

        self.jnp = jnp
        self.version = str(jax.__version__)

    def run(self, n_ops: int, size: int) -> dict[str, Any]:
        jnp = self.jnp
        b = jnp.asarray(np.ones(size))
        c = jnp.zeros(size)
        for _ in range(WARMUP_OPS):
            c = c + b
        c.block_until_ready()
        c = jnp.zeros(size)
        c.block_until_ready()
        start = _clock()
        for _ in range(n_ops):
            c = c + b
        c.block_until_ready()
        return _timing(start, np.asarray(c))


class ChildPeer:
    """A peer in a process of its own that times one chain per request: a JSON line in, a JSON
    line out. It starts with a line of its own (its version, or why it cannot run)."""

    def __init__(self, name: str, python: str, kind: str, env: dict[str, str]) -> None:
        self.name = name
        self._stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--child", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
            cwd=BENCH,
        )
        hello = self._answer()
        if "error" in hello:
            self.close()
            raise RuntimeError(hello["error"])
        self.version: str = hello["version"]

    def _answer(self) -> dict[str, Any]:
        """The child's next JSON line (other lines, a library's chatter, are skipped)."""
        assert self.proc.stdout is not None
        timer = threading.Timer(CHILD_TIMEOUT_S, self.proc.kill)
        timer.start()
        try:
            for line in self.proc.stdout:
                if line.startswith("{"):
                    answer: dict[str, Any] = json.loads(line)
                    return answer
        finally:
            timer.cancel()
        self._stderr.seek(0)
        tail = " | ".join(self._stderr.read().strip().splitlines()[-5:])
        raise RuntimeError(f"{self.name}: the process ended (rc={self.proc.wait()}): {tail}")

    def run(self, n_ops: int, size: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"n_ops": n_ops, "size": size}) + "\n")
        self.proc.stdin.flush()
        answer = self._answer()
        if "error" in answer:
            raise RuntimeError(f"{self.name}: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()  # end of requests: the child leaves
            except OSError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


def _serve(kind: str) -> int:
    """A child's loop (``--child mxnet`` / ``--child jax``): time a chain per request."""
    runner: _MxnetTiny | _JaxTiny
    try:
        runner = _MxnetTiny() if kind == "mxnet" else _JaxTiny()
    except Exception as exc:  # the peer is unavailable here: say why, and leave
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 0
    print(json.dumps({"version": runner.version}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = runner.run(request["n_ops"], request["size"])
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
    sys.stdout.flush()
    # MXNet can crash in its static destructors at exit (run.py's runner leaves the same way).
    os._exit(0)


def _start_children(args: argparse.Namespace, notes: list[str]) -> dict[str, ChildPeer]:
    """The MXNet and JAX processes that are available (a note for each that is not)."""
    sys.path.insert(0, str(BENCH))
    import run

    children: dict[str, ChildPeer] = {}
    env = run.child_env()
    if args.no_mxnet:
        notes.append("MXNet skipped (--no-mxnet)")
    else:
        python, note = run.ensure_mxnet(args.mxnet_venv, not args.no_install, retry=False)
        notes.append(note.replace(str(ROOT) + os.sep, ""))
        if python is not None:
            try:
                children["mxnet"] = ChildPeer("mxnet", python, "mxnet", env)
            except RuntimeError as exc:
                notes.append(f"MXNet skipped: {exc}")
    jax_env = dict(env, JAX_PLATFORMS="cpu")
    try:
        children["jax"] = ChildPeer("jax", sys.executable, "jax", jax_env)
    except RuntimeError as exc:
        notes.append(f"JAX skipped: {exc}")
    return children


def bench_tiny(
    args: argparse.Namespace, children: dict[str, ChildPeer], failures: list[str]
) -> dict[str, Any]:
    n_ops, size, reps = args.tiny_ops, 4, args.reps
    peers: dict[str, Callable[[int, int], dict[str, Any]]] = {
        "aioengine": tiny_aioengine,
        "numpy": tiny_numpy,
    }
    for name, child in children.items():
        peers[name] = child.run
    if not args.no_array_api:
        peers["aioengine.array_api"] = tiny_array_api
    expected = np.full(size, float(n_ops))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in peers}
    errors: dict[str, str] = {}
    names = list(peers)
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            if name in errors:
                continue
            try:
                out = peers[name](n_ops, size)
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            if not np.array_equal(np.asarray(out["value"]), expected):
                errors[name] = f"wrong result {out['value']} (expected {expected.tolist()})"
                continue
            runs[name].append(out)
    result: dict[str, Any] = {"n_ops": n_ops, "size": size, "reps": reps, "peers": {}}
    for name, outs in runs.items():
        if name in errors:
            failures.append(f"tiny/{name}: {errors[name]}")
            result["peers"][name] = {"error": errors[name]}
            continue
        rates = [n_ops / o["wall_s"] for o in outs]
        result["peers"][name] = {
            "ops_per_s": max(rates),
            "median_ops_per_s": statistics.median(rates),
            "us_per_op": 1e6 / max(rates),
            "cpu_us_per_op": min(o["cpu_s"] for o in outs) / n_ops * 1e6,
            "runs_ops_per_s": [round(r) for r in rates],
        }
    return result


# --------------------------------------------------------------------------------------------
# branches: four independent chains of elementwise operations


def branches_numpy(inputs: Sequence[np.ndarray], n_ops: int, workers: int) -> Any:
    return [chain(np, x, n_ops) for x in inputs]


def branches_threads(inputs: Sequence[np.ndarray], n_ops: int, workers: int) -> Any:
    """The floor of what ``workers`` threads can do here: each chain, whole, on a thread of a
    plain pool (NumPy releases the GIL in the ufuncs)."""
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda x: chain(np, x, n_ops), inputs))


def branches_aioengine(inputs: Sequence[np.ndarray], n_ops: int, workers: int) -> Any:
    async def main() -> list[np.ndarray]:
        import aioengine as ae
        from aioengine.array import namespace

        async with ae.Engine(cpu_workers=workers) as engine:
            xp = namespace(engine)
            await chain(xp, xp.asarray(inputs[0][:1024]), len(STEPS))  # the pool's threads up
            ys = [chain(xp, xp.asarray(x), n_ops) for x in inputs]
            return [await y for y in ys]

    return asyncio.run(main())


def branches_dask(chunks: int) -> Callable[[Sequence[np.ndarray], int, int], Any]:
    def run(inputs: Sequence[np.ndarray], n_ops: int, workers: int) -> Any:
        import dask
        import dask.array as da

        ys = []
        for x in inputs:
            y = da.from_array(x, chunks=-(-len(x) // chunks), name=False)
            ys.append(chain(da, y, n_ops))
        return list(dask.compute(*ys, scheduler="threads", num_workers=workers))

    return run


def bench_branches(args: argparse.Namespace, failures: list[str]) -> dict[str, Any]:
    n, n_ops, reps, workers = args.branch_elements, args.branch_ops, args.reps, args.workers
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(n) for _ in range(4)]
    reference = branches_numpy(inputs, n_ops, workers)
    peers: dict[str, Callable[[Sequence[np.ndarray], int, int], Any]] = {
        "aioengine": branches_aioengine,
        "numpy": branches_numpy,
        "threads-floor": branches_threads,
    }
    try:
        import dask.array  # noqa: F401

        for chunks in (1, 2, 4):
            peers[f"dask-{chunks}chunk"] = branches_dask(chunks)
    except ImportError as exc:
        failures.append(f"branches: dask.array does not import ({exc})")
    walls: dict[str, list[float]] = {name: [] for name in peers}
    exact: dict[str, bool] = {}
    errors: dict[str, str] = {}
    names = list(peers)
    for peer in peers.values():  # imports, thread pools: untimed
        peer([x[:1024] for x in inputs], len(STEPS), workers)
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            if name in errors:
                continue
            try:
                start = _clock()
                outs = peers[name](inputs, n_ops, workers)
                walls[name].append(_since(start)[0])
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            pairs = list(zip(outs, reference, strict=True))
            if not all(np.allclose(a, b, rtol=1e-12, atol=0) for a, b in pairs):
                errors[name] = "results differ from NumPy's"
            exact[name] = exact.get(name, True) and all(np.array_equal(a, b) for a, b in pairs)
            del outs, pairs
    result: dict[str, Any] = {
        "elements": n,
        "mbytes": n * 8 / 1e6,
        "branches": len(inputs),
        "ops_per_branch": n_ops,
        "workers": workers,
        "reps": reps,
        "peers": {},
    }
    for name in peers:
        if name in errors:
            failures.append(f"branches/{name}: {errors[name]}")
            result["peers"][name] = {"error": errors[name]}
            continue
        result["peers"][name] = {
            "wall_s": min(walls[name]),
            "median_wall_s": statistics.median(walls[name]),
            "runs_s": [round(w, 4) for w in walls[name]],
            "bitwise_equal_to_numpy": exact[name],
        }
    return result


# --------------------------------------------------------------------------------------------
# overlap: a coroutine producer with simulated I/O feeding array operations


async def _heartbeat(stop: asyncio.Event, lags: list[float]) -> None:
    """Sleep 1 ms again and again; record how late each wake-up is (the event loop's lag)."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(HEARTBEAT_S)
        lags.append(time.perf_counter() - t - HEARTBEAT_S)


async def _overlap_once(
    mode: str,
    sources: Sequence[np.ndarray],
    n_chunks: int,
    ops_per_chunk: int,
    io_s: float,
    workers: int,
) -> dict[str, Any]:
    """One run: ``mode`` is ``overlap`` (I/O and compute), ``io`` (I/O alone), ``compute``
    (compute alone) or ``numpy-on-loop`` (I/O, and NumPy called in the producer coroutine)."""
    import aioengine as ae
    from aioengine.array import namespace

    async with ae.Engine(cpu_workers=workers) as engine:
        xp = namespace(engine)
        await chain(xp, xp.asarray(sources[0]), len(STEPS))  # the pool's threads up
        queue: asyncio.Queue[Any] = asyncio.Queue()
        sums: list[float] = []

        async def produce() -> None:
            for i in range(n_chunks):
                if mode != "compute":
                    await asyncio.sleep(io_s)  # the chunk's I/O
                src = sources[i % len(sources)]
                if mode == "io":
                    queue.put_nowait(None)
                elif mode == "numpy-on-loop":
                    queue.put_nowait(chain(np, src, ops_per_chunk))
                else:
                    queue.put_nowait(chain(xp, xp.asarray(src), ops_per_chunk))

        async def consume() -> None:
            for _ in range(n_chunks):
                y = await queue.get()
                if y is not None:
                    value = y if isinstance(y, np.ndarray) else await y
                    sums.append(float(value.sum()))

        lags: list[float] = []
        stop = asyncio.Event()
        gc.collect()  # before the heartbeat starts: a collection here is not the engine's lag
        beat = asyncio.create_task(_heartbeat(stop, lags))
        await asyncio.sleep(0.01)
        start = time.perf_counter()
        await asyncio.gather(produce(), consume())
        wall = time.perf_counter() - start
        stop.set()
        await beat
        await engine.wait_for_all()
    lags_ms = sorted(lag * 1e3 for lag in lags)
    return {"wall_s": wall, "sums": sums, "lags_ms": lags_ms}


def _p99(sorted_values: Sequence[float]) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(0.99 * len(sorted_values)))]


def bench_overlap(args: argparse.Namespace, failures: list[str]) -> dict[str, Any]:
    n_chunks, elements, workers = args.chunks, args.chunk_elements, args.workers
    io_s = args.io_s / n_chunks
    rng = np.random.default_rng(1)
    sources = [rng.standard_normal(elements) for _ in range(4)]
    # Calibrate: operations per chunk so that the compute alone takes about --compute-s on
    # the engine's workers, i.e. NumPy's compute on one core takes --compute-s x workers.
    cycle = []
    for _ in range(5):
        t = time.perf_counter()
        chain(np, sources[0], len(STEPS))
        cycle.append(time.perf_counter() - t)
    per_op = statistics.median(cycle) / len(STEPS)
    ops_per_chunk = max(len(STEPS), round(args.compute_s * workers / n_chunks / per_op))
    expected = [float(chain(np, src, ops_per_chunk).sum()) for src in sources]
    expected_sums = [expected[i % len(sources)] for i in range(n_chunks)]
    modes = ("overlap", "io", "compute", "numpy-on-loop")
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    errors: dict[str, str] = {}
    for rep in range(args.overlap_reps):
        k = rep % len(modes)
        for mode in modes[k:] + modes[:k]:
            if mode in errors:
                continue
            try:
                out = asyncio.run(
                    _overlap_once(mode, sources, n_chunks, ops_per_chunk, io_s, workers)
                )
            except Exception as exc:
                errors[mode] = f"{type(exc).__name__}: {exc}"
                continue
            if mode != "io" and out["sums"] != expected_sums:
                errors[mode] = "the chunks' sums differ from NumPy's"
            runs[mode].append(out)
    result: dict[str, Any] = {
        "chunks": n_chunks,
        "chunk_elements": elements,
        "ops_per_chunk": ops_per_chunk,
        "numpy_us_per_op": per_op * 1e6,
        "io_per_chunk_s": io_s,
        "workers": workers,
        "reps": args.overlap_reps,
        "modes": {},
    }
    for mode in modes:
        if mode in errors:
            failures.append(f"overlap/{mode}: {errors[mode]}")
            result["modes"][mode] = {"error": errors[mode]}
            continue
        walls = [o["wall_s"] for o in runs[mode]]
        p99s = [_p99(o["lags_ms"]) for o in runs[mode]]
        result["modes"][mode] = {
            "wall_s": statistics.median(walls),
            "runs_s": [round(w, 4) for w in walls],
            "lag_p99_ms": max(p99s),
            "lag_max_ms": max(o["lags_ms"][-1] if o["lags_ms"] else 0.0 for o in runs[mode]),
            "beats": statistics.median(len(o["lags_ms"]) for o in runs[mode]),
        }
    m = result["modes"]
    if all("wall_s" in m[mode] for mode in ("overlap", "io", "compute")):
        # Within each repetition, then the median: a slow moment hits one repetition's three.
        ratios = [
            o["wall_s"] / max(i["wall_s"], c["wall_s"])
            for o, i, c in zip(runs["overlap"], runs["io"], runs["compute"], strict=True)
        ]
        result["ratio"] = statistics.median(ratios)
        result["ratios"] = [round(r, 3) for r in ratios]
    return result


# --------------------------------------------------------------------------------------------
# memory: a long loop of pushes on 1 MB arrays, in a fresh process


def _rss() -> int:
    """This process's resident set in bytes (psutil, or /proc on Linux)."""
    try:
        import psutil
    except ImportError:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return int(psutil.Process().memory_info().rss)


class _Sampler(threading.Thread):
    """Samples the RSS every 2 ms; sets ``exceeded`` when it grows past ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__(daemon=True)
        self.start_rss = _rss()
        self.peak = self.start_rss
        self.limit = limit
        self.exceeded = threading.Event()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.002):
            rss = _rss()
            self.peak = max(self.peak, rss)
            if rss - self.start_rss > self.limit:
                self.exceeded.set()

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        self.peak = max(self.peak, _rss())
        return self.peak


async def _memory_loop(
    variant: str, iters: int, every: int, size: int, limit: int
) -> dict[str, Any]:
    import aioengine as ae
    from aioengine.array import namespace

    max_pending = 2 * every if variant == "capacity" else None
    async with ae.Engine(max_pending=max_pending) as engine:
        xp = namespace(engine)
        a = xp.asarray(np.zeros(size))
        for _ in range(every):  # warm-up: the pool's threads, the allocator's arenas
            a = a * 0.5 + 1
        await a
        done = every
        gc.collect()
        sampler = _Sampler(limit)
        sampler.start()
        t0 = time.perf_counter()
        for i in range(1, iters + 1):
            a = a * 0.5 + 1
            if variant == "capacity":
                await engine.wait_for_capacity()
            elif i % every == 0:
                await a
            if i % every == 0 and sampler.exceeded.is_set():
                break
        value = await a
        wall = time.perf_counter() - t0
        done += i
        await engine.wait_for_all()
    peak = sampler.stop()
    expected = np.zeros(size)
    for _ in range(min(done, 200)):  # 0 -> 2 - 2 * 0.5**n: exactly 2.0 after 54 iterations
        expected = expected * 0.5 + 1
    # Not getrusage's ru_maxrss: Linux carries the high-water mark of the memory map that
    # exec replaced into it, here the parent's (about 360 MB after the other benchmarks).
    return {
        "variant": variant,
        "iterations": i,
        "ops": 2 * i,
        "wall_s": wall,
        "ops_per_s": 2 * i / wall,
        "start_rss_mib": sampler.start_rss / 2**20,
        "peak_rss_mib": peak / 2**20,
        "growth_mib": (peak - sampler.start_rss) / 2**20,
        "stopped_early": sampler.exceeded.is_set(),
        "correct": bool(np.array_equal(np.asarray(value), expected)),
    }


def bench_memory(args: argparse.Namespace, failures: list[str]) -> dict[str, Any]:
    sys.path.insert(0, str(BENCH))
    import run

    result: dict[str, Any] = {
        "iterations": args.mem_iters,
        "every": args.mem_every,
        "elements": args.mem_elements,
        "variants": {},
    }
    for variant in ("await", "capacity"):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "memory"]
        cmd += ["--memory-variant", variant, "--mem-iters", str(args.mem_iters)]
        cmd += ["--mem-every", str(args.mem_every), "--mem-elements", str(args.mem_elements)]
        proc = subprocess.run(
            cmd, env=run.child_env(), cwd=BENCH, capture_output=True, text=True, check=False
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
            error = f"rc={proc.returncode}: {tail}"
            failures.append(f"memory/{variant}: {error}")
            result["variants"][variant] = {"error": error}
            continue
        out = json.loads(lines[-1])
        if not out["correct"]:
            failures.append(f"memory/{variant}: wrong final value")
        result["variants"][variant] = out
    return result


# --------------------------------------------------------------------------------------------
# Shared by chain, reductions, chain_memory, chain_lag, chain_busy, mlp, mlp_two: the programs
# written once against ``xp``, peers that take turns, and an engine that stays up for a shape.


def elementwise_chain(xp: Any, a: Any, b: Any) -> Any:
    """The issue's 10-step elementwise chain (five reused intermediates)."""
    c = a * 1.5 + b
    c = c * c - a
    c = xp.sqrt(xp.abs(c)) + 2.0
    c = c * b - a * 0.5
    return xp.exp(-c * c) + c


# The same chain for numexpr: one ``evaluate`` per reused intermediate (its default threads).
NUMEXPR_CHAIN = (
    "a * 1.5 + b",
    "c * c - a",
    "sqrt(abs(c)) + 2.0",
    "c * b - a * 0.5",
    "exp(-c * c) + c",
)


def chain_close(value: np.ndarray, reference: np.ndarray) -> bool:
    """Whether a chain's result equals NumPy's to ``rtol=1e-12``, with ``atol`` 1e-12 times the
    largest magnitude: where ``c * c - a`` or ``c * b - a * 0.5`` cancels to near zero, a
    kernel that rounds once less (numexpr's, contracted to a fused multiply-add) differs from
    NumPy by a rounding of the terms, not of the result (4e-16 on an element of 6e-5)."""
    atol = 1e-12 * float(np.max(np.abs(reference), initial=0.0))
    return bool(np.allclose(value, reference, rtol=1e-12, atol=atol))


def numexpr_chain(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    import numexpr

    c = a
    for expr in NUMEXPR_CHAIN:
        c = numexpr.evaluate(expr, local_dict={"a": a, "b": b, "c": c})
    return c


def stream_floor(pool: concurrent.futures.ThreadPoolExecutor, a: np.ndarray, b: np.ndarray) -> Any:
    """The physical floor of a chain on ``a`` and ``b``: read both once and write a fresh output
    once, ``np.add(a_chunk, b_chunk, out=out_chunk)`` on ``pool`` (a thread per core; four
    chunks per thread)."""
    out = np.empty_like(a)
    bounds = np.linspace(0, a.size, 4 * (os.cpu_count() or 1) + 1).astype(int)

    def add(i: int) -> None:
        lo, hi = bounds[i], bounds[i + 1]
        np.add(a[lo:hi], b[lo:hi], out=out[lo:hi])

    list(pool.map(add, range(len(bounds) - 1)))
    return out


class _EngineThread:
    """An event loop on a thread of its own with one ``Engine`` (default settings) on it, up for
    a whole benchmark shape: the async peers' coroutines run there and time themselves, while
    the synchronous peers run on the calling thread, so the peers can take turns."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.engine: Any = self.call(self._open())
        from aioengine.array import namespace

        self.xp: Any = namespace(self.engine)

    async def _open(self) -> Any:
        import aioengine as ae

        return ae.Engine()

    def call(self, coro: Any) -> Any:
        """Run ``coro`` on the engine's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.call(self.engine.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


Peer = Callable[[], tuple[float, Any]]  # one timed run: (wall seconds, value)


def take_turns(
    peers: dict[str, Peer],
    reps: int,
    check: Callable[[str, Any], str | None],
    warm: bool = False,
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Every peer once per repetition, the first to go rotating from one repetition to the next;
    ``check(name, value)`` says what is wrong with a value (None: nothing). With ``warm``, each
    timed run follows an untimed run of the same peer: a run of a few milliseconds timed right
    after another peer's measures how fast this VM wakes the cores that peer left idle (a
    two-thread NumPy loop took 7 ms there, 3.5 ms back to back), for every peer alike. The
    wall times, and the first error of each peer that failed (it runs no more)."""
    walls: dict[str, list[float]] = {name: [] for name in peers}
    errors: dict[str, str] = {}
    names = list(peers)
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            if name in errors:
                continue
            gc.collect()
            try:
                if warm:
                    peers[name]()
                wall, value = peers[name]()
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            problem = check(name, value)
            if problem is not None:
                errors[name] = problem
                continue
            walls[name].append(wall)
            del value
    return walls, errors


def summarize(
    walls: dict[str, list[float]],
    errors: dict[str, str],
    failures: list[str],
    label: str,
    against: Sequence[str] = ("numpy",),
) -> dict[str, Any]:
    """Each peer's median wall time and its ratios to the peers ``against`` (``vs_<peer>``: that
    peer's time over this one's within each repetition, the median of those: > 1 is faster)."""
    out: dict[str, Any] = {}
    for name, runs in walls.items():
        if name in errors:
            failures.append(f"{label}/{name}: {errors[name]}")
            out[name] = {"error": errors[name]}
            continue
        entry: dict[str, Any] = {
            "wall_s": statistics.median(runs),
            "runs_s": [round(w, 6) for w in runs],
        }
        for ref in against:
            ref_runs = walls.get(ref, [])
            if ref != name and ref not in errors and len(ref_runs) == len(runs) and runs:
                ratios = [r / w for r, w in zip(ref_runs, runs, strict=True)]
                entry[f"vs_{ref}"] = statistics.median(ratios)
        out[name] = entry
    return out


def _numexpr_available(notes: list[str]) -> bool:
    try:
        import numexpr  # noqa: F401
    except ImportError as exc:
        notes.append(f"numexpr skipped: it does not import ({exc})")
        return False
    return True


# --------------------------------------------------------------------------------------------
# chain: the 10-step elementwise chain at five sizes


def _repeats(n: int) -> int:
    """Chains per timed run: a tiny chain is timed over enough of them to outlast the clock's
    noise, a large one over three (each awaited, or converted, before the next starts: one
    chain of a few milliseconds timed alone varied 2x from run to run on this VM)."""
    return max(3, 200_000 // n)


def _chain_size(
    eng: _EngineThread,
    pool: concurrent.futures.ThreadPoolExecutor,
    n: int,
    reps: int,
    has_numexpr: bool,
    failures: list[str],
) -> dict[str, Any]:
    """The chain at ``n`` elements, every peer in turns."""
    import aioengine.array_api as sxp

    rng = np.random.default_rng(3)
    A, B = rng.standard_normal(n), rng.standard_normal(n)
    reference = elementwise_chain(np, A, B)
    added = A + B
    repeats = _repeats(n)
    xp = eng.xp

    async def make() -> tuple[Any, Any]:
        a, b = xp.asarray(A), xp.asarray(B)
        await a
        await b
        await elementwise_chain(xp, a, b)  # warm-up, untimed
        return a, b

    a, b = eng.call(make())
    sa, sb = sxp.asarray(A), sxp.asarray(B)
    np.asarray(elementwise_chain(sxp, sa, sb))  # warm-up, untimed

    async def on_engine() -> tuple[float, Any]:
        start = _clock()
        for _ in range(repeats):
            value = await elementwise_chain(xp, a, b)
        return _since(start)[0] / repeats, value

    def on_array_api() -> tuple[float, Any]:
        start = _clock()
        for _ in range(repeats):
            value = np.asarray(elementwise_chain(sxp, sa, sb))
        return _since(start)[0] / repeats, value

    def on_numpy() -> tuple[float, Any]:
        start = _clock()
        for _ in range(repeats):
            value = elementwise_chain(np, A, B)
        return _since(start)[0] / repeats, value

    def on_numexpr() -> tuple[float, Any]:
        start = _clock()
        for _ in range(repeats):
            value = numexpr_chain(A, B)
        return _since(start)[0] / repeats, value

    def on_floor() -> tuple[float, Any]:
        start = _clock()
        value = stream_floor(pool, A, B)
        return _since(start)[0], value

    def with_numpy_calls() -> tuple[float, Any]:
        """The async peer with the compiled runner off: each chunk's blocks as NumPy calls,
        as in the pure-Python install (the runner's gain, in the same run)."""
        from aioengine.array import _numpy_fuse

        saved = _numpy_fuse._available[:]
        _numpy_fuse._available[:] = [False]
        try:
            return eng.call(on_engine())
        finally:
            _numpy_fuse._available[:] = saved

    peers: dict[str, Peer] = {
        "aioengine": lambda: eng.call(on_engine()),
        "aioengine.array_api": on_array_api,
        "numpy": on_numpy,
    }
    if has_numexpr:
        peers["numexpr"] = on_numexpr
    if n >= 1_000_000:  # the floor is the issue's for the large sizes
        stream_floor(pool, A, B)  # the pool's threads up
        peers["floor"] = on_floor
        if _runner_compiled():
            peers["aioengine-numpy-calls"] = with_numpy_calls

    def check(name: str, value: Any) -> str | None:
        expected = added if name == "floor" else reference
        if not chain_close(np.asarray(value), expected):
            return "results differ from NumPy's (rtol 1e-12)"
        return None

    walls, errors = take_turns(peers, reps, check, warm=n >= 1_000_000)
    against = ("numpy", "numexpr", "aioengine")
    out = {
        "elements": n,
        "chains_per_run": repeats,
        "peers": summarize(walls, errors, failures, f"chain/{n}", against),
    }
    eng.call(eng.engine.wait_for_all())
    return out


def _runner_compiled() -> bool:
    """Whether this aioengine runs fused chains through NumPy's loops without the GIL (the
    wheel's compiled runner, ``aioengine/array/_numpy_fuse.py``)."""
    from aioengine.array import _numpy_fuse

    return _numpy_fuse.available()


def bench_chain(args: argparse.Namespace, notes: list[str], failures: list[str]) -> dict[str, Any]:
    has_numexpr = _numexpr_available(notes)
    workers = os.cpu_count() or 1
    result: dict[str, Any] = {"reps": args.reps, "floor_threads": workers, "sizes": {}}
    if not _runner_compiled():
        notes.append(
            "chain: aioengine-numpy-calls skipped: this aioengine runs no compiled runner (a "
            "pure install, or AIOENGINE_ARRAY_NUMPY_LOOPS=0): its chains are NumPy calls already"
        )
    eng = _EngineThread()
    pool = concurrent.futures.ThreadPoolExecutor(workers)
    try:
        for n in args.chain_sizes:
            sized = _chain_size(eng, pool, n, args.reps, has_numexpr, failures)
            result["sizes"][str(n)] = sized
    finally:
        pool.shutdown()
        eng.close()
    return result


# --------------------------------------------------------------------------------------------
# reductions: a dot product and a mean squared error on 8e6 float64


def _sum_prod(xp: Any, a: Any, b: Any) -> Any:
    return xp.sum(a * b)


def _mse(xp: Any, a: Any, b: Any) -> Any:
    return xp.mean((a - b) ** 2)


REDUCTIONS: dict[str, tuple[Callable[[Any, Any, Any], Any], str, bool]] = {
    # name: (the program, its numexpr string, whether numexpr's sum is divided by the size)
    "sum(a * b)": (_sum_prod, "sum(a * b)", False),
    "mean((a - b) ** 2)": (_mse, "sum((a - b) ** 2)", True),
}


async def _await_value(x: Any) -> Any:
    return await x


def _reduction(
    eng: _EngineThread,
    inputs: tuple[np.ndarray, np.ndarray, Any, Any, Any, Any],
    label: str,
    reps: int,
    has_numexpr: bool,
    failures: list[str],
) -> dict[str, Any]:
    """One program of :data:`REDUCTIONS`, every peer in turns."""
    import aioengine.array_api as sxp

    A, B, a, b, sa, sb = inputs
    program, ne_expr, divide = REDUCTIONS[label]
    reference = float(program(np, A, B))
    xp = eng.xp
    eng.call(_await_value(program(xp, a, b)))  # warm-up, untimed
    float(program(sxp, sa, sb))

    async def on_engine() -> tuple[float, Any]:
        start = _clock()
        value = float(await program(xp, a, b))
        return _since(start)[0], value

    def on_array_api() -> tuple[float, Any]:
        start = _clock()
        value = float(program(sxp, sa, sb))
        return _since(start)[0], value

    def on_numpy() -> tuple[float, Any]:
        start = _clock()
        value = float(program(np, A, B))
        return _since(start)[0], value

    def on_numexpr() -> tuple[float, Any]:
        import numexpr

        start = _clock()
        value = float(numexpr.evaluate(ne_expr, local_dict={"a": A, "b": B}))
        if divide:
            value /= A.size
        return _since(start)[0], value

    peers: dict[str, Peer] = {
        "aioengine": lambda: eng.call(on_engine()),
        "aioengine.array_api": on_array_api,
        "numpy": on_numpy,
    }
    if has_numexpr:
        peers["numexpr"] = on_numexpr

    def check(name: str, value: Any) -> str | None:
        # Summation order differs between the peers (pairwise, blocked, sequential).
        if not np.isclose(value, reference, rtol=1e-10, atol=0):
            return f"{value!r} differs from NumPy's {reference!r} (rtol 1e-10)"
        return None

    walls, errors = take_turns(peers, reps, check)
    return {"peers": summarize(walls, errors, failures, f"reductions/{label}", ("numpy",))}


def bench_reductions(
    args: argparse.Namespace, notes: list[str], failures: list[str]
) -> dict[str, Any]:
    import aioengine.array_api as sxp

    has_numexpr = _numexpr_available(notes)
    n = args.reduction_elements
    rng = np.random.default_rng(4)
    A, B = rng.standard_normal(n), rng.standard_normal(n)
    result: dict[str, Any] = {
        "elements": n,
        "reps": args.reps,
        "numexpr_note": "numexpr has sum() but no mean(): sum((a - b) ** 2) / n",
        "programs": {},
    }
    eng = _EngineThread()
    try:
        xp = eng.xp

        async def make() -> tuple[Any, Any]:
            a, b = xp.asarray(A), xp.asarray(B)
            await a
            await b
            return a, b

        a, b = eng.call(make())
        sa, sb = sxp.asarray(A), sxp.asarray(B)
        np.asarray(sa), np.asarray(sb)
        for label in REDUCTIONS:
            result["programs"][label] = _reduction(
                eng, (A, B, a, b, sa, sb), label, args.reps, has_numexpr, failures
            )
    finally:
        eng.close()
    return result


# --------------------------------------------------------------------------------------------
# chain_memory: the peak memory of the chain above its inputs, in a fresh process per peer

CHAIN_MEMORY_PEERS = ("aioengine", "aioengine.array_api", "numpy", "numexpr")
# The variables run.child_env() sets to 1 (its runners' one BLAS / OpenMP / numexpr thread).
THREAD_PINS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def _worker_thread_traced() -> bool:
    """Whether tracemalloc (started) sees an array allocated on another thread."""
    import tracemalloc

    held: list[np.ndarray] = []
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    thread = threading.Thread(target=lambda: held.append(np.ones(1 << 20)))
    thread.start()
    thread.join()
    return tracemalloc.get_traced_memory()[0] - before >= 8 << 20


def chain_memory_child(peer: str, n: int) -> dict[str, Any]:
    """One peer's chain, tracemalloc started after its inputs exist (in this process's
    own form: engine arrays for the engine's peers) and a 1,000-element warm-up ran."""
    import tracemalloc

    rng = np.random.default_rng(5)
    A, B = rng.standard_normal(n), rng.standard_normal(n)
    small_a, small_b = A[:1000].copy(), B[:1000].copy()
    traced: dict[str, Any] = {}

    def measure(run: Callable[[], Any]) -> Any:
        gc.collect()
        tracemalloc.start()
        traced["worker_thread_visible"] = _worker_thread_traced()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        value = run()
        traced["peak_bytes"] = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        return value

    if peer == "aioengine":

        async def main() -> Any:
            import aioengine as ae
            from aioengine.array import namespace

            async with ae.Engine() as engine:
                xp = namespace(engine)
                await elementwise_chain(xp, xp.asarray(small_a), xp.asarray(small_b))
                a, b = xp.asarray(A), xp.asarray(B)
                await a
                await b
                gc.collect()
                tracemalloc.start()
                traced["worker_thread_visible"] = _worker_thread_traced()
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
                value = await elementwise_chain(xp, a, b)
                traced["peak_bytes"] = tracemalloc.get_traced_memory()[1] - base
                tracemalloc.stop()
                return np.array(value)

        value = asyncio.run(main())
    elif peer == "aioengine.array_api":
        import aioengine.array_api as sxp

        np.asarray(elementwise_chain(sxp, sxp.asarray(small_a), sxp.asarray(small_b)))
        sa, sb = sxp.asarray(A), sxp.asarray(B)
        np.asarray(sa), np.asarray(sb)
        value = measure(lambda: np.asarray(elementwise_chain(sxp, sa, sb)))
    elif peer == "numpy":
        elementwise_chain(np, small_a, small_b)
        value = measure(lambda: elementwise_chain(np, A, B))
    elif peer == "numexpr":
        numexpr_chain(small_a, small_b)
        value = measure(lambda: numexpr_chain(A, B))
    else:
        raise ValueError(f"unknown chain_memory peer {peer!r}")
    correct = chain_close(value, elementwise_chain(np, A, B))
    return {
        "peak_bytes": traced["peak_bytes"],
        "peak_mib": traced["peak_bytes"] / 2**20,
        "result_mib": n * 8 / 2**20,
        "multiple": traced["peak_bytes"] / (n * 8),
        "worker_thread_visible": traced["worker_thread_visible"],
        "correct": correct,
    }


def bench_chain_memory(
    args: argparse.Namespace, notes: list[str], failures: list[str]
) -> dict[str, Any]:
    sys.path.insert(0, str(BENCH))
    import run

    n = args.memory_chain_elements
    result: dict[str, Any] = {"elements": n, "result_mib": n * 8 / 2**20, "peers": {}}
    peers = [p for p in CHAIN_MEMORY_PEERS if p != "numexpr" or _numexpr_available([])]
    # The runners' environment, without its one-thread pins: each peer's threads as here.
    env = run.child_env()
    for var in THREAD_PINS:
        if var in os.environ:
            env[var] = os.environ[var]
        else:
            env.pop(var, None)
    for peer in peers:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "chain_memory"]
        cmd += ["--memory-peer", peer, "--memory-chain-elements", str(n)]
        proc = subprocess.run(cmd, env=env, cwd=BENCH, capture_output=True, text=True, check=False)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
            error = f"rc={proc.returncode}: {tail}"
            failures.append(f"chain_memory/{peer}: {error}")
            result["peers"][peer] = {"error": error}
            continue
        out = json.loads(lines[-1])
        if not out["correct"]:
            failures.append(f"chain_memory/{peer}: results differ from NumPy's (rtol 1e-12)")
        if not out["worker_thread_visible"]:
            notes.append(f"chain_memory/{peer}: tracemalloc did not see a worker thread's array")
        if out["peak_bytes"] < n * 8:
            notes.append(
                f"chain_memory/{peer}: peak below the result's size: some allocations are "
                "invisible to tracemalloc"
            )
        result["peers"][peer] = out
    return result


# --------------------------------------------------------------------------------------------
# chain_lag: the event loop's lag while the chain runs, back to back


async def _chain_lag_once(mode: str, A: np.ndarray, B: np.ndarray, times: int) -> dict[str, Any]:
    """``times`` chains, each awaited before the next is pushed (``aioengine``), or NumPy called
    in the coroutine (``numpy-on-loop``, for reference), under a 1 ms heartbeat."""
    import aioengine as ae
    from aioengine.array import namespace

    async with ae.Engine() as engine:
        xp = namespace(engine)
        a, b = xp.asarray(A), xp.asarray(B)
        await elementwise_chain(xp, a, b)  # warm-up, untimed
        values: list[np.ndarray] = []
        lags: list[float] = []
        stop = asyncio.Event()
        gc.collect()
        beat = asyncio.create_task(_heartbeat(stop, lags))
        await asyncio.sleep(0.01)
        start = time.perf_counter()
        for _ in range(times):
            if mode == "numpy-on-loop":
                values.append(elementwise_chain(np, A, B))
                await asyncio.sleep(0)
            else:
                values.append(await elementwise_chain(xp, a, b))
        wall = time.perf_counter() - start
        stop.set()
        await beat
        await engine.wait_for_all()
    return {"wall_s": wall, "values": values, "lags_ms": sorted(lag * 1e3 for lag in lags)}


def bench_chain_lag(args: argparse.Namespace, failures: list[str]) -> dict[str, Any]:
    n, times = args.lag_elements, args.lag_chains
    rng = np.random.default_rng(6)
    A, B = rng.standard_normal(n), rng.standard_normal(n)
    reference = elementwise_chain(np, A, B)
    modes = ("aioengine", "numpy-on-loop")
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    errors: dict[str, str] = {}
    for rep in range(args.lag_reps):
        k = rep % len(modes)
        for mode in modes[k:] + modes[:k]:
            if mode in errors:
                continue
            try:
                out = asyncio.run(_chain_lag_once(mode, A, B, times))
            except Exception as exc:
                errors[mode] = f"{type(exc).__name__}: {exc}"
                continue
            if not all(chain_close(v, reference) for v in out.pop("values")):
                errors[mode] = "results differ from NumPy's (rtol 1e-12)"
            runs[mode].append(out)
    result: dict[str, Any] = {
        "elements": n,
        "chains": times,
        "reps": args.lag_reps,
        "modes": {},
    }
    for mode in modes:
        if mode in errors:
            failures.append(f"chain_lag/{mode}: {errors[mode]}")
            result["modes"][mode] = {"error": errors[mode]}
            continue
        result["modes"][mode] = {
            "wall_per_chain_s": statistics.median(o["wall_s"] for o in runs[mode]) / times,
            "lag_p99_ms": max(_p99(o["lags_ms"]) for o in runs[mode]),
            "lag_max_ms": max(o["lags_ms"][-1] if o["lags_ms"] else 0.0 for o in runs[mode]),
            "beats": statistics.median(len(o["lags_ms"]) for o in runs[mode]),
        }
    return result


# --------------------------------------------------------------------------------------------
# chain_busy: a chain pushed by a caller that keeps the CPU without awaiting starts anyway

BUSY_MODES = ("spin", "sleep", "awaited")
BUSY_CAP_S = 2.0  # a chain not ready this long after its push is reported "never"


def _poll_ready(
    c: Any, start: float, sleep: bool, started: Callable[[], bool]
) -> tuple[float | None, float | None]:
    """Poll ``c.ready`` without yielding to the event loop (the caller keeps its thread, as a
    program busy in Python does), with a 0.5 ms ``time.sleep`` between polls if ``sleep``:
    the seconds from ``start`` until ``started()`` first said an operation of the chain was
    running or done, and until it is ready; None after :data:`BUSY_CAP_S`."""
    now = start
    began: float | None = None
    while not c.ready:
        if began is None and started():
            began = time.perf_counter() - start
        if now - start >= BUSY_CAP_S:
            return began, None
        if sleep:
            time.sleep(0.0005)
        now = time.perf_counter()
    return (now - start if began is None else began), now - start


async def _chain_busy_once(mode: str, A: np.ndarray, B: np.ndarray) -> dict[str, Any]:
    """One chain pushed on a fresh engine, then ``c.ready`` polled in a pure-Python loop
    (``spin``) or between 0.5 ms ``time.sleep`` calls (``sleep``), never yielding to the loop,
    or the chain awaited at once (``awaited``, the reference). The time from the first
    operation's push until the value is ready (None: not within :data:`BUSY_CAP_S`)."""
    import aioengine as ae
    from aioengine.array import namespace

    async with ae.Engine() as engine:
        xp = namespace(engine)
        a, b = xp.asarray(A), xp.asarray(B)
        await a
        await b
        await elementwise_chain(xp, a, b)  # warm-up, untimed
        gc.collect()
        ready_s: float | None
        began_s: float | None = None
        before = engine.statistics()
        settled = before.running + before.done

        def started() -> bool:
            now = engine.statistics()
            return now.running + now.done > settled

        start = time.perf_counter()
        c = elementwise_chain(xp, a, b)
        push_s = time.perf_counter() - start
        if mode == "awaited":
            value = await c
            ready_s = time.perf_counter() - start
        else:
            began_s, ready_s = _poll_ready(c, start, mode == "sleep", started)
            value = await c  # ready, or (capped) computed once the loop runs
        await engine.wait_for_all()
    return {"ready_s": ready_s, "began_s": began_s, "push_s": push_s, "value": np.asarray(value)}


def _median_or_never(runs: Sequence[float | None]) -> float | None:
    """The median of ``runs``, a capped run (None) counting as longer than any; None if the
    median is capped."""
    ordered = sorted(r for r in runs if r is not None) + [float("inf")] * runs.count(None)
    median = statistics.median(ordered) if ordered else float("inf")
    return None if median == float("inf") else median


def bench_chain_busy(args: argparse.Namespace, failures: list[str]) -> dict[str, Any]:
    rng = np.random.default_rng(9)
    result: dict[str, Any] = {"reps": args.chain_busy_reps, "cap_s": BUSY_CAP_S, "sizes": {}}
    for n in args.chain_busy_sizes:
        A, B = rng.standard_normal(n), rng.standard_normal(n)
        reference = elementwise_chain(np, A, B)
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in BUSY_MODES}
        errors: dict[str, str] = {}
        for rep in range(args.chain_busy_reps):
            k = rep % len(BUSY_MODES)
            for mode in BUSY_MODES[k:] + BUSY_MODES[:k]:
                if mode in errors:
                    continue
                try:
                    out = asyncio.run(_chain_busy_once(mode, A, B))
                except Exception as exc:
                    errors[mode] = f"{type(exc).__name__}: {exc}"
                    continue
                if not chain_close(out.pop("value"), reference):
                    errors[mode] = "results differ from NumPy's (rtol 1e-12)"
                runs[mode].append(out)
        modes: dict[str, Any] = {}
        awaited = [o["ready_s"] for o in runs["awaited"]] if "awaited" not in errors else []
        for mode in BUSY_MODES:
            if mode in errors:
                failures.append(f"chain_busy/{n}/{mode}: {errors[mode]}")
                modes[mode] = {"error": errors[mode]}
                continue
            ready: list[float | None] = [o["ready_s"] for o in runs[mode]]
            entry: dict[str, Any] = {
                "ready_s": _median_or_never(ready),
                "never": ready.count(None),
                "push_s": statistics.median(o["push_s"] for o in runs[mode]),
                "began_s": _median_or_never([o["began_s"] for o in runs[mode]])
                if mode != "awaited"
                else None,
                "runs_s": [None if r is None else round(r, 6) for r in ready],
            }
            if mode != "awaited" and len(awaited) == len(ready) and ready:
                # Within each repetition (the modes take turns), as the other shapes' ratios.
                pairs = list(zip(ready, awaited, strict=True))
                entry["vs_awaited"] = _median_or_never(
                    [None if r is None or w is None else r / w for r, w in pairs]
                )
                entry["late_ms"] = _median_or_never(
                    [None if r is None or w is None else (r - w) * 1e3 for r, w in pairs]
                )
            modes[mode] = entry
        result["sizes"][str(n)] = {"elements": n, "modes": modes}
    return result


# --------------------------------------------------------------------------------------------
# mlp, mlp_two: a 2-layer MLP trained by full-batch gradient descent, written once against xp

MLP_FEATURES, MLP_HIDDEN, MLP_LR, MLP_LOG_EVERY = 64, 128, 0.1, 20


def mlp_problem(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """The samples ``X`` (n, 64), targets ``y`` (n, 1) (a noisy tanh of a random projection)
    and the initial weights and biases ``W1, b1, W2, b2``, all drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, MLP_FEATURES))
    w = rng.standard_normal((MLP_FEATURES, 1)) / np.sqrt(MLP_FEATURES)
    y = np.tanh(X @ w) + 0.1 * rng.standard_normal((n, 1))
    W1 = rng.standard_normal((MLP_FEATURES, MLP_HIDDEN)) / np.sqrt(MLP_FEATURES)
    W2 = rng.standard_normal((MLP_HIDDEN, 1)) / np.sqrt(MLP_HIDDEN)
    return X, y, [W1, np.zeros(MLP_HIDDEN), W2, np.zeros(1)]


def mlp_train(xp: Any, X: Any, y: Any, params: Sequence[Any], steps: int) -> Iterator[Any]:
    """Train 64 -> 128 (tanh) -> 1 with the mean squared error, ``steps`` steps of gradient
    descent on the whole batch. Yields the loss every ``MLP_LOG_EVERY`` steps (the driver reads
    it, as a training loop that logs does) and, last, the loss of the final weights."""
    W1, b1, W2, b2 = params
    n = X.shape[0]
    for step in range(steps):
        h = xp.tanh(X @ W1 + b1)
        err = h @ W2 + b2 - y
        if (step + 1) % MLP_LOG_EVERY == 0:
            yield xp.mean(err * err)
        g = err * (2.0 / n)
        g_h = (g @ xp.matrix_transpose(W2)) * (1.0 - h * h)
        W2 = W2 - MLP_LR * (xp.matrix_transpose(h) @ g)
        b2 = b2 - MLP_LR * xp.sum(g, axis=0)
        W1 = W1 - MLP_LR * (xp.matrix_transpose(X) @ g_h)
        b1 = b1 - MLP_LR * xp.sum(g_h, axis=0)
    err = xp.tanh(X @ W1 + b1) @ W2 + b2 - y
    yield xp.mean(err * err)


def bench_mlp(args: argparse.Namespace, failures: list[str]) -> dict[str, Any]:
    """``mlp`` (one model per peer) and ``mlp_two`` (two models: at once on the engine, in turn
    on NumPy), whichever ``--only`` selects."""
    import aioengine.array_api as sxp

    n, steps = args.mlp_samples, args.mlp_steps
    seeds = (7, 8) if "mlp_two" in args.only_set else (7,)  # the second model for mlp_two
    problems = [mlp_problem(seed, n) for seed in seeds]
    references = [
        [float(loss) for loss in mlp_train(np, X, y, params, steps)] for X, y, params in problems
    ]
    result: dict[str, Any] = {
        "samples": n,
        "layers": f"{MLP_FEATURES} -> {MLP_HIDDEN} (tanh) -> 1, MSE",
        "steps": steps,
        "lr": MLP_LR,
        "log_every": MLP_LOG_EVERY,
        "reps": args.mlp_reps,
        "final_loss": [r[-1] for r in references],
    }
    eng = _EngineThread()
    try:
        xp = eng.xp

        async def make() -> list[list[Any]]:
            made = [[xp.asarray(v) for v in (X, y, *params)] for X, y, params in problems]
            for arrays in made:
                for v in arrays:
                    await v
            return made

        on_eng = eng.call(make())
        on_sync = [[sxp.asarray(v) for v in (X, y, *params)] for X, y, params in problems]
        for arrays in on_sync:
            for v in arrays:
                np.asarray(v)

        def train(ns: Any, arrays: Sequence[Any]) -> Iterator[Any]:
            return mlp_train(ns, arrays[0], arrays[1], arrays[2:], steps)

        async def drive(arrays: Sequence[Any]) -> list[float]:
            return [float(await loss) for loss in train(xp, arrays)]

        async def engine_one() -> tuple[float, Any]:
            start = _clock()
            losses = await drive(on_eng[0])
            return _since(start)[0], [losses]

        async def engine_two() -> tuple[float, Any]:
            start = _clock()
            losses = await asyncio.gather(drive(on_eng[0]), drive(on_eng[1]))
            return _since(start)[0], list(losses)

        def sync_one() -> tuple[float, Any]:
            start = _clock()
            losses = [float(loss) for loss in train(sxp, on_sync[0])]
            return _since(start)[0], [losses]

        def sync_two() -> tuple[float, Any]:
            """The two models' steps interleaved in one loop: each logging point's losses are
            read after both models' steps up to it were pushed."""
            start = _clock()
            losses: list[list[float]] = [[], []]
            pairs = zip(train(sxp, on_sync[0]), train(sxp, on_sync[1]), strict=True)
            for first, second in pairs:
                losses[0].append(float(first))
                losses[1].append(float(second))
            return _since(start)[0], losses

        def numpy_models(count: int) -> Peer:
            def run() -> tuple[float, Any]:
                start = _clock()
                losses = [
                    [float(loss) for loss in mlp_train(np, X, y, params, steps)]
                    for X, y, params in problems[:count]
                ]
                return _since(start)[0], losses

            return run

        def check(name: str, value: Any) -> str | None:
            for got, expected in zip(value, references[: len(value)], strict=True):
                if not np.allclose(got, expected, rtol=1e-9, atol=0):
                    return f"losses {got[-1]!r} differ from NumPy's {expected[-1]!r} (rtol 1e-9)"
            return None

        # Warm-up, untimed: the pools' threads, BLAS's buffers.
        eng.call(_await_value(xp.tanh(on_eng[0][0] @ on_eng[0][2])))
        np.asarray(sxp.tanh(on_sync[0][0] @ on_sync[0][2]))
        if "mlp" in args.only_set:
            peers: dict[str, Peer] = {
                "aioengine": lambda: eng.call(engine_one()),
                "aioengine.array_api": sync_one,
                "numpy": numpy_models(1),
            }
            walls, errors = take_turns(peers, args.mlp_reps, check)
            result["one"] = summarize(walls, errors, failures, "mlp")
        if "mlp_two" in args.only_set:
            peers = {
                "aioengine": lambda: eng.call(engine_two()),
                "aioengine.array_api": sync_two,
                "numpy-in-turn": numpy_models(2),
            }
            walls, errors = take_turns(peers, args.mlp_reps, check)
            result["two"] = summarize(walls, errors, failures, "mlp_two", ("numpy-in-turn",))
    finally:
        eng.close()
    return result


# --------------------------------------------------------------------------------------------
# kmeans: examples/arrays.py, on the engine and on NumPy, in a process of its own


def kmeans_child(reps: int) -> dict[str, Any]:
    """Import examples/arrays.py and time its ``on_engine()`` and ``on_numpy()`` in turns
    (the first to go alternating), checking them as its ``main()`` does."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("arrays_example", ROOT / "examples" / "arrays.py")
    assert spec is not None
    assert spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    walls: dict[str, list[float]] = {"aioengine": [], "numpy": []}
    problems: list[str] = []
    for rep in range(reps):
        order = ["aioengine", "numpy"] if rep % 2 == 0 else ["numpy", "aioengine"]
        for name in order:
            gc.collect()
            t = time.perf_counter()
            if name == "aioengine":
                results, sizes, _, pushed = asyncio.run(example.on_engine())
                walls[name].append(time.perf_counter() - t)
            else:
                expected, expected_sizes, _ = example.on_numpy()
                walls[name].append(time.perf_counter() - t)
        for (c, inertia, its), (c_np, inertia_np, its_np) in zip(results, expected, strict=True):
            if its != its_np or not (
                np.allclose(c, c_np, rtol=1e-9, atol=1e-9)
                and np.isclose(inertia, inertia_np, rtol=1e-9)
            ):
                problems.append("centroids, inertias or iteration counts differ from NumPy's")
        if sizes.tolist() != expected_sizes.tolist():
            problems.append("cluster sizes differ from NumPy's")
    return {
        "points": example.POINTS,
        "features": example.FEATURES,
        "clusters": example.CLUSTERS,
        "shards": example.SHARDS,
        "restarts": example.RESTARTS,
        "operations_pushed": pushed,
        "iterations": [r[2] for r in results],
        "walls": walls,
        "problems": sorted(set(problems)),
    }


def bench_kmeans(args: argparse.Namespace, failures: list[str]) -> dict[str, Any]:
    sys.path.insert(0, str(BENCH))
    import run

    # The example as a user runs it: default BLAS threads (run.child_env() pins them to one
    # for the engine benchmarks; the arrays limit BLAS themselves), its small size for --quick.
    env = run.child_env()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(var, None)
        if var in os.environ:
            env[var] = os.environ[var]
    if args.quick:
        env["AIOENGINE_EXAMPLE_SMALL"] = "1"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "kmeans"]
    cmd += ["--kmeans-reps", str(args.kmeans_reps)]
    proc = subprocess.run(cmd, env=env, cwd=BENCH, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
        error = f"rc={proc.returncode}: {tail}"
        failures.append(f"kmeans: {error}")
        return {"error": error}
    out: dict[str, Any] = json.loads(lines[-1])
    for problem in out.pop("problems"):
        failures.append(f"kmeans: {problem}")
    walls = out.pop("walls")
    out["reps"] = args.kmeans_reps
    out["blas_threads"] = env.get("OPENBLAS_NUM_THREADS", "default")
    out["peers"] = summarize(walls, {}, failures, "kmeans")
    return out


# --------------------------------------------------------------------------------------------
# --busy: CPU-bound processes beside the run


def spin() -> None:
    """A ``--busy`` process: a pure-Python loop that never sleeps, until terminated."""
    n = 0
    while True:
        n += 1


# --------------------------------------------------------------------------------------------
# report


def _versions(children: dict[str, ChildPeer]) -> dict[str, str]:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        import aioengine
        from aioengine.engine import _COMPILED

        core = "compiled" if _COMPILED else "pure Python"
        where = Path(aioengine.__file__).resolve().parent.parent
        origin = "this tree" if where == ROOT else f"from {where}"
        out["aioengine"] = f"{aioengine.__version__} ({core}, {origin})"
    except ImportError as exc:
        out["aioengine"] = f"ERROR {exc}"
    try:
        import dask

        out["dask"] = str(dask.__version__)
    except ImportError:
        pass
    try:
        import numexpr

        out["numexpr"] = f"{numexpr.__version__} ({numexpr.get_num_threads()} threads)"
    except ImportError:
        pass
    try:
        from threadpoolctl import threadpool_info

        blas = [
            f"{p.get('internal_api')} {p.get('version')} ({p.get('num_threads')} threads, "
            f"{p.get('threading_layer')}, {p.get('architecture')})"
            for p in threadpool_info()
            if p.get("user_api") == "blas"
        ]
        out["blas"] = "; ".join(blas) or "none found"
    except ImportError:
        out["blas"] = "unknown (threadpoolctl does not import)"
    for name, child in children.items():
        out[name] = child.version
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _get(d: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets with the measured figures (``met`` is None where not measured)."""
    tiny, br = result.get("tiny", {}), result.get("branches", {})
    ov, mem = result.get("overlap", {}), result.get("memory", {})
    aio = _get(tiny, "peers", "aioengine", "ops_per_s")
    mxnet, jax = _get(tiny, "peers", "mxnet", "ops_per_s"), _get(tiny, "peers", "jax", "ops_per_s")
    aio_s, numpy_s = _get(br, "peers", "aioengine", "wall_s"), _get(br, "peers", "numpy", "wall_s")
    dask = [
        p["wall_s"]
        for n, p in br.get("peers", {}).items()
        if n.startswith("dask-") and "wall_s" in p
    ]
    rows: list[tuple[str, float | None, str, float]] = [
        ("tiny: aioengine / MXNet NDArray, ops/s", _ratio(aio, mxnet), ">=", 4.0),
        ("tiny: aioengine / JAX eager, ops/s", _ratio(aio, jax), ">=", 1.5),
        ("branches: NumPy time / aioengine time", _ratio(numpy_s, aio_s), ">=", 1.6),
        (
            "branches: best dask time / aioengine time",
            _ratio(min(dask, default=None), aio_s),
            ">=",
            1.2,
        ),
        ("overlap: time / max(I/O alone, compute alone)", ov.get("ratio"), "<=", 1.15),
        ("overlap: event-loop lag p99, ms", _get(ov, "modes", "overlap", "lag_p99_ms"), "<=", 5.0),
        (
            "memory: RSS growth (await every N), MiB",
            _get(mem, "variants", "await", "growth_mib"),
            "<=",
            64.0,
        ),
    ]
    rows += _new_targets(result)
    out = []
    for name, value, op, goal in rows:
        met = None if value is None else (value >= goal if op == ">=" else value <= goal)
        out.append({"target": name, "value": value, "goal": f"{op} {goal:g}", "met": met})
    return out


def _inverse(x: float | None) -> float | None:
    return 1.0 / x if x else None


def _new_targets(result: dict[str, Any]) -> list[tuple[str, float | None, str, float]]:
    """The rows of chain, reductions, chain_memory, chain_lag, chain_busy, mlp, mlp_two and
    kmeans."""
    rows: list[tuple[str, float | None, str, float]] = []
    for sized in (_get(result, "chain", "sizes") or {}).values():
        n, peers = sized["elements"], sized["peers"]
        if n <= 10_000:
            vs = _inverse(_get(peers, "aioengine", "vs_numpy"))
            rows.append((f"chain {n:,}: aioengine time / NumPy time", vs, "<=", 3.0))
        elif n < 1_000_000:
            pass  # a mid size (one chunk): reported, no target of the issue's
        else:
            vs = _get(peers, "aioengine", "vs_numpy")
            rows.append((f"chain {n:,}: NumPy time / aioengine time", vs, ">=", 3.0))
            vs = _get(peers, "aioengine", "vs_numexpr")
            rows.append((f"chain {n:,}: numexpr time / aioengine time", vs, ">=", 1.0))
        vs = _inverse(_get(peers, "aioengine.array_api", "vs_aioengine"))
        rows.append((f"chain {n:,}: array_api time / aioengine time", vs, "<=", 1.2))
    for label, program in (_get(result, "reductions", "programs") or {}).items():
        vs = _get(program, "peers", "aioengine", "vs_numpy")
        rows.append((f"reductions {label}: NumPy / aioengine", vs, ">=", 2.5))
    multiple = _get(result, "chain_memory", "peers", "aioengine", "multiple")
    rows.append(("chain_memory: aioengine peak / result size", multiple, "<=", 1.25))
    lag = _get(result, "chain_lag", "modes", "aioengine", "lag_p99_ms")
    rows.append(("chain_lag: event-loop lag p99, ms", lag, "<=", 5.0))
    for sized in (_get(result, "chain_busy", "sizes") or {}).values():
        # A chain must not wait for a sync point: it is computed while the caller spins or
        # sleeps without awaiting. (When it starts cannot be seen from outside: ``ready``
        # says when it is done, and a spinning caller also takes a core from the workers;
        # the report's late_ms says how much later than awaited it is done.)
        for mode, caller in (("spin", "spinning"), ("sleep", "sleeping")):
            never = _get(sized, "modes", mode, "never")
            label = f"chain_busy {sized['elements']:,}: {caller} caller, runs never done"
            rows.append((label, never, "<=", 0))
    one, two = _get(result, "mlp", "one") or {}, _get(result, "mlp", "two") or {}
    vs = _get(one, "aioengine", "vs_numpy")
    rows.append(("mlp: NumPy time / aioengine time", vs, ">=", 1.0))
    vs = _get(one, "aioengine.array_api", "vs_numpy")
    rows.append(("mlp: NumPy time / aioengine.array_api time", vs, ">=", 1.0))
    vs = _get(two, "aioengine", "vs_numpy-in-turn")
    rows.append(("mlp_two: NumPy in turn / aioengine two at once", vs, ">=", 1.6))
    vs = _get(result, "kmeans", "peers", "aioengine", "vs_numpy")
    rows.append(("kmeans: NumPy time / aioengine time", vs, ">=", 1.5))
    return rows


def _peer_table(lines: list[str], peers: dict[str, Any], unit: str, scale: float) -> None:
    """Rows of peer, median time (in ``unit``, seconds times ``scale``) and its ratios."""
    refs = sorted({key[3:] for p in peers.values() for key in p if key.startswith("vs_")})
    head = "".join(f" {'vs ' + ref:>16}" for ref in refs)
    lines.append(f"    {'peer':22} {unit:>10}{head}")
    for name, p in peers.items():
        if "error" in p:
            lines.append(f"    {name:22} failed: {p['error']}")
            continue
        cells = "".join(
            f" {p['vs_' + ref]:15.2f}x" if "vs_" + ref in p else f" {'-':>16}" for ref in refs
        )
        lines.append(f"    {name:22} {p['wall_s'] * scale:10.3f}{cells}")


def _report_new(result: dict[str, Any], lines: list[str]) -> None:
    """The sections of chain, reductions, chain_memory, chain_lag, chain_busy, mlp, mlp_two and
    kmeans."""
    if "chain" in result:
        c = result["chain"]
        lines.append(
            f"\nchain: the 10-step elementwise chain on float64, median of {c['reps']} "
            "(vs X: X's time / this peer's, within each repetition, the median; > 1 is faster)"
        )
        for sized in c["sizes"].values():
            lines.append(
                f"  {sized['elements']:,} elements ({sized['chains_per_run']} chains per run)"
            )
            _peer_table(lines, sized["peers"], "ms/chain", 1e3)
    if "reductions" in result:
        r = result["reductions"]
        lines.append(f"\nreductions: {r['elements']:,} float64, median of {r['reps']}")
        for label, program in r["programs"].items():
            lines.append(f"  {label}")
            _peer_table(lines, program["peers"], "ms", 1e3)
        lines.append(f"  ({r['numexpr_note']})")
    if "chain_memory" in result:
        m = result["chain_memory"]
        lines.append(
            f"\nchain_memory: peak above the inputs (tracemalloc), the chain on "
            f"{m['elements']:,} float64 (result {m['result_mib']:.1f} MiB), a process per peer"
        )
        lines.append(f"  {'peer':22} {'peak MiB':>9} {'x result':>9}")
        for name, p in m["peers"].items():
            if "error" in p:
                lines.append(f"  {name:22} failed: {p['error']}")
                continue
            lines.append(f"  {name:22} {p['peak_mib']:9.1f} {p['multiple']:9.2f}")
    if "chain_lag" in result:
        lg = result["chain_lag"]
        lines.append(
            f"\nchain_lag: {lg['chains']} chains on {lg['elements']:,} float64 back to back, "
            f"a 1 ms heartbeat, worst of {lg['reps']}"
        )
        lines.append(f"  {'run':22} {'s/chain':>8} {'lag p99 ms':>11} {'lag max ms':>11}")
        for mode, p in lg["modes"].items():
            if "error" in p:
                lines.append(f"  {mode:22} failed: {p['error']}")
                continue
            lines.append(
                f"  {mode:22} {p['wall_per_chain_s']:8.3f} {p['lag_p99_ms']:11.2f} "
                f"{p['lag_max_ms']:11.2f}"
            )
    if "chain_busy" in result:
        cb = result["chain_busy"]
        lines.append(
            f"\nchain_busy: the chain pushed, then c.ready polled without awaiting (spin: a "
            f"pure-Python loop; sleep: 0.5 ms sleeps) or awaited at once; ms from the first "
            f"push until ready, median of {cb['reps']} (vs awaited: within each repetition)"
        )
        for sized in cb["sizes"].values():
            lines.append(f"  {sized['elements']:,} elements")
            lines.append(
                f"    {'mode':22} {'ready ms':>10} {'push ms':>8} {'vs awaited':>11} "
                f"{'late ms':>8} {'never':>6}"
            )
            for mode, p in sized["modes"].items():
                if "error" in p:
                    lines.append(f"    {mode:22} failed: {p['error']}")
                    continue
                ready = "never" if p["ready_s"] is None else f"{p['ready_s'] * 1e3:.2f}"
                vs, late = p.get("vs_awaited"), p.get("late_ms")
                vs_cell = "-" if "vs_awaited" not in p else "never" if vs is None else f"{vs:.2f}x"
                late_cell = (
                    "-" if "late_ms" not in p else "never" if late is None else f"{late:.2f}"
                )
                lines.append(
                    f"    {mode:22} {ready:>10} {p['push_s'] * 1e3:8.2f} {vs_cell:>11} "
                    f"{late_cell:>8} {p['never']:6d}"
                )
    if "mlp" in result:
        m = result["mlp"]
        lines.append(
            f"\nmlp: {m['layers']}, {m['steps']} steps of gradient descent on {m['samples']:,} "
            f"samples, loss read every {m['log_every']}; median of {m['reps']}; final loss "
            + ", ".join(f"{loss:.6g}" for loss in m["final_loss"])
        )
        if "one" in m:
            lines.append("  one model")
            _peer_table(lines, m["one"], "s", 1.0)
        if "two" in m:
            lines.append("  mlp_two: two models (seeds 7, 8), at once on the engine")
            _peer_table(lines, m["two"], "s", 1.0)
    if "kmeans" in result:
        k = result["kmeans"]
        if "error" in k:
            lines.append(f"\nkmeans: failed: {k['error']}")
        else:
            lines.append(
                f"\nkmeans: examples/arrays.py, {k['points']:,} points in {k['features']}-D, "
                f"{k['clusters']} clusters, {k['restarts']} restarts (iterations "
                f"{k['iterations']}), BLAS threads: {k['blas_threads']}; median of {k['reps']}"
            )
            _peer_table(lines, k["peers"], "s", 1.0)


def report(result: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    mode = "quick" if result["quick"] else "full"
    busy = f"; busy: {result['busy']} spinning processes beside it" if result["busy"] else ""
    lines = [f"arrays: {versions}; {result['cpus']} CPUs; {mode} mode{busy}"]
    lines += [f"  note: {note}" for note in result["notes"]]
    if "tiny" in result:
        t = result["tiny"]
        lines.append(
            f"\ntiny: {t['n_ops']:,} x c = c + b on {t['size']} float64, best of {t['reps']}"
        )
        lines.append(
            f"  {'peer':22} {'ops/s':>11} {'us/op':>8} {'CPU us/op':>10} {'median ops/s':>13}"
        )
        for name, p in t["peers"].items():
            if "error" in p:
                lines.append(f"  {name:22} failed: {p['error']}")
                continue
            lines.append(
                f"  {name:22} {p['ops_per_s']:11,.0f} {p['us_per_op']:8.2f} "
                f"{p['cpu_us_per_op']:10.2f} {p['median_ops_per_s']:13,.0f}"
            )
    if "branches" in result:
        b = result["branches"]
        lines.append(
            f"\nbranches: {b['branches']} chains x {b['ops_per_branch']} ops on "
            f"{b['mbytes']:.0f} MB float64, {b['workers']} workers, best of {b['reps']}"
        )
        lines.append(f"  {'peer':22} {'wall s':>8} {'median s':>9} {'vs NumPy':>9}  equal to NumPy")
        numpy_s = _get(b, "peers", "numpy", "wall_s")
        for name, p in b["peers"].items():
            if "error" in p:
                lines.append(f"  {name:22} failed: {p['error']}")
                continue
            eq = "bitwise" if p["bitwise_equal_to_numpy"] else "to 1e-12"
            speedup = f"{numpy_s / p['wall_s']:8.2f}x" if numpy_s else f"{'-':>9}"
            lines.append(
                f"  {name:22} {p['wall_s']:8.3f} {p['median_wall_s']:9.3f} {speedup}  {eq}"
            )
    if "overlap" in result:
        o = result["overlap"]
        lines.append(
            f"\noverlap: {o['chunks']} chunks of {o['chunk_elements']:,} float64, "
            f"{o['io_per_chunk_s'] * 1e3:.1f} ms I/O + {o['ops_per_chunk']} ops each, "
            f"median of {o['reps']}"
        )
        lines.append(f"  {'run':22} {'wall s':>8} {'lag p99 ms':>11} {'lag max ms':>11}")
        for mode, p in o["modes"].items():
            if "error" in p:
                lines.append(f"  {mode:22} failed: {p['error']}")
                continue
            lines.append(
                f"  {mode:22} {p['wall_s']:8.3f} {p['lag_p99_ms']:11.2f} {p['lag_max_ms']:11.2f}"
            )
    if "memory" in result:
        m = result["memory"]
        lines.append(
            f"\nmemory: a = a * 0.5 + 1 on {m['elements']:,} float64, {m['iterations']:,} "
            f"iterations (await every {m['every']} / wait_for_capacity on max_pending)"
        )
        lines.append(f"  {'variant':22} {'growth MiB':>11} {'start MiB':>10} {'ops/s':>9}")
        for variant, p in m["variants"].items():
            if "error" in p:
                lines.append(f"  {variant:22} failed: {p['error']}")
                continue
            early = "  (stopped early: over the limit)" if p["stopped_early"] else ""
            lines.append(
                f"  {variant:22} {p['growth_mib']:11.1f} {p['start_rss_mib']:10.1f} "
                f"{p['ops_per_s']:9,.0f}{early}"
            )
    _report_new(result, lines)
    lines.append("\ntargets (reported, never asserted)")
    floor = _ratio(
        _get(result, "branches", "peers", "numpy", "wall_s"),
        _get(result, "branches", "peers", "threads-floor", "wall_s"),
    )
    if floor is not None:
        # What the machine gave two threads in this run bounds the branches and overlap figures.
        lines.append(f"  (two plain threads ran the branches {floor:.2f}x as fast as NumPy here)")
    for row in result["targets"]:
        value = "n/a" if row["value"] is None else f"{row['value']:.2f}"
        met = {True: "yes", False: "NO", None: "-"}[row["met"]]
        lines.append(f"  {row['target']:52} {value:>8} {row['goal']:>8}  {met}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke mode: small sizes, 2 repetitions")
    ap.add_argument("--only", default=",".join(SHAPES), help="benchmarks to run (all)")
    ap.add_argument(
        "--reps", type=int, help="repetitions of tiny, branches, chain, reductions (7; 2 --quick)"
    )
    ap.add_argument(
        "--out", type=Path, help="the JSON file to write (results/arrays.json; --quick: quick/)"
    )
    ap.add_argument("--workers", type=int, default=2, help="CPU workers (engine and dask)")
    ap.add_argument("--no-mxnet", action="store_true", help="skip the MXNet peer")
    ap.add_argument("--no-install", action="store_true", help="never create MXNet's venv")
    ap.add_argument("--no-array-api", action="store_true", help="skip aioengine.array_api")
    ap.add_argument("--mxnet-venv", type=Path, default=ROOT / ".venv-mxnet")
    # Sizes (the defaults are the issue's; --quick overrides them).
    ap.add_argument("--tiny-ops", type=int, default=20_000)
    ap.add_argument("--branch-elements", type=int, default=1 << 20)
    ap.add_argument("--branch-ops", type=int, default=20)
    ap.add_argument("--chunks", type=int, default=50, help="overlap: chunks")
    ap.add_argument("--chunk-elements", type=int, default=1 << 18)
    ap.add_argument("--io-s", type=float, default=1.0, help="overlap: total simulated I/O")
    ap.add_argument("--compute-s", type=float, default=1.0, help="overlap: NumPy compute")
    ap.add_argument("--overlap-reps", type=int, help="(3; 1 with --quick)")
    ap.add_argument("--mem-iters", type=int, default=100_000)
    ap.add_argument("--mem-every", type=int, default=256)
    ap.add_argument("--mem-elements", type=int, default=131_072)
    ap.add_argument("--mem-limit-mib", type=int, default=2048, help=argparse.SUPPRESS)
    ap.add_argument(
        "--chain-sizes", default="1000,20000,100000,1000000,8000000", help="chain: elements"
    )
    ap.add_argument("--reduction-elements", type=int, default=8_000_000)
    ap.add_argument("--memory-chain-elements", type=int, default=8_000_000)
    ap.add_argument("--lag-elements", type=int, default=8_000_000)
    ap.add_argument("--lag-chains", type=int, default=5, help="chain_lag: chains back to back")
    ap.add_argument("--lag-reps", type=int, help="(3; 1 with --quick)")
    ap.add_argument("--chain-busy-sizes", default="1000000,8000000", help="chain_busy: elements")
    ap.add_argument("--chain-busy-reps", type=int, help="(5; 2 with --quick)")
    ap.add_argument("--mlp-samples", type=int, default=20_000)
    ap.add_argument("--mlp-steps", type=int, default=200)
    ap.add_argument("--mlp-reps", type=int, help="repetitions of mlp and mlp_two (3; 2 --quick)")
    ap.add_argument("--kmeans-reps", type=int, help="(3; 1 with --quick)")
    ap.add_argument(
        "--busy",
        type=int,
        nargs="?",
        const=1,
        default=0,
        metavar="N",
        help="run N CPU-bound processes beside the run (a busy machine; default N: 1)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--memory-variant", default="await", help=argparse.SUPPRESS)
    ap.add_argument("--memory-peer", default="aioengine", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.out = args.out or (QUICK_OUT if args.quick else OUT)
    args.only_set = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = sorted(args.only_set - set(SHAPES))
    if unknown:
        ap.error(f"--only: unknown benchmarks {', '.join(unknown)} (known: {', '.join(SHAPES)})")
    try:
        args.chain_sizes = [int(float(s)) for s in args.chain_sizes.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--chain-sizes: comma-separated element counts, got {args.chain_sizes!r}")
    try:
        args.chain_busy_sizes = [
            int(float(s)) for s in args.chain_busy_sizes.split(",") if s.strip()
        ]
    except ValueError:
        ap.error(
            f"--chain-busy-sizes: comma-separated element counts, got {args.chain_busy_sizes!r}"
        )
    if args.quick:
        args.tiny_ops, args.branch_elements = 2_000, 131_072
        args.chunks, args.chunk_elements, args.io_s, args.compute_s = 10, 131_072, 0.1, 0.1
        args.mem_iters = 2_000
        args.chain_sizes = [1_000, 100_000, 1_000_000]
        args.chain_busy_sizes = [1_000_000]
        args.reduction_elements = args.memory_chain_elements = args.lag_elements = 1_000_000
        args.lag_chains, args.mlp_samples, args.mlp_steps = 3, 2_000, 20
    args.reps = args.reps or (2 if args.quick else 7)
    args.overlap_reps = args.overlap_reps or (1 if args.quick else 3)
    args.lag_reps = args.lag_reps or (1 if args.quick else 3)
    args.chain_busy_reps = args.chain_busy_reps or (2 if args.quick else 5)
    args.mlp_reps = args.mlp_reps or (2 if args.quick else 3)
    args.kmeans_reps = args.kmeans_reps or (1 if args.quick else 3)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child == "memory":
        out = asyncio.run(
            _memory_loop(
                args.memory_variant,
                args.mem_iters,
                args.mem_every,
                args.mem_elements,
                args.mem_limit_mib << 20,
            )
        )
        print(json.dumps(out))
        return 0
    if args.child == "chain_memory":
        print(json.dumps(chain_memory_child(args.memory_peer, args.memory_chain_elements)))
        return 0
    if args.child == "kmeans":
        print(json.dumps(kmeans_child(args.kmeans_reps)))
        return 0
    if args.child:
        return _serve(args.child)
    only = args.only_set
    try:
        import aioengine.array  # noqa: F401
    except ImportError as exc:
        print(f"arrays: aioengine.array does not import ({exc})")
        return 1
    t0 = time.perf_counter()
    notes: list[str] = []
    failures: list[str] = []
    children = _start_children(args, notes) if "tiny" in only else {}
    result: dict[str, Any] = {
        "benchmark": "arrays",
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "busy": args.busy,
        "versions": _versions(children),
        "notes": notes,
    }
    if os.environ.get("OPENBLAS_CORETYPE"):
        notes.append(f"OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} (from the environment)")
    if only & {"chain"}:
        notes.append(
            "chain floor: np.add(a_chunk, b_chunk, out=out_chunk) on a thread per core (reads "
            "both inputs once, writes a fresh output once)"
        )
    spawn = multiprocessing.get_context("spawn")
    spinners = [spawn.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for spinner in spinners:
        spinner.start()
    try:
        try:
            if "tiny" in only:
                result["tiny"] = bench_tiny(args, children, failures)
        finally:
            for child in children.values():
                child.close()
        if "branches" in only:
            result["branches"] = bench_branches(args, failures)
        if "overlap" in only:
            result["overlap"] = bench_overlap(args, failures)
        if "memory" in only:
            result["memory"] = bench_memory(args, failures)
        if "chain" in only:
            result["chain"] = bench_chain(args, notes, failures)
        if "reductions" in only:
            result["reductions"] = bench_reductions(args, notes, failures)
        if "chain_memory" in only:
            result["chain_memory"] = bench_chain_memory(args, notes, failures)
        if "chain_lag" in only:
            result["chain_lag"] = bench_chain_lag(args, failures)
        if "chain_busy" in only:
            result["chain_busy"] = bench_chain_busy(args, failures)
        if only & {"mlp", "mlp_two"}:
            result["mlp"] = bench_mlp(args, failures)
        if "kmeans" in only:
            result["kmeans"] = bench_kmeans(args, failures)
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()
    result["targets"] = targets(result)
    result["failures"] = failures
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(report(result))
    for failure in failures:
        print(f"FAILED {failure}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {os.path.relpath(args.out, ROOT)} in {result['seconds']} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
