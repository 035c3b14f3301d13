"""A simulated GPU: streams, events and sticky errors on the CPU, for tests and demos.

:class:`SimulatedGPU` implements the device seam
(:class:`~aioengine.executors.device.DeviceBackend`) without CUDA. Each stream is a FIFO of
work items: kernels (Python callables, usually NumPy) enqueued with
:meth:`RunContext.launch <aioengine.RunContext.launch>`, and barriers enqueued by
``wait_event``. An event completes when its stream has run every item enqueued before it was
recorded; a never-recorded event reads as complete, as in CUDA.

The device runs items in an *adversarial* order: among the streams whose head may run (a
kernel, or a barrier whose event has completed), it picks one at random (seeded). So a missing
``wait_event`` shows up as a wrong result, not as a lucky interleaving. Items run either on a
device thread of their own (``manual=False``, the default) or only when a test calls
:meth:`SimulatedGPU.step` / :meth:`SimulatedGPU.run_until_idle` (``manual=True``).

A kernel that raises (or :meth:`SimulatedGPU.fail`) puts the device into a sticky error, as an
illegal memory access does on a real GPU: every later query returns :data:`ILLEGAL_ADDRESS` and
every later device call raises :class:`SimulatedDeviceError`.

Every device call raises :class:`RuntimeError` on a thread that runs an event loop, which is
how the tests check that the engine never makes one there (the poller has a thread of its own).

Locking: ``_cond`` guards every field of the device and of its streams and events.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ..context import RunContext
from ..errors import DeviceUnavailableError
from .device import EVENT_DONE, EVENT_NOT_READY, StreamFamily

__all__ = (
    "ILLEGAL_ADDRESS",
    "SimulatedDeviceError",
    "SimulatedEvent",
    "SimulatedGPU",
    "SimulatedStream",
)

ILLEGAL_ADDRESS = 700  # cudaErrorIllegalAddress: the sticky error a failed kernel leaves


class SimulatedDeviceError(RuntimeError):
    """A device call on a simulated GPU in a sticky error state (CUDA's ``CUDARuntimeError``).

    Attributes:
        status: the CUDA-style error code.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SimulatedStream:
    """One stream of a simulated device: a FIFO of kernels and barriers.

    Attributes:
        device_id: the device it belongs to.
        family: the :class:`StreamFamily` it serves.
        priority: 0, or -1 for a high-priority stream (lower is higher, as in CUDA).
    """

    def __init__(
        self, gpu: SimulatedGPU, device_id: int, family: StreamFamily, number: int
    ) -> None:
        self.device_id = device_id
        self.family = family
        self.priority = -1 if family is StreamFamily.PRIORITY else 0
        self._gpu = gpu
        self._number = number
        self._items: deque[tuple[Callable[..., Any], tuple[Any, ...]] | _Barrier] = deque()
        self._issued = 0  # items ever enqueued
        self._retired = 0  # items ever run; invariant: _retired + len(_items) == _issued
        self.kernels = 0  # kernels run (for tests)
        self.waits = 0  # barriers enqueued by wait_event (for tests)

    def launch(self, fn: Callable[..., Any], *args: Any) -> None:
        """Enqueue ``fn(*args)`` as a kernel on this stream (from a GPU worker thread)."""
        self._gpu.launch(self, fn, args)

    def synchronize(self) -> None:
        """Wait on the calling (worker) thread until everything enqueued on this stream so
        far has run, as ``cupy.cuda.Stream.synchronize()`` does (what CuPy does itself for a
        result whose shape depends on the data). Raises :class:`SimulatedDeviceError` if the
        device fails meanwhile. On a manual device, whoever steps it runs the items."""
        self._gpu.synchronize(self)

    def __repr__(self) -> str:
        return (
            f"<SimulatedStream gpu({self.device_id}) {self.family.value}#{self._number} "
            f"queued={len(self._items)}>"
        )


class SimulatedEvent:
    """An event of a simulated device: complete once its stream passed its record point.

    Destroying one on an event-loop thread is counted in
    :attr:`SimulatedGPU.events_freed_on_loop` (``cudaEventDestroy`` is a CUDA call).
    """

    __slots__ = ("_mark", "_stream")

    def __init__(self) -> None:
        self._stream: SimulatedStream | None = None  # None: never recorded (reads as complete)
        self._mark = 0  # the stream's _issued count at record time

    def __del__(self) -> None:
        stream = self._stream
        if stream is not None and asyncio._get_running_loop() is not None:
            stream._gpu.events_freed_on_loop += 1

    def _done(self) -> bool:
        stream = self._stream
        return stream is None or stream._retired >= self._mark


class _Barrier:
    """A ``wait_event`` item: the stream may go on once the captured record point is passed."""

    __slots__ = ("mark", "stream")

    def __init__(self, event: SimulatedEvent) -> None:
        self.stream = event._stream  # captured now: a later re-record does not move it
        self.mark = event._mark

    def passed(self) -> bool:
        return self.stream is None or self.stream._retired >= self.mark


class SimulatedGPU:
    """A device backend that simulates ``devices`` GPUs on the CPU (see the module docstring).

    Args:
        devices: how many GPUs it has (``gpu(0)`` … ``gpu(devices - 1)``).
        seed: seed of the adversarial scheduler.
        manual: run items only in :meth:`step` / :meth:`run_until_idle` (no device thread).

    Use it with ``Engine(gpu_backend=SimulatedGPU())``.
    """

    name = "simulated"

    def __init__(self, devices: int = 1, *, seed: int = 0, manual: bool = False) -> None:
        if type(devices) is not int or devices < 1:
            raise ValueError(f"devices must be an int >= 1, got {devices!r}")
        self.devices = devices
        self.manual = manual
        self._random = random.Random(seed)
        self._cond = threading.Condition(threading.Lock())
        self._streams: list[SimulatedStream] = []
        self._errors: dict[int, int] = {}  # device -> sticky error status
        self.error_causes: dict[int, BaseException] = {}  # device -> what raised in a kernel
        self._thread: threading.Thread | None = None  # the device thread (not in manual mode)
        self._running = 0  # items being run by step() or the device thread
        self.worker_threads: dict[int, tuple[int, StreamFamily]] = {}  # ident -> what it bound
        self.events_freed_on_loop = 0  # recorded events destroyed on an event-loop thread

    # -- the DeviceBackend protocol -----------------------------------------------------

    def check(self, device_id: int) -> None:
        """Raise :class:`DeviceUnavailableError` unless ``device_id`` exists here."""
        if device_id >= self.devices:
            raise DeviceUnavailableError(
                f"cannot run on gpu({device_id}): the simulated GPU has {self.devices} "
                f"device(s); create SimulatedGPU(devices={device_id + 1})"
            )

    def bind_worker(self, device_id: int, family: StreamFamily) -> SimulatedStream:
        """Create a stream of ``family`` on ``device_id`` for the calling worker thread."""
        self._not_on_loop("bind_worker")
        with self._cond:
            self._raise_sticky(device_id)
            stream = SimulatedStream(self, device_id, family, len(self._streams))
            self._streams.append(stream)
            self.worker_threads[threading.get_ident()] = (device_id, family)
            return stream

    def run(self, stream: Any, fn: Callable[[RunContext], Any], rctx: RunContext) -> Any:
        """Call ``fn(rctx)`` on the worker thread (device work goes through ``launch``)."""
        self._not_on_loop("run")
        return fn(rctx)

    def launch(self, stream: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Enqueue ``fn(*args)`` as a kernel on ``stream``."""
        self._not_on_loop("launch")
        if not callable(fn):
            raise TypeError(f"launch() needs a callable kernel, got {fn!r}")
        with self._cond:
            self._raise_sticky(stream.device_id)
            stream._items.append((fn, args))
            stream._issued += 1
            self._cond.notify_all()
        self._start()

    def wait_event(self, stream: Any, event: Any) -> None:
        """Enqueue a barrier: later items of ``stream`` wait for ``event``'s record point."""
        self._not_on_loop("wait_event")
        with self._cond:
            self._raise_sticky(stream.device_id)
            barrier = _Barrier(event)
            if barrier.passed():
                return  # complete already: the barrier would be a no-op
            stream._items.append(barrier)
            stream._issued += 1
            stream.waits += 1
            self._cond.notify_all()
        self._start()

    def record(self, stream: Any) -> SimulatedEvent:
        """Return a fresh event recorded after everything enqueued on ``stream`` so far."""
        self._not_on_loop("record")
        with self._cond:
            self._raise_sticky(stream.device_id)
            event = SimulatedEvent()
            event._stream = stream
            event._mark = stream._issued
            return event

    def query(self, event: Any) -> int:
        """0 when complete, 600 when not yet, the sticky error when the device failed."""
        self._not_on_loop("query")
        with self._cond:
            stream = event._stream
            if stream is not None:
                status = self._errors.get(stream.device_id)
                if status is not None:
                    return status
            return EVENT_DONE if event._done() else EVENT_NOT_READY

    def is_device_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a (simulated) CUDA error."""
        return isinstance(exc, SimulatedDeviceError)

    def synchronize(self, stream: SimulatedStream) -> None:
        """Block the calling worker thread until ``stream`` has run every item enqueued on
        it so far (:meth:`SimulatedStream.synchronize`)."""
        self._not_on_loop("synchronize")
        self._start()
        with self._cond:
            mark = stream._issued
            while stream._retired < mark:
                self._raise_sticky(stream.device_id)
                self._cond.wait(1.0)  # every item run, and fail(), notify

    # -- driving the simulation ---------------------------------------------------------

    def fail(self, device_id: int = 0, status: int = ILLEGAL_ADDRESS) -> None:
        """Put ``device_id`` into a sticky error state (as a faulting kernel would)."""
        with self._cond:
            self._errors.setdefault(device_id, status)
            self._cond.notify_all()

    def step(self, n: int = 1) -> int:
        """Run up to ``n`` items (each the head of a random runnable stream); return how many."""
        ran = 0
        while ran < n and self._run_one(block=False):
            ran += 1
        return ran

    def run_until_idle(self) -> int:
        """Run items until none can run; return how many ran."""
        ran = 0
        while self._run_one(block=False):
            ran += 1
        return ran

    @property
    def queued(self) -> int:
        """Items enqueued on all streams and not run yet."""
        with self._cond:
            return sum(len(s._items) for s in self._streams)

    @property
    def streams(self) -> list[SimulatedStream]:
        """Every stream created so far, in creation order."""
        with self._cond:
            return list(self._streams)

    def _runnable(self) -> list[SimulatedStream]:
        """Streams whose head may run now (lock held)."""
        return [
            s
            for s in self._streams
            if s._items
            and s.device_id not in self._errors
            and (not isinstance(s._items[0], _Barrier) or s._items[0].passed())
        ]

    def _run_one(self, *, block: bool) -> bool:
        """Run one item; with ``block``, wait up to a second for one to become runnable."""
        with self._cond:
            runnable = self._runnable()
            if not runnable and block:
                self._cond.wait(1.0)
                runnable = self._runnable()
            if not runnable:
                return False
            stream = self._random.choice(runnable)
            item = stream._items[0]
            self._running += 1
        error: BaseException | None = None
        if not isinstance(item, _Barrier):
            fn, args = item
            try:
                fn(*args)
            except BaseException as exc:  # a faulting kernel: the device is dead
                error = exc
        with self._cond:
            self._running -= 1
            if error is not None:
                # A faulting kernel never completes: its stream (and any stream waiting for
                # it, on any device) stays where it is, as on a real GPU.
                self._errors.setdefault(stream.device_id, ILLEGAL_ADDRESS)
                self.error_causes.setdefault(stream.device_id, error)
            else:
                stream._items.popleft()
                stream._retired += 1
                if not isinstance(item, _Barrier):
                    stream.kernels += 1
            self._cond.notify_all()
        return True

    def _start(self) -> None:
        if self.manual:
            return
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._device_loop, name="aioengine-simulated-gpu", daemon=True
            )
            self._thread.start()

    def _device_loop(self) -> None:
        """The device thread: run items until nothing is runnable for a second, then exit."""
        while True:
            if self._run_one(block=True):
                continue
            with self._cond:
                if not self._runnable():
                    self._thread = None  # the next launch or wait_event starts a new one
                    return

    def _raise_sticky(self, device_id: int) -> None:
        status = self._errors.get(device_id)
        if status is not None:
            raise SimulatedDeviceError(
                status, f"simulated gpu({device_id}) is in a sticky error state ({status})"
            )

    @staticmethod
    def _not_on_loop(what: str) -> None:
        if asyncio._get_running_loop() is not None:
            raise RuntimeError(
                f"SimulatedGPU.{what}() called on an event-loop thread: device work must run "
                "on a GPU worker thread"
            )

    def __repr__(self) -> str:
        mode = "manual" if self.manual else "threaded"
        return (
            f"<SimulatedGPU devices={self.devices} {mode} streams={len(self._streams)} "
            f"queued={self.queued}>"
        )
