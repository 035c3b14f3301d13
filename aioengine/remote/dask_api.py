"""Every private name of Dask (and of asyncio's tasks) that the remote collaborator uses, in
one place: the one file to read on a Dask upgrade.

Dask's public API cannot send several tasks in one graph message, observe a future's end
without a thread or a task, or say which worker left with a key; these helpers do, through
names that Dask may move. Each one degrades to the public API (or to a plainer message, or to
a task that awaits the future) where the name is missing, and :func:`missing` lists what this
Dask lacks, which ``tests/test_remote.py`` checks so that an upgrade that moves one fails
loudly.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Iterable
from typing import Any, Protocol

from ..errors import DeviceUnavailableError

__all__ = (
    "INSTALL",
    "batch_api",
    "cancelled_error",
    "distributed",
    "missing",
    "removed_workers",
    "send_graph",
    "set_error",
    "state_wait",
    "task_running",
    "task_states",
    "watched_future",
    "worker_addresses",
)

INSTALL = (
    "remote operations need Dask distributed: pip install 'aioengine[dask]'; then give the "
    "engine a cluster (Engine(cluster='local'), Engine(cluster='tcp://host:8786'), or the "
    "environment variable AIOENGINE_CLUSTER=tcp://host:8786)"
)

#: The states in which a worker's task still runs its function (executing, or cancelled or
#: resumed while executing): ``distributed.worker_state_machine``'s names.
_RUNNING_STATES = frozenset({"executing", "long-running", "cancelled", "resumed"})


def distributed() -> Any:
    """Import ``distributed``, or raise DeviceUnavailableError saying how to install it."""
    try:
        import distributed
    except ImportError as exc:
        raise DeviceUnavailableError(INSTALL) from exc
    return distributed


def batch_api() -> tuple[Any, ...] | None:
    """What sending several tasks in one graph needs of Dask (its Future, Task,
    parse_input, LLGExpr, SpanMetadata, HLGExpr, HighLevelGraph, MaterializedLayer and
    ``Client._graph_to_futures``), or None on a Dask that lacks them: each value operation is
    then sent by its own ``client.submit``."""
    try:
        from dask._expr import HLGExpr, LLGExpr
        from dask._task_spec import Task, parse_input
        from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
        from distributed import Client, Future
        from distributed.spans import SpanMetadata
    except ImportError:
        return None
    params = inspect.signature(Client._graph_to_futures).parameters
    if not {"span_metadata", "internal_priority", "user_priority"} <= params.keys():
        return None
    return (
        Future,
        Task,
        parse_input,
        LLGExpr,
        SpanMetadata,
        HLGExpr,
        HighLevelGraph,
        MaterializedLayer,
    )


class Watcher(Protocol):
    """What :func:`watched_future` tells when its task ends."""

    def ended(self) -> None:
        """The task ended: finished, erred or was cancelled (called once, on the thread of
        the client's loop, from within Dask's handling of the scheduler's report)."""


_watched_state: Any = None  # the FutureState subclass, made on first use (None: not yet)


def _watched_state_type() -> Any:
    """A subclass of Dask's ``FutureState`` that calls its watcher's ``ended()`` once, when the
    client learns that the task finished, erred or was cancelled (the moments its event is
    set: what awaiting the future waits for); False on a Dask without it."""
    global _watched_state
    if _watched_state is not None:
        return _watched_state
    try:
        from distributed.client import FutureState
    except ImportError:
        _watched_state = False
        return False
    if not all(callable(getattr(FutureState, n, None)) for n in ("finish", "set_error", "cancel")):
        _watched_state = False
        return False

    class WatchedState(FutureState):
        __slots__ = ("watcher",)

        def __init__(self, key: str, watcher: Watcher) -> None:
            super().__init__(key)
            self.watcher: Watcher | None = watcher

        def finish(self, type: Any = None) -> None:
            super().finish(type)  # type: ignore[no-untyped-call]
            self._ended()

        def set_error(self, exception: Any, traceback: Any) -> None:
            super().set_error(exception, traceback)  # type: ignore[no-untyped-call]
            self._ended()

        def cancel(self, reason: Any = None, msg: Any = None) -> None:
            super().cancel(reason=reason, msg=msg)  # type: ignore[no-untyped-call]
            self._ended()

        def _ended(self) -> None:
            watcher = self.watcher
            if watcher is not None:
                self.watcher = None  # once; and the record no longer lives as long as the key
                watcher.ended()

    _watched_state = WatchedState
    return WatchedState


def watched_future(api: tuple[Any, ...], client: Any, key: str, watcher: Watcher) -> Any:
    """A new future of ``key`` (not submitted yet: :func:`send_graph` sends its task) whose
    end calls ``watcher.ended()``, once, with no task or thread of its own: its state (shared
    by every future of the key on this client) is a ``FutureState`` that tells it. Returns
    the future, and whether it is watched (False on a Dask without it: await it instead)."""
    state_type = _watched_state_type()
    futures = getattr(client, "futures", None)
    if state_type is False or type(futures) is not dict or key in futures:
        return api[0](key, client), False
    state = futures[key] = state_type(key, watcher)
    future = api[0](key, client)  # it takes the state the client holds for the key
    if future._state is not state:
        return future, False
    return future, True


def send_graph(
    client: Any,
    api: tuple[Any, ...],
    groups: list[tuple[list[Any], dict[str, Any]]],
    priority: int,
) -> None:
    """Send ``groups`` of tasks (built with ``api``, :func:`batch_api`'s), each with its
    ``client.submit`` options (``workers=``, ``resources=``, ...), as one graph message.

    One group goes as a plain graph with its options for every task; several go as a graph
    of layers, one per group, each annotated with its group's options (which Dask's scheduler
    applies per task), so that operations placed on different workers still cost one
    message, not one each."""
    span_metadata = api[4]
    keys = [task.key for tasks, _ in groups for task in tasks]
    if len(groups) == 1:
        tasks, options = groups[0]
        expr = api[3]({task.key: task for task in tasks}, _determ_token=uuid.uuid4().hex)
    else:
        options = {}
        hlg_expr, graph_type, layer_type = api[5], api[6], api[7]
        layers = {
            f"aioengine-{i}": layer_type(
                {task.key: task for task in tasks}, annotations=dict(group) or None
            )
            for i, (tasks, group) in enumerate(groups)
        }
        expr = hlg_expr(
            dsk=graph_type(layers, {name: set() for name in layers}),
            low_level_optimizer=None,
            output_keys=keys,
            _determ_token=uuid.uuid4().hex,
        )
    futures = client._graph_to_futures(
        expr,
        keys,
        span_metadata=span_metadata(collections=[{"type": "Future"}]),
        internal_priority={key: i for i, key in enumerate(keys)},
        user_priority=priority,
        fifo_timeout="100 ms",
        **options,
    )
    # They duplicate the engine's own futures (made as the tasks were collected): released
    # (Dask's own Future.release, which defers the work to the client's loop).
    for future in futures.values():
        future.release()


def set_error(future: Any, error: BaseException) -> None:
    """Fail a future whose task could not be sent (it never reached the scheduler)."""
    future._state.set_error(error, error.__traceback__)


def state_wait(future: Any) -> Awaitable[None] | None:
    """What to await until ``future`` has finished, erred or been cancelled, read from its
    state on the client's loop (no thread, no transfer); None on a Dask without it."""
    wait = getattr(getattr(future, "_state", None), "wait", None)
    return None if wait is None else wait()


def cancelled_error(key: str) -> BaseException:
    """The exception of a future that was cancelled, as Dask raises it."""
    return distributed().client.FutureCancelledError(key, "cancelled")  # type: ignore[no-any-return]


def task_running(key: str, dask_worker: Any = None) -> bool:
    """On a worker (``client.run``): whether a function of task ``key`` still runs there."""
    state = getattr(dask_worker, "state", None)
    task = state.tasks.get(key) if state is not None else None
    return task is not None and task.state in _RUNNING_STATES


async def removed_workers(call: Any, client: Any, keys: Iterable[str]) -> dict[str, str]:
    """The address of the worker whose removal lost each of ``keys`` (scattered or computed
    data), read from the scheduler's event log with ``call`` (how
    the backend awaits a client coroutine); best effort: what the log no longer holds is
    left out."""
    found: dict[str, str] = {}
    try:
        events = await call(client.scheduler.events(topic="all"))
    except Exception:
        return found
    wanted = set(keys)
    for _, event in events:
        if isinstance(event, dict) and event.get("action") == "remove-worker":
            gone = {
                *event.get("lost-scattered-tasks", ()),
                *event.get("lost-computed-tasks", ()),
            }
            for key in wanted & gone:
                found[key] = str(event.get("worker"))
    return found


async def worker_addresses(call: Any, client: Any) -> list[str]:
    """The addresses of the cluster's workers, asked of its scheduler (through ``call``,
    :meth:`~aioengine.remote.connection.Connection.call`): an asynchronous client's
    ``scheduler_info()`` lists none."""
    identity = await call(client.scheduler.identity())
    return list(identity.get("workers", {}))


async def task_states(call: Any, client: Any, keys: Iterable[str]) -> dict[str, str | None]:
    """The scheduler's state of each of ``keys`` (None: it does not know the key, or the
    question failed), asked with ``call``."""
    wanted = list(keys)
    try:
        states = await call(client.scheduler.get_task_status(keys=wanted))
    except Exception:
        return dict.fromkeys(wanted)
    return {key: states.get(key) for key in wanted}


def missing() -> list[str]:
    """The private names above that this Dask lacks (empty when all are there)."""
    gone = []
    if batch_api() is None:
        gone.append("the graph API (dask._expr.LLGExpr, Client._graph_to_futures, ...)")
    try:
        from distributed.client import FutureState
    except ImportError:
        gone.append("distributed.client.FutureState")
    else:
        for name in ("wait", "set_error", "finish", "cancel"):
            if not callable(getattr(FutureState, name, None)):
                gone.append(f"FutureState.{name}")
    try:
        from distributed.worker_state_machine import TaskState
    except ImportError:
        gone.append("distributed.worker_state_machine.TaskState")
    else:
        if "state" not in getattr(TaskState, "__dataclass_fields__", {}):
            gone.append("TaskState.state")
    try:
        from distributed.scheduler import Scheduler
    except ImportError:
        gone.append("distributed.scheduler.Scheduler")
    else:
        if not callable(getattr(Scheduler, "get_events", None)):
            gone.append("Scheduler.get_events (the 'events' handler)")
    return gone
