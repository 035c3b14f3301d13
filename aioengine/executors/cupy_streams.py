"""The CuPy device backend: real GPUs through CuPy streams and events.

Facts this relies on (``docs/gpu-design.md``, sections "Streams per FnProperty", "The
launch path" and "Observing completion: the poller"; checked against CuPy 13/14):

- CuPy's current device and stream are thread-local, so each GPU worker thread binds its
  device and its own ``non_blocking`` stream once (:meth:`CupyBackend.bind_worker`) and every
  CuPy call of the functions it runs lands on that stream;
- events are created with ``disable_timing=True`` (``Stream.record()`` without an event would
  create a timing event) in the worker, whose device is the stream's;
- the poller reads ``cupy.cuda.runtime.eventQuery``, a raw status (0, 600 or an error), never
  ``Event.done``, which reads an error as "not ready";
- CuPy is imported only when a GPU context is first used, so the engine works without it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..context import RunContext
from ..errors import DeviceUnavailableError
from .device import StreamFamily

__all__ = ("CupyBackend", "gpu_available")

#: The ``cudaError`` codes after which a CUDA context is unusable: "This leaves the process in
#: an inconsistent state and any further CUDA work will return the same error. To continue
#: using CUDA, the process must be terminated and relaunched" (CUDA Runtime API, cudaError:
#: IllegalAddress 700, LaunchTimeout 702, Assert 710, HardwareStackError 714,
#: IllegalInstruction 715, MisalignedAddress 716, InvalidAddressSpace 717, InvalidPc 718,
#: LaunchFailure 719). The driver API's ``CUresult`` uses the same numbers.
STICKY_CUDA_ERRORS = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719})


def gpu_available() -> bool:
    """Whether CuPy is installed and sees a usable CUDA device (never raises).

    The first call initialises CUDA in the calling thread, which takes from a fraction of a
    second to a few seconds: call it before the event loop starts, or from a coroutine as
    ``await asyncio.to_thread(aioengine.gpu_available)``, not on the loop thread.
    """
    try:
        import cupy

        return bool(cupy.is_available())
    except Exception:
        return False


class CupyBackend:
    """The device backend for NVIDIA GPUs through CuPy (``pip install 'aioengine[gpu]'``).

    Raises:
        DeviceUnavailableError: if CuPy is not installed (the message says how to fix it).
    """

    name = "cupy"

    def __init__(self) -> None:
        try:
            import cupy
        except ImportError:
            raise DeviceUnavailableError(
                "CuPy is not installed; install it with 'pip install aioengine[gpu]' (or the "
                "cupy-cudaXXx wheel for your CUDA), use aioengine.SimulatedGPU() as "
                "Engine(gpu_backend=...) to simulate one, or push to aioengine.cpu()"
            ) from None
        self._cupy = cupy
        self._lock = threading.Lock()
        self._count: int | None = None  # devices seen by the driver, probed once

    def check(self, device_id: int) -> None:
        """Raise :class:`DeviceUnavailableError` unless CUDA device ``device_id`` exists."""
        count = self._count
        if count is None:
            with self._lock:
                count = self._count
                if count is None:
                    count = self._count = self._probe_off_thread()
        if device_id >= count:
            if count == 0:
                raise DeviceUnavailableError(
                    f"cannot run on gpu({device_id}): CuPy is installed but finds no usable "
                    "CUDA device (no GPU, or no driver); use Engine(gpu_backend="
                    "aioengine.SimulatedGPU()) to simulate one, or push to aioengine.cpu()"
                )
            raise DeviceUnavailableError(
                f"cannot run on gpu({device_id}): this machine has {count} CUDA device(s), "
                f"gpu(0) to gpu({count - 1})"
            )

    def _probe_off_thread(self) -> int:
        """Count devices on a short-lived thread: the first push may come from the loop
        thread, and no CUDA call (here ``cuInit``) may run there."""
        result: list[int] = []
        probe = threading.Thread(
            target=lambda: result.append(self._probe()), name="aioengine-cuda-probe"
        )
        probe.start()
        probe.join()
        return result[0] if result else 0

    def _probe(self) -> int:
        cupy = self._cupy
        try:
            if not cupy.is_available():
                return 0
            return int(cupy.cuda.runtime.getDeviceCount())
        except Exception:
            return 0

    def bind_worker(self, device_id: int, family: StreamFamily) -> Any:
        """Make this thread use ``device_id`` and a new non-blocking stream of ``family``."""
        cuda = self._cupy.cuda
        cuda.Device(device_id).use()
        if family is StreamFamily.PRIORITY:
            stream = cuda.Stream(non_blocking=True, priority=-1)  # CUDA clamps to the range
        else:
            stream = cuda.Stream(non_blocking=True)
        stream.use()
        return stream

    def run(self, stream: Any, fn: Callable[[RunContext], Any], rctx: RunContext) -> Any:
        """Call ``fn(rctx)`` inside ``with stream:``; check it left the device and stream
        current.

        A function that leaves another device current (``cupy.cuda.Device(n).use()``) is a
        bug of that function, not a failure of the device: the device is made current again
        and the operation fails with a RuntimeError, instead of the event recorded next
        landing on the wrong device (a CUDA error that would mark the device failed).
        """
        cuda = self._cupy.cuda
        device = rctx.ctx.device_id
        try:
            with stream:
                result = fn(rctx)
                current = cuda.get_current_stream()
        finally:
            leaked = cuda.runtime.getDevice()
            if leaked != device:
                cuda.runtime.setDevice(device)
        if leaked != device:
            raise RuntimeError(
                f"{fn!r} made CUDA device {leaked} current and did not restore it; use "
                "'with cupy.cuda.Device(n):' blocks, which restore it"
            )
        if current != stream:
            raise RuntimeError(
                f"{fn!r} changed the current CUDA stream and did not restore it; use "
                "'with other_stream:' blocks, which restore it"
            )
        return result

    def launch(self, stream: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Run ``fn(*args)`` now, with ``stream`` current: CuPy calls enqueue themselves."""
        with stream:
            return fn(*args)

    def wait_event(self, stream: Any, event: Any) -> None:
        """``stream.wait_event(event)``: later work on ``stream`` waits, the host does not."""
        stream.wait_event(event)

    def record(self, stream: Any) -> Any:
        """Record a fresh non-timing event on ``stream``."""
        event = self._cupy.cuda.Event(disable_timing=True)
        event.record(stream)
        return event

    def query(self, event: Any) -> int:
        """``cudaEventQuery``'s raw status (0 done, 600 not ready, else an error)."""
        runtime = self._cupy.cuda.runtime
        try:
            return int(runtime.eventQuery(event.ptr))
        except runtime.CUDARuntimeError as exc:  # some CuPy versions raise instead
            return int(exc.status)

    def is_device_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a CUDA runtime or driver error that breaks the context (its
        ``status`` in :data:`STICKY_CUDA_ERRORS`).

        Any other CUDA error (an invalid launch configuration, a launch out of resources, an
        invalid value) fails only the operation that raised it: the context still works. Were
        it broken after all, recording the operation's event would raise the sticky error, and
        that marks the device failed.
        """
        cuda = self._cupy.cuda
        if not isinstance(exc, (cuda.runtime.CUDARuntimeError, cuda.driver.CUDADriverError)):
            return False
        return getattr(exc, "status", None) in STICKY_CUDA_ERRORS
