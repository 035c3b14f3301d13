"""GPU contexts on the simulated device: routing, fences, the poller, lifetimes, failures.

Everything here runs without CUDA: ``ae.SimulatedGPU`` implements the same device seam as
CuPy (streams, events, raw status queries, sticky errors) on NumPy, with an adversarial stream
scheduler. ``manual=True`` devices run nothing until the test steps them, which makes
"enqueued but not run yet" states observable. Real-GPU tests are in ``test_gpu_cupy.py``.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import random
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

import aioengine as ae
from aioengine.executors.device import EVENT_NOT_READY
from aioengine.executors.simulated import ILLEGAL_ADDRESS, SimulatedEvent
from aioengine.fence import Fence
from aioengine.poller import Poller, poller_for

from .conftest import ci_examples
from .helpers import Outcome, SequentialModel, until

F = ae.FnProperty
GPU0 = ae.gpu(0)


async def drive(engine: ae.Engine, sim: ae.SimulatedGPU, rng: random.Random) -> None:
    """Step a manual device a few random items at a time until the engine is idle."""
    while engine.pending:
        sim.step(rng.randint(1, 3))
        await asyncio.sleep(0)
        if not sim.queued:
            await asyncio.sleep(0.001)


def tick(rctx: ae.RunContext) -> None:
    """A GPU function that enqueues one empty kernel (so its fence waits for the device)."""
    rctx.launch(time.sleep, 0)


def enqueued(*ops: ae.Operation[Any]) -> Callable[[], bool]:
    """Whether every op has recorded its fence (enqueued its work, or finished).

    RUNNING alone is not enough: it is set before the function runs and launches.
    """

    def check() -> bool:
        for op in ops:
            if op.done():
                continue
            fences = op.core.gpu._gpu_pending
            if not any(f.op is op for f in list(fences)):
                return False
        return True

    return check


@pytest.fixture
def manual() -> ae.SimulatedGPU:
    return ae.SimulatedGPU(devices=2, seed=7, manual=True)


@pytest.fixture
async def eng(manual: ae.SimulatedGPU) -> AsyncIterator[ae.Engine]:
    engine = ae.Engine(gpu_backend=manual, cpu_workers=2)
    try:
        yield engine
    finally:
        manual.fail(0)  # nothing may hang at teardown: whatever is still queued fails
        manual.fail(1)
        try:
            await engine.aclose(cancel=True, timeout=10)
        except BaseExceptionGroup:
            pass


def stream_of(sim: ae.SimulatedGPU, family: ae.StreamFamily, device: int = 0) -> Any:
    [stream] = [s for s in sim.streams if s.family is family and s.device_id == device]
    return stream


# -- routing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prop", "family"),
    [
        (F.NORMAL, ae.StreamFamily.COMPUTE),
        (F.COPY_TO_GPU, ae.StreamFamily.H2D),
        (F.COPY_FROM_GPU, ae.StreamFamily.D2H),
        (F.GPU_PRIORITIZED, ae.StreamFamily.PRIORITY),
        (F.NO_SKIP, ae.StreamFamily.COMPUTE),
    ],
)
async def test_property_picks_stream_family_and_worker(
    prop: ae.FnProperty, family: ae.StreamFamily
) -> None:
    sim = ae.SimulatedGPU(devices=2)
    async with ae.Engine(gpu_backend=sim) as engine:
        seen = await engine.push_sync(
            lambda rctx: (rctx.stream, rctx.device_id, rctx.ctx), ae.gpu(1), prop=prop
        )
    stream, device, ctx = seen
    assert (stream.family, stream.device_id, device, ctx) == (family, 1, 1, ae.gpu(1))
    assert stream.priority == (-1 if family is ae.StreamFamily.PRIORITY else 0)
    assert set(sim.worker_threads.values()) == {(1, family)}


async def test_each_family_has_its_own_worker_thread_and_stream() -> None:
    sim = ae.SimulatedGPU()
    async with ae.Engine(gpu_backend=sim) as engine:
        import threading

        props = [F.NORMAL, F.COPY_TO_GPU, F.COPY_FROM_GPU, F.GPU_PRIORITIZED]
        ops = [
            engine.push_sync(lambda r: (threading.get_ident(), id(r.stream)), GPU0, prop=p)
            for p in props
        ]
        seen = [await op for op in ops]
    assert len({t for t, _ in seen}) == 4
    assert len({s for _, s in seen}) == 4
    assert len(sim.streams) == 4


async def test_gpu_workers_setting_sizes_the_compute_pool() -> None:
    sim = ae.SimulatedGPU()
    gate = asyncio.Event()
    async with ae.Engine(gpu_backend=sim, gpu_workers=3) as engine:
        loop = asyncio.get_running_loop()

        def block(rctx: ae.RunContext) -> int:
            asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(10)
            return id(rctx.stream)

        ops = [engine.push_sync(block, GPU0) for _ in range(3)]
        await until(lambda: all(op.state is ae.OpState.RUNNING for op in ops))  # three workers
        gate.set()
        assert len({await op for op in ops}) == 3


async def test_no_device_call_ever_runs_on_the_loop_thread() -> None:
    sim = ae.SimulatedGPU()
    stream = None
    async with ae.Engine(gpu_backend=sim) as engine:
        x = engine.new_var("x")
        for _ in range(20):
            engine.push_sync(tick, GPU0, [], [x])
            engine.push_sync(lambda r: None, GPU0, [x], [], prop=F.COPY_FROM_GPU)
            engine.push_sync(lambda r: None, ae.cpu(), [x], [])
        await engine.wait_for_all()  # any device call on the loop would have raised
        poller = poller_for(asyncio.get_running_loop())
        await until(lambda: not poller.alive)  # it dropped the settled events on its thread
        assert sim.events_freed_on_loop == 0  # destroying an event is a device call too
        stream = sim.streams[0]
        # The check bites: the simulator refuses device calls on an event-loop thread,
        # queries included (the poller queries on a thread of its own).
        with pytest.raises(RuntimeError, match="event-loop thread"):
            sim.record(stream)
        with pytest.raises(RuntimeError, match="event-loop thread"):
            sim.query(SimulatedEvent())


async def test_settled_events_are_never_destroyed_on_the_loop_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The poller may drop a released event before the loop's settle code returns."""
    original = Poller.release

    def release_then_yield_the_gil(self: Poller, *args: Any) -> None:
        original(self, *args)
        time.sleep(0.02)  # any GIL switch here lets the poller thread drop its reference first

    monkeypatch.setattr(Poller, "release", release_then_yield_the_gil)
    sim = ae.SimulatedGPU()
    async with ae.Engine(gpu_backend=sim) as engine:
        x = engine.new_var("x")
        for _ in range(5):
            await engine.push_sync(tick, GPU0, [], [x])
        poller = poller_for(asyncio.get_running_loop())
        await until(lambda: not poller.alive)
    assert sim.events_freed_on_loop == 0


async def test_coroutine_and_async_ops_on_a_gpu_context_are_host_consumers(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    x = eng.new_var("x")
    data = np.zeros(3)
    eng.push_sync(lambda r: r.launch(np.add, data, 1, data), GPU0, [], [x])

    async def read(rctx: ae.RunContext) -> list[float]:
        assert rctx.stream is None
        return data.tolist()

    coro = eng.push_async(read, GPU0, [x], [])
    inline = eng.push_sync(lambda r: data.sum(), GPU0, [x], [], prop=F.ASYNC)
    await until(lambda: manual.queued == 1)
    await asyncio.sleep(0.01)
    assert not coro.done()
    assert not inline.done()
    manual.run_until_idle()
    assert await coro == [1.0, 1.0, 1.0]
    assert await inline == 3.0


# -- fences ---------------------------------------------------------------------------------


async def test_same_stream_chain_needs_no_waits_and_is_released_on_enqueue(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    x = eng.new_var("x")
    log: list[int] = []
    ops = [eng.push_sync(lambda r, i=i: r.launch(log.append, i), GPU0, [], [x]) for i in range(5)]
    # Every one is enqueued before any "kernel" ran: the turn is released at enqueue.
    await until(enqueued(*ops))
    assert log == []
    assert manual.queued == 5
    manual.run_until_idle()
    await asyncio.gather(*ops)
    assert log == [0, 1, 2, 3, 4]
    assert stream_of(manual, ae.StreamFamily.COMPUTE).waits == 0


async def test_host_mode_releases_only_when_the_event_completed(
    manual: ae.SimulatedGPU,
) -> None:
    engine = ae.Engine(gpu_backend=manual, gpu_sync="host")
    x = engine.new_var("x")
    a = engine.push_sync(tick, GPU0, [], [x])
    b = engine.push_sync(tick, GPU0, [], [x])
    await until(enqueued(a))
    await asyncio.sleep(0.01)
    assert b.state is ae.OpState.PENDING  # a's work has not completed: b has no turn
    await until(lambda: manual.queued == 1)
    manual.run_until_idle()
    await a
    await until(enqueued(b))
    manual.run_until_idle()
    await b
    await engine.aclose()


async def test_cross_stream_read_after_write_waits_once_on_the_newest_fence(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    x = eng.new_var("x")
    ops = [eng.push_sync(tick, GPU0, [], [x]) for _ in range(3)]
    ops.append(eng.push_sync(lambda r: None, GPU0, [x], [], prop=F.COPY_FROM_GPU))
    await until(enqueued(*ops))
    assert stream_of(manual, ae.StreamFamily.D2H).waits == 1
    manual.run_until_idle()
    await asyncio.gather(*ops)


async def test_reader_waits_once_per_source_stream(eng: ae.Engine, manual: ae.SimulatedGPU) -> None:
    x, y = eng.new_var("x"), eng.new_var("y")
    ops = [
        eng.push_sync(tick, GPU0, [], [x]),
        eng.push_sync(tick, GPU0, [], [y], prop=F.COPY_TO_GPU),
        eng.push_sync(lambda r: None, GPU0, [x, y], [], prop=F.COPY_FROM_GPU),
    ]
    await until(enqueued(*ops))
    assert stream_of(manual, ae.StreamFamily.D2H).waits == 2
    manual.run_until_idle()
    await asyncio.gather(*ops)


async def test_writer_waits_for_readers_and_writer_on_other_streams(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    x = eng.new_var("x")
    ops = [
        eng.push_sync(tick, GPU0, [], [x], prop=F.COPY_TO_GPU),
        eng.push_sync(tick, GPU0, [x], [], prop=F.COPY_FROM_GPU),
        eng.push_sync(tick, GPU0, [x], [], prop=F.GPU_PRIORITIZED),
        eng.push_sync(tick, GPU0, [], [x]),  # WAW + 2 x WAR
    ]
    await until(enqueued(*ops))
    assert stream_of(manual, ae.StreamFamily.COMPUTE).waits == 3
    manual.run_until_idle()
    await asyncio.gather(*ops)


async def test_completed_fences_need_no_wait(eng: ae.Engine, manual: ae.SimulatedGPU) -> None:
    x = eng.new_var("x")
    first = eng.push_sync(tick, GPU0, [], [x])
    await until(lambda: manual.queued == 1)
    manual.run_until_idle()
    await first
    await eng.push_sync(lambda r: None, GPU0, [x], [], prop=F.COPY_FROM_GPU)
    assert stream_of(manual, ae.StreamFamily.D2H).waits == 0


async def test_missing_waits_give_stale_reads_the_test_bites() -> None:
    """With the cross-stream waits the d2h copy always sees the write; without, not always."""

    async def trial(seed: int, skip: bool) -> bool:
        sim = ae.SimulatedGPU(seed=seed, manual=True)
        engine = ae.Engine(gpu_backend=sim)
        src, out = np.zeros(1), np.zeros(1)
        x, y = engine.new_var("x"), engine.new_var("y")
        await engine.push_sync(lambda r: None, GPU0)  # creates engine._core.gpu
        assert engine._core.gpu is not None
        engine._core.gpu.skip_waits = skip
        w = engine.push_sync(lambda r: r.launch(np.copyto, src, 1.0), GPU0, [], [x])
        c = engine.push_sync(
            lambda r: r.launch(np.copyto, out, src), GPU0, [x], [y], prop=F.COPY_FROM_GPU
        )
        await until(enqueued(w, c))
        sim.run_until_idle()
        await engine.aclose()
        return bool(out[0] == 1.0)

    assert all([await trial(seed, skip=False) for seed in range(20)])
    assert not all([await trial(seed, skip=True) for seed in range(20)])


# -- host consumers -------------------------------------------------------------------------


async def test_cpu_reader_starts_after_the_gpu_write_completed(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    x = eng.new_var("x")
    data = np.zeros(4)
    eng.push_sync(lambda r: r.launch(np.add, data, 5, data), GPU0, [], [x])
    read = eng.push_sync(lambda r: data.copy(), ae.cpu(), [x], [])
    await until(lambda: manual.queued == 1)
    await asyncio.sleep(0.02)
    assert read.state is ae.OpState.PENDING  # granted its turn, waiting for the fence
    manual.run_until_idle()
    assert (await read).tolist() == [5.0] * 4


async def test_cpu_writer_waits_for_a_gpu_reader_of_its_host_buffer(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    host, dev = np.ones(3), np.zeros(3)
    h, d = eng.new_var("host"), eng.new_var("dev")
    up = eng.push_sync(lambda r: r.launch(np.copyto, dev, host), GPU0, [h], [d], prop=F.COPY_TO_GPU)
    overwrite = eng.push_sync(lambda r: host.fill(9), ae.cpu(), [], [h])  # write after read
    await until(enqueued(up))
    await asyncio.sleep(0.02)
    assert overwrite.state is ae.OpState.PENDING
    manual.run_until_idle()
    await overwrite
    assert dev.tolist() == [1.0, 1.0, 1.0]  # the upload read the buffer before it changed


async def test_wait_for_var_and_wait_for_all_wait_for_completion(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    x = eng.new_var("x")
    op = eng.push_sync(tick, GPU0, [], [x])
    await until(enqueued(op))
    assert x.statistics().pending_write is False  # released at enqueue: the Var is idle
    waiter = asyncio.ensure_future(eng.wait_for_var(x))
    everything = asyncio.ensure_future(eng.wait_for_all())
    await asyncio.sleep(0.02)
    assert not waiter.done()
    assert not everything.done()
    assert not op.done()
    manual.run_until_idle()
    await asyncio.wait_for(asyncio.gather(waiter, everything), 10)
    assert op.done()


async def test_wait_for_var_timeout_leaves_the_engine_usable(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    x = eng.new_var("x")
    op = eng.push_sync(tick, GPU0, [], [x])
    await until(enqueued(op))
    with pytest.raises(TimeoutError):
        await eng.wait_for_var(x, timeout=0.02)
    manual.run_until_idle()
    await eng.wait_for_var(x)
    await op


async def test_cancelled_host_consumer_does_not_run(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    x = eng.new_var("x")
    ran: list[str] = []
    eng.push_sync(tick, GPU0, [], [x])
    read = eng.push_sync(lambda r: ran.append("read"), ae.cpu(), [x], [])
    after = eng.push_sync(lambda r: ran.append("after"), ae.cpu(), [], [x])
    await until(lambda: manual.queued == 1)
    assert read.cancel()
    manual.run_until_idle()
    await after
    assert ran == ["after"]
    assert read.cancelled()


# -- the poller -----------------------------------------------------------------------------


async def test_poller_queries_heads_only_backs_off_and_stops_when_idle(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    x = eng.new_var("x")
    ops = [eng.push_sync(tick, GPU0, [], [x]) for _ in range(5)]
    await until(enqueued(*ops))
    poller = poller_for(asyncio.get_running_loop())
    start, ticks = time.monotonic(), poller.ticks
    # No progress: the back-off reaches its cap...
    await until(lambda: poller._delay == Poller.max_delay)
    assert poller.running
    assert poller.pending == 5
    # One stream, so at most one query per pass (only the FIFO head can complete next).
    assert poller.queries <= poller.ticks + 5
    # ... and never went below 1 ms: at most one pass per millisecond (a stalled machine
    # only makes fewer).
    assert poller.ticks - ticks <= (time.monotonic() - start) / Poller.min_delay + 10
    manual.run_until_idle()
    await asyncio.gather(*ops)
    assert not poller.running
    assert poller.pending == 0
    ticks = poller.ticks
    await asyncio.sleep(0.02)
    assert poller.ticks == ticks  # idle: no more queries
    await until(lambda: not poller.alive)  # and its thread exits soon after


class ScriptedBackend:
    """A backend whose events are plain names and whose query() returns scripted statuses."""

    def __init__(self) -> None:
        self.status: dict[str, int] = {}
        self.queried: list[str] = []
        self.times: list[float] = []

    def query(self, event: str) -> int:
        self.queried.append(event)
        self.times.append(time.perf_counter())
        return self.status.get(event, EVENT_NOT_READY)


class SettleRecorder:
    """Stands in for an engine: records what the poller reports (on the loop thread)."""

    def __init__(self) -> None:
        self.settled: list[tuple[str, int]] = []
        self.loop_thread = threading.get_ident()

    def _fences_settled(self, items: list[tuple[Fence, int]]) -> None:
        assert threading.get_ident() == self.loop_thread
        self.settled.extend((f.event, status) for f, status in items)


def scripted_fence(
    owner: SettleRecorder, backend: ScriptedBackend, stream: object, name: str
) -> Fence:
    return Fence(owner, backend, name, stream, 0, 0, ())


async def test_poller_queries_only_fifo_heads_and_streams_progress_independently() -> None:
    backend, owner = ScriptedBackend(), SettleRecorder()
    poller = poller_for(asyncio.get_running_loop())
    stream_a, stream_b = object(), object()
    for name in ("a1", "a2"):
        poller.watch(scripted_fence(owner, backend, stream_a, name))
    for name in ("b1", "b2"):
        poller.watch(scripted_fence(owner, backend, stream_b, name))
    await until(lambda: len(backend.queried) >= 6)  # three passes over both streams
    # Nothing completed: only the heads were ever asked (a stream completes in order).
    assert set(backend.queried) == {"a1", "b1"}
    backend.status.update(b1=0, b2=0)  # stream b finished, a is still busy
    await asyncio.wait_for(until(lambda: len(owner.settled) == 2), 5)
    assert owner.settled == [("b1", 0), ("b2", 0)]
    assert "a2" not in backend.queried
    backend.status.update(a1=0, a2=0)
    await asyncio.wait_for(until(lambda: len(owner.settled) == 4), 5)
    assert owner.settled[2:] == [("a1", 0), ("a2", 0)]
    await asyncio.wait_for(until(lambda: not poller.running), 5)


async def test_poller_backs_off_to_no_less_than_one_millisecond() -> None:
    backend, owner = ScriptedBackend(), SettleRecorder()
    poller = poller_for(asyncio.get_running_loop())
    ticks = poller.ticks
    start = time.perf_counter()
    poller.watch(scripted_fence(owner, backend, object(), "slow"))
    await until(lambda: len(backend.times) >= 11)  # it keeps polling: ten gaps to look at
    elapsed = time.perf_counter() - start
    passes = poller.ticks - ticks
    # With no progress the passes are at least 1 ms apart (the design's floor: a busier
    # poll steals the GIL from the threads that launch the work).
    gaps = [b - a for a, b in zip(backend.times, backend.times[1:], strict=False)]
    assert min(gaps) >= 0.9e-3
    assert passes <= elapsed / 1e-3 + 5
    backend.status["slow"] = 0
    await asyncio.wait_for(until(lambda: owner.settled == [("slow", 0)]), 5)


async def test_an_error_status_is_reported_not_read_as_not_ready() -> None:
    """Event.done would read an error as "not ready" and poll forever: the status is kept."""
    backend, owner = ScriptedBackend(), SettleRecorder()
    poller = poller_for(asyncio.get_running_loop())
    stream = object()
    poller.watch(scripted_fence(owner, backend, stream, "bad"))
    poller.watch(scripted_fence(owner, backend, stream, "behind"))
    backend.status["bad"] = ILLEGAL_ADDRESS
    await asyncio.wait_for(until(lambda: len(owner.settled) == 2), 5)
    # The device error is sticky: the fence behind it on the device fails with it.
    assert owner.settled == [("bad", ILLEGAL_ADDRESS), ("behind", ILLEGAL_ADDRESS)]


async def test_one_poller_per_loop_serves_several_engines() -> None:
    a, b = ae.SimulatedGPU(), ae.SimulatedGPU()
    async with ae.Engine(gpu_backend=a) as e1, ae.Engine(gpu_backend=b) as e2:
        assert await e1.push_sync(lambda r: 1, GPU0) == 1
        assert await e2.push_sync(lambda r: 2, GPU0) == 2
    loop = asyncio.get_running_loop()
    assert poller_for(loop) is poller_for(loop)


# -- lifetimes ----------------------------------------------------------------------------


class Blob:
    """A weak-referenceable stand-in for a device array."""


async def test_keepalive_holds_what_the_op_touched_until_its_fence_completes(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    x = eng.new_var("x")
    captured = Blob()
    refs = [weakref.ref(captured)]

    def fn(rctx: ae.RunContext, blob: Blob = captured) -> None:
        temporary = Blob()  # reachable only through keep_alive once fn returns
        refs.append(weakref.ref(temporary))
        rctx.keep_alive(temporary)
        rctx.launch(time.sleep, 0)

    op = eng.push_sync(fn, GPU0, [], [x])
    del fn, captured
    await until(enqueued(op))
    waiter = asyncio.ensure_future(asyncio.shield(op))
    await asyncio.sleep(0.01)
    waiter.cancel()  # cancelling a waiter does not drop the keepalive
    gc.collect()
    assert len(refs) == 2
    assert all(r() is not None for r in refs)
    manual.run_until_idle()
    await op
    del op
    # Dropped once the fence completed, on the poller's thread (freeing memory is a CUDA call).
    await until(lambda: (gc.collect(), all(r() is None for r in refs))[1])


def test_a_fence_does_not_keep_its_stream_alive() -> None:
    """Vars keep their last fences: a CuPy stream must still die with its worker (its
    destructor is a CUDA call, which must not run on whichever thread drops the Var)."""
    stream = Blob()
    ref = weakref.ref(stream)
    fence = Fence(None, None, None, stream, 0, 1, ())
    assert fence.stream_id == id(stream)
    del stream
    gc.collect()
    assert ref() is None


async def test_var_values_stay_alive_until_completion(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    blob = Blob()
    ref = weakref.ref(blob)
    x = eng.new_var("x", value=blob)
    op = eng.push_sync(tick, GPU0, [x], [])
    await until(enqueued(op))
    eng.delete_var(x)
    del blob, x
    gc.collect()
    assert ref() is not None
    manual.run_until_idle()
    await eng.wait_for_all()
    del op
    await until(lambda: (gc.collect(), ref() is None)[1])


# -- the loop never blocks ----------------------------------------------------------------


async def test_loop_keeps_running_while_kernels_run() -> None:
    """Each kernel waits until the loop has ticked five more times: were the loop blocked
    by the GPU work (or by waiting for it), no kernel would see a tick."""
    sim = ae.SimulatedGPU()
    cond = threading.Condition()
    beats = 0
    saw_ticks: list[bool] = []

    def kernel() -> None:
        with cond:
            target = beats + 5
            saw_ticks.append(cond.wait_for(lambda: beats >= target, timeout=10))

    async with ae.Engine(gpu_backend=sim) as engine:
        x = engine.new_var("x")
        stop = False

        async def heartbeat() -> None:
            nonlocal beats
            while not stop:
                await asyncio.sleep(0.001)
                with cond:
                    beats += 1
                    cond.notify_all()

        beat = asyncio.ensure_future(heartbeat())
        for _ in range(3):
            engine.push_sync(lambda r: r.launch(kernel), GPU0, [], [x])
        await engine.wait_for_var(x)
        stop = True
        await beat
    assert saw_ticks == [True, True, True]


# -- failures -------------------------------------------------------------------------------


async def test_python_error_in_a_gpu_op_fails_only_that_op() -> None:
    sim = ae.SimulatedGPU()
    engine = ae.Engine(gpu_backend=sim)
    x = engine.new_var("x")

    def bad(rctx: ae.RunContext) -> None:
        raise ValueError("shape mismatch")

    op = engine.push_sync(bad, GPU0, [], [x])
    dep = engine.push_sync(lambda r: None, GPU0, [x], [])
    with pytest.raises(ValueError, match="shape mismatch"):
        await op
    with pytest.raises(ae.DependencyError):
        await dep
    with pytest.raises(ValueError):
        await engine.wait_for_var(x)
    assert await engine.push_sync(lambda r: 42, GPU0) == 42  # the device still works
    await engine.aclose()


async def test_kernel_fault_fails_pending_ops_and_later_pushes(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    x, y = eng.new_var("x"), eng.new_var("y")

    def crash() -> None:
        raise MemoryError("illegal address")

    ops = [
        eng.push_sync(lambda r: r.launch(crash), GPU0, [], [x]),
        eng.push_sync(tick, GPU0, [], [y]),
        eng.push_sync(tick, GPU0, [x], [y], prop=F.COPY_FROM_GPU),
    ]
    host = eng.push_sync(lambda r: "ran", ae.cpu(), [x], [])
    await until(enqueued(*ops))
    manual.step()  # one stream head runs; the fault (or not) is random: run everything
    manual.run_until_idle()
    for op in ops:
        with pytest.raises(ae.DeviceFailedError, match="must be restarted"):
            await op
    with pytest.raises(ae.DependencyError) as info:
        await host
    assert isinstance(info.value.__cause__, ae.DeviceFailedError)
    with pytest.raises(ae.DeviceFailedError, match="cannot push to gpu\\(0\\)"):
        eng.push_sync(lambda r: None, GPU0)
    with pytest.raises(ae.DeviceFailedError):
        eng.push_async(asyncio.sleep, GPU0)  # type: ignore[arg-type]
    with pytest.raises(BaseExceptionGroup) as group:
        await eng.wait_for_all()
    assert [type(e) for e in group.value.exceptions] == [ae.DeviceFailedError]  # once
    # The other device is unaffected.
    assert await eng.push_sync(lambda r: r.device_id, ae.gpu(1)) == 1


async def test_a_fence_that_fails_keeps_what_its_op_touched(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    """The failed device may still use that memory: it is kept for the process's life."""
    refs: list[weakref.ref[Blob]] = []

    def crash() -> None:
        raise MemoryError("illegal address")

    def fn(rctx: ae.RunContext) -> None:
        blob = Blob()
        refs.append(weakref.ref(blob))
        rctx.keep_alive(blob)
        rctx.launch(crash)

    op = eng.push_sync(fn, GPU0, [], [eng.new_var("x")])
    await until(enqueued(op))
    manual.run_until_idle()
    with pytest.raises(ae.DeviceFailedError):
        await op
    del op
    with pytest.raises(BaseExceptionGroup):
        await eng.wait_for_all()
    gc.collect()
    assert refs[0]() is not None


async def test_device_error_raised_in_the_worker_is_sticky(manual: ae.SimulatedGPU) -> None:
    engine = ae.Engine(gpu_backend=manual)
    x = engine.new_var("x")
    slow = engine.push_sync(tick, GPU0, [], [x])
    await until(enqueued(slow))

    def cuda_error(rctx: ae.RunContext) -> None:
        raise ae.SimulatedDeviceError(ILLEGAL_ADDRESS, "an illegal memory access")

    bad = engine.push_sync(cuda_error, GPU0)
    with pytest.raises(ae.DeviceFailedError, match="restarted") as info:
        await bad
    assert isinstance(info.value.__cause__, ae.SimulatedDeviceError)
    with pytest.raises(ae.DeviceFailedError):
        await slow  # pending work on the failed device fails too, without any poll result
    with pytest.raises(ae.DeviceFailedError):
        engine.push_sync(lambda r: None, GPU0)
    with pytest.raises(BaseExceptionGroup):
        await engine.aclose()


async def test_unavailable_devices_raise_at_push_with_the_fix() -> None:
    async with ae.Engine(gpu_backend=ae.SimulatedGPU(devices=1)) as engine:
        with pytest.raises(ae.DeviceUnavailableError, match="SimulatedGPU\\(devices=3\\)"):
            engine.push_sync(lambda r: None, ae.gpu(2))
    async with ae.Engine() as engine:
        if ae.gpu_available():
            pytest.skip("this machine has a GPU")
        with pytest.raises(ae.DeviceUnavailableError, match="cannot run on gpu\\(0\\)"):
            engine.push_sync(lambda r: None, GPU0)
        assert engine.pending == 0


async def test_gpu_push_needs_a_bound_engine() -> None:
    engine = ae.Engine(gpu_backend=ae.SimulatedGPU())

    def push() -> None:
        engine.push_sync(lambda r: None, GPU0)

    with pytest.raises(RuntimeError, match="not bound to an event loop"):
        await asyncio.to_thread(push)
    await engine.aclose()


def test_bad_gpu_settings_name_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="gpu_sync"):
        ae.Engine(gpu_sync="sometimes")
    with pytest.raises(ValueError, match="gpu_workers"):
        ae.Engine(gpu_workers=0)
    with pytest.raises(ValueError, match="gpu_max_inflight"):
        ae.Engine(gpu_max_inflight=-1)
    with pytest.raises(TypeError, match="gpu_backend"):
        ae.Engine(gpu_backend=object())  # type: ignore[arg-type]
    monkeypatch.setenv("AIOENGINE_GPU_COPY_WORKERS", "two")
    with pytest.raises(ValueError, match="AIOENGINE_GPU_COPY_WORKERS"):
        ae.Engine()
    monkeypatch.setenv("AIOENGINE_GPU_COPY_WORKERS", "2")
    monkeypatch.setenv("AIOENGINE_GPU_SYNC", "host")
    settings = ae.Engine()._settings
    assert (settings.gpu_copy_workers, settings.gpu_sync) == (2, "host")


# -- the in-flight bound ------------------------------------------------------------------


async def test_max_inflight_bounds_enqueued_work_per_device(manual: ae.SimulatedGPU) -> None:
    engine = ae.Engine(gpu_backend=manual, gpu_max_inflight=2)
    ops = [engine.push_sync(tick, GPU0, [], [engine.new_var()]) for _ in range(5)]
    await until(lambda: manual.queued == 2)
    await asyncio.sleep(0.02)
    assert manual.queued == 2
    assert engine._core.gpu is not None
    assert engine._core.gpu.inflight(0) == 2
    rng = random.Random(0)
    await asyncio.wait_for(drive(engine, manual, rng), 10)
    await asyncio.gather(*ops)
    assert engine._core.gpu.inflight(0) == 0
    await engine.aclose()


# -- serial mode and observability --------------------------------------------------------


async def test_serial_mode_runs_gpu_ops_one_at_a_time() -> None:
    sim = ae.SimulatedGPU()
    log: list[str] = []
    async with ae.Engine(gpu_backend=sim, serial=True) as engine:
        a, b = engine.new_var("a"), engine.new_var("b")
        engine.push_sync(
            lambda r: r.launch(lambda: (time.sleep(0.01), log.append("gpu"))), GPU0, [], [a]
        )
        engine.push_sync(lambda r: log.append("cpu"), ae.cpu(), [], [b])
        await engine.wait_for_all()
    assert log == ["gpu", "cpu"]


async def test_statistics_and_dump_cover_gpu_pools() -> None:
    async with ae.Engine(gpu_backend=ae.SimulatedGPU()) as engine:
        await engine.push_sync(lambda r: None, GPU0, prop=F.COPY_TO_GPU)
        stats = engine.statistics()
        assert any("gpu0-h2d" in name for name in stats.pools), stats.pools
        assert "aioengine" in str(engine.dump()).lower() or str(engine.dump())


# -- random programs: event mode == host mode == a sequential model -----------------------

PROPS = [F.NORMAL, F.COPY_TO_GPU, F.COPY_FROM_GPU, F.GPU_PRIORITIZED]
N_VARS = 4

step = st.tuples(
    st.sampled_from(["gpu", "gpu", "gpu", "cpu"]),
    st.sampled_from(PROPS),
    st.lists(st.integers(0, N_VARS - 1), max_size=2),
    st.integers(0, N_VARS - 1),
    st.integers(1, 9),
)


def kernel(out: np.ndarray, ins: list[np.ndarray], k: int) -> None:
    total = out * 0.5 + k
    for a in ins:
        total = total + a
    out[:] = total


def model(program: list[tuple[str, ae.FnProperty, list[int], int, int]]) -> list[list[float]]:
    """The final arrays: the program's kernels through the shared sequential model
    (helpers.py), in push order, on the host."""
    arrays = [np.full(2, float(i)) for i in range(N_VARS)]
    seq = SequentialModel()
    for _, _, reads, write, k in program:
        ins = [arrays[r] for r in reads if r != write]
        outcome, _ = seq.push(functools.partial(kernel, arrays[write], ins, k), reads, [write])
        assert outcome is Outcome.DONE
    return [a.tolist() for a in arrays]


async def run_program(
    program: list[tuple[str, ae.FnProperty, list[int], int, int]],
    sync: str,
    seed: int,
    skip_waits: bool = False,
) -> list[list[float]]:
    sim = ae.SimulatedGPU(seed=seed, manual=True)
    engine = ae.Engine(gpu_backend=sim, gpu_sync=sync, cpu_workers=2)
    if skip_waits:  # drop the cross-stream waits (a broken engine, for the test of the test)
        await engine.push_sync(lambda r: None, GPU0)  # creates engine._core.gpu
        assert engine._core.gpu is not None
        engine._core.gpu.skip_waits = True
    arrays = [np.full(2, float(i)) for i in range(N_VARS)]
    vars_ = [engine.new_var(f"v{i}") for i in range(N_VARS)]
    for where, prop, reads, write, k in program:
        ins = [arrays[r] for r in reads if r != write]
        const = [vars_[r] for r in reads if r != write]
        args = (arrays[write], ins, k)
        if where == "gpu":
            engine.push_sync(
                lambda r, a=args: r.launch(kernel, *a), GPU0, const, [vars_[write]], prop=prop
            )
        else:
            engine.push_sync(lambda r, a=args: kernel(*a), ae.cpu(), const, [vars_[write]])
    await asyncio.wait_for(drive(engine, sim, random.Random(seed)), 30)
    await engine.aclose()
    return [a.tolist() for a in arrays]


@ci_examples(
    25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=st.lists(step, min_size=1, max_size=14), seed=st.integers(0, 2**16))
def test_random_programs_event_mode_matches_host_mode_and_the_model(
    program: list[tuple[str, ae.FnProperty, list[int], int, int]], seed: int
) -> None:
    expected = model(program)
    assert asyncio.run(run_program(program, "event", seed)) == expected
    assert asyncio.run(run_program(program, "host", seed)) == expected


def test_random_programs_without_the_waits_disagree_with_the_model() -> None:
    """The random-program test bites: drop the cross-stream waits and some programs go wrong.

    Programs of GPU writes and reads spread over every stream family, deterministic seeds.
    """
    rng = random.Random(7)
    wrong = 0
    for seed in range(12):
        program = [
            ("gpu", rng.choice(PROPS), rng.sample(range(N_VARS), 2), rng.randrange(N_VARS), k)
            for k in range(1, 13)
        ]
        expected = model(program)
        assert asyncio.run(run_program(program, "event", seed)) == expected
        wrong += asyncio.run(run_program(program, "event", seed, skip_waits=True)) != expected
    assert wrong > 0


async def test_dump_says_what_gpu_work_waits_for(eng: ae.Engine, manual: ae.SimulatedGPU) -> None:
    x = eng.new_var("x")
    eng.push_sync(tick, GPU0, [], [x], name="kernel")
    eng.push_sync(lambda r: None, ae.cpu(), [x], [], name="consumer")
    await until(lambda: manual.queued == 1)
    dump = eng.dump()
    assert "fence" in (dump.op("kernel").flag or "")
    assert "waiting for 1 GPU fence" in (dump.op("consumer").flag or "")
    manual.run_until_idle()
    await eng.wait_for_all()


async def test_a_value_replaced_by_a_gpu_write_stays_alive_until_completion(
    eng: ae.Engine, manual: ae.SimulatedGPU
) -> None:
    old = Blob()
    ref = weakref.ref(old)
    w = eng.new_var("w", value=old)
    del old
    ahead = eng.push_sync(tick, GPU0, [], [eng.new_var()])
    update = eng.submit(lambda b: Blob(), w, out=w, ctx=GPU0)  # reads w, replaces its value
    await until(enqueued(ahead, update))
    gc.collect()
    assert ref() is not None  # replaced, but the device may still be reading it
    manual.run_until_idle()
    await update
    await until(lambda: (gc.collect(), ref() is None)[1])


async def test_a_gpu_waiting_on_a_failed_gpu_fails_instead_of_hanging(
    manual: ae.SimulatedGPU,
) -> None:
    engine = ae.Engine(gpu_backend=manual)
    x, y = engine.new_var("x"), engine.new_var("y")

    def crash() -> None:
        raise MemoryError("illegal address")

    a = engine.push_sync(lambda r: r.launch(crash), GPU0, [], [x])
    b = engine.push_sync(tick, ae.gpu(1), [x], [y])
    await until(enqueued(a, b))
    manual.run_until_idle()  # gpu(0) faults; gpu(1)'s stream waits for it forever
    with pytest.raises(ae.DeviceFailedError, match="must be restarted"):
        await asyncio.wait_for(a, 10)
    with pytest.raises(ae.DeviceFailedError, match="wait for work of a GPU that failed"):
        await asyncio.wait_for(b, 10)
    with pytest.raises(ae.DeviceFailedError):  # what b wrote carries its failure
        await asyncio.wait_for(engine.wait_for_var(y), 10)
    with pytest.raises(ae.DeviceFailedError):
        engine.push_sync(lambda r: None, ae.gpu(1))
    with pytest.raises(BaseExceptionGroup):
        await asyncio.wait_for(engine.aclose(), 10)


async def test_a_gpu_failed_through_another_still_finishes_its_other_work_first(
    manual: ae.SimulatedGPU,
) -> None:
    """gpu(1) is healthy: only its compute stream is stuck behind gpu(0)'s failed work. Its
    upload of a host buffer still runs, so the CPU op that overwrites that buffer must wait
    for the upload to complete, not start when gpu(1) is marked failed."""
    engine = ae.Engine(gpu_backend=manual)
    host_v, x, y, d = (engine.new_var(n) for n in ("host", "x", "y", "d"))
    host = np.array([1.0])
    uploaded: list[float] = []
    a = engine.push_sync(tick, GPU0, [], [x])
    upload = engine.push_sync(
        lambda r: r.launch(lambda: uploaded.append(float(host[0]))),
        ae.gpu(1),
        [host_v],
        [d],
        prop=ae.FnProperty.COPY_TO_GPU,
    )
    b = engine.push_sync(tick, ae.gpu(1), [x], [y])  # its stream waits for a
    await until(enqueued(a, upload, b))

    def overwrite(rctx: ae.RunContext) -> None:
        host[0] = 999.0

    w = engine.push_sync(overwrite, ae.cpu(), [], [host_v])
    manual.fail(0)  # gpu(0) faults before running a; gpu(1) has run nothing yet
    with pytest.raises(ae.DeviceFailedError, match="wait for work of a GPU that failed"):
        await asyncio.wait_for(b, 10)
    with pytest.raises(ae.DeviceFailedError):  # gpu(1) takes no new work
        engine.push_sync(lambda r: None, ae.gpu(1))
    assert not upload.done()
    assert not w.done()  # the upload has not read the buffer yet
    manual.run_until_idle()
    await asyncio.wait_for(upload, 10)  # done: its work ran
    await asyncio.wait_for(w, 10)
    assert uploaded == [1.0]
    assert host[0] == 999.0
    with pytest.raises(BaseExceptionGroup):
        await asyncio.wait_for(engine.aclose(), 10)


async def test_an_op_enqueueing_while_its_gpu_fails_through_another_fails_too(
    manual: ae.SimulatedGPU,
) -> None:
    """c is inside its function on gpu(1) when gpu(1) fails (its stream waits for gpu(0)'s
    failed work): c's fence, recorded after that, would never complete."""
    engine = ae.Engine(gpu_backend=manual)
    x, y, z = engine.new_var("x"), engine.new_var("y"), engine.new_var("z")
    inside, go = threading.Event(), threading.Event()

    def crash() -> None:
        raise MemoryError("illegal address")

    def held(rctx: ae.RunContext) -> None:
        inside.set()
        assert go.wait(10)
        rctx.launch(time.sleep, 0)  # behind b's wait on gpu(1)'s compute stream

    a = engine.push_sync(lambda r: r.launch(crash), GPU0, [], [x])
    b = engine.push_sync(tick, ae.gpu(1), [x], [y])
    await until(enqueued(a, b))
    c = engine.push_sync(held, ae.gpu(1), [], [z])
    await until(inside.is_set)
    manual.run_until_idle()  # gpu(0) faults, and gpu(1) fails with it
    with pytest.raises(ae.DeviceFailedError, match="wait for work of a GPU that failed"):
        await asyncio.wait_for(b, 10)
    go.set()
    await until(enqueued(c))
    manual.run_until_idle()
    with pytest.raises(ae.DeviceFailedError, match="wait for work of a GPU that failed"):
        await asyncio.wait_for(c, 10)
    with pytest.raises(BaseExceptionGroup):
        await asyncio.wait_for(engine.aclose(), 10)


class QueryRaises(ae.SimulatedGPU):
    """A backend whose status query raises (a driver bug): polling must survive it."""

    def query(self, event: Any) -> int:
        raise RuntimeError("driver bug")


async def test_a_query_that_raises_fails_the_device_and_polling_goes_on() -> None:
    engine = ae.Engine(gpu_backend=QueryRaises())
    op = engine.push_sync(lambda r: None, GPU0)
    with pytest.raises(ae.DeviceFailedError, match="status 999"):
        await asyncio.wait_for(op, 10)
    with pytest.raises(BaseExceptionGroup):
        await engine.aclose()
    async with ae.Engine(gpu_backend=ae.SimulatedGPU()) as other:  # same loop, same poller
        assert await asyncio.wait_for(other.push_sync(lambda r: 5, GPU0), 10) == 5


def test_interpreter_exits_with_gpu_work_pending_under_an_inflight_bound() -> None:
    import subprocess
    import sys
    import textwrap

    body = textwrap.dedent(
        """
        import asyncio, time
        import aioengine as ae

        async def main():
            engine = ae.Engine(gpu_backend=ae.SimulatedGPU(), gpu_max_inflight=1)
            for _ in range(3):
                engine.push_sync(
                    lambda r: r.launch(time.sleep, 0.3), ae.gpu(0), [], [engine.new_var()]
                )
            await asyncio.sleep(0.05)  # the loop closes with work in flight and queued

        asyncio.run(main())
        print("exiting", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", body], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "exiting\n"


def test_pollers_do_not_keep_closed_loops_alive() -> None:
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def one() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        async with ae.Engine(gpu_backend=ae.SimulatedGPU()) as engine:
            await engine.push_sync(lambda r: None, GPU0)

    for _ in range(3):
        asyncio.run(one())
    gc.collect()
    assert [ref() for ref in loops] == [None, None, None]
