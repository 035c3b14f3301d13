"""Routing: which executor runs an operation, and the thread pools it creates on first use.

A collaborator of the scheduler inside the core: :class:`Routes` is its typed field
``core.routes``. A CPU context's operations go to the thread pool of that context (``cpu0``,
``cpu1``, ...; ``FnProperty.CPU_PRIORITIZED`` ones to the shared ``cpu-priority`` pool), or to
the event-loop thread (``None``) for ``FnProperty.ASYNC`` functions, coroutine functions and
serial mode. A GPU or remote context is routed by its collaborator (:class:`GpuSeam`,
:class:`RemoteSeam`), opened here on its context's first push through the façade's opener.

The scheduler keeps the one route it read last (``Scheduler._last_route``) and asks here only
when a push's context or property differs from it, so nothing here is on the push's fast path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .context import Context, DeviceType, RunContext, cpu
from .executors import Executor
from .executors.threads import ThreadExecutor
from .kinds import _CORO, FnProperty, OpState

if TYPE_CHECKING:
    from .operation import Operation
    from .scheduler import Scheduler

__all__ = ("GpuSeam", "RemoteSeam", "Routes")

_CPU0 = cpu(0)
_CPU = DeviceType.CPU
_REMOTE = DeviceType.REMOTE


class GpuSeam(Protocol):
    """What the core calls of its GPU collaborator (``gpu_sync.GpuSync``), behind its
    ``core.gpu is not None`` (or, at dispatch, ``core.may_hold``) test; the core never imports
    the collaborator."""

    def route(self, ctx: Context, prop: FnProperty, kind: int) -> Executor | None:
        """The executor of an operation on a GPU context (None: the loop thread)."""

    def devices_for(self, ctx: Context) -> object:
        """Raise if ``ctx``'s device cannot be used now."""

    def hold_for_fences_locked(self, op: Operation[Any]) -> bool:
        """Make a host consumer wait for the pending fences on its Vars; False if none."""

    def execute(self, op: Operation[Any], rctx: RunContext) -> None:
        """Launch GPU ``op`` on this worker's stream (a GPU worker thread)."""

    def shutdown(self) -> None:
        """Stop the device workers (``aclose``)."""


class RemoteSeam(Protocol):
    """What the core calls of its remote collaborator (``remote.RemoteBackend``), behind its
    ``core.remote is not None`` (or, at dispatch, ``core.may_hold``) test; the core never
    imports the collaborator."""

    def route(self, ctx: Context, prop: FnProperty, kind: int) -> Executor:
        """The executor of an operation on a remote context (raises for what cannot run
        remotely)."""

    def hold_locked(self, op: Operation[Any]) -> bool:
        """Make an operation that is not a remote value operation wait until the remote
        versions its Vars carry have settled (and, for a reader, are gathered); False if
        none is pending. Lock held."""

    def key_of(self, op: Operation[Any]) -> str | None:
        """The Dask key of a remote operation, None for a local one (observers: ``dump()``)."""

    def withdraw_locked(self, op: Operation[Any], msg: object) -> bool:
        """Cancel a running operation that released its Vars once submitted (a remote value
        operation) if nothing has used its result yet; False otherwise. Lock held."""


class Routes:
    """The executors of one engine and the route of each ``(context, property)`` pushed.

    Its state, every field guarded by the engine lock (``core.lock``):

    - ``executors``: the thread pools by name (the CPU ones made here; the GPU collaborator
      adds its own), read by the façade's close and by the observers.
    - ``_table``: the executor of each ``(Context, FnProperty)`` routed so far (None: the loop
      thread); emptied when the executors are shut down.
    - ``_run_contexts``: one stream-less :class:`RunContext` per context, made on first use.
    - ``_open_gpu``, ``_open_remote``: the façade's functions that create the GPU and the remote
      collaborator (each attaches itself to the scheduler: ``Scheduler.attach_locked``).
    """

    __slots__ = ("_open_gpu", "_open_remote", "_run_contexts", "_table", "executors")

    def __init__(
        self,
        open_gpu: Callable[[Scheduler, Context], GpuSeam],
        open_remote: Callable[[Scheduler, Context], RemoteSeam],
    ) -> None:
        self.executors: dict[str, Executor] = {}
        self._table: dict[tuple[Context, FnProperty], Executor | None] = {}
        self._run_contexts: dict[Context, RunContext] = {}
        self._open_gpu = open_gpu
        self._open_remote = open_remote

    def route(self, core: Scheduler, ctx: Context, prop: FnProperty, kind: int) -> Executor | None:
        """The executor of an operation of ``kind`` on ``ctx`` with ``prop`` (None: the
        event-loop thread); the first push to a GPU or remote context opens its collaborator,
        which routes it (and raises for what cannot run there). Any thread, lock not held."""
        if ctx.device_type is _REMOTE:
            return self.remote_for(core, ctx).route(ctx, prop, kind)
        if kind == _CORO:
            if ctx.device_type is not _CPU:
                self.gpu_for(core, ctx).devices_for(ctx)  # a host consumer: the device must work
            return None
        try:
            return self._table[ctx, prop]
        except KeyError:
            pass
        if ctx.device_type is not _CPU:
            return self.gpu_for(core, ctx).route(ctx, prop, kind)
        settings = core.settings
        target: Executor | None
        if settings.serial or prop is FnProperty.ASYNC:
            target = None
        elif prop is FnProperty.CPU_PRIORITIZED:
            target = self._pool(core, "cpu-priority", _CPU0, settings.cpu_priority_workers)
        else:
            target = self._pool(core, f"cpu{ctx.device_id}", ctx, settings.cpu_workers)
        with core.lock:
            self._table[ctx, prop] = target
        return target

    def gpu_for(self, core: Scheduler, ctx: Context) -> GpuSeam:
        """The GPU collaborator, opened by the façade's opener on the first GPU push."""
        gpu = core.gpu
        return self._open_gpu(core, ctx) if gpu is None else gpu

    def remote_for(self, core: Scheduler, ctx: Context) -> RemoteSeam:
        """The remote collaborator, opened by the façade's opener on the first remote push."""
        remote = core.remote
        return self._open_remote(core, ctx) if remote is None else remote

    def _pool(self, core: Scheduler, key: str, ctx: Context, workers: int) -> ThreadExecutor:
        with core.lock:
            executor = self.executors.get(key)
            if executor is None:
                executor = ThreadExecutor(ctx, workers, f"aioengine-{key}", core.execute)
                self.executors[key] = executor
            assert isinstance(executor, ThreadExecutor)
            return executor

    def not_submitted(self, core: Scheduler, op: Operation[Any]) -> None:
        """``op``'s pool was shut down after this thread made it READY and released the lock.

        Executors shut down once no operation is READY: ``aclose(cancel=True)`` has cancelled
        ``op`` in between (without ``cancel`` it waits for ``op``). At interpreter exit
        (the pool is abandoned) nothing runs any more: ``op`` is cancelled, never left pending,
        and so is what that makes ready for an abandoned pool (in a loop, not by recursion:
        a chain of thousands may be queued at exit).
        """
        dropped = [op]
        while dropped:
            ready: list[Any] = []
            with core.lock:
                for op in dropped:
                    if op._state is OpState.READY:
                        core.finish_locked(op, OpState.CANCELLED, None, None, ready)
                todo = core.dispatch_locked(ready)
            dropped = [o for o in todo if o.target is not None and o.target.abandoned]
            if len(dropped) < len(todo):
                core.submit_ready([o for o in todo if o.target is None or not o.target.abandoned])

    def run_context(self, ctx: Context) -> RunContext:
        """The stream-less :class:`RunContext` of ``ctx`` (the loop thread's operations)."""
        rctx = self._run_contexts.get(ctx)
        if rctx is None:
            rctx = self._run_contexts[ctx] = RunContext(ctx)
        return rctx

    def on_worker_thread(self, core: Scheduler) -> bool:
        """Whether the caller runs on one of these executors' threads (so inside one of the
        engine's operations); safe from any thread."""
        with core.lock:
            executors = list(self.executors.values())
        return any(executor.owns_current_thread() for executor in executors)

    def forget_locked(self) -> list[Executor]:
        """Forget every executor and route (lock held, or no façade left to push: each step
        is atomic under the GIL); return the executors, for the caller to shut down."""
        executors = list(self.executors.values())
        self.executors.clear()
        self._table.clear()
        return executors
