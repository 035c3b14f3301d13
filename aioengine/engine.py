"""The engine: the public façade over the scheduler core and its collaborators.

:class:`Engine` is what users hold. It resolves the settings, binds the lifecycle (``async
with``, :meth:`Engine.aclose`), validates every push's arguments before anything is queued,
and runs the waits (:meth:`Engine.wait_for_var`, :meth:`Engine.wait_for_all`). The cycle every
operation goes through (admission, grant, dispatch, run, finish, cancel, bulk segments) is the
scheduler's (``scheduler.py``, ``self._core``); the façade reaches the collaborators around it
by delegation: GPU synchronisation (``gpu_sync.py``, opened on the first GPU push), the
observers (``dump``, ``graph``, ``trace``, ``history``, ``stats``, ``progress``, ``watchdog``),
and the ergonomic layer (``ergonomic.py``: :meth:`Engine.submit`, :meth:`Engine.op`,
``Var.get``/``Var.set``).

Anything that must happen before an observer reads the core (closing an open bulk segment,
say) happens here, at the façade's entry point: observers never change the core's state.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import numbers
import operator
import os
import warnings
from collections.abc import Callable, Coroutine, Iterable, Sequence
from operator import add
from types import FunctionType, TracebackType
from typing import Any, TypeVar, overload

from . import bulk as _bulk
from . import ergonomic as _ergonomic
from . import instrument as _instrument
from .cancellation import cancel_marker, cancel_not_started
from .context import Context, RunContext, cpu
from .corestate import COMPILED as _COMPILED
from .corestate import State
from .ergonomic import OpDecorator
from .errors import (
    DependencyError,
    EngineClosedError,
    OperatorDeletedError,
    VarDeletedError,
    summary,
)
from .executors import Executor
from .executors.device import DeviceBackend
from .fence import has_pending
from .functions import async_kind, default_name, delete_nothing, is_coroutine_function
from .gpu_sync import open_gpu
from .instrument import Instrument
from .kinds import _BULK, _CORO, _SYNC, _WAIT, FnProperty, OpState, check_prop
from .lock import unguard_interrupts
from .observe import dump as _dump
from .observe import graph as _graph
from .observe import progress as _progress
from .observe import trace as _trace
from .observe.history import Recorder
from .observe.log import OpLogger
from .observe.stats import EngineStatistics, build_statistics
from .observe.watchdog import start_watchdog
from .operation import (
    OnComplete,
    Operation,
    OprHandle,
    delete_handle_locked,
    new_operation,
)
from .remote import RemoteBackend, open_remote
from .scheduler import Scheduler
from .settings import Settings, cluster_setting
from .var import NO_VALUE, Var, carry, checked_modes, checked_reads, checked_writes, queued_behind

__all__ = ("Engine",)

T = TypeVar("T")

logger = logging.getLogger("aioengine")

_partial = functools.partial
_CO_COROUTINE = 128  # inspect.CO_COROUTINE
_NORMAL = FnProperty.NORMAL
_CPU0 = cpu(0)
# The compiled façade reads a pushed function's code flags and name from its C struct
# (functions.pxd, cimported by engine.pxd). Declared, not bound: the pure-Python façade
# calls them only ``if _COMPILED``.
_is_coroutine_code: Callable[[FunctionType], int]
_qualified_name: Callable[[FunctionType], str]


def _check_timeout(timeout: object) -> None:
    """``timeout`` must be None or a number of seconds (NaN is refused: it never expires)."""
    if timeout is None:
        return
    if type(timeout) not in (int, float) and (
        isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)
    ):
        raise TypeError(
            f"timeout must be a number of seconds or None, got {timeout!r} "
            f"({type(timeout).__name__})"
        )
    if timeout != timeout:
        raise ValueError("timeout must be a number of seconds or None, got nan")


def _join_executors(executors: list[Executor]) -> None:
    """Join the workers of executors already shut down (on a helper thread, see aclose)."""
    for executor in executors:
        executor.shutdown(True)


def _forgetting(remote: RemoteBackend, var: Var, op: Operation[None]) -> None:
    """``delete_var``'s done callback on an engine with a cluster: drop what ``var`` keeps on
    the cluster (its remote version, its scattered value), unless the deletion was cancelled
    (then the Var lives on)."""
    if not op.cancelled():
        remote.forget(var)


class Engine:
    """An asyncio-native dependency engine (MXNet's execution engine, for ``async`` Python).

    Push functions with the Vars they read (``const_vars``) and mutate (``mutate_vars``); the
    engine runs each one as soon as its Vars allow, in parallel where it can, and guarantees
    that two operations of which at least one mutates a common Var run in push order.

    The engine binds to the running event loop on first use (not at construction), so it can
    be created anywhere, including a notebook cell; using it from a second loop raises
    :class:`RuntimeError`. Use it as ``async with Engine() as engine:`` or call
    :meth:`aclose`.

    Args:
        cpu_workers: threads per CPU context (env ``AIOENGINE_CPU_WORKERS``; default: the
            number of CPUs).
        cpu_priority_workers: threads of the pool that runs ``FnProperty.CPU_PRIORITIZED``
            operations (env ``AIOENGINE_CPU_PRIORITY_WORKERS``; default: min(4, CPUs)).
        serial: run every operation alone, in push order, on the loop thread (MXNet's
            NaiveEngine, with the same results, errors and cancellation as the threaded
            mode; env ``AIOENGINE_SERIAL=1``; default False).
        max_pending: bound for the awaitable pushes (:meth:`push_sync_wait` and friends),
            which wait while this many operations are pending, so a producer cannot outrun
            memory (env ``AIOENGINE_MAX_PENDING``; default: unbounded). Plain pushes are
            never refused.
        watchdog: log a :meth:`dump` (logger ``aioengine``, WARNING) when no operation has
            finished for this many seconds while some are pending, once per stall; also
            records push sites (env ``AIOENGINE_WATCHDOG``; default: off). See
            ``docs/observability.md``.
        gpu_backend: the device behind ``gpu(i)`` contexts: CuPy (the default, loaded on
            the first GPU push) or :class:`~aioengine.SimulatedGPU` (CPU stand-in).
        gpu_workers: threads per GPU for compute and priority work, each with its own stream
            (env ``AIOENGINE_GPU_WORKERS``; default 1, as MXNet's
            ``MXNET_GPU_WORKER_NTHREADS``).
        gpu_copy_workers: threads per GPU for each copy direction, each with its own stream
            (env ``AIOENGINE_GPU_COPY_WORKERS``; default 1; MXNet's
            ``MXNET_GPU_COPY_NTHREADS``).
        gpu_sync: ``"event"`` (default): a GPU operation releases its Vars once enqueued and
            later GPU operations order themselves after it with stream waits; ``"host"``:
            only once its work completed (a debug switch and test oracle; env
            ``AIOENGINE_GPU_SYNC``).
        gpu_max_inflight: the most enqueued, uncompleted operations per GPU; a GPU worker
            waits before launching more, so a fast producer cannot exhaust device memory
            (env ``AIOENGINE_GPU_MAX_INFLIGHT``; default: unbounded).
        cluster: the Dask cluster that runs operations pushed to :func:`~aioengine.remote`
            contexts: a ``distributed.Client`` (asynchronous on the engine's loop, or a
            blocking one; used, never closed), a cluster object (e.g. ``LocalCluster``), a
            scheduler address (``"tcp://10.0.0.5:8786"``) or ``"local"`` (the engine starts
            a ``LocalCluster`` of its own). A client the engine makes is created on its loop
            at the first remote push and closed by :meth:`aclose` (env
            ``AIOENGINE_CLUSTER``: an address; default: none). Needs
            ``pip install 'aioengine[dask]'``; see ``docs/howto/cluster.md``.
        security: a ``distributed.security.Security`` for the client the engine makes
            (TLS); default: none.

    Raises:
        ValueError: if a setting (argument or environment variable) is invalid; the message
            names it.
    """

    def __init__(
        self,
        *,
        cpu_workers: int | None = None,
        cpu_priority_workers: int | None = None,
        serial: bool | None = None,
        max_pending: int | None = None,
        watchdog: float | None = None,
        gpu_backend: DeviceBackend | None = None,
        gpu_workers: int | None = None,
        gpu_copy_workers: int | None = None,
        gpu_sync: str | None = None,
        gpu_max_inflight: int | None = None,
        cluster: object = None,
        security: object = None,
    ) -> None:
        self._settings = Settings.resolve(
            cpu_workers=cpu_workers,
            cpu_priority_workers=cpu_priority_workers,
            serial=serial,
            max_pending=max_pending,
            watchdog=watchdog,
            gpu_workers=gpu_workers,
            gpu_copy_workers=gpu_copy_workers,
            gpu_sync=gpu_sync,
            gpu_max_inflight=gpu_max_inflight,
        )
        if gpu_backend is not None and not all(
            callable(getattr(gpu_backend, m, None))
            for m in ("check", "bind_worker", "run", "launch", "wait_event", "record", "query")
        ):
            raise TypeError(
                f"gpu_backend must be a device backend (aioengine.SimulatedGPU() or "
                f"aioengine.CupyBackend()), got {gpu_backend!r}"
            )
        self._gpu_backend = gpu_backend
        # Numbers the Vars' default names; next() on it is atomic, so new_var() takes no
        # lock (a finalizer may call it inside a critical section: lock.py).
        self._var_count = itertools.count(1)
        # The scheduler core: every operation's cycle and the state it needs (scheduler.py).
        self._core = Scheduler(
            self._settings,
            _partial(open_gpu, backend_box=[gpu_backend]),
            (OpLogger(),) if logger.isEnabledFor(logging.DEBUG) else (),
            _partial(open_remote, cluster=cluster_setting(cluster), security=security),
        )
        if self._settings.watchdog is not None:
            start_watchdog(self, self._settings.watchdog)

    @property
    def gpu_backend(self) -> DeviceBackend | None:
        """The device backend given as ``gpu_backend`` (None: CuPy, the default)."""
        return self._gpu_backend

    @property
    def serial(self) -> bool:
        """Whether the engine runs in serial mode."""
        return self._settings.serial

    @property
    def cpu_workers(self) -> int:
        """Threads per CPU context pool."""
        return self._settings.cpu_workers

    @property
    def cpu_priority_workers(self) -> int:
        """Threads of the CPU priority pool."""
        return self._settings.cpu_priority_workers

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` has finished, or was left unfinished (timed out or
        cancelled) on an event loop that has closed since."""
        _close_if_loop_closed(self)
        return self._core.state is State.CLOSED

    @property
    def pending(self) -> int:
        """The number of operations pushed and not finished yet."""
        return len(self._core.live)

    def __repr__(self) -> str:
        return repr(self._core)

    def add_instrument(self, instrument: Instrument) -> None:
        """Install an :class:`~aioengine.instrument.Instrument`; safe from any thread."""
        if not isinstance(instrument, Instrument):
            raise TypeError(f"instrument must be an aioengine Instrument, got {instrument!r}")
        with self._core.lock:
            _instrument.install_locked(self._core, instrument)

    def remove_instrument(self, instrument: Instrument) -> None:
        """Uninstall ``instrument`` (ValueError if it is not installed)."""
        with self._core.lock:
            if instrument not in self._core.instruments:
                raise ValueError(f"{instrument!r} is not installed on {self!r}")
            _instrument.uninstall_locked(self._core, instrument)

    def __enter__(self) -> Engine:
        raise TypeError(
            "aioengine.Engine is an asynchronous context manager: use `async with "
            "ae.Engine() as engine:` in a coroutine, or ae.BlockingEngine from synchronous code"
        )

    def __exit__(self, *exc_info: object) -> None:
        """Never reached: :meth:`__enter__` refuses a plain ``with``."""

    async def __aenter__(self) -> Engine:
        self._core.require_loop()
        if self._core.state is not State.OPEN:
            raise EngineClosedError(f"{self!r} is closed; create a new Engine")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.aclose()
            return
        # The body raised: cancel what has not started, let running work finish, close, and
        # let the body's exception propagate unchanged. Failures of operations that were
        # still running are logged, not lost.
        try:
            await self.aclose(cancel=True)
        except BaseExceptionGroup as group:
            logger.error(
                "%r closed while handling %r; operations also failed", self, exc, exc_info=group
            )

    async def aclose(self, *, cancel: bool = False, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Drain the engine, shut its thread pools down and raise unthrown failures.

        After this starts, pushes raise :class:`~aioengine.EngineClosedError`. Without
        ``cancel`` every pending operation runs; with ``cancel=True`` those that have not
        started are cancelled and running ones are waited for. Closing twice is harmless. If
        the await is cancelled or times out, the engine stays consistent (still closing, its
        pools running); call again. Once the event loop has closed, an engine left closing
        so is closed (:attr:`closed`). The worker threads are joined off the event loop.

        Raises:
            ExceptionGroup: of every failure recorded and not thrown yet, as
                :meth:`wait_for_all`.
            RuntimeError: inside one of this engine's operations (it would wait for itself).
            TimeoutError: if operations are still running after ``timeout`` seconds (e.g. a
                callback-style operation whose ``on_complete`` is never called); the message
                names them.
        """
        self._core.check_fork()
        _check_timeout(timeout)
        if self.closed:  # (which closes it if its loop has closed)
            return  # even from another loop: closing twice is harmless
        self._core.require_loop()
        current = self._core.running_op()
        if current is not None:
            raise RuntimeError(
                f"aclose() inside operation {current.name!r} would wait for that operation "
                "itself; close the engine outside its operations"
            )
        with self._core.lock:
            if self._core.state is State.CLOSED:
                return
            self._core.set_state_locked(State.CLOSING)
        if cancel:
            cancel_not_started(self._core)
        try:
            await self._drained(timeout)
        except TimeoutError:
            with self._core.lock:
                names = [op.name for op in list(self._core.live.values())[:10]]
            raise TimeoutError(
                f"aclose() timed out after {timeout} s with {len(self._core.live)} operation(s) "
                f"still pending, first: {', '.join(map(repr, names))}"
            ) from None
        errors = self._core.take_failures()
        if self._core.gpu is not None:
            self._core.gpu.shutdown()
        remote = self._core.remote
        if remote is not None:
            assert isinstance(remote, RemoteBackend)
            await remote.aclose()  # nothing is pending: it leaves no key of this engine
        executors = self._core.shutdown_executors(wait=False)
        if executors:
            # Joined off the loop: a callback-style operation's function may still need it.
            try:
                joined = asyncio.get_running_loop().run_in_executor(
                    None, _join_executors, executors
                )
            except RuntimeError:  # interpreter exit: the default executor takes no new work
                _join_executors(executors)
            else:
                await joined
        await self._drained(timeout)  # deletions finalizers pushed meanwhile (see delete_var)
        with self._core.lock:
            self._core.set_state_locked(State.CLOSED)
        unguard_interrupts(self._core)
        if errors:
            raise BaseExceptionGroup("unhandled errors in aioengine.Engine", errors)

    def __del__(self) -> None:
        # __init__ may have failed before _core existed: then there is nothing to release.
        # The last reference may be dropped inside one of the scheduler's critical sections
        # on this very thread, so nothing here takes the engine lock.
        core = getattr(self, "_core", None)
        # Fields only until there is something to say or release: at interpreter exit this
        # module's globals (State...) may be gone, and a closed engine has neither left.
        if core is None or not (core.failures or core.routes.executors):
            return
        if core.state is State.CLOSED:
            return
        _collected_unclosed(self, core)

    def new_var(self, name: str | None = None, *, value: object = NO_VALUE) -> Var:
        """Create a Var of this engine; safe from any thread.

        Args:
            name: shown in reprs and error messages (default ``"var<N>"``).
            value: data for the Var to carry (see :meth:`submit` and :meth:`Var.get`);
                default: none.

        Raises:
            EngineClosedError: if the engine is closed.
        """
        if value is not NO_VALUE:
            var = self.new_var(name)
            carry(var, value)
            return var
        self._core.check_fork()
        if self._core.state is State.CLOSED:
            raise EngineClosedError(f"{self!r} is closed; create a new Engine")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r}")
        return Var(self, name if name is not None else f"var{next(self._var_count)}")

    @overload
    def new_operator(
        self,
        fn: Callable[[RunContext], Coroutine[Any, Any, T]],
        const_vars: Iterable[Var] = ...,
        mutate_vars: Iterable[Var] = ...,
        *,
        commute_vars: Iterable[Var] = ...,
        concurrent_vars: Iterable[Var] = ...,
        prop: FnProperty = ...,
        name: str | None = ...,
        is_async: bool | None = ...,
    ) -> OprHandle[T]: ...

    @overload
    def new_operator(
        self,
        fn: Callable[[RunContext, OnComplete], None],
        const_vars: Iterable[Var] = ...,
        mutate_vars: Iterable[Var] = ...,
        *,
        commute_vars: Iterable[Var] = ...,
        concurrent_vars: Iterable[Var] = ...,
        prop: FnProperty = ...,
        name: str | None = ...,
        is_async: bool | None = ...,
    ) -> OprHandle[None]: ...

    @overload
    def new_operator(
        self,
        fn: Callable[[RunContext], T],
        const_vars: Iterable[Var] = ...,
        mutate_vars: Iterable[Var] = ...,
        *,
        commute_vars: Iterable[Var] = ...,
        concurrent_vars: Iterable[Var] = ...,
        prop: FnProperty = ...,
        name: str | None = ...,
        is_async: bool | None = ...,
    ) -> OprHandle[T]: ...

    def new_operator(
        self,
        fn: Callable[..., Any],
        const_vars: Iterable[Var] = (),
        mutate_vars: Iterable[Var] = (),
        *,
        commute_vars: Iterable[Var] = (),
        concurrent_vars: Iterable[Var] = (),
        prop: FnProperty = _NORMAL,
        name: str | None = None,
        is_async: bool | None = None,
    ) -> OprHandle[Any]:
        """Build an operator once (validated, Vars deduplicated) to :meth:`push` many times.

        Args:
            fn: ``fn(rctx)`` (sync), ``async def fn(rctx)``, or, with ``is_async=True``, a
                callback-style ``fn(rctx, on_complete)``.
            is_async: None: coroutine functions are async, anything else is sync; True: a
                coroutine function, or a callback-style function; False: a sync function.

        Raises:
            TypeError: if ``fn`` is not callable, a Var list holds a non-Var, or ``fn`` is a
                coroutine function with ``is_async=False``.
            ValueError: if a Var belongs to another engine.
            VarDeletedError: if a Var was deleted.
        """
        self._check_open()
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        coro = is_coroutine_function(fn)
        if is_async is None:
            kind = _CORO if coro else _SYNC
        elif is_async is True:
            kind = async_kind(fn)
        elif is_async is False:
            if coro:
                raise TypeError(
                    f"{default_name(fn)} is a coroutine function but is_async=False; pass "
                    "is_async=None or True"
                )
            kind = _SYNC
        else:
            raise TypeError(f"is_async must be True, False or None, got {is_async!r}")
        check_prop(prop)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r}")
        mutate = checked_writes(self, mutate_vars)
        const = checked_reads(self, const_vars, mutate)
        modes = None
        if commute_vars or concurrent_vars:
            const, mutate, modes = checked_modes(self, const, mutate, commute_vars, concurrent_vars)
        for v in (*const, *mutate):
            if v._deleted:
                raise VarDeletedError(f"{v!r} was deleted; create a new Var")
        return OprHandle(self, fn, kind, const, mutate, prop, name or default_name(fn), modes)

    def delete_operator(self, handle: OprHandle[Any]) -> None:
        """Retire ``handle``: pushes already made still run; later pushes raise.

        Raises:
            OperatorDeletedError: if it was already deleted.
        """
        self._core.check_fork()
        if not isinstance(handle, OprHandle):
            raise TypeError(f"handle must be an aioengine.OprHandle, got {handle!r}")
        if handle._engine is not self:
            raise ValueError(f"{handle!r} belongs to another Engine")
        with self._core.lock:
            if not delete_handle_locked(handle):
                raise OperatorDeletedError(f"{handle!r} was already deleted")

    def push_sync(
        self,
        fn: Callable[[RunContext], T],
        ctx: Context = _CPU0,
        const_vars: Iterable[Var] = (),
        mutate_vars: Iterable[Var] = (),
        *,
        commute_vars: Iterable[Var] = (),
        concurrent_vars: Iterable[Var] = (),
        prop: FnProperty = _NORMAL,
        priority: int = 0,
        name: str | None = None,
    ) -> Operation[T]:
        """Schedule ``fn(rctx)`` after every earlier operation that conflicts on its Vars.

        This is *not* an async function: it queues the operation and returns at once; await
        the returned :class:`Operation` for the result. ``fn`` runs on a worker thread of
        ``ctx``'s pool (``FnProperty.ASYNC``: inline on the loop thread; serial mode: on the
        loop thread). Safe to call from any thread; calls from one thread keep their order.

        Raises:
            TypeError: if ``fn`` is not callable or is a coroutine function (use
                :meth:`push_async`), or an argument has the wrong type.
            ValueError: if a Var belongs to another engine.
            VarDeletedError: if a Var was deleted.
            EngineClosedError: if the engine is closing or closed.
            DeviceUnavailableError: if ``ctx`` is a GPU that cannot be used here.
        """
        # The usual cases, a function or a partial of one, are decided without a call, and
        # their default name is taken from the same function (each attribute read counts).
        func: Any = fn.func if type(fn) is _partial else fn
        if type(func) is FunctionType:
            if _COMPILED:  # read from the function's C struct (functions.pxd)
                coroutine = _is_coroutine_code(func)  # noqa: F821  (engine.pxd: compiled only)
                if name is None:
                    name = _qualified_name(func)  # noqa: F821
            else:
                coroutine = func.__code__.co_flags & _CO_COROUTINE
                if name is None:
                    name = func.__qualname__
            if coroutine:
                raise TypeError(
                    f"{default_name(fn)} is a coroutine function; push it with push_async()"
                )
        elif not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        elif is_coroutine_function(fn):
            raise TypeError(
                f"{default_name(fn)} is a coroutine function; push it with push_async()"
            )
        mutate = checked_writes(self, mutate_vars)
        const = checked_reads(self, const_vars, mutate)
        if commute_vars or concurrent_vars:
            const, mutate, modes = checked_modes(self, const, mutate, commute_vars, concurrent_vars)
            return self._core.push(
                self, fn, _SYNC, ctx, const, mutate, prop, priority, name, None, None, modes
            )
        return self._core.push(self, fn, _SYNC, ctx, const, mutate, prop, priority, name, None)

    @overload
    def push_async(
        self,
        fn: Callable[[RunContext], Coroutine[Any, Any, T]],
        ctx: Context = ...,
        const_vars: Iterable[Var] = ...,
        mutate_vars: Iterable[Var] = ...,
        *,
        commute_vars: Iterable[Var] = ...,
        concurrent_vars: Iterable[Var] = ...,
        prop: FnProperty = ...,
        priority: int = ...,
        name: str | None = ...,
    ) -> Operation[T]: ...

    @overload
    def push_async(
        self,
        fn: Callable[[RunContext, OnComplete], None],
        ctx: Context = ...,
        const_vars: Iterable[Var] = ...,
        mutate_vars: Iterable[Var] = ...,
        *,
        commute_vars: Iterable[Var] = ...,
        concurrent_vars: Iterable[Var] = ...,
        prop: FnProperty = ...,
        priority: int = ...,
        name: str | None = ...,
    ) -> Operation[None]: ...

    def push_async(
        self,
        fn: Callable[..., Any],
        ctx: Context = _CPU0,
        const_vars: Iterable[Var] = (),
        mutate_vars: Iterable[Var] = (),
        *,
        commute_vars: Iterable[Var] = (),
        concurrent_vars: Iterable[Var] = (),
        prop: FnProperty = _NORMAL,
        priority: int = 0,
        name: str | None = None,
    ) -> Operation[Any]:
        """Schedule an asynchronous function after every conflicting earlier operation.

        ``fn`` is either ``async def fn(rctx)``, run as a task on the engine's loop (the
        operation completes when it returns), or a plain ``fn(rctx, on_complete)`` (MXNet's
        ``AsyncFn``), run on ``ctx``'s pool, which completes when ``on_complete()`` is called
        from any thread, exactly once (``on_complete(exc)`` fails it). A plain function with
        one required parameter that returns an awaitable (``lambda rctx: fetch(url)``) runs
        like ``async def``; two required parameters mean callback-style. Not an async function:
        it returns the :class:`Operation` at once. Safe to call from any thread; a coroutine
        function needs the engine bound to its loop.

        Raises:
            EngineError: ``VarDeletedError``, ``EngineClosedError`` or
                ``DeviceUnavailableError``, as :meth:`push_sync` (and ``TypeError`` /
                ``ValueError`` for bad arguments).
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        kind = async_kind(fn)
        mutate = checked_writes(self, mutate_vars)
        const = checked_reads(self, const_vars, mutate)
        if commute_vars or concurrent_vars:
            const, mutate, modes = checked_modes(self, const, mutate, commute_vars, concurrent_vars)
            return self._core.push(
                self, fn, kind, ctx, const, mutate, prop, priority, name, None, None, modes
            )
        return self._core.push(self, fn, kind, ctx, const, mutate, prop, priority, name, None)

    def push(
        self, handle: OprHandle[T], ctx: Context = _CPU0, *, priority: int = 0
    ) -> Operation[T]:
        """Push one execution of a pre-built operator (see :meth:`new_operator`).

        Raises:
            OperatorDeletedError: if ``handle`` was deleted.
            VarDeletedError: if one of its Vars was deleted since.
            TypeError, ValueError, EngineClosedError, DeviceUnavailableError: as
                :meth:`push_sync`.
        """
        if type(handle) is not OprHandle:
            raise TypeError(f"handle must be an aioengine.OprHandle, got {handle!r}")
        if handle._engine is not self:
            raise ValueError(f"{handle!r} belongs to another Engine")
        if handle._deleted:
            raise OperatorDeletedError(f"{handle!r} was deleted; build a new one")
        op: Operation[T] = self._core.push(
            self,
            handle._fn,
            handle._kind,
            ctx,
            handle._const,
            handle._mutate,
            handle._prop,
            priority,
            handle.name,
            None,
            handle,
            handle._modes,
        )
        return op

    def bulk(self, size: int) -> _bulk.Bulk:
        """Run the inline operations pushed inside ``with engine.bulk(size):`` in segments.

        MXNet's ``engine.bulk``: the sync operations that run on the event-loop thread
        (``FnProperty.ASYNC``, or any sync operation in serial mode) pushed from this task
        inside the block are grouped, in push order, into segments of up to ``size``. A
        segment queues once on the union of its operations' Vars and runs them one after the
        other when its turn comes, which saves most of the per-operation scheduling cost of
        many small operations. Each operation keeps its own result, failure, cancellation
        and skipping; the rule holds as always (two conflicting operations run in push
        order). The price is granularity: a segment starts only when all its Vars are free,
        and later operations on any of them wait for the whole segment.

        A segment closes when it is full, when the block ends, before any other push, when
        something waits (``await`` of a member, :meth:`wait_for_var`, :meth:`wait_for_all`,
        :meth:`dump`) and at the latest on the loop's next iteration: nothing waits for the
        block to end. Other operations (thread-pool, coroutine, GPU, callback-style) and
        pushes from other threads are not grouped. ``size=1`` groups nothing. See
        ``docs/howto/bulk.md``.

        Raises:
            TypeError: if ``size`` is not an int.
            ValueError: if ``size`` is less than 1.
            RuntimeError: (on entering the block) off the engine's event-loop thread.
            EngineClosedError: (on entering the block) if the engine is closed.
        """
        return _bulk.Bulk(self._core, size)

    def delete_var(
        self,
        var: Var,
        delete_fn: Callable[[RunContext], object] | None = None,
        ctx: Context = _CPU0,
    ) -> Operation[None]:
        """Delete ``var`` once every operation pushed on it so far has finished.

        ``delete_fn(rctx)`` (e.g. freeing the data) runs on ``ctx``'s pool after all of them,
        even if ``var`` carries a failure (which stays recorded for :meth:`wait_for_all`). From
        this call on, a push or wait naming ``var`` raises :class:`~aioengine.VarDeletedError`.
        Cancelling the returned operation before it starts cancels the deletion: ``delete_fn``
        does not run and ``var`` can be used (or deleted) again. While the engine closes, a
        deletion is accepted (the close waits; ``delete_fn`` runs on the loop thread).

        Raises:
            VarDeletedError: if ``var`` was already deleted.
            EngineClosedError: if the engine is closed.
            TypeError: if ``delete_fn`` is not callable or None.
        """
        if delete_fn is not None:
            if not callable(delete_fn):
                raise TypeError(f"delete_fn must be callable or None, got {delete_fn!r}")
            if is_coroutine_function(delete_fn):
                raise TypeError("delete_fn must be a plain function, not a coroutine function")
        if type(var) is not Var:
            raise TypeError(f"var must be an aioengine.Var, got {var!r}")
        if var._owner is not self:
            raise ValueError(f"{var!r} belongs to another Engine")
        mutate = (var,)
        fn = delete_fn if delete_fn is not None else delete_nothing
        name = f"delete_var({var.name})"
        op: Operation[None] = self._core.push(
            self, fn, _SYNC, ctx, (), mutate, FnProperty.DELETE_VAR, 0, name, var
        )
        remote = self._core.remote
        if remote is not None:
            # Its keys go with it, here, once it has finished (its function may run on a
            # worker, which can reach neither the Var nor the client).
            assert isinstance(remote, RemoteBackend)
            op.add_done_callback(_partial(_forgetting, remote, var))
        return op

    @property
    def max_pending(self) -> int | None:
        """The bound of the awaitable pushes, or None (unbounded)."""
        return self._settings.max_pending

    async def wait_for_capacity(self) -> None:
        """Wait until fewer than ``max_pending`` operations are pending (at once if unbounded).

        Returns without yielding when there is room. Only meaningful on the loop thread.

        Raises:
            RuntimeError: inside one of this engine's operations, when the room could only
                come from that operation itself (it and the operations waiting for it fill
                the bound): waiting would deadlock.
        """
        await self._wait_for_capacity("wait_for_capacity()")

    async def _wait_for_capacity(self, what: str) -> None:
        """:meth:`wait_for_capacity`, for the call named ``what`` (in its error message)."""
        limit = self._settings.max_pending
        if limit is None or len(self._core.live) < limit:
            return
        loop = self._core.require_loop()
        current = self._core.running_op()
        while True:
            with self._core.lock:
                if len(self._core.live) < limit:
                    return
                if current is not None:
                    # Checked again after each wake-up: meanwhile other pushes may have
                    # queued behind current what would have made room.
                    _check_room_inside_locked(self._core, current, limit, what)
                fut = self._core.wakeups.capacity_waiter_locked(loop)
            try:
                await fut
            except BaseException:
                with self._core.lock:
                    self._core.wakeups.drop_waiter_locked(fut)
                raise

    async def push_sync_wait(
        self,
        fn: Callable[[RunContext], T],
        ctx: Context = _CPU0,
        const_vars: Iterable[Var] = (),
        mutate_vars: Iterable[Var] = (),
        *,
        prop: FnProperty = _NORMAL,
        priority: int = 0,
        name: str | None = None,
    ) -> Operation[T]:
        """:meth:`push_sync` after :meth:`wait_for_capacity`: backpressure for producers.

        Returns the :class:`Operation` once it is pushed (not when it finishes). Raises
        ``RuntimeError`` where :meth:`wait_for_capacity` would deadlock.
        """
        await self._wait_for_capacity("push_sync_wait()")
        return self.push_sync(
            fn, ctx, const_vars, mutate_vars, prop=prop, priority=priority, name=name
        )

    async def push_async_wait(
        self,
        fn: Callable[..., Any],
        ctx: Context = _CPU0,
        const_vars: Iterable[Var] = (),
        mutate_vars: Iterable[Var] = (),
        *,
        prop: FnProperty = _NORMAL,
        priority: int = 0,
        name: str | None = None,
    ) -> Operation[Any]:
        """:meth:`push_async` after :meth:`wait_for_capacity`: backpressure for producers."""
        await self._wait_for_capacity("push_async_wait()")
        return self.push_async(
            fn, ctx, const_vars, mutate_vars, prop=prop, priority=priority, name=name
        )

    async def push_wait(
        self, handle: OprHandle[T], ctx: Context = _CPU0, *, priority: int = 0
    ) -> Operation[T]:
        """:meth:`push` after :meth:`wait_for_capacity`: backpressure for producers."""
        await self._wait_for_capacity("push_wait()")
        return self.push(handle, ctx, priority=priority)

    def _check_open(self) -> None:
        self._core.check_fork()
        if self._core.state is not State.OPEN:
            raise EngineClosedError(f"{self!r} is {self._core.state.value}; create a new Engine")

    async def wait_for_var(self, var: Var, *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until every operation pushed so far that reads or mutates ``var`` finished.

        Then, if ``var`` carried a failure at that point, raise it and clear it everywhere
        (the same exception is cleared from every Var carrying it and from the engine's
        record) for the operations pushed afterwards, which run normally; an operation
        pushed before the call still sees it when it starts, and is skipped. A failure
        recorded by an operation pushed after this call is left for a later wait. Returns
        without yielding when ``var`` is idle. Cancelling the wait (or the timeout) leaves
        the engine unchanged.

        Raises:
            TimeoutError: if ``timeout`` seconds pass first.
            VarDeletedError: if ``var`` was deleted.
        """
        loop = self._core.require_loop()
        _check_timeout(timeout)
        if type(var) is not Var:
            raise TypeError(f"var must be an aioengine.Var, got {var!r}")
        if var._owner is not self:
            raise ValueError(f"{var!r} belongs to another Engine")
        if self._core.state is State.CLOSED:
            raise EngineClosedError(f"{self!r} is closed; create a new Engine")
        current = self._core.running_op()
        marker: Operation[None] | None = None
        failure: BaseException | None = None
        with self._core.lock:
            if var._deleted:
                raise VarDeletedError(f"{var!r} was deleted; nothing to wait for")
            if self._core.segments.open is not None:
                # Its members may use var: the marker goes behind them.
                self._core.segments.flush_locked(self._core)
            if current is not None and (
                var in current.const_vars
                or var in current.mutate_vars
                or (self._settings.serial and not var._is_idle())
            ):
                raise RuntimeError(
                    f"wait_for_var({var.name!r}) inside operation {current.name!r} would wait "
                    "for that operation itself (it holds the Var, or serial mode runs what is "
                    "pending on it afterwards); wait outside the operation"
                )
            if current is not None and not var._is_idle():
                # Its marker would queue behind every user of var: is one of them behind current?
                stuck = [
                    other
                    for other in queued_behind(current)
                    if other is not current
                    and (var in other.const_vars or var in other.mutate_vars)
                ]
                if stuck:
                    first = min(stuck, key=operator.attrgetter("seq"))
                    raise RuntimeError(
                        f"wait_for_var({var.name!r}) inside operation {current.name!r} would "
                        f"wait for {first.name!r}, which is queued behind that operation: "
                        "this would deadlock; wait outside the operation"
                    )
            todo: list[Operation[Any]] = []
            remote = self._core.remote
            if (
                not var._is_idle()
                or (self._core.gpu is not None and has_pending(var))
                or (isinstance(remote, RemoteBackend) and remote.pending(var))
            ):
                marker = new_operation(
                    self._core,
                    self,
                    None,
                    _WAIT,
                    _CPU0,
                    (),
                    (var,),
                    _NORMAL,
                    0,
                    f"wait_for_var({var.name})",
                )
                fut: asyncio.Future[None] = loop.create_future()
                todo = self._core.queue_marker_locked(marker, var, fut)
            else:
                # Idle: its failure is the wait's now, in this critical section; once the lock
                # is released, an operation pushed from another thread may run and fail on it.
                failure = self._core.take_failure_locked(var._failure)
        if todo:
            self._core.submit_ready(todo)
        if marker is not None:
            try:
                async with asyncio.timeout(timeout):
                    await fut
            except BaseException as exc:
                cancel_marker(self._core, marker)
                if isinstance(exc, TimeoutError):
                    raise TimeoutError(
                        f"wait_for_var({var!r}) timed out after {timeout} s; "
                        f"{self._describe_var(var)}"
                    ) from None
                raise
            with self._core.lock:
                # Its result: the failure var carried at its turn (see dispatch_locked).
                failure = self._core.take_failure_locked(marker._result)
        if failure is not None:
            raise failure

    def _describe_var(self, var: Var) -> str:
        """The part of :meth:`dump` about ``var`` and what its users wait behind."""
        return f"why it is busy:\n{_dump.describe_var(self, var)}"

    async def wait_for_all(
        self,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
        progress: bool = False,
    ) -> None:
        """Wait until no operation is pending, then raise every unthrown failure.

        Operations pushed while waiting are waited for too. Afterwards all recorded failures
        are cleared. Cancelling the wait (or the timeout) leaves the engine unchanged. With
        ``progress=True`` a progress bar of finished vs pushed operations is shown (tqdm,
        notebook-aware; a text line without tqdm).

        Raises:
            ExceptionGroup: of every failure recorded and not yet thrown (by this or by
                :meth:`wait_for_var`), in the order they happened.
            TimeoutError: if ``timeout`` seconds pass first (failures stay recorded).
        """
        self._core.require_loop()
        _check_timeout(timeout)
        if self._core.state is State.CLOSED:
            raise EngineClosedError(f"{self!r} is closed; create a new Engine")
        current = self._core.running_op()
        if current is not None:
            raise RuntimeError(
                f"wait_for_all() inside operation {current.name!r} would wait for that "
                "operation itself; use wait_for_var() on the Vars you need"
            )
        try:
            if progress:
                await _progress.drain_with_progress(self, timeout)
            else:
                await self._drained(timeout)
        except TimeoutError:
            raise TimeoutError(
                f"wait_for_all() timed out after {timeout} s with {len(self._core.live)} "
                f"operation(s) pending:\n{_dump.describe_all(self)}"
            ) from None
        errors = self._core.take_failures()
        if errors:
            raise BaseExceptionGroup("unhandled errors in aioengine.Engine", errors)

    async def _drained(self, timeout: float | None) -> None:  # noqa: ASYNC109
        loop = self._core.require_loop()
        self._core.segments.flush(self._core)
        async with asyncio.timeout(timeout):
            while True:
                with self._core.lock:
                    if not self._core.live:
                        return
                    fut = self._core.wakeups.idle_waiter_locked(loop)
                try:
                    await fut
                except BaseException:
                    with self._core.lock:
                        self._core.wakeups.drop_waiter_locked(fut)
                    raise

    def trace(self, path: str | os.PathLike[str] | None = None) -> _trace.TraceSession:
        """Trace while a ``with`` / ``async with`` block runs; write Chrome trace JSON to ``path``.

        ``async with engine.trace("run.json"):`` records every operation that starts in the
        block (one track per worker thread, lanes for coroutine and callback-style operations,
        flow arrows to the operations each waited for); open the file in ui.perfetto.dev or
        chrome://tracing. The session's ``trace`` attribute holds the JSON object afterwards,
        and ``session.timeline()`` draws it (a :class:`~aioengine.Timeline`, shown inline in a
        notebook). See ``docs/observability.md``. Safe to call from any thread.
        """
        return _trace.TraceSession(self, path)

    def start_trace(self) -> None:
        """Start recording a trace (see :meth:`trace`); safe from any thread.

        Raises:
            RuntimeError: if a trace is already running.
        """
        core = self._core
        with core.lock:  # looking and installing: one critical section
            if core.tracelog is not None:
                raise RuntimeError(f"{self!r} is already tracing; call stop_trace() first")
            core.start_trace_locked()

    def stop_trace(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """Stop the trace; return its Chrome trace-event JSON object, also written to ``path``.

        Operations still running are closed at this moment with the outcome
        ``"unfinished (trace stopped)"``. The file is written on the calling thread; on the
        event loop, ``async with engine.trace(path):`` writes it on a worker thread instead.

        Raises:
            RuntimeError: if no trace is running.
        """
        core = self._core
        with core.lock:
            log = core.stop_trace_locked()
            if log is None:
                raise RuntimeError(f"{self!r} is not tracing; call start_trace() first")
            live = list(core.live.values())
        return _trace.finish_trace(log, core.loop_thread, live, path)

    def record_history(self, n: int = 1000) -> None:
        """Record push sites, times and dependencies, and keep the newest ``n`` finished ops.

        From this call on, :meth:`graph` also shows recently finished operations, and
        :meth:`dump` shows push sites (``file:line``) and how long each operation has waited;
        :meth:`statistics` measures busy time. Costs a short frame walk per push. Calling it
        again resizes the history. ``Engine(watchdog=...)`` turns it on with ``n=1000``.
        """
        if type(n) is not int or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        core = self._core
        # Looking and installing are one critical section: two threads calling this at once
        # install one recorder, not two that would each record every operation.
        with core.lock:
            current = Recorder.of(self)
            if current is not None:
                current.resize(n)
            else:
                _instrument.install_locked(core, Recorder(n))

    def graph(self) -> _graph.Graph:
        """The dependency graph of pending (and, with :meth:`record_history`, recent) ops.

        Edges run from an operation to the ones that waited for it, labelled with the Var.
        Render it with ``to_dot()`` / ``to_mermaid()``; notebooks display it inline.
        """
        self._core.segments.flush(self._core)
        return _graph.build_graph(self)

    def dump(self) -> _dump.Dump:
        """A snapshot of every busy Var's queue and every pending operation; ``print()`` it.

        Shows which operations hold each Var and which wait for it, the await stacks of
        suspended coroutine operations, and flags callback-style operations that have not
        called ``on_complete()``. Safe from any thread. If the engine's lock stays busy for
        2 s (a ``signal.signal()`` handler that interrupted the engine inside it), the dump
        is empty and its ``note`` says why.
        """
        core = self._core
        segments = core.segments
        # An open segment's members queue on their Vars first, to be shown; the wait for the
        # lock is bounded as build_dump's own is (a signal handler may have interrupted it).
        if segments.open is not None and core.lock.acquire(timeout=_dump._LOCK_WAIT):
            try:
                if segments.open is not None:
                    segments.flush_locked(core)
            finally:
                core.lock.release()
        return _dump.build_dump(self)

    def statistics(self) -> EngineStatistics:
        """Counts of operations by state, in total and per pool (a frozen dataclass)."""
        return build_statistics(self)

    async def _get_value(self, var: Var) -> Any:
        """:meth:`Var.get`: the ergonomic layer's read of ``var``'s value; on a closed engine,
        the value as it was left (nothing can change it any more)."""
        if self._core.state is State.CLOSED and type(var) is Var and var._owner is self:
            box = var._failure
            if box is not None and box.unthrown:
                raise DependencyError(f"{var!r} carries a failure") from box.exc
            value = var._value
            return _ergonomic.checked(var, NO_VALUE if value is NO_VALUE else (value,))
        return await _ergonomic.get(self, var)

    @overload
    def submit(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        /,
        *args: Any,
        reads: Iterable[Var] = ...,
        writes: Iterable[Var] = ...,
        out: Var | Sequence[Var] | None = ...,
        accumulate: Var | None = ...,
        merge: Callable[[Any, Any], Any] = ...,
        ordered: bool = ...,
        ctx: Context = ...,
        prop: FnProperty = ...,
        priority: int = ...,
        name: str | None = ...,
        **kwargs: Any,
    ) -> Operation[T]: ...

    @overload
    def submit(
        self,
        fn: Callable[..., T],
        /,
        *args: Any,
        reads: Iterable[Var] = ...,
        writes: Iterable[Var] = ...,
        out: Var | Sequence[Var] | None = ...,
        accumulate: Var | None = ...,
        merge: Callable[[Any, Any], Any] = ...,
        ordered: bool = ...,
        ctx: Context = ...,
        prop: FnProperty = ...,
        priority: int = ...,
        name: str | None = ...,
        **kwargs: Any,
    ) -> Operation[T]: ...

    def submit(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        reads: Iterable[Var] = (),
        writes: Iterable[Var] = (),
        out: Var | Sequence[Var] | None = None,
        accumulate: Var | None = None,
        merge: Callable[[Any, Any], Any] = add,
        ordered: bool = False,
        ctx: Context = _CPU0,
        prop: FnProperty = _NORMAL,
        priority: int = 0,
        name: str | None = None,
        **kwargs: Any,
    ) -> Operation[Any]:
        """Push ``fn(*args, **kwargs)``: an ordinary function, with the values of its Vars.

        Every Var among ``args`` and ``kwargs`` is read (written if it is also in ``writes``)
        and replaced by the value it carries when ``fn`` runs; ``reads`` / ``writes`` add
        Vars that are not arguments. ``fn``'s return value becomes the value of ``out`` (a
        Var, or a sequence of Vars that the result is unpacked into), which is written. A
        coroutine function runs on the loop (:meth:`push_async`), anything else on ``ctx``'s
        pool (:meth:`push_sync`). Returns the :class:`Operation`; see ``ergonomic.py``.

        The keywords above are submit's own and never reach ``fn``: ``submit(f, x, name="a")``
        names the operation and calls ``f(x)``. Bind such an argument with
        :func:`functools.partial`, or call through :meth:`op`, which passes every keyword on.
        Only a Var that is an argument itself is read: a Var inside a list, tuple, set or dict
        argument would be no dependency, and raises ``TypeError``.

        A reduction: with ``accumulate=var``, ``fn`` runs without holding ``var`` (so many
        run at once) and its return value is merged into ``var``'s value with
        ``merge(current, result)`` (the result itself while ``var`` carries no value), as a
        commute access of ``var``: merges run one at a time, in the order the results come.
        ``ordered=True`` merges in push order (deterministic floating point). ``merge`` runs
        inline on the loop: keep it cheap. Returns the merge's :class:`Operation`, whose
        result is ``fn``'s return value; a failure of ``fn`` skips its merge and is recorded
        on ``var`` (an :class:`~aioengine.Abort` aborts the merge too: ``var`` keeps its
        value). ``out=`` cannot be combined with it.

        ``fn`` may raise :class:`~aioengine.Abort` to refuse the work: the operation fails
        with it for its awaiter, and ``out``'s Vars keep their values, with no failure
        recorded on any of its Vars.

        Raises:
            EngineError: ``VarDeletedError``, ``EngineClosedError`` or
                ``DeviceUnavailableError``, as :meth:`push_sync` (and ``TypeError`` /
                ``ValueError`` for bad arguments).
        """
        return _ergonomic.submit(
            self, fn, args, kwargs, reads, writes, out, ctx, prop, priority, name,
            accumulate, merge, ordered,
        )  # fmt: skip

    @overload
    def op(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        /,
        *,
        const_vars: Iterable[Var] = ...,
        mutate_vars: Iterable[Var] = ...,
        out: Var | Sequence[Var] | None = ...,
        accumulate: Var | None = ...,
        merge: Callable[[Any, Any], Any] = ...,
        ordered: bool = ...,
        ctx: Context = ...,
        prop: FnProperty = ...,
        priority: int = ...,
        name: str | None = ...,
    ) -> Callable[..., Operation[T]]: ...

    @overload
    def op(
        self,
        fn: Callable[..., T],
        /,
        *,
        const_vars: Iterable[Var] = ...,
        mutate_vars: Iterable[Var] = ...,
        out: Var | Sequence[Var] | None = ...,
        accumulate: Var | None = ...,
        merge: Callable[[Any, Any], Any] = ...,
        ordered: bool = ...,
        ctx: Context = ...,
        prop: FnProperty = ...,
        priority: int = ...,
        name: str | None = ...,
    ) -> Callable[..., Operation[T]]: ...

    @overload
    def op(
        self,
        fn: None = ...,
        /,
        *,
        const_vars: Iterable[Var] = ...,
        mutate_vars: Iterable[Var] = ...,
        out: Var | Sequence[Var] | None = ...,
        accumulate: Var | None = ...,
        merge: Callable[[Any, Any], Any] = ...,
        ordered: bool = ...,
        ctx: Context = ...,
        prop: FnProperty = ...,
        priority: int = ...,
        name: str | None = ...,
    ) -> OpDecorator[Operation[Any]]: ...

    def op(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        const_vars: Iterable[Var] = (),
        mutate_vars: Iterable[Var] = (),
        out: Var | Sequence[Var] | None = None,
        accumulate: Var | None = None,
        merge: Callable[[Any, Any], Any] = add,
        ordered: bool = False,
        ctx: Context = _CPU0,
        prop: FnProperty = _NORMAL,
        priority: int = 0,
        name: str | None = None,
    ) -> Any:
        """Decorator: calling the decorated function pushes it with :meth:`submit`.

        ``@engine.op`` or ``@engine.op(const_vars=..., mutate_vars=..., out=...)``; a call
        ``f(*args, **kwargs)`` returns an :class:`Operation` and reads ``const_vars``, writes
        ``mutate_vars`` and ``out``, and passes Var arguments by value, as :meth:`submit`.
        Every argument of a call goes to the function, keywords such as ``name=`` included:
        the options are the decorator's. ``accumulate``, ``merge`` and ``ordered`` make each
        call a reduction into a Var, as :meth:`submit`'s.
        """
        return _ergonomic.op(
            self, fn, const_vars, mutate_vars, out, ctx, prop, priority, name,
            accumulate, merge, ordered,
        )  # fmt: skip


def _close_if_loop_closed(engine: Engine) -> None:
    """Close an engine left closing on a loop that has closed since.

    An :meth:`aclose` that timed out (or was cancelled) leaves the engine closing, to be
    called again; once its loop is closed nothing can drain it any more, so it is closed
    now: its pools shut down without waiting (running functions finish, nothing new
    starts) and the operations left unfinished, which never will be (their loop is
    gone), are logged. The TimeoutError of that aclose() reported them first.
    """
    core = engine._core
    loop = core.loop
    if loop is None or not loop.is_closed():
        return
    with core.lock:
        if core.state is not State.CLOSING:
            return
        core.set_state_locked(State.CLOSED)
        unfinished = len(core.live)
        names = [op.name for op in list(core.live.values())[:10]]
    unguard_interrupts(core)
    if core.gpu is not None:
        core.gpu.shutdown()
    core.abandon_executors()
    if unfinished:
        logger.warning(
            "%r was closing when its event loop closed: closed with %d operation(s) "
            "unfinished, first: %s",
            engine,
            unfinished,
            ", ".join(map(repr, names)),
        )


def _collected_unclosed(engine: Engine, core: Scheduler) -> None:
    """``Engine.__del__`` of an engine not closed: warn (its failures lost, or its pools left
    running), then shut its pools down without waiting; no lock taken (see ``__del__``)."""
    lost = core.ledger.unthrown()
    if lost:
        # What aclose() would have raised is lost with the engine: said once, as asyncio
        # says "Task exception was never retrieved" (RuntimeWarning: shown by default).
        warnings.warn(
            f"{engine!r} was garbage collected without being closed, losing {len(lost)} "
            f"failure(s) that no wait_for_var(), wait_for_all() or aclose() raised; the "
            f"first: {summary(lost[0])}. Use 'async with Engine()' or "
            "'await engine.aclose()', which raise them",
            RuntimeWarning,
            source=engine,
            stacklevel=1 if _COMPILED else 3,  # as below
        )
        if core.routes.executors:
            core.abandon_executors()
        return
    if core.routes.executors:
        if core.state is State.CLOSING:  # aclose() was called, and interrupted
            core.abandon_executors()
            return
        warnings.warn(
            f"{engine!r} was garbage collected without being closed; use "
            "'async with Engine()' or 'await engine.aclose()'",
            ResourceWarning,
            source=engine,
            # The line that dropped the engine: __del__'s caller, or the innermost Python
            # frame when compiled (compiled, __del__ and this function have no frames).
            stacklevel=1 if _COMPILED else 3,
        )
        core.abandon_executors()


def _check_room_inside_locked(
    core: Scheduler, current: Operation[Any], limit: int, what: str
) -> None:
    """Refuse a wait for room below ``max_pending`` (``limit``) inside running operation
    ``current`` that only ``current`` could make (lock held).

    The operations that cannot finish before ``current`` does are ``current`` itself and
    those queued behind it on some Var (directly or through others: ``queued_behind``), in
    serial mode every pending one. Once the others have finished these are still pending:
    if they fill the bound, the wait could only end after ``current`` ends, which waits.
    """
    if core.segments.open is not None:
        core.segments.flush_locked(core)  # its members queue on their Vars, to be counted
    if core.settings.serial:
        stuck = len(core.live)
    else:
        stuck = 0
        for op in queued_behind(current):
            if op.kind == _BULK:  # a segment: its members wait behind current
                stuck += sum(1 for member in op._result or () if member._state < OpState.DONE)
            elif op.kind < _WAIT:
                stuck += 1
    if stuck >= limit:
        raise RuntimeError(
            f"{what} inside operation {current.name!r} would wait for room that only that "
            f"operation can make: max_pending={limit}, and {stuck} pending operation(s) (it "
            "and those queued behind it) cannot finish before it does; this would deadlock. "
            "Push without waiting there (push_sync, push_async, push) or wait outside the "
            "operation"
        )
