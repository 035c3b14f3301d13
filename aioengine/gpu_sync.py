"""GPU synchronisation: the collaborator that runs operations on GPU streams and orders them.

The scheduler (``scheduler.py``) knows GPUs only as executors: it reaches this module through its
``_gpu`` field, which stays None until the first push to a ``gpu(i)`` context, so the CPU-only
path pays one ``is None`` test. From then on :class:`GpuSync` owns everything GPU:

- routing (:meth:`GpuSync.route`): plain functions run on the device's stream workers
  (``executors/gpu.py``); ``FnProperty.ASYNC``, ``DELETE_VAR`` and callback-style functions are
  host consumers on the loop;
- the GPU execute path (:meth:`GpuSync.execute`, on a GPU worker thread): cross-stream waits,
  the launch, the fence (``fence.py`` has the ordering rules) and the early release of the
  operation's Var turns once its work is enqueued (event mode);
- fences: :meth:`GpuSync.hold_for_fences_locked` makes a host consumer wait for the pending
  fences on its Vars; the poller (``poller.py``) reports completed fences to
  :meth:`GpuSync._fences_settled`, which completes their operations and wakes their consumers;
- device failure: a failed fence poisons the streams that wait on it
  (:meth:`GpuSync._fail_devices_locked`); every operation a failed device fails shares one
  failure record per device.

Design notes, with the reasons, are in ``docs/design.md`` (section GPU).

State (guarded by the engine lock, ``core.lock``; the device-level state is
:class:`~aioengine.executors.gpu.GpuDevices`', which this class extends):

- ``_core``: the scheduler this collaborator serves (it calls the scheduler's ``_locked``
  bookkeeping; the scheduler never imports this module).
- ``_fence_seq``: fences recorded so far (``Fence.seq``).
- ``_gpu_pending``: fences recorded and not settled.
- ``_stuck_streams``: ``id()``s of GPU streams stuck behind a wait on a failed fence: a fence
  recorded on one of them never completes. A stream lives as long as its worker thread, so
  its id is not reused while the engine runs.
- ``_device_boxes``: per failed GPU, the one failure record its operations share.
"""

from __future__ import annotations

import contextvars
import functools
import weakref
from typing import Any

from . import instrument as _instrument
from .context import Context, RunContext
from .errors import DeviceFailedError, DeviceUnavailableError, trim_traceback
from .executors import Executor
from .executors.device import DeviceBackend
from .executors.gpu import GpuDevices
from .fence import Fence, gpu_waits, host_waits, note_launch
from .kinds import _SYNC, FnProperty, OpState
from .operation import Operation, fence_settled_locked, wait_for_fences_locked
from .poller import poller_for
from .scheduler import Scheduler
from .var import Failure

__all__ = ("GpuSync", "open_gpu")

_DONE = OpState.DONE
_FAILED = OpState.FAILED
_CANCELLED = OpState.CANCELLED
_DEVICE_FAILED = -1  # the status of a fence settled because its device failed elsewhere
_context_run = contextvars.Context.run  # unbound: no method lookup per launch


def open_gpu(core: Scheduler, ctx: Context, backend_box: list[DeviceBackend | None]) -> GpuSync:
    """Create ``core``'s GPU collaborator on the first push to a GPU context (any thread).

    ``backend_box`` holds the engine's ``gpu_backend`` (None: CuPy, loaded now and kept there
    for the next attempt). Raises
    :class:`~aioengine.DeviceUnavailableError` if ``ctx``'s device cannot be used, with the
    scheduler unchanged; two threads racing here make one collaborator.
    """
    if core.loop is None:
        raise RuntimeError(
            f"{core!r} is not bound to an event loop yet, and GPU operations need it (its "
            "poller observes their completion); use the engine from a coroutine first"
        )
    backend = backend_box[0]
    if backend is None:
        from .executors.cupy_streams import CupyBackend

        try:
            backend = backend_box[0] = CupyBackend()
        except DeviceUnavailableError as exc:  # no CuPy: say which push failed
            raise DeviceUnavailableError(f"cannot run on {ctx!r}: {exc}") from None
    backend.check(ctx.device_id)
    settings = core.settings
    with core.lock:
        current = core.gpu
        if isinstance(current, GpuSync):  # another thread opened it first
            return current
        gpu = GpuSync(
            core,
            backend,
            workers=settings.gpu_workers,
            copy_workers=settings.gpu_copy_workers,
            host_sync=settings.gpu_sync == "host" or settings.serial,
            max_inflight=settings.gpu_max_inflight,
        )
        core.attach_locked(gpu=gpu)
    return gpu


class GpuSync(GpuDevices):
    """The GPU side of one engine's scheduler: routes, launches, fences, device failures.

    Created by :func:`open_gpu`; see the module docstring for its state.
    """

    def __init__(
        self,
        core: Scheduler,
        backend: DeviceBackend,
        *,
        workers: int,
        copy_workers: int,
        host_sync: bool,
        max_inflight: int | None,
    ) -> None:
        super().__init__(
            backend,
            run=Scheduler.execute,
            workers=workers,
            copy_workers=copy_workers,
            host_sync=host_sync,
            max_inflight=max_inflight,
        )
        # Weakly: the scheduler holds this collaborator (``_gpu``), and a reference back would
        # make a cycle that only the cycle collector frees (the operations in flight hold
        # the scheduler while this works for them).
        self._core: Scheduler = weakref.proxy(core)
        self._fence_seq = 0
        self._gpu_pending: dict[Fence, None] = {}
        self._stuck_streams: set[int] = set()
        self._device_boxes: dict[int, Failure] = {}

    def route(self, ctx: Context, prop: FnProperty, kind: int) -> Executor | None:
        """Route an operation on a GPU context (not cached: a device may fail meanwhile).

        Plain functions run on the device's stream workers; ``FnProperty.ASYNC``,
        ``DELETE_VAR`` and callback-style functions are host consumers on the loop.
        """
        self.devices_for(ctx)
        if kind != _SYNC or prop is FnProperty.ASYNC or prop is FnProperty.DELETE_VAR:
            return None
        with self._core.lock:
            return self.executor(ctx, prop, self._core.routes.executors.__setitem__)

    def devices_for(self, ctx: Context) -> GpuSync:
        """Raise if ``ctx``'s device cannot be used (now); else return self."""
        self.backend.check(ctx.device_id)
        err = self.broken(ctx.device_id)
        if err is not None:
            raise DeviceFailedError(f"cannot push to {ctx!r}: {err}") from err.__cause__
        return self

    def _device_box_locked(self, device_id: int, err: DeviceFailedError) -> Failure:
        """The one failure record all operations failed by ``device_id`` share (lock held)."""
        box = self._device_boxes.get(device_id)
        if box is None or not box.unthrown:  # none yet, or thrown (and so cleared) already
            box = self._device_boxes[device_id] = Failure(err)
            self._core.record_failure_locked(box)
        return box

    def hold_for_fences_locked(self, op: Operation[Any]) -> bool:
        """Make a host consumer wait for the pending GPU fences on its Vars (lock held).

        Returns False when there are none (it may start now); else it stays PENDING and
        :meth:`_settle_fence_locked` makes it ready when the last of them completes.
        """
        fences = host_waits(op.const_vars, op.mutate_vars)
        if not fences:
            return False
        wait_for_fences_locked(op, len(fences))
        for fence in fences:
            assert fence.waiters is not None  # pending fences have a waiter list
            fence.waiters.append(op)
        return True

    def execute(self, op: Operation[Any], rctx: RunContext) -> None:
        """Enqueue GPU ``op`` on this worker's stream and record its fence (GPU worker thread).

        The stream first waits (``wait_event``, no host wait) for the fences on other streams
        that ``op`` depends on (fence.py). Once its work is enqueued its Var turns are released
        (event mode; host mode: when its fence completes), and the poller completes ``op`` when
        its fence does. An enqueue cannot be undone, so nothing here can be cancelled.
        """
        stream = rctx.stream
        device = op.ctx.device_id
        broken = None
        deps: list[Fence] = []
        waits: list[Any] = []
        released: list[Operation[Any]] = []  # what a skip of op made READY
        with self._core.lock:
            # RUNNING from here on (so no cancel() races the device check below); False:
            # cancelled while queued, or skipped (an input carries a failure).
            started = self._core.start_locked(op, released)
            if started:
                broken = self.broken(device)
                if broken is None:
                    deps = gpu_waits(op.const_vars, op.mutate_vars, stream)
                    if not self.skip_waits:
                        waits = [f.event for f in deps]
        if not started:
            if released:
                self._core.submit_ready(released)
            return
        if broken is not None:
            self._fail_on_device(op, device, broken)
            return
        if self._core.instruments:
            _instrument.notify_start(self._core, op)
        log = self._core.tracelog
        if log is not None:
            log.started(op)
        backend = self.backend
        # The in-flight bound: may wait (this worker only) for completions.
        if not self.acquire(device):  # the device failed, or the interpreter is exiting
            broken = self.broken(device)
            if broken is not None:
                self._fail_on_device(op, device, broken)
            else:
                self._core.finish(op, _CANCELLED, None, None)
            return
        keep: list[Any] = []
        fn = op.fn
        assert fn is not None
        # The values before the run too: a write may replace a value the device still reads.
        before = tuple(v._value for v in op.vars)
        state = _DONE
        result: object = None
        exc: BaseException | None = None
        try:
            for event in waits:
                backend.wait_event(stream, event)
            result = _context_run(
                op.snapshot, backend.run, stream, fn, RunContext(op.ctx, stream, keep, backend)
            )
        except BaseException as e:
            trim_traceback(e)
            state, exc = _FAILED, e
        event = None
        if exc is None or not backend.is_device_error(exc):
            try:
                event = backend.record(stream)
            except BaseException as e:
                exc = e
        if event is None:  # a CUDA error: the device is dead, and so is what it has queued
            self.release(device)
            assert exc is not None
            # What the function enqueued may still run: keep it for the life of the process.
            self.keep_forever((fn, keep, before, tuple(v._value for v in op.mutate_vars)))
            err = self.fail(device, exc)
            with self._core.lock:
                self._core.call_soon_locked(functools.partial(self._fail_device_fences, device))
            self._fail_on_device(op, device, err)
            del op, fn, exc  # the failure's frames reach this frame
            return
        after = tuple(v._value for v in op.mutate_vars)
        fence = Fence(self, backend, event, stream, device, 0, (fn, result, keep, before, after))
        ready: list[Any] = []
        with self._core.lock:
            self._fence_seq += 1
            fence.seq = self._fence_seq
            fence.op = op
            fence.state = state
            fence.result = result
            fence.exc = exc
            note_launch(op.const_vars, op.mutate_vars, fence)
            self._gpu_pending[fence] = None
            poisoned = False
            for dep in deps:  # if one of them fails, this stream never passes its wait
                if dep.status is None:
                    assert dep.dependents is not None  # pending fences have a list
                    dep.dependents.append(fence)
                elif dep.status:
                    poisoned = True
            if not self.host_sync:
                self._core.release_locked(op, state, exc, ready)
            # Or the device failed, or its stream got stuck, while op was being enqueued (a
            # cross-device chain settles only the fences pending then): op's work sits behind a
            # wait that never passes, or on a dead device.
            if poisoned or fence.stream_id in self._stuck_streams or self.dead(device):
                self._fail_devices_locked([fence], ready)
            todo = self._core.dispatch_locked(ready)
        loop = self._core.loop
        assert loop is not None
        poller_for(loop).watch(fence)
        if todo:
            self._core.submit_ready(todo)
        del op, fn, exc, fence  # an idle worker keeps nothing alive

    def _fail_on_device(self, op: Operation[Any], device: int, err: DeviceFailedError) -> None:
        """Fail ``op`` (not launched) because its device failed."""
        ready: list[Any] = []
        with self._core.lock:
            box = self._device_box_locked(device, err)
            self._core.finish_locked(op, _FAILED, None, err, ready, box)
            todo = self._core.dispatch_locked(ready)
        if todo:
            self._core.submit_ready(todo)

    def _fail_device_fences(self, device: int) -> None:
        """Settle every pending fence of a failed device as failed (loop thread)."""
        ready: list[Any] = []
        with self._core.lock:
            failed = []
            for fence in list(self._gpu_pending):
                if fence.device_id == device:
                    failed.extend(self._settle_fence_locked(fence, _DEVICE_FAILED, ready))
            self._fail_devices_locked(failed, ready)
            todo = self._core.dispatch_locked(ready)
        if todo:
            self._core.submit_ready(todo)

    def _fences_settled(self, items: list[tuple[Fence, int]]) -> None:
        """The poller saw these fences complete (status 0) or fail (loop thread)."""
        ready: list[Any] = []
        with self._core.lock:
            failed = []
            for fence, status in items:
                if fence.status is None:  # else settled already, as its device failed
                    failed.extend(self._settle_fence_locked(fence, status, ready))
            if failed:
                self._fail_devices_locked(failed, ready)
            todo = self._core.dispatch_locked(ready)
        if todo:
            self._core.submit_ready(todo)

    def _fail_devices_locked(self, waiting: list[Fence], ready: list[Any]) -> None:
        """Fail the pending fences that wait on a failed fence, and those behind them on
        their streams (lock held).

        Such a fence's stream waits (``wait_event``) for work that will never complete, so
        nothing recorded on that stream from then on completes: those fences fail, and so,
        in turn, do the fences that wait on them (cross-device chains). Their device takes
        no new work; what it queued earlier on that stream or on its other streams still
        runs, and the poller reports it as usual, so that no host consumer of that work
        starts before the device is done with its memory.
        """
        while waiting:
            fence = waiting.pop()
            if fence.status is not None:
                continue
            self.fail(
                fence.device_id,
                RuntimeError("its streams wait for work of a failed GPU"),
                reason="its streams wait for work of a GPU that failed",
                stuck=True,
            )
            self._stuck_streams.add(fence.stream_id)
            for other in list(self._gpu_pending):
                if (
                    other.stream_id == fence.stream_id
                    and other.seq >= fence.seq
                    and other.status is None
                ):
                    waiting.extend(self._settle_fence_locked(other, _DEVICE_FAILED, ready))

    def _settle_fence_locked(self, fence: Fence, status: int, ready: list[Any]) -> list[Fence]:
        """Complete ``fence``'s operation and wake the host consumers waiting on it (lock held).

        A failed status fails the operation with its device's error (the device is marked
        failed) and keeps the fence's keepalive for the life of the process: the device may
        still touch that memory.
        Returns the pending fences (of other operations) that wait on a failed ``fence``.
        The event and the keepalive are dropped on the poller's thread, not here: destroying
        an event or freeing pool memory is a CUDA call, and this runs on the loop thread.
        """
        fence.status = status
        del self._gpu_pending[fence]
        self.release(fence.device_id)
        op = fence.op
        fence.op = None
        # Hand the event (and, on success, the keepalive) to the poller without keeping a
        # reference here: release() empties the list, so the last reference never dies on
        # the loop thread, even if the poller thread drops its own first.
        dropped: list[object] = [fence.event]
        fence.event = None
        if not status:
            dropped.append(fence.keep)
        else:  # the failed device may still touch that memory, as after a CUDA error raised
            self.keep_forever(fence.keep)  # in a worker (execute)
        fence.keep = None
        loop = self._core.loop
        assert loop is not None
        poller_for(loop).release(dropped)
        dependents = fence.dependents
        fence.dependents = None
        # The outcome of its function (enqueued): the operation's now, not the fence's, which
        # its Vars keep after this.
        result, exc = fence.result, fence.exc
        fence.result = fence.exc = None
        if op is not None:
            state = fence.state
            box = None
            if status:
                exc = self.fail(fence.device_id, status)
                box = self._device_box_locked(fence.device_id, exc)
                state = _FAILED
                result = None
            if self.host_sync:
                self._core.finish_locked(op, state, result, exc, ready, box)
            else:  # released as a success: what it wrote carries a failure found since
                self._core.complete_released_locked(op, state, result, exc, box)
        waiters = fence.waiters
        fence.waiters = None
        if waiters:
            for w in waiters:
                if fence_settled_locked(w):
                    ready.append(w)
        if not status or not dependents:
            return []
        return [d for d in dependents if d.status is None]
