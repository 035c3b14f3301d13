"""GPU executors: per device, one worker pool per stream family, each worker on its stream.

MXNet's per-device engine layout: for ``gpu(d)`` the engine lazily creates a pool for each
:class:`~aioengine.executors.device.StreamFamily` an operation's ``FnProperty`` picks
(compute, h2d, d2h, priority). Each worker thread binds device ``d`` and a stream of its own
once, when it starts, and runs every operation with that stream current (CuPy's current
device and stream are thread-local, so this is what makes it safe).

:class:`GpuDevices` is the engine's per-device GPU state: the backend, the executors, which
devices failed (sticky: a CUDA error poisons the process), and the optional bound on in-flight
work. Operations, fences and Vars stay in ``gpu_sync.py`` / ``fence.py``.

Locking: ``_cond`` guards ``_broken``, ``_dead`` and ``_inflight``; a worker waiting for an
in-flight slot waits on it, so it is never held with the engine lock requested (lock order:
engine lock, then ``_cond``). ``broken()`` and ``dead()`` read unlocked: a device failing just
after the read settles its pending fences afterwards anyway (``GpuSync._fail_device_fences``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..context import Context, RunContext
from ..errors import DeviceFailedError
from ..kinds import FnProperty
from . import Run
from .device import DeviceBackend, StreamFamily
from .threads import ThreadExecutor

__all__ = ("GpuDevices", "GpuExecutor", "family_of")

_FAMILY = {
    FnProperty.COPY_TO_GPU: StreamFamily.H2D,
    FnProperty.COPY_FROM_GPU: StreamFamily.D2H,
    FnProperty.GPU_PRIORITIZED: StreamFamily.PRIORITY,
}


def family_of(prop: FnProperty) -> StreamFamily:
    """The stream family a GPU operation with ``prop`` runs on (``COMPUTE`` by default)."""
    return _FAMILY.get(prop, StreamFamily.COMPUTE)


class GpuExecutor(ThreadExecutor):
    """The worker pool of one (device, stream family); each worker owns one stream."""

    def __init__(
        self, ctx: Context, family: StreamFamily, workers: int, devices: GpuDevices, run: Run
    ) -> None:
        super().__init__(ctx, workers, f"aioengine-gpu{ctx.device_id}-{family.value}", run)
        self.family = family
        self._devices = devices

    def _abandon(self) -> list[Any]:
        """Interpreter exit: also let workers waiting for an in-flight slot go."""
        self._devices.shutdown()
        return super()._abandon()

    def _worker_context(self) -> RunContext:
        """Bind this new worker thread to its device and a stream of its own."""
        try:
            stream = self._devices.backend.bind_worker(self._ctx.device_id, self.family)
        except BaseException as exc:
            # The worker still runs what it is given; every operation then fails with this.
            self._devices.fail(self._ctx.device_id, exc)
            return RunContext(self._ctx)
        return RunContext(self._ctx, stream)


class GpuDevices:
    """The GPU side of one engine: backend, executors, failed devices, in-flight bound.

    Args:
        backend: the device backend (CuPy or simulated).
        workers: threads (so streams) per device for compute and priority work.
        copy_workers: threads (so streams) per device for each copy direction.
        host_sync: release Var turns only when an operation's event completed (debug mode).
        max_inflight: the most enqueued, uncompleted operations per device (None: no bound).
        run: the engine's runner, which the executors call for each operation.
    """

    def __init__(
        self,
        backend: DeviceBackend,
        *,
        workers: int,
        copy_workers: int,
        host_sync: bool,
        max_inflight: int | None,
        run: Run,
    ) -> None:
        self.backend = backend
        self._run = run
        self.host_sync = host_sync
        self.max_inflight = max_inflight
        self.skip_waits = False  # test hook: drop the cross-stream waits (results must diverge)
        self._workers = workers
        self._copy_workers = copy_workers
        self._executors: dict[tuple[int, StreamFamily], GpuExecutor] = {}
        self._cond = threading.Condition(threading.Lock())
        self._broken: dict[int, DeviceFailedError] = {}  # device -> the error that killed it
        # Devices that failed themselves (a CUDA error): nothing they queued will run. The
        # others in _broken only have streams stuck behind a failed GPU (see fail()).
        self._dead: set[int] = set()
        self._inflight: dict[int, int] = {}  # device -> launched fences not completed
        self._closing = False  # shutdown: in-flight waiters give up
        # What operations of a failed device had enqueued: the device may still touch it.
        self._kept_forever: list[object] = []

    def executor(
        self, ctx: Context, prop: FnProperty, register: Callable[[str, GpuExecutor], None]
    ) -> GpuExecutor:
        """The executor for ``prop`` on ``ctx``, created on first use (engine lock held)."""
        family = family_of(prop)
        key = (ctx.device_id, family)
        executor = self._executors.get(key)
        if executor is None:
            copy = family in (StreamFamily.H2D, StreamFamily.D2H)
            n = self._copy_workers if copy else self._workers
            executor = self._executors[key] = GpuExecutor(ctx, family, n, self, self._run)
            register(f"gpu{ctx.device_id}-{family.value}", executor)
        return executor

    # -- failures ----------------------------------------------------------------------

    def broken(self, device_id: int) -> DeviceFailedError | None:
        """The error that killed ``device_id``, or None while it works."""
        return self._broken.get(device_id)

    def dead(self, device_id: int) -> bool:
        """Whether ``device_id`` failed itself (a CUDA error): nothing it queued will run."""
        return device_id in self._dead

    def fail(
        self,
        device_id: int,
        cause: BaseException | int,
        reason: str | None = None,
        *,
        stuck: bool = False,
    ) -> DeviceFailedError:
        """Mark ``device_id`` failed (first cause wins); return its error.

        ``reason`` replaces "failed with a CUDA error (...)" in the message. ``stuck``: the
        device itself works, but a stream of it waits for a failed GPU; it takes no new work,
        and what it queued on its other streams still runs (:meth:`dead` stays False).
        """
        with self._cond:
            if not stuck:
                self._dead.add(device_id)
            err = self._broken.get(device_id)
            if err is None:
                what = (
                    f"status {cause}"
                    if isinstance(cause, int)
                    else f"{type(cause).__name__}: {cause}"
                )
                why = reason or f"failed with a CUDA error ({what})"
                err = DeviceFailedError(
                    f"gpu({device_id}) ({self.backend.name}) {why}; "
                    "its pending operations failed and later pushes to it raise. A CUDA error "
                    "leaves the process in an inconsistent state: the process must be "
                    "restarted to use this GPU again"
                )
                if isinstance(cause, BaseException):
                    err.__cause__ = cause
                self._broken[device_id] = err
            self._cond.notify_all()  # in-flight waiters of a dead device give up
            return err

    # -- the in-flight bound -----------------------------------------------------------

    def acquire(self, device_id: int) -> bool:
        """Take an in-flight slot on ``device_id``, waiting while the bound is reached.

        Called on a GPU worker thread before a launch; the poller frees slots as fences
        complete, so this blocks only the worker, never the loop. Returns False (and takes
        no slot) if the device failed or the engine is shutting down meanwhile.
        """
        limit = self.max_inflight
        with self._cond:
            if limit is not None:
                while self._inflight.get(device_id, 0) >= limit:
                    if device_id in self._broken or self._closing:
                        return False
                    self._cond.wait(0.1)
            if device_id in self._broken:
                return False
            self._inflight[device_id] = self._inflight.get(device_id, 0) + 1
            return True

    def release(self, device_id: int) -> None:
        """Give back the in-flight slot of a completed (or never launched) operation."""
        with self._cond:
            self._inflight[device_id] -= 1
            self._cond.notify_all()  # waiters of several devices share the condition

    def keep_forever(self, obj: object) -> None:
        """Keep ``obj`` for the life of the process (memory a failed device may still use)."""
        with self._cond:
            self._kept_forever.append(obj)

    def inflight(self, device_id: int) -> int:
        """Launched operations on ``device_id`` whose fence has not completed."""
        return self._inflight.get(device_id, 0)

    def shutdown(self) -> None:
        """Let workers blocked on the in-flight bound go (the executors stop separately)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def __repr__(self) -> str:
        return (
            f"<GpuDevices {self.backend.name} executors={len(self._executors)} "
            f"broken={sorted(self._broken)}>"
        )
