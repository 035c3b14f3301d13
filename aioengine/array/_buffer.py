"""Buffer: one piece of array memory, the engine Var that orders every access to it, and its
outcome.

MXNet's ``NDArray::Chunk``: every operation that makes a new array makes a new Buffer (and Var);
views (basic indexing, reshape of contiguous data, transposes) share their base's Buffer, so a
write through any view is ordered against every read through any other view, conservatively:
without overlap analysis, but for the chunks of a chunked Buffer (each with a Var of its own,
below), where a view holds only the chunks it touches.

A Buffer's state falls in four groups; its two optional parts are objects of their own,
documented where they are defined: :class:`Group` (tiny operations fused into one push) and
:class:`Chunks` (the chunk part of a chunked Buffer; ``_chain.py`` makes them).

**The value and its outcome**, each field guarded by the turn its Var gives (written only by an
operation that holds a write on ``var``, read only by one that holds at least a read), except
where said:

* ``value``: the data (a NumPy array, or the GPU backend's array): :data:`MISSING` until the
  first write has run; always C-contiguous (reshape views rely on it). In a chunked Buffer,
  each chunk's elements are guarded by that chunk's Var; ``value`` itself is replaced only by
  an operation holding every chunk (allocated once by the first chunk's kernel to run).
* ``failure``: the exception that makes this Buffer unusable for good (sticky): the one its
  producing operation raised, or a :class:`~aioengine.DependencyError` whose ``__cause__`` is
  the root failure of an input. Also written by ``await`` on the loop thread once the engine
  has reported a skip (the write it stands for has finished by then). One for the whole of a
  chunked Buffer: an operation on other chunks that runs after a chunk failed sees it; a view
  of other chunks read before may have been read healthy (its elements were).
* ``carrier``: a fused step (or work computed off the engine: device work released before it
  ran, an operation computed at the call) that raised pushed an operation of its own that
  raises the same exception, writing this Var (so that the engine records it, once);
  ``await`` throws it.
* ``exported``: ``await`` or a sync point handed ``value`` out as a read-only view; the next
  write holding every chunk copies it first (inside that write, which holds the turn), so what
  the user holds never changes (a partial write never copies: see ``lent``).

**The operation that makes it**, until it has run: ``shape``, ``dtype``: what it promised
(checked when it runs); ``fn``, ``args`` (or ``x1`` and ``x2`` for a function of the hot path;
``x2`` None for a unary one), ``name``: the operation itself (then None, so that a chain of
arrays does not keep its inputs alive). A Buffer is the function pushed for the operation that
makes it (:meth:`produce`, or the Buffer itself on the hot path): fewer objects per pending
operation for the cycle collector to walk while thousands are pending.

**Access**, written by the thread that pushes an operation on the Buffer: the arrays of one
Buffer are used from one thread at a time (the loop's, or one synchronous caller's); pushes on
one array from two threads at once have no order to keep, and are not supported.

* ``vars``: the Vars that order access to the Buffer: ``(var,)``, or one per chunk for a
  chunked Buffer (then ``var`` is the first). Set at creation (and by :meth:`expose`, which
  merges the chunks back into one Var).
* **Which chunks an access holds** (the rule, written once here): an operation holds the Vars of
  the chunks its arrays touch (:meth:`chunks`, from the flat span of a view's layout,
  ``_meta.flat_span``: a cheap superset; every chunk for a whole array, and for advanced
  indexing). So ``x[:10] += 1`` orders only against the users of ``x``'s first chunk, and a
  view across a chunk boundary holds both chunks: the engine's rule holds per chunk. A write
  holding some chunks only is *partial*; one on chunks a read pushed before may hand out
  (``lent``) holds them all (:meth:`write`).
* ``writer``: the :class:`~aioengine.Operation` of the latest array write pushed (read to tell
  a skipped write from one that ran, and for reprs).
* ``exposed``: ``x.var`` handed the Var out (:meth:`expose`): raw pushes may name it, so it is
  deleted with ``delete_var`` when the Buffer goes.
* ``readers``: the operations that read this Buffer without a turn on its Vars (a step joined
  them after the value was computed: a chunk kernel, ``_chain.py``, or a fused tiny operation,
  ``_push.py``), as (chunk, the operation's Var, the operation): a write on that chunk (and
  the merge before handing the Var out) reads those Vars first, so it waits for those reads,
  and takes them off the list (a later write on the chunk orders after it). Every write of an
  unchunked Buffer is on its one chunk. Finished readers are dropped as new ones come
  (:meth:`read_unheld`), so an input read by every iteration of a loop keeps a short list.
* ``wgen``: the number of array writes pushed on the Buffer, on any chunk, and of merges. Not
  0: a value may be present yet stale (a write skipped by the engine), which readers must
  check (``_kernel.input_failure``); 0: the value (once present) is the one its producing
  operation made. A fused step may join a chain's program only while the ``wgen`` of every
  array it reads is what the program recorded (no write came in between). One count for the
  whole Buffer is sound, and simpler than one per chunk: a write on chunk *j* also refuses
  later joins for chunk *i*, and the step pushes kernels of its own, ordered by the Vars as
  any push is (less fusion after a partial write, never a stale read).
* ``lent``: the chunks (a range: the hull of them) that reads handing the value out (``await``,
  a sync point) were pushed on since the last write holding every chunk was pushed
  (``exported`` is set when such a read runs). A partial write never copies the value
  (operations on the other chunks may be using the same allocation at that moment): so a write
  on chunks a pushed read may hand out holds every chunk instead, and copies first if, when it
  runs, the value was handed out. A partial write on other chunks changes no element handed
  out.

**Its parts**: ``group``, the :class:`Group` that made it (or None); ``chunked``, its
:class:`Chunks` (or None: unchunked). ``chunked`` stays after a merge (its ``writers`` tell a
skipped write on a chunk), with no kernel left to join. ``reduction``: for the result of a
fused reduction, a weak reference to the program (``_chain.Program``) whose kernels compute
the partials its operation combines, whose one kernel a sync point may compute (or None).
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import EngineClosedError, FnProperty
from ._kernel import MISSING, reraise, run, run2

if TYPE_CHECKING:
    import numpy as np

    from .. import Context, Engine, Operation, RunContext, Var
    from ._meta import Shape

__all__ = ("MISSING", "Buffer", "Chunks", "Group")

_ASYNC = FnProperty.ASYNC


class Buffer:
    """The memory and the Var behind one or more :class:`~aioengine.array.Array` views."""

    __slots__ = (
        "__weakref__",
        "args",
        "carrier",
        "chunked",
        "dtype",
        "engine",
        "exported",
        "exposed",
        "failure",
        "fn",
        "group",
        "lent",
        "name",
        "readers",
        "reduction",
        "shape",
        "value",
        "var",
        "vars",
        "wgen",
        "writer",
        "x1",
        "x2",
    )

    def __init__(
        self,
        engine: Engine,
        var: Var,
        shape: Shape,
        dtype: np.dtype[Any],
        value: Any = MISSING,
        fn: Callable[..., Any] | None = None,
        args: tuple[Any, ...] | None = None,
        name: str = "",
        x1: Any = None,
        x2: Any = None,
    ) -> None:
        self.engine = engine
        self.var = var
        self.vars: tuple[Var, ...] = (var,)
        self.chunked: Chunks | None = None
        self.wgen = 0
        self.readers: list[tuple[int, Var, Operation[Any]]] | None = None
        self.lent: range | None = None
        self.shape = shape
        self.dtype = dtype
        self.value = value
        self.failure: BaseException | None = None
        self.writer: Operation[Any] | None = None
        self.exported = False
        self.exposed = False
        self.fn = fn
        self.args = args
        self.name = name
        self.x1 = x1
        self.x2 = x2
        self.carrier: Var | None = None
        self.group: Group | None = None
        self.reduction: Any = None

    def produce(self, rctx: RunContext) -> None:
        """The function of the operation that makes this Buffer: ``fn(*args)`` into it."""
        fn, args = self.fn, self.args
        self.fn = self.args = None
        assert fn is not None, "a Buffer is produced once"
        assert args is not None
        run(fn, args, (self,), None, self.name, rctx)

    def __call__(self, rctx: RunContext) -> None:
        """:meth:`produce` for a binary function, whose two arguments wait in ``x1`` and
        ``x2``: the hot path, where the Buffer itself is the function pushed (no argument
        tuple, no bound method kept while the operation is pending). Then the operations
        fused into it (its group's ``steps``, in push order), each into its own Buffer."""
        fn, x1, x2 = self.fn, self.x1, self.x2
        self.fn = self.x1 = self.x2 = None
        assert fn is not None, "a Buffer is produced once"
        group = self.group
        if group is None or group.steps is None:
            run2(fn, x1, x2, self, self.name, rctx)
            return
        more = group.steps
        group.steps = None
        # The first operation's own failure is the whole group's (each fused step reads its
        # result, directly or not): the engine records it, as for any operation.
        run2(fn, x1, x2, self, self.name, rctx)
        more.reverse()
        while more:
            step = more.pop()  # a step done is not kept alive by the list (nor its value)
            fn, x1, x2 = step.fn, step.x1, step.x2
            step.fn = step.x1 = step.x2 = None
            assert fn is not None
            try:
                run2(fn, x1, x2, step, step.name, rctx)
            except BaseException as exc:
                # Only the steps that read this one's result fail with it (run2 sees its
                # failure); an operation of its own records it once (carry).
                step.carry(exc, rctx.ctx, step.name)

    def carry(self, exc: BaseException, ctx: Context, name: str) -> None:
        """Record ``exc``, raised by a fused step making this Buffer (or by the device work
        of an operation released before it ran, ``_kernel.launch``), in the engine once: an
        operation of its own writing a new Var (``carrier``) raises it. The step's shared Var
        must not carry it, or the engine would skip readers of the steps that did compute.
        Called by the operation (or device work) computing the step, before it returns (so
        ``await``, which runs after it, sees ``carrier``)."""
        try:
            carrier = self.engine.new_var(f"{name} failure")
            self.engine.push_sync(
                functools.partial(reraise, exc), ctx, (), (carrier,), prop=_ASYNC, name=name
            )
        except EngineClosedError:
            # Device work failing while the engine closes (it runs after its operation was
            # released): ``await`` still raises it, and the log says it, as aclose() cannot.
            logging.getLogger("aioengine").error(
                "%s failed while %r was closing", name, self.engine, exc_info=exc
            )
            return
        self.carrier = carrier

    def chunks(self, first: int, stop: int) -> range:
        """The chunks holding the flat elements ``[first, stop)`` (a view's
        ``_meta.flat_span``): those of a chunked Buffer; the one chunk of an unchunked one. An
        empty span is in one chunk still (a read of it needs the value allocated, as any)."""
        n = len(self.vars)
        if n == 1:
            return range(1)
        chunked = self.chunked
        assert chunked is not None  # (several Vars: a chunked Buffer)
        elems = chunked.elems
        if stop <= first:
            c = min(first // elems, n - 1)
            return range(c, c + 1)
        return range(first // elems, min(n, -(-stop // elems)))

    def run_writer_here(self) -> bool:
        """At a sync point (``await`` on the loop's thread, or a thread of the user's about to
        block): compute this Buffer on the calling thread now if a fused chain of one chunk
        makes it and no worker has taken its kernel yet (``_chain.Program`` decides); return
        whether it did. The caller waits for it anyway, and the hand-offs to a worker and back
        cost more than such a chain's whole compute. The result of a fused reduction: its
        partials' kernel, likewise (its combine then runs on the loop, as the loop iterates).
        A small array's inline operation (its :class:`Group`), on the loop's thread: now,
        not at the loop's next run of its queue."""
        chunked = self.chunked
        if chunked is None or chunked.program is None:
            ref = self.reduction
            if ref is None:
                # A small array's operation (and those fused into it), queued for the loop's
                # thread: run now if that is the caller (it would run there anyway).
                writer = self.writer
                return writer is not None and writer.prop is _ASYNC and writer.run_here()
            program = ref()
            return program is not None and bool(program.run_here(None))
        return bool(chunked.program.run_here(self.writer))

    def lend(self, chunks: range) -> None:
        """At the push of a read that hands ``chunks`` of the value out (``await``, a sync
        point): record them in ``lent``, so that a later write on them holds every chunk."""
        lent = self.lent
        if lent is not None:
            chunks = range(min(lent.start, chunks.start), max(lent.stop, chunks.stop))
        self.lent = chunks

    def write(self, chunks: range) -> tuple[range, tuple[Var, ...], list[Var]]:
        """At the push of a write on ``chunks`` (those of the view written): record it
        (``wgen``, ``lent``) and return the chunks it holds (every chunk if a
        read pushed before may hand some of them out: the write may have to copy the whole
        Buffer), their Vars, and the Vars of the kernels reading them without a turn (taken
        off ``readers``), which it must wait for."""
        n = len(self.vars)
        lent = self.lent
        if lent is not None and lent.start < chunks.stop and chunks.start < lent.stop:
            chunks = range(n)
        if len(chunks) == n:
            self.lent = None
        self.wgen += 1  # no later step joins a kernel that read it before this write
        waits: dict[Var, None] = {}  # (an operation may be listed twice: wait once)
        readers = self.readers
        if readers:
            kept = []
            for chunk, var, op in readers:
                if n == 1 or chunk in chunks:
                    if not op.done():
                        waits[var] = None
                else:
                    kept.append((chunk, var, op))
            self.readers = kept or None
        return chunks, self.vars[chunks.start : chunks.stop], list(waits)

    def read_unheld(self, chunk: int, var: Var, op: Operation[Any]) -> None:
        """Record that ``op`` (writing ``var``) reads ``chunk`` of this Buffer without a turn
        on its Vars (``readers``); the caller checked that the value is computed and no write
        on it is pending (``_chain.quiescent``). The readers that finished first are dropped
        (they finish about in push order): O(1) a call, on the loop's hot path, where a chain
        of 61 chunk kernels registers one a chunk. The list may name an operation twice;
        :meth:`write` waits for each once."""
        readers = self.readers
        if readers is None:
            self.readers = [(chunk, var, op)]
            return
        while readers and readers[0][2].done():
            del readers[0]
        readers.append((chunk, var, op))

    def cut(
        self,
        elems: int,
        vars_: Sequence[Var],
        writers: Sequence[Operation[Any]],
        program: Any = None,
    ) -> None:
        """Make this new Buffer chunked (by the thread that pushes its chunks' operations):
        chunks of ``elems`` elements, each with its Var (``vars_``) and the operation that
        writes it (``writers``), made by ``program`` (a fused chain's) or by operations of
        their own (None)."""
        self.vars = tuple(vars_)
        self.chunked = Chunks(elems, program, tuple(writers))
        self.var = self.vars[0]
        self.writer = writers[-1]

    def wrote(self, op: Operation[Any], chunks: range) -> None:
        """After the push of a write on ``chunks`` (:meth:`write`): ``op`` is their writer."""
        chunked = self.chunked
        if chunked is not None and chunked.writers is not None and len(self.vars) > 1:
            writers = chunked.writers
            chunked.writers = tuple(op if i in chunks else w for i, w in enumerate(writers))

    def expose(self) -> Var:
        """Hand the Var out (``x.var``): raw pushes may name it from now on, so it is deleted
        with ``delete_var`` once the Buffer is collected (after those pushes), from a finalizer.

        A Var never handed out needs no deletion: when the last Array and the last operation
        holding the Buffer are gone, nothing is pending on it and nobody else can name it, so it
        goes with the Buffer, without the push a deletion costs.
        """
        if not self.exposed:
            if self.chunked is not None or self.readers:
                self._merge()
            self.exposed = True
            # Buffers fused into one operation share its Var: it goes when they all have.
            owner: Buffer | Group = self if self.group is None else self.group
            if owner is not self and not owner.exposed:
                owner.exposed = True
                finalizer = weakref.finalize(owner, _delete, self.engine, self.var)
                finalizer.atexit = False
            elif owner is self:
                finalizer = weakref.finalize(self, _delete, self.engine, self.var)
                finalizer.atexit = False  # an engine closed at exit has nothing left to delete
        return self.var

    def _merge(self) -> None:
        """Before handing the Var out (raw pushes name one Var): give a chunked Buffer one Var
        of its own (the results of a fused program of one chunk share its kernel's Var: the
        one handed out is deleted with this Buffer, while the others still use theirs), and
        order it after the kernels that read the Buffer without a turn (``readers``). One
        operation writes every chunk's Var and the one handed out, reading those kernels'
        Vars: what raw pushes do on it comes after all of them."""
        readers = list(dict.fromkeys(var for _, var, _ in self.readers or ()))
        self.readers = None
        chunked = self.chunked is not None
        var = self.engine.new_var(self.name or "array") if chunked else self.var
        self.engine.push_sync(
            _nothing,
            const_vars=readers,
            mutate_vars=tuple(dict.fromkeys((*self.vars, var))),
            prop=_ASYNC,
            name="merge chunks",
        )
        self.var = var
        self.vars = (var,)
        if self.chunked is not None:
            self.chunked.program = None
        self.wgen += 1

    def handed_out(self) -> bool:
        """Whether this Buffer's Var was handed out (by it, or another Buffer sharing it)."""
        group = self.group
        return self.exposed if group is None else group.exposed

    def __repr__(self) -> str:
        return f"<Buffer {self.var.name}>"


def _delete(engine: Engine, var: Var) -> None:
    """The finalizer of an exposed Buffer: delete its Var after its pending raw pushes (MXNet's
    DeleteVariable from ``~Chunk``; the engine accepts ``delete_var`` from a finalizer, on any
    thread). A closed engine has nothing left to delete."""
    try:
        if not engine.closed:  # (a deletion deferred past the close would be reported)
            engine.delete_var(var)
    except Exception:  # a closed engine, a Var deleted already, interpreter exit
        pass


def _nothing(rctx: RunContext) -> None:
    """The operation that merges a chunked Buffer's Vars (it orders, and does nothing)."""


class Group:
    """Tiny operations fused into one push (``_push.py``'s fusion): the Buffer of the operation
    pushed and those of the operations that joined it, which all share its Var and hold this
    record (``Buffer.group``).

    * ``steps``: the Buffers of the operations that joined, in push order, until the pushed
      operation runs them after its own (then None; a step done is not kept alive by the
      list). Loop thread only: steps join only while the operation has not started, and it
      runs on the loop too, so ``steps`` is never appended to and read at once.
    * ``exposed``: a Buffer of the group handed the shared Var out (``x.var``): it is deleted
      (from this record's finalizer) when the last Buffer of the group goes.
    """

    __slots__ = ("__weakref__", "exposed", "steps")

    def __init__(self, first: Buffer) -> None:
        self.steps: list[Buffer] | None = [first]
        self.exposed = False


class Chunks:
    """The chunk part of a chunked Buffer (``Buffer.chunked``; ``_chain.py`` makes them): its
    flat (C-order) elements are cut into chunks of ``elems``, each with a Var of its own
    (``Buffer.vars``). Written by the thread that pushes on the Buffer, as the Buffer's own
    access fields.

    * ``elems``: the elements of one chunk (the last may have fewer).
    * ``program``: the fused chain that computes it (``_chain.Program``, a kernel per chunk),
      which later elementwise operations may join while no kernel of it has started; None for
      a scan's result (``_scan.py``: nothing joins its operations) and once the chunks are
      merged.
    * ``writers``: per chunk, the operation of the latest write pushed on it (its kernel,
      until a write replaces it: :meth:`Buffer.wrote`); ``Buffer.writer`` is the latest write
      pushed on any chunk.
    """

    __slots__ = ("elems", "program", "writers")

    def __init__(self, elems: int, program: Any, writers: tuple[Operation[Any], ...]) -> None:
        self.elems = elems
        self.program = program
        self.writers: tuple[Operation[Any], ...] | None = writers
