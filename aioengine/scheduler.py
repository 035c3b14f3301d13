"""The scheduler: the per-operation cycle of an engine, and nothing else.

The rule it keeps: two operations of which at least one mutates a common Var run in the order
they were pushed; commute and concurrent accesses of a Var form groups whose members may run
in any order (one at a time) or together (``var.py``, where the grant rule lives).
:class:`Scheduler` is the core behind the :class:`~aioengine.Engine` façade
(``engine.py``): the façade validates arguments, binds settings, runs the lifecycle and the
waits, and calls in here for the cycle every operation goes through:

1. *Admission* (:meth:`Scheduler.push` checks and routes it, then :meth:`_admit_locked`):
   under ``lock``, the operation takes the next sequence number and appends one request per
   Var to the Vars' queues (``var.py``, where the grant rule lives). A push is atomic across
   all of its Vars, so two threads pushing on the same Vars in opposite orders cannot build
   a cycle (MXNet 1.9.1 deadlocks there).
2. *Grant and dispatch* (:meth:`dispatch_locked`, :meth:`submit_ready`): when an operation's last
   request is granted it is READY and goes to its executor: the thread pool of its context
   (``executors/``), or the loop queue for coroutine functions, ``FnProperty.ASYNC`` functions
   and serial mode.
3. *Run* (:meth:`execute`, :meth:`_execute_one`): the executor starts the operation (or skips
   it when an input carries a failure) and runs its function.
4. *Finish and release* (:meth:`finish`, :meth:`_finish_and_continue`): under ``lock`` the
   outcome is recorded, the Vars are released and whatever became ready is dispatched, on the
   thread that finished (MXNet continues on the completing thread too).
5. *Cancel* (``cancellation.py``) and *bulk segments* (``bulk.py``:
   :class:`~aioengine.bulk.Segments`, the core's part that joins, queues and runs them,
   beside the user's scope).

Nothing touches the event loop unless someone waits: loop futures exist only for awaiters of
an operation, of ``wait_for_var`` and of ``wait_for_all``. Worker threads hand such wake-ups to
the loop in batches (``wakeups.py``) with one ``call_soon_threadsafe``.

Collaborators sit above this module and are reached through one field each, behind one cheap
test: ``gpu`` (``gpu_sync.py``: GPU streams and fences; None until the first GPU push),
``remote`` (``remote/``: operations on a Dask cluster; None until the first remote push),
both behind ``may_hold`` on the dispatch path, so the CPU-only path pays one test for the
two, and ``instruments`` (``observe/``: empty on the fast path). This module imports none
of them; the façade injects the GPU and remote openers. A running trace records through
``tracelog`` (``tracelog.py``, a core module: None on the fast path), which
``observe/trace.py`` reads once the trace has stopped.

The scheduler's state, every field documented once, and its invariants are
``corestate.py``'s (:class:`~aioengine.corestate.CoreState`, the base of :class:`Scheduler`).

The API for the façade and the collaborators (bulk, GPU, remote, task, observers), as in
distributed's ``WorkerState``: the fields without a leading underscore are the state they
may read, and only the core's modules (this one, ``corestate.py``, ``bulk.py``,
``cancellation.py``, ``routing.py``, ``wakeups.py``) assign them (``tools/reach.py`` counts
any other writer, and lint holds that count at 0); the collaborators change the state only
through the methods without a leading underscore, a ``_locked`` suffix saying the caller
holds ``lock``. Those of :class:`Scheduler`:

- running: :meth:`start_locked` (an executor claims a READY operation), :meth:`execute`
  (every executor's runner), :meth:`finish` (its outcome, from any thread),
  :meth:`finish_locked`, :meth:`dispatch_locked` then :meth:`submit_ready` (what a release
  made READY, handed to executors once unlocked); for bulk segments also
  :meth:`enqueue_loop_locked`, :meth:`claim_loop_op_locked` and :meth:`skip_locked`;
- release early, complete later (the GPU once enqueued, the remote backend once
  submitted): :meth:`release_locked` or :meth:`release_submitted_locked`, then
  :meth:`complete_released_locked`; ``complete_locked`` makes any operation final;
  :meth:`attach_task_locked` (the task a remote operation's wait runs in);
- admission :meth:`push`, and :meth:`queue_marker_locked` (``wait_for_var``'s marker).

And those of ``CoreState``: ``complete_locked`` (every operation's completion: counters,
``wait_for_all``, awaiters and callbacks), ``call_soon_locked`` (a callback on the loop),
``require_loop``, ``check_fork``, ``running_op``,
``attach_locked`` (an opener attaches the GPU or the remote collaborator),
``record_failure_locked``, ``take_failure_locked`` and ``take_failures`` (the façade's waits
throw them), ``set_state_locked``, ``shutdown_executors``, ``abandon_executors``; the waiters
are ``wakeups``'.

Observers (``observe/``, the façade's waits) only read: they may take ``lock`` to read a
consistent snapshot of ``live``, ``finished``, ``instruments``, ``segments.open`` and the
Vars and operations reachable from them, and read ``loop_thread`` and ``forked``; they call
no method of this class (a dump asks ``remote.key_of`` for a remote operation's Dask key).
Installing an instrument goes through ``Engine.add_instrument`` and closing an open bulk
segment through the façade's entry points.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import operator
import threading
from collections.abc import Callable
from types import FunctionType
from typing import Any

from . import instrument as _instrument
from . import lifecycle
from .bulk import Segments
from .context import Context, DeviceType, RunContext, cpu
from .corestate import COMPILED as _COMPILED
from .corestate import CoreState, State
from .errors import (
    Abort,
    DependencyError,
    EngineClosedError,
    OperatorDeletedError,
    VarDeletedError,
    report,
    summary,
    trim_traceback,
)
from .executors import Executor
from .executors.gpu import GpuExecutor
from .functions import default_name, delete_nothing, returned_coroutine
from .kinds import _BULK, _CORO, _SYNC, _WAIT, FnProperty, OpState, check_priority, check_prop
from .lock import Deferred
from .lock import defer as _defer
from .operation import (
    _COROUTINE_TYPES,
    OnComplete,
    Operation,
    OprHandle,
    new_operation,
)
from .task import start_task
from .var import (
    WRITE,
    Failure,
    Var,
    append_all,
    append_modes,
    release_all,
    release_modes,
    take_tokens,
    withdraw_all,
)

__all__ = ("Scheduler", "State")


_get_running_loop = asyncio._get_running_loop
_partial = functools.partial
_get_ident = threading.get_ident
# The collection under way: a finalizer it runs may call the engine (lock.py).
_collection = lifecycle.collection
# Unbound, so that the compiled core calls it without a method lookup per operation.
_context_run = contextvars.Context.run

_PENDING = OpState.PENDING
_READY = OpState.READY
_RUNNING = OpState.RUNNING
_DONE = OpState.DONE
_FAILED = OpState.FAILED
_SKIPPED = OpState.SKIPPED
_CANCELLED = OpState.CANCELLED

_NO_SKIP = frozenset({FnProperty.NO_SKIP, FnProperty.DELETE_VAR})
_NORMAL = FnProperty.NORMAL
_OPEN = State.OPEN
_CLOSING = State.CLOSING
_CPU0 = cpu(0)
_GPU = DeviceType.GPU
_CPU = DeviceType.CPU
_REMOTE = DeviceType.REMOTE
_LOOP_BUDGET = 256  # inline operations run per loop callback before the loop's other work
_run_order = operator.attrgetter("key")  # run queues: higher priority first, then push order
_push_order = operator.attrgetter("seq")
_NOTHING: list[Any] = []  # nothing to submit (push's admission): never appended to


def _cancel_message(exc: BaseException) -> object:
    """The message of a CancelledError (None if it has none), kept as a cancelled
    operation's ``_result`` (Operation._cancelled_error raises it again)."""
    return exc.args[0] if exc.args else None


# The compiled core's C functions that take an operation out of the cycle collector's passes
# and put it back (collector.pxd, cimported by scheduler.pxd). Declared, not bound: the pure
# Python scheduler hides nothing, and calls them only ``if _COMPILED``.
_hide: Callable[[Operation[Any]], None]
_show: Callable[[Operation[Any]], None]
# And the calling thread's ident as a C call (lock.pxd), for the pushes' and the finishes'
# critical sections; threading.get_ident() (_get_ident) is a Python call.
_thread_ident: Callable[[], int]


class Scheduler(CoreState):
    """The per-operation cycle of one engine: admission, grant, dispatch, run, finish.

    Created by :class:`~aioengine.Engine`, which owns it as ``engine._core``; its state is
    its base's, :class:`~aioengine.corestate.CoreState` (``corestate.py`` documents every
    field). Not a public class: its API for the façade, the collaborators and the observers
    is listed in this module's docstring.
    """

    def push(
        self,
        owner: object,
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
        modes: tuple[int, ...] | None = None,
        made: Operation[Any] | None = None,
    ) -> Operation[Any]:
        """Validate the rest, append the requests atomically and dispatch if ready.

        ``owner`` is the façade pushing: the operation holds it (see ``Operation.owner``).
        ``modes``: the mode of each Var of ``mutate`` (``var.py``: WRITE, COMMUTE,
        CONCURRENT) when some is not a write; None when all are.
        Called by a finalizer (inside a critical section of this thread, or run by the
        garbage collector), it returns the operation at once and admits it later, without
        any lock of this thread's held (:meth:`_admit_deferred`, which passes it back in
        as ``made``; ``lock.py`` says when).
        """
        loop = self.loop
        if _COMPILED:  # noqa: SIM108  (a conditional expression would box the C int)
            me = _thread_ident()  # noqa: F821  (scheduler.pxd: compiled only)
        else:
            me = _get_ident()
        lock = self.lock
        collecting = _collection.thread  # (a C int in the compiled core: me is not boxed)
        if lock.owner == me or collecting == me:  # from a finalizer (lock.py)
            if name is None:
                name = default_name(fn)
            op = new_operation(self, owner, fn, kind, ctx, const, mutate, prop, priority, name)
            push = _partial(self.push, owner, fn, kind, ctx, const, mutate, prop, priority,
                            name, deleting, handle, modes, op)  # fmt: skip
            _defer(lock, me, Deferred(self._admit_deferred, op, push))
            return op
        # On the bound loop's thread while it runs (the usual case), the full check is not
        # needed; it asks the running loop, which costs a getpid() system call.
        running = self._loop_is_running
        if loop is None or self.forked or me != self.loop_thread or not running():  # type: ignore[misc]
            loop = self._bind()  # (_loop_is_running is set with _loop)
        if type(ctx) is not Context:
            raise TypeError(f"ctx must be an aioengine.Context (cpu(i) or gpu(i)), got {ctx!r}")
        if type(prop) is not FnProperty:
            check_prop(prop)
        if type(priority) is not int:
            priority = check_priority(priority)
        if name is None:
            if type(fn) is FunctionType:
                name = fn.__qualname__
            elif type(fn) is _partial and type(fn.func) is FunctionType:
                name = fn.func.__qualname__
            else:
                name = default_name(fn)
        elif type(name) is not str:
            raise TypeError(f"name must be a str or None, got {name!r}")
        if kind == _CORO:  # on the loop; _route checks a GPU context's device
            target = None if ctx.device_type is _CPU else self._route(ctx, prop, kind)
        else:
            last_ctx, last_prop, target = self._last_route
            if ctx is not last_ctx or prop is not last_prop:
                target = self._route(ctx, prop, kind)
        if (
            deleting is not None
            and loop is not None
            and (fn is delete_nothing or self.state is _CLOSING)
        ):
            # A deletion with nothing to run finishes on the loop: no thread hop. One pushed
            # while the engine closes (by a finalizer) runs there too: the pools may be
            # shutting down, the loop runs until the close ends.
            target = None
        if target is None and loop is None:
            raise RuntimeError(
                f"{self!r} is not bound to an event loop yet, and {name!r} must run on it "
                "(coroutine, FnProperty.ASYNC or serial mode); use the engine from a "
                "coroutine first"
            )
        bulk = 0  # the segment size, when this operation joins a bulk segment (bulk.py)
        segments = self.segments  # (a typed local: scheduler.pxd)
        if (
            segments.scopes
            and target is None
            and kind == _SYNC
            and handle is None
            and deleting is None
            and ctx.device_type is _CPU
            and me == self.loop_thread
            and modes is None
        ):
            bulk = segments.size_for(self)
        if made is None:
            op = new_operation(
                self, owner, fn, kind, ctx, const, mutate, prop, priority, name, target
            )
        else:
            op = made
            op.target = target
        lock.enter(me)
        try:
            if _COMPILED:  # out of the cycle collector's passes until it completes (collector.py)
                _hide(op)  # noqa: F821  (scheduler.pxd: compiled only)
            todo = self._admit_locked(
                op, ctx, const, mutate, handle, deleting, modes, bulk, segments
            )
        except BaseException:
            if _COMPILED:  # refused: its snapshot must be tracked before it is freed
                _show(op)  # noqa: F821  (scheduler.pxd: compiled only)
            raise
        finally:
            lock.leave()
        if todo is None:
            assert target is not None
            self._submit_one(target, op)
        elif todo:
            self.submit_ready(todo)
        return op

    def _admit_locked(
        self,
        op: Operation[Any],
        ctx: Context,
        const: tuple[Var, ...],
        mutate: tuple[Var, ...],
        handle: OprHandle[Any] | None,
        deleting: Var | None,
        modes: tuple[int, ...] | None,
        bulk: int,
        segments: Segments,
    ) -> list[Operation[Any]] | None:
        """Admission, :meth:`push`'s critical section (lock held): refuse ``op`` if the engine
        is not open or a Var or handle it uses was deleted; give it the next sequence number;
        append its requests to its Vars' queues, atomically across them, or join it to the
        open bulk segment (``bulk``: the segment's size, 0 outside one; ``segments`` is
        ``self.segments``, typed once by the caller).

        Returns what to submit once the lock is released: None for ``op`` itself, READY, to
        its executor; else a list of operations (empty: ``op`` waits for its turn, was parked
        for a commute token, joined a segment or was queued for the loop thread).
        """
        sequencer = self._sequencer
        if self.state is not _OPEN and (deleting is None or self.state is not _CLOSING):
            # A deletion is clean-up, which a finalizer may push while the engine closes:
            # accepted until the close ends (it runs on the loop then, the pools shutting
            # down: see push; the close waits for it).
            raise EngineClosedError(f"{self!r} is {self.state.value}; create a new Engine")
        if handle is not None and handle._deleted:
            raise OperatorDeletedError(f"{handle!r} was deleted; build a new one")
        if self._deleted_vars:
            for v in (*const, *mutate):
                if v._deleted:
                    raise VarDeletedError(f"{v!r} was deleted; operation {op.name!r} cannot use it")
        if segments.open is not None and not bulk:
            segments.flush_locked(self)  # it queues on its Vars before this operation
        self.seq += 1
        op.seq = seq = self.seq
        priority = op.priority
        op.key = seq - (priority << 64) if priority else seq
        self.live[seq] = op
        if self.instruments:
            _instrument.notify_locked(self, "on_push", op)
        if self.tracelog is not None:
            self.tracelog.pushed(op)
        if bulk:
            segments.join_locked(self, op, bulk)
            return _NOTHING
        # Appending is what a push promises to do atomically across its Vars, in the
        # critical section that gave it its sequence number: so every Var's queue is in
        # push order, which Var._holds relies on.
        if modes is not None and ctx.device_type is _CPU:
            op.modes = modes
            wait = append_modes(op, const, mutate, modes)
            if sequencer is not None and not sequencer._append(op, 1):
                wait += 1
            if not wait and not take_tokens(op):
                return _NOTHING  # admitted everywhere, parked for a busy commute token
        else:  # (the read/write-only path falls through: no jump)
            # A GPU or remote operation's commute and concurrent Vars are written, in push
            # order (an order those modes allow): its device work is fenced, and its Dask
            # task holds its Vars, as a writer's.
            wait = append_all(op, const, mutate)
            if sequencer is not None and not sequencer._append(op, 1):
                wait += 1
        if deleting is not None:
            deleting._deleted = op
            self._deleted_vars = True
        if wait:
            op.nwait = wait
            return _NOTHING
        if self.may_hold:  # GPU fences or remote versions may hold it
            return self.dispatch_locked([op])
        op._state = _READY
        if op.target is None:
            if self.loop_queue.put_locked(op):  # enqueue_loop_locked, inlined
                self.call_soon_locked(self._run_loop_queue)
            return _NOTHING
        return None

    def _admit_deferred(self, op: Operation[Any], push: Callable[[], object]) -> None:
        """Push ``op``, which a finalizer pushed inside a critical section, now that the
        section or the collection has ended (a :class:`~aioengine.lock.Deferred` call; no
        lock held).

        ``push`` is the :meth:`push` call that admits it (``op`` passed as ``made``). Its
        caller got ``op`` back long ago, so a push refused now (the engine closed, a Var
        deleted meanwhile) fails ``op`` with that error and reports it, except a deletion
        refused because the engine is closed (clean-up with nothing left to do; one pushed
        while it closes is admitted, see :meth:`_admit_locked`).
        """
        try:
            push()
        except Exception as exc:
            with self.lock:
                if op._state is _PENDING and not op.seq:  # never admitted
                    op._state = _FAILED
                    op._exception = exc
                    op.fn = None
                    op.vars = ()
                    if op.waiters is not None or op.callbacks is not None:
                        self._notify_locked(op)
            if op.prop is FnProperty.DELETE_VAR and self.state is not _OPEN:
                return  # a deletion refused by a closed engine: nothing is left to delete
            report(
                self.loop,
                self.loop_thread,
                f"{op.name!r}, pushed by a finalizer, could not be pushed",
                exc,
            )

    def _route(self, ctx: Context, prop: FnProperty, kind: int) -> Executor | None:
        """Return the executor for ``(ctx, prop)`` (``routing.py``); None means the event-loop
        thread. A CPU context's route becomes the last one taken, which pushes check first."""
        target = self.routes.route(self, ctx, prop, kind)
        if ctx.device_type is _CPU and kind != _CORO:
            self._last_route = (ctx, prop, target)
        return target

    def dispatch_locked(self, ready: list[Any]) -> list[Operation[Any]]:
        """Mark newly ready operations READY (lock held).

        Host consumers of pending GPU work wait for its fences first. Wait markers complete
        at once (which may append more operations to ``ready``, handled in the same pass);
        operations for the loop thread join its queue. Returns the ones to submit to their
        executors once the lock is released, and, on the loop thread while its queue is
        empty (so no queued operation of higher priority is overtaken), coroutine operations
        to start there at once: creating a task runs nothing, and it saves their tasks a
        trip through the loop queue (a chain of coroutine operations costs one loop
        iteration less per operation). Not with a task factory, which may start the task
        eagerly, in the caller. Nothing ready: ``ready`` itself, empty (the hot paths test
        ``ready`` first themselves, and call only when something became ready).
        """
        if not ready:
            return ready
        todo: list[Operation[Any]] = []
        queue = self.loop_queue
        i = 0
        while i < len(ready):
            op = ready[i]
            i += 1
            if op.kind == _WAIT:
                if self.may_hold and self._held_locked(op):
                    continue
                # Its result: the failure its Var carries now that every earlier user has
                # finished, not one that a later operation records before the waiter resumes.
                self.finish_locked(op, _DONE, op.mutate_vars[0]._failure, None, ready)
            elif op._state is _PENDING:
                if self.may_hold and self._held_locked(op):
                    continue
                op._state = _READY
                if op.target is not None:
                    todo.append(op)
                elif (
                    op.kind == _CORO
                    and queue.head == len(queue.fifo)  # queue.empty_locked(), inlined
                    and not queue.heap
                    and _get_ident() == self.loop_thread
                    and self.loop is not None
                    and self.loop.get_task_factory() is None
                ):
                    todo.append(op)  # started at once by submit_ready
                elif queue.put_locked(op):  # enqueue_loop_locked, inlined
                    self.call_soon_locked(self._run_loop_queue)
        return todo

    def _held_locked(self, op: Operation[Any]) -> bool:
        """Whether a collaborator holds ``op``, READY by the Vars' rule, back (lock held): a
        host consumer of GPU data (or a wait marker) until the GPU fences it depends on
        complete, any operation until the remote versions it uses have settled."""
        gpu = self.gpu
        if (
            gpu is not None
            and (op.kind == _WAIT or type(op.target) is not GpuExecutor)
            and gpu.hold_for_fences_locked(op)
        ):
            return True
        remote = self.remote
        return remote is not None and remote.hold_locked(op)

    def submit_ready(self, todo: list[Operation[Any]]) -> None:
        """Hand READY operations to their executors, or start them on the loop thread (see
        :meth:`dispatch_locked`); lock not held."""
        if len(todo) > 1:
            todo.sort(key=_run_order)  # the loop's ones start in this order
        for op in todo:
            if op.target is None:
                self._execute_one(op, None)
            else:
                self._submit_one(op.target, op)

    def _submit_one(self, target: Executor, op: Operation[Any]) -> None:
        """Submit one READY operation; from the loop thread, wake workers once per iteration.

        A burst of pushes from the loop then hands the workers one wake-up instead of one per
        operation (each wake-up of a sleeping thread costs a GIL hand-off).
        """
        if _get_ident() != self.loop_thread:
            if not target.submit(op, op.key, True):
                self.routes.not_submitted(self, op)
            return
        if not target.submit(op, op.key, False):
            self.routes.not_submitted(self, op)
            return
        wakes = self._wakes
        if target not in wakes:
            if not wakes:
                assert self.loop is not None
                self.loop.call_soon(self._flush_wakes)
            wakes.append(target)

    def _flush_wakes(self) -> None:
        """Wake the executors that the loop thread submitted to (loop thread)."""
        wakes = self._wakes
        self._wakes = []
        for target in wakes:
            target.wake()

    def enqueue_loop_locked(self, op: Operation[Any]) -> None:
        """Queue a READY operation for the loop thread; run the queue soon (lock held)."""
        if self.loop_queue.put_locked(op):
            self.call_soon_locked(self._run_loop_queue)

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
                lock = self.lock
                lock.enter(_get_ident())
                try:
                    op = self.claim_loop_op_locked(todo)
                    if op is None:
                        self.loop_queue.scheduled = False
                finally:
                    lock.leave()
                if todo:
                    self.submit_ready(todo)  # what skipped operations released
                if op is None:
                    return
                while op is not None:
                    # A bulk segment runs all its members in this one call: each one counts.
                    budget -= len(op._result) if op.kind == _BULK else 1
                    op = self._execute_one(op, None, True, budget > 0)
        except BaseException:
            # KeyboardInterrupt or SystemExit from an inline operation (recorded, and the loop
            # stops): while the queue stays scheduled nothing schedules this again.
            self._reschedule_loop_queue()
            raise
        self._reschedule_loop_queue()

    def _reschedule_loop_queue(self) -> None:
        """After a run of the loop queue that did not empty it: run it again soon, if needed."""
        with self.lock:
            if not self.loop_queue.empty_locked():
                self.call_soon_locked(self._run_loop_queue)
            else:
                self.loop_queue.scheduled = False

    def claim_loop_op_locked(self, todo: list[Operation[Any]]) -> Operation[Any] | None:
        """Take the best READY operation of the loop queue and mark it RUNNING (lock held).

        Cancelled ones are dropped, skipped ones finished (what they release is appended
        to ``todo``, for the caller to submit once the lock is released).
        """
        queue = self.loop_queue
        while True:
            op = queue.pop_locked()
            if op is None or self.start_locked(op, todo):
                return op
            self.lock.after.append(op)  # cancelled or skipped: released once unlocked

    def start_locked(self, op: Operation[Any], todo: list[Operation[Any]]) -> bool:
        """Mark READY ``op`` RUNNING and return True; False if it was cancelled while queued
        or is skipped because an input carries a failure (what a skip releases is appended to
        ``todo``, for the caller to submit once the lock is released). Lock held."""
        if op._state is not _READY:
            return False
        if self.failures and op.kind != _BULK:  # a segment's members check their own
            skipped = self.skip_locked(op)
            if skipped is not None:
                todo.extend(skipped)
                return False
        op._state = _RUNNING
        return True

    def run_here(self, op: Operation[Any]) -> bool:
        """:meth:`Operation.run_here`: run READY sync ``op``, queued on a CPU pool and taken
        by no worker, now on the calling thread (the loop's, or one that none of the engine's
        pools owns), or queued for the loop thread when that is the caller; return whether
        its function ran. Taken out of the queue first, it is run by nobody else; then it
        starts and finishes as on a worker (as the loop's queue runs it), its successors
        submitted as usual (skipped or cancelled at its start, it ran nothing: False)."""
        if op.state is not _READY or op.kind != _SYNC:
            return False
        target = op.target
        ctx = op.ctx
        on_loop = _get_ident() == self.loop_thread
        if target is None and on_loop:
            # Queued for the loop thread, and this is it: run it now rather than when the
            # loop next runs its queue (the order among READY operations is a hint only).
            with self.lock:
                taken = self.loop_queue.unqueue_locked(op)
            if not taken:
                return False
            try:
                self._execute_one(op, None, False, False)
            except BaseException:
                # An interrupt before it started (as on the pool path below): back in the
                # loop's queue, or it would hold its Vars for ever.
                if op.state is _READY:
                    with self.lock:
                        self.enqueue_loop_locked(op)
                raise
            state = op.state
            return state is _DONE or state is _FAILED
        if target is None or ctx is None or ctx.device_type is not _CPU:
            return False
        if not on_loop and self.routes.on_worker_thread(self):
            return False  # a worker waits for nothing it could run instead: it would nest
        unqueue = getattr(target, "unqueue", None)
        if unqueue is None or unqueue(op.key) is None:
            return False
        try:
            self._execute_one(op, None if on_loop else self.routes.run_context(ctx), False, False)
        except BaseException:
            # An interrupt before it started (a signal reaches the main thread, and the
            # engine's own code defers it only where lock.py's guard sees it): back to the
            # pool, or it would hold its Vars for ever. (On the loop's thread _execute_one
            # records a KeyboardInterrupt the function raised, then raises it: it ended.)
            if op.state is _READY and not target.submit(op, op.key, True):
                self.routes.not_submitted(self, op)
            raise
        state = op.state
        if state is _FAILED and not on_loop:
            # Recorded, as on a worker; the caller's thread raises an interrupt the function
            # raised (the user's code is interruptible on the main thread), as the loop's does.
            exc = op.exception()
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise exc
        return state is _DONE or state is _FAILED

    @staticmethod
    def execute(op: Operation[Any], rctx: RunContext) -> None:
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
        self = op.core
        if rctx.ctx.device_type is _GPU:
            gpu = self.gpu  # set before its first executor existed
            assert gpu is not None
            gpu.execute(op, rctx)
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
        """Run ``op`` (see :meth:`execute`); return a successor this thread claimed to run.

        ``rctx`` is None on the loop thread. ``claimed``: ``op`` is already RUNNING
        (:meth:`_finish_and_continue` or :meth:`claim_loop_op_locked` started it).
        ``more``: whether to claim a successor at all.
        """
        if not claimed:
            todo: list[Operation[Any]] = []
            lock = self.lock
            lock.enter(_get_ident())
            try:
                started = self.start_locked(op, todo)
            finally:
                lock.leave()
            if not started:
                if todo:
                    self.submit_ready(todo)
                return None
        kind = op.kind
        if kind != _BULK:  # a segment's members are reported instead
            if self.instruments:
                _instrument.notify_start(self, op)
            if self.tracelog is not None:
                self.tracelog.started(op)
        ctx = op.ctx
        if rctx is None:
            if ctx is not self.loop_ctx:  # by identity: Context hashes in Python
                self.loop_rctx = self.routes.run_context(ctx)
                self.loop_ctx = ctx
            rctx = self.loop_rctx
            assert rctx is not None
        elif rctx.ctx is not ctx:  # e.g. the shared CPU priority pool
            rctx = (
                self.routes.run_context(ctx)
                if rctx.stream is None
                else RunContext(ctx, rctx.stream)
            )
        fn = op.fn
        if kind == _SYNC:
            assert fn is not None
            try:
                result = _context_run(op.snapshot, fn, rctx)
            except BaseException as exc:
                # Drop this frame from the traceback: the recorded failure must not keep the
                # operation (and through it its Vars) alive until someone throws it.
                trim_traceback(exc)
                self.finish(op, _FAILED, None, exc)
                # The failure's frames reach this frame through f_back: hold no operation.
                del op, fn
                if isinstance(exc, (KeyboardInterrupt, SystemExit)) and (
                    _get_ident() == self.loop_thread
                ):
                    raise  # inline on the loop thread: recorded, and the loop still stops
                return None
            if result is not None and type(result) in _COROUTINE_TYPES:
                self.finish(op, _FAILED, None, returned_coroutine(op.name, result))
            elif more:
                return self._finish_and_continue(op, result)
            else:
                self.finish(op, _DONE, result, None)
        elif kind == _CORO:
            assert fn is not None
            start_task(self.loop, op, fn, rctx)
        elif kind == _BULK:
            segments = self.segments  # (a typed local: scheduler.pxd)
            return segments.run(self, op, more)
        else:
            assert fn is not None
            token = OnComplete(op)
            try:
                result = _context_run(op.snapshot, fn, rctx, token)
            except BaseException as exc:
                trim_traceback(exc)
                token.raised(exc)
                del op, fn, token  # as above: the failure's frames reach this frame
                if isinstance(exc, (KeyboardInterrupt, SystemExit)) and (
                    _get_ident() == self.loop_thread
                ):
                    raise  # as a sync operation's, above
                return None
            if type(result) in _COROUTINE_TYPES:
                token.raised(returned_coroutine(op.name, result))
        return None

    def skip_locked(self, op: Operation[Any]) -> list[Operation[Any]] | None:
        """Inherit an input's failure at start; skip ``op`` unless it is NO_SKIP.

        Called with the lock held when ``failures`` is not empty. As in MXNet, the failure is
        taken at start (when every earlier writer of the inputs has finished), from the first
        const Var carrying one that ``op`` sees (one thrown after ``op`` was pushed still
        counts: ``Failure.seen_by``), else the first mutated Var. Returns None when ``op``
        should run; when it was skipped, the operations its release made ready, for the
        caller to submit once the lock is released.
        """
        if self.ledger.thrown:
            self.ledger.retire(next(iter(self.live), None))
        seq = op.seq
        for v in op.vars:
            box = v._failure
            if box is not None and box.seen_by(seq):
                assert box.exc is not None
                op.inherited = box
                if op.prop in _NO_SKIP:
                    if op.modes is None:  # its release takes the slow path (_done_locked)
                        op.modes = (WRITE,) * (len(op.vars) - op.nreads)
                    return None
                err = DependencyError(
                    f"operation {op.name!r} was skipped: {v.name!r} carries a failure "
                    f"({summary(box.exc)})"
                )
                err.__cause__ = box.exc
                ready: list[Any] = []
                self.finish_locked(op, _SKIPPED, None, err, ready)
                return self.dispatch_locked(ready) if ready else []
        return None

    def finish(
        self, op: Operation[Any], state: OpState, result: object, exc: BaseException | None
    ) -> None:
        """Record ``op``'s outcome, release its Vars, dispatch what became ready."""
        if state is _FAILED and isinstance(exc, asyncio.CancelledError):
            # The function ended itself with CancelledError: the operation reports
            # cancelled, with that error's message (as a task's does).
            state, result, exc = _CANCELLED, _cancel_message(exc), None
        ready: list[Any] = []
        # Dropped by the critical section, released when this returns (lock.py's invariant).
        _held = (op.fn, op.vars)
        lock = self.lock
        lock.enter(_get_ident())
        try:
            if state is _DONE:
                self._done_locked(op, result, ready)
            else:
                self.finish_locked(op, state, result, exc, ready)
            todo = self.dispatch_locked(ready) if ready else ready
        finally:
            lock.leave()
        if todo:
            self.submit_ready(todo)

    def _finish_and_continue(self, op: Operation[Any], result: object) -> Operation[Any] | None:
        """:meth:`finish` a sync ``op`` that returned; start its successor on this thread.

        On a worker, the successor is an operation of the same pool that this completion
        made ready, else the best one queued on the pool; with a failure recorded the start
        must check for skips, so none is claimed then. On the loop thread it is the best one
        of the loop queue (:meth:`claim_loop_op_locked`, which checks for skips). It is
        marked RUNNING in the same critical section as ``op``'s completion (one lock round
        trip per operation, not two) and the caller runs it on its own thread: READY and in
        no queue (or just taken from one), nobody else can.
        """
        target = op.target
        queue = self.loop_queue
        ready: list[Any] = []
        nxt = None
        # Dropped by the critical section, released when this returns (lock.py's invariant;
        # the caller holds op's function).
        _held = op.vars
        lock = self.lock
        if _COMPILED:
            lock.enter(_thread_ident())  # noqa: F821  (scheduler.pxd: compiled only)
        else:
            lock.enter(_get_ident())
        try:
            self._done_locked(op, result, ready)
            if (
                target is None
                and len(ready) == 1
                and queue.head == len(queue.fifo)  # queue.empty_locked(), inlined
                and not queue.heap
                and not self.failures
                and not self.may_hold
            ):
                only: Operation[Any] = ready[0]
                if only.target is None and only.kind != _WAIT:
                    # The one operation made ready runs on the loop too and nothing else
                    # waits there: it is the best of the loop queue without going through it.
                    # (dispatch_locked's other checks do not apply: no failure to inherit, no GPU
                    # fence to wait for, and a wait marker is not run but completed.)
                    only._state = _RUNNING
                    return only
            todo = self.dispatch_locked(ready) if ready else ready
            if target is None:
                nxt = self.claim_loop_op_locked(todo)
            # Abandoned (interpreter exit): this worker must return to its pool and stop.
            elif not self.failures and not target.abandoned:
                for i, candidate in enumerate(todo):
                    if candidate.target is target:
                        nxt = todo.pop(i)
                        break
                else:
                    while (nxt := target.take()) is not None and nxt._state is not _READY:
                        lock.after.append(nxt)  # cancelled while queued: released later
                if nxt is not None:
                    nxt._state = _RUNNING
        finally:
            lock.leave()
        if nxt is None or target is None:
            if todo:
                self.submit_ready(todo)  # a worker returns to its pool and pops one of them
            return nxt
        if todo:
            # This worker goes on with nxt: wake others for every operation queued here.
            for other in todo:
                if other.target is target:
                    if not target.submit(other, other.key, False):
                        self.routes.not_submitted(self, other)
                else:
                    self._submit_one(other.target, other)
            target.wake(caller_pops=False)
        return nxt

    def _done_locked(self, op: Operation[Any], result: object, ready: list[Any]) -> None:
        """:meth:`finish_locked` for an operation whose function returned ``result`` (lock
        held): every operation's path, so the release is inlined unless a failure is to be
        recorded (an input's, inherited by a NO_SKIP operation) or it has commute or
        concurrent Vars: one test, ``modes``, which ``skip_locked`` sets for the former."""
        op._state = _DONE
        op._result = result
        if op.modes is None:  # nothing inherited either (skip_locked): the fast path
            release_all(op.vars, op.nreads, ready, True)
            if self._sequencer is not None:
                self._sequencer._release(True, ready, True)
            op.fn = None
        else:
            self.release_locked(op, _DONE, None, ready)
        self.complete_locked(op, _DONE)

    def finish_locked(
        self,
        op: Operation[Any],
        state: OpState,
        result: object,
        exc: BaseException | None,
        ready: list[Any],
        box: Failure | None = None,
    ) -> None:
        """The bookkeeping of :meth:`finish` (lock held; no user code runs here).

        ``box``: the failure record to share, for a failure that many operations have in
        common (a failed GPU); by default a FAILED state records a new one.
        """
        op._state = state
        op._result = result
        op._exception = exc
        self.lock.after.append(op.vars)  # released once unlocked (lock.py)
        self.release_locked(op, state, exc, ready, box)
        self.complete_locked(op, state)

    def release_locked(
        self,
        op: Operation[Any],
        state: OpState,
        exc: BaseException | None,
        ready: list[Any],
        box: Failure | None = None,
        counted: bool = True,
    ) -> None:
        """Record ``op``'s failure on what it mutates and release its Vars (lock held).

        A GPU operation does this once enqueued and completes later (``complete_locked``).
        :meth:`_done_locked` inlines the common case (a successful operation with no failure
        to record). ``counted=False``: its writes do not count towards :attr:`Var.version`
        yet (a remote value operation released once submitted counts them when it settles).
        """
        after = self.lock.after
        # Its function and the failures it replaces may hold user objects: released once
        # unlocked (lock.py).
        after.append(op.fn)
        after.append(op.inherited)
        wrote = state is not _CANCELLED
        if wrote:
            if box is None:
                box = op.inherited
                if state is _FAILED:
                    assert exc is not None
                    if isinstance(exc, Abort):
                        # Rolled back (errors.Abort): its Vars keep the failure (or none) and
                        # version they had, and only its awaiter sees exc.
                        box = None
                        wrote = False
                    else:
                        box = Failure(exc)
                        self.failures[box] = None
            if box is not None:
                for v in op.mutate_vars:
                    after.append(v._failure)
                    v._failure = box
        if op.segment is not None:
            # A bulk segment's member: the segment holds its Vars and releases them after its
            # last member; the member counts its own writes (Var.version).
            if wrote:
                for v in op.mutate_vars:
                    v._version += 1
            op.fn = None
            op.inherited = None
            return
        completed = wrote and counted and op.kind != _WAIT
        if op.nwait:  # cancelled before its turn on some Vars: see _withdraw_locked
            self._withdraw_locked(op, completed, ready)
        else:
            if op.modes is None:
                release_all(op.vars, op.nreads, ready, completed)
            else:
                release_modes(op, ready, completed)
            if self._sequencer is not None and op.kind != _WAIT:
                self._sequencer._release(True, ready, completed)
        op.fn = None
        op.inherited = None

    def _withdraw_locked(self, op: Operation[Any], completed: bool, ready: list[Any]) -> None:
        """Release the granted requests of an operation cancelled before all its Vars'
        turns came; its other requests become tombstones (``op`` is CANCELLED already).

        Or of one cancelled while parked for a commute token (``nwait`` -1: every request
        granted, no token taken): it leaves the contenders it waits among."""
        assert op._state is _CANCELLED, op
        withdraw_all(op, ready, completed)
        sequencer = self._sequencer
        if sequencer is not None and op.kind != _WAIT:
            if sequencer._holds(op):
                sequencer._release(True, ready, completed)
            else:
                sequencer._withdraw(ready)
        op.nwait = 0

    def release_submitted_locked(self, op: Operation[Any], ready: list[Any]) -> None:
        """Release the Vars of ``op``, a remote value operation just submitted to Dask (the
        data orders it now), without counting its writes yet; from now on no task of its
        own can cancel it (the remote collaborator's ``withdraw_locked`` may). Complete it
        with :meth:`complete_released_locked` (lock held)."""
        op.task = None
        self.release_locked(op, _DONE, None, ready, counted=False)

    def attach_task_locked(self, op: Operation[Any], task: asyncio.Task[Any]) -> None:
        """``task`` runs ``op`` on the loop (a remote operation awaiting its Dask task):
        ``Operation.cancel`` of the running operation cancels it (lock held)."""
        op.task = task

    def complete_released_locked(
        self,
        op: Operation[Any],
        state: OpState,
        result: object,
        exc: BaseException | None,
        box: Failure | None = None,
        count: bool = False,
    ) -> None:
        """Complete ``op``, whose Vars :meth:`release_locked` released before it finished
        (the GPU collaborator's, once its work is enqueued; the remote one's, once submitted),
        with its outcome; ``box``: a failure found after the release (a failed device), now
        recorded on what it wrote; ``count``: its writes count towards :attr:`Var.version`
        now (released by :meth:`release_submitted_locked`). Release early, complete later:
        the collaborators' one way to finish such an operation (lock held)."""
        if count:
            for v in op.mutate_vars:
                v._version += 1
        if box is not None:
            for v in op.mutate_vars:
                v._failure = box
        op._state = state
        op._result = result
        op._exception = exc
        op.fn = None
        self.complete_locked(op, state)

    def queue_marker_locked(
        self, marker: Operation[None], var: Var, fut: asyncio.Future[None]
    ) -> list[Operation[Any]]:
        """Queue ``wait_for_var``'s marker on ``var``, in push order, ``fut`` its awaiter's
        future; returns what to submit once unlocked (the marker, granted at once, goes
        through dispatch: GPU work on ``var`` may still hold it). Lock held."""
        marker.waiters = [fut]
        self.seq += 1  # a marker's request takes its place in the queue's push order
        marker.seq = marker.key = self.seq
        if var._append(marker, 1):
            return self.dispatch_locked([marker])
        marker.nwait = 1
        return []
