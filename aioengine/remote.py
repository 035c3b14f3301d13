"""Remote operations: the collaborator that runs operations on a Dask cluster.

The scheduler (``scheduler.py``) reaches this module through its ``_remote`` field, which stays
None until the first push to a :func:`~aioengine.remote` context, so a local-only engine pays
one ``is None`` test. Dask distributed does the work (keys, futures as arguments, cancel,
TLS); this module only maps the engine's rule onto it. ``docs/howto/cluster.md`` is the
user's side of the same design.

Two kinds of remote operation:

- *Side-effect operations* (``push_sync`` / ``push_async`` / ``push`` on a remote context):
  ``fn(rctx)`` runs on a worker and may touch anything, so the operation holds its Vars until
  the Dask task has finished, exactly like a local one. A task on the engine's loop
  (``op._task``) awaits the Dask future; cancelling it cancels the Dask task.
- *Value operations* (``Engine.submit(..., ctx=remote())``, a
  :class:`~aioengine.functions.ValueCall`): every write makes a new *version* of its ``out``
  Vars, a :class:`RemoteVersion` that the Var carries as its value and whose Dask future
  (a new key) stays on the cluster. A Var argument reaches the worker as the Dask future of
  the version it must see (a local value is scattered once per version). Dask then orders
  such operations by data, and the engine's rule holds without waiting: read-after-write,
  the reader has the writer's future as an argument; write-after-read and write-after-write,
  the writer makes a new key and the version a reader was given never changes. So a value
  operation releases its Vars once *submitted* (as a GPU operation once enqueued), and a
  dependent chain reaches the scheduler at once: one whose arguments are all futures already
  is *collected* as it starts (:meth:`RemoteBackend.start`) and released there, and the
  collected tasks are sent as one graph at the next loop iteration (:meth:`RemoteBackend._flush`,
  one ``update-graph`` message instead of one per task). It completes (``await op``) when its task
  has. Two conditions, documented for users: the function must not modify its inputs in
  place, and Dask may run it more than once. One that declares ``writes=`` (side effects),
  and every value operation in serial mode, holds its Vars until it has finished instead.

Any other operation that uses a Var whose version is still being computed (a local one, a
side-effect one, ``wait_for_var``, ``delete_var``) is held before it starts
(:meth:`RemoteBackend.hold_locked`, called by the scheduler's dispatch, like the GPU's fences)
until the version has *settled*; a local reader also until the value is gathered to this
process, once per version (the Var then carries the local value, and the scatter cache
remembers its future, so a later remote reader sends nothing).

Failures keep the local semantics. A version settles failed when its operation failed, or
when the operation was *skipped*: one of the versions it depends on (those of the Vars it reads
and the previous versions of those it writes) settled failed; Dask then fails it with the
upstream exception, and the engine reports ``DependencyError`` as for a local skip, sharing the
upstream failure record. A settled failure is recorded on the Var (``Var._failure``) if that
version is still its latest, and the Var's value goes back to the last version that did not
fail (a failed operation leaves its Vars' values as they were): so what starts later is
skipped, as locally, until the failure is thrown.

State (the engine lock, ``core._lock``, guards every field that another thread may read; the
rest is loop-thread only):

- ``_core``: the scheduler served (it calls the scheduler's ``_locked`` bookkeeping; the
  scheduler never imports this module). ``_loop``: its loop, where every Dask call is made.
- ``_cluster``, ``_security``: what ``Engine(cluster=, security=)`` (or
  ``AIOENGINE_CLUSTER``) gave. ``_client``: the connected ``distributed.Client`` (None until
  connected); ``_connecting``: the task that connects; ``_own_client``, ``_own_cluster``: what
  the engine made, and so closes; ``_on_loop``: the client runs on the engine's loop (else
  on its own thread: a blocking client).
- ``_token``: this engine's part of every Dask key it makes (``name-token-seq``).
- ``_scattered``: per Var, the local value last sent to the cluster and its future (a weak
  mapping: a dropped Var drops its entry).
- ``_holders``: the Vars that may carry a remote version (weak), released at close.
- ``_executor``: the one :class:`RemoteExecutor` every remote context routes to.
- ``_starting``: while :meth:`RemoteBackend.start` runs, the operations it made READY, which
  it starts next (a chain is started by a loop, not by recursion); None otherwise.
- ``_batch``: the collected value operations' tasks not sent yet (a flush is scheduled
  whenever it is not empty); ``_batch_api``: the parts of Dask that sending a graph needs
  (None on a Dask without them: then each is sent by ``client.submit``).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import inspect
import operator
import threading
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from . import instrument as _instrument
from .context import Context, RemoteOptions, RunContext, remote
from .errors import Abort, DependencyError, DeviceUnavailableError, EngineClosedError, summary
from .functions import ValueCall
from .kinds import _CALLBACK, _CORO, _WAIT, FnProperty, OpState
from .operation import Operation
from .scheduler import Scheduler
from .var import NO_VALUE, Var, _Failure

# distributed is optional and only partly typed: its client and futures are Any here.
DaskClient = Any  # a distributed.Client
DaskFuture = Any  # a distributed.Future

__all__ = ("RemoteBackend", "RemoteExecutor", "RemoteVersion", "open_remote")

_DONE = OpState.DONE
_FAILED = OpState.FAILED
_SKIPPED = OpState.SKIPPED
_CANCELLED = OpState.CANCELLED
_PENDING = OpState.PENDING
_DELETE_VAR = FnProperty.DELETE_VAR
_NO_SKIP = FnProperty.NO_SKIP
_context_run = contextvars.Context.run

INSTALL = (
    "remote operations need Dask distributed: pip install 'aioengine[dask]'; then give the "
    "engine a cluster (Engine(cluster='local'), Engine(cluster='tcp://host:8786'), or the "
    "environment variable AIOENGINE_CLUSTER=tcp://host:8786)"
)


def _distributed() -> Any:
    """Import ``distributed``, or raise DeviceUnavailableError saying how to install it."""
    try:
        import distributed
    except ImportError as exc:
        raise DeviceUnavailableError(INSTALL) from exc
    return distributed


def _batch_api() -> tuple[Any, Any, Any, Any, Any] | None:
    """What sending several tasks in one graph needs of Dask (its Future, Task,
    parse_input, LLGExpr, SpanMetadata and ``Client._graph_to_futures``), or None on a
    Dask that lacks them: each value operation is then sent by its own ``client.submit``."""
    try:
        from dask._expr import LLGExpr
        from dask._task_spec import Task, parse_input
        from distributed import Client, Future
        from distributed.spans import SpanMetadata
    except ImportError:
        return None
    params = inspect.signature(Client._graph_to_futures).parameters
    if not {"span_metadata", "internal_priority", "user_priority"} <= params.keys():
        return None
    return Future, Task, parse_input, LLGExpr, SpanMetadata


def open_remote(core: Scheduler, ctx: Context, cluster: object, security: object) -> RemoteBackend:
    """Create ``core``'s remote collaborator on the first push to a remote context.

    Raises:
        DeviceUnavailableError: if no cluster is configured or ``distributed`` is missing.
        RuntimeError: if the engine is not bound to a running loop yet.
    """
    if cluster is None:
        raise DeviceUnavailableError(
            f"{ctx!r}: no cluster is configured; create the engine with Engine(cluster=...) "
            "(a distributed.Client, a cluster object, a scheduler address or 'local') or set "
            "AIOENGINE_CLUSTER=tcp://host:8786. " + INSTALL.split(";")[0]
        )
    _distributed()
    if core._loop is None:
        raise RuntimeError(
            f"{core!r} is not bound to an event loop yet, and remote operations need it (its "
            "Dask client runs there); use the engine from a coroutine first"
        )
    with core._lock:
        current = core._remote
        if current is None:
            backend = RemoteBackend(core, core._loop, cluster, security)
            core._remote = backend
            return backend
    assert isinstance(current, RemoteBackend)
    return current


class _Escaped(Exception):
    """A ``KeyboardInterrupt`` or ``SystemExit`` raised by a remote function, carried back as
    an ordinary exception: Dask re-raises those on the worker's event loop (on an in-process
    cluster, the caller's), which would stop it. It carries the type's name and arguments,
    not the exception (nor, raised outside the ``except``, its context), which Dask would
    raise again; :meth:`RemoteBackend._error` rebuilds the original, so the operation fails
    with it, as a local one does."""

    def __init__(self, kind: str, args: tuple[Any, ...]) -> None:
        super().__init__(kind, args)
        self.kind, self.original_args = kind, args

    @classmethod
    def of(cls, exc: BaseException) -> _Escaped:
        kind = "KeyboardInterrupt" if isinstance(exc, KeyboardInterrupt) else "SystemExit"
        return cls(kind, exc.args)

    def original(self) -> BaseException:
        kind = KeyboardInterrupt if self.kind == "KeyboardInterrupt" else SystemExit
        return kind(*self.original_args)


def _calling(fn: Callable[[RunContext], Any], rctx: RunContext) -> Any:
    """A side-effect operation's task on the worker (``push_sync``): ``fn(rctx)``."""
    try:
        return fn(rctx)
    except (KeyboardInterrupt, SystemExit) as exc:
        escaped = _Escaped.of(exc)
    raise escaped


async def _awaiting(fn: Callable[[RunContext], Awaitable[Any]], rctx: RunContext) -> Any:
    """A side-effect operation's task on the worker (``push_async``), on the worker's event
    loop: ``await fn(rctx)``, also for a function that is not ``async def`` itself but
    returns an awaitable (``lambda rctx: coro()``), which Dask would not await."""
    try:
        return await fn(rctx)
    except (KeyboardInterrupt, SystemExit) as exc:
        escaped = _Escaped.of(exc)
    raise escaped


def _apply(fn: Callable[..., Any], n: int | None, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """A value operation's task on the worker: ``fn(*args, **kwargs)``, checked for
    ``n`` results when ``out`` is a sequence of ``n`` Vars."""
    try:
        return _unpack(fn(*args, **kwargs), n)
    except (KeyboardInterrupt, SystemExit) as exc:
        escaped = _Escaped.of(exc)
    raise escaped


async def _apply_async(
    fn: Callable[..., Coroutine[Any, Any, Any]],
    n: int | None,
    args: list[Any],
    kwargs: dict[str, Any],
) -> Any:
    """:func:`_apply` for a coroutine function: it runs on the worker's event loop."""
    try:
        return _unpack(await fn(*args, **kwargs), n)
    except (KeyboardInterrupt, SystemExit) as exc:
        escaped = _Escaped.of(exc)
    raise escaped


def _running(key: str, dask_worker: Any = None) -> bool:
    """On a worker (``client.run``): whether a function of task ``key`` is still running
    there (executing, or cancelled while executing)."""
    state = getattr(dask_worker, "state", None)
    task = state.tasks.get(key) if state is not None else None
    return task is not None and task.state in _RUNNING_STATES


_RUNNING_STATES = frozenset({"executing", "long-running", "cancelled", "resumed"})


def _unpack(result: Any, n: int | None) -> Any:
    if n is None:
        return result
    values = tuple(result)
    if len(values) != n:
        raise ValueError(f"the function returned {len(values)} value(s) for out= of {n} Var(s)")
    return values


class RemoteVersion:
    """One version of a Var written by a remote value operation: the value lives on the
    cluster under the key of :attr:`future`.

    A Var carries it as its value (``Var._value``) until the next write; an operation's
    function never sees it (a remote one gets the future, a local one the gathered value).
    Its fields are written on the loop thread under the engine lock.
    """

    __slots__ = (
        "__weakref__",
        "box",
        "exc",
        "fallback",
        "future",
        "gathering",
        "given",
        "name",
        "previous",
        "settled",
        "var",
        "waiters",
        "watchers",
    )

    def __init__(self, future: DaskFuture, var: Var, previous: object) -> None:
        self.future = future  #: the Dask future of the value
        self.var = weakref.ref(var)  #: the Var it is a version of
        self.name = var.name
        #: the Var's value before this version, until it settles (then dropped, or kept in
        #: ``fallback`` if it failed: what the Var goes back to)
        self.previous: object = previous
        self.fallback: object = NO_VALUE
        self.settled = False  #: its operation finished (or was skipped)
        self.box: _Failure | None = None  #: the failure record, if it failed
        self.exc: BaseException | None = None  #: that failure's exception
        self.gathering = False  #: a gather to this process is under way
        #: its future was handed to a later remote operation (an argument, or a dependency of
        #: its write): from then on its operation can no longer be withdrawn
        self.given = False
        self.waiters: list[Operation[Any]] = []  #: operations held until it settles or arrives
        self.watchers: list[asyncio.Future[None]] = []  #: loop futures woken when it settles

    def __repr__(self) -> str:
        state = "failed" if self.exc is not None else "settled" if self.settled else "pending"
        return f"<RemoteVersion of {self.name!r} {state} key={self.future.key!r}>"

    async def wait_settled(self, loop: asyncio.AbstractEventLoop) -> None:
        """Return once this version has settled (loop thread)."""
        if not self.settled:
            fut = loop.create_future()
            self.watchers.append(fut)
            await fut


class RemoteExecutor:
    """The executor of every remote context: it hands each READY operation to the loop, where
    :meth:`RemoteBackend.start` submits it to Dask. It runs nothing itself and has no queue
    (Dask's scheduler is the queue, ordered by ``priority=``)."""

    _name = "aioengine-remote"  # pools are named after it (statistics(), traces): "remote"

    def __init__(self, backend: RemoteBackend) -> None:
        self._backend = backend
        self._closed = False

    def __repr__(self) -> str:
        return "<RemoteExecutor>"

    @property
    def ctx(self) -> Context:
        """A remote context (the executor serves every one)."""
        return remote()

    @property
    def abandoned(self) -> bool:
        """Never: nothing of it runs on a thread."""
        return False

    def owns_current_thread(self) -> bool:
        """No thread is one of its workers."""
        return False

    def submit(self, item: Any, key: int, wake: bool = True) -> bool:
        """Start ``item`` on the loop (now, on the loop thread; else soon)."""
        if self._closed:
            return False
        backend = self._backend
        loop = backend._loop
        if backend._core._loop_thread == threading.get_ident():
            backend.start(item)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(backend.start, item)
        else:
            return False
        return True

    def take(self) -> Any:
        """Nothing is ever queued here."""
        return None

    def wake(self, *, caller_pops: bool = True) -> None:
        """Nothing to wake: :meth:`submit` starts at once."""

    def shutdown(self, wait: bool) -> None:
        """Take no more operations."""
        self._closed = True


def _priority(op: Operation[Any]) -> int:
    """The ``priority`` an operation was pushed with (its run key encodes it)."""
    return (op._seq - op._key) >> 64


class RemoteBackend:
    """The remote collaborator of one engine (created by :func:`open_remote`); its state is
    listed in this module's docstring."""

    def __init__(
        self,
        core: Scheduler,
        loop: asyncio.AbstractEventLoop,
        cluster: object,
        security: object,
    ) -> None:
        self._core = core
        self._loop = loop
        self._cluster = cluster
        self._security = security
        self._client: DaskClient | None = None
        self._connecting: asyncio.Task[DaskClient] | None = None
        self._own_client = False
        self._own_cluster: Any = None
        self._on_loop = True
        self._token = uuid.uuid4().hex[:12]
        self._scattered: weakref.WeakKeyDictionary[Var, tuple[object, Any]] = (
            weakref.WeakKeyDictionary()
        )
        self._holders: weakref.WeakSet[Var] = weakref.WeakSet()
        self._executor = RemoteExecutor(self)
        self._starting: collections.deque[Operation[Any]] | None = None
        # Collected value operations not sent yet: (priority and options, context, tasks,
        # futures) each.
        self._batch: list[
            tuple[tuple[int, RemoteOptions | None], Context, list[Any], list[Any]]
        ] = []
        self._batch_api = _batch_api()
        #: the failure of connecting, once it failed: every operation that was waiting for
        #: the connection fails with this one record (one error at ``aclose()``, not one per
        #: operation), and a later remote push raises at once
        self._unreachable: _Failure | None = None
        #: the value operations released once submitted, until they settle: their Dask
        #: future and versions (what withdrawing one needs); lock held
        self._submitted: dict[Operation[Any], tuple[DaskFuture, list[RemoteVersion]]] = {}
        #: those withdrawn by ``cancel()``, with its message, until they settle; lock held
        self._withdrawn: dict[Operation[Any], object] = {}
        self._unreachable_text = ""  #: its message

    # -- the scheduler's seam ----------------------------------------------------------

    def route(self, ctx: Context, prop: FnProperty, kind: int) -> RemoteExecutor:
        """The executor of a remote operation; callback-style functions cannot run remotely.

        Raises:
            TypeError: for a callback-style function (``fn(rctx, on_complete)``).
            EngineClosedError: once the engine has closed its client.
        """
        if kind == _CALLBACK:
            raise TypeError(
                f"a callback-style function (fn(rctx, on_complete)) cannot run on {ctx!r}: "
                "push a plain function (push_sync) or an 'async def fn(rctx)' (push_async)"
            )
        if self._executor._closed:
            raise EngineClosedError(f"{self._core!r}: its Dask client is closed")
        if self._unreachable is not None:
            raise DeviceUnavailableError(self._unreachable_text)
        return self._executor

    def hold_locked(self, op: Operation[Any]) -> bool:
        """Hold ``op`` while a Var it uses carries a version still being computed (or, for a
        reader, not yet gathered here); False if nothing holds it. Lock held (any thread)."""
        if type(op._fn) is ValueCall:
            return False  # Dask orders it by data: it gets the futures
        scattered = self._scattered
        if scattered and op._kind != _WAIT:
            for var in op._mutate:
                if var in scattered:
                    # It writes the Var (maybe in place): the copy on the cluster is stale.
                    self._core._call_soon_locked(functools.partial(self._stale, var))
        gather = (
            op._target is not self._executor
            and op._kind != _WAIT  # a wait_for_var marker needs no value
            and op._prop is not _DELETE_VAR
        )
        for var in op._vars:
            value = var._value
            if type(value) is not RemoteVersion:
                continue
            if not value.settled:
                value.waiters.append(op)
                return True
            if not gather:
                continue  # it needs no value
            # (Gathered even if the Var carries a failure: until the operation starts, the
            # failure may be thrown, and then it runs.)
            value.waiters.append(op)
            if not value.gathering:
                value.gathering = True
                self._core._call_soon_locked(functools.partial(self._begin_gather, value))
            return True
        return False

    def withdraw_locked(self, op: Operation[Any], msg: object) -> bool:
        """Cancel a value operation released once submitted (``cancel()`` of a running
        one), if no later operation was given a version it writes: each Var gets back the
        value it had before (what starts from now on reads that), its Dask task is cancelled
        (if it ran anyway, its result is dropped), and it ends CANCELLED when that task has.
        False if it settled, was withdrawn already, or its result was handed on. Lock held."""
        entry = self._submitted.get(op)
        if entry is None or op in self._withdrawn:
            return False
        future, versions = entry
        if any(version.given or version.settled for version in versions):
            return False
        self._withdrawn[op] = msg
        for version in versions:
            var = version.var()
            if var is not None and var._value is version:
                previous = version.previous
                if type(previous) is RemoteVersion and previous.exc is not None:
                    previous = previous.fallback
                var._value = previous
        self._core._call_soon_locked(functools.partial(self._begin_cancel, future))
        return True

    async def _lost_inputs(
        self,
        op: Operation[Any],
        client: DaskClient,
        exc: BaseException,
        inputs: tuple[list[tuple[int, Var]], list[tuple[str, Var]]],
        cancelled: bool,
    ) -> BaseException:
        """The failure of value operation ``op`` whose task failed with ``exc``: a value
        this process sent it that is gone (its worker died with the only copy) is forgotten,
        so that the next operation sends it again; if the cluster ``cancelled`` the task for
        that, an error that names it and the worker that held it, else ``exc`` (loop
        thread)."""
        lost: dict[str, str] = {}  # key: the Var's name
        for _, var in [*inputs[0], *inputs[1]]:
            cached = self._scattered.get(var)
            if cached is not None and getattr(cached[1], "status", "finished") != "finished":
                del self._scattered[var]
                lost[cached[1].key] = var.name
        if not lost or not cancelled:
            return exc
        workers = await self._removed_workers(client, lost.keys())
        named = ", ".join(
            f"{name!r} (key {key!r}"
            + (f", on worker {workers[key]}" if key in workers else "")
            + ")"
            for key, name in lost.items()
        )
        error = RuntimeError(
            f"the cluster cancelled {op.name!r}: the value of {named} that this process sent "
            "was lost with the worker that held it, which left the cluster (it died); push "
            "the operation again to send the value again"
        )
        error.__cause__ = exc
        return error

    async def _removed_workers(self, client: DaskClient, keys: Any) -> dict[str, str]:
        """The address of the worker whose removal lost each of ``keys``, from the
        scheduler's event log (best effort: what it no longer remembers is left out)."""
        found: dict[str, str] = {}
        try:
            events = await self._call(client.scheduler.events(topic="all"))
        except Exception:
            return found
        wanted = set(keys)
        for _, event in events:
            if isinstance(event, dict) and event.get("action") == "remove-worker":
                for key in wanted & set(event.get("lost-scattered-tasks", ())):
                    found[key] = str(event.get("worker"))
        return found

    def _begin_cancel(self, future: DaskFuture) -> None:
        task = self._loop.create_task(self._cancel_future(future))
        task.add_done_callback(_quiet)

    def _stale(self, var: Var) -> None:
        """Forget the copy of ``var``'s value on the cluster, which a local writer replaces
        (loop thread, after the batches already collected were sent): a reader already
        given its future keeps it; the key goes once nobody holds it."""
        self._scattered.pop(var, None)

    # -- connecting ----------------------------------------------------------------------

    async def _ready(self) -> DaskClient:
        """The connected client (connecting on first use, on the engine's loop)."""
        client = self._client
        if client is not None:
            return client
        if self._connecting is None:
            self._connecting = self._loop.create_task(self._connect())
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> DaskClient:
        try:
            return await self._connect_once()
        except Exception as exc:
            error = DeviceUnavailableError(
                f"could not connect to the Dask cluster {_describe(self._cluster)}: {summary(exc)}"
            )
            error.__cause__ = exc
            box = _Failure(error)
            self._unreachable_text = str(error)
            with self._core._lock:
                self._unreachable = box
                self._core._failures[box] = None
            raise error from exc

    async def _connect_once(self) -> DaskClient:
        distributed = _distributed()
        cluster = self._cluster
        if isinstance(cluster, distributed.Client):
            if cluster.asynchronous:
                if cluster.loop.asyncio_loop is not self._loop:
                    raise RuntimeError(
                        f"{cluster!r} is asynchronous on another event loop; create it on the "
                        "engine's loop (or pass a blocking Client, or an address)"
                    )
            else:
                self._on_loop = False
            client = cluster
        else:
            target = cluster
            if cluster == "local":
                self._own_cluster = target = await distributed.LocalCluster(
                    processes=False,
                    dashboard_address=":0",
                    asynchronous=True,
                    security=self._security,
                )
            elif not isinstance(cluster, str):
                if not hasattr(cluster, "scheduler_address"):
                    raise TypeError(
                        "cluster must be a distributed.Client, a cluster object, a scheduler "
                        f"address or 'local', got {cluster!r}"
                    )
                loop = getattr(getattr(cluster, "loop", None), "asyncio_loop", None)
                if not (getattr(cluster, "asynchronous", False) and loop is self._loop):
                    # A blocking cluster (or one on another loop) runs its own loop on a
                    # thread; a client on this loop cannot share that object, so it
                    # connects to the scheduler's address (what the cluster's own client
                    # would do), with the cluster's security unless one was given.
                    target = cluster.scheduler_address
                    if self._security is None:
                        self._security = getattr(cluster, "security", None)
            kwargs: dict[str, Any] = {}
            if self._security is not None:
                kwargs["security"] = self._security
            client = await distributed.Client(
                target, asynchronous=True, set_as_default=False, **kwargs
            )
            self._own_client = True
        self._client = client
        return client

    async def _call(self, awaitable: Any) -> Any:
        """Await a coroutine of the client's (``asynchronous=True``) on the client's loop."""
        if self._on_loop:
            return await awaitable
        assert self._client is not None
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(awaitable, self._client.loop.asyncio_loop)
        )

    def _finished(self, future: DaskFuture) -> Awaitable[None]:
        """What to await until ``future`` has finished, erred or been cancelled (no data moves).

        On the engine's loop, the future's own state (no thread involved; it is what awaiting
        the future does, without the transfer of its result), returned itself: one coroutine
        frame fewer per operation; otherwise a done callback, which Dask runs on a thread of
        its own, wakes the loop.
        """
        state = getattr(future, "_state", None)
        wait = getattr(state, "wait", None)
        if self._on_loop and wait is not None:
            return wait()  # type: ignore[no-any-return]
        return self._settled_by_callback(future)

    async def _settled_by_callback(self, future: DaskFuture) -> None:
        done = self._loop.create_future()
        loop = self._loop

        def settle(_: object) -> None:  # a Dask callback thread
            if not loop.is_closed():
                loop.call_soon_threadsafe(_set_done, done)

        future.add_done_callback(settle)
        await done

    # -- running -------------------------------------------------------------------------

    def start(self, op: Operation[Any]) -> None:
        """Start READY ``op`` (loop thread).

        A value operation whose arguments are all on the cluster already is *collected*: its
        task joins the batch that :meth:`_flush` sends (one graph per loop iteration), and it
        releases its Vars here, so the operations that this makes READY are started by the
        same call (iteratively: ``_starting`` queues them) and a dependent chain pushed in one
        go reaches Dask in one graph. Any other operation gets a task that submits it.
        """
        starting = self._starting
        if starting is not None:  # called back from within start() below: queued
            starting.append(op)
            return
        self._starting = starting = collections.deque((op,))
        try:
            while starting:
                self._start_one(starting.popleft())
        finally:
            self._starting = None
            for left in starting:  # (only if one raised)
                self._loop.call_soon(self.start, left)

    def _start_one(self, op: Operation[Any]) -> None:
        core = self._core
        todo: list[Operation[Any]] = []
        with core._lock:
            started = core._start_locked(op, todo)
            if started:
                collected = type(op._fn) is ValueCall and self._collect_locked(op, todo)
                if collected:
                    assert self._client is not None
                    run = self._complete_value(op, self._client, *collected)
                else:
                    run = (self._run_value if type(op._fn) is ValueCall else self._run_effect)(op)
                task = self._loop.create_task(run, name=op.name, context=op._context)
                task._log_destroy_pending = False  # type: ignore[attr-defined]
                if not collected:
                    task.add_done_callback(functools.partial(self._task_done, op))
                    op._task = task
        if todo:
            core._submit(todo)
        if started and core._instruments:
            _instrument.notify_start(core, op)

    def _collect_locked(
        self, op: Operation[Any], todo: list[Operation[Any]]
    ) -> tuple[DaskFuture, list[RemoteVersion], list[RemoteVersion], bool, Any] | None:
        """Add value operation ``op``'s task to the batch and release its Vars, if it can be
        done now: connected, every argument a future already (nothing to scatter), not
        holding its Vars, not in serial mode (a blocking client's calls are thread-safe).
        Returns what :meth:`_complete_value` needs, else None. Lock held, loop thread."""
        core = self._core
        call = op._fn
        assert type(call) is ValueCall
        client = self._client
        api = self._batch_api
        if (
            call.holds
            or op._prop is _NO_SKIP
            or core._settings.serial
            or client is None
            or api is None
        ):
            return None
        deps: list[RemoteVersion] = []
        args = list(call.args)
        kwargs = dict(call.kwargs)
        for i, var in call.arg_vars:
            args[i] = arg = self._arg_now(var, deps)
            if arg is None:
                return None
        for name, var in call.kw_vars:
            kwargs[name] = arg = self._arg_now(var, deps)
            if arg is None:
                return None
        for var in op._vars:  # the previous versions of what it writes, too
            value = var._value
            if type(value) is RemoteVersion and value not in deps:
                value.given = True
                deps.append(value)
        future_type, task_type, parse_input = api[0], api[1], api[2]
        n = None if call.single or not call.outs else len(call.outs)
        key = self._key(op)
        apply = _apply_async if inspect.iscoroutinefunction(call.fn) else _apply
        future = future_type(key, client)
        tasks = [task_type(key, apply, call.fn, n, parse_input(args), parse_input(kwargs))]
        if n is None:
            parts = [future] if call.outs else []
        else:
            parts = []
            for i in range(n):
                part_key = f"{key}-{i}"
                tasks.append(task_type(part_key, operator.getitem, parse_input(future), i))
                parts.append(future_type(part_key, client))
        ctx = op._ctx
        group = (_priority(op), ctx.options)  # one graph per priority and options
        self._batch.append((group, ctx, tasks, [future, *parts] if n else [future]))
        if len(self._batch) == 1:
            self._loop.call_soon(self._flush)
        versions: list[RemoteVersion] = []
        for var, part in zip(call.outs, parts, strict=True):
            version = RemoteVersion(part, var, var._value)
            var._value = version
            versions.append(version)
            self._holders.add(var)
        ready: list[Any] = []
        op._task = None  # submitted: only withdraw_locked can cancel it now
        self._submitted[op] = (future, versions)
        core._release_locked(op, _DONE, None, ready, counted=False)
        if ready:
            todo.extend(core._dispatch_locked(ready))
        return future, deps, versions, True, (call.arg_vars, call.kw_vars)

    def _arg_now(self, var: Var, deps: list[RemoteVersion]) -> DaskFuture | None:
        """:meth:`_remote_arg` if nothing is to be sent: the future, else None."""
        value = var._value
        if type(value) is RemoteVersion:
            value.given = True
            if value not in deps:
                deps.append(value)
            return value.future
        cached = self._scattered.get(var)
        if cached is not None and cached[0] is value and not isinstance(cached[1], asyncio.Future):
            return cached[1]
        return None

    def _flush(self) -> None:
        """Send the collected tasks to Dask: one graph per priority and options (loop
        thread). A graph that cannot be sent (a function that cannot be pickled) is sent
        again task by task, and the tasks that still cannot fail their operations."""
        batch, self._batch = self._batch, []
        client = self._client
        groups: dict[tuple[int, RemoteOptions | None], list[Any]] = {}
        for entry in batch:
            groups.setdefault(entry[0], []).append(entry)
        for (priority, _), entries in groups.items():
            options = self._options(entries[0][1])
            try:
                self._send(client, [t for e in entries for t in e[2]], priority, options)
            except Exception:
                for entry in entries:
                    try:
                        if len(entries) == 1:
                            raise
                        self._send(client, entry[2], priority, options)
                    except Exception as error:
                        for future in entry[3]:
                            future._state.set_error(error, error.__traceback__)

    def _send(self, client: DaskClient, tasks: list[Any], priority: int, options: Any) -> None:
        if client is None:
            raise EngineClosedError(f"{self._core!r}: its Dask client is closed")
        api = self._batch_api
        assert api is not None
        expr_type, span_metadata = api[3], api[4]
        keys = [task.key for task in tasks]
        client._graph_to_futures(
            expr_type({task.key: task for task in tasks}, _determ_token=uuid.uuid4().hex),
            keys,
            span_metadata=span_metadata(collections=[{"type": "Future"}]),
            internal_priority={key: i for i, key in enumerate(keys)},
            user_priority=priority,
            fifo_timeout="100 ms",
            **options,
        )

    def _task_done(self, op: Operation[Any], task: asyncio.Task[None]) -> None:
        """A task cancelled before its first step never ran its body (which finishes the
        operation in every other case): nothing was submitted, so ``op`` is cancelled."""
        if task.cancelled() and op._state < _DONE:
            self._core._finish(op, _CANCELLED, None, None)

    def _key(self, op: Operation[Any]) -> str:
        return f"{op.name}-{self._token}-{op._seq}"

    def _options(self, ctx: Context) -> dict[str, Any]:
        options = ctx.options
        assert options is not None
        kwargs: dict[str, Any] = {}
        if options.resources:
            kwargs["resources"] = dict(options.resources)
        if options.workers is not None:
            kwargs["workers"] = list(options.workers)
        if options.retries:
            kwargs["retries"] = options.retries
        return kwargs

    async def _run_effect(self, op: Operation[Any]) -> None:
        """A side-effect operation: submit ``fn(rctx)``, hold the Vars until it finished."""
        core = self._core
        future = None
        failure: BaseException | None = None
        result: object = None
        try:
            client = await self._ready()
            fn = op._fn
            assert fn is not None
            future = client.submit(
                _awaiting if op._kind == _CORO else _calling,
                fn,
                RunContext(op._ctx),
                key=self._key(op),
                pure=False,
                priority=_priority(op),
                **self._options(op._ctx),
            )
            await self._finished(future)
            if core._instruments:
                await self._ran_on(client, op, future)
            if future.status == "finished":
                result = await self._call(client.gather(future, asynchronous=True))
            else:  # (not raised here: it may be a KeyboardInterrupt the function raised)
                failure = await self._error(future)
        except asyncio.CancelledError as exc:
            if future is not None:
                await self._cancel_future(future)
                await self._ended(future.key)  # it holds its Vars until then, as locally
            core._finish(op, _FAILED, None, exc)  # reported as cancelled, with its message
        except Exception as exc:
            box = self._unreachable
            if box is not None and exc is box.exc:  # one record for every operation
                ready: list[Any] = []
                with core._lock:
                    core._finish_locked(op, _FAILED, None, exc, ready, box)
                    todo = core._dispatch_locked(ready) if ready else ready
                if todo:
                    core._submit(todo)
            else:
                core._finish(op, _FAILED, None, exc)
        else:
            if failure is None:
                core._finish(op, _DONE, result, None)
            else:
                core._finish(op, _FAILED, None, failure)
        finally:
            if future is not None:
                future.release()
            del future, op

    async def _ran_on(self, client: DaskClient, op: Operation[Any], future: DaskFuture) -> None:
        """Tell the instruments (a trace) which worker ran ``op``'s finished task: the one
        that holds its result, asked of the scheduler as soon as it finished (one round trip,
        only while an instrument is installed). Should Dask already have copied the result to
        a second worker for a dependent, the first address in order is named. None for a task
        that failed or was cancelled (no worker holds anything of it)."""
        where: str | None = None
        if future.status == "finished":
            try:
                who = await self._call(client.scheduler.who_has(keys=[future.key]))
            except Exception:
                who = {}
            holders = sorted(who.get(future.key, ()))
            where = holders[0] if holders else None
        _instrument.notify_ran_on(self._core, op, where)

    async def _error(self, future: DaskFuture) -> BaseException:
        """The exception of a Dask future that erred or was cancelled."""
        if future.status == "error":
            exc: BaseException = await self._call(future.exception(asynchronous=True))
            return exc.original() if type(exc) is _Escaped else exc
        distributed = _distributed()
        return distributed.client.FutureCancelledError(future.key, "cancelled")  # type: ignore[no-any-return]

    async def _cancel_future(self, future: DaskFuture) -> None:
        """Cancel ``future``'s task: not started, it never runs; running, it runs to its end
        and its result is dropped. Dask sends the cancellation in its next batch, so a task
        may still start on a worker that frees a thread in between (best effort)."""
        client = self._client
        if client is None:
            return
        try:
            await self._call(client.cancel([future], asynchronous=True))
        except (asyncio.CancelledError, Exception):
            pass  # cancelled again, or the client is closing: the key goes with it

    async def _ended(self, key: str) -> None:
        """Return once no worker runs the task of ``key`` any more (after its cancellation:
        Dask drops a cancelled task's result but cannot stop a running function, and an
        operation holds its Vars until its function has ended). Polled, as Dask sends no
        event for it; cancelling the caller again does not cut this short. A worker that
        cannot answer (it died, or the client is closing) runs nothing."""
        client = self._client
        delay = 0.005
        while client is not None:
            try:
                running = await asyncio.shield(
                    self._call(client.run(_running, key, on_error="ignore", asynchronous=True))
                )
            except asyncio.CancelledError:
                continue  # cancelled again: still wait for the function's end
            except Exception:
                return
            if not any(running.values()):
                return
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                pass
            delay = min(delay * 2, 0.2)
            client = self._client

    async def _remote_arg(self, client: DaskClient, var: Var, deps: list[RemoteVersion]) -> Any:
        """What a Var argument becomes on the worker: the future of its version."""
        with self._core._lock:  # (given, against withdraw_locked on another thread)
            value = var._value
            if type(value) is RemoteVersion:
                value.given = True
                if value not in deps:
                    deps.append(value)
                return value.future
        if value is NO_VALUE:
            raise ValueError(
                f"{var!r} carries no value: create it with engine.new_var(name, value=...) or "
                "write it first (submit(..., out=var) or var.set(value))"
            )
        cached = self._scattered.get(var)
        if cached is not None and cached[0] is value:
            pending = cached[1]
            if isinstance(pending, asyncio.Future):
                return await asyncio.shield(pending)
            return pending
        # Scattered once per version: concurrent readers of this value share the one send.
        sent: asyncio.Future[Any] = self._loop.create_future()
        self._scattered[var] = (value, sent)
        self._holders.add(var)
        key = f"{var.name}-{self._token}-v{var._version}-{uuid.uuid4().hex[:8]}"
        try:
            futures = await self._call(client.scatter({key: value}, asynchronous=True))
        except BaseException as exc:
            self._scattered.pop(var, None)
            sent.set_exception(exc)
            sent.exception()  # retrieved here: the readers sharing it raise their own copy
            raise
        future = futures[key]
        self._scattered[var] = (value, future)
        sent.set_result(future)
        return future

    async def _run_value(self, op: Operation[Any]) -> None:
        """A value operation: submit it with its Vars' versions; unless it holds, release the
        Vars at once; complete (and settle its versions) when the task has finished."""
        core = self._core
        call = op._fn
        assert type(call) is ValueCall
        versions: list[RemoteVersion] = []
        deps: list[RemoteVersion] = []
        future = None
        released = False
        inputs = (call.arg_vars, call.kw_vars)
        try:
            client = await self._ready()
            if op._prop is _NO_SKIP:
                # It runs even if a version it uses fails, on the value that failure leaves
                # (the one before): so it is sent only once they have settled.
                for var in op._vars:
                    value = var._value
                    if type(value) is RemoteVersion:
                        await value.wait_settled(self._loop)
            args = list(call.args)
            kwargs = dict(call.kwargs)
            for i, var in call.arg_vars:
                args[i] = await self._remote_arg(client, var, deps)
            for key, var in call.kw_vars:
                kwargs[key] = await self._remote_arg(client, var, deps)
            with core._lock:
                for var in op._vars:  # the previous versions of what it writes, too
                    value = var._value
                    if type(value) is RemoteVersion and value not in deps:
                        value.given = True
                        deps.append(value)
            n = None if call.single or not call.outs else len(call.outs)
            key = self._key(op)
            apply = _apply_async if inspect.iscoroutinefunction(call.fn) else _apply
            future = client.submit(
                apply,
                call.fn,
                n,
                args,
                kwargs,
                key=key,
                pure=False,
                priority=_priority(op),
                **self._options(op._ctx),
            )
            if n is None:
                parts = [future] if call.outs else []
            else:
                parts = [
                    client.submit(
                        operator.getitem, future, i, key=f"{key}-{i}", priority=_priority(op)
                    )
                    for i in range(n)
                ]
            ready: list[Any] = []
            with core._lock:
                for var, part in zip(call.outs, parts, strict=True):
                    version = RemoteVersion(part, var, var._value)
                    var._value = version
                    versions.append(version)
                if not call.holds and not core._settings.serial:
                    released = True
                    op._task = None  # submitted: only withdraw_locked can cancel it now
                    self._submitted[op] = (future, versions)
                    core._release_locked(op, _DONE, None, ready, counted=False)
                    todo = core._dispatch_locked(ready) if ready else ready
                else:
                    todo = ready
            for var in call.outs:
                self._holders.add(var)
            if todo:
                core._submit(todo)
        except asyncio.CancelledError as exc:
            if future is not None:
                await self._cancel_future(future)
            await self._settle(op, versions, released, _FAILED, None, exc, None)
            return
        except Exception as exc:
            box = self._unreachable
            if box is None or exc is not box.exc:
                box = _Failure(exc)
            await self._settle(op, versions, released, _FAILED, None, exc, box)
            return
        finally:
            del call
        await self._complete_value(op, client, future, deps, versions, released, inputs)

    async def _complete_value(
        self,
        op: Operation[Any],
        client: DaskClient,
        future: DaskFuture,
        deps: list[RemoteVersion],
        versions: list[RemoteVersion],
        released: bool,
        inputs: tuple[list[tuple[int, Var]], list[tuple[str, Var]]],
    ) -> None:
        """The rest of a submitted value operation: await its task, then settle.
        ``inputs``: its Var arguments (``ValueCall.arg_vars`` and ``kw_vars``)."""
        try:
            await self._finished(future)
            if released and op in self._withdrawn:
                with self._core._lock:
                    msg = self._withdrawn.pop(op)
                future.release()
                await self._settle(op, versions, released, _CANCELLED, msg, None, None)
                return
            if self._core._instruments:
                await self._ran_on(client, op, future)
        except asyncio.CancelledError as exc:  # a holding operation, cancelled while it ran
            await self._cancel_future(future)
            await self._ended(future.key)
            await self._settle(op, versions, released, _FAILED, None, exc, None)
            return
        try:
            state, result, failure, box = await self._outcome(
                op, client, future, deps, versions, inputs
            )
        except asyncio.CancelledError as cancel:  # a holding operation, cancelled while it ran
            await self._cancel_future(future)
            state, result, failure, box = _FAILED, None, cancel, None
        except Exception as error:
            state, result, failure, box = _FAILED, None, error, _Failure(error)
        finally:
            if not any(version.future is future for version in versions):
                future.release()  # (a version's future lives as long as the version)
            del deps
        await self._settle(op, versions, released, state, result, failure, box)

    async def _outcome(
        self,
        op: Operation[Any],
        client: DaskClient,
        future: DaskFuture,
        deps: list[RemoteVersion],
        versions: list[RemoteVersion],
        inputs: tuple[list[tuple[int, Var]], list[tuple[str, Var]]],
    ) -> tuple[OpState, object, BaseException | None, _Failure | None]:
        """How a value operation whose task has finished ends: skipped if a version it
        depends on failed (Dask then failed it with that exception), else failed or done."""
        for dep in deps:
            await dep.wait_settled(self._loop)
        failed = next((dep for dep in deps if dep.exc is not None), None)
        if failed is not None:
            cause = failed.exc
            assert cause is not None
            err = DependencyError(
                f"operation {op.name!r} was skipped: {failed.name!r} carries a failure "
                f"({summary(cause)})"
            )
            err.__cause__ = cause
            return _SKIPPED, None, err, failed.box
        if future.status != "finished":
            exc = await self._error(future)
            exc = await self._lost_inputs(op, client, exc, inputs, future.status == "cancelled")
            # An Abort records nothing (errors.Abort): its versions roll back, and only the
            # awaiter sees it.
            return _FAILED, None, exc, None if isinstance(exc, Abort) else _Failure(exc)
        result = None
        if not versions:  # no out=: its result is gathered for ``await op``
            result = await self._call(client.gather(future, asynchronous=True))
        return _DONE, result, None, None

    async def _settle(
        self,
        op: Operation[Any],
        versions: list[RemoteVersion],
        released: bool,
        state: OpState,
        result: object,
        exc: BaseException | None,
        box: _Failure | None,
    ) -> None:
        """Finish ``op`` and settle its versions (loop thread); wake what they held."""
        core = self._core
        if state is _FAILED and isinstance(exc, asyncio.CancelledError):
            state, result, exc, box = _CANCELLED, exc.args[0] if exc.args else None, None, None
        ready: list[Any] = []
        watchers: list[asyncio.Future[None]] = []
        with core._lock:
            self._submitted.pop(op, None)
            for version in versions:
                version.settled = True
                version.box = box
                # Cancelled (a holding operation, after its submission): no data either.
                if state is _CANCELLED:
                    version.exc = asyncio.CancelledError()
                elif state is _SKIPPED:  # its dependents name the root failure, as locally
                    version.exc = exc.__cause__ if exc is not None and exc.__cause__ else exc
                else:
                    version.exc = exc
                var = version.var()
                if version.exc is not None:
                    previous = version.previous
                    if type(previous) is RemoteVersion and previous.exc is not None:
                        previous = previous.fallback
                    version.fallback = previous
                    if var is not None and var._value is version:
                        var._value = previous  # a failed write leaves the value as it was
                        if box is not None:
                            var._failure = box
                version.previous = None
                ready.extend(op for op in version.waiters if op._state is _PENDING)
                version.waiters.clear()
                watchers.extend(version.watchers)
                version.watchers.clear()
            if state is _FAILED and box is not None:
                core._failures[box] = None
            if released:
                if state is not _CANCELLED and not isinstance(exc, Abort):  # Var.version
                    for var in op._mutate:
                        var._version += 1
                op._state = state
                op._result = result
                op._exception = exc if state is not _CANCELLED else None
                op._fn = None
                core._complete_locked(op, state)
            elif state is _DONE:
                core._finish_locked(op, state, result, None, ready)
            else:
                core._finish_locked(op, state, result, exc, ready, box)
            todo = core._dispatch_locked(ready) if ready else ready
        if todo:
            core._submit(todo)
        for fut in watchers:
            _set_done(fut)

    # -- local readers -------------------------------------------------------------------

    def _begin_gather(self, version: RemoteVersion) -> None:
        task = self._loop.create_task(self._gather(version))
        task.add_done_callback(_quiet)

    async def _gather(self, version: RemoteVersion) -> None:
        """Bring a settled version's value here once, for the local readers it holds."""
        core = self._core
        try:
            value = await self._call(self._ready_client().gather(version.future, asynchronous=True))
        except Exception as cause:
            # Lost (its worker left and it cannot be recomputed, or it cannot be sent here): a
            # failure of the Var, which no longer carries the value, so nothing gathers it again.
            exc = _lost(version, cause)
            box = _Failure(exc)
            with core._lock:
                version.exc = exc
                version.box = box
                core._failures[box] = None
                var = version.var()
                if var is not None and var._value is version:
                    var._value = NO_VALUE
                    var._failure = box
                    self._scattered.pop(var, None)
                ready = [op for op in version.waiters if op._state is _PENDING]
                version.waiters.clear()
                version.gathering = False
                todo = core._dispatch_locked(ready) if ready else ready
        else:
            with core._lock:
                var = version.var()
                if var is not None and var._value is version:
                    var._value = value
                    self._scattered[var] = (value, version.future)
                ready = [op for op in version.waiters if op._state is _PENDING]
                version.waiters.clear()
                version.gathering = False
                todo = core._dispatch_locked(ready) if ready else ready
        if todo:
            core._submit(todo)

    def _ready_client(self) -> DaskClient:
        assert self._client is not None  # a version exists only once connected
        return self._client

    # -- the façade's calls --------------------------------------------------------------

    def pending(self, var: Var) -> bool:
        """Whether ``var`` carries a version that has not settled (``wait_for_var``)."""
        value = var._value
        return type(value) is RemoteVersion and not value.settled

    def forget(self, var: Var) -> None:
        """Drop what ``var`` keeps on the cluster (``delete_var``, once its turn came)."""
        if type(var._value) is RemoteVersion:
            var._value = NO_VALUE
        self._scattered.pop(var, None)

    def statistics(self) -> dict[str, int]:
        """Remote versions the Vars carry, and scattered values kept (``dump()``)."""
        return {
            "versions": sum(1 for v in list(self._holders) if type(v._value) is RemoteVersion),
            "scattered": len(self._scattered),
        }

    def key_of(self, op: Operation[Any]) -> str | None:
        """The Dask key of a remote operation (``dump()``), or None for a local one."""
        if op._target is not self._executor:
            return None
        return self._key(op)

    async def aclose(self) -> None:
        """Release every key of this engine and close what the engine made (``aclose()``,
        once nothing is pending). Values still on the cluster are dropped with their keys."""
        self._executor.shutdown(False)
        for var in list(self._holders):
            if type(var._value) is RemoteVersion:
                var._value = NO_VALUE
        self._holders.clear()
        for _, future in list(self._scattered.values()):
            if not isinstance(future, asyncio.Future):
                future.release()
        self._scattered.clear()
        connecting = self._connecting
        if connecting is not None and not connecting.done():
            connecting.cancel()
            try:
                await connecting
            except (asyncio.CancelledError, Exception):
                pass
        client = self._client
        self._client = None
        if client is not None and self._own_client:
            await client.close()
        if self._own_cluster is not None:
            cluster, self._own_cluster = self._own_cluster, None
            await cluster.close()


def _lost(version: RemoteVersion, cause: BaseException) -> RuntimeError:
    """The failure of a Var whose version could not be brought here: ``cause`` is Dask's."""
    exc = RuntimeError(
        f"the value of {version.name!r} (Dask key {version.future.key!r}) could not be "
        f"gathered: {summary(cause)}; it was lost with the worker that held it (and cannot "
        "be recomputed) or cannot be sent to this process"
    )
    exc.__cause__ = cause
    return exc


def _describe(cluster: object) -> str:
    """How an error names the cluster: its address, and the connect timeout Dask used."""
    address = cluster if isinstance(cluster, str) else getattr(cluster, "scheduler_address", None)
    try:
        import dask.config
        from dask.utils import parse_timedelta

        timeout = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"))
    except Exception:
        return repr(address if address is not None else cluster)
    return f"at {address if address is not None else cluster!r} within {timeout:g} s"


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _quiet(task: asyncio.Future[Any]) -> None:
    """Retrieve a fire-and-forget task's exception (a cancel or gather that failed at close)."""
    if not task.cancelled():
        task.exception()
