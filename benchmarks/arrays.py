"""Engine-backed arrays (``aioengine.array``) against NumPy, MXNet's NDArray, JAX and dask.array.

Four measurements, each peer side by side in one run (the ratios are taken within the run):

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

``--quick`` (the smoke run in ``nox -s bench_smoke``) shrinks everything: 2,000-operation
chains, 1 MB arrays, 0.1 s of I/O, 2,000 iterations, two repetitions.

Usage::

    python benchmarks/arrays.py                 # everything (about 2-3 minutes on 2 cores)
    python benchmarks/arrays.py --quick         # smoke: small sizes, under 30 s
    python benchmarks/arrays.py --only tiny,branches --reps 9

Prints the peers' figures and a table of the targets; writes ``benchmarks/results/arrays.json``
(``--out``). Timings are reported, never judged: the exit status is 1 only when a result is
wrong or a peer crashed. MXNet is skipped, with a note, when its venv cannot be made
(``--no-mxnet`` skips it outright); JAX when it does not import.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
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
# report


def _versions(children: dict[str, ChildPeer]) -> dict[str, str]:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        import aioengine
        from aioengine.engine import _COMPILED

        core = "compiled" if _COMPILED else "pure Python"
        out["aioengine"] = f"{aioengine.__version__} ({core})"
    except ImportError as exc:
        out["aioengine"] = f"ERROR {exc}"
    try:
        import dask

        out["dask"] = str(dask.__version__)
    except ImportError:
        pass
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
    out = []
    for name, value, op, goal in rows:
        met = None if value is None else (value >= goal if op == ">=" else value <= goal)
        out.append({"target": name, "value": value, "goal": f"{op} {goal:g}", "met": met})
    return out


def report(result: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    mode = "quick" if result["quick"] else "full"
    lines = [f"arrays: {versions}; {result['cpus']} CPUs; {mode} mode"]
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
        lines.append(f"  {row['target']:48} {value:>8} {row['goal']:>8}  {met}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke mode: small sizes, 2 repetitions")
    ap.add_argument("--only", default="tiny,branches,overlap,memory", help="benchmarks to run")
    ap.add_argument("--reps", type=int, help="repetitions of tiny and branches (7; 2 with --quick)")
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
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--memory-variant", default="await", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.out = args.out or (QUICK_OUT if args.quick else OUT)
    if args.quick:
        args.tiny_ops, args.branch_elements = 2_000, 131_072
        args.chunks, args.chunk_elements, args.io_s, args.compute_s = 10, 131_072, 0.1, 0.1
        args.mem_iters = 2_000
    args.reps = args.reps or (2 if args.quick else 7)
    args.overlap_reps = args.overlap_reps or (1 if args.quick else 3)
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
    if args.child:
        return _serve(args.child)
    only = {name.strip() for name in args.only.split(",") if name.strip()}
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
        "versions": _versions(children),
        "notes": notes,
    }
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
