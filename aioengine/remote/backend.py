"""The remote collaborator: :class:`RemoteBackend` maps the engine's rule onto Dask (the
design is in the package's docstring, :mod:`aioengine.remote`).

State (the engine lock, ``core.lock``, guards every field that another thread may read; the
rest is loop-thread only):

- ``_core``: the scheduler served (it calls the scheduler's ``_locked`` bookkeeping; the
  scheduler never imports this module). ``_loop``: its loop, where every Dask call is made.
- ``_link``: the :class:`~aioengine.remote.connection.Connection` to the cluster (its own
  state is documented there).
- ``_token``: this engine's part of every Dask key it makes (``name-token-seq``).
- ``_scattered``: per Var, the local value last sent to the cluster and its future (a weak
  mapping: a dropped Var drops its entry).
- ``_holders``: the Vars that may carry a remote version (weak), released at close.
- ``_executor``: the one :class:`RemoteExecutor` every remote context routes to.
- ``_placement``: the Vars' homes and the worker each value operation of a plain remote
  context is sent to (:mod:`~aioengine.remote.placement`, loop thread).
- ``_starting``: while :meth:`RemoteBackend.start` runs, the operations it made READY, which
  it starts next (a chain is started by a loop, not by recursion); None otherwise.
- ``_batch``: the records (:class:`_Submitted`) of the collected value operations whose
  tasks are not sent yet (a flush is scheduled whenever it is not empty); ``_batch_api``: the
  parts of Dask that sending a graph needs (None on a Dask without them: then each is sent by
  ``client.submit``).
- ``_ended``: the records of the value operations whose Dask tasks ended since the last
  :meth:`RemoteBackend._complete_ended`, which is scheduled whenever it is not empty (loop
  thread only).
- ``_submitted``: the records of the value operations released once submitted, until they
  settle (what withdrawing one needs: its future and versions); ``_withdrawn``: those that
  ``cancel()`` withdrew, with its message, until they settle. Both under the lock.

A value operation's record is its whole client-side state from its submission until it
settles. On the common path no asyncio task runs for it: its Dask future's state calls the
record when the task ends (:func:`~aioengine.remote.dask_api.watched_future`), the record
joins ``_ended``, and :meth:`RemoteBackend._complete` settles it in the next loop
iteration, with the other operations that ended meanwhile. Only what must await (a failed
task's exception, a result to gather, an input not settled yet, the instruments' question,
a withdrawal, a resend) starts a coroutine, :meth:`RemoteBackend._complete_slowly`; so does
every operation sent without a watched future (``client.submit``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import operator
import threading
import uuid
import weakref
from typing import Any

from .. import instrument as _instrument
from ..context import Context, RemoteOptions, RunContext, remote
from ..errors import Abort, DependencyError, DeviceUnavailableError, EngineClosedError, summary
from ..functions import ValueCall
from ..kinds import _CALLBACK, _CORO, _WAIT, FnProperty, OpState
from ..operation import Operation
from ..scheduler import Scheduler
from ..task import quiet
from ..var import NO_VALUE, Failure, Var, carry
from . import dask_api, worker
from .connection import Connection
from .placement import Placement
from .version import RemoteVersion, lost_error

# distributed is optional and only partly typed: its client and futures are Any here.
DaskClient = Any  # a distributed.Client
DaskFuture = Any  # a distributed.Future

__all__ = ("RemoteBackend", "RemoteExecutor", "open_remote")

_DONE = OpState.DONE
_FAILED = OpState.FAILED
_SKIPPED = OpState.SKIPPED
_CANCELLED = OpState.CANCELLED
_PENDING = OpState.PENDING
_DELETE_VAR = FnProperty.DELETE_VAR
_NO_SKIP = FnProperty.NO_SKIP


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
            "AIOENGINE_CLUSTER=tcp://host:8786. " + dask_api.INSTALL.split(";")[0]
        )
    dask_api.distributed()
    if core.loop is None:
        raise RuntimeError(
            f"{core!r} is not bound to an event loop yet, and remote operations need it (its "
            "Dask client runs there); use the engine from a coroutine first"
        )
    with core.lock:
        current = core.remote
        if current is None:
            backend = RemoteBackend(core, core.loop, cluster, security)
            core.attach_locked(remote=backend)
            return backend
    assert isinstance(current, RemoteBackend)
    return current


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
        if backend._core.loop_thread == threading.get_ident():
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


#: How many times a value operation is sent again because a version it read was aborted, or
#: because Dask cancelled it with a graph that lost a dependency (once per aborted or re-sent
#: input upstream, in practice); past it, it fails.
_RESENDS = 8


def _priority(op: Operation[Any]) -> int:
    """The ``priority`` an operation was pushed with (its run key encodes it)."""
    return (op.seq - op.key) >> 64


class _Submitted:
    """A value operation from its submission until it settles: all that completing it needs
    (and withdrawing it, or sending it again). Written on the loop thread; ``future`` and
    ``versions``, which ``withdraw_locked`` reads from any thread, under the lock.

    - ``op``, ``call``: the operation and its call (``op.fn`` is dropped at completion);
      ``args``, ``kwargs``: the arguments its task was sent (futures in place of its Vars);
    - ``deps``: the versions it depends on (those it reads, and the previous versions of
      those it writes); ``versions``: the versions it writes, in ``call.outs`` order;
    - ``future``: its task's Dask future (a new one if it is sent again); ``released``: its
      Vars were released at submission (else it holds them until it settles);
    - ``tasks``: its Dask task spec(s) until :meth:`RemoteBackend._flush` sends them (one
      ``Task``, or a list of them for a sequence ``out``), then None;
    - ``where``: the worker it was placed on (:class:`~aioengine.remote.placement.Placement`)
      until it settles, or None (not placed, or settled).
    """

    __slots__ = (
        "args",
        "backend",
        "call",
        "deps",
        "future",
        "kwargs",
        "op",
        "released",
        "tasks",
        "versions",
        "where",
    )

    def __init__(
        self,
        backend: RemoteBackend,
        op: Operation[Any],
        call: ValueCall,
        deps: list[RemoteVersion],
    ) -> None:
        self.backend = backend
        self.op = op
        self.call = call
        self.deps = deps
        self.args: list[Any] = []
        self.kwargs: dict[str, Any] = {}
        self.versions: list[RemoteVersion] = []
        self.future: DaskFuture = None
        self.released = False
        self.tasks: Any = None
        self.where: str | None = None

    def ended(self) -> None:
        """Its Dask task ended (finished, erred or was cancelled): called once by its
        future's watched state (:func:`~aioengine.remote.dask_api.watched_future`)."""
        self.backend._task_ended(self)


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
        self._link = Connection(loop, cluster, security, self._unreachable)
        self._token = uuid.uuid4().hex[:12]
        self._scattered: weakref.WeakKeyDictionary[Var, tuple[object, Any]] = (
            weakref.WeakKeyDictionary()
        )
        self._holders: weakref.WeakSet[Var] = weakref.WeakSet()
        self._executor = RemoteExecutor(self)
        self._placement = Placement(loop, self._worker_addresses)
        self._starting: collections.deque[Operation[Any]] | None = None
        self._batch: list[_Submitted] = []  # collected, not sent yet
        self._batch_api = dask_api.batch_api()
        self._ended: list[_Submitted] = []  # their tasks ended, to complete
        #: the value operations released once submitted, until they settle; lock held
        self._submitted: dict[Operation[Any], _Submitted] = {}
        #: those withdrawn by ``cancel()``, with its message, until they settle; lock held
        self._withdrawn: dict[Operation[Any], object] = {}
        self._resent = 0  # value operations sent again (part of their new keys)
        # The function last collected (weak: it may hold a large closure) and the worker
        # function that applies it (inspect.iscoroutinefunction, once per function in a row).
        self._last_fn: weakref.ref[Any] | None = None
        self._last_apply: Any = worker.apply

    def _unreachable(self, box: Failure) -> None:
        """Record the failure of connecting, once: every operation that waited for the
        connection fails with it (one error at ``aclose()``, not one per operation)."""
        with self._core.lock:
            self._core.record_failure_locked(box)

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
        if self._link.unreachable is not None:
            raise DeviceUnavailableError(self._link.unreachable_text)
        return self._executor

    def hold_locked(self, op: Operation[Any]) -> bool:
        """Hold ``op`` while a Var it uses carries a version still being computed (or, for a
        reader, not yet gathered here); False if nothing holds it. Lock held (any thread)."""
        if type(op.fn) is ValueCall:
            return False  # Dask orders it by data: it gets the futures
        scattered = self._scattered
        if scattered and op.kind != _WAIT:
            for var in op.mutate_vars:
                if var in scattered:
                    # It writes the Var (maybe in place): the copy on the cluster is stale.
                    self._core.call_soon_locked(functools.partial(self._stale, var))
        gather = (
            op.target is not self._executor
            and op.kind != _WAIT  # a wait_for_var marker needs no value
            and op.prop is not _DELETE_VAR
        )
        for var in op.vars:
            value = var._value
            if type(value) is not RemoteVersion:
                continue
            if not value.settled:
                value.hold(op)
                return True
            if not gather:
                continue  # it needs no value
            # (Gathered even if the Var carries a failure: until the operation starts, the
            # failure may be thrown, and then it runs.)
            value.hold(op)
            if not value.gathering:
                value.gathering = True
                self._core.call_soon_locked(functools.partial(self._begin_gather, value))
            return True
        return False

    def withdraw_locked(self, op: Operation[Any], msg: object) -> bool:
        """Cancel a value operation released once submitted (``cancel()`` of a running
        one), if no later operation was given a version it writes: each Var gets back the
        value it had before (what starts from now on reads that), its Dask task is cancelled
        (if it ran anyway, its result is dropped), and it ends CANCELLED when that task has.
        False if it settled, was withdrawn already, or its result was handed on. Lock held."""
        record = self._submitted.get(op)
        if record is None or op in self._withdrawn:
            return False
        if any(version.given or version.settled for version in record.versions):
            return False
        self._withdrawn[op] = msg
        for version in record.versions:
            version.withdraw()
        self._core.call_soon_locked(functools.partial(self._begin_cancel, record.future))
        return True

    async def _lost_inputs(
        self, record: _Submitted, client: DaskClient, exc: BaseException, cancelled: bool
    ) -> BaseException:
        """The failure of a value operation whose task failed with ``exc``: a value
        this process sent it that is gone (its worker died with the only copy) is forgotten,
        so that the next operation sends it again; if the cluster ``cancelled`` the task for
        that, an error that names it and the worker that held it; likewise for a computed
        input that Dask cancelled because it cannot compute it again; else ``exc`` (loop
        thread)."""
        lost: dict[str, str] = {}  # key: the Var's name
        call = record.call
        for _, var in call.arg_vars():
            cached = self._scattered.get(var)
            if cached is not None and getattr(cached[1], "status", "finished") != "finished":
                del self._scattered[var]
                lost[cached[1].key] = var.name
        computed: dict[str, str] = {}  # the same for a computed input Dask cannot redo
        if cancelled and not lost:
            for dep in record.deps:
                if getattr(dep.future, "status", "finished") != "finished":
                    computed[dep.future.key] = dep.name
        if not cancelled or not (lost or computed):
            return exc
        workers = await dask_api.removed_workers(
            self._link.call, client, [*lost.keys(), *computed.keys()]
        )

        def named(keys: dict[str, str]) -> str:
            return ", ".join(
                f"{name!r} (key {key!r}"
                + (f", on worker {workers[key]}" if key in workers else "")
                + ")"
                for key, name in keys.items()
            )

        if lost:
            error = RuntimeError(
                f"the cluster cancelled {record.op.name!r}: the value of {named(lost)} that "
                "this process sent was lost with the worker that held it, which left the "
                "cluster (it died); push the operation again to send the value again"
            )
        else:
            error = RuntimeError(
                f"the cluster cancelled {record.op.name!r}: the value of {named(computed)} was "
                "lost with the worker that held it, which left the cluster (it died), and "
                "Dask cannot compute it again (a value it was computed from is gone too)"
            )
        error.__cause__ = exc
        return error

    async def _inputs_present(self, record: _Submitted, client: DaskClient) -> bool:
        """Whether every input of ``record``'s task is still on the cluster, or known to its
        scheduler (a key lost with a worker that Dask computes again): the versions it
        depends on, and the values this process sent it (loop thread)."""
        futures = [dep.future for dep in record.deps]
        for _, var in record.call.arg_vars():
            cached = self._scattered.get(var)
            if cached is not None and not isinstance(cached[1], asyncio.Future):
                futures.append(cached[1])
        unsure = [f.key for f in futures if getattr(f, "status", "finished") != "finished"]
        if not unsure:
            return True
        states = await dask_api.task_states(self._link.call, client, unsure)
        return all(states.get(key) not in (None, "erred", "forgotten") for key in unsure)

    def _begin_cancel(self, future: DaskFuture) -> None:
        task = self._loop.create_task(self._cancel_future(future))
        task.add_done_callback(_retrieve)

    def _stale(self, var: Var) -> None:
        """Forget the copy of ``var``'s value on the cluster, which a local writer replaces
        (loop thread, after the batches already collected were sent): a reader already
        given its future keeps it; the key goes once nobody holds it."""
        self._scattered.pop(var, None)

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
        with core.lock:
            started = core.start_locked(op, todo)
            if started:
                value = type(op.fn) is ValueCall
                if not (value and self._collect_locked(op, todo)):
                    run = (self._run_value if value else self._run_effect)(op)
                    task = self._loop.create_task(run, name=op.name, context=op.snapshot)
                    quiet(task)
                    task.add_done_callback(functools.partial(self._task_done, op))
                    core.attach_task_locked(op, task)
        if todo:
            core.submit_ready(todo)
        if started:
            if core.instruments:
                _instrument.notify_start(core, op)
            if core.tracelog is not None:
                core.tracelog.started(op)

    def _collect_locked(self, op: Operation[Any], todo: list[Operation[Any]]) -> bool:
        """Add value operation ``op``'s task to the batch and release its Vars, if it can be
        done now: connected, every argument a future already (nothing to scatter), not
        holding its Vars, not in serial mode (a blocking client's calls are thread-safe).
        Its record then waits for its task's end (:meth:`_task_ended`). False if it cannot.
        Lock held, loop thread."""
        core = self._core
        call = op.fn
        assert type(call) is ValueCall
        client = self._link.client
        api = self._batch_api
        if (
            call.holds
            or op.prop is _NO_SKIP
            or core.settings.serial
            or client is None
            or api is None
        ):
            return False
        deps: list[RemoteVersion] = []
        args = list(call.args)
        kwargs = dict(call.kwargs)
        for i in call.positions:
            args[i] = arg = self._arg_now(args[i], deps)
            if arg is None:
                return False
        for name in call.keys:
            kwargs[name] = arg = self._arg_now(kwargs[name], deps)
            if arg is None:
                return False
        for var in op.vars:  # the previous versions of what it writes, too
            value = var._value
            if type(value) is RemoteVersion and value not in deps:
                value.given = True
                deps.append(value)
        record = _Submitted(self, op, call, deps)
        record.args = args
        record.kwargs = kwargs
        record.released = True
        record.where = self._place(op, record)
        task_type, parse_input = api[1], api[2]
        outs = call.outs
        n = None if call.single or not outs else len(outs)
        key = self._key(op)
        fn = call.fn
        last = self._last_fn
        if last is None or last() is not fn:  # (a loop of submits sends one function)
            self._last_apply = (
                worker.apply_async if inspect.iscoroutinefunction(fn) else worker.apply
            )
            try:
                self._last_fn = weakref.ref(fn)
            except TypeError:
                self._last_fn = None
        future, watched = dask_api.watched_future(api, client, key, record)
        record.future = future
        task = task_type(
            key,
            self._last_apply,
            fn,
            n,
            parse_input(kwargs) if kwargs else kwargs,
            *map(parse_input, args),
        )
        versions = record.versions
        if n is None:
            record.tasks = task
            if outs:
                var = outs[0]
                value = var._value
                if type(value) is not RemoteVersion:  # (one that does is a holder already)
                    self._holders.add(var)
                version = RemoteVersion(future, var, value)
                carry(var, version)
                versions.append(version)
        else:
            tasks = [task]
            for i, var in enumerate(outs):
                part_key = f"{key}-{i}"
                tasks.append(task_type(part_key, operator.getitem, parse_input(future), i))
                version = RemoteVersion(api[0](part_key, client), var, var._value)
                carry(var, version)
                versions.append(version)
                self._holders.add(var)
            record.tasks = tasks
        if record.where is not None:
            for version in versions:
                self._placement.home(version.future, record.where)
        batch = self._batch
        batch.append(record)
        if len(batch) == 1:
            self._loop.call_soon(self._flush)
        ready: list[Any] = []
        self._submitted[op] = record
        core.release_submitted_locked(op, ready)
        if ready:
            todo.extend(core.dispatch_locked(ready))
        if not watched:  # a Dask whose future states cannot tell: a task awaits it
            quiet(
                self._loop.create_task(
                    self._complete_slowly(record, False), name=op.name, context=op.snapshot
                )
            )
        return True

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
        """Send the collected tasks to Dask: one graph per priority, its tasks grouped by
        their options (a layer each). A graph that cannot be sent (a function that cannot be
        pickled) is sent again task by task, and the tasks that still cannot fail their
        operations."""
        batch, self._batch = self._batch, []
        client = self._link.client
        graphs: dict[int, dict[tuple[RemoteOptions | None, str | None], list[_Submitted]]] = {}
        for record in batch:
            op = record.op
            group = (op.ctx.options, record.where)
            graphs.setdefault(_priority(op), {}).setdefault(group, []).append(record)
        for priority, groups in graphs.items():
            try:
                self._send(
                    client,
                    [
                        (_tasks_of(records), self._options(records[0].op.ctx, records[0].where))
                        for records in groups.values()
                    ],
                    priority,
                )
            except Exception:
                every = [record for record in batch if _priority(record.op) == priority]
                for record in every:
                    try:
                        if len(every) == 1:
                            raise
                        options = self._options(record.op.ctx, record.where)
                        self._send(client, [(_tasks_of([record]), options)], priority)
                    except Exception as error:
                        dask_api.set_error(record.future, error)
                        if type(record.tasks) is list:  # a sequence out: its parts' futures
                            for version in record.versions:
                                dask_api.set_error(version.future, error)
            for records in groups.values():
                for record in records:
                    record.tasks = None

    def _send(
        self, client: DaskClient, groups: list[tuple[list[Any], dict[str, Any]]], priority: int
    ) -> None:
        if client is None:
            raise EngineClosedError(f"{self._core!r}: its Dask client is closed")
        api = self._batch_api
        assert api is not None
        dask_api.send_graph(client, api, groups, priority)

    def _task_done(self, op: Operation[Any], task: asyncio.Task[None]) -> None:
        """A task cancelled before its first step never ran its body (which finishes the
        operation in every other case): nothing was submitted, so ``op`` is cancelled."""
        if task.cancelled() and op._state < _DONE:
            self._core.finish(op, _CANCELLED, None, None)

    def _key(self, op: Operation[Any]) -> str:
        return f"{op.name}-{self._token}-{op.seq}"

    def _placeable(self, op: Operation[Any]) -> bool:
        """Whether the worker of value operation ``op`` is the engine's to choose: a plain
        :func:`~aioengine.remote` context (no ``workers=``, no ``resources=``)."""
        options = op.ctx.options
        return options is not None and options.workers is None and not options.resources

    def _place(self, op: Operation[Any], record: _Submitted) -> str | None:
        """The worker value operation ``op`` is sent to, or None (Dask decides), as the
        homes of the versions it reads and overwrites say
        (:meth:`~aioengine.remote.placement.Placement.choose`): ``record``'s Var arguments
        are futures already (a version's, or a scattered value's), and its ``deps`` hold the
        versions its ``out`` Vars carry before it."""
        if not self._placeable(op):
            return None
        call = record.call
        deps = record.deps
        args, kwargs = record.args, record.kwargs
        reads = [args[i] for i in call.positions]
        reads.extend(kwargs[name] for name in call.keys)
        outs = call.outs
        writes = [next((dep.future for dep in deps if dep.var() is var), None) for var in outs]
        return self._placement.choose(reads, writes)

    async def _worker_addresses(self) -> list[str]:
        client = self._link.client
        if client is None:
            return []
        return await dask_api.worker_addresses(self._link.call, client)

    def _options(self, ctx: Context, where: str | None = None) -> dict[str, Any]:
        """The ``client.submit`` options of a task of context ``ctx``: its own, or, placed
        on worker ``where``, that preference."""
        options = ctx.options
        assert options is not None
        if where is not None:
            kwargs: dict[str, Any] = {"workers": [where], "allow_other_workers": True}
            if options.retries:
                kwargs["retries"] = options.retries
            return kwargs
        kwargs = {}
        if options.resources:
            kwargs["resources"] = dict(options.resources)
        if options.workers is not None:
            kwargs["workers"] = list(options.workers)
            if options.allow_other_workers:
                kwargs["allow_other_workers"] = True
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
            client = await self._link.ready()
            fn = op.fn
            assert fn is not None
            future = client.submit(
                worker.awaiting if op.kind == _CORO else worker.calling,
                fn,
                RunContext(op.ctx),
                key=self._key(op),
                pure=False,
                priority=_priority(op),
                **self._options(op.ctx),
            )
            await self._link.finished(future)
            if core.instruments or core.tracelog is not None:
                await self._ran_on(client, op, future)
            if future.status == "finished":
                result = await self._link.call(client.gather(future, asynchronous=True))
            else:  # (not raised here: it may be a KeyboardInterrupt the function raised)
                failure = await self._error(future)
        except asyncio.CancelledError as exc:
            if future is not None:
                await self._cancel_future(future)
                await self._ended_on_workers(future.key)  # it holds its Vars until then
            core.finish(op, _FAILED, None, exc)  # reported as cancelled, with its message
        except Exception as exc:
            box = self._link.unreachable
            if box is not None and exc is box.exc:  # one record for every operation
                ready: list[Any] = []
                with core.lock:
                    core.finish_locked(op, _FAILED, None, exc, ready, box)
                    todo = core.dispatch_locked(ready)
                if todo:
                    core.submit_ready(todo)
            else:
                core.finish(op, _FAILED, None, exc)
        else:
            if failure is None:
                core.finish(op, _DONE, result, None)
            else:
                core.finish(op, _FAILED, None, failure)
        finally:
            if future is not None:
                future.release()
            del future, op

    async def _ran_on(self, client: DaskClient, op: Operation[Any], future: DaskFuture) -> None:
        """Tell the instruments and a running trace which worker ran ``op``'s finished task:
        the one that holds its result, asked of the scheduler as soon as it finished (one
        round trip, only while an instrument or a trace is installed). Should Dask already
        have copied the result to a second worker for a dependent, the first address in
        order is named. None for a task that failed or was cancelled (no worker holds
        anything of it)."""
        where: str | None = None
        if future.status == "finished":
            try:
                who = await self._link.call(client.scheduler.who_has(keys=[future.key]))
            except Exception:
                who = {}
            holders = sorted(who.get(future.key, ()))
            where = holders[0] if holders else None
        _instrument.notify_ran_on(self._core, op, where)
        log = self._core.tracelog
        if log is not None:
            log.ran_on(op, where)

    async def _error(self, future: DaskFuture) -> BaseException:
        """The exception of a Dask future that erred or was cancelled."""
        if future.status == "error":
            exc: BaseException = await self._link.call(future.exception(asynchronous=True))
            return exc.original() if type(exc) is worker.Escaped else exc
        return dask_api.cancelled_error(future.key)

    async def _cancel_future(self, future: DaskFuture) -> None:
        """Cancel ``future``'s task: not started, it never runs; running, it runs to its end
        and its result is dropped. Dask sends the cancellation in its next batch, so a task
        may still start on a worker that frees a thread in between (best effort)."""
        client = self._link.client
        if client is None:
            return
        try:
            await self._link.call(client.cancel([future], asynchronous=True))
        except (asyncio.CancelledError, Exception):
            pass  # cancelled again, or the client is closing: the key goes with it

    async def _ended_on_workers(self, key: str) -> None:
        """Return once no worker runs the task of ``key`` any more (after its cancellation:
        Dask drops a cancelled task's result but cannot stop a running function, and an
        operation holds its Vars until its function has ended). Polled, as Dask sends no
        event for it; cancelling the caller again does not cut this short. A worker that
        cannot answer (it died, or the client is closing) runs nothing."""
        client = self._link.client
        delay = 0.005
        while client is not None:
            try:
                running = await asyncio.shield(
                    self._link.call(
                        client.run(dask_api.task_running, key, on_error="ignore", asynchronous=True)
                    )
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
            client = self._link.client

    async def _remote_arg(self, client: DaskClient, var: Var, deps: list[RemoteVersion]) -> Any:
        """What a Var argument becomes on the worker: the future of its version."""
        with self._core.lock:  # (given, against withdraw_locked on another thread)
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
            futures = await self._link.call(client.scatter({key: value}, asynchronous=True))
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
        """A value operation that could not be collected: submit it with its Vars' versions
        (once connected, and its local values scattered); unless it holds, release the Vars at
        once; complete (and settle its versions) when the task has finished."""
        core = self._core
        call = op.fn
        assert type(call) is ValueCall
        record = _Submitted(self, op, call, [])
        try:
            client = await self._link.ready()
            if op.prop is _NO_SKIP:
                # It runs even if a version it uses fails, on the value that failure leaves
                # (the one before): so it is sent only once they have settled.
                for var in op.vars:
                    value = var._value
                    if type(value) is RemoteVersion:
                        await value.wait_settled(self._loop)
            deps = record.deps
            args = list(call.args)
            kwargs = dict(call.kwargs)
            for i in call.positions:
                args[i] = await self._remote_arg(client, args[i], deps)
            for key in call.keys:
                kwargs[key] = await self._remote_arg(client, kwargs[key], deps)
            with core.lock:
                for var in op.vars:  # the previous versions of what it writes, too
                    value = var._value
                    if type(value) is RemoteVersion and value not in deps:
                        value.given = True
                        deps.append(value)
            record.args = args
            record.kwargs = kwargs
            if self._placeable(op):
                await self._placement.known()
            record.where = self._place(op, record)
            record.future, parts = self._submit_value(
                client, op, call, args, kwargs, self._key(op), record.where
            )
            ready: list[Any] = []
            with core.lock:
                for var, part in zip(call.outs, parts, strict=True):
                    version = RemoteVersion(part, var, var._value)
                    carry(var, version)
                    record.versions.append(version)
                    if record.where is not None:
                        self._placement.home(part, record.where)
                if not call.holds and not core.settings.serial:
                    record.released = True
                    self._submitted[op] = record
                    core.release_submitted_locked(op, ready)
                    todo = core.dispatch_locked(ready)
                else:
                    todo = ready
            for var in call.outs:
                self._holders.add(var)
            if todo:
                core.submit_ready(todo)
        except asyncio.CancelledError as exc:
            if record.future is not None:
                await self._cancel_future(record.future)
            self._settle(record, _FAILED, None, exc, None)
            return
        except Exception as exc:
            box = self._link.unreachable
            if box is None or exc is not box.exc:
                box = Failure(exc)
            self._settle(record, _FAILED, None, exc, box)
            return
        finally:
            del call
        await self._complete_slowly(record, False)

    # -- completing value operations -------------------------------------------------------

    def _task_ended(self, record: _Submitted) -> None:
        """The Dask task of ``record`` ended (its future's state tells, on the client's
        loop): it joins ``_ended``, completed by :meth:`_complete_ended` at the next loop
        iteration, not within Dask's handling of the scheduler's report."""
        if threading.get_ident() != self._core.loop_thread:  # a blocking client's thread
            if not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._task_ended, record)
            return
        ended = self._ended
        ended.append(record)
        if len(ended) == 1:
            self._loop.call_soon(self._complete_ended)

    def _complete_ended(self) -> None:
        """Complete the value operations whose tasks ended since the last call, in the order
        the client learnt of it (a task's inputs first): :meth:`_complete` (loop thread)."""
        ended, self._ended = self._ended, []
        done = 0
        try:
            for record in ended:
                done += 1
                self._complete(record)
        finally:
            for left in ended[done:]:  # (only if one raised)
                self._task_ended(left)

    def _complete(self, record: _Submitted) -> None:
        """Complete a value operation whose task has ended, here and now on the common path:
        its task finished, it has versions (its result stays on the cluster), every version it
        depends on has settled, and neither an instrument nor a withdrawal is involved; then
        it is done, or skipped if a version it depends on failed (as :meth:`_outcome` decides
        once it could await). Anything else goes to :meth:`_complete_slowly` (a trace too: it
        asks the scheduler where the task ran)."""
        op = record.op
        future = record.future
        slow = (
            future.status != "finished"
            or not record.versions
            or self._core.instruments
            or self._core.tracelog is not None
            or (record.released and op in self._withdrawn)
        )
        if not slow:
            for dep in record.deps:
                if not dep.settled:
                    slow = True
                    break
        if slow:
            task = self._loop.create_task(
                self._complete_slowly(record, True), name=op.name, context=op.snapshot
            )
            quiet(task)
            return
        skipped = self._skip(record)
        if skipped is None:
            state, failure, box = _DONE, None, None
        else:
            state, failure, box = _SKIPPED, *skipped
        if not any(version.future is future for version in record.versions):
            future.release()  # (a version's future lives as long as the version)
        self._settle(record, state, None, failure, box)

    async def _complete_slowly(self, record: _Submitted, ended: bool) -> None:
        """The rest of a submitted value operation that :meth:`_complete` could not finish
        at once: await its task (unless it ``ended`` already), then settle (or, if it failed
        only because a version it read was aborted, send it again on the value the abort left:
        :meth:`_resend`, and await that, at most ``_RESENDS`` times)."""
        for _ in range(_RESENDS):
            if not await self._await_value(record, ended):
                return
            ended = False
        error = RuntimeError(
            f"{record.op.name!r} was sent again {_RESENDS} times: its inputs kept aborting "
            "(or Dask kept cancelling it)"
        )
        self._settle(record, _FAILED, None, error, Failure(error))

    async def _await_value(self, record: _Submitted, ended: bool) -> bool:
        """One round of :meth:`_complete_slowly`: False once settled, True if its task was
        sent again."""
        op = record.op
        future = record.future
        client = self._link.client
        try:
            if not ended:
                await self._link.finished(future)
            if record.released and op in self._withdrawn:
                with self._core.lock:
                    msg = self._withdrawn.pop(op)
                future.release()
                self._settle(record, _CANCELLED, msg, None, None)
                return False
            if self._core.instruments or self._core.tracelog is not None:
                await self._ran_on(client, op, future)
        except asyncio.CancelledError as exc:  # a holding operation, cancelled while it ran
            await self._cancel_future(future)
            await self._ended_on_workers(future.key)
            self._settle(record, _FAILED, None, exc, None)
            return False
        try:
            state, result, failure, box = await self._outcome(record, client)
            if state is None:  # failed for an aborted input: sent again
                await self._resend(record, client)
                return True
        except asyncio.CancelledError as cancel:  # a holding operation, cancelled while it ran
            await self._cancel_future(future)
            state, result, failure, box = _FAILED, None, cancel, None
        except Exception as error:
            state, result, failure, box = _FAILED, None, error, Failure(error)
        finally:
            if not any(version.future is future for version in record.versions):
                future.release()  # (a version's future lives as long as the version)
        self._settle(record, state, result, failure, box)
        return False

    def _submit_value(
        self,
        client: DaskClient,
        op: Operation[Any],
        call: ValueCall,
        args: list[Any],
        kwargs: dict[str, Any],
        key: str,
        where: str | None,
    ) -> tuple[DaskFuture, list[DaskFuture]]:
        """Submit a value operation's task by ``client.submit`` under ``key`` (placed on
        worker ``where``, if not None): its future, and the futures of what its ``out`` Vars
        get (one per Var of a sequence ``out``)."""
        n = None if call.single or not call.outs else len(call.outs)
        apply = worker.apply_async if inspect.iscoroutinefunction(call.fn) else worker.apply
        priority = _priority(op)
        future = client.submit(
            apply,
            call.fn,
            n,
            kwargs,
            *args,
            key=key,
            pure=False,
            priority=priority,
            **self._options(op.ctx, where),
        )
        if n is None:
            return future, [future] if call.outs else []
        parts = [
            client.submit(operator.getitem, future, i, key=f"{key}-{i}", priority=priority)
            for i in range(n)
        ]
        return future, parts

    async def _resend(self, record: _Submitted, client: DaskClient) -> None:
        """Send a value operation again, its task having failed only because a version it
        read was aborted (``ae.Abort``: its operation rolled back) or sent again itself, or
        cancelled by Dask with the rest of its graph while its own inputs are all there:
        each such argument is now the value the abort left (the version before, or the
        local value, scattered), or the version's new future. Its own versions take the new
        futures, so what reads them sees the new values; so does ``record.future``."""
        op, call, args, kwargs = record.op, record.call, record.args, record.kwargs
        future = record.future
        by_first = {id(dep.first): dep for dep in record.deps}

        async def now(arg: Any) -> Any:
            dep = by_first.get(id(arg))
            if dep is None:
                return arg
            if not isinstance(dep.exc, Abort):
                return dep.future
            value = dep.fallback
            if type(value) is RemoteVersion:
                return value.future
            if value is NO_VALUE:
                raise ValueError(
                    f"{dep.name!r} carries no value: the write {op.name!r} read was aborted "
                    "and nothing was written before it"
                )
            return await self._link.call(client.scatter(value, asynchronous=True))

        new_args = list(args)
        for i in call.positions:
            new_args[i] = await now(args[i])
        new_kwargs = dict(kwargs)
        for name in call.keys:
            new_kwargs[name] = await now(kwargs[name])
        self._resent += 1
        key = f"{self._key(op)}-again{self._resent}"
        again, parts = self._submit_value(client, op, call, new_args, new_kwargs, key, record.where)
        with self._core.lock:
            for version, part in zip(record.versions, parts, strict=True):
                version.future = part
                if record.where is not None:
                    self._placement.home(part, record.where)
            record.future = again
        if not any(version.future is future for version in record.versions):
            future.release()

    def _skip(self, record: _Submitted) -> tuple[BaseException, Failure | None] | None:
        """Whether a value operation whose dependencies have all settled is skipped: if one
        of them failed (Dask then failed its task with that exception), its error and the
        root failure's record, else None. An aborted version failed nothing (errors.Abort):
        what read it is sent again instead."""
        failed = next(
            (dep for dep in record.deps if dep.exc is not None and not isinstance(dep.exc, Abort)),
            None,
        )
        if failed is None:
            return None
        cause = failed.exc
        assert cause is not None
        err = DependencyError(
            f"operation {record.op.name!r} was skipped: {failed.name!r} carries a failure "
            f"({summary(cause)})"
        )
        err.__cause__ = cause
        return err, failed.box

    async def _outcome(
        self, record: _Submitted, client: DaskClient
    ) -> tuple[OpState | None, object, BaseException | None, Failure | None]:
        """How a value operation whose task has finished ends: skipped if a version it
        depends on failed (:meth:`_skip`), else failed or done; None for the state if it must
        be sent again (:meth:`_resend`)."""
        deps = record.deps
        for dep in deps:
            await dep.wait_settled(self._loop)
        skipped = self._skip(record)
        if skipped is not None:
            return _SKIPPED, None, *skipped
        future = record.future
        if future.status != "finished":
            exc = await self._error(future)
            if isinstance(exc, Abort) and any(
                isinstance(dep.exc, Abort) or dep.future is not dep.first for dep in deps
            ):
                return None, None, None, None  # maybe only its input's abort: send it again
            cancelled = future.status == "cancelled"
            if cancelled and await self._inputs_present(record, client):
                # Dask cancels every key of a graph in which one dependency is lost: a task
                # of the same batch as an operation whose input died with its worker. Its own
                # inputs are all there: send it again.
                return None, None, None, None
            exc = await self._lost_inputs(record, client, exc, cancelled)
            # An Abort records nothing (errors.Abort): its versions roll back, and only the
            # awaiter sees it.
            return _FAILED, None, exc, None if isinstance(exc, Abort) else Failure(exc)
        result = None
        if not record.versions:  # no out=: its result is gathered for ``await op``
            result = await self._link.call(client.gather(future, asynchronous=True))
        return _DONE, result, None, None

    def _settle(
        self,
        record: _Submitted,
        state: OpState,
        result: object,
        exc: BaseException | None,
        box: Failure | None,
    ) -> None:
        """Finish a value operation and settle its versions (loop thread); wake what they
        held."""
        core = self._core
        op = record.op
        if record.where is not None:
            self._placement.settled(record.where)
            record.where = None
        if state is _FAILED and isinstance(exc, asyncio.CancelledError):
            state, result, exc, box = _CANCELLED, exc.args[0] if exc.args else None, None, None
        ready: list[Any] = []
        watchers: list[asyncio.Future[None]] = []
        with core.lock:
            self._submitted.pop(op, None)
            # Cancelled (a holding operation, after its submission): no data either; skipped:
            # its dependents name the root failure, as locally.
            if state is _CANCELLED:
                why: BaseException | None = asyncio.CancelledError()
            elif state is _SKIPPED:
                why = exc.__cause__ if exc is not None and exc.__cause__ else exc
            else:
                why = exc
            for version in record.versions:
                version.settle(why, box, ready, watchers)
            if state is _FAILED and box is not None:
                core.record_failure_locked(box)
            if record.released:
                cancelled = state is _CANCELLED
                core.complete_released_locked(
                    op,
                    state,
                    result,
                    None if cancelled else exc,
                    count=not cancelled and not isinstance(exc, Abort),  # Var.version
                )
            elif state is _DONE:
                core.finish_locked(op, state, result, None, ready)
            else:
                core.finish_locked(op, state, result, exc, ready, box)
            todo = core.dispatch_locked(ready)
        if todo:
            core.submit_ready(todo)
        for fut in watchers:
            _set_done(fut)

    # -- local readers -------------------------------------------------------------------

    def _begin_gather(self, version: RemoteVersion) -> None:
        task = self._loop.create_task(self._gather(version))
        task.add_done_callback(_retrieve)

    async def _gather(self, version: RemoteVersion) -> None:
        """Bring a settled version's value here once, for the local readers it holds."""
        core = self._core
        ready: list[Any] = []
        try:
            client = self._ready_client()
            value = await self._link.call(client.gather(version.future, asynchronous=True))
        except Exception as cause:
            # Lost (its worker left and it cannot be recomputed, or it cannot be sent here).
            exc = lost_error(version, cause)
            box = Failure(exc)
            with core.lock:
                core.record_failure_locked(box)
                var = version.lost(exc, box, ready)
                if var is not None:
                    self._scattered.pop(var, None)
                todo = core.dispatch_locked(ready)
        else:
            with core.lock:
                var = version.gathered(value, ready)
                if var is not None:
                    self._scattered[var] = (value, version.future)
                todo = core.dispatch_locked(ready)
        if todo:
            core.submit_ready(todo)

    def _ready_client(self) -> DaskClient:
        assert self._link.client is not None  # a version exists only once connected
        return self._link.client

    # -- the façade's calls --------------------------------------------------------------

    def pending(self, var: Var) -> bool:
        """Whether ``var`` carries a version that has not settled (``wait_for_var``)."""
        value = var._value
        return type(value) is RemoteVersion and not value.settled

    def forget(self, var: Var) -> None:
        """Drop what ``var`` keeps on the cluster (``delete_var``, once its turn came)."""
        if type(var._value) is RemoteVersion:
            carry(var, NO_VALUE)
        self._scattered.pop(var, None)

    def statistics(self) -> dict[str, int]:
        """Remote versions the Vars carry, and scattered values kept (``dump()``)."""
        return {
            "versions": sum(1 for v in list(self._holders) if type(v._value) is RemoteVersion),
            "scattered": len(self._scattered),
        }

    def key_of(self, op: Operation[Any]) -> str | None:
        """The Dask key of a remote operation (``dump()``), or None for a local one."""
        if op.target is not self._executor:
            return None
        return self._key(op)

    async def aclose(self) -> None:
        """Release every key of this engine and close what the engine made (``aclose()``,
        once nothing is pending). Values still on the cluster are dropped with their keys."""
        self._executor.shutdown(False)
        for var in list(self._holders):
            if type(var._value) is RemoteVersion:
                carry(var, NO_VALUE)
        self._holders.clear()
        for _, future in list(self._scattered.values()):
            if not isinstance(future, asyncio.Future):
                future.release()
        self._scattered.clear()
        await self._placement.aclose()
        await self._link.aclose()


def _tasks_of(records: list[_Submitted]) -> list[Any]:
    """The Dask tasks of the collected ``records``, in order."""
    tasks: list[Any] = []
    for record in records:
        if type(record.tasks) is list:
            tasks.extend(record.tasks)
        else:
            tasks.append(record.tasks)
    return tasks


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Retrieve a fire-and-forget task's exception (a cancel or gather that failed at close)."""
    if not task.cancelled():
        task.exception()
