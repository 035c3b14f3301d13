"""Fences: how GPU operations order themselves after each other without the host.

A :class:`Fence` is the event recorded on a stream after one GPU operation was enqueued
(MXNet's async GPU engine, RFC apache/mxnet#18951). Each :class:`~aioengine.Var` that a GPU
operation used remembers, in a :class:`VarFences` of this module (the one slot a Var keeps for
it, attached by :func:`aioengine.var.fences_of`), the fence of its last GPU writer and the
newest GPU reader fence per stream since that write.

Ordering rules (written here only; ``gpu_sync.py`` applies them, this module holds the state):

- A GPU operation on stream S orders itself after the fences it depends on with
  ``S.wait_event``: for a read, the Var's writer (read-after-write); for a write, the writer and
  every reader (write-after-write, write-after-read). Fences already on S need nothing (a
  stream runs its work in order); per source stream only the newest fence counts (events of one
  stream complete in order). Its Var turn is released once it is *enqueued*.
- A host consumer (a CPU operation, a coroutine, ``wait_for_var``) waits until the same fences
  have *completed*, as seen by the poller (``poller.py``), before it starts.
- After the launch, on stream S with new fence F: every Var read gets ``readers[S] = F``; every
  Var written gets ``writer = F`` and no readers.

Locking: the fields of a Fence and of a VarFences are guarded by the owning engine's lock,
except ``status``, which only the engine's loop thread sets (under that lock) and which is read
without it as a single reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .var import fences_of

if TYPE_CHECKING:
    from .operation import Operation
    from .var import Var

__all__ = ("Fence", "VarFences", "gpu_waits", "has_pending", "host_waits", "note_launch")


class Fence:
    """The completion event of one enqueued GPU operation.

    Attributes:
        event: the backend's event (dropped once the fence completes).
        stream_id: ``id()`` of the stream it was recorded on. Not the stream itself: a Var
            keeps its last fences after they completed, and must not keep a CuPy stream
            alive past its worker (its destructor would then run on whichever thread drops
            the Var last, the loop's included). While the fence is pending its stream is
            alive (its worker holds it), so the id is unique among the fences that matter.
        device_id: the device of that stream.
        seq: launch order of the fences of one engine (newest wins per stream).
        status: None while pending; then 0, or the device's error code.
        result, exc: what the operation's function returned or raised (at its enqueue),
            which the operation completes with when the fence settles (then dropped).
    """

    __slots__ = (
        "backend",
        "dependents",
        "device_id",
        "event",
        "exc",
        "keep",
        "op",
        "owner",
        "result",
        "seq",
        "state",
        "status",
        "stream_id",
        "waiters",
    )

    def __init__(
        self,
        owner: Any,
        backend: Any,
        event: Any,
        stream: Any,
        device_id: int,
        seq: int,
        keep: tuple[Any, ...],
    ) -> None:
        self.owner = owner  # the engine told when the fence completes (_fences_settled)
        self.backend = backend  # whose query() reads this fence's status
        self.event = event
        self.stream_id = id(stream)
        self.device_id = device_id
        self.seq = seq
        self.status: int | None = None
        # Everything the operation touched (its function and closure, its result, the values
        # of its Vars, what it passed to RunContext.keep_alive): alive until status == 0, so the
        # memory pool cannot hand it out while the device may still use it. Kept on error.
        self.keep: tuple[Any, ...] | None = keep
        self.op: Operation[Any] | None = None  # the GPU operation, until it is completed
        self.state: Any = None  # the OpState the operation ends in if the fence succeeds
        self.result: object = None  # its function's result, until the operation completes
        self.exc: BaseException | None = None  # or its exception
        self.waiters: list[Operation[Any]] | None = []  # host consumers waiting on it
        # Later fences whose streams wait_event on this one: if it fails they never complete.
        self.dependents: list[Fence] | None = []

    def __repr__(self) -> str:
        status = "pending" if self.status is None else f"status={self.status}"
        return f"<Fence #{self.seq} gpu({self.device_id}) {status}>"


class VarFences:
    """The GPU sync state of one Var: the fence of its last GPU writer, and the newest GPU
    reader fence per stream (by ``Fence.stream_id``) since that write. Completed fences stay
    until replaced.

    The Var keeps it in one slot (:func:`aioengine.var.fences_of` attaches it on the first
    GPU operation that uses the Var); only this module reads or changes it, with the engine
    lock held.
    """

    __slots__ = ("_readers", "_writer")

    def __init__(self) -> None:
        self._writer: Fence | None = None
        self._readers: dict[int, Fence] | None = None

    def read_by(self, fence: Fence) -> None:
        """A GPU operation that reads the Var was enqueued, with ``fence`` (lock held)."""
        readers = self._readers
        if readers is None:
            self._readers = {fence.stream_id: fence}
        else:
            readers[fence.stream_id] = fence

    def written_by(self, fence: Fence) -> None:
        """A GPU operation that writes the Var was enqueued, with ``fence`` (lock held)."""
        self._writer = fence
        self._readers = None


def gpu_waits(const: tuple[Var, ...], mutate: tuple[Var, ...], stream: Any) -> list[Fence]:
    """The fences a GPU operation on ``stream`` must ``wait_event`` for (lock held)."""
    newest: dict[int, Fence] = {}
    stream_id = id(stream)

    def need(f: Fence | None) -> None:
        if f is None or f.status is not None or f.stream_id == stream_id:
            return
        key = f.stream_id
        old = newest.get(key)
        if old is None or old.seq < f.seq:
            newest[key] = f

    for v in const:
        state: VarFences | None = v._fences
        if state is not None:
            need(state._writer)
    for v in mutate:
        state = v._fences
        if state is not None:
            need(state._writer)
            readers = state._readers
            if readers:
                for f in readers.values():
                    need(f)
    return list(newest.values())


def host_waits(const: tuple[Var, ...], mutate: tuple[Var, ...]) -> list[Fence]:
    """The pending fences a host consumer must see completed before it starts (lock held)."""
    pending: dict[Fence, None] = {}
    for v in const:
        state: VarFences | None = v._fences
        if state is not None:
            f = state._writer
            if f is not None and f.status is None:
                pending[f] = None
    for v in mutate:
        state = v._fences
        if state is not None:
            f = state._writer
            if f is not None and f.status is None:
                pending[f] = None
            readers = state._readers
            if readers:
                for f in readers.values():
                    if f.status is None:
                        pending[f] = None
    return list(pending)


def has_pending(var: Var) -> bool:
    """Whether GPU work on ``var`` is enqueued and not completed (lock held)."""
    state: VarFences | None = var._fences
    if state is None:
        return False
    f = state._writer
    if f is not None and f.status is None:
        return True
    readers = state._readers
    return readers is not None and any(f.status is None for f in readers.values())


def note_launch(const: tuple[Var, ...], mutate: tuple[Var, ...], fence: Fence) -> None:
    """Record ``fence`` in the sync state of the Vars its operation used (lock held)."""
    for v in const:
        fences_of(v, VarFences).read_by(fence)
    for v in mutate:
        fences_of(v, VarFences).written_by(fence)
