"""A GPU pipeline: upload (h2d) -> compute -> download (d2h), overlapped across batches.

Every batch goes through five operations, each on the batch's own Vars:

    fill (CPU pool: writes a pinned host buffer)
      -> h2d      (gpu(0), FnProperty.COPY_TO_GPU:   the h2d stream)
      -> compute  (gpu(0), FnProperty.NORMAL:        the compute stream)
      -> d2h      (gpu(0), FnProperty.COPY_FROM_GPU: the d2h stream, into a pinned buffer)
      -> collect  (CPU pool: reads the pinned buffer)

The three GPU families have a stream each, and a GPU operation releases its Vars as soon as
its work is *enqueued*; the engine orders the streams with events (``wait_event``), never with
the host. So the GPU works on three batches at once: batch i+1 uploads while batch i computes
and batch i-1 downloads. The CPU operations are host consumers: ``fill`` waits until the upload
that last read its pinned buffer has *completed*, ``collect`` until its download has.

The same code runs on CuPy (``xp = cupy``, pinned host buffers from ``cupyx.empty_pinned``,
asynchronous copies) and, when no GPU is usable here, on ``aioengine.SimulatedGPU`` (``xp =
numpy``; a device thread runs the kernels in a random order that the stream rules allow).
Device work goes through ``rctx.launch`` so that it is enqueued on the operation's stream on
both. The results are checked against NumPy.

Run: python examples/gpu_pipeline.py   (AIOENGINE_EXAMPLE_SMALL=1 for a quick run)
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import aioengine as ae

SMALL = os.environ.get("AIOENGINE_EXAMPLE_SMALL") == "1"
RING = 3  # pinned host buffers per direction: batches whose copies may be in flight at once
GPU = ae.gpu(0)


@dataclass
class Device:
    """The few device calls the pipeline makes, for CuPy or for the simulated GPU.

    ``upload`` and ``download`` are *kernels*: they are run through ``rctx.launch``, so they
    land on the operation's stream (CuPy: called at once with the stream current, the copy is
    asynchronous; simulator: enqueued and run later by the device thread, in stream order).
    """

    simulated: bool
    xp: Any  # the array module: cupy or numpy
    empty_pinned: Callable[..., np.ndarray]  # page-locked host memory (numpy.empty on the sim)
    upload: Callable[[Any, np.ndarray], None]  # host -> device, into a preallocated array
    download: Callable[[np.ndarray, Any], None]  # device -> host, into a preallocated array
    order: list[str]  # the simulator's kernel order (labels), to show the interleaving
    description: str


def cupy_device() -> Device:
    import cupy
    import cupyx

    def upload(dst: Any, src: np.ndarray) -> None:
        # An asynchronous H2D copy on the op's stream (rctx.launch made it current), as
        # cupy.asarray(src, blocking=False) does, but into an array allocated on this stream.
        # From pinned memory it truly overlaps; ``src`` must stay alive and unchanged until the
        # copy has completed, which the Vars guarantee: the next fill of this buffer is a host
        # consumer and waits for this op's fence.
        dst.set(src, stream=cupy.cuda.get_current_stream())

    def download(dst: np.ndarray, src: Any) -> None:
        # Asynchronous D2H into pinned memory: ``dst`` is valid once the op's fence has
        # completed (the collect operation, a host consumer, starts only then).
        src.get(stream=cupy.cuda.get_current_stream(), out=dst, blocking=False)

    props = cupy.cuda.runtime.getDeviceProperties(GPU.device_id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return Device(
        simulated=False,
        xp=cupy,
        empty_pinned=cupyx.empty_pinned,
        upload=upload,
        download=download,
        order=[],
        description=f"CuPy {cupy.__version__} on {GPU!r}: {name}",
    )


def simulated_device() -> Device:
    return Device(
        simulated=True,
        xp=np,
        empty_pinned=np.empty,
        upload=np.copyto,
        download=np.copyto,
        order=[],
        description="the simulated GPU (aioengine.SimulatedGPU: NumPy kernels on a device "
        "thread; the timings are not GPU timings)",
    )


def layer(xp: Any, x: Any, w: Any, y: Any) -> None:
    """The compute kernel: ``y = tanh(x @ w)``, in place (works for numpy and cupy)."""
    xp.dot(x, w, out=y)
    xp.tanh(y, out=y)


async def run_pipeline(device: Device, batches: int, rows: int, cols: int) -> dict[str, Any]:
    xp = device.xp
    rng = np.random.default_rng(0)
    w_host = (rng.standard_normal((cols, cols)) / np.sqrt(cols)).astype(np.float32)
    base = rng.standard_normal((rows, cols)).astype(np.float32)
    scales = np.linspace(0.5, 1.5, batches, dtype=np.float32)  # batch i is base * scales[i]

    pinned_w = device.empty_pinned((cols, cols), np.float32)
    pinned_w[...] = w_host
    pinned_in = [device.empty_pinned((rows, cols), np.float32) for _ in range(RING)]
    pinned_out = [device.empty_pinned((rows, cols), np.float32) for _ in range(RING)]
    results = np.empty((batches, rows, cols), np.float32)
    # Device arrays by name. Each entry is used only by operations holding the Var of the same
    # name, so the Vars order every access to it, as MXNet's Vars order access to NDArrays.
    dev: dict[str, Any] = {}
    lock = threading.Lock()

    def tagged(label: str, kernel: Callable[..., None]) -> Callable[..., None]:
        """``kernel``, recording ``label`` when it runs on the simulated device."""
        if not device.simulated:
            return kernel

        def run(*args: Any) -> None:
            with lock:
                device.order.append(label)
            kernel(*args)

        return run

    def upload_w(rctx: ae.RunContext) -> None:
        w = xp.empty((cols, cols), np.float32)  # allocated on this op's (h2d) stream
        rctx.launch(tagged("W", device.upload), w, pinned_w)
        dev["w"] = w  # lives as long as the pipeline: no keep_alive needed

    def fill(i: int, k: int, rctx: ae.RunContext) -> None:
        # A CPU operation writing pinned_in[k]: it waits until the upload that last read this
        # buffer (batch i - RING) has completed on the device, not merely been enqueued.
        np.multiply(base, scales[i], out=pinned_in[k])

    def upload(i: int, k: int, rctx: ae.RunContext) -> None:
        x = xp.empty((rows, cols), np.float32)
        rctx.launch(tagged(f"H{i}", device.upload), x, pinned_in[k])
        dev[f"x{i}"] = x

    def compute(i: int, rctx: ae.RunContext) -> None:
        # Runs on the compute stream; the engine made that stream wait for the h2d fence of
        # x{i} (and of w) first. The op's Vars are released once this returns.
        x = dev.pop(f"x{i}")  # its last use: drop the name now...
        y = xp.empty((rows, cols), np.float32)
        rctx.launch(tagged(f"C{i}", layer), xp, x, dev["w"], y)
        rctx.keep_alive(x)  # ...but keep the memory until the kernel has finished with it
        dev[f"y{i}"] = y

    def download(i: int, k: int, rctx: ae.RunContext) -> None:
        y = dev.pop(f"y{i}")
        rctx.launch(tagged(f"D{i}", device.download), pinned_out[k], y)
        rctx.keep_alive(y)

    def collect(i: int, k: int, rctx: ae.RunContext) -> None:
        # A host consumer of pinned_out[k]: it starts once the d2h copy has completed.
        results[i] = pinned_out[k]

    backend = ae.SimulatedGPU(seed=1) if device.simulated else None  # None: CuPy
    t0 = time.perf_counter()
    # gpu_max_inflight bounds the enqueued, unfinished GPU operations (and so the device
    # memory they hold): a fast producer waits instead of filling the GPU's memory.
    async with ae.Engine(gpu_backend=backend, gpu_max_inflight=4 * RING) as engine:
        w_var = engine.new_var("w")
        in_vars = [engine.new_var(f"pinned_in{k}") for k in range(RING)]
        out_vars = [engine.new_var(f"pinned_out{k}") for k in range(RING)]
        engine.push_sync(upload_w, GPU, [], [w_var], prop=ae.FnProperty.COPY_TO_GPU)
        for i in range(batches):
            k = i % RING
            x, y = engine.new_var(f"x{i}"), engine.new_var(f"y{i}")
            p = functools.partial
            engine.push_sync(p(fill, i, k), ae.cpu(), [], [in_vars[k]], name=f"fill{i}")
            engine.push_sync(
                p(upload, i, k), GPU, [in_vars[k]], [x], prop=ae.FnProperty.COPY_TO_GPU
            )
            engine.push_sync(p(compute, i), GPU, [x, w_var], [y], name=f"compute{i}")
            engine.push_sync(
                p(download, i, k), GPU, [y], [out_vars[k]], prop=ae.FnProperty.COPY_FROM_GPU
            )
            engine.push_sync(p(collect, i, k), ae.cpu(), [out_vars[k]], [], name=f"collect{i}")
        await engine.wait_for_all()
    wall = time.perf_counter() - t0

    # Check against NumPy: every row of small batches, a sample of the rows of big ones.
    check = np.arange(rows) if rows <= 256 else np.sort(rng.choice(rows, 16, replace=False))
    max_err = 0.0
    for i in range(batches):
        expected = np.tanh((base[check] * scales[i]) @ w_host)
        max_err = max(max_err, float(np.abs(results[i][check] - expected).max()))
    streams = [(s.family.value, s.kernels, s.waits) for s in backend.streams] if backend else []
    return {"wall": wall, "max_err": max_err, "checked_rows": len(check), "streams": streams}


async def main() -> None:
    if await asyncio.to_thread(ae.gpu_available):  # it initialises CUDA: off the loop
        device = cupy_device()
        batches, rows, cols = (6, 64, 64) if SMALL else (32, 2048, 2048)
    else:
        print(
            "no usable GPU (CuPy is not installed or finds no CUDA device): running on the "
            "simulated GPU, aioengine.SimulatedGPU()"
        )
        device = simulated_device()
        batches, rows, cols = (6, 64, 64) if SMALL else (16, 256, 256)
    print(f"device: {device.description}")
    out = await run_pipeline(device, batches, rows, cols)
    mb = batches * rows * cols * 4 * 2 / 1e6
    print(
        f"{batches} batches of {rows}x{cols} float32 through h2d -> compute -> d2h on three "
        f"streams in {out['wall']:.3f} s ({mb:.1f} MB copied); results match NumPy "
        f"(max error {out['max_err']:.1e} over {out['checked_rows']} rows per batch)"
    )
    if device.simulated:
        per_stream = ", ".join(f"{f} {n} kernels/{w} waits" for f, n, w in out["streams"])
        print(f"simulated streams: {per_stream}")
        shown = " ".join(device.order[:24])
        print(f"simulated device order (H=h2d, C=compute, D=d2h): {shown} ...")
    assert out["max_err"] < 1e-3, out["max_err"]


if __name__ == "__main__":
    asyncio.run(main())
