"""Real-GPU tests: the CuPy backend, fences and the poller on an NVIDIA GPU.

These are the tests that need a device (``docs/gpu-design.md``, section "Testing"). They
are marked ``gpu``: ``conftest.py`` skips them unless ``aioengine.gpu_available()`` (CuPy
installed and a CUDA device usable). They use plain ``asyncio.run`` (no pytest-asyncio), so on
a GPU machine ``python -m pytest -m gpu -x --timeout=300 tests/test_gpu_cupy.py`` runs them with
plain pytest. CuPy is imported inside the tests and fixtures only: this file imports without
it.

Most tests time a *spin kernel*: a ``cupy.RawKernel`` that loops on ``clock64()`` for a number
of cycles calibrated to wall time on this GPU (the ``spin`` fixture), so a kernel runs about
50 ms while the host goes on. The cross-stream tests then prove the ordering both ways: with
the engine's ``wait_event`` s the result is right, and with the test-only hook
``engine._core.gpu.skip_waits = True`` the stale (or overtaken) value appears, which shows that the
test would catch a missing wait. The same logic runs on every CI run against
``aioengine.SimulatedGPU`` (``tests/test_gpu.py``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import aioengine as ae
from aioengine.poller import Poller

KERNEL_S = 0.05  # how long a "long" kernel spins

# spin: wait `cycles` SM clock cycles. spin_fill: spin, then out[:n] = value.
# spin_copy: spin, then dst[:n] = src[:n] (reads src late: the long reader of the WAR test).
# store_to: write through a raw address (address 8: an illegal address, a sticky CUDA error).
KERNELS = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}

extern "C" __global__ void spin_fill(long long cycles, float* out, float value, int n) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        out[i] = value;
    }
}

extern "C" __global__ void spin_copy(long long cycles, const float* src, float* dst, int n) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        dst[i] = src[i];
    }
}

extern "C" __global__ void store_to(long long address) {
    *((volatile int*)address) = 1;
}
"""


@dataclass
class Spin:
    """The test kernels, compiled once, and the SM clock rate measured on this GPU."""

    cupy: Any
    spin_kernel: Any
    spin_fill_kernel: Any
    spin_copy_kernel: Any
    cycles_per_s: float

    def cycles(self, seconds: float) -> np.int64:
        return np.int64(int(seconds * self.cycles_per_s))

    def spin(self, seconds: float) -> None:
        """Enqueue a kernel that runs ``seconds`` on the current stream."""
        self.spin_kernel((1,), (1,), (self.cycles(seconds),))

    def spin_fill(self, seconds: float, out: Any, value: float) -> None:
        """Enqueue: spin ``seconds``, then ``out[...] = value`` (float32 ``out``)."""
        args = (self.cycles(seconds), out, np.float32(value), np.int32(out.size))
        self.spin_fill_kernel((4,), (256,), args)

    def spin_copy(self, seconds: float, src: Any, dst: Any) -> None:
        """Enqueue: spin ``seconds``, then ``dst[...] = src`` (a reader that reads late)."""
        self.spin_copy_kernel((4,), (256,), (self.cycles(seconds), src, dst, np.int32(src.size)))


@pytest.fixture(scope="module")
def spin() -> Spin:
    """Compile the kernels and calibrate ``clock64()`` cycles to seconds with timing events."""
    cupy = pytest.importorskip("cupy")
    module = cupy.RawModule(code=KERNELS)  # compiled with NVRTC
    kernel = module.get_function("spin")
    stream = cupy.cuda.Stream(non_blocking=True)
    probe = 100_000_000  # ~50 ms at 2 GHz
    with stream:
        # Load the module, and get the clocks up first: an idle GPU starts at a low clock, and
        # clock64() counts SM cycles at the current clock.
        kernel((1,), (1,), (np.int64(probe),))
        start, end = cupy.cuda.Event(), cupy.cuda.Event()  # timing events
        start.record(stream)
        kernel((1,), (1,), (np.int64(probe),))
        end.record(stream)
    end.synchronize()
    ms = cupy.cuda.get_elapsed_time(start, end)
    assert ms > 0, ms
    return Spin(
        cupy=cupy,
        spin_kernel=kernel,
        spin_fill_kernel=module.get_function("spin_fill"),
        spin_copy_kernel=module.get_function("spin_copy"),
        cycles_per_s=probe / (ms / 1e3),
    )


async def warm_up(engine: ae.Engine) -> None:
    """Start the compute, h2d and d2h workers (each binds its device and creates its stream)."""
    for prop in (ae.FnProperty.NORMAL, ae.FnProperty.COPY_TO_GPU, ae.FnProperty.COPY_FROM_GPU):
        await engine.push_sync(lambda rctx: None, ae.gpu(0), prop=prop)


def on_thread(pool: ThreadPoolExecutor, fn: Callable[[], Any]) -> Any:
    return pool.submit(fn).result(timeout=30)


@pytest.mark.gpu
class TestCupyBackend:
    """The device seam, with CuPy: what the engine and the poller rely on."""

    def test_event_query_is_600_while_a_kernel_runs_then_0(self, spin: Spin) -> None:
        cupy = spin.cupy
        backend = ae.CupyBackend()
        backend.check(0)
        # Worker calls run on threads of their own, as in the engine (bind_worker makes the
        # calling thread use the device and the new stream).
        with ThreadPoolExecutor(1) as pool_a, ThreadPoolExecutor(1) as pool_b:

            def launch_on_a() -> tuple[Any, Any]:
                stream = backend.bind_worker(0, ae.StreamFamily.COMPUTE)
                assert cupy.cuda.get_current_stream() == stream
                backend.launch(stream, spin.spin, (KERNEL_S,))
                return stream, backend.record(stream)

            t0 = time.perf_counter()
            stream_a, event_a = on_thread(pool_a, launch_on_a)
            assert backend.query(event_a) == 600  # cudaErrorNotReady, not an error

            def wait_on_b() -> tuple[Any, Any]:
                stream = backend.bind_worker(0, ae.StreamFamily.D2H)
                backend.wait_event(stream, event_a)  # no host wait
                return stream, backend.record(stream)

            stream_b, event_b = on_thread(pool_b, wait_on_b)
            assert backend.query(event_b) == 600  # B waits for A's kernel on the device

            deadline = time.perf_counter() + 10
            while (status_a := backend.query(event_a)) == 600:
                assert time.perf_counter() < deadline, "the spin kernel never finished"
                time.sleep(0.001)
            elapsed = time.perf_counter() - t0
            assert status_a == 0
            while (status_b := backend.query(event_b)) == 600:
                assert time.perf_counter() < deadline, "stream B never passed its wait"
                time.sleep(0.001)
            assert status_b == 0
            assert backend.query(event_a) == 0  # stays complete
            assert elapsed >= 0.5 * KERNEL_S  # it did spin (calibration is approximate)
            on_thread(pool_b, stream_b.synchronize)  # DeviceBackend has no synchronize
            on_thread(pool_a, stream_a.synchronize)

        never_recorded = cupy.cuda.Event(disable_timing=True)
        assert backend.query(never_recorded) == 0  # as in CUDA: an empty event is complete
        assert backend.is_device_error(cupy.cuda.runtime.CUDARuntimeError(700))
        assert not backend.is_device_error(cupy.cuda.runtime.CUDARuntimeError(9))
        assert not backend.is_device_error(ValueError("not a device error"))

    def test_the_poller_resolves_await_op_within_a_few_poll_intervals(self, spin: Spin) -> None:
        cupy = spin.cupy
        done_at: list[float] = []

        def op(rctx: ae.RunContext) -> str:
            spin.spin(KERNEL_S)
            # A blocking-sync event recorded right after the kernel: a helper thread sleeps on
            # it and notes when the device got there (the engine's fence is recorded after it).
            event = cupy.cuda.Event(block=True, disable_timing=True)
            event.record(rctx.stream)

            def note() -> None:
                event.synchronize()
                done_at.append(time.perf_counter())

            threading.Thread(target=note, daemon=True).start()
            return "done"

        async def main() -> tuple[float, float, bool]:
            async with ae.Engine() as engine:
                await warm_up(engine)
                v = engine.new_var("v")
                t0 = time.perf_counter()
                operation = engine.push_sync(op, ae.gpu(0), mutate_vars=[v])
                await asyncio.sleep(KERNEL_S / 2)
                early = operation.done()
                assert await operation == "done"
                return t0, time.perf_counter(), early

        t0, resolved_at, done_early = asyncio.run(main())
        assert not done_early  # not before its kernel ran
        assert done_at, "the helper thread never saw the event"
        assert done_at[0] - t0 >= 0.5 * KERNEL_S
        latency = resolved_at - done_at[0]
        assert latency < 5 * Poller.max_delay + 0.005, latency


@pytest.mark.gpu
class TestCrossStreamOrdering:
    """RAW, WAR and WAW across streams: right with the waits, wrong without (the test bites)."""

    @pytest.mark.parametrize(
        "skip_waits", [pytest.param(False, id="waits"), pytest.param(True, id="skip-waits")]
    )
    def test_read_after_write(self, spin: Spin, skip_waits: bool) -> None:
        """A slow kernel writes on compute; a d2h copy reads it into pinned host memory."""
        cupy = spin.cupy
        import cupyx

        buf = cupy.zeros(1024, np.float32)
        host = cupyx.empty_pinned(1024, np.float32)
        host[...] = -1
        cupy.cuda.Device(0).synchronize()  # buf was zeroed on this thread's stream

        async def main() -> np.ndarray:
            async with ae.Engine() as engine:
                await warm_up(engine)
                assert engine._core.gpu is not None
                engine._core.gpu.skip_waits = skip_waits
                x, h = engine.new_var("x"), engine.new_var("h")

                def write(rctx: ae.RunContext) -> None:
                    spin.spin_fill(KERNEL_S, buf, 7.0)

                def read(rctx: ae.RunContext) -> None:
                    buf.get(stream=rctx.stream, out=host, blocking=False)  # d2h stream

                engine.push_sync(write, ae.gpu(0), mutate_vars=[x])
                engine.push_sync(read, ae.gpu(0), [x], [h], prop=ae.FnProperty.COPY_FROM_GPU)
                await engine.wait_for_var(h)  # a host consumer: waits for the d2h fence
                got: np.ndarray = host.copy()
                return got

        got = asyncio.run(main())
        if skip_waits:
            assert (got == 0).all(), "the copy did not overtake the kernel: the test cannot bite"
        else:
            assert (got == 7).all()

    @pytest.mark.parametrize(
        "skip_waits", [pytest.param(False, id="waits"), pytest.param(True, id="skip-waits")]
    )
    def test_write_after_read(self, spin: Spin, skip_waits: bool) -> None:
        """A long reader on compute; then an h2d copy overwrites what it reads."""
        cupy = spin.cupy
        import cupyx

        buf = cupy.full(1024, 1.0, np.float32)
        out = cupy.zeros(1024, np.float32)
        new = cupyx.empty_pinned(1024, np.float32)
        new[...] = 2.0
        cupy.cuda.Device(0).synchronize()

        async def main() -> None:
            async with ae.Engine() as engine:
                await warm_up(engine)
                assert engine._core.gpu is not None
                engine._core.gpu.skip_waits = skip_waits
                x, y = engine.new_var("x"), engine.new_var("y")

                def long_read(rctx: ae.RunContext) -> None:
                    spin.spin_copy(KERNEL_S, buf, out)  # reads buf after ~50 ms

                def overwrite(rctx: ae.RunContext) -> None:
                    buf.set(new, stream=rctx.stream)  # an asynchronous copy on h2d

                engine.push_sync(long_read, ae.gpu(0), [x], [y])
                engine.push_sync(overwrite, ae.gpu(0), [], [x], prop=ae.FnProperty.COPY_TO_GPU)
                await engine.wait_for_all()

        asyncio.run(main())
        cupy.cuda.Device(0).synchronize()  # engine streams are non-blocking: sync before reading
        got = out.get()
        if skip_waits:
            assert (got == 2).all(), "the writer did not overtake the reader: cannot bite"
        else:
            assert (got == 1).all()
        assert (buf.get() == 2).all()

    @pytest.mark.parametrize(
        "skip_waits", [pytest.param(False, id="waits"), pytest.param(True, id="skip-waits")]
    )
    def test_write_after_write(self, spin: Spin, skip_waits: bool) -> None:
        """A slow kernel writes on compute, then an h2d copy writes the same array."""
        cupy = spin.cupy
        import cupyx

        buf = cupy.zeros(1024, np.float32)
        new = cupyx.empty_pinned(1024, np.float32)
        new[...] = 5.0
        cupy.cuda.Device(0).synchronize()

        async def main() -> None:
            async with ae.Engine() as engine:
                await warm_up(engine)
                assert engine._core.gpu is not None
                engine._core.gpu.skip_waits = skip_waits
                x = engine.new_var("x")

                def slow_write(rctx: ae.RunContext) -> None:
                    spin.spin_fill(KERNEL_S, buf, 3.0)

                def fast_write(rctx: ae.RunContext) -> None:
                    buf.set(new, stream=rctx.stream)

                engine.push_sync(slow_write, ae.gpu(0), [], [x])
                engine.push_sync(fast_write, ae.gpu(0), [], [x], prop=ae.FnProperty.COPY_TO_GPU)
                await engine.wait_for_var(x)

        asyncio.run(main())
        cupy.cuda.Device(0).synchronize()
        got = buf.get()
        if skip_waits:
            assert (got == 3).all(), "the second write did not overtake the first: cannot bite"
        else:
            assert (got == 5).all()


@pytest.mark.gpu
def test_loop_heartbeat_lag_stays_small_while_kernels_run(spin: Spin) -> None:
    """The loop never blocks on the device: a 1 ms heartbeat keeps ticking under long kernels."""
    kernels = 4

    async def main() -> tuple[float, float]:
        async with ae.Engine() as engine:
            await warm_up(engine)
            v = engine.new_var("v")
            stop = asyncio.Event()
            lag = 0.0

            async def heartbeat() -> None:
                nonlocal lag
                while not stop.is_set():
                    t = time.perf_counter()
                    await asyncio.sleep(0.001)
                    lag = max(lag, time.perf_counter() - t - 0.001)

            beat = asyncio.create_task(heartbeat())
            await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            ops = [
                engine.push_sync(lambda rctx: spin.spin(KERNEL_S), ae.gpu(0), [], [v])
                for _ in range(kernels)
            ]
            for op in ops:
                await op
            total = time.perf_counter() - t0
            stop.set()
            await beat
            return lag, total

    lag, total = asyncio.run(main())
    assert total >= 0.5 * kernels * KERNEL_S  # the kernels really ran (one stream: in a row)
    assert lag < 0.2 * KERNEL_S, f"loop lag {lag * 1e3:.1f} ms while kernels ran"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "keep", [pytest.param(True, id="keep_alive"), pytest.param(False, id="no-keep_alive")]
)
def test_keep_alive_holds_an_array_until_the_op_completed(spin: Spin, keep: bool) -> None:
    """A temporary a long kernel writes stays alive (not back in the pool) until the fence.

    Without ``rctx.keep_alive`` the temporary dies when the function returns, while the
    kernel still writes it: the hazard keep_alive exists for (the pool could hand its memory
    to the next allocation on that stream).
    """
    cupy = spin.cupy
    refs: list[weakref.ref[Any]] = []
    enqueued = threading.Event()

    def op(rctx: ae.RunContext) -> None:
        tmp = cupy.empty(1024, np.float32)  # allocated on the op's stream
        spin.spin_fill(2 * KERNEL_S, tmp, 1.0)
        if keep:
            rctx.keep_alive(tmp)
        refs.append(weakref.ref(tmp))
        enqueued.set()

    async def main() -> tuple[bool, bool, bool]:
        async with ae.Engine() as engine:
            await warm_up(engine)
            operation = engine.push_sync(op, ae.gpu(0), mutate_vars=[engine.new_var("v")])
            await asyncio.to_thread(enqueued.wait, 10)
            await asyncio.sleep(0.01)  # the engine has recorded the fence by now
            gc.collect()
            alive_while_running = refs[0]() is not None
            running = not operation.done()
            await operation
            gc.collect()
            return alive_while_running, running, refs[0]() is None

    alive_while_running, running, dead_after = asyncio.run(main())
    assert running  # the kernel was still running when we looked
    assert alive_while_running is keep
    assert dead_after


# The sticky-error scenario, run in a subprocess (a CUDA error poisons the process). It prints
# one JSON line; argv[1] is "cupy" (a kernel writes through an illegal address) or "simulated"
# (a simulated kernel raises), so the harness itself also runs without a GPU.
STICKY_SCRIPT = r"""
import asyncio, json, sys, time
import numpy as np
import aioengine as ae
from aioengine.poller import poller_for

KIND = sys.argv[1]
KERNELS = sys.argv[2]


def setup():
    if KIND == "cupy":
        import cupy
        module = cupy.RawModule(code=KERNELS)
        store_to, spin = module.get_function("store_to"), module.get_function("spin")
        spin((1,), (1,), (np.int64(0),))
        cupy.cuda.Device(0).synchronize()

        def fault(rctx):
            store_to((1,), (1,), (np.int64(8),))  # cudaErrorIllegalAddress (700)

        def work(rctx):
            spin((1,), (1,), (np.int64(1000),))

        return None, fault, work

    def crash():
        raise RuntimeError("simulated illegal address")

    def fault(rctx):
        rctx.launch(crash)

    def work(rctx):
        rctx.launch(lambda: None)

    return ae.SimulatedGPU(), fault, work


def outcome(exc):
    if exc is None:
        return {"type": None}
    root = exc if isinstance(exc, ae.DeviceFailedError) else exc.__cause__
    return {
        "type": type(exc).__name__,
        "root": type(root).__name__,
        "restart": "restart" in str(root),
    }


async def main():
    backend, fault, work = setup()
    t_start = time.perf_counter()
    engine = ae.Engine(gpu_backend=backend)
    x, y = engine.new_var("x"), engine.new_var("y")
    await engine.push_sync(work, ae.gpu(0), mutate_vars=[y])  # the device works
    ops = [engine.push_sync(fault, ae.gpu(0), mutate_vars=[x], name="fault")]
    ops += [
        engine.push_sync(work, ae.gpu(0), [x], [y], name=f"after{i}") for i in range(3)
    ]
    ops.append(engine.push_sync(lambda rctx: "ran", ae.cpu(), [y], [], name="host"))
    outcomes = {}
    for op in ops:
        try:
            async with asyncio.timeout(30):
                await op
            outcomes[op.name] = outcome(None)
        except Exception as exc:
            outcomes[op.name] = outcome(exc)
    t = time.perf_counter()
    try:
        engine.push_sync(work, ae.gpu(0), name="later")
        later = outcome(None)
    except Exception as exc:
        later = outcome(exc)
    later_s = time.perf_counter() - t
    await asyncio.sleep(0.05)
    poller = poller_for(asyncio.get_running_loop())
    close = "ok"
    try:
        async with asyncio.timeout(30):
            await engine.aclose()
    except TimeoutError:
        close = "hang"
    except BaseExceptionGroup as group:
        close = sorted({type(e).__name__ for e in group.exceptions})
    print(json.dumps({
        "ops": outcomes,
        "later": later,
        "later_s": later_s,
        "poller_idle": not poller.running and poller.pending == 0,
        "close": close,
        "total_s": time.perf_counter() - t_start,
    }))


asyncio.run(main())
"""


def run_sticky_script(kind: str) -> dict[str, Any]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(
            [sys.executable, "-c", STICKY_SCRIPT, kind, KERNELS],
            capture_output=True,
            text=True,
            env=env,
            timeout=90,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the sticky-error scenario hung:\n{exc.stdout!r}\n{exc.stderr!r}")
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def check_sticky(result: dict[str, Any]) -> None:
    failed = {"root": "DeviceFailedError", "restart": True}
    for name, got in result["ops"].items():
        # The faulting op and the ops after it fail with the device's error; an op that starts
        # once its input already carries that failure is skipped with DependencyError.
        assert got["type"] in ("DeviceFailedError", "DependencyError"), (name, got)
        assert {k: got[k] for k in failed} == failed, (name, got)
    assert result["ops"]["fault"]["type"] == "DeviceFailedError"
    assert result["later"] == {"type": "DeviceFailedError", **failed}
    assert result["later_s"] < 1.0  # raised at once
    assert result["poller_idle"]  # no spin on a dead device
    assert result["close"] != "hang"
    assert result["total_s"] < 60


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_a_sticky_cuda_error_fails_the_device_and_later_pushes() -> None:
    pytest.importorskip("cupy")
    check_sticky(run_sticky_script("cupy"))


def test_the_sticky_error_scenario_runs_on_the_simulator() -> None:
    """The subprocess harness above, against SimulatedGPU: it runs (and is right) in CI too."""
    check_sticky(run_sticky_script("simulated"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_chain_of_gpu_arrays_is_one_fused_cupy_kernel(dtype: Any) -> None:
    """Elementwise operations on CuPy arrays above INLINE_COST join one chain, enqueued as one
    ``cupy.fuse`` kernel on the operation's stream (``aioengine/array/_cupy_fuse.py``), with
    NumPy's values and the dtypes the operations promised."""
    import aioengine.array as aa
    from aioengine.array import _cupy_fuse

    rng = np.random.default_rng(0)
    an, bn = rng.random((300, 300)).astype(dtype), rng.random((300, 300)).astype(dtype)

    async def main() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], int]:
        async with ae.Engine() as engine:
            await warm_up(engine)
            xp = aa.namespace(engine)
            a, b = xp.asarray(an).to_device(ae.gpu(0)), xp.asarray(bn).to_device(ae.gpu(0))
            await a
            await b
            _cupy_fuse._FUSED.clear()
            release = threading.Event()
            hold = engine.push_sync(lambda r: release.wait(30), ae.gpu(0), name="hold")
            c = a * 1.5 + b  # waits behind the held worker: every step joins its kernel
            c = c * c - a
            d = xp.sin(c) / (b + 1.0)
            release.set()
            await hold
            assert c.dtype == dtype
            assert d.dtype == dtype
            got_c = await c.to_device(ae.cpu())
            got_d = await d.to_device(ae.cpu())
            return got_c, got_d, len(_cupy_fuse._FUSED)

    got_c, got_d, fused = asyncio.run(main())
    cn = an * dtype(1.5) + bn
    cn = cn * cn - an
    rtol = 1e-5 if dtype is np.float32 else 1e-12
    np.testing.assert_allclose(got_c, cn, rtol=rtol)
    np.testing.assert_allclose(got_d, np.sin(cn) / (bn + dtype(1.0)), rtol=100 * rtol)
    assert got_d.dtype == dtype
    assert fused == 1  # the chain's one program, made into one fused function
