"""Operations: one pushed function, its Vars, and the awaitable handle on its outcome.

An :class:`Operation` is what ``push_sync`` / ``push_async`` / ``push`` return. It follows
:class:`asyncio.Future`'s interface (``done``, ``result``, ``exception``, ``cancel``,
``cancelled``, ``add_done_callback``) and is awaitable. Internally it is also the engine's
per-push record (MXNet's ``OprBlock``): its counter of ungranted Var requests and its state.

Life of an operation (``OpState``)::

    PENDING --all Var requests granted--> READY --an executor starts it--> RUNNING
       |                                    |                                |
       +--cancel()--> CANCELLED <--cancel()-+           DONE / FAILED / CANCELLED (coroutines)
                                            +--an input carries a failure--> SKIPPED

A host consumer of GPU data stays PENDING after its turn until the GPU fences on its Vars have
completed; a GPU operation stays RUNNING after its enqueue until its own fence has (fence.py).

Every field below ``name`` is guarded by the owning engine's lock; the only fields read without
it are ``_state`` (a single reference read, for ``done()``) and the immutable ones.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Generator
from contextvars import copy_context
from types import CoroutineType, FunctionType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .cancellation import cancel
from .errors import report, summary
from .kinds import FnProperty, OpState
from .var import (
    COMMUTE,
    CONCURRENT,
    MODE_NAMES,
    NO_VALUE,
    WRITE,
    give,
    no_value_error,
    queued_behind,
)

if TYPE_CHECKING:
    from .context import Context, RunContext
    from .scheduler import Scheduler
    from .var import Failure, Var

__all__ = ("Call", "FnProperty", "OnComplete", "OpState", "Operation", "OprHandle")

T = TypeVar("T")


async def _probe() -> None:
    """Never awaited: only the type of its coroutine object is wanted (below)."""


def _coroutine_types() -> frozenset[type]:
    coro = _probe()
    kind = type(coro)
    coro.close()
    return frozenset({CoroutineType, kind})


# What a sync function that should have been ``async def`` returns: a Python coroutine, or
# one of aioengine's own (``engine.wait_for_all()``, say), a Cython coroutine in the
# compiled core (setup.py). A set lookup, since every sync operation's result is checked.
_COROUTINE_TYPES = _coroutine_types()
# Compiled by Cython (setup.py), whose functions are not Python functions: Call.show's test.
_COMPILED = type(_probe) is not FunctionType
# A C function of the compiled core (operation.pxd), bound there; declared for type checkers.
_show_call: Callable[[Call], None]

# The states read on every operation's path, bound once: an attribute of an Enum class is
# looked up through its metaclass each time.
_get_ident = threading.get_ident
_PENDING = OpState.PENDING
_DONE = OpState.DONE
_CANCELLED = OpState.CANCELLED


class _OperationCore:
    """An operation's fields: the per-push record that the engine's hot path reads and writes.

    :class:`Operation` adds the Future interface. The split exists for the compiled core
    (``operation.pxd``): there this class is an extension type whose fields the compiled
    engine reads as C struct members, and an extension type cannot also derive from
    ``Generic``. Interpreted, it is an ordinary base class with the same ``__slots__``.

    The fields without an underscore are public to read, as distributed's ``TaskState``'s are:
    observers, the GPU and remote collaborators and tests read them; only the core's modules
    write them. ``_state``, ``_result`` and ``_exception`` stay private: users read them
    through ``state``, ``result()`` and ``exception()``.

    Its fields, documented once, here (:func:`new_operation` sets every one; all but ``name``
    and the immutable ones are guarded by the engine lock, except ``_state``, read unlocked
    by ``done()``, and ``task``, the loop thread's):

    - ``name``: the operation's name (the function's qualified name by default).
    - ``core``: the scheduler of its engine.
    - ``owner``: the façade that pushed it (an :class:`~aioengine.Engine`): an engine with
      live operations stays alive; its finalizer takes no lock.
    - ``fn``: the function; dropped when the operation finishes, so its closure is freed.
    - ``kind``: how it runs (``kinds.py``: sync, coroutine, callback-style, a wait marker,
      a bulk segment).
    - ``ctx``: the device context it runs on (``cpu(i)``, ``gpu(i)``, ``remote()``).
    - ``vars``: its reads, then its writes, deduplicated, in one tuple (one object for the
      garbage collector to walk; with both, its own tuple, which the compiled core hides
      from the collector with it: ``collector.pxd``); emptied when it completes.
    - ``nreads``: how many of ``vars`` are reads.
    - ``modes``: the modes of the Vars after the reads (``var.py``: WRITE, COMMUTE,
      CONCURRENT) when some is not a write, or (all WRITE) once a start inherited a failure;
      None otherwise: the finish's fast path is one test.
    - ``prop``: its :class:`FnProperty`; ``priority``: its priority (an int).
    - ``seq``: its push sequence number, the order of its requests in every Var's queue;
      ``key``: its run-queue order, smaller first (higher priority, then push order),
      unique in its engine. Both set by the push, under the lock.
    - ``target``: the executor that runs it; None: the event loop's thread.
    - ``nwait``: its ungranted Var requests (-1: parked for a commute token); ``nfwait``: the
      GPU fences this host consumer waits to see completed (``fence.py``).
    - ``_state``: its :class:`OpState`; ``_result``, ``_exception``: its outcome (a
      cancelled operation keeps its message in ``_result``).
    - ``inherited``: the failure it took from an input at start (``Failure``), if any.
    - ``waiters``: one loop future per awaiter; ``callbacks``: (callback, context) pairs.
    - ``task``: the task of a coroutine operation, or of a remote operation's wait.
    - ``snapshot``: the pusher's ``contextvars`` context, in which its function runs (not
      ``ctx``, the device).
    - ``segment``: the bulk segment that holds its Vars and runs it (``bulk.py``); such a
      member is in no Var's queue itself.
    """

    __slots__ = (
        "__weakref__",
        "_exception",
        "_result",
        "_state",
        "callbacks",
        "core",
        "ctx",
        "fn",
        "inherited",
        "key",
        "kind",
        "modes",
        "name",
        "nfwait",
        "nreads",
        "nwait",
        "owner",
        "priority",
        "prop",
        "segment",
        "seq",
        "snapshot",
        "target",
        "task",
        "vars",
        "waiters",
    )
    # The fields' types, for type checkers; new_operation() sets every one of them.
    name: str
    core: Scheduler
    owner: object
    fn: Callable[..., Any] | None
    kind: int
    ctx: Context
    vars: tuple[Var, ...]
    nreads: int
    modes: tuple[int, ...] | None
    prop: FnProperty
    priority: int
    seq: int
    key: int
    target: Any
    nwait: int
    nfwait: int
    _state: OpState
    _result: Any
    _exception: BaseException | None
    inherited: Failure | None
    waiters: list[asyncio.Future[None]] | None
    callbacks: list[tuple[Callable[[Operation[Any]], object], contextvars.Context]] | None
    task: asyncio.Task[Any] | None
    snapshot: contextvars.Context
    segment: Operation[Any] | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(
            f"{type(self).__name__} cannot be created directly: push a function to an "
            "Engine (push_sync, push_async, push), which returns its Operation"
        )

    @property
    def const_vars(self) -> tuple[Var, ...]:
        """The Vars it reads: the first ``nreads`` of ``vars`` (a copy, for the cold paths)."""
        return self.vars[: self.nreads]

    @property
    def mutate_vars(self) -> tuple[Var, ...]:
        """The Vars it mutates: the rest of ``vars`` (a copy, for the cold paths). Commute
        and concurrent Vars count: they are written, in an order the engine chooses."""
        return self.vars[self.nreads :]

    def accesses(self) -> list[tuple[Var, str]]:
        """Each of its Vars with the name of its mode (``"read"``, ``"write"``,
        ``"commute"``, ``"concurrent"``), in ``vars`` order (for observers)."""
        nreads = self.nreads
        out = [(v, "read") for v in self.vars[:nreads]]
        modes = self.modes
        for i, v in enumerate(self.vars[nreads:]):
            out.append((v, "write" if modes is None else MODE_NAMES[modes[i]]))
        return out


class Call:
    """The function of a local value operation, made for one push alone (``submit``'s record:
    ``ergonomic.LocalCall`` derives from it): calls ``fn(*args, **kwargs)`` with the Vars
    among the arguments replaced by the values they carry, and gives the result to ``out``.

    Here in the core, so that the compiled build runs every submit's call as C, as it runs
    the push. While its operation is pending, the compiled core keeps it and its ``args``
    tuple out of the cycle collector with the operation (``collector.pxd``): thousands of
    pending submits then cost the collector nothing, as thousands of ``push_sync`` do. The
    core recognises a *direct* subclass (one pointer compare per push). A call begins with
    :meth:`show`: from then on a failure's traceback may keep the record, and it must be back
    in the collector (Python has no call that untracks an object: the pure-Python core hides
    nothing, and ``show`` does nothing there).

    Attributes:
        fn: the user's function; args, kwargs: its arguments, Vars included.
        positions: the indices of the Var arguments in ``args``; keys: the names of the Var
            keyword arguments (both empty tuples when there are none).
        out: the ``out`` Var, a tuple of them (the result is unpacked into them), or None.
    """

    __slots__ = ("args", "fn", "keys", "kwargs", "out", "positions")
    args: tuple[Any, ...]

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        positions: tuple[int, ...],
        keys: tuple[str, ...],
        out: Var | tuple[Var, ...] | None,
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.positions = positions
        self.keys = keys
        self.out = out

    def show(self) -> None:
        """Put the record and its ``args`` back in the cycle collector (compiled core)."""
        if _COMPILED:
            _show_call(self)  # noqa: F821  (operation.pxd: compiled only)

    def bind(self) -> tuple[Any, dict[str, Any]]:
        """The arguments with each Var replaced by its value (the operation holds its turn)."""
        args: Any = self.args
        if self.positions:
            args = list(args)
            for i in self.positions:
                args[i] = _value_of(args[i])
        return args, self.bind_kwargs()

    def bind_kwargs(self) -> dict[str, Any]:
        """The keyword arguments with each Var replaced by its value."""
        kwargs = self.kwargs
        if self.keys:
            kwargs = dict(kwargs)
            for key in self.keys:
                kwargs[key] = _value_of(kwargs[key])
        return kwargs

    def __call__(self, rctx: RunContext) -> Any:
        self.show()  # back in the collector: a failure's traceback may keep it from now on
        # bind(), written out: every submit's path.
        args: Any = self.args
        positions = self.positions
        if positions:
            args = list(args)
            for i in positions:
                args[i] = _value_of(args[i])
        result = self.fn(*args, **self.bind_kwargs()) if self.kwargs else self.fn(*args)
        # A coroutine: a forgotten ``async def``, which fails the operation (the engine says
        # so); a failed operation leaves its out Vars as they were.
        out = self.out
        if out is not None and type(result) not in _COROUTINE_TYPES:
            give(out, result)
        return result


def _value_of(var: Var) -> Any:
    """The value ``var`` carries (ValueError if none)."""
    value = var._value
    if value is NO_VALUE:
        raise no_value_error(var)
    return value


class Operation(_OperationCore, Generic[T]):
    """One pushed function: an awaitable handle on its outcome.

    ``await op`` returns the function's return value or raises its exception (a skipped
    operation raises :class:`~aioengine.DependencyError`, a cancelled one
    :class:`asyncio.CancelledError`). Cancelling the task that awaits an operation stops the
    wait only; call :meth:`cancel` to cancel the operation itself.

    Attributes:
        name: the name given at push, or the function's ``__qualname__``.
        seq: its push sequence number: operations that share a written Var run in its order.
        ctx: the device context it runs on.
        const_vars, mutate_vars: the Vars it reads, and those it mutates (deduplicated).

    The engine's other fields on it (documented on ``_OperationCore``) can be read, to
    inspect it; only the engine writes them.
    """

    __slots__ = ()

    # -- asyncio.Future's interface ------------------------------------------------------

    @property
    def state(self) -> OpState:
        """Where the operation is in its life (a snapshot)."""
        return self._state

    def done(self) -> bool:
        """Return True once the operation finished: done, failed, skipped or cancelled."""
        return self._state >= _DONE

    def cancelled(self) -> bool:
        """Return True if the operation was cancelled."""
        return self._state is _CANCELLED

    def cancel(self, msg: object = None) -> bool:
        """Cancel the operation if it can still be cancelled; return whether it will be.

        An operation that has not started is cancelled at once: its function never runs, its
        Vars are released and no failure is recorded. A running coroutine operation receives
        :class:`asyncio.CancelledError` at its current ``await`` (its Vars are released when it
        ends). A running sync or callback-style operation cannot be cancelled: this returns
        False and its Vars are released only when it has finished. A remote value operation,
        running once submitted to Dask, can be until a later operation was given its result:
        its Vars get back the values they had before it. Safe to call from any thread.
        ``msg`` becomes the message of the :class:`asyncio.CancelledError` that ``await``,
        :meth:`result` and :meth:`exception` raise, as for :meth:`asyncio.Future.cancel`.
        """
        return cancel(self.core, self, msg)

    def run_here(self) -> bool:
        """Run the operation now, on the calling thread, if it waits in a CPU thread pool's
        queue for a worker, or (called on the engine's event-loop thread) in the loop's queue
        of inline operations; return whether it did.

        For a caller about to wait for this operation anyway: a coroutine on the engine's
        event loop, or a thread of your own about to block on it. It saves the two thread
        hand-offs (to a worker, and back to the waiter), tens to hundreds of microseconds each
        on a busy machine. The rule is unchanged: a queued operation has its turn on every
        Var already, and it runs, finishes and releases them exactly as on a worker (its
        function runs on the calling thread, which it holds meanwhile). An inline operation
        (``FnProperty.ASYNC``, serial mode) runs on the loop's thread anyway: there, this
        runs it before the loop's next run of its queue. Returns False, changing nothing, if
        the operation is not a synchronous one queued on a CPU pool or for this loop thread
        (it has not become ready, a worker took it, it runs elsewhere, or it ended), or the
        caller is one of the engine's pool threads (an operation); False too if the engine
        skipped it as it started (an input failed: its function never ran). A
        ``KeyboardInterrupt`` or ``SystemExit`` the function raised is recorded as on a worker
        and raised to the caller.
        """
        return bool(self.core.run_here(self))

    def result(self) -> T:
        """Return the function's result, or raise its exception.

        Raises:
            asyncio.InvalidStateError: if the operation has not finished.
            asyncio.CancelledError: if it was cancelled.
        """
        state = self._state
        if state < _DONE:
            raise asyncio.InvalidStateError(f"{self!r} has not finished")
        if state is _CANCELLED:
            raise self._cancelled_error()
        if self._exception is not None:
            raise self._exception
        result: T = self._result
        return result

    def exception(self) -> BaseException | None:
        """Return the exception the operation finished with, or None.

        Raises:
            asyncio.InvalidStateError: if the operation has not finished.
            asyncio.CancelledError: if it was cancelled.
        """
        state = self._state
        if state < _DONE:
            raise asyncio.InvalidStateError(f"{self!r} has not finished")
        if state is _CANCELLED:
            raise self._cancelled_error()
        return self._exception

    def _cancelled_error(self) -> asyncio.CancelledError:
        # The message given to cancel() (kept in _result, as asyncio.Future keeps it).
        msg = self._result
        return asyncio.CancelledError(f"{self!r} was cancelled" if msg is None else msg)

    def add_done_callback(
        self,
        fn: Callable[[Operation[T]], object],
        *,
        context: contextvars.Context | None = None,
    ) -> None:
        """Call ``fn(op)`` on the engine's event loop once the operation has finished.

        As with :meth:`asyncio.Future.add_done_callback`, ``fn`` is scheduled with
        ``loop.call_soon`` (at once if the operation is already done). Safe to call from any
        thread once the engine is bound to its loop.
        """
        if not callable(fn):
            raise TypeError(f"add_done_callback() needs a callable, got {fn!r}")
        if context is None:
            context = copy_context()
        core = self.core
        loop = core.loop
        if loop is None:
            loop = core.require_loop()
        with core.lock:
            if self._state < _DONE:
                if self.callbacks is None:
                    self.callbacks = []
                self.callbacks.append((fn, context))
                return
            if self.callbacks is not None:
                # Finished off the loop, its callbacks not scheduled yet (the inbox will):
                # this one goes after them, in the order they were added.
                self.callbacks.append((fn, context))
                return
        if _get_ident() == core.loop_thread:
            loop.call_soon(fn, self, context=context)
        else:
            loop.call_soon_threadsafe(fn, self, context=context)

    def remove_done_callback(self, fn: Callable[[Operation[T]], object]) -> int:
        """Remove every registration of ``fn``; return how many were removed."""
        with self.core.lock:
            callbacks = self.callbacks
            if not callbacks or self._state >= _DONE:
                return 0  # none, or due already: as asyncio.Future's, they will run
            kept = [(f, c) for f, c in callbacks if f != fn]
            self.callbacks = kept or None
            return len(callbacks) - len(kept)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        """Return the event loop the engine is bound to.

        Raises:
            RuntimeError: if the engine is not bound to a loop yet.
        """
        return self.core.require_loop()

    def __await__(self) -> Generator[Any, None, T]:
        if self._state < _DONE:
            fut = self._waiter()
            if fut is not None:
                try:
                    yield from fut
                except asyncio.CancelledError:
                    with self.core.lock:
                        if self.waiters is not None and fut in self.waiters:
                            self.waiters.remove(fut)
                    raise
        return self.result()

    def _waiter(self) -> asyncio.Future[None] | None:
        """A loop future resolved when this operation finishes; None if it already has."""
        core = self.core
        loop = core._bind()
        if loop is None or asyncio._get_running_loop() is not loop:
            raise RuntimeError(f"await {self!r} from a coroutine on the engine's event loop")
        if self.segment is not None and self.segment is core.segments.open:
            core.segments.flush(core)  # do not wait for the loop's next iteration to queue it
        current = core.running_op()
        if current is not None and self.seq >= current.seq:
            _check_await_inside(core, current, self)
        fut = loop.create_future()
        with core.lock:
            if self._state >= _DONE:
                return None
            if self.waiters is None:
                self.waiters = []
            self.waiters.append(fut)
        return fut

    def __repr__(self) -> str:
        return f"<Operation {self.name!r} {self._state.name.lower()} on {self.ctx!r}>"


class OnComplete:
    """The completion token passed to a callback-style (MXNet ``AsyncFn``) function.

    Call it exactly once, from any thread: ``on_complete()`` completes the operation,
    ``on_complete(exc)`` fails it with ``exc`` (an :class:`asyncio.CancelledError` cancels it
    instead, with that error's message). A second call raises :class:`RuntimeError`.
    """

    __slots__ = ("_called", "_op")

    def __init__(self, op: Operation[Any]) -> None:
        self._op = op
        # Guarded by the engine lock: set once, by the first call (True), or when the
        # function raised before any call (the exception: the operation failed with it).
        self._called: bool | BaseException = False

    def __call__(self, exc: BaseException | None = None) -> None:
        if exc is not None and not isinstance(exc, BaseException):
            raise TypeError(f"on_complete() takes an exception or None, not {exc!r}")
        op = self._op
        core = op.core
        with core.lock:
            called = self._called
            if called is True:
                raise RuntimeError(f"on_complete() for {op.name!r} was already called")
            if called is not False:
                raise RuntimeError(
                    f"on_complete() for {op.name!r} came after its function raised "
                    f"{summary(called)}: the operation failed with that exception"
                )
            self._called = True
        if exc is None:
            core.finish(op, _DONE, None, None)
        elif isinstance(exc, asyncio.CancelledError):  # cancelled, with that error's message
            core.finish(op, _CANCELLED, exc.args[0] if exc.args else None, None)
        else:
            core.finish(op, OpState.FAILED, None, exc)

    def raised(self, exc: BaseException) -> None:
        """The function raised ``exc`` (or returned a coroutine): fail the operation with it,
        unless it called this token already, in which case ``exc`` is reported (to the
        loop's exception handler) since nobody else can receive it."""
        op = self._op
        core = op.core
        with core.lock:
            already = self._called
            if not already:
                self._called = exc
        if not already:
            core.finish(op, OpState.FAILED, None, exc)
            return
        report(
            core.loop,
            core.loop_thread,
            f"{op.name!r} raised after calling on_complete(); the exception is reported here",
            exc,
        )

    def __repr__(self) -> str:
        called = self._called
        state = "pending" if called is False else "called" if called is True else "raised"
        return f"<OnComplete for {self._op.name!r} {state}>"


def _check_await_inside(core: Scheduler, current: Operation[Any], op: Operation[Any]) -> None:
    """Refuse an await of ``op`` inside coroutine operation ``current`` (pushed no later
    than ``op``) that could only deadlock: ``op`` waits for ``current`` to finish."""
    if op is current:
        raise RuntimeError(f"{current.name!r} awaits itself: this would deadlock")
    # A bulk segment's member waits for what its segment waits for, on all its Vars.
    waits = op if op.segment is None else op.segment
    if core.settings.serial:
        raise RuntimeError(
            f"{current.name!r} awaits {op.name!r}, which serial mode runs only after it: "
            "this would deadlock; await it outside the operation"
        )
    # Pushed later and in conflict on a Var that current holds: queued behind it there.
    # Both concurrent on it is no conflict: the later one joins current's running group
    # unless something queued ahead keeps it out (the precise check below).
    held_writes = current.mutate_vars
    for v in waits.mutate_vars:
        if v in current.const_vars or (
            v in held_writes and not (_mode(current, v) == _mode(waits, v) == CONCURRENT)
        ):
            break
    else:
        for v in waits.const_vars:
            if v in held_writes:
                break
        else:
            # Or queued behind an operation queued behind current, on other Vars.
            with core.lock:
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


def _mode(op: Operation[Any], v: Var) -> int:
    """The mode in which ``op`` writes ``v``, one of its ``mutate`` Vars."""
    modes = op.modes
    return WRITE if modes is None else modes[op.vars.index(v) - op.nreads]


def new_operation(
    core: Scheduler,
    owner: object,
    fn: Callable[..., Any] | None,
    kind: int,
    ctx: Context,
    const: tuple[Var, ...],
    mutate: tuple[Var, ...],
    prop: FnProperty,
    priority: int,
    name: str,
    target: Any = None,
) -> Operation[Any]:
    """A new PENDING operation: the engine's one way to make one (every push's path).

    Its fields (documented in :class:`_OperationCore`) are set here, not by a constructor: in
    the compiled core (operation.pxd) ``_OperationCore.__new__`` allocates it and each field
    is a C struct store, with no type call and no argument parsing.
    """
    cls: type[Operation[Any]] = Operation  # typed `type` in the compiled core: its tp_new slot
    op = cls.__new__(cls)  # is called directly, as a C function
    op.name = name
    op.core = core
    op.owner = owner
    op.fn = fn
    op.kind = kind
    op.ctx = ctx
    op.vars = const + mutate if const else mutate
    op.nreads = len(const)
    op.modes = None
    op.prop = prop
    op.priority = priority
    op.seq = 0
    op.key = 0
    op.target = target
    op.nwait = 0
    op.nfwait = 0
    op._state = _PENDING
    op._result = None
    op._exception = None
    op.inherited = None
    op.waiters = None
    op.callbacks = None
    op.task = None
    op.snapshot = copy_context()
    op.segment = None
    return op


# -- the core's API for the GPU collaborator (gpu_sync.py): a host consumer's fence count --


def wait_for_fences_locked(op: Operation[Any], count: int) -> None:
    """Make PENDING ``op``, a host consumer of GPU data whose Var turns are all granted, wait
    for ``count`` (> 0) pending GPU fences to complete before it starts: the GPU
    collaborator's one way to set the count, which :func:`fence_settled_locked` counts down.
    Caller holds the engine lock; the collaborator keeps ``op`` in each fence's waiters."""
    op.nfwait = count


def fence_settled_locked(op: Operation[Any]) -> bool:
    """One of the fences that ``op`` waits for (:func:`wait_for_fences_locked`) settled:
    count it, and return whether ``op`` may start now (it was the last, and ``op`` is still
    PENDING; a cancelled one is not counted). Caller holds the engine lock and, on True,
    hands ``op`` to the scheduler's dispatch (``Scheduler.dispatch_locked``)."""
    if op._state is _PENDING and op.nfwait:
        op.nfwait -= 1
        return not op.nfwait
    return False


class OprHandle(Generic[T]):
    """A pre-built operation (MXNet's ``OprHandle``): validated once, pushed many times.

    Create one with :meth:`Engine.new_operator`, run it with :meth:`Engine.push`, and retire it
    with :meth:`Engine.delete_operator`.

    Attributes:
        name: the operation name every push of this handle carries.
    """

    __slots__ = (
        "_const",
        "_deleted",
        "_engine",
        "_fn",
        "_kind",
        "_modes",
        "_mutate",
        "_prop",
        "name",
    )

    def __init__(
        self,
        engine: object,
        fn: Callable[..., Any],
        kind: int,
        const: tuple[Var, ...],
        mutate: tuple[Var, ...],
        prop: FnProperty,
        name: str,
        modes: tuple[int, ...] | None = None,
    ) -> None:
        self.name = name
        self._engine = engine
        self._fn = fn
        self._kind = kind
        self._const = const
        self._mutate = mutate  # its Vars after the reads: writes, commute, concurrent
        self._modes = modes  # their modes (var.py), None when all are writes
        self._prop = prop
        self._deleted = False  # set by delete_operator; later pushes raise

    def _with_mode(self, mode: int) -> tuple[Var, ...]:
        modes = self._modes
        if modes is None:
            return self._mutate if mode == WRITE else ()
        return tuple(v for v, m in zip(self._mutate, modes, strict=True) if m == mode)

    @property
    def const_vars(self) -> tuple[Var, ...]:
        """The Vars every push of this handle reads."""
        return self._const

    @property
    def mutate_vars(self) -> tuple[Var, ...]:
        """The Vars every push of this handle writes (a Var named in two modes included)."""
        return self._with_mode(WRITE)

    @property
    def commute_vars(self) -> tuple[Var, ...]:
        """The Vars every push of this handle accesses in commute mode."""
        return self._with_mode(COMMUTE)

    @property
    def concurrent_vars(self) -> tuple[Var, ...]:
        """The Vars every push of this handle accesses in concurrent mode."""
        return self._with_mode(CONCURRENT)

    def __repr__(self) -> str:
        state = " deleted" if self._deleted else ""
        return (
            f"<OprHandle {self.name!r}{state} reads={len(self._const)} writes={len(self._mutate)}>"
        )


def delete_handle_locked(handle: OprHandle[Any]) -> bool:
    """Mark ``handle`` deleted, so that every later push of it raises; return False if it
    already was. The façade's one way to retire a handle (``Engine.delete_operator``): a
    function of the core, not a method users would call. Caller holds the engine lock,
    under which the scheduler's push checks the mark (pushes already admitted still run)."""
    if handle._deleted:
        return False
    handle._deleted = True
    return True
