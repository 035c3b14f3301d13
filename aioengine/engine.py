"""The engine: push operations on Vars, run them when their turn comes, wait for them.

The rule the engine keeps: two operations of which at least one mutates a common Var run in
the order they were pushed. Everything here exists to keep that rule cheaply.

Design (callbacks and counters, not a task per operation):

1. ``push_*`` validates its arguments, then, under ``_lock``, appends one request per Var to the
   Vars' queues (``var.py``). A push is atomic across all of its Vars, so two threads pushing
   on the same Vars in opposite orders cannot build a cycle (MXNet 1.9.1 deadlocks there).
2. When an operation's last request is granted it is READY and goes to its executor: the
   thread pool of its context (``executors/``), or the event loop for coroutine functions,
   ``FnProperty.ASYNC`` functions and serial mode.
3. The executor calls :meth:`Engine._execute` (via ``Operation``), which starts the operation
   (or skips it when an input carries a failure), runs the function, and calls ``_finish``:
   under ``_lock`` it records the outcome, releases the Vars and dispatches whatever became
   ready, on the thread that finished (MXNet continues on the completing thread too).
4. Nothing touches the event loop unless someone waits: loop futures exist only for awaiters
   of an operation, of ``wait_for_var`` and of ``wait_for_all``. Worker threads hand such
   wake-ups to the loop in batches through ``_inbox`` and one ``call_soon_threadsafe``.

Lock discipline: ``_lock`` guards every mutable field of the engine, its Vars and its
operations. It is held only for bookkeeping, never while user code runs and never across an
``await``; the loop thread takes it for microseconds, so the loop is never blocked on a worker.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import functools
import inspect
import logging
import operator
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Coroutine, Iterable, Sequence
from heapq import heappop, heappush
from types import FunctionType, MethodType, TracebackType
from typing import Any, Protocol, TypeVar, overload

from . import bulk as _bulk
from . import dump as _dump
from . import ergonomic as _ergonomic
from . import graph as _graph
from . import progress as _progress
from . import trace as _trace
from .bulk import size_for as _bulk_size_for
from .collector import watch as _watch_collections
from .context import Context, DeviceType, RunContext, cpu
from .errors import (
    DependencyError,
    DeviceFailedError,
    DeviceUnavailableError,
    EngineClosedError,
    OperatorDeletedError,
    VarDeletedError,
    summary,
)
from .executors import Executor
from .executors.device import DeviceBackend
from .executors.gpu import GpuDevices, GpuExecutor
from .executors.threads import ThreadExecutor
from .fence import Fence, gpu_waits, has_pending, host_waits, note_launch
from .history import Recorder
from .instrument import Instrument
from .lock import EngineLock
from .log import OpLogger
from .operation import (
    _BULK,
    _CALLBACK,
    _CORO,
    _COROUTINE_TYPES,
    _SYNC,
    _WAIT,
    FnProperty,
    OnComplete,
    Operation,
    OprHandle,
    OpState,
    new_operation,
)
from .poller import poller_for
from .settings import Settings
from .stats import EngineStatistics, build_statistics, new_counters
from .task import current_op, run_coroutine
from .var import (
    NO_VALUE,
    Var,
    _Failure,
    append_all,
    drop_consumed,
    queued_behind,
    release_all,
)
from .watchdog import start_watchdog

__all__ = ("Engine",)

T = TypeVar("T")

logger = logging.getLogger("aioengine")

_get_running_loop = asyncio._get_running_loop
_partial = functools.partial
_get_ident = threading.get_ident
# Unbound, so that the compiled core calls it without a method lookup per operation.
_context_run = contextvars.Context.run

_PENDING = OpState.PENDING
_READY = OpState.READY
_RUNNING = OpState.RUNNING
_DONE = OpState.DONE
_FAILED = OpState.FAILED
_SKIPPED = OpState.SKIPPED
_CANCELLED = OpState.CANCELLED

_CO_COROUTINE = inspect.CO_COROUTINE
_NO_SKIP = frozenset({FnProperty.NO_SKIP, FnProperty.DELETE_VAR})
_NORMAL = FnProperty.NORMAL
_CPU0 = cpu(0)
_GPU = DeviceType.GPU
_CPU = DeviceType.CPU
_LOOP_BUDGET = 256  # inline operations run per loop callback before the loop's other work
_run_order = operator.attrgetter("_key")  # run queues: higher priority first, then push order
_push_order = operator.attrgetter("_seq")
_DEVICE_FAILED = -1  # the status of a fence settled because its device failed elsewhere


# Every engine, so that a forked child can mark them unusable (see _after_fork_in_child).
_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a child after os.fork(): engines of the parent raise on use instead of hanging.

    Their worker threads do not exist in the child and their lock may have been copied held,
    so the lock is replaced and every later call raises a clear RuntimeError.
    """
    for engine in list(_engines):
        engine._forked = True
        engine._use_lock(EngineLock())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _State(enum.Enum):
    """Lifecycle of an :class:`Engine`."""

    OPEN = "open"
    CLOSING = "closing"  # aclose() started: pushes raise, pending operations drain
    CLOSED = "closed"  # drained and executors shut down


_OPEN = _State.OPEN


def _fn_name(fn: Callable[..., Any]) -> str:
    """The default operation name: the function's ``__qualname__`` (partials unwrapped)."""
    while type(fn) is functools.partial:
        fn = fn.func
    if type(fn) is FunctionType or type(fn) is MethodType:
        return fn.__qualname__
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def _is_coroutine_function(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` returns a coroutine, decided without calling it.

    Plain functions, methods and partials of them (the hot path) are decided from the code
    flags; anything else goes through :func:`inspect.iscoroutinefunction`, including an object
    whose ``__call__`` is ``async def``.
    """
    inner = fn
    while type(inner) is functools.partial:
        inner = inner.func
    if type(inner) is MethodType:
        inner = inner.__func__
    if type(inner) is FunctionType:
        return bool(inner.__code__.co_flags & _CO_COROUTINE)
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 (an async __call__ method)
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


def _async_kind(fn: Callable[..., Any]) -> int:
    """Classify a function given to ``push_async`` (or ``new_operator(is_async=True)``).

    ``async def fn(rctx)`` runs as a task on the loop, and so does a plain function with one
    required positional parameter that returns an awaitable (``lambda rctx: fetch(url)``;
    parameters with defaults, as used to bind loop variables, do not count). A function with
    two required positional parameters is callback-style: ``fn(rctx, on_complete)``.
    """
    # The usual cases, a coroutine function or a partial of one, are decided without a call.
    if type(fn) is _partial and type(fn.func) is FunctionType:
        if fn.func.__code__.co_flags & _CO_COROUTINE:
            return _CORO
    elif type(fn) is FunctionType and fn.__code__.co_flags & _CO_COROUTINE:
        return _CORO
    if _is_coroutine_function(fn):
        return _CORO
    if type(fn) is FunctionType:
        code = fn.__code__
        positional = code.co_argcount
        required = positional - len(fn.__defaults__ or ())
        varargs = bool(code.co_flags & inspect.CO_VARARGS)
    else:
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            return _CALLBACK  # no signature to read: MXNet's AsyncFn convention
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        positional = sum(1 for p in params if p.kind in kinds)
        required = sum(1 for p in params if p.kind in kinds and p.default is p.empty)
        varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    if required >= 2 or (required == 0 and varargs):
        return _CALLBACK
    if required == 1 or positional:
        return _CORO
    raise TypeError(
        f"{_fn_name(fn)} takes no positional argument; push_async needs async def fn(rctx), "
        "a function of (rctx) returning an awaitable, or a callback-style fn(rctx, on_complete)"
    )


def _check_timeout(timeout: object) -> None:
    """``timeout`` must be None or a number of seconds (NaN is refused: it never expires)."""
    if timeout is None:
        return
    if type(timeout) not in (int, float):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if timeout != timeout:
        raise ValueError("timeout must be a number of seconds or None, got nan")


def _cancel_message(exc: BaseException) -> object:
    """The message of a CancelledError (None if it has none), kept as a cancelled
    operation's ``_result`` (Operation._cancelled_error raises it again)."""
    return exc.args[0] if exc.args else None


def _join_executors(executors: list[Executor]) -> None:
    """Join the workers of executors already shut down (on a helper thread, see aclose)."""
    for executor in executors:
        executor.shutdown(True)


def _noop(rctx: RunContext) -> None:
    """The function of a ``delete_var`` without ``delete_fn``."""


# Whether this module runs compiled (setup.py): Cython's functions are not Python functions.
# The one test of the build; the test suite and the benchmarks ask it too.
_COMPILED = type(_noop) is not FunctionType

# The compiled core's C functions that take an operation out of the cycle collector's passes
# and put it back (collector.pxd, cimported by engine.pxd). Declared, not bound: the pure
# Python engine hides nothing, and calls them only ``if _COMPILED``.
_hide: Callable[[Operation[Any]], None]
_show: Callable[[Operation[Any]], None]


class _OpDecorator(Protocol):
    """What ``Engine.op(...)`` returns when called with options only: a decorator."""

    @overload
    def __call__(
        self, fn: Callable[..., Coroutine[Any, Any, T]], /
    ) -> Callable[..., Operation[T]]: ...

    @overload
    def __call__(self, fn: Callable[..., T], /) -> Callable[..., Operation[T]]: ...


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
        self._pid = os.getpid()
        self._forked = False  # set in a child process after os.fork(): every use raises
        # The hot paths (push, start, finish) take and give back the lock in a try statement
        # ("with lock:" costs twice as much: __exit__ takes three arguments), with calls
        # that _use_lock keeps bound; an EngineLock's are one C call each (lock.py).
        self._use_lock(EngineLock())
        self._state = _State.OPEN
        self._loop: asyncio.AbstractEventLoop | None = None  # bound once, on first use
        self._loop_thread = 0  # ident of the thread running _loop
        # _loop's is_running, bound with it: every push on the loop's thread asks it.
        self._loop_is_running: Callable[[], bool] | None = None
        self._seq = 0  # push counter: the sequence number of the latest operation (or marker)
        self._var_count = 0
        # Some Var was deleted: pushes must check their Vars. Set in the critical section that
        # marks the Var deleted, so a push (which checks it under the lock) cannot miss it.
        self._deleted_vars = False
        # Operations pushed and not finished, by sequence number (so in push order).
        self._live: dict[int, Operation[Any]] = {}
        # Failures recorded and not thrown yet, in the order they happened.
        self._failures: dict[_Failure, None] = {}
        self._idle_waiters: list[asyncio.Future[None]] = []  # wait_for_all callers
        self._capacity_waiters: list[asyncio.Future[None]] = []  # push_*_wait callers
        self._executors: dict[str, Executor] = {}  # by pool name, created on first use
        self._routes: dict[tuple[Context, FnProperty], Executor | None] = {}
        # The last CPU route taken, checked by identity first: a push loop repeats one context
        # and property, and hashing a Context or an enum runs Python code. Replaced whole (one
        # tuple), so a reader on another thread sees a consistent entry.
        self._last_route: tuple[object, object, Executor | None] = (None, None, None)
        self._rctx_cache: dict[Context, RunContext] = {}  # stream-less RunContexts
        self._loop_rctx: RunContext | None = None  # the RunContext of the op running inline
        self._loop_ctx: Context | None = None  # the ctx of _loop_rctx (loop thread only)
        # Loop-thread hand-off. Invariant: _inbox_scheduled is True iff a _drain_inbox call is
        # scheduled and has not yet swapped _inbox out; the same for the loop queue.
        self._inbox: list[Operation[Any]] = []  # finished ops whose awaiters need waking
        self._idle_due = False  # _idle_waiters need waking (set off the loop thread)
        self._capacity_due = False  # _capacity_waiters need waking (set off the loop thread)
        self._inbox_scheduled = False
        # READY ops for the loop thread, guarded by _lock (any thread enqueues, the loop
        # thread claims), by _key (smaller first), in two parts. A priority-0 op (its key is
        # its _seq) goes to the slot of its _seq in the FIFO _loop_fifo, whose slot i holds
        # the op with _seq == _loop_base + i, or None (an op not READY, a claimed one, or a
        # number no loop op has). Its live part starts at _loop_head: claimed and skipped
        # slots before it are dropped in bulk. Ops made ready in any order by completions on
        # the loop thread have larger numbers than the one that ran, so they usually land at
        # or after the head: a list's index and append, C operations compiled. Any other op
        # (a priority, a number behind the head, or one so far ahead that the padding would
        # more than double the list) goes to the min-heap _loop_heap of keys, with the op in
        # _loop_heap_ops. The best is the smaller of the heap's head and the FIFO's first op.
        # Invariants: a slot is filled once; the last slot is an op whenever _loop_head is
        # below the list's length (padding only precedes a new op); _loop_heap_ops holds
        # exactly the heap's keys. The loop queue is empty iff the FIFO and the heap are.
        self._loop_fifo: list[Operation[Any] | None] = []
        self._loop_head = 0
        self._loop_base = 0
        self._loop_heap: list[int] = []
        self._loop_heap_ops: dict[int, Operation[Any]] = {}
        self._loop_queue_scheduled = False
        self._wakes: list[Executor] = []  # loop-thread only: executors to wake this iteration
        # Observers; empty on the fast path (DEBUG logging at creation installs an OpLogger).
        # Replaced, never mutated, under the lock (_add/_remove_instrument_locked): a hook
        # called without the lock iterates the tuple it read, unchanged.
        self._instruments: tuple[Instrument, ...] = (
            (OpLogger(),) if logger.isEnabledFor(logging.DEBUG) else ()
        )
        self._finished = new_counters()  # finished ops by executor and OpState (statistics())
        _engines.add(self)
        if _COMPILED:
            _watch_collections(self)
        if self._settings.watchdog is not None:
            start_watchdog(self, self._settings.watchdog)
        # GPU state, created by the first push to a gpu(i) context; while it is None no fence
        # exists and host consumers skip the fence checks (the CPU-only fast path).
        self._gpu: GpuDevices | None = None
        self._fence_seq = 0  # fences recorded so far (Fence.seq)
        self._gpu_pending: dict[Fence, None] = {}  # fences recorded and not settled
        # id()s of GPU streams stuck behind a wait on a failed fence: a fence recorded on one
        # of them never completes (_fail_devices_locked). Under the lock. A stream lives as
        # long as its worker thread, so its id is not reused while the engine runs.
        self._stuck_streams: set[int] = set()
        self._device_boxes: dict[int, _Failure] = {}  # per failed GPU: the shared failure
        # Serial mode: every operation also writes this hidden Var, so they run one at a time.
        self._sequencer: Var | None = Var(self, "<serial>") if self._settings.serial else None
        # Bulk execution (bulk.py). Active scopes: a push asks its context for one only while
        # this is nonzero. Written on the loop thread only; other threads' pushes read it
        # unlocked, harmlessly: a push off the loop thread never joins a segment.
        self._bulk_scopes = 0
        # The open segment, collecting members (its _result holds them until it runs).
        # Guarded by _lock: opened on the loop thread, closed from any thread (a push that
        # does not join it, a wait, dump()); an unlocked read is only a hint, re-checked under
        # the lock. Invariant: while it is open no other push takes a sequence number;
        # _flush_segment_locked queues it on its Vars first, so every Var's queue stays in
        # push order.
        self._segment: Operation[Any] | None = None
        # Under _lock: True while a _flush_segment_soon call is scheduled and has not run.
        self._segment_flush_scheduled = False

    # -- properties --------------------------------------------------------------------

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
        """Whether :meth:`aclose` has finished."""
        return self._state is _State.CLOSED

    @property
    def pending(self) -> int:
        """The number of operations pushed and not finished yet."""
        return len(self._live)

    def __repr__(self) -> str:
        mode = "serial" if self._settings.serial else f"cpu_workers={self._settings.cpu_workers}"
        return f"<aioengine.Engine {self._state.value} pending={len(self._live)} {mode}>"

    # -- instruments -------------------------------------------------------------------

    def _notify_locked(self, hook: str, op: Operation[Any]) -> None:
        """Call the ``hook`` method (``"on_push"`` or ``"on_finish"``) of every instrument (lock
        held). One that raises is uninstalled and reported: a broken observer must not
        strand the operations it observes (the bookkeeping around the hook goes on)."""
        for inst in self._instruments:
            try:
                getattr(inst, hook)(op)
            except Exception as exc:
                self._instrument_failed_locked(inst, hook, exc)

    def _notify_start(self, op: Operation[Any]) -> None:
        """:meth:`_notify_locked` for ``Instrument.on_start`` (called without the lock)."""
        for inst in self._instruments:
            try:
                inst.on_start(op)
            except Exception as exc:
                self._instrument_failed(inst, "on_start", exc)

    def _instrument_failed(self, inst: Instrument, hook: str, exc: Exception) -> None:
        """:meth:`_instrument_failed_locked` from a hook called without the lock."""
        with self._lock:
            self._instrument_failed_locked(inst, hook, exc)

    def _instrument_failed_locked(self, inst: Instrument, hook: str, exc: Exception) -> None:
        """Uninstall ``inst``, whose ``hook`` raised ``exc``, and report it (lock held)."""
        self._remove_instrument_locked(inst)
        message = f"aioengine: {type(inst).__name__}.{hook} raised; the instrument was removed"
        loop = self._loop
        if loop is not None and not loop.is_closed():  # the handler runs later, not locked
            loop.call_soon_threadsafe(
                loop.call_exception_handler, {"message": message, "exception": exc}
            )
        else:
            logger.error(message, exc_info=exc)

    def add_instrument(self, instrument: Instrument) -> None:
        """Install an :class:`~aioengine.instrument.Instrument`; safe from any thread."""
        if not isinstance(instrument, Instrument):
            raise TypeError(f"instrument must be an aioengine Instrument, got {instrument!r}")
        with self._lock:
            self._add_instrument_locked(instrument)

    def _add_instrument_locked(self, instrument: Instrument) -> None:
        """Install ``instrument`` (lock held)."""
        self._instruments = (*self._instruments, instrument)

    def _remove_instrument_locked(self, instrument: Instrument) -> None:
        """Uninstall ``instrument`` if installed (lock held)."""
        self._instruments = tuple(i for i in self._instruments if i is not instrument)

    def remove_instrument(self, instrument: Instrument) -> None:
        """Uninstall ``instrument`` (ValueError if it is not installed)."""
        with self._lock:
            if instrument not in self._instruments:
                raise ValueError(f"{instrument!r} is not installed on {self!r}")
            self._remove_instrument_locked(instrument)

    # -- loop binding ------------------------------------------------------------------

    def _use_lock(self, lock: EngineLock | threading.Lock) -> None:
        """Make ``lock`` the engine lock, keeping the calls that take and give it back bound,
        so that the hot paths call them without a method lookup (called before the engine
        is shared, or in a forked child, or by a test that swaps in a stand-in lock)."""
        self._lock = lock
        self._lock_acquire: Callable[[], object]
        self._lock_release: Callable[[], object]
        if type(lock) is EngineLock:
            self._lock_acquire = lock.take
            self._lock_release = lock.give
        else:
            self._lock_acquire = lock.acquire
            self._lock_release = lock.release

    def _bind(self) -> asyncio.AbstractEventLoop | None:
        """Bind to the running loop on first use; return the bound loop (None if unbound).

        Called from any thread. A thread with no running loop may push sync operations to
        an unbound engine; a thread running a different loop may not use the engine at all.
        """
        if self._forked:
            self._check_fork()
        loop = _get_running_loop()
        bound = self._loop
        if loop is bound:
            return bound
        if loop is None:
            if bound is not None and bound.is_closed():
                raise RuntimeError(
                    f"{self!r} is bound to an event loop that is closed; create a new Engine"
                )
            return bound
        with self._lock:
            if self._loop is None:
                self._loop = loop
                self._loop_thread = _get_ident()
                self._loop_is_running = loop.is_running
                first = True
            else:
                first = False
        if first:
            return loop
        raise RuntimeError(
            f"{self!r} is bound to another event loop; an Engine serves the loop it was "
            "first used on: create one Engine per loop"
        )

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._bind()
        if loop is None:
            raise RuntimeError(
                f"{self!r} is not bound to an event loop yet; use it from a coroutine first"
            )
        return loop

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Engine:
        self._require_loop()
        if self._state is not _State.OPEN:
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
        pools running); call again. The worker threads are joined off the event loop.

        Raises:
            ExceptionGroup: of every failure recorded and not thrown yet, as
                :meth:`wait_for_all`.
            RuntimeError: inside one of this engine's operations (it would wait for itself).
            TimeoutError: if operations are still running after ``timeout`` seconds (e.g. a
                callback-style operation whose ``on_complete`` is never called); the message
                names them.
        """
        self._require_loop()
        _check_timeout(timeout)
        current = self._running_op()
        if current is not None:
            raise RuntimeError(
                f"aclose() inside operation {current.name!r} would wait for that operation "
                "itself; close the engine outside its operations"
            )
        with self._lock:
            if self._state is _State.CLOSED:
                return
            self._state = _State.CLOSING
        if cancel:
            self._cancel_not_started()
        try:
            await self._drained(timeout)
        except TimeoutError:
            with self._lock:
                names = [op.name for op in list(self._live.values())[:10]]
            raise TimeoutError(
                f"aclose() timed out after {timeout} s with {len(self._live)} operation(s) "
                f"still pending, first: {', '.join(map(repr, names))}"
            ) from None
        errors = self._take_failures()
        if self._gpu is not None:
            self._gpu.shutdown()
        executors = self._shutdown_executors(wait=False)
        if executors:
            # Joined off the loop: a callback-style operation is done once on_complete() is
            # called, and the rest of its function may still need the loop.
            try:
                joined = asyncio.get_running_loop().run_in_executor(
                    None, _join_executors, executors
                )
            except RuntimeError:  # interpreter exit: the default executor takes no new work
                _join_executors(executors)
            else:
                await joined
        self._state = _State.CLOSED
        if errors:
            raise BaseExceptionGroup("unhandled errors in aioengine.Engine", errors)

    def _shutdown_executors(self, *, wait: bool) -> list[Executor]:
        """Shut every executor down (with ``wait``, join their workers); return them."""
        with self._lock:
            executors = list(self._executors.values())
            self._executors.clear()
            self._routes.clear()
            self._last_route = (None, None, None)
        for executor in executors:
            executor.shutdown(wait)
        return executors

    def __del__(self) -> None:
        # __init__ may have failed before _executors existed: then there is nothing to release.
        if getattr(self, "_executors", None) and self._state is not _State.CLOSED:
            warnings.warn(
                f"{self!r} was garbage collected without being closed; use "
                "'async with Engine()' or 'await engine.aclose()'",
                ResourceWarning,
                source=self,
                # The line that dropped the engine: __del__'s caller, or the innermost Python
                # frame when compiled (a compiled __del__ has no frame of its own).
                stacklevel=1 if _COMPILED else 2,
            )
            self._shutdown_executors(wait=False)

    def _cancel_not_started(self) -> None:
        ready: list[Any] = []
        with self._lock:
            if self._segment is not None:
                self._flush_segment_locked()
            for op in list(self._live.values()):
                if op._state is _PENDING or op._state is _READY:
                    self._finish_locked(op, _CANCELLED, None, None, ready)
            todo = self._settle(ready)
        self._submit(todo)

    # -- creating Vars and operators ---------------------------------------------------

    def new_var(self, name: str | None = None, *, value: object = NO_VALUE) -> Var:
        """Create a Var of this engine; safe from any thread.

        Args:
            name: shown in reprs and error messages (default ``"var<N>"``).
            value: data for the Var to carry (see :meth:`submit` and :meth:`Var.get`);
                default: none.
        """
        if value is not NO_VALUE:
            var = self.new_var(name)
            var._value = value
            return var
        self._check_fork()
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r}")
        with self._lock:
            self._var_count += 1
            count = self._var_count
        return Var(self, name if name is not None else f"var{count}")

    @overload
    def new_operator(
        self,
        fn: Callable[[RunContext], Coroutine[Any, Any, T]],
        const_vars: Iterable[Var] = ...,
        mutate_vars: Iterable[Var] = ...,
        *,
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
        coro = _is_coroutine_function(fn)
        if is_async is None:
            kind = _CORO if coro else _SYNC
        elif is_async is True:
            kind = _async_kind(fn)
        elif is_async is False:
            if coro:
                raise TypeError(
                    f"{_fn_name(fn)} is a coroutine function but is_async=False; pass "
                    "is_async=None or True"
                )
            kind = _SYNC
        else:
            raise TypeError(f"is_async must be True, False or None, got {is_async!r}")
        self._check_prop(prop)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r}")
        mutate = self._writes(mutate_vars)
        const = self._reads(const_vars, mutate)
        for v in (*const, *mutate):
            if v._deleted:
                raise VarDeletedError(f"{v!r} was deleted; create a new Var")
        return OprHandle(self, fn, kind, const, mutate, prop, name or _fn_name(fn))

    def delete_operator(self, handle: OprHandle[Any]) -> None:
        """Retire ``handle``: pushes already made still run; later pushes raise.

        Raises:
            OperatorDeletedError: if it was already deleted.
        """
        self._check_fork()
        if not isinstance(handle, OprHandle):
            raise TypeError(f"handle must be an aioengine.OprHandle, got {handle!r}")
        if handle._engine is not self:
            raise ValueError(f"{handle!r} belongs to another Engine")
        with self._lock:
            if handle._deleted:
                raise OperatorDeletedError(f"{handle!r} was already deleted")
            handle._deleted = True

    # -- pushing -----------------------------------------------------------------------

    def push_sync(
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
            if func.__code__.co_flags & _CO_COROUTINE:
                raise TypeError(
                    f"{_fn_name(fn)} is a coroutine function; push it with push_async()"
                )
            if name is None:
                name = func.__qualname__
        elif not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        elif _is_coroutine_function(fn):
            raise TypeError(f"{_fn_name(fn)} is a coroutine function; push it with push_async()")
        mutate = self._writes(mutate_vars)
        const = self._reads(const_vars, mutate)
        return self._push(fn, _SYNC, ctx, const, mutate, prop, priority, name, None)

    @overload
    def push_async(
        self,
        fn: Callable[[RunContext], Coroutine[Any, Any, T]],
        ctx: Context = ...,
        const_vars: Iterable[Var] = ...,
        mutate_vars: Iterable[Var] = ...,
        *,
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
        kind = _async_kind(fn)
        mutate = self._writes(mutate_vars)
        const = self._reads(const_vars, mutate)
        return self._push(fn, kind, ctx, const, mutate, prop, priority, name, None)

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
        op: Operation[T] = self._push(
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
        return _bulk.Bulk(self, size)

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
        does not run and ``var`` can be used (or deleted) again.

        Raises:
            VarDeletedError: if ``var`` was already deleted.
            TypeError: if ``delete_fn`` is not callable or None.
        """
        if delete_fn is not None:
            if not callable(delete_fn):
                raise TypeError(f"delete_fn must be callable or None, got {delete_fn!r}")
            if _is_coroutine_function(delete_fn):
                raise TypeError("delete_fn must be a plain function, not a coroutine function")
        if type(var) is not Var:
            raise TypeError(f"var must be an aioengine.Var, got {var!r}")
        if var._owner is not self:
            raise ValueError(f"{var!r} belongs to another Engine")
        mutate = (var,)
        fn = delete_fn if delete_fn is not None else _noop
        name = f"delete_var({var.name})"
        op: Operation[None] = self._push(
            fn, _SYNC, ctx, (), mutate, FnProperty.DELETE_VAR, 0, name, var
        )
        return op

    @property
    def max_pending(self) -> int | None:
        """The bound of the awaitable pushes, or None (unbounded)."""
        return self._settings.max_pending

    async def wait_for_capacity(self) -> None:
        """Wait until fewer than ``max_pending`` operations are pending (at once if unbounded).

        Returns without yielding when there is room. Only meaningful on the loop thread.
        """
        limit = self._settings.max_pending
        if limit is None or len(self._live) < limit:
            return
        loop = self._require_loop()
        while True:
            with self._lock:
                if len(self._live) < limit:
                    return
                fut: asyncio.Future[None] = loop.create_future()
                self._capacity_waiters.append(fut)
            try:
                await fut
            except BaseException:
                with self._lock:
                    if fut in self._capacity_waiters:
                        self._capacity_waiters.remove(fut)
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

        Returns the :class:`Operation` once it is pushed (not when it finishes).
        """
        await self.wait_for_capacity()
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
        await self.wait_for_capacity()
        return self.push_async(
            fn, ctx, const_vars, mutate_vars, prop=prop, priority=priority, name=name
        )

    async def push_wait(
        self, handle: OprHandle[T], ctx: Context = _CPU0, *, priority: int = 0
    ) -> Operation[T]:
        """:meth:`push` after :meth:`wait_for_capacity`: backpressure for producers."""
        await self.wait_for_capacity()
        return self.push(handle, ctx, priority=priority)

    def _push(
        self,
        fn: Callable[..., Any],
        kind: int,
        ctx: Context,
        const: tuple[Var, ...],
        mutate: tuple[Var, ...],
        prop: FnProperty,
        priority: int,
        name: str | None,
        deleting: Var | None,
        handle: OprHandle[Any] | None = None,
    ) -> Operation[Any]:
        """Validate the rest, append the requests atomically and dispatch if ready."""
        loop = self._loop
        # On the bound loop's thread while it runs (the usual case), the full check is not
        # needed; it asks the running loop, which costs a getpid() system call.
        if (
            loop is None
            or self._forked
            or _get_ident() != self._loop_thread
            or not self._loop_is_running()  # type: ignore[misc]  # set with _loop
        ):
            loop = self._bind()
        if type(ctx) is not Context:
            raise TypeError(f"ctx must be an aioengine.Context (cpu(i) or gpu(i)), got {ctx!r}")
        if type(prop) is not FnProperty:
            self._check_prop(prop)
        if type(priority) is not int:
            raise TypeError(f"priority must be an int, got {priority!r}")
        if name is None:
            if type(fn) is FunctionType:
                name = fn.__qualname__
            elif type(fn) is _partial and type(fn.func) is FunctionType:
                name = fn.func.__qualname__
            else:
                name = _fn_name(fn)
        elif type(name) is not str:
            raise TypeError(f"name must be a str or None, got {name!r}")
        if kind == _CORO:  # on the loop; _route checks a GPU context's device
            target = None if ctx.device_type is _CPU else self._route(ctx, prop, kind)
        else:
            last_ctx, last_prop, target = self._last_route
            if ctx is not last_ctx or prop is not last_prop:
                target = self._route(ctx, prop, kind)
        if target is None and loop is None:
            raise RuntimeError(
                f"{self!r} is not bound to an event loop yet, and {name!r} must run on it "
                "(coroutine, FnProperty.ASYNC or serial mode); use the engine from a "
                "coroutine first"
            )
        bulk = 0  # the segment size, when this operation joins a bulk segment (bulk.py)
        if (
            self._bulk_scopes
            and target is None
            and kind == _SYNC
            and handle is None
            and deleting is None
            and ctx.device_type is _CPU
            and _get_ident() == self._loop_thread
        ):
            bulk = _bulk_size_for(self)
        op = new_operation(self, fn, kind, ctx, const, mutate, prop, priority, name, target)
        if _COMPILED:  # out of the cycle collector's passes until it completes (collector.py)
            _hide(op)  # noqa: F821  (engine.pxd: compiled only)
        sequencer = self._sequencer
        self._lock_acquire()
        try:
            if self._state is not _OPEN:
                raise EngineClosedError(f"{self!r} is {self._state.value}; create a new Engine")
            if handle is not None and handle._deleted:
                raise OperatorDeletedError(f"{handle!r} was deleted; build a new one")
            if self._deleted_vars:
                for v in (*const, *mutate):
                    if v._deleted:
                        raise VarDeletedError(
                            f"{v!r} was deleted; operation {name!r} cannot use it"
                        )
            if self._segment is not None and not bulk:
                self._flush_segment_locked()  # it queues on its Vars before this operation
            self._seq += 1
            op._seq = seq = self._seq
            op._key = seq - (priority << 64) if priority else seq
            self._live[seq] = op
            if self._instruments:
                self._notify_locked("on_push", op)
            if bulk:
                self._join_segment_locked(op, bulk)
                return op
            # Appending is what a push promises to do atomically across its Vars, in the
            # critical section that gave it its sequence number: so every Var's queue is in
            # push order, which Var._holds relies on.
            wait = append_all(op, const, mutate)
            if sequencer is not None and not sequencer._append(op, True):
                wait += 1
            if deleting is not None:
                deleting._deleted = op
                self._deleted_vars = True
            if wait:
                op._wait = wait
                return op
            if self._gpu is not None:  # it may have to wait for GPU fences
                todo = self._settle([op])
            else:
                op._state = _READY
                if target is None:
                    self._enqueue_loop(op)
                    return op
                todo = None
        finally:
            self._lock_release()
        if todo is None:
            assert target is not None
            self._submit_one(target, op)
        elif todo:
            self._submit(todo)
        return op

    # -- argument checks ---------------------------------------------------------------

    def _check_fork(self) -> None:
        if self._forked:
            raise RuntimeError(
                f"{self!r} was created in process {self._pid} and cannot be used after "
                "os.fork(): its threads do not exist here. Create a new Engine in the child "
                "(or use multiprocessing's 'spawn' start method)"
            )

    def _check_open(self) -> None:
        self._check_fork()
        if self._state is not _State.OPEN:
            raise EngineClosedError(f"{self!r} is {self._state.value}; create a new Engine")

    @staticmethod
    def _check_prop(prop: object) -> None:
        if not isinstance(prop, FnProperty):
            raise TypeError(f"prop must be an aioengine.FnProperty, got {prop!r}")

    def _writes(self, mutate_vars: Iterable[Var]) -> tuple[Var, ...]:
        """Check ``mutate_vars`` (checked first, then ``const_vars`` by :meth:`_reads`) and
        deduplicate it. Two calls, not one returning both tuples: no pair to build per push."""
        m: Sequence[Var] = (
            mutate_vars
            if type(mutate_vars) is list or type(mutate_vars) is tuple
            else self._listed("mutate_vars", mutate_vars)
        )
        # A Var's owner is read through `var`, which the compiled core types as Var (a C
        # struct read) once the exact type is checked.
        for v in m:
            if type(v) is not Var:
                self._bad_var("mutate_vars", m)
            var: Var = v
            if var._owner is not self:
                self._bad_var("mutate_vars", m)
        # Short lists (the usual case) are deduplicated without building dicts or sets, by
        # identity: Var has no __eq__, so `is` decides what `==` would, without its calls.
        nm = len(m)
        if nm < 2 or (nm == 2 and m[0] is not m[1]):
            return tuple(m)
        return tuple(dict.fromkeys(m))

    def _reads(self, const_vars: Iterable[Var], mutate: tuple[Var, ...]) -> tuple[Var, ...]:
        """Check ``const_vars`` and deduplicate it, less the Vars in ``mutate`` (the
        deduplicated writes): a Var in both lists counts as mutated."""
        c: Sequence[Var] = (
            const_vars
            if type(const_vars) is list or type(const_vars) is tuple
            else self._listed("const_vars", const_vars)
        )
        for v in c:
            if type(v) is not Var:
                self._bad_var("const_vars", c)
            var: Var = v
            if var._owner is not self:
                self._bad_var("const_vars", c)
        nc = len(c)
        if not nc:
            return ()
        if (
            nc == 1
            or (nc == 2 and c[0] is not c[1])
            or (nc == 3 and c[0] is not c[1] and c[0] is not c[2] and c[1] is not c[2])
        ):
            const = tuple(c)
        else:
            const = tuple(dict.fromkeys(c))
        # Below, tuple([...]) rather than a generator: the compiled core (engine.pxd) makes
        # this a cpdef method, in which Cython does not support closures.
        if len(mutate) > 8:  # long lists: a set, not nc * nm comparisons
            written = set(mutate)
            return tuple([v for v in const if v not in written])
        for v in const:
            for w in mutate:
                if v is w:  # in both lists: mutated
                    return tuple([v for v in const if v not in mutate])
        return const

    @staticmethod
    def _listed(arg: str, vars_: object) -> list[Var]:
        if isinstance(vars_, Var):
            raise TypeError(f"{arg} must be a list of Vars, not a single Var; use [{vars_.name}]")
        if isinstance(vars_, (str, bytes)) or not isinstance(vars_, Iterable):
            raise TypeError(f"{arg} must be an iterable of aioengine.Var, got {vars_!r}")
        return list(vars_)

    def _bad_var(self, arg: str, vars_: Iterable[object]) -> None:
        for i, v in enumerate(vars_):
            if type(v) is not Var:
                raise TypeError(f"{arg}[{i}] is {v!r}, not an aioengine.Var")
            if v._owner is not self:
                raise ValueError(f"{arg}[{i}] {v!r} belongs to another Engine")

    # -- routing -----------------------------------------------------------------------

    def _route(self, ctx: Context, prop: FnProperty, kind: int) -> Executor | None:
        """Return the executor for ``(ctx, prop)``; None means the event-loop thread."""
        if kind == _CORO:
            if ctx.device_type is not _CPU:
                self._gpu_devices(ctx)  # a host consumer of a GPU: the device must be usable
            return None
        last_ctx, last_prop, last = self._last_route
        if ctx is last_ctx and prop is last_prop:
            return last
        target: Executor | None
        try:
            target = self._routes[ctx, prop]
        except KeyError:
            pass
        else:
            self._last_route = (ctx, prop, target)
            return target
        if ctx.device_type is not _CPU:
            return self._gpu_route(ctx, prop, kind)
        if self._settings.serial or prop is FnProperty.ASYNC:
            target = None
        elif prop is FnProperty.CPU_PRIORITIZED:
            target = self._executor("cpu-priority", _CPU0, self._settings.cpu_priority_workers)
        else:
            target = self._executor(f"cpu{ctx.device_id}", ctx, self._settings.cpu_workers)
        with self._lock:
            self._routes[ctx, prop] = target
        return target

    def _on_worker_thread(self) -> bool:
        """Whether the caller runs on one of this engine's worker threads (so inside one of
        its operations); safe from any thread."""
        with self._lock:
            executors = list(self._executors.values())
        return any(executor.owns_current_thread() for executor in executors)

    def _executor(self, key: str, ctx: Context, workers: int) -> Executor:
        with self._lock:
            executor = self._executors.get(key)
            if executor is None:
                executor = ThreadExecutor(ctx, workers, f"aioengine-{key}", Engine._execute)
                self._executors[key] = executor
            return executor

    # -- GPU contexts (fence.py has the ordering rules, executors/gpu.py the pools) ------

    def _gpu_route(self, ctx: Context, prop: FnProperty, kind: int) -> Executor | None:
        """Route an operation on a GPU context (not cached: a device may fail meanwhile).

        Plain functions run on the device's stream workers; ``FnProperty.ASYNC``,
        ``DELETE_VAR`` and callback-style functions are host consumers on the loop.
        """
        gpu = self._gpu_devices(ctx)
        if kind != _SYNC or prop is FnProperty.ASYNC or prop is FnProperty.DELETE_VAR:
            return None
        with self._lock:
            return gpu.executor(ctx, prop, self._executors.__setitem__)

    def _gpu_devices(self, ctx: Context) -> GpuDevices:
        """The GPU state, created on first use; raise if ``ctx``'s device cannot be used."""
        if self._loop is None:
            raise RuntimeError(
                f"{self!r} is not bound to an event loop yet, and GPU operations need it (its "
                "poller observes their completion); use the engine from a coroutine first"
            )
        gpu = self._gpu
        if gpu is None:
            from .executors.cupy_streams import CupyBackend

            backend = self._gpu_backend
            if backend is None:
                try:
                    backend = self._gpu_backend = CupyBackend()
                except DeviceUnavailableError as exc:  # no CuPy: say which push failed
                    raise DeviceUnavailableError(f"cannot run on {ctx!r}: {exc}") from None
            backend.check(ctx.device_id)
            settings = self._settings
            with self._lock:
                gpu = self._gpu
                if gpu is None:
                    gpu = self._gpu = GpuDevices(
                        backend,
                        run=Engine._execute,
                        workers=settings.gpu_workers,
                        copy_workers=settings.gpu_copy_workers,
                        host_sync=settings.gpu_sync == "host" or settings.serial,
                        max_inflight=settings.gpu_max_inflight,
                    )
        else:
            gpu.backend.check(ctx.device_id)
        err = gpu.broken(ctx.device_id)
        if err is not None:
            raise DeviceFailedError(f"cannot push to {ctx!r}: {err}") from err.__cause__
        return gpu

    def _device_box_locked(self, device_id: int, err: DeviceFailedError) -> _Failure:
        """The one failure record all operations failed by ``device_id`` share (lock held)."""
        box = self._device_boxes.get(device_id)
        if box is None or box.exc is None:  # none yet, or thrown (and so cleared) already
            box = self._device_boxes[device_id] = _Failure(err)
            self._failures[box] = None
        return box

    def _hold_for_fences(self, op: Operation[Any]) -> bool:
        """Make a host consumer wait for the pending GPU fences on its Vars (lock held).

        Returns False when there are none (it may start now); else it stays PENDING and
        :meth:`_settle_fence_locked` makes it ready when the last of them completes.
        """
        fences = host_waits(op._const, op._mutate)
        if not fences:
            return False
        op._fwait = len(fences)
        for fence in fences:
            assert fence.waiters is not None  # pending fences have a waiter list
            fence.waiters.append(op)
        return True

    def _execute_gpu(self, op: Operation[Any], rctx: RunContext) -> None:
        """Enqueue GPU ``op`` on this worker's stream and record its fence (GPU worker thread).

        The stream first waits (``wait_event``, no host wait) for the fences on other streams
        that ``op`` depends on (fence.py). Once its work is enqueued its Var turns are released
        (event mode; host mode: when its fence completes), and the poller completes ``op`` when
        its fence does. An enqueue cannot be undone, so nothing here can be cancelled.
        """
        gpu = self._gpu
        assert gpu is not None
        stream = rctx.stream
        device = op._ctx.device_id
        skipped = None
        broken = None
        deps: list[Fence] = []
        waits: list[Any] = []
        with self._lock:
            if op._state is not _READY:  # cancelled while queued
                return
            if self._failures:
                skipped = self._skip_locked(op)
            if skipped is None:
                broken = gpu.broken(device)
                if broken is None:
                    op._state = _RUNNING
                    deps = gpu_waits(op._const, op._mutate, stream)
                    if not gpu.skip_waits:
                        waits = [f.event for f in deps]
        if skipped is not None:
            if skipped:
                self._submit(skipped)
            return
        if broken is not None:
            self._fail_on_device(op, device, broken)
            return
        if self._instruments:
            self._notify_start(op)
        backend = gpu.backend
        # The in-flight bound: may wait (this worker only) for completions.
        if not gpu.acquire(device):  # the device failed, or the interpreter is exiting
            broken = gpu.broken(device)
            if broken is not None:
                self._fail_on_device(op, device, broken)
            else:
                self._finish(op, _CANCELLED, None, None)
            return
        keep: list[Any] = []
        fn = op._fn
        assert fn is not None
        # The values before the run too: a write may replace a value the device still reads.
        before = tuple(v._value for v in op._vars)
        state = _DONE
        result: object = None
        exc: BaseException | None = None
        try:
            for event in waits:
                backend.wait_event(stream, event)
            result = _context_run(
                op._context, backend.run, stream, fn, RunContext(op._ctx, stream, keep, backend)
            )
        except BaseException as e:
            e.__traceback__ = e.__traceback__.tb_next if e.__traceback__ else None
            state, exc = _FAILED, e
        event = None
        if exc is None or not backend.is_device_error(exc):
            try:
                event = backend.record(stream)
            except BaseException as e:
                exc = e
        if event is None:  # a CUDA error: the device is dead, and so is what it has queued
            gpu.release(device)
            assert exc is not None
            # What the function enqueued may still run: keep it for the life of the process.
            gpu.keep_forever((fn, keep, before, tuple(v._value for v in op._mutate)))
            err = gpu.fail(device, exc)
            with self._lock:
                self._call_soon(functools.partial(self._fail_device_fences, device))
            self._fail_on_device(op, device, err)
            del op, fn, exc  # the failure's frames reach this frame
            return
        after = tuple(v._value for v in op._mutate)
        fence = Fence(self, backend, event, stream, device, 0, (fn, result, keep, before, after))
        ready: list[Any] = []
        with self._lock:
            self._fence_seq += 1
            fence.seq = self._fence_seq
            fence.op = op
            fence.state = state
            op._result = result
            op._exception = exc
            note_launch(op._const, op._mutate, fence)
            self._gpu_pending[fence] = None
            poisoned = False
            for dep in deps:  # if one of them fails, this stream never passes its wait
                if dep.status is None:
                    assert dep.dependents is not None  # pending fences have a list
                    dep.dependents.append(fence)
                elif dep.status:
                    poisoned = True
            if not gpu.host_sync:
                self._release_locked(op, state, exc, ready)
            # Or the device failed, or its stream got stuck, while op was being enqueued (a
            # cross-device chain settles only the fences pending then): op's work sits behind a
            # wait that never passes, or on a dead device.
            if poisoned or fence.stream_id in self._stuck_streams or gpu.dead(device):
                self._fail_devices_locked([fence], ready)
            todo = self._settle(ready) if ready else ready
        loop = self._loop
        assert loop is not None
        poller_for(loop).watch(fence)
        if todo:
            self._submit(todo)
        del op, fn, exc, fence  # an idle worker keeps nothing alive

    def _fail_on_device(self, op: Operation[Any], device: int, err: DeviceFailedError) -> None:
        """Fail ``op`` (not launched) because its device failed."""
        ready: list[Any] = []
        with self._lock:
            box = self._device_box_locked(device, err)
            self._finish_locked(op, _FAILED, None, err, ready, box)
            todo = self._settle(ready) if ready else ready
        if todo:
            self._submit(todo)

    def _fail_device_fences(self, device: int) -> None:
        """Settle every pending fence of a failed device as failed (loop thread)."""
        ready: list[Any] = []
        with self._lock:
            failed = []
            for fence in list(self._gpu_pending):
                if fence.device_id == device:
                    failed.extend(self._settle_fence_locked(fence, _DEVICE_FAILED, ready))
            self._fail_devices_locked(failed, ready)
            todo = self._settle(ready) if ready else ready
        if todo:
            self._submit(todo)

    def _fences_settled(self, items: list[tuple[Fence, int]]) -> None:
        """The poller saw these fences complete (status 0) or fail (loop thread)."""
        ready: list[Any] = []
        with self._lock:
            failed = []
            for fence, status in items:
                if fence.status is None:  # else settled already, as its device failed
                    failed.extend(self._settle_fence_locked(fence, status, ready))
            if failed:
                self._fail_devices_locked(failed, ready)
            todo = self._settle(ready) if ready else ready
        if todo:
            self._submit(todo)

    def _fail_devices_locked(self, waiting: list[Fence], ready: list[Any]) -> None:
        """Fail the pending fences that wait on a failed fence, and those behind them on
        their streams (lock held).

        Such a fence's stream waits (``wait_event``) for work that will never complete, so
        nothing recorded on that stream from then on completes: those fences fail, and so,
        in turn, do the fences that wait on them (cross-device chains). Their device takes
        no new work; what it queued earlier on that stream or on its other streams still
        runs, and the poller settles it as usual, so that no host consumer of that work
        starts before the device is done with its memory.
        """
        gpu = self._gpu
        assert gpu is not None
        while waiting:
            fence = waiting.pop()
            if fence.status is not None:
                continue
            gpu.fail(
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
        gpu = self._gpu
        assert gpu is not None
        fence.status = status
        del self._gpu_pending[fence]
        gpu.release(fence.device_id)
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
            gpu.keep_forever(fence.keep)  # in a worker (_execute_gpu)
        fence.keep = None
        loop = self._loop
        assert loop is not None
        poller_for(loop).release(dropped)
        dependents = fence.dependents
        fence.dependents = None
        if op is not None:
            state = fence.state
            exc = op._exception
            box = None
            if status:
                exc = gpu.fail(fence.device_id, status)
                box = self._device_box_locked(fence.device_id, exc)
                state = _FAILED
                op._result = None
            if gpu.host_sync:
                self._finish_locked(op, state, op._result, exc, ready, box)
            else:
                if box is not None:  # released as a success: what it wrote carries the failure
                    for v in op._mutate:
                        v._failure = box
                op._state = state
                op._exception = exc
                self._complete_locked(op, state)
        waiters = fence.waiters
        fence.waiters = None
        if waiters:
            for w in waiters:
                if w._state is _PENDING and w._fwait:
                    w._fwait -= 1
                    if not w._fwait:
                        ready.append(w)
        if not status or not dependents:
            return []
        return [d for d in dependents if d.status is None]

    # -- running -----------------------------------------------------------------------

    def _settle(self, ready: list[Any]) -> list[Operation[Any]]:
        """Mark newly ready operations READY (lock held).

        Host consumers of pending GPU work wait for its fences first. Wait markers complete
        at once (which may append more operations to ``ready``, handled in the same pass);
        operations for the loop thread join its queue. Returns the ones to submit to their
        executors once the lock is released, and, on the loop thread while its queue is
        empty (so no queued operation of higher priority is overtaken), coroutine operations
        to start there at once: creating a task runs nothing, and it saves their tasks a
        trip through the loop queue (a chain of coroutine operations costs one loop
        iteration less per operation). Not with a task factory, which may start the task
        eagerly, in the caller.
        """
        todo: list[Operation[Any]] = []
        i = 0
        while i < len(ready):
            op = ready[i]
            i += 1
            if op._kind == _WAIT:
                if self._gpu is not None and self._hold_for_fences(op):
                    continue
                # Its result: the failure its Var carries now that every earlier user has
                # finished, not one that a later operation records before the waiter resumes.
                self._finish_locked(op, _DONE, op._mutate[0]._failure, None, ready)
            elif op._state is _PENDING:
                if (
                    self._gpu is not None
                    and type(op._target) is not GpuExecutor
                    and self._hold_for_fences(op)
                ):
                    continue  # a host consumer of GPU data: it starts once the fences complete
                op._state = _READY
                if op._target is not None:
                    todo.append(op)
                elif (
                    op._kind == _CORO
                    and self._loop_head == len(self._loop_fifo)  # the loop queue is empty
                    and not self._loop_heap
                    and _get_ident() == self._loop_thread
                    and self._loop is not None
                    and self._loop.get_task_factory() is None
                ):
                    todo.append(op)  # started at once by _submit
                else:
                    self._enqueue_loop(op)
        return todo

    def _submit(self, todo: list[Operation[Any]]) -> None:
        """Hand READY operations to their executors, or start them on the loop thread (see
        :meth:`_settle`); lock not held."""
        if len(todo) > 1:
            todo.sort(key=_run_order)  # the loop's ones start in this order
        for op in todo:
            if op._target is None:
                self._execute_one(op, None)
            else:
                self._submit_one(op._target, op)

    def _submit_one(self, target: Executor, op: Operation[Any]) -> None:
        """Submit one READY operation; from the loop thread, wake workers once per iteration.

        A burst of pushes from the loop then hands the workers one wake-up instead of one per
        operation (each wake-up of a sleeping thread costs a GIL hand-off).
        """
        if _get_ident() != self._loop_thread:
            if not target.submit(op, op._key, True):
                self._not_submitted(op)
            return
        if not target.submit(op, op._key, False):
            self._not_submitted(op)
            return
        wakes = self._wakes
        if target not in wakes:
            wakes.append(target)
            if len(wakes) == 1:
                assert self._loop is not None
                self._loop.call_soon(self._flush_wakes)

    def _not_submitted(self, op: Operation[Any]) -> None:
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
            with self._lock:
                for op in dropped:
                    if op._state is _READY:
                        self._finish_locked(op, _CANCELLED, None, None, ready)
                todo = self._settle(ready) if ready else ready
            dropped = [o for o in todo if o._target is not None and o._target.abandoned]
            if len(dropped) < len(todo):
                self._submit([o for o in todo if o._target is None or not o._target.abandoned])

    def _flush_wakes(self) -> None:
        """Wake the executors that the loop thread submitted to (loop thread)."""
        wakes = self._wakes
        self._wakes = []
        for target in wakes:
            target.wake()

    def _enqueue_loop(self, op: Operation[Any]) -> None:
        """Queue a READY operation for the loop thread (lock held)."""
        if op._priority or not self._fifo_put(op):
            heappush(self._loop_heap, op._key)
            self._loop_heap_ops[op._key] = op
        if not self._loop_queue_scheduled:
            self._loop_queue_scheduled = True
            self._call_soon(self._run_loop_queue)

    def _fifo_put(self, op: Operation[Any]) -> bool:
        """Put priority-0 ``op`` in the slot of its number; False if that slot is behind the
        head, or so far ahead that padding would more than double the FIFO (lock held)."""
        fifo = self._loop_fifo
        n = len(fifo)
        seq: int = op._seq
        if self._loop_head == n:  # the FIFO is empty: it starts again at this operation
            del fifo[:]
            self._loop_head = 0
            self._loop_base = seq
            fifo.append(op)
            return True
        i = seq - self._loop_base
        if i < n:
            if i < self._loop_head:
                return False
            fifo[i] = op
            return True
        gap = i - n
        if gap > n + 64:
            return False
        while gap:  # padding, each slot appended once and passed once by the head
            fifo.append(None)
            gap -= 1
        fifo.append(op)
        return True

    def _call_soon(self, callback: Callable[[], None]) -> None:
        """Schedule ``callback`` on the engine's loop from any thread (lock held)."""
        loop = self._loop
        assert loop is not None
        if _get_ident() == self._loop_thread:
            loop.call_soon(callback)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(callback)

    def _run_loop_queue(self) -> None:
        """Run the loop thread's READY operations, best first (on the loop thread).

        As a worker does, it finishes an inline operation and starts the next best one in
        one critical section (:meth:`_finish_and_continue`), so a chain of inline operations
        (or serial mode) costs neither a loop iteration nor a second lock round trip per
        operation. After ``_LOOP_BUDGET`` operations it yields to the loop's other callbacks
        (the tasks of the coroutine operations it started among them) and reschedules.
        """
        budget = _LOOP_BUDGET
        try:
            while budget > 0:
                todo: list[Operation[Any]] = []
                self._lock_acquire()
                try:
                    op = self._claim_loop_op_locked(todo)
                    if op is None:
                        self._loop_queue_scheduled = False
                finally:
                    self._lock_release()
                if todo:
                    self._submit(todo)  # what skipped operations released
                if op is None:
                    return
                while op is not None:
                    # A bulk segment runs all its members in this one call: each one counts.
                    budget -= len(op._result) if op._kind == _BULK else 1
                    op = self._execute_one(op, None, True, budget > 0)
        except BaseException:
            # KeyboardInterrupt or SystemExit from an inline operation (recorded, and the loop
            # stops): while _loop_queue_scheduled stays True nothing schedules this again.
            self._reschedule_loop_queue()
            raise
        self._reschedule_loop_queue()

    def _reschedule_loop_queue(self) -> None:
        """After a run of the loop queue that did not empty it: run it again soon, if needed."""
        with self._lock:
            if self._loop_head < len(self._loop_fifo) or self._loop_heap:  # not empty
                self._call_soon(self._run_loop_queue)
            else:
                self._loop_queue_scheduled = False

    def _claim_loop_op_locked(self, todo: list[Operation[Any]]) -> Operation[Any] | None:
        """Take the best READY operation of the loop queue and mark it RUNNING (lock held).

        Cancelled ones are dropped, skipped ones finished (what they release is appended
        to ``todo``, for the caller to submit once the lock is released).
        """
        fifo = self._loop_fifo
        heap = self._loop_heap
        n = len(fifo)
        op: Operation[Any] | None = None
        while True:
            # _loop_head is written back before each start: a skip's release (in
            # _start_locked) may enqueue, and _enqueue_loop reads it.
            head = self._loop_head
            while head < n and fifo[head] is None:
                head += 1  # a slot whose op is not READY yet, or never a loop op
            self._loop_head = head
            first = fifo[head] if head < n else None  # the FIFO's best; the heap's is heap[0]
            if first is not None and not (heap and heap[0] < first._key):
                op = first
                fifo[head] = None
                self._loop_head = head + 1
            elif heap:
                op = self._loop_heap_ops.pop(heappop(heap))
            else:
                break
            if self._start_locked(op, todo):
                break
            op = None
            n = len(fifo)  # the skip's release may have enqueued
        head = self._loop_head
        kept = drop_consumed(fifo, head)
        self._loop_base += head - kept
        self._loop_head = kept
        return op

    def _start_locked(self, op: Operation[Any], todo: list[Operation[Any]]) -> bool:
        """Mark READY ``op`` RUNNING and return True; False if it was cancelled while queued
        or is skipped because an input carries a failure (what a skip releases is appended to
        ``todo``, for the caller to submit once the lock is released). Lock held."""
        if op._state is not _READY:
            return False
        if self._failures and op._kind != _BULK:  # a segment's members check their own
            skipped = self._skip_locked(op)
            if skipped is not None:
                todo.extend(skipped)
                return False
        op._state = _RUNNING
        return True

    @staticmethod
    def _execute(op: Operation[Any], rctx: RunContext) -> None:
        """Start ``op`` and run its function on a worker thread: every executor's runner.

        A static method, so that executors, whose threads outlive their last operation, keep
        no reference to the engine (which can then be collected and warn if never closed).

        An operation that ``op``'s completion made ready on the same pool runs next on this
        thread, without a trip through the pool's queue (MXNet continues on the completing
        thread too), even if queued work has a higher priority (priority orders the queue, as
        in MXNet, and is a hint); the others are submitted as usual. Failing that, the thread
        takes the best operation queued on its pool.
        """
        # A failure's traceback reaches this frame (f_back), whose locals it keeps as they are
        # when it returns: so hold no operation by then.
        self = op._engine
        if rctx.ctx.device_type is _GPU:
            self._execute_gpu(op, rctx)
            del op
            return
        nxt = self._execute_one(op, rctx)
        del op
        while nxt is not None:
            nxt = self._execute_one(nxt, rctx, True)

    def _execute_one(
        self,
        op: Operation[Any],
        rctx: RunContext | None,
        claimed: bool = False,
        more: bool = True,
    ) -> Operation[Any] | None:
        """Run ``op`` (see :meth:`_execute`); return a successor this thread claimed to run.

        ``rctx`` is None on the loop thread. ``claimed``: ``op`` is already RUNNING
        (:meth:`_finish_and_continue` or :meth:`_claim_loop_op_locked` started it).
        ``more``: whether to claim a successor at all.
        """
        if not claimed:
            todo: list[Operation[Any]] = []
            self._lock_acquire()
            try:
                started = self._start_locked(op, todo)
            finally:
                self._lock_release()
            if not started:
                if todo:
                    self._submit(todo)
                return None
        kind = op._kind
        if self._instruments and kind != _BULK:  # a segment's members are reported instead
            self._notify_start(op)
        ctx = op._ctx
        if rctx is None:
            if ctx is not self._loop_ctx:  # by identity: Context hashes in Python
                self._loop_rctx = self._run_context(ctx)
                self._loop_ctx = ctx
            rctx = self._loop_rctx
            assert rctx is not None
        elif rctx.ctx is not ctx:  # e.g. the shared CPU priority pool
            rctx = self._run_context(ctx) if rctx.stream is None else RunContext(ctx, rctx.stream)
        fn = op._fn
        if kind == _SYNC:
            assert fn is not None
            try:
                result = _context_run(op._context, fn, rctx)
            except BaseException as exc:
                # Drop this frame from the traceback: the recorded failure must not keep the
                # operation (and through it its Vars) alive until someone throws it.
                exc.__traceback__ = exc.__traceback__.tb_next if exc.__traceback__ else None
                self._finish(op, _FAILED, None, exc)
                # The failure's frames reach this frame through f_back: hold no operation.
                del op, fn
                if isinstance(exc, (KeyboardInterrupt, SystemExit)) and rctx is self._loop_rctx:
                    raise  # inline on the loop thread: recorded, and the loop still stops
                return None
            if type(result) in _COROUTINE_TYPES:
                self._finish(op, _FAILED, None, self._awaitable_result(op, result))
            elif more:
                return self._finish_and_continue(op, result)
            else:
                self._finish(op, _DONE, result, None)
        elif kind == _CORO:
            assert fn is not None
            self._start_task(op, fn, rctx)
        elif kind == _BULK:
            return self._run_segment(op, more)
        else:
            assert fn is not None
            token = OnComplete(op)
            try:
                result = _context_run(op._context, fn, rctx, token)
            except BaseException as exc:
                exc.__traceback__ = exc.__traceback__.tb_next if exc.__traceback__ else None
                self._callback_raised(op, token, exc)
                del op, fn, token  # as above: the failure's frames reach this frame
                return None
            if type(result) in _COROUTINE_TYPES:
                self._callback_raised(op, token, self._awaitable_result(op, result))
        return None

    # -- bulk execution (bulk.py) --------------------------------------------------------

    def _bulk_enter(self) -> None:
        self._bulk_scopes += 1

    def _bulk_exit(self) -> None:
        """A bulk scope ended: close the open segment, so its members queue now (loop thread)."""
        self._bulk_scopes -= 1
        self._flush_segment()

    def _flush_segment(self) -> None:
        """Close the open segment, if any (any thread): something is about to wait."""
        if self._segment is not None:
            with self._lock:
                if self._segment is not None:
                    self._flush_segment_locked()

    def _flush_segment_soon(self) -> None:
        """The loop's next iteration after a segment opened: close it (loop thread)."""
        with self._lock:
            self._segment_flush_scheduled = False
            if self._segment is not None:
                self._flush_segment_locked()

    def _join_segment_locked(self, op: Operation[Any], size: int) -> None:
        """Add ``op`` (PENDING, numbered) to the open segment, opening one if needed, and close
        it once it holds ``size`` operations (loop thread, lock held)."""
        seg = self._segment
        if seg is None:
            seg = self._segment = new_operation(
                self, None, _BULK, _CPU0, (), (), _NORMAL, 0, "bulk segment"
            )
            members: list[Operation[Any]] = [op]
            seg._result = members
            if not self._segment_flush_scheduled:
                self._segment_flush_scheduled = True
                assert self._loop is not None
                self._loop.call_soon(self._flush_segment_soon)
        else:
            members = seg._result
            members.append(op)
        op._segment = seg
        if len(members) >= size:
            self._flush_segment_locked()

    def _flush_segment_locked(self) -> None:
        """Queue the open segment on the union of its members' Vars (lock held).

        It takes the next sequence number, as a push does: nothing else was pushed since its
        first member (the invariant at ``_segment``), so the Vars' queues stay in push order.
        A segment whose members were all cancelled before it closed is dropped.
        """
        seg = self._segment
        assert seg is not None
        self._segment = None
        members: list[Operation[Any]] = seg._result
        reads: dict[Var, None] = {}
        writes: dict[Var, None] = {}
        priority = None
        for op in members:
            if op._state is _PENDING:  # else cancelled already; it needs no Var
                vars_ = op._vars  # its reads, then its writes
                for k in range(op._nreads):
                    reads[vars_[k]] = None
                for k in range(op._nreads, len(vars_)):
                    writes[vars_[k]] = None
                if priority is None or op._priority > priority:
                    priority = op._priority
        if priority is None:
            return
        # written by another member; a list, not a generator: a cpdef method when compiled
        const = tuple([v for v in reads if v not in writes])
        mutate = tuple(writes)
        seg._vars = const + mutate
        seg._nreads = len(const)
        seg._priority = priority
        seg.name = f"bulk segment ({len(members)} operations from {members[0].name!r})"
        self._seq += 1
        seg._seq = seq = self._seq
        seg._key = seq - (priority << 64) if priority else seq
        wait = append_all(seg, const, mutate)
        sequencer = self._sequencer
        if sequencer is not None and not sequencer._append(seg, True):
            wait += 1
        if wait:
            seg._wait = wait
        elif self._gpu is not None:
            self._settle([seg])  # it may have to wait for GPU fences; it runs on the loop
        else:
            seg._state = _READY
            self._enqueue_loop(seg)

    def _run_segment(self, seg: Operation[Any], more: bool) -> Operation[Any] | None:
        """Run a segment's members in push order, then release its Vars (loop thread).

        Each member starts (unless cancelled, or skipped because an input carries a failure,
        which an earlier member may have written) and finishes under the lock as an operation
        of its own; only holding and releasing the Vars is the segment's. A member that
        returned is completed in the critical section that starts the next one: one lock
        round trip per member. Returns the loop operation claimed next, as
        :meth:`_finish_and_continue` does.
        """
        members: list[Operation[Any]] = seg._result
        seg._result = None
        n = len(members)
        i = 0
        done: Operation[Any] | None = None  # returned `result`; completed with the next start
        result: object = None
        try:
            while True:
                self._lock_acquire()
                try:
                    if done is not None:
                        done._state = _DONE
                        done._result = result
                        box = done._inherited  # a NO_SKIP member passes an inherited failure on
                        vars_ = done._vars
                        for k in range(done._nreads, len(vars_)):  # its writes
                            v = vars_[k]
                            v._version += 1
                            if box is not None:
                                v._failure = box
                        done._fn = None
                        done._inherited = None
                        self._complete_locked(done, _DONE)
                        done = None
                    while i < n:
                        op = members[i]
                        i += 1
                        if op._state is not _PENDING:
                            pass  # cancelled while it waited
                        elif self._failures and self._skip_locked(op) is not None:
                            pass  # skipped (it releases nothing: the segment holds its Vars)
                        else:
                            op._state = _RUNNING
                            break
                    else:
                        op = None
                finally:
                    self._lock_release()
                if op is None:
                    break
                if self._instruments:
                    self._notify_start(op)
                ctx = op._ctx
                if ctx is not self._loop_ctx:  # by identity, as in _execute_one: Context
                    self._loop_rctx = self._run_context(ctx)  # hashes in Python
                    self._loop_ctx = ctx
                rctx = self._loop_rctx
                fn = op._fn
                assert fn is not None
                try:
                    result = _context_run(op._context, fn, rctx)
                except BaseException as exc:
                    exc.__traceback__ = exc.__traceback__.tb_next if exc.__traceback__ else None
                    self._finish(op, _FAILED, None, exc)
                    del op, fn  # the failure's frames reach this frame: see _execute_one
                    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                        raise  # recorded; the members after it wait for the loop (below)
                    continue
                if type(result) in _COROUTINE_TYPES:
                    self._finish(op, _FAILED, None, self._awaitable_result(op, result))
                    continue
                done = op
        except BaseException:
            # KeyboardInterrupt or SystemExit from a member, re-raised as an inline
            # operation's is: the members after it run (or are skipped) when the loop runs
            # again, as inline operations queued behind that one would. So the segment keeps
            # its Vars and goes back to the loop queue with them.
            with self._lock:
                rest = seg._result = members[i:]
                if rest:
                    seg._state = _READY
                    self._enqueue_loop(seg)
            members.clear()
            if not rest:
                self._finish_segment(seg, False)
            raise
        # Hold nothing of a member once this frame returns: a failure's frames reach it
        # (f_back), and keep its locals as they are then (see _execute).
        members.clear()
        op = fn = result = v = box = vars_ = None  # type: ignore[assignment]
        return self._finish_segment(seg, more)

    def _finish_segment(self, seg: Operation[Any], more: bool) -> Operation[Any] | None:
        """Release a segment's Vars; claim the next loop operation if ``more`` (loop thread)."""
        ready: list[Any] = []
        nxt = None
        self._lock_acquire()
        try:
            seg._state = _DONE
            # False: its members counted their own writes as they finished.
            release_all(seg._vars, seg._nreads, ready, False)
            if self._sequencer is not None:
                self._sequencer._release(True, ready, True)
            self._complete_locked(seg, _DONE)
            todo = self._settle(ready) if ready else ready
            if more:
                nxt = self._claim_loop_op_locked(todo)
        finally:
            self._lock_release()
        if todo:
            self._submit(todo)
        return nxt

    def _run_context(self, ctx: Context) -> RunContext:
        rctx = self._rctx_cache.get(ctx)
        if rctx is None:
            rctx = self._rctx_cache[ctx] = RunContext(ctx)
        return rctx

    def _skip_locked(self, op: Operation[Any]) -> list[Operation[Any]] | None:
        """Inherit an input's failure at start; skip ``op`` unless it is NO_SKIP.

        Called with the lock held when some failure is recorded. As in MXNet, the failure is
        taken at start (when every earlier writer of the inputs has finished), from the first
        const Var carrying one, else the first mutated Var. Returns None when ``op`` should
        run; when it was skipped, the operations its release made ready, for the caller to
        submit once the lock is released.
        """
        for v in op._vars:
            box = v._failure
            if box is not None and box.exc is not None:
                op._inherited = box
                if op._prop in _NO_SKIP:
                    return None
                err = DependencyError(
                    f"operation {op.name!r} was skipped: {v.name!r} carries a failure "
                    f"({summary(box.exc)})"
                )
                err.__cause__ = box.exc
                ready: list[Any] = []
                self._finish_locked(op, _SKIPPED, None, err, ready)
                return self._settle(ready) if ready else []
        return None

    @staticmethod
    def _awaitable_result(op: Operation[Any], result: object) -> TypeError:
        close = getattr(result, "close", None)
        if callable(close):
            close()  # a never-awaited coroutine would warn
        return TypeError(
            f"{op.name!r} returned a coroutine; declare it 'async def' and push it with "
            "push_async()"
        )

    def _start_task(self, op: Operation[Any], fn: Callable[..., Any], rctx: RunContext) -> None:
        """Create the task of coroutine operation ``op`` (loop thread; ``op`` is RUNNING)."""
        loop = self._loop
        assert loop is not None
        coro = run_coroutine(op, fn, rctx)
        # Up to its hand-off now, in op's context (it sets current_op there): from here on
        # a cancellation of the task reaches its try statement.
        _context_run(op._context, coro.send, None)
        task = loop.create_task(coro, name=op.name, context=op._context)
        # The engine tracks this task through its operation (dump(), statistics()); when the
        # loop closes with it pending (asyncio.run ending while operations are queued behind
        # a cancelled one), the operation is simply never finished, which is not worth a
        # "Task was destroyed but it is pending!" on stderr at interpreter exit.
        task._log_destroy_pending = False  # type: ignore[attr-defined]
        op._task = task  # read on the loop thread only (_cancel hands off to it), so no lock

    def _callback_raised(self, op: Operation[Any], token: OnComplete, exc: BaseException) -> None:
        """A callback-style function raised: fail the op, or report if already completed."""
        with self._lock:
            already = token._called
            if not already:
                token._called = exc
        if not already:
            self._finish(op, _FAILED, None, exc)
            return
        self._report(
            f"{op.name!r} raised after calling on_complete(); the exception is reported here",
            exc,
        )

    def _on_complete_called(self, token: OnComplete, exc: BaseException | None) -> None:
        op = token._op
        with self._lock:
            called = token._called
            if called is True:
                raise RuntimeError(f"on_complete() for {op.name!r} was already called")
            if called is not False:
                raise RuntimeError(
                    f"on_complete() for {op.name!r} came after its function raised "
                    f"{summary(called)}: the operation failed with that exception"
                )
            token._called = True
        if exc is None:
            self._finish(op, _DONE, None, None)
        elif isinstance(exc, asyncio.CancelledError):
            self._finish(op, _CANCELLED, _cancel_message(exc), None)
        else:
            self._finish(op, _FAILED, None, exc)

    def _report(self, message: str, exc: BaseException) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            context = {"message": message, "exception": exc}
            if _get_ident() == self._loop_thread:
                loop.call_exception_handler(context)
            else:
                loop.call_soon_threadsafe(loop.call_exception_handler, context)
        else:
            logger.error(message, exc_info=exc)

    # -- finishing ---------------------------------------------------------------------

    def _finish(
        self, op: Operation[Any], state: OpState, result: object, exc: BaseException | None
    ) -> None:
        """Record ``op``'s outcome, release its Vars, dispatch what became ready."""
        if state is _FAILED and isinstance(exc, asyncio.CancelledError):
            # The function ended itself with CancelledError: the operation reports
            # cancelled, with that error's message (as a task's does).
            state, result, exc = _CANCELLED, _cancel_message(exc), None
        ready: list[Any] = []
        self._lock_acquire()
        try:
            if state is _DONE:
                self._done_locked(op, result, ready)
            else:
                self._finish_locked(op, state, result, exc, ready)
            todo = self._settle(ready) if ready else ready
        finally:
            self._lock_release()
        if todo:
            self._submit(todo)

    def _finish_and_continue(self, op: Operation[Any], result: object) -> Operation[Any] | None:
        """:meth:`_finish` a sync ``op`` that returned; start its successor on this thread.

        On a worker, the successor is an operation of the same pool that this completion
        made ready, else the best one queued on the pool; with a failure recorded the start
        must check for skips, so none is claimed then. On the loop thread it is the best one
        of the loop queue (:meth:`_claim_loop_op_locked`, which checks for skips). It is
        marked RUNNING in the same critical section as ``op``'s completion (one lock round
        trip per operation, not two) and the caller runs it on its own thread: READY and in
        no queue (or just taken from one), nobody else can.
        """
        target = op._target
        ready: list[Any] = []
        nxt = None
        self._lock_acquire()
        try:
            self._done_locked(op, result, ready)
            if (
                target is None
                and len(ready) == 1
                and self._loop_head == len(self._loop_fifo)  # the loop queue is empty
                and not self._loop_heap
                and not self._failures
                and self._gpu is None
            ):
                only: Operation[Any] = ready[0]
                if only._target is None and only._kind != _WAIT:
                    # The one operation made ready runs on the loop too and nothing else
                    # waits there: it is the best of the loop queue without going through it.
                    # (_settle's other checks do not apply: no failure to inherit, no GPU
                    # fence to wait for, and a wait marker is not run but completed.)
                    only._state = _RUNNING
                    return only
            todo = self._settle(ready) if ready else ready
            if target is None:
                nxt = self._claim_loop_op_locked(todo)
            # Abandoned (interpreter exit): this worker must return to its pool and stop.
            elif not self._failures and not target.abandoned:
                for i, candidate in enumerate(todo):
                    if candidate._target is target:
                        nxt = todo.pop(i)
                        break
                else:
                    while (nxt := target.take()) is not None and nxt._state is not _READY:
                        pass  # cancelled while queued: its queue entry is dropped
                if nxt is not None:
                    nxt._state = _RUNNING
        finally:
            self._lock_release()
        if nxt is None or target is None:
            if todo:
                self._submit(todo)  # a worker returns to its pool and pops one of them
            return nxt
        if todo:
            # This worker goes on with nxt: wake others for every operation queued here.
            for other in todo:
                if other._target is target:
                    if not target.submit(other, other._key, False):
                        self._not_submitted(other)
                else:
                    self._submit_one(other._target, other)
            target.wake(caller_pops=False)
        return nxt

    def _done_locked(self, op: Operation[Any], result: object, ready: list[Any]) -> None:
        """:meth:`_finish_locked` for an operation whose function returned ``result`` (lock
        held): every operation's path, so the release is inlined unless a failure is to be
        recorded (an input's, inherited by a NO_SKIP operation)."""
        op._state = _DONE
        op._result = result
        if op._inherited is None:
            release_all(op._vars, op._nreads, ready, True)
            if self._sequencer is not None:
                self._sequencer._release(True, ready, True)
            op._fn = None
        else:
            self._release_locked(op, _DONE, None, ready)
        self._complete_locked(op, _DONE)

    def _finish_locked(
        self,
        op: Operation[Any],
        state: OpState,
        result: object,
        exc: BaseException | None,
        ready: list[Any],
        box: _Failure | None = None,
    ) -> None:
        """The bookkeeping of :meth:`_finish` (lock held; no user code runs here).

        ``box``: the failure record to share, for a failure that many operations have in
        common (a failed GPU); by default a FAILED state records a new one.
        """
        op._state = state
        op._result = result
        op._exception = exc
        self._release_locked(op, state, exc, ready, box)
        self._complete_locked(op, state)

    def _release_locked(
        self,
        op: Operation[Any],
        state: OpState,
        exc: BaseException | None,
        ready: list[Any],
        box: _Failure | None = None,
    ) -> None:
        """Record ``op``'s failure on what it mutates and release its Vars (lock held).

        A GPU operation does this once enqueued and completes later (:meth:`_complete_locked`).
        :meth:`_done_locked` inlines the common case (a successful operation with no failure
        to record).
        """
        if state is not _CANCELLED:
            if box is None:
                box = op._inherited
                if state is _FAILED:
                    assert exc is not None
                    box = _Failure(exc)
                    self._failures[box] = None
            if box is not None:
                for v in op._mutate:
                    v._failure = box
        if op._segment is not None:
            # A bulk segment's member: the segment holds its Vars and releases them after its
            # last member; the member counts its own writes (Var.version).
            if state is not _CANCELLED:
                for v in op._mutate:
                    v._version += 1
            op._fn = None
            op._inherited = None
            return
        completed = state is not _CANCELLED and op._kind != _WAIT
        if op._wait:  # cancelled before its turn on some Vars: see _withdraw_locked
            self._withdraw_locked(op, completed, ready)
        else:
            release_all(op._vars, op._nreads, ready, completed)
            if self._sequencer is not None and op._kind != _WAIT:
                self._sequencer._release(True, ready, completed)
        op._fn = None
        op._inherited = None

    def _withdraw_locked(self, op: Operation[Any], completed: bool, ready: list[Any]) -> None:
        """Release the granted requests of an operation cancelled before all its Vars'
        turns came; its other requests become tombstones (``op`` is CANCELLED already)."""
        assert op._state is _CANCELLED, op
        for write, vars_ in ((False, op._const), (True, op._mutate)):
            for v in vars_:
                if v._holds(op):
                    v._release(write, ready, completed)
                else:
                    v._withdraw(ready)
        sequencer = self._sequencer
        if sequencer is not None and op._kind != _WAIT:
            if sequencer._holds(op):
                sequencer._release(True, ready, completed)
            else:
                sequencer._withdraw(ready)
        op._wait = 0

    def _complete_locked(self, op: Operation[Any], state: OpState) -> None:
        """Make ``op`` final: counters, ``wait_for_all``, awaiters and callbacks (lock held)."""
        if self._instruments and op._kind < _WAIT:
            self._notify_locked("on_finish", op)
        if _COMPILED:  # back in the cycle collector, with its Var tuple (collector.py)
            _show(op)  # noqa: F821  (engine.pxd: compiled only)
        # A finished operation keeps no Var alive (its failure's traceback may keep it).
        op._vars = ()
        op._nreads = 0
        if op._kind < _WAIT:
            del self._live[op._seq]
            self._finished[op._target][state] += 1  # statistics()
            if self._capacity_waiters:
                if _get_ident() == self._loop_thread:
                    self._wake_capacity_waiters()
                else:
                    self._capacity_due = True
                    self._post()
            if not self._live and self._idle_waiters:
                if _get_ident() == self._loop_thread:
                    self._wake_idle_waiters()
                else:
                    self._idle_due = True
                    self._post()
        if op._waiters is not None or op._callbacks is not None:
            if _get_ident() == self._loop_thread:
                self._wake(op)
            else:
                self._inbox.append(op)
                self._post()

    def _show_live(self) -> None:
        """Show the cycle collector every live operation again (collector.py).

        Called before a full collection, on whichever thread collects, which may hold the
        lock: so it takes none. It runs no Python code, so no other thread runs meanwhile.
        """
        if _COMPILED:
            for op in list(self._live.values()):
                _show(op)  # noqa: F821  (engine.pxd: compiled only)

    def _post(self) -> None:
        """Make sure a ``_drain_inbox`` is scheduled on the loop (lock held)."""
        if not self._inbox_scheduled:
            self._inbox_scheduled = True
            self._call_soon(self._drain_inbox)

    def _drain_inbox(self) -> None:
        with self._lock:
            ops = self._inbox
            self._inbox = []
            idle = self._idle_due
            self._idle_due = False
            if self._capacity_due:
                self._capacity_due = False
                self._wake_capacity_waiters()
            self._inbox_scheduled = False
            for op in ops:
                self._wake(op)
            if idle and not self._live:
                self._wake_idle_waiters()

    def _wake(self, op: Operation[Any]) -> None:
        """Schedule ``op``'s callbacks, then resolve its awaiters (loop thread, lock held).

        In that order, so that a callback added before ``await op`` has run when the await
        returns, as with an asyncio.Future (resolving a waiter schedules its task's step).
        """
        callbacks = op._callbacks
        if callbacks is not None:
            op._callbacks = None
            loop = self._loop
            assert loop is not None
            for fn, context in callbacks:
                loop.call_soon(fn, op, context=context)
        waiters = op._waiters
        if waiters is not None:
            op._waiters = None
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def _wake_capacity_waiters(self) -> None:
        """Wake every push_*_wait caller; each re-checks the bound (loop thread, lock held)."""
        limit = self._settings.max_pending
        if limit is not None and len(self._live) >= limit:
            return
        waiters = self._capacity_waiters
        self._capacity_waiters = []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _wake_idle_waiters(self) -> None:
        waiters = self._idle_waiters
        self._idle_waiters = []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # -- cancelling and callbacks ------------------------------------------------------

    def _cancel(self, op: Operation[Any], msg: object) -> bool:
        self._check_fork()  # the parent's operations cannot be cancelled in a forked child
        ready: list[Any] = []
        with self._lock:
            state = op._state
            if state >= _DONE:
                return False
            if state is not _RUNNING:  # the message is kept in _result (result() raises it)
                if op._prop is FnProperty.DELETE_VAR:
                    for v in op._mutate:  # (finishing forgets them)
                        if v._deleted is op:
                            v._deleted = False  # a deletion cancelled did not happen
                self._finish_locked(op, _CANCELLED, msg, None, ready)
                todo = self._settle(ready) if ready else ready
            elif op._kind != _CORO:
                return False  # a running thread cannot be interrupted
            else:
                todo = None
        if todo is not None:
            if todo:
                self._submit(todo)
            return True
        # A running coroutine: cancel its task on the loop thread.
        loop = self._loop
        assert loop is not None
        if _get_ident() == self._loop_thread:
            task = op._task
            return task.cancel(msg) if task is not None else False
        if loop.is_closed():
            return False
        loop.call_soon_threadsafe(self._cancel_task, op, msg)
        return True

    def _cancel_task(self, op: Operation[Any], msg: object) -> None:
        task = op._task
        if task is not None:
            task.cancel(msg)

    def _add_done_callback(
        self,
        op: Operation[Any],
        fn: Callable[[Operation[Any]], object],
        context: contextvars.Context,
    ) -> None:
        loop = self._loop
        if loop is None:
            loop = self._require_loop()
        with self._lock:
            if op._state < _DONE:
                if op._callbacks is None:
                    op._callbacks = []
                op._callbacks.append((fn, context))
                return
            if op._callbacks is not None:
                # Finished off the loop, its callbacks not scheduled yet (_drain_inbox will):
                # this one goes after them, in the order they were added.
                op._callbacks.append((fn, context))
                return
        if _get_ident() == self._loop_thread:
            loop.call_soon(fn, op, context=context)
        else:
            loop.call_soon_threadsafe(fn, op, context=context)

    def _remove_done_callback(
        self, op: Operation[Any], fn: Callable[[Operation[Any]], object]
    ) -> int:
        with self._lock:
            callbacks = op._callbacks
            if not callbacks or op._state >= _DONE:
                return 0  # none, or due already: as asyncio.Future's, they will run
            kept = [(f, c) for f, c in callbacks if f != fn]
            op._callbacks = kept or None
            return len(callbacks) - len(kept)

    def _op_waiter(self, op: Operation[Any]) -> asyncio.Future[None] | None:
        """A loop future resolved when ``op`` finishes; None if it already has."""
        loop = self._bind()
        if loop is None or _get_running_loop() is not loop:
            raise RuntimeError(f"await {op!r} from a coroutine on the engine's event loop")
        if op._segment is not None and op._segment is self._segment:
            self._flush_segment()  # do not wait for the loop's next iteration to queue it
        current = self._running_op()
        if current is not None and op._seq >= current._seq:
            self._check_await_inside(current, op)
        fut = loop.create_future()
        with self._lock:
            if op._state >= _DONE:
                return None
            if op._waiters is None:
                op._waiters = []
            op._waiters.append(fut)
        return fut

    def _check_await_inside(self, current: Operation[Any], op: Operation[Any]) -> None:
        """Refuse an await of ``op`` inside coroutine operation ``current`` (pushed no later
        than ``op``) that could only deadlock: ``op`` waits for ``current`` to finish."""
        if op is current:
            raise RuntimeError(f"{current.name!r} awaits itself: this would deadlock")
        # A bulk segment's member waits for what its segment waits for, on all its Vars.
        waits = op if op._segment is None else op._segment
        if self._settings.serial:
            raise RuntimeError(
                f"{current.name!r} awaits {op.name!r}, which serial mode runs only after it: "
                "this would deadlock; await it outside the operation"
            )
        # Pushed later and in conflict on a Var that current holds: queued behind it there.
        held_writes = current._mutate
        for v in waits._mutate:
            if v in held_writes or v in current._const:
                break
        else:
            for v in waits._const:
                if v in held_writes:
                    break
            else:
                # Or queued behind an operation queued behind current, on other Vars.
                with self._lock:
                    if waits._state is not _PENDING or waits not in queued_behind(current, waits):
                        return
                raise RuntimeError(
                    f"{current.name!r} awaits {op.name!r}, which was pushed after it and waits "
                    "for it through the operations queued behind it: this would deadlock; "
                    "await it outside the operation"
                )
        raise RuntimeError(
            f"{current.name!r} awaits {op.name!r}, which was pushed after it and waits for it "
            f"on {v.name!r}: this would deadlock; await it outside the operation"
        )

    def _discard_op_waiter(self, op: Operation[Any], fut: asyncio.Future[None]) -> None:
        with self._lock:
            if op._waiters is not None and fut in op._waiters:
                op._waiters.remove(fut)

    # -- waiting -----------------------------------------------------------------------

    def _running_op(self) -> Operation[Any] | None:
        """The running coroutine operation of this engine the caller is inside, if any."""
        ref = current_op.get()
        current = ref() if ref is not None else None
        if current is None or current._engine is not self or current._state is not _RUNNING:
            return None
        return current

    async def wait_for_var(self, var: Var, *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until every operation pushed so far that reads or mutates ``var`` finished.

        Then, if ``var`` carried a failure at that point, raise it and clear it everywhere
        (the same exception is cleared from every Var carrying it and from the engine's
        record; operations pushed afterwards run normally). A failure recorded by an
        operation pushed after this call is left for a later wait. Returns without yielding
        when ``var`` is idle. Cancelling the wait (or the timeout) leaves the engine unchanged.

        Raises:
            TimeoutError: if ``timeout`` seconds pass first.
            VarDeletedError: if ``var`` was deleted.
        """
        loop = self._require_loop()
        _check_timeout(timeout)
        if type(var) is not Var:
            raise TypeError(f"var must be an aioengine.Var, got {var!r}")
        if var._owner is not self:
            raise ValueError(f"{var!r} belongs to another Engine")
        if self._state is _State.CLOSED:
            raise EngineClosedError(f"{self!r} is closed; create a new Engine")
        current = self._running_op()
        marker: Operation[None] | None = None
        failure: BaseException | None = None
        with self._lock:
            if var._deleted:
                raise VarDeletedError(f"{var!r} was deleted; nothing to wait for")
            if self._segment is not None:
                self._flush_segment_locked()  # its members may use var: the marker goes behind
            if current is not None and (
                var in current._const
                or var in current._mutate
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
                    if other is not current and (var in other._const or var in other._mutate)
                ]
                if stuck:
                    first = min(stuck, key=_push_order)
                    raise RuntimeError(
                        f"wait_for_var({var.name!r}) inside operation {current.name!r} would "
                        f"wait for {first.name!r}, which is queued behind that operation: "
                        "this would deadlock; wait outside the operation"
                    )
            todo: list[Operation[Any]] = []
            if not var._is_idle() or (self._gpu is not None and has_pending(var)):
                marker = new_operation(
                    self, None, _WAIT, _CPU0, (), (var,), _NORMAL, 0, f"wait_for_var({var.name})"
                )
                fut: asyncio.Future[None] = loop.create_future()
                marker._waiters = [fut]
                self._seq += 1  # a marker's request takes its place in the queue's push order
                marker._seq = marker._key = self._seq
                if var._append(marker, True):
                    # Idle, but GPU work on it may be pending: _settle waits for its fences.
                    todo = self._settle([marker])
                else:
                    marker._wait = 1
            else:
                # Idle: its failure is the wait's now, in this critical section; once the lock
                # is released, an operation pushed from another thread may run and fail on it.
                failure = self._take_failure_locked(var, var._failure)
        if todo:
            self._submit(todo)
        if marker is not None:
            try:
                async with asyncio.timeout(timeout):
                    await fut
            except BaseException as exc:
                self._cancel_marker(marker)
                if isinstance(exc, TimeoutError):
                    raise TimeoutError(
                        f"wait_for_var({var!r}) timed out after {timeout} s; "
                        f"{self._describe_var(var)}"
                    ) from None
                raise
            with self._lock:
                failure = self._take_failure_locked(var, marker._result)  # see _settle
        if failure is not None:
            raise failure

    def _take_failure_locked(self, var: Var, box: _Failure | None) -> BaseException | None:
        """Claim the exception of ``box``, the failure ``var`` carried at a wait's turn, and
        clear it everywhere (lock held): under the lock, so two waits never both throw it.
        ``var`` keeps a later operation's failure that replaced ``box``."""
        if box is None:
            return None
        if var._failure is box:
            var._failure = None
        self._failures.pop(box, None)
        exc, box.exc = box.exc, None
        return exc

    def _describe_var(self, var: Var) -> str:
        """The part of :meth:`dump` about ``var`` and what its users wait behind."""
        return f"why it is busy:\n{_dump.describe_var(self, var)}"

    def _cancel_marker(self, marker: Operation[None]) -> None:
        ready: list[Any] = []
        with self._lock:
            if marker._state < _DONE:
                self._finish_locked(marker, _CANCELLED, None, None, ready)
            todo = self._settle(ready) if ready else ready
        if todo:
            self._submit(todo)

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
        notebook-aware, with ``pip install 'aioengine[progress]'``; a text line otherwise).

        Raises:
            ExceptionGroup: of every failure recorded and not yet thrown (by this or by
                :meth:`wait_for_var`), in the order they happened.
            TimeoutError: if ``timeout`` seconds pass first (failures stay recorded).
        """
        self._require_loop()
        _check_timeout(timeout)
        if self._state is _State.CLOSED:
            raise EngineClosedError(f"{self!r} is closed; create a new Engine")
        current = self._running_op()
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
                f"wait_for_all() timed out after {timeout} s with {len(self._live)} "
                f"operation(s) pending:\n{_dump.describe_all(self)}"
            ) from None
        errors = self._take_failures()
        if errors:
            raise BaseExceptionGroup("unhandled errors in aioengine.Engine", errors)

    async def _drained(self, timeout: float | None) -> None:  # noqa: ASYNC109
        loop = self._require_loop()
        self._flush_segment()
        async with asyncio.timeout(timeout):
            while True:
                with self._lock:
                    if not self._live:
                        return
                    fut: asyncio.Future[None] = loop.create_future()
                    self._idle_waiters.append(fut)
                try:
                    await fut
                except BaseException:
                    with self._lock:
                        if fut in self._idle_waiters:
                            self._idle_waiters.remove(fut)
                    raise

    def _take_failures(self) -> list[BaseException]:
        with self._lock:
            boxes = list(self._failures)
            self._failures.clear()
            errors = []
            for box in boxes:
                if box.exc is not None:
                    errors.append(box.exc)
                    box.exc = None
        return errors

    # -- observability (thin delegations to trace.py, graph.py, dump.py, stats.py) --------

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
        _trace.start_trace(self)

    def stop_trace(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """Stop the trace; return its Chrome trace-event JSON object, also written to ``path``.

        Operations still running are closed at this moment with the outcome
        ``"unfinished (trace stopped)"``. The file is written on the calling thread; on the
        event loop, ``async with engine.trace(path):`` writes it on a worker thread instead.

        Raises:
            RuntimeError: if no trace is running.
        """
        return _trace.stop_trace(self, path)

    def record_history(self, n: int = 1000) -> None:
        """Record push sites, times and dependencies, and keep the newest ``n`` finished ops.

        From this call on, :meth:`graph` also shows recently finished operations, and
        :meth:`dump` shows push sites (``file:line``) and how long each operation has waited;
        :meth:`statistics` measures busy time. Costs a short frame walk per push. Calling it
        again resizes the history. ``Engine(watchdog=...)`` turns it on with ``n=1000``.
        """
        if type(n) is not int or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        Recorder.ensure(self, n)

    def graph(self) -> _graph.Graph:
        """The dependency graph of pending (and, with :meth:`record_history`, recent) ops.

        Edges run from an operation to the ones that waited for it, labelled with the Var.
        Render it with ``to_dot()`` / ``to_mermaid()``; notebooks display it inline.
        """
        self._flush_segment()
        return _graph.build_graph(self)

    def dump(self) -> _dump.Dump:
        """A snapshot of every busy Var's queue and every pending operation; ``print()`` it.

        Shows which operations hold each Var and which wait for it, the await stacks of
        suspended coroutine operations, and flags callback-style operations that have not
        called ``on_complete()``. Safe from any thread. If the engine's lock stays busy for
        2 s (a ``signal.signal()`` handler that interrupted the engine inside it), the dump
        is empty and its ``note`` says why.
        """
        return _dump.build_dump(self)  # it closes the open bulk segment, as a wait does

    def statistics(self) -> EngineStatistics:
        """Counts of operations by state, in total and per pool (a frozen dataclass)."""
        return build_statistics(self)

    # -- the ergonomic layer (thin delegations to ergonomic.py; the push path is unchanged) --

    @overload
    def submit(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        /,
        *args: Any,
        reads: Iterable[Var] = ...,
        writes: Iterable[Var] = ...,
        out: Var | Sequence[Var] | None = ...,
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

        Raises:
            EngineError: ``VarDeletedError``, ``EngineClosedError`` or
                ``DeviceUnavailableError``, as :meth:`push_sync` (and ``TypeError`` /
                ``ValueError`` for bad arguments).
        """
        return _ergonomic.submit(
            self, fn, args, kwargs, reads, writes, out, ctx, prop, priority, name
        )

    @overload
    def op(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        /,
        *,
        const_vars: Iterable[Var] = ...,
        mutate_vars: Iterable[Var] = ...,
        out: Var | Sequence[Var] | None = ...,
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
        ctx: Context = ...,
        prop: FnProperty = ...,
        priority: int = ...,
        name: str | None = ...,
    ) -> _OpDecorator: ...

    def op(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        const_vars: Iterable[Var] = (),
        mutate_vars: Iterable[Var] = (),
        out: Var | Sequence[Var] | None = None,
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
        the options are the decorator's.
        """
        return _ergonomic.op(self, fn, const_vars, mutate_vars, out, ctx, prop, priority, name)
