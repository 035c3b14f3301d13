"""GPU copy/compute overlap through the engine, on a real GPU; prints one JSON object.

What it measures (the real-GPU test plan in ``docs/gpu-design.md``, section "Testing"):

* **overlap**: ``batches`` batches of h2d (from pinned memory) -> compute (``tanh(x @ w)``)
  -> d2h (into pinned memory), pushed through the engine with ``FnProperty.COPY_TO_GPU`` /
  ``NORMAL`` / ``COPY_FROM_GPU`` so they run on three streams, against the same operations all
  pushed as ``NORMAL`` (one stream: no overlap, same engine overhead). ``ratio`` =
  serialized wall / pipelined wall: 1.0 means no overlap; ``ideal_ratio`` (the sum of the three
  stage times over the longest, measured alone with timing events) is the most overlap can give.
  Batches use a ring of ``RING`` device and pinned buffers, each with its Var, so the h2d of
  batch i + RING waits (on the device, with ``wait_event``) for the compute that read its slot.
* **event_query_us**: the cost of one ``cudaEventQuery`` (what the poller calls per stream per
  tick) on a completed event and on a pending one.
* **poll_latency_ms**: from a kernel's completion (seen by a helper thread blocked on a
  blocking-sync event recorded right after it) to ``await op`` returning, on asyncio and, if
  installed, uvloop; compare with the poller's back-off (1 ms to ``Poller.max_delay``).

Timings are reported, never judged. Without CuPy or without a usable CUDA device it prints
``{"benchmark": "gpu_overlap", "skipped": true, "reason": ...}`` and exits 0.

Usage::

    python benchmarks/gpu_overlap.py            # 16 batches of 4096 x 4096 float32, 3 reps
    python benchmarks/gpu_overlap.py --quick    # 8 batches of 1024 x 1024, 1 rep
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import aioengine as ae
from aioengine.poller import Poller

RING = 3  # device/pinned buffer slots: batches whose work may be in flight at once
GPU = ae.gpu(0)
SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def skip_reason() -> str | None:
    """Why this machine cannot run the benchmark, or None if it can."""
    if ae.gpu_available():
        return None
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'aioengine[gpu]')"
    return f"CuPy {cupy.__version__} finds no usable CUDA device"


class Bench:
    """Buffers and kernels shared by the measurements."""

    def __init__(self, batches: int, rows: int, cols: int) -> None:
        import cupy
        import cupyx

        self.cupy = cupy
        self.batches, self.rows, self.cols = batches, rows, cols
        rng = np.random.default_rng(0)
        host_w = (rng.standard_normal((cols, cols)) / np.sqrt(cols)).astype(np.float32)
        self.w = cupy.asarray(host_w)
        shape = (rows, cols)
        self.host_in = [cupyx.empty_pinned(shape, np.float32) for _ in range(RING)]
        self.host_out = [cupyx.empty_pinned(shape, np.float32) for _ in range(RING)]
        for k, buf in enumerate(self.host_in):
            buf[...] = rng.standard_normal(shape).astype(np.float32) * (k + 1)
        self.dev_in = [cupy.empty(shape, np.float32) for _ in range(RING)]
        self.dev_out = [cupy.empty(shape, np.float32) for _ in range(RING)]
        self.spin_kernel = cupy.RawKernel(SPIN, "spin")
        cupy.cuda.Device(GPU.device_id).synchronize()  # made on this thread's stream
        self.cycles_per_s = self._calibrate()

    # -- the three stages (each runs with its stream current) --------------------------------

    def h2d(self, k: int) -> None:
        self.dev_in[k].set(self.host_in[k], stream=self.cupy.cuda.get_current_stream())

    def compute(self, k: int) -> None:
        cupy = self.cupy
        cupy.dot(self.dev_in[k], self.w, out=self.dev_out[k])
        cupy.tanh(self.dev_out[k], out=self.dev_out[k])

    def d2h(self, k: int) -> None:
        stream = self.cupy.cuda.get_current_stream()
        self.dev_out[k].get(stream=stream, out=self.host_out[k], blocking=False)

    # -- helpers -----------------------------------------------------------------------------

    def _calibrate(self) -> float:
        cupy = self.cupy
        probe = 20_000_000
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            self.spin_kernel((1,), (1,), (np.int64(probe),))  # load; raise the clocks
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            self.spin_kernel((1,), (1,), (np.int64(probe),))
            end.record(stream)
        end.synchronize()
        ms: float = cupy.cuda.get_elapsed_time(start, end)
        return probe / (ms / 1e3)

    def spin(self, seconds: float) -> None:
        """Enqueue a kernel that runs about ``seconds`` on the current stream."""
        self.spin_kernel((1,), (1,), (np.int64(int(seconds * self.cycles_per_s)),))

    def stage_ms(self, reps: int = 5) -> dict[str, float]:
        """Device time of each stage alone (timing events, one stream, median of ``reps``)."""
        cupy = self.cupy
        stream = cupy.cuda.Stream(non_blocking=True)
        out: dict[str, float] = {}
        with stream:
            for name, stage in (("h2d", self.h2d), ("compute", self.compute), ("d2h", self.d2h)):
                times = []
                for _ in range(reps + 1):  # the first is a warm-up
                    start, end = cupy.cuda.Event(), cupy.cuda.Event()
                    start.record(stream)
                    stage(0)
                    end.record(stream)
                    end.synchronize()
                    times.append(cupy.cuda.get_elapsed_time(start, end))
                out[name] = statistics.median(times[1:])
        return out


async def run_batches(bench: Bench, engine: ae.Engine, overlapped: bool) -> float:
    """Push every batch's three stages and wait for them; return the wall time."""
    normal = ae.FnProperty.NORMAL
    up = ae.FnProperty.COPY_TO_GPU if overlapped else normal
    down = ae.FnProperty.COPY_FROM_GPU if overlapped else normal
    dev_in = [engine.new_var(f"dev_in{k}") for k in range(RING)]
    dev_out = [engine.new_var(f"dev_out{k}") for k in range(RING)]
    host_in = [engine.new_var(f"host_in{k}") for k in range(RING)]
    host_out = [engine.new_var(f"host_out{k}") for k in range(RING)]
    w = engine.new_var("w")
    # Bound fns built before the clock starts (marshalling, as in benchmarks/run.py).
    ops: list[tuple[Callable[[ae.RunContext], None], list[ae.Var], list[ae.Var], Any]] = []
    for i in range(bench.batches):
        k = i % RING
        ops.append((_stage(bench.h2d, k), [host_in[k]], [dev_in[k]], up))
        ops.append((_stage(bench.compute, k), [dev_in[k], w], [dev_out[k]], normal))
        ops.append((_stage(bench.d2h, k), [dev_out[k]], [host_out[k]], down))
    t0 = time.perf_counter()
    for fn, const, mutate, prop in ops:
        engine.push_sync(fn, GPU, const, mutate, prop=prop)
    await engine.wait_for_all()
    return time.perf_counter() - t0


def _stage(stage: Callable[[int], None], k: int) -> Callable[[ae.RunContext], None]:
    def fn(rctx: ae.RunContext) -> None:
        stage(k)

    return fn


async def measure_overlap(bench: Bench, reps: int) -> dict[str, Any]:
    walls: dict[str, list[float]] = {"pipelined": [], "serialized": []}
    async with ae.Engine() as engine:
        await run_batches(bench, engine, True)  # warm-up: streams, cuBLAS, pools
        await run_batches(bench, engine, False)
        for _ in range(reps):
            for name, overlapped in (("pipelined", True), ("serialized", False)):
                walls[name].append(await run_batches(bench, engine, overlapped))
    # Check the last run's output of each slot against NumPy (a few rows): a wrong order
    # must be reported as a failure, never as a fast time.
    w = bench.w.get()
    for k in range(min(RING, bench.batches)):
        expected = np.tanh(bench.host_in[k][:8] @ w)
        err = float(np.abs(bench.host_out[k][:8] - expected).max())
        if err > 1e-3:
            raise AssertionError(f"slot {k}: the result differs from NumPy by {err}")
    pipelined = statistics.median(walls["pipelined"])
    serialized = statistics.median(walls["serialized"])
    stage = bench.stage_ms()
    return {
        "pipelined_s": pipelined,
        "serialized_s": serialized,
        "ratio": serialized / pipelined,
        "stage_ms": stage,
        "ideal_ratio": sum(stage.values()) / max(stage.values()),
        "walls": walls,
    }


def measure_event_query(bench: Bench, n: int = 20_000) -> dict[str, Any]:
    """Microseconds per ``cudaEventQuery`` on a completed and on a pending event."""
    cupy = bench.cupy
    query = cupy.cuda.runtime.eventQuery
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        done = cupy.cuda.Event(disable_timing=True)
        done.record(stream)
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            query(done.ptr)
        done_us = (time.perf_counter() - t0) / n * 1e6
        bench.spin(0.5)  # long enough for every query below
        pending = cupy.cuda.Event(disable_timing=True)
        pending.record(stream)
        t0 = time.perf_counter()
        statuses = {query(pending.ptr) for _ in range(n)}
        pending_us = (time.perf_counter() - t0) / n * 1e6
        stream.synchronize()
    return {"done": done_us, "pending": pending_us, "pending_statuses": sorted(statuses)}


async def measure_poll_latency(bench: Bench, trials: int, kernel_s: float) -> dict[str, float]:
    """Milliseconds from a kernel's completion to ``await op`` returning (median/p90/max)."""
    cupy = bench.cupy
    latencies: list[float] = []
    async with ae.Engine() as engine:
        v = engine.new_var("v")
        await engine.push_sync(lambda rctx: None, GPU, [], [v])  # warm-up
        for _ in range(trials):
            done_at: list[float] = []
            helper: list[threading.Thread] = []

            def op(
                rctx: ae.RunContext,
                done_at: list[float] = done_at,
                helper: list[threading.Thread] = helper,
            ) -> None:
                bench.spin(kernel_s)
                event = cupy.cuda.Event(block=True, disable_timing=True)
                event.record(rctx.stream)

                def note() -> None:
                    event.synchronize()  # sleeps (blocking sync); the GIL is released
                    done_at.append(time.perf_counter())

                helper.append(threading.Thread(target=note, daemon=True))
                helper[0].start()

            await engine.push_sync(op, GPU, [], [v])
            resolved = time.perf_counter()
            await asyncio.to_thread(helper[0].join, 10)  # it may note its time a little later
            latencies.append((resolved - done_at[0]) * 1e3)
    latencies.sort()
    return {
        "median": statistics.median(latencies),
        "p90": latencies[int(0.9 * (len(latencies) - 1))],
        "max": latencies[-1],
        "n": len(latencies),
    }


def loop_factories() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    try:
        import uvloop
    except ImportError:
        pass
    else:
        factories["uvloop"] = uvloop.new_event_loop
    return factories


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 repetition")
    ap.add_argument("--batches", type=int, help="batches per run (default 16, quick 8)")
    ap.add_argument("--size", type=int, help="rows = cols of a batch (default 4096, quick 1024)")
    ap.add_argument("--reps", type=int, help="repetitions (default 3, quick 1)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    reason = skip_reason()
    if reason is not None:
        print(json.dumps({"benchmark": "gpu_overlap", "skipped": True, "reason": reason}))
        return 0
    import cupy

    batches = args.batches or (8 if args.quick else 16)
    size = args.size or (1024 if args.quick else 4096)
    reps = args.reps or (1 if args.quick else 3)
    bench = Bench(batches, size, size)
    props = cupy.cuda.runtime.getDeviceProperties(GPU.device_id)
    name = props["name"]
    result: dict[str, Any] = {
        "benchmark": "gpu_overlap",
        "skipped": False,
        "device": name.decode() if isinstance(name, bytes) else str(name),
        "cupy": cupy.__version__,
        "python": sys.version.split()[0],
        "batches": batches,
        "shape": [size, size],
        "reps": reps,
        "poller": {"min_delay_ms": Poller.min_delay * 1e3, "max_delay_ms": Poller.max_delay * 1e3},
    }
    result["overlap"] = asyncio.run(measure_overlap(bench, reps))
    result["event_query_us"] = measure_event_query(bench)
    trials = 10 if args.quick else 50
    result["poll_latency_ms"] = {}
    for loop_name, factory in loop_factories().items():
        with asyncio.Runner(loop_factory=factory) as runner:
            latency = runner.run(measure_poll_latency(bench, trials, 0.002))
        result["poll_latency_ms"][loop_name] = latency
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
