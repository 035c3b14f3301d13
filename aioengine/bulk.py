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
from typing import TYPE_CHECKING

from .errors import EngineClosedError

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ("Bulk",)

#: The innermost active bulk scope of the current context (task or thread).
_current: contextvars.ContextVar[Bulk | None] = contextvars.ContextVar(
    "aioengine_bulk", default=None
)


def size_for(engine: Scheduler) -> int:
    """The segment size for a push to ``engine`` from the current context; 0: do not group
    (no scope, an ended one, or size 1)."""
    scope = _current.get()
    while scope is not None:
        if scope._engine is engine:
            if not scope._active or scope.size < 2:
                return 0
            # The engine's loop named: current_task() would ask for the running loop, which
            # costs a getpid() system call on every push.
            return scope.size if asyncio.current_task(engine._loop) is scope._task else 0
        scope = scope._outer
    return 0


class Bulk:
    """The scope of :meth:`Engine.bulk <aioengine.Engine.bulk>`: use it in a ``with``
    statement, once.

    Attributes:
        size: the most operations one segment holds.
    """

    __slots__ = ("_active", "_engine", "_outer", "_task", "_token", "_used", "size")

    def __init__(self, engine: Scheduler, size: int) -> None:
        if type(size) is not int:
            raise TypeError(f"size must be an int, got {size!r}")
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self._engine = engine
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
        engine = self._engine
        if self._used:
            raise RuntimeError(f"{self!r} was entered already; call engine.bulk() again")
        loop = engine._require_loop()
        if threading.get_ident() != engine._loop_thread or not loop.is_running():
            raise RuntimeError(
                "engine.bulk() applies to pushes on the engine's event-loop thread; "
                "enter it from a coroutine on that loop"
            )
        if engine.closed:
            raise EngineClosedError(f"{engine!r} is closed; create a new Engine")
        self._used = True
        self._task = asyncio.current_task()
        self._outer = _current.get()
        self._token = _current.set(self)
        self._active = True
        engine._bulk_enter()
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
        self._engine._bulk_exit()
