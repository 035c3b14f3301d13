"""Bulk execution: inline operations pushed in a burst run as one segment (MXNet's ``bulk``).

Inside ``with engine.bulk(n):``, the sync operations that run on the event-loop thread anyway
(``FnProperty.ASYNC`` ones, and every sync operation in serial mode), pushed from that thread,
are collected into a *segment* of up to ``n`` operations instead of each queueing on its Vars.
A segment is one request per Var on the union of its members' Vars (a Var some member writes
counts as written); when its turn comes it runs its members one after the other, in push
order, in one loop callback. Each member is still a full :class:`~aioengine.Operation`: it can
be awaited and cancelled, gets its own result or failure, and an input's failure skips it as
usual (a member that fails skips the later members that use what it wrote).

What a segment saves is the per-operation trip through the Vars' queues and the loop's run
queue; what it costs is granularity: the whole segment waits until *all* its Vars are free,
and a later operation on any of them waits for the whole segment. The push-order rule is kept
because no operation outside a segment is pushed while it is open:

- a push that does not join the open segment (another kind of operation, a push from another
  thread, a ``wait_for_var``) first closes it, so it queues on its Vars behind the segment;
- a segment also closes when it holds ``n`` operations, when the ``with`` block ends, when
  something waits (``wait_for_all``, ``aclose``, awaiting a member, ``dump``, ``graph``),
  and at the latest on the loop's next iteration, so a member never waits for the block to
  end and awaiting one inside the block cannot hang.

The scope is carried by a context variable and names the task that entered it, so it covers
that task only, as MXNet's thread-local bulk size covers one thread: not the other tasks of the
loop, nor the tasks started inside the block (``create_task`` copies the context, and so does
a coroutine operation's task), nor functions the loop calls (segment members among them).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import instrument as _instrument
from .context import cpu
from .errors import EngineClosedError, trim_traceback
from .functions import returned_coroutine
from .kinds import _BULK, FnProperty, OpState
from .operation import _COROUTINE_TYPES, Operation, new_operation
from .var import Var, append_all, release_all

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ("Bulk", "Segments")

_PENDING = OpState.PENDING
_READY = OpState.READY
_RUNNING = OpState.RUNNING
_DONE = OpState.DONE
_FAILED = OpState.FAILED
_NORMAL = FnProperty.NORMAL
_CPU0 = cpu(0)
# Unbound, so that the compiled core calls it without a method lookup per member.
_context_run = contextvars.Context.run
_get_ident = threading.get_ident

#: The innermost active bulk scope of the current context (task or thread).
_current: contextvars.ContextVar[Bulk | None] = contextvars.ContextVar(
    "aioengine_bulk", default=None
)


class Bulk:
    """The scope of :meth:`Engine.bulk <aioengine.Engine.bulk>`: use it in a ``with``
    statement, once.

    Attributes:
        size: the most operations one segment holds.
    """

    __slots__ = ("_active", "_core", "_outer", "_task", "_token", "_used", "size")

    def __init__(self, core: Scheduler, size: int) -> None:
        if type(size) is not int:
            raise TypeError(f"size must be an int, got {size!r}")
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self._core = core
        self.size = size
        self._outer: Bulk | None = None  # the scope active when this one was entered
        self._token: contextvars.Token[Bulk | None] | None = None
        # The task that entered the block: pushes from other contexts that copied this one
        # (tasks started in the block) are not grouped.
        self._task: asyncio.Task[object] | None = None
        # Read by pushes on the loop thread; a push from a context copied inside the block
        # (a task started there) stops joining segments once the block has ended.
        self._active = False
        self._used = False

    def __repr__(self) -> str:
        state = "active" if self._active else "done" if self._used else "not entered"
        return f"<aioengine.Bulk size={self.size} {state}>"

    def __enter__(self) -> Bulk:
        core = self._core
        if self._used:
            raise RuntimeError(f"{self!r} was entered already; call engine.bulk() again")
        loop = core.require_loop()
        if threading.get_ident() != core.loop_thread or not loop.is_running():
            raise RuntimeError(
                "engine.bulk() applies to pushes on the engine's event-loop thread; "
                "enter it from a coroutine on that loop"
            )
        if core.closed:
            raise EngineClosedError(f"{core!r} is closed; create a new Engine")
        self._used = True
        self._task = asyncio.current_task()
        self._outer = _current.get()
        self._token = _current.set(self)
        self._active = True
        core.segments.enter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._active = False
        self._task = None
        token, self._token = self._token, None
        assert token is not None
        try:
            _current.reset(token)
        except ValueError:  # exited in another context than entered: nothing to restore
            pass
        self._core.segments.exit(self._core)


class Segments:
    """The bulk segments of one scheduler: the open one, and running a queued one.

    A collaborator of :class:`~aioengine.scheduler.Scheduler` inside the core (the scheduler
    holds one as ``segments`` and passes itself to every call: no reference back). Its
    methods are the scheduler's own cycle for a segment: join, close (queue on the Vars), run
    the members, release.

    State, guarded by the scheduler's lock (``core.lock``) unless said otherwise:

    - ``scopes``: active ``bulk()`` scopes; a push asks its context for one only while this is
      nonzero. Written on the loop thread only; other threads' pushes read it unlocked,
      harmlessly: a push off the loop thread never joins a segment.
    - ``open``: the open segment, collecting members (its ``_result`` holds them until it
      runs). Opened on the loop thread, closed from any thread (a push that does not join it,
      a wait, ``dump()``); an unlocked read is only a hint, re-checked under the lock.
      Invariant: while it is open no other push takes a sequence number; :meth:`flush_locked`
      queues it on its Vars first, so every Var's queue stays in push order.
    - ``flush_scheduled``: True while a :meth:`flush_soon` call is scheduled and has not run.
    """

    def __init__(self) -> None:
        self.scopes = 0
        self.open: Operation[Any] | None = None
        self.flush_scheduled = False

    def size_for(self, core: Scheduler) -> int:
        """The segment size for a push to ``core`` from the current context; 0: do not group
        (no scope, an ended one, or size 1)."""
        scope = _current.get()
        while scope is not None:
            if scope._core is core:
                if not scope._active or scope.size < 2:
                    return 0
                # The core's loop named: current_task() would ask for the running loop, which
                # costs a getpid() system call on every push.
                return scope.size if asyncio.current_task(core.loop) is scope._task else 0
            scope = scope._outer
        return 0

    def enter(self) -> None:
        """A bulk scope was entered (loop thread)."""
        self.scopes += 1

    def exit(self, core: Scheduler) -> None:
        """A bulk scope ended: close the open segment, so its members queue now (loop thread)."""
        self.scopes -= 1
        self.flush(core)

    def flush(self, core: Scheduler) -> None:
        """Close the open segment, if any (any thread): something is about to wait."""
        if self.open is not None:
            with core.lock:
                if self.open is not None:
                    self.flush_locked(core)

    def flush_soon(self, core: Scheduler) -> None:
        """The loop's next iteration after a segment opened: close it (loop thread)."""
        with core.lock:
            self.flush_scheduled = False
            if self.open is not None:
                self.flush_locked(core)

    def join_locked(self, core: Scheduler, op: Operation[Any], size: int) -> None:
        """Add ``op`` (PENDING, numbered) to the open segment, opening one if needed, and close
        it once it holds ``size`` operations (loop thread, lock held)."""
        seg = self.open
        if seg is None:
            seg = self.open = new_operation(
                core, op.owner, None, _BULK, _CPU0, (), (), _NORMAL, 0, "bulk segment"
            )
            members: list[Operation[Any]] = [op]
            seg._result = members
            if not self.flush_scheduled:
                self.flush_scheduled = True
                assert core.loop is not None
                core.loop.call_soon(self.flush_soon, core)
        else:
            members = seg._result
            members.append(op)
        op.segment = seg
        if len(members) >= size:
            self.flush_locked(core)

    def flush_locked(self, core: Scheduler) -> None:
        """Queue the open segment on the union of its members' Vars (lock held).

        It takes the next sequence number, as a push does: nothing else was pushed since its
        first member (the invariant at ``open``), so the Vars' queues stay in push order.
        A segment whose members were all cancelled before it closed is dropped.
        """
        seg = self.open
        assert seg is not None
        self.open = None
        members: list[Operation[Any]] = seg._result
        reads: dict[Var, None] = {}
        writes: dict[Var, None] = {}
        priority = None
        for op in members:
            if op._state is _PENDING:  # else cancelled already; it needs no Var
                vars_ = op.vars  # its reads, then its writes
                for k in range(op.nreads):
                    reads[vars_[k]] = None
                for k in range(op.nreads, len(vars_)):
                    writes[vars_[k]] = None
                if priority is None or op.priority > priority:
                    priority = op.priority
        if priority is None:
            return
        # written by another member; a list, not a generator: a cpdef method when compiled
        const = tuple([v for v in reads if v not in writes])
        mutate = tuple(writes)
        seg.vars = const + mutate
        seg.nreads = len(const)
        seg.priority = priority
        seg.name = f"bulk segment ({len(members)} operations from {members[0].name!r})"
        core.seq += 1
        seg.seq = seq = core.seq
        seg.key = seq - (priority << 64) if priority else seq
        wait = append_all(seg, const, mutate)
        sequencer = core._sequencer
        if sequencer is not None and not sequencer._append(seg, 1):
            wait += 1
        if wait:
            seg.nwait = wait
        elif core.may_hold:
            # It may have to wait for GPU fences or remote versions; it runs on the loop.
            core.dispatch_locked([seg])
        else:
            seg._state = _READY
            core.enqueue_loop_locked(seg)

    def run(self, core: Scheduler, seg: Operation[Any], more: bool) -> Operation[Any] | None:
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
                lock = core.lock
                lock.enter(_get_ident())
                try:
                    if done is not None:
                        done._state = _DONE
                        done._result = result
                        box = done.inherited  # a NO_SKIP member passes an inherited failure on
                        vars_ = done.vars
                        for k in range(done.nreads, len(vars_)):  # its writes
                            v = vars_[k]
                            v._version += 1
                            if box is not None:
                                v._failure = box
                        done.fn = None
                        done.inherited = None
                        core.complete_locked(done, _DONE)
                        done = None
                    while i < n:
                        op = members[i]
                        i += 1
                        if op._state is not _PENDING:
                            pass  # cancelled while it waited
                        elif core.failures and core.skip_locked(op) is not None:
                            pass  # skipped (it releases nothing: the segment holds its Vars)
                        else:
                            op._state = _RUNNING
                            break
                    else:
                        op = None
                finally:
                    lock.leave()
                if op is None:
                    break
                if core.instruments:
                    _instrument.notify_start(core, op)
                if core.tracelog is not None:
                    core.tracelog.started(op)
                ctx = op.ctx
                if ctx is not core.loop_ctx:  # by identity, as in _execute_one: Context
                    core.loop_rctx = core.routes.run_context(ctx)  # hashes in Python
                    core.loop_ctx = ctx
                rctx = core.loop_rctx
                fn = op.fn
                assert fn is not None
                try:
                    result = _context_run(op.snapshot, fn, rctx)
                except BaseException as exc:
                    trim_traceback(exc)
                    core.finish(op, _FAILED, None, exc)
                    del op, fn  # the failure's frames reach this frame: see _execute_one
                    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                        raise  # recorded; the members after it wait for the loop (below)
                    continue
                if type(result) in _COROUTINE_TYPES:
                    core.finish(op, _FAILED, None, returned_coroutine(op.name, result))
                    continue
                done = op
        except BaseException:
            # KeyboardInterrupt or SystemExit from a member, re-raised as an inline
            # operation's is: the members after it run (or are skipped) when the loop runs
            # again, as inline operations queued behind that one would. So the segment keeps
            # its Vars and goes back to the loop queue with them.
            with core.lock:
                rest = seg._result = members[i:]
                if rest:
                    seg._state = _READY
                    core.enqueue_loop_locked(seg)
            members.clear()
            if not rest:
                self.release(core, seg, False)
            raise
        # Hold nothing of a member once this frame returns: a failure's frames reach it
        # (f_back), and keep its locals as they are then (see Scheduler.execute).
        members.clear()
        op = fn = result = v = box = vars_ = None  # type: ignore[assignment]
        return self.release(core, seg, more)

    def release(self, core: Scheduler, seg: Operation[Any], more: bool) -> Operation[Any] | None:
        """Release a segment's Vars; claim the next loop operation if ``more`` (loop thread)."""
        ready: list[Any] = []
        nxt = None
        lock = core.lock
        lock.enter(_get_ident())
        try:
            seg._state = _DONE
            # False: its members counted their own writes as they finished.
            release_all(seg.vars, seg.nreads, ready, False)
            if core._sequencer is not None:
                core._sequencer._release(True, ready, True)
            core.complete_locked(seg, _DONE)
            todo = core.dispatch_locked(ready) if ready else ready
            if more:
                nxt = core.claim_loop_op_locked(todo)
        finally:
            lock.leave()
        if todo:
            core.submit_ready(todo)
        return nxt
