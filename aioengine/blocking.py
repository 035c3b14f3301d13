"""The blocking front end: the engine for synchronous code and other threads.

``with ae.BlockingEngine() as engine:`` starts an event-loop thread through anyio's
:func:`~anyio.from_thread.start_blocking_portal` and runs an :class:`~aioengine.Engine` on it.
The methods are the Engine's: pushes return :class:`concurrent.futures.Future` objects, and
``wait_for_var`` / ``wait_for_all`` / ``get`` block the calling thread (with ``timeout=``).
Every method is safe from any number of threads at once.

The methods shared with Engine are not written here: ``BlockingMethods``
(``_blocking_generated.py``) has them, generated from Engine's signatures and overloads by
``python tools/gen_blocking.py`` (rerun it after changing one of them). Each calls one of the
helpers below (:meth:`BlockingEngine._bridge`, ``_wait``, ``_decorator``) in one line.

Threads, and why nothing here deadlocks quietly:

* Pushes are made directly on the calling thread (the engine's pushes are thread-safe and
  atomic across their Vars), so calls from one thread keep their program order and cost no
  loop round trip. A push from a thread that runs an event loop of its own is handed to the
  engine's loop thread instead (an Engine serves one loop).
* Waits run on the loop thread through the portal and block the caller until they finish.
  The loop thread itself must never block on the engine: a wait from there (inside a
  coroutine operation, an ``FnProperty.ASYNC`` operation, a serial-mode operation or a done
  callback) could only deadlock, so it raises :class:`RuntimeError` at once. MXNet deadlocks
  when ``WaitForVar`` is called from inside an operation.
* A future's ``result()`` / ``exception()`` called on the loop thread before it is done
  raises for the same reason.

:func:`run` is the other way round: it runs an async ``main`` on a new loop (asyncio's or
uvloop's) in the calling thread and returns its result.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from . import ergonomic as _ergonomic
from . import lifecycle
from ._blocking_generated import BlockingMethods
from .engine import Engine
from .ergonomic import OpDecorator
from .errors import EngineClosedError
from .lock import Deferred, unguard_interrupts
from .operation import Operation, OpState
from .var import Var

__all__ = ("BlockingEngine", "run")

T = TypeVar("T")

# Every BlockingEngine entered and not closed yet is registered in lifecycle.portals_at_exit
# (so that interpreter exit can stop it) and lifecycle.portals_after_fork, and has a finalizer
# (_stop_dropped) that stops its loop thread if it is dropped unclosed.

# How often (seconds) a wait of the main thread wakes, only to run the handler of a signal
# that came meanwhile: CPython notices a signal in a lock wait by its interruption, and one
# that lands as the wait begins (after the interpreter's last check, before the wait
# blocks) interrupts nothing, so its handler (a Ctrl-C's KeyboardInterrupt) would otherwise
# run only when the wait ends. Seen as a Ctrl-C in close() that surfaced after the drain.
_SIGNAL_POLL = 0.05


def _wait_done(fut: concurrent.futures.Future[Any], timeout: float | None) -> None:
    """Block until ``fut`` is done, or raise TimeoutError after ``timeout`` seconds. On the
    main thread in waits of :data:`_SIGNAL_POLL` seconds, so that a signal interrupts it at
    once (elsewhere no signal handler runs: one wait)."""
    main = threading.current_thread() is threading.main_thread()
    deadline = None if timeout is None else time.monotonic() + timeout
    while not fut.done():
        step = _SIGNAL_POLL if main else None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            step = left if step is None else min(step, left)
        concurrent.futures.wait((fut,), step)


def _result(fut: concurrent.futures.Future[T], timeout: float | None = None) -> T:
    """``fut.result(timeout)``, waiting as :func:`_wait_done` does."""
    _wait_done(fut, timeout)
    return concurrent.futures.Future.result(fut, 0)


def _exception(
    fut: concurrent.futures.Future[Any], timeout: float | None = None
) -> BaseException | None:
    """``fut.exception(timeout)``, waiting as :func:`_wait_done` does."""
    _wait_done(fut, timeout)
    return concurrent.futures.Future.exception(fut, 0)


class _Raised:
    """A ``BaseException`` that is not an ``Exception`` (a ``KeyboardInterrupt`` an operation
    raised, recorded, then raised again by ``wait_for_all`` in a group), carried out of the
    portal as a value by :func:`_boxed`."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def _boxed(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the loop thread (awaited if it returns an awaitable, as the portal
    does), with a base exception returned as :class:`_Raised`: the portal would raise it
    out of its task group as well as to the caller, and stop its loop (later pushes would
    find an engine bound to a closed loop). Cancellation passes through."""
    try:
        result = fn(*args)
        if inspect.isawaitable(result):
            result = await result
    except (asyncio.CancelledError, Exception):
        raise
    except BaseException as exc:
        return _Raised(exc)
    return result


def _call(portal: BlockingPortal, fn: Callable[..., Any], *args: Any) -> Any:
    """``portal.call(fn, *args)``, waiting as :func:`_wait_done` does; a base exception
    ``fn`` raised on the loop is raised here (the loop goes on: :func:`_boxed`)."""
    result = _result(portal.start_task_soon(_boxed, fn, *args))
    if type(result) is _Raised:
        exc, result = result.exc, None
        try:
            raise exc
        finally:
            del exc  # (its traceback holds this frame)
    return result


def _abandon_at_exit(engine: BlockingEngine) -> None:
    """At interpreter exit (lifecycle.portals_at_exit, atexit: once the non-daemon threads
    have finished, before the daemon ones are frozen): stop an unclosed loop thread.

    Without this, a BlockingEngine that was never closed hangs the interpreter: its
    ``start_blocking_portal`` context is finalized after the (daemon) loop thread has been
    frozen, and waits for that thread forever. Not earlier: a non-daemon thread may still be
    using the engine (Python joins those threads first). As for an unclosed :class:`Engine`,
    coroutine operations are cancelled, queued operations cancelled and running ones finish.
    """
    engine._abandon()


def _stop_portal(stack: contextlib.ExitStack, portal: BlockingPortal) -> None:
    """Stop a portal's loop thread without draining (cancelling what runs on the loop) and
    finalize its context: from a thread that is not the loop's and holds no engine lock."""
    with contextlib.suppress(RuntimeError):  # the portal has stopped already
        portal.call(portal.stop, True)
    stack.close()


def _stop_dropped(stack: contextlib.ExitStack, portal: BlockingPortal) -> None:
    """The finalizer of a BlockingEngine entered and dropped without :meth:`close`: its loop
    thread is stopped (as at interpreter exit, :func:`_abandon_at_exit`) by the engine's
    finalizer thread (``lock.py``), not here. Here is any thread that dropped the last
    reference, or ran the garbage collection that found it: the loop thread itself (which
    cannot wait for its own stop), or a thread holding a lock that the loop needs to stop.
    Without this, finalizing the portal's context here would do just that."""
    lifecycle.deferred_calls.put([Deferred(_stop_portal, stack, portal)])


def _mark_stopped(portal: BlockingPortal) -> None:
    """Mark ``portal`` stopped in a forked child, where no thread runs its loop: run
    :meth:`BlockingPortal.stop` here, not through the loop (``portal.call`` would wait for a
    loop that never runs). Its first step marks the portal stopped (from then on its calls
    raise RuntimeError, which its context's exit expects of a stopped portal) and sets its
    stop event; it awaits nothing (anyio 4), and whatever it would do after a first await is
    not done: the loop's tasks are the parent's. Setting the event only schedules, on the
    copy of the parent's loop, callbacks that never run here (asyncio's debug mode refuses
    even that from this thread: a RuntimeError, once the portal is marked)."""
    stop = portal.stop()
    try:
        stop.send(None)
    except StopIteration:
        return
    except RuntimeError:
        return
    stop.close()


def _forget_in_child(engine: BlockingEngine) -> None:
    """In a forked child (lifecycle.portals_after_fork): the loop thread is the parent's."""
    engine._forget_loop()


# Guards every _OpFuture's _cancelling flag: cancels are rare, and a lock per future (one per
# push) would cost more than the contention this one could see.
_CANCEL_LOCK = threading.Lock()


class _OpFuture(concurrent.futures.Future[T]):
    """A :class:`concurrent.futures.Future` that follows one :class:`Operation`.

    ``cancel()`` cancels the operation (and succeeds only if the operation could be
    cancelled); blocking on it from the engine's loop thread or one of its workers (inside an
    operation) raises instead of deadlocking.
    """

    def __init__(self, op: Operation[T], owner: BlockingEngine) -> None:
        super().__init__()
        self.operation = op
        self._owner = owner
        # cancel() on any thread and _resolve on the loop thread may both find the operation
        # cancelled; the first to set this (under _CANCEL_LOCK) cancels the future and
        # notifies its waiters (a second notify would raise, and log at CRITICAL level).
        self._cancelling = False

    def cancel(self) -> bool:
        """Cancel the operation; return whether it is (or, if running, will be) cancelled.

        An operation that has not started is cancelled at once, and so is this future. A
        running coroutine operation is asked to stop (as :meth:`asyncio.Task.cancel` does):
        this future then follows it, cancelled, or done if it finished first. A running sync
        operation cannot be cancelled: False.
        """
        if self.done():
            return False
        if not self.operation.cancel():
            return False
        if self.operation.cancelled():
            self._mark_cancelled()
        return True

    def _mark_cancelled(self) -> None:
        """Cancel this future and wake concurrent.futures.wait() callers, once."""
        with _CANCEL_LOCK:
            if self._cancelling:
                return
            self._cancelling = True
        if super().cancel():
            self.set_running_or_notify_cancel()

    def result(self, timeout: float | None = None) -> T:
        if not self.done():
            self._owner._check_thread("Future.result()")
        return _result(self, timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self.done():
            self._owner._check_thread("Future.exception()")
        return _exception(self, timeout)


def _resolve(fut: _OpFuture[Any], op: Operation[Any]) -> None:
    """Copy ``op``'s outcome into ``fut`` (a done callback, on the loop thread)."""
    if fut.done():  # cancelled through the future already
        return
    try:
        if op.cancelled():
            fut._mark_cancelled()
        elif (exc := op.exception()) is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(op.result())
    except concurrent.futures.InvalidStateError:  # pragma: no cover - a cancel() raced us
        pass


class BlockingEngine(BlockingMethods):
    """An :class:`~aioengine.Engine` on its own event-loop thread, for synchronous code.

    ``with BlockingEngine(cpu_workers=4) as engine:`` starts the loop thread (anyio's blocking
    portal) and binds a new Engine to it; leaving the block drains the engine like
    :meth:`wait_for_all` (or, if the block raised, cancels what has not started) and stops
    the thread. The methods mirror :class:`~aioengine.Engine`'s; ``push_*`` and
    :meth:`submit` return :class:`concurrent.futures.Future` objects (their ``operation``
    attribute is the :class:`~aioengine.Operation`), and the waits block. Safe to use from any
    number of threads at once.

    Args:
        uvloop: run the loop thread on uvloop (``pip install 'aioengine[uvloop]'``).
        **engine_kwargs: passed to :class:`~aioengine.Engine` (``cpu_workers``, ``serial``, ...).

    Raises:
        ValueError: if an engine setting is invalid (from the constructor, as ``Engine()``).
    """

    def __init__(self, *, uvloop: bool = False, **engine_kwargs: Any) -> None:
        self._engine = Engine(**engine_kwargs)
        self._uvloop = bool(uvloop)
        self._lock = threading.Lock()
        self._stack: contextlib.ExitStack | None = None
        self._portal: BlockingPortal | None = None
        self._loop_thread: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._forked = False  # this is a forked child of the process that entered it
        # The futures handed out, so that close() resolves any whose operation finished
        # while its done callback could no longer reach the loop (a push racing the close).
        self._futures: weakref.WeakSet[_OpFuture[Any]] = weakref.WeakSet()
        # While entered and not closed: stops the loop thread if this is dropped unclosed.
        self._finalizer: (
            weakref.finalize[[contextlib.ExitStack, BlockingPortal], BlockingEngine] | None
        ) = None

    @property
    def engine(self) -> Engine:
        """The async :class:`~aioengine.Engine` (for ``trace()``, ``graph()``, ``dump()``...)."""
        return self._engine

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has finished."""
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._portal else "not started"
        if self._forked and not self._closed:
            state = "unusable after os.fork()"
        return f"<aioengine.BlockingEngine {state} {self._engine!r}>"

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> BlockingEngine:
        with self._lock:
            if self._closed:
                raise EngineClosedError(f"{self!r} is closed; create a new BlockingEngine")
            if self._portal is not None:
                raise RuntimeError(f"{self!r} was already entered")
            options = {"use_uvloop": True} if self._uvloop else {}
            stack = contextlib.ExitStack()
            portal = stack.enter_context(
                start_blocking_portal("asyncio", options, name="aioengine-loop")
            )
            try:
                _call(portal, self._engine.__aenter__)
                self._loop_thread = _call(portal, threading.get_ident)
                self._loop = _call(portal, asyncio.get_running_loop)
            except BaseException:
                stack.close()
                raise
            self._stack, self._portal = stack, portal
            self._finalizer = weakref.finalize(self, _stop_dropped, stack, portal)
            self._finalizer.atexit = False  # interpreter exit: portals_at_exit's hook
            lifecycle.portals_at_exit.add(self, _abandon_at_exit)
            lifecycle.portals_after_fork.add(self, _forget_in_child)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        self._close(functools.partial(self._engine.__aexit__, exc_type, exc, tb))

    def close(self) -> None:
        """Drain the engine, stop the loop thread and raise unthrown failures (idempotent).

        A ``KeyboardInterrupt`` while it drains leaves the engine closing and its loop
        running: call it again to finish.

        Raises:
            ExceptionGroup: of every failure recorded and not thrown yet.
            RuntimeError: if called on the engine's loop thread.
        """
        self._close(self._engine.aclose)

    def _close(self, closer: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._check_thread("close()")
        with self._lock:
            stack, portal = self._stack, self._portal
            if self._closed or stack is None or portal is None:
                self._closed = True
                return
            interrupted = False
            try:
                _call(portal, closer)
            except KeyboardInterrupt:
                # Ctrl-C while draining: the close goes on on the loop, the engine stays
                # open (closing), and close() may be called again, as for Engine.aclose().
                interrupted = True
                raise
            finally:
                if not interrupted:
                    self._closed = True
                    self._stack = self._portal = None
                    self._unregister()
                    stack.close()
                    self._resolve_stranded()
                    unguard_interrupts()  # from this thread, which can restore SIGINT's handler

    def _resolve_stranded(self) -> None:
        """Settle the futures of finished operations whose done callback never ran (the loop
        is closed now; see :meth:`_bridge`)."""
        for fut in list(self._futures):
            if not fut.done() and fut.operation.done():
                _resolve(fut, fut.operation)

    def _unregister(self) -> None:
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer.detach()  # drops its references to the portal and its context
        lifecycle.portals_at_exit.discard(self)
        lifecycle.portals_after_fork.discard(self)

    def _abandon(self) -> None:
        """Stop the loop thread without draining (interpreter exit; see
        :func:`_abandon_at_exit`)."""
        if not self._lock.acquire(blocking=False):  # pragma: no cover - a close() is under way
            return
        try:
            stack, portal = self._stack, self._portal
            self._closed = True
            self._stack = self._portal = None
            self._unregister()
            if stack is None or portal is None:
                return
            _stop_portal(stack, portal)  # cancels what runs on the loop
        finally:
            self._lock.release()

    def _forget_loop(self) -> None:
        """In a forked child: forget the loop thread, which is the parent's; every later use
        raises (see :meth:`_portal_or_raise`), and exit does not wait for that thread.

        The lock may have been copied held, so it is replaced. The portal is marked stopped
        (:func:`_mark_stopped`), so that finalizing its context calls nothing on the loop and
        only joins the loop thread, which the child's threading module knows has stopped:
        else that context's exit would hand ``portal.stop`` to a loop that no thread runs
        here, and wait for it forever.
        """
        self._lock = threading.Lock()
        self._forked = True
        self._loop_thread = None
        portal, stack = self._portal, self._stack
        self._stack = self._portal = None
        self._unregister()
        if portal is not None:
            _mark_stopped(portal)
        del portal, stack  # finalized here, at once, calling nothing on the loop

    def _portal_or_raise(self, what: str) -> BlockingPortal:
        portal = self._portal
        if portal is None:
            if self._forked:
                raise RuntimeError(
                    f"{what}: {self!r} was entered in the parent process and cannot be used "
                    "after os.fork(): its loop thread does not exist here. Create a new "
                    "BlockingEngine in the child (or use multiprocessing's 'spawn' start method)"
                )
            if self._closed:
                raise EngineClosedError(f"{what}: {self!r} is closed; create a new one")
            raise RuntimeError(
                f"{what}: {self!r} is not started; use 'with ae.BlockingEngine() as engine:'"
            )
        return portal

    def _check_thread(self, what: str) -> None:
        """Refuse to block a thread of the engine's own: the loop thread or a worker.

        Blocking there waits on the engine with one of its threads (and the running
        operation's Vars) held: the loop thread cannot run what it waits for, and a worker
        waiting for work queued behind its own operation deadlocks as MXNet does.
        """
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError(
                f"BlockingEngine.{what} was called on the engine's own event-loop thread "
                "(inside a coroutine operation, an FnProperty.ASYNC operation, a serial-mode "
                "operation or a done callback); blocking there would deadlock. Await the "
                "async Engine (blocking_engine.engine) there instead, or call from another "
                "thread"
            )
        if self._engine._core.routes.on_worker_thread(self._engine._core):
            raise RuntimeError(
                f"BlockingEngine.{what} was called inside an operation, on one of the "
                "engine's worker threads; blocking there can deadlock (the operation holds "
                "its Vars and its worker while it waits, as in MXNet). Push the work that "
                "needs the result as a later operation on the same Vars instead, or wait "
                "from another thread"
            )

    # -- pushing -----------------------------------------------------------------------

    def _bridge(self, push: Callable[[], Operation[T]]) -> _OpFuture[T]:
        portal = self._portal_or_raise("push")
        loop = self._loop
        running = asyncio._get_running_loop()
        if running is not None and running is not loop:
            # This thread runs another loop: push from the engine's. (A tuple, because the
            # portal would await an awaitable result, and an Operation is awaitable.)
            (op,) = _call(portal, lambda: (push(),))
        else:
            op = push()
        fut: _OpFuture[T] = _OpFuture(op, self)
        self._futures.add(fut)
        try:
            op.add_done_callback(functools.partial(_resolve, fut))
        except RuntimeError:
            # The push was accepted, then close() ran to its end before this: the operation
            # is final (drained or cancelled) and the loop closed. Settle it from here.
            if not op.done():
                raise
            _resolve(fut, op)
        return fut

    # -- the helpers of the generated methods (_blocking_generated.py) -------------------
    #
    # new_var ... wait_for_all are BlockingMethods' (tools/gen_blocking.py writes them from
    # Engine's signatures); each calls the Engine or one of these in one line.

    def _decorator(
        self, fn: Callable[..., Any] | None, decorator: OpDecorator[Operation[Any]]
    ) -> Any:
        """:meth:`op`: wrap the Engine's ``decorator`` so that each call of the function it
        decorates pushes through :meth:`_bridge` (a future); decorate ``fn`` if given."""

        def decorate(f: Callable[..., Any]) -> Callable[..., concurrent.futures.Future[Any]]:
            push = decorator(f)  # TypeError for a non-callable, as Engine.op

            @functools.wraps(f)
            def call(*args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
                return self._bridge(lambda: push(*args, **kwargs))

            return call

        return decorate(fn) if fn is not None else decorate

    # -- waiting -----------------------------------------------------------------------

    def _wait(self, what: str, wait: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``wait()`` on the loop thread and block until it returns.

        Raises:
            RuntimeError: on the engine's own threads (see :meth:`_check_thread`), or if the
                BlockingEngine was not entered.
            EngineClosedError: if it is closed, or a close() stops the loop meanwhile (not
                the portal's own RuntimeError).
        """
        self._check_thread(what)
        portal = self._portal_or_raise(what)
        try:
            result: T = _call(portal, wait)
        except RuntimeError:
            if self._portal is portal:
                raise  # the wait's own error
            raise EngineClosedError(f"{what}: {self!r} was closed meanwhile") from None
        return result

    def get(self, var: Var, *, timeout: float | None = None) -> Any:
        """Block until every write to ``var`` pushed so far has run; return its value.

        As :meth:`aioengine.Var.get`: a ``ValueError`` for a Var with no value is raised here
        only, not again by :meth:`wait_for_all` or :meth:`close`; a failure ``var`` carries
        is raised as ``DependencyError`` and stays recorded (for :meth:`wait_for_var`).

        Raises:
            DependencyError: if ``var`` carries a failure (its ``__cause__`` is the failure).
            ValueError: if ``var`` carries no value.
            TimeoutError: if ``timeout`` seconds pass while earlier writes to ``var`` still
                run or wait (the read is cancelled); the message says why ``var`` is busy, as
                :meth:`wait_for_var`'s. Once they have finished the read is due, and its
                value is returned even if the loop runs it after the deadline: on an idle
                ``var``, ``timeout=0`` returns at once, as :meth:`wait_for_var` does.
            RuntimeError: if called on the engine's loop thread (it would deadlock).
        """
        self._check_thread("get()")
        fut = self._bridge(lambda: _ergonomic.read(self._engine, var))
        try:
            value = fut.result(timeout)
        except TimeoutError:
            if fut.operation.state is not OpState.PENDING:
                # Its turn came (no earlier write is left): only the loop's run of it is left.
                return _ergonomic.checked(var, fut.result())
            if not fut.cancel() and fut.done():  # the read ran meanwhile: its outcome stands
                return _ergonomic.checked(var, fut.result())
            raise TimeoutError(
                f"get({var!r}) timed out after {timeout} s; {self._engine._describe_var(var)}"
            ) from None
        return _ergonomic.checked(var, value)


def run(
    main: Callable[[], Coroutine[Any, Any, T]] | Coroutine[Any, Any, T], *, uvloop: bool = False
) -> T:
    """Run an async ``main`` on a new event loop in this thread and return its result.

    ``main`` is a coroutine function (called with no arguments) or a coroutine. With
    ``uvloop=True`` the loop is uvloop's (``pip install 'aioengine[uvloop]'``), otherwise
    asyncio's default; like :func:`asyncio.run`, it cannot be called from a running loop.

    Raises:
        ImportError: if ``uvloop=True`` and uvloop is not installed.
        TypeError: if ``main`` is neither a coroutine function nor a coroutine.
    """
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if uvloop:
        try:
            import uvloop as _uvloop
        except ImportError as exc:
            raise ImportError(
                "ae.run(main, uvloop=True) needs uvloop, which is not installed: "
                "pip install 'aioengine[uvloop]' (or call ae.run(main) for asyncio's loop)"
            ) from exc
        factory = _uvloop.new_event_loop
    coro = main() if callable(main) else main
    if not inspect.iscoroutine(coro):
        raise TypeError(
            f"ae.run() needs a coroutine function or a coroutine, got {main!r}; "
            "define main with 'async def'"
        )
    with asyncio.Runner(loop_factory=factory) as runner:
        result: T = runner.run(coro)
    return result
