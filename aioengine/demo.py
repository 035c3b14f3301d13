"""The demos behind ``python -m aioengine``: each runs real work and checks its result.

``demo`` (:func:`run_pipeline_demo`), the showcase: the read -> decode -> transform -> upload
-> reduce pipeline of ``pipeline.py`` (the code ``examples/pipeline.py`` runs) on an engine,
traced and with a progress bar, then recomputed sequentially with no engine; the two summaries
must be bit-identical.

``bench-demo`` (:func:`run_demo`): a seeded random program of operations over Vars that each
guard one NumPy array: every operation reads up to three arrays and overwrites one or two, on
the engine's CPU pools (NumPy releases the GIL inside its kernels, so independent operations
really overlap), with a few coroutine operations that "upload" checksums the way an I/O-bound
step would. The same program then runs again on a serial engine, and every array must be
bit-identical.

Both checks hold because of the engine's rule (conflicting operations run in push order):
it is exactly what makes the parallel run agree with the serial one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .context import RunContext, cpu
from .engine import Engine
from .pipeline import IO_LATENCY, RECORDS, SIZE, PipelineSummary, run_pipeline, run_sequential

__all__ = (
    "DemoReport",
    "PipelineDemoReport",
    "Program",
    "make_program",
    "run_demo",
    "run_pipeline_demo",
    "run_program",
)


@dataclass(frozen=True, slots=True)
class PipelineDemoReport:
    """What :func:`run_pipeline_demo` ran and found.

    Attributes:
        summary: the engine run's result.
        wall_s: the engine run's wall time, from the first push to the end of the wait.
        sequential: the result of the same stages run one after another with no engine.
        sequential_wall_s: that run's wall time.
        workers: the engine's CPU worker threads.
        tracks: the names of the trace's tracks (worker threads, the event loop, coroutine
            lanes), in the trace's order; empty when not traced.
    """

    summary: PipelineSummary
    wall_s: float
    sequential: PipelineSummary
    sequential_wall_s: float
    workers: int
    tracks: tuple[str, ...] = ()

    @property
    def verified(self) -> bool:
        """Whether the engine run's summary equals the sequential one exactly (bit for bit)."""
        return self.summary == self.sequential


def _track_names(trace: dict[str, Any]) -> tuple[str, ...]:
    return tuple(
        str(event["args"]["name"])
        for event in trace["traceEvents"]
        if event.get("ph") == "M" and event.get("name") == "thread_name"
    )


async def run_pipeline_demo(
    *,
    records: int = RECORDS,
    size: int = SIZE,
    io_latency: float = IO_LATENCY,
    seed: int = 0,
    workers: int | None = None,
    trace_path: str | os.PathLike[str] | None = None,
    progress: bool = False,
    cluster: str | None = None,
) -> PipelineDemoReport:
    """Run the pipeline on a new engine, then sequentially, and report both.

    With ``cluster`` (a Dask scheduler address, or ``"local"`` for a ``LocalCluster`` of the
    engine's own), the NumPy stages run on that cluster (``Engine(cluster=...)``).

    The engine run has ``workers`` CPU threads (None: the engine's default), is traced to
    ``trace_path`` (Chrome trace JSON) when it is given, and shows a progress bar with
    ``progress=True``. A mismatch is not raised: check :attr:`PipelineDemoReport.verified`.

    Raises:
        ValueError: if ``records < 1``, ``size < 1``, ``io_latency`` is negative or not
            finite, ``seed < 0``, or ``workers`` (or ``AIOENGINE_CPU_WORKERS``) is not a
            positive number.
    """
    async with Engine(cpu_workers=workers, cluster=cluster) as engine:
        with contextlib.ExitStack() as stack:
            session = None if trace_path is None else stack.enter_context(engine.trace(trace_path))
            t0 = time.perf_counter()
            summary = await run_pipeline(
                engine,
                records=records,
                size=size,
                io_latency=io_latency,
                seed=seed,
                progress=progress,
                on_cluster=cluster is not None,
            )
            wall = time.perf_counter() - t0
        # the trace is written now (on leaving the stack)
        tracks = () if session is None or session.trace is None else _track_names(session.trace)
        n_workers = engine.cpu_workers
    t0 = time.perf_counter()
    sequential = await run_sequential(records=records, size=size, io_latency=io_latency, seed=seed)
    return PipelineDemoReport(
        summary=summary,
        wall_s=wall,
        sequential=sequential,
        sequential_wall_s=time.perf_counter() - t0,
        workers=n_workers,
        tracks=tracks,
    )


@dataclass(frozen=True, slots=True)
class Step:
    """One operation of a :class:`Program`: which arrays it reads and which it overwrites."""

    reads: tuple[int, ...]
    writes: tuple[int, ...]
    upload: bool  # a coroutine op that only reads (I/O-style), instead of a NumPy kernel


@dataclass(frozen=True, slots=True)
class Program:
    """A seeded random program over ``n_vars`` arrays of ``size`` x ``size`` floats."""

    n_vars: int
    size: int
    steps: tuple[Step, ...]
    seed: int


def make_program(n_ops: int, n_vars: int, size: int, seed: int) -> Program:
    """Generate a random program: each op reads 0-3 arrays and writes 1-2 (or uploads one).

    Raises:
        ValueError: if ``n_ops < 1``, ``n_vars < 2``, ``size < 1`` or ``seed < 0`` (the seed
            also seeds NumPy's ``default_rng``, which rejects negative seeds).
    """
    if n_ops < 1 or n_vars < 2 or size < 1 or seed < 0:
        raise ValueError(
            f"need n_ops >= 1, n_vars >= 2, size >= 1 and seed >= 0, got n_ops={n_ops}, "
            f"n_vars={n_vars}, size={size}, seed={seed}"
        )
    rng = random.Random(seed)
    steps = []
    for _ in range(n_ops):
        if rng.random() < 0.1:
            steps.append(Step((rng.randrange(n_vars),), (), True))
            continue
        writes = tuple(rng.sample(range(n_vars), rng.randint(1, 2)))
        reads = tuple(rng.sample(range(n_vars), rng.randint(0, 3)))
        steps.append(Step(reads, writes, False))
    return Program(n_vars, size, tuple(steps), seed)


@dataclass
class DemoReport:
    """What one run of a program did."""

    ops: int
    vars: int
    wall_s: float
    busy_s: float  # summed run time of the operations
    uploads: int
    checksum: float
    arrays: list[np.ndarray] = field(repr=False)
    threads: set[str] = field(default_factory=set, repr=False)

    @property
    def parallelism(self) -> float:
        """Average number of operations running at once (busy time / wall time)."""
        return self.busy_s / self.wall_s if self.wall_s > 0 else 0.0


def _kernel(out: np.ndarray, inputs: list[np.ndarray], salt: float) -> None:
    """Overwrite ``out`` in place from itself and the inputs.

    Elementwise ufuncs only: they release the GIL, so kernels on different threads overlap,
    and they use no BLAS threads of their own that would compete with the engine's workers.
    """
    np.sin(out, out=out)
    out *= 0.5
    for x in inputs:
        out += np.cos(x)
    out += salt
    np.tanh(out, out=out)
    np.exp(out, out=out)
    np.log1p(out, out=out)


async def run_program(program: Program, engine: Engine, *, progress: bool = False) -> DemoReport:
    """Push ``program`` on ``engine``, wait for it, and report (arrays are the results).

    ``progress=True`` shows a progress bar while waiting (``wait_for_all(progress=True)``).
    """
    rng = np.random.default_rng(program.seed)
    arrays = [rng.standard_normal((program.size, program.size)) for _ in range(program.n_vars)]
    vars_ = [engine.new_var(f"a{i}") for i in range(program.n_vars)]
    busy = 0.0
    uploads: list[float] = []
    lock = threading.Lock()
    threads: set[str] = set()

    def op(step: Step, index: int, rctx: RunContext) -> None:
        nonlocal busy
        t0 = time.perf_counter()
        inputs = [arrays[i] for i in step.reads if i not in step.writes]
        for k, w in enumerate(step.writes):
            _kernel(arrays[w], inputs, salt=(index + k) * 1e-3)
        elapsed = time.perf_counter() - t0
        with lock:
            busy += elapsed
            threads.add(threading.current_thread().name)

    async def upload(array: np.ndarray) -> None:
        value = float(array.sum())  # read the array while we hold its Var
        await asyncio.sleep(0.005)  # the network round trip of a real upload
        uploads.append(value)

    t0 = time.perf_counter()
    for index, step in enumerate(program.steps):
        if step.upload:
            target = arrays[step.reads[0]]

            async def fn(rctx: RunContext, target: np.ndarray = target) -> None:
                await upload(target)

            engine.push_async(fn, cpu(), const_vars=[vars_[step.reads[0]]], name="upload")
        else:
            engine.push_sync(
                functools.partial(op, step, index),
                cpu(),
                const_vars=[vars_[i] for i in step.reads],
                mutate_vars=[vars_[i] for i in step.writes],
                name=f"op{index}",
            )
    await engine.wait_for_all(progress=progress)
    wall = time.perf_counter() - t0
    return DemoReport(
        ops=len(program.steps),
        vars=program.n_vars,
        wall_s=wall,
        busy_s=busy,
        uploads=len(uploads),
        checksum=float(sum(a.sum() for a in arrays)),
        arrays=arrays,
        threads=threads,
    )


async def run_demo(
    *,
    n_ops: int = 600,
    n_vars: int = 32,
    size: int = 256,
    seed: int = 0,
    workers: int | None,
    trace_path: str | os.PathLike[str] | None = None,
    progress: bool = False,
) -> tuple[DemoReport, DemoReport]:
    """Run the program threaded and serially; raise AssertionError if they disagree.

    The threaded run has ``workers`` CPU threads (None: the engine's default), is traced to
    ``trace_path`` (Chrome trace JSON) when it is given, and shows a progress bar with
    ``progress=True``.

    Raises:
        ValueError: as :func:`make_program`, or if ``workers`` (or
            ``AIOENGINE_CPU_WORKERS``) is not a positive number; before any work runs.
        AssertionError: if an array differs between the two runs.
    """
    program = make_program(n_ops, n_vars, size, seed)
    async with Engine(cpu_workers=workers) as engine:
        if trace_path is not None:
            async with engine.trace(trace_path):
                threaded = await run_program(program, engine, progress=progress)
        else:
            threaded = await run_program(program, engine, progress=progress)
    async with Engine(serial=True) as engine:
        serial = await run_program(program, engine)
    for i, (a, b) in enumerate(zip(threaded.arrays, serial.arrays, strict=True)):
        if not np.array_equal(a, b):
            raise AssertionError(f"array a{i} differs between the threaded and the serial run")
    return threaded, serial
