"""CupyBackend against a recording stand-in for the CuPy API it uses (no GPU needed).

The stand-in implements only the calls ``executors/cupy_streams.py`` makes, with CuPy's
documented signatures, and records them, so these tests pin down *how* the backend talks to
CuPy: non-blocking streams, a high-priority stream for GPU_PRIORITIZED, non-timing events,
raw ``eventQuery`` statuses, CUDA errors classified as device errors. The same engine paths
run for real in ``test_gpu_cupy.py`` on a machine with a GPU.
"""

from __future__ import annotations

import asyncio
import sys
import types
from typing import Any

import pytest

import aioengine as ae
from aioengine.executors.cupy_streams import CupyBackend


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        super().__init__(f"cudaError {status}")
        self.status = status


class CUDADriverError(RuntimeError):
    def __init__(self, status: int) -> None:
        super().__init__(f"CUresult {status}")
        self.status = status


class FakeCupy(types.ModuleType):
    """``cupy`` with ``cuda.{Device, Stream, Event, runtime, driver, get_current_stream}``."""

    def __init__(self, devices: int = 1) -> None:
        super().__init__("cupy")
        self.calls: list[tuple[Any, ...]] = []
        self.devices = devices
        self.statuses: dict[int, int] = {}  # event ptr -> status eventQuery returns
        fake = self
        current: list[Any] = [None]
        device: list[int] = [0]  # the calling thread's current device (one thread here)

        def set_device(device_id: int) -> None:
            fake.calls.append(("setDevice", device_id))
            device[0] = device_id

        class Device:
            def __init__(self, device_id: int) -> None:
                self.id = device_id

            def use(self) -> None:
                fake.calls.append(("Device.use", self.id))
                device[0] = self.id

        class Stream:
            def __init__(self, non_blocking: bool = False, priority: int | None = None) -> None:
                self.non_blocking = non_blocking
                self.priority = priority
                self.ptr = id(self)
                fake.calls.append(("Stream", non_blocking, priority))

            def use(self) -> Stream:
                current[0] = self
                return self

            def __enter__(self) -> Stream:
                self._prev = current[0]
                current[0] = self
                return self

            def __exit__(self, *exc: object) -> None:
                current[0] = self._prev

            def wait_event(self, event: Any) -> None:
                fake.calls.append(("wait_event", self.ptr, event.ptr))

        class Event:
            def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
                self.ptr = id(self)
                fake.calls.append(("Event", block, disable_timing))

            def record(self, stream: Any = None) -> None:
                fake.calls.append(("record", self.ptr, stream.ptr))

        def event_query(ptr: int) -> int:
            status = fake.statuses.get(ptr, 0)
            if status == -1:
                raise CUDARuntimeError(999)
            return status

        runtime = types.SimpleNamespace(
            eventQuery=event_query,
            getDevice=lambda: device[0],
            setDevice=set_device,
            getDeviceCount=lambda: fake.devices,
            CUDARuntimeError=CUDARuntimeError,
        )
        self.cuda = types.SimpleNamespace(
            Device=Device,
            Stream=Stream,
            Event=Event,
            runtime=runtime,
            driver=types.SimpleNamespace(CUDADriverError=CUDADriverError),
            get_current_stream=lambda: current[0],
        )

    def is_available(self) -> bool:
        return self.devices > 0


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> FakeCupy:
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


def test_without_cupy_the_error_says_how_to_fix_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(ae.DeviceUnavailableError, match=r"pip install aioengine\[gpu\]"):
        CupyBackend()
    assert ae.gpu_available() is False


def test_check_counts_devices(fake_cupy: FakeCupy) -> None:
    backend = CupyBackend()
    backend.check(0)
    with pytest.raises(ae.DeviceUnavailableError, match="1 CUDA device"):
        backend.check(1)
    assert ae.gpu_available() is True
    fake_cupy.devices = 0
    with pytest.raises(ae.DeviceUnavailableError, match="no usable CUDA device"):
        CupyBackend().check(0)


@pytest.mark.parametrize(
    ("family", "priority"),
    [(ae.StreamFamily.COMPUTE, None), (ae.StreamFamily.PRIORITY, -1), (ae.StreamFamily.D2H, None)],
)
def test_workers_bind_their_device_and_a_non_blocking_stream(
    fake_cupy: FakeCupy, family: ae.StreamFamily, priority: int | None
) -> None:
    stream = CupyBackend().bind_worker(0, family)
    assert fake_cupy.calls == [("Device.use", 0), ("Stream", True, priority)]
    assert fake_cupy.cuda.get_current_stream() is stream


def test_events_are_fresh_non_timing_and_queried_raw(fake_cupy: FakeCupy) -> None:
    backend = CupyBackend()
    stream = backend.bind_worker(0, ae.StreamFamily.COMPUTE)
    fake_cupy.calls.clear()
    event = backend.record(stream)
    assert fake_cupy.calls == [("Event", False, True), ("record", event.ptr, stream.ptr)]
    assert backend.record(stream) is not event
    assert backend.query(event) == 0
    fake_cupy.statuses[event.ptr] = 600
    assert backend.query(event) == 600
    fake_cupy.statuses[event.ptr] = 700
    assert backend.query(event) == 700  # an error status is returned, never "not ready"
    fake_cupy.statuses[event.ptr] = -1
    assert backend.query(event) == 999  # a CuPy that raises still yields the status
    other = backend.bind_worker(0, ae.StreamFamily.D2H)
    backend.wait_event(other, event)
    assert fake_cupy.calls[-1] == ("wait_event", other.ptr, event.ptr)


def test_run_makes_the_stream_current_and_catches_a_leaked_stream(fake_cupy: FakeCupy) -> None:
    backend = CupyBackend()
    stream = backend.bind_worker(0, ae.StreamFamily.COMPUTE)
    rctx = ae.RunContext(ae.gpu(0), stream)
    assert backend.run(stream, lambda r: fake_cupy.cuda.get_current_stream(), rctx) is stream
    assert backend.launch(stream, lambda a: a + 1, (1,)) == 2
    leaked = fake_cupy.cuda.Stream(non_blocking=True)
    with pytest.raises(RuntimeError, match="changed the current CUDA stream"):
        backend.run(stream, lambda r: leaked.use(), rctx)


def test_run_restores_a_leaked_device(fake_cupy: FakeCupy) -> None:
    """A function leaving another device current fails itself, not the device."""
    fake_cupy.devices = 2
    backend = CupyBackend()
    stream = backend.bind_worker(0, ae.StreamFamily.COMPUTE)
    rctx = ae.RunContext(ae.gpu(0), stream)
    with pytest.raises(RuntimeError, match="made CUDA device 1 current"):
        backend.run(stream, lambda r: fake_cupy.cuda.Device(1).use(), rctx)
    assert fake_cupy.cuda.runtime.getDevice() == 0
    assert fake_cupy.calls[-1] == ("setDevice", 0)
    assert backend.run(stream, lambda r: "fine", rctx) == "fine"
    assert [c for c in fake_cupy.calls if c[0] == "setDevice"] == [("setDevice", 0)]


def test_only_sticky_cuda_errors_are_device_errors(fake_cupy: FakeCupy) -> None:
    """Those after which CUDA documents the context as unusable; the others (an invalid
    launch configuration, say) fail one operation, like a Python exception."""
    backend = CupyBackend()
    for status in (700, 702, 710, 714, 715, 716, 717, 718, 719):
        assert backend.is_device_error(CUDARuntimeError(status))
        assert backend.is_device_error(CUDADriverError(status))
    for status in (1, 2, 9, 209, 701):
        assert not backend.is_device_error(CUDARuntimeError(status))
        assert not backend.is_device_error(CUDADriverError(status))
    assert not backend.is_device_error(ValueError("shape"))


async def test_an_ordinary_cuda_error_fails_the_operation_not_the_device(
    fake_cupy: FakeCupy,
) -> None:
    async with ae.Engine() as engine:
        x = engine.new_var("x")

        def bad_launch(rctx: ae.RunContext) -> None:
            raise CUDARuntimeError(9)  # cudaErrorInvalidConfiguration

        failed = engine.push_sync(bad_launch, ae.gpu(0), [], [x])
        with pytest.raises(CUDARuntimeError):
            await failed
        with pytest.raises(CUDARuntimeError):
            await engine.wait_for_var(x)  # x carries it, as any failure
        # Its event was recorded as for any operation, and the device goes on.
        assert [c[0] for c in fake_cupy.calls].count("Event") == 1
        assert await engine.push_sync(lambda r: "fine", ae.gpu(0), [], [x]) == "fine"


async def test_engine_runs_on_the_cupy_backend(fake_cupy: FakeCupy) -> None:
    async with ae.Engine() as engine:  # the default backend: CuPy
        x = engine.new_var("x")
        first = engine.push_sync(lambda r: r.stream, ae.gpu(0), [], [x])
        second = engine.push_sync(
            lambda r: r.stream, ae.gpu(0), [x], [], prop=ae.FnProperty.COPY_FROM_GPU
        )
        compute, d2h = await first, await second
        assert compute is not d2h
        await engine.wait_for_all()
    assert [c[0] for c in fake_cupy.calls].count("Event") == 2
    # The d2h stream waited for the compute stream's fence unless it had completed already.
    waits = [c for c in fake_cupy.calls if c[0] == "wait_event"]
    assert all(c[1] == d2h.ptr for c in waits)


async def test_error_status_fails_the_device(fake_cupy: FakeCupy) -> None:
    engine = ae.Engine()
    original = fake_cupy.cuda.Event

    class FailingEvent(original):  # type: ignore[misc, valid-type]
        def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
            super().__init__(block, disable_timing)
            fake_cupy.statuses[self.ptr] = 700

    fake_cupy.cuda.Event = FailingEvent
    op = engine.push_sync(lambda r: None, ae.gpu(0))
    with pytest.raises(ae.DeviceFailedError, match="status 700"):
        await asyncio.wait_for(op, 5)
    with pytest.raises(ae.DeviceFailedError):
        engine.push_sync(lambda r: None, ae.gpu(0))
    with pytest.raises(BaseExceptionGroup):
        await engine.aclose()
