"""Remote chunks and fused remote chains: how an array on ``ae.remote()`` becomes Dask tasks.

A remote array's data is a :class:`Store`: its shape cut along the **leading axis** into
chunks of ``rows`` rows (a 2-D stencil's halo is whole rows), each chunk an engine Var whose
value is a remote version (a Dask key on a worker: ``Engine.submit(..., ctx=ae.remote())``,
``docs/howto/cluster.md``). Views (basic indexing) are a window over the Store: the shape,
strides and byte offset NumPy's indexing gives on a zero-memory stand-in
(:func:`~aioengine.array._meta.layout`).

**One writer per Var.** Every chunk Var is written exactly once, by the task that makes it; an
in-place write makes *new* Vars for the chunks it touches (``Store.chunks`` is replaced, never
changed in place). So an operation reads the chunk Vars the Store had when it was pushed (a
snapshot), the engine orders each task after the one task that wrote each of its inputs, and
aliasing needs no analysis: ``a[0:2] = a[1:3]`` or ``data[1:] += data[:-1]`` reads the versions
before the write, across chunk boundaries, as NumPy does (cuPyNumeric's aliasing bugs cannot
happen). A dropped Var releases its key (the engine's remote versions go with it).

**Fusion.** An elementwise operation is recorded in an :class:`Expr`, a program over a shape
(its *space*), not pushed: a later elementwise operation of the same shape that reads one of
its results joins it as one more step. The Expr is *flushed* (its tasks pushed: one per chunk
of the space, computing every result someone still holds, plus the partials of the reductions
that joined it) when something needs its chunks (a read by another program, a gather, a write
into it) or at the event loop's next iteration (a local operation pushed with the first step
runs the flush: the engine counts it as pending, so ``wait_for_all()`` covers the chain). A
write whose value is a pending Expr of the written shape evaluates that program inside the
write's own tasks: ``x[1:-1] = 0.5 * (x[:-2] + x[2:])`` is one task per chunk.

State: ``Store.chunks`` (None while its Expr is pending) and ``Store.expr`` are set by the
flush; ``Expr.steps``, ``windows``, ``results``, ``sinks`` and ``flushed`` are guarded by
``Expr.lock`` (a step joins on the pushing thread; the flush may run on the loop's).
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import EngineClosedError, FnProperty
from ..context import cpu, remote
from ._meta import layout
from ._remote_kernel import (
    CONST,
    IN,
    STEP,
    Program,
    Window,
    combine,
    create,
    own,
    read_window,
    run,
    run_one,
    write,
)

if TYPE_CHECKING:
    from .. import Engine, Var

__all__ = (
    "FUSE_STEPS",
    "REMOTE_CHUNK_BYTES",
    "Expr",
    "Store",
    "View",
    "chunk_rows",
    "created",
    "flush_soon",
    "gather_parts",
    "placed",
    "rows_of",
    "view_rows",
    "write_into",
)

#: The default chunk size of a remote array, in bytes of float64 (``rows`` = this over 8 over
#: the elements of a row): 8 MiB is 1 Mi elements, 1-5 ms of elementwise work per task, well
#: above Dask's cost of about 1 ms per task. A namespace made with ``chunk_bytes=`` (or
#: ``AIOENGINE_ARRAY_CHUNK_BYTES``) uses that instead.
REMOTE_CHUNK_BYTES = 8 << 20

#: The most steps one Expr holds (a longer chain starts a new one).
FUSE_STEPS = 64

_ASYNC = FnProperty.ASYNC
_REMOTE = remote()
_CPU = cpu()


def chunk_rows(shape: tuple[int, ...], chunk_bytes: int) -> int:
    """The rows of one chunk of an array of ``shape``: ``chunk_bytes`` of float64 (at least
    one row)."""
    row = math.prod(shape[1:]) if shape else 1
    return max(1, (chunk_bytes // 8) // max(row, 1))


def _count(shape: tuple[int, ...], rows: int) -> int:
    return max(1, -(-shape[0] // rows)) if shape else 1


def _addr(a: np.ndarray[Any, Any]) -> int:
    return int(a.__array_interface__["data"][0])


class View:
    """A window over a Store: shape, strides and byte offset from the Store's start."""

    __slots__ = ("lay", "offset", "shape", "strides")

    def __init__(self, lay: np.ndarray[Any, Any], base: np.ndarray[Any, Any]) -> None:
        self.lay = lay
        self.shape: tuple[int, ...] = tuple(lay.shape)
        self.strides: tuple[int, ...] = tuple(lay.strides)
        self.offset = _addr(lay) - _addr(base)

    def key(self) -> tuple[Any, ...]:
        return (self.shape, self.strides, self.offset)

    def rows(self, lo: int, hi: int) -> View:
        """Rows ``lo:hi`` of this view's leading axis (``0 <= lo < hi <=`` its length): its
        layout sliced, and its offset moved ``lo`` strides on, where such a slice starts. No
        address is read (``__array_interface__``, 3 µs a call): a write makes one per input
        per chunk it touches."""
        view = View.__new__(View)
        lay = view.lay = self.lay[lo:hi]
        view.shape = lay.shape
        view.strides = self.strides
        view.offset = self.offset + lo * self.strides[0]
        return view


def _base_of(lay: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    base = lay
    while base.base is not None and isinstance(base.base, np.ndarray):
        base = base.base
    return base


class Store:
    """The chunks of one remote array, the base of its views (see the module docstring)."""

    __slots__ = (
        "__weakref__",
        "chunks",
        "dtype",
        "engine",
        "expr",
        "lay",
        "name",
        "rowbytes",
        "rows",
        "shape",
    )

    def __init__(
        self,
        engine: Engine,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        rows: int,
        name: str,
        expr: Expr | None = None,
    ) -> None:
        self.engine = engine
        self.shape = shape
        self.dtype = dtype
        #: Rows per chunk (the last chunk may be shorter).
        self.rows = rows
        self.name = name
        #: The zero-memory stand-in whose views give windows (:class:`View`).
        self.lay = layout(shape, dtype)
        self.rowbytes = self.lay.strides[0] if shape else dtype.itemsize
        #: One Var per chunk (None while ``expr`` is pending); replaced whole by a write.
        self.chunks: tuple[Var, ...] | None = None
        #: The pending program that makes this Store, until it is flushed.
        self.expr = expr

    @property
    def count(self) -> int:
        return _count(self.shape, self.rows)

    def whole(self) -> View:
        return View(self.lay, _base_of(self.lay))

    def materialized(self) -> tuple[Var, ...]:
        """The chunk Vars, flushing the pending program that makes them first."""
        if self.chunks is None:
            expr = self.expr
            assert expr is not None
            expr.flush()
        assert self.chunks is not None
        return self.chunks

    def describe(self) -> str:
        return f"remote array {self.name!r} {self.shape} {self.dtype}"


def view_rows(store: Store, view: View) -> tuple[int, int] | None:
    """The first and last row of ``store`` that ``view`` touches (None: no element)."""
    if 0 in view.shape:
        return None
    lo = hi = view.offset
    for d, s in zip(view.shape, view.strides, strict=True):
        if s < 0:
            lo += (d - 1) * s
        else:
            hi += (d - 1) * s
    if not store.shape:
        return 0, 0
    return lo // store.rowbytes, hi // store.rowbytes


def _window(
    store: Store,
    chunks: tuple[Var, ...],
    view: View,
    args: list[Any],
    seen: dict[int, int],
) -> Window:
    """The :class:`Window` a task reads ``view`` through, appending the chunk Vars it needs to
    ``args`` (``seen``: the index in ``args`` of each Var already there, by id: a chunk read
    by several windows is passed once)."""
    span = view_rows(store, view)
    if span is None:
        return Window((), 0, 0, view.shape, view.strides, 0, store.dtype)
    r0, r1 = span
    c0, c1 = r0 // store.rows, r1 // store.rows
    start = r0 - c0 * store.rows
    stop = r1 + 1 - c1 * store.rows
    offset = view.offset - r0 * store.rowbytes
    parts = tuple(_arg(args, seen, v) for v in chunks[c0 : c1 + 1])
    return Window(parts, start, stop, view.shape, view.strides, offset, store.dtype)


def _arg(args: list[Any], seen: dict[int, int], var: Var) -> int:
    """The index of ``var`` among a task's arguments ``args``, appended if new."""
    k = seen.get(id(var))
    if k is None:
        k = seen[id(var)] = len(args)
        args.append(var)
    return k


def _restrict(view: View, space: tuple[int, ...], lo: int, hi: int) -> View:
    """``view`` as read by the task computing rows ``lo:hi`` of ``space``: those rows if it
    runs along the space's leading axis, else whole (a broadcast operand)."""
    if not space or len(view.shape) != len(space) or view.shape[0] != space[0] or space[0] == 1:
        return view
    return view.rows(lo, hi)


class _Input:
    """An input of an Expr: a view of a Store, with the Store's chunks when it was read."""

    __slots__ = ("chunks", "store", "view")

    def __init__(self, store: Store, chunks: tuple[Var, ...], view: View) -> None:
        self.store = store
        self.chunks = chunks
        self.view = view


class Expr:
    """A pending fused program over ``shape`` (see the module docstring)."""

    __slots__ = (
        "__weakref__",
        "engine",
        "flushed",
        "inputs",
        "lock",
        "name",
        "results",
        "rows",
        "shape",
        "sinks",
        "steps",
    )

    def __init__(self, engine: Engine, shape: tuple[int, ...], rows: int, name: str) -> None:
        self.engine = engine
        self.shape = shape
        self.rows = rows
        self.name = name
        self.inputs: list[_Input] = []
        #: (function, operand references, result dtype) per step.
        self.steps: list[tuple[Callable[..., Any], tuple[tuple[int, Any], ...], Any]] = []
        #: Per step, its result's Store (weakly: dead means nobody can read it), or None.
        self.results: list[weakref.ref[Store] | None] = []
        #: Reductions joined: (partial's reducer, combine's, operand reference, dtype, count,
        #: result Store).
        self.sinks: list[tuple[str, str, tuple[int, Any], Any, int, Store]] = []
        self.lock = threading.Lock()
        self.flushed = False

    def input(self, store: Store, view: View) -> tuple[int, Any]:
        """The reference of an input (the Store's chunks now), added if new. Lock held."""
        chunks = store.materialized()
        for k, inp in enumerate(self.inputs):
            if inp.chunks is chunks and inp.view.key() == view.key():
                return (IN, k)
        self.inputs.append(_Input(store, chunks, view))
        return (IN, len(self.inputs) - 1)

    def absorb(self, other: Expr) -> bool:
        """Take ``other``'s steps, inputs and reductions (another pending program of the same
        shape, which an operation reads together with this one), so that both run as one;
        False (nothing changed) if ``other`` was flushed or this would be too long. This
        Expr's lock held (then ``other``'s is taken: the two are nested only on the thread
        pushing on both arrays, and the arrays of a namespace are used from one thread at a
        time, so no other thread absorbs the pair the other way round; ``flush`` takes one)."""
        with other.lock:
            if other.flushed or len(self.steps) + len(other.steps) > FUSE_STEPS:
                return False
            other.flushed = True
            di, ds = len(self.inputs), len(self.steps)

            def moved(ref: tuple[int, Any]) -> tuple[int, Any]:
                kind, index = ref
                return (kind, index + (di if kind == IN else ds)) if kind != CONST else ref

            self.inputs.extend(other.inputs)
            for fn, refs, dtype in other.steps:
                self.steps.append((fn, tuple(moved(r) for r in refs), dtype))
            for weak in other.results:
                store = weak() if weak is not None else None
                if store is not None:
                    store.expr = self
                self.results.append(weak)
            for part, name, sref, dtype, count, result in other.sinks:
                result.expr = self
                self.sinks.append((part, name, moved(sref), dtype, count, result))
            other.inputs, other.steps, other.results, other.sinks = [], [], [], []
            return True

    def flush(self) -> None:
        """Push this program's tasks, one per chunk of its space (the results someone holds
        and the partials of its reductions), then each reduction's combine. Once."""
        with self.lock:
            if self.flushed:
                return
            self.flushed = True
        engine = self.engine
        live: list[tuple[int, Store]] = []
        for k, ref in enumerate(self.results):
            store = ref() if ref is not None else None
            if store is not None:
                live.append((k, store))
        if not live and not self.sinks:
            return
        n = _count(self.shape, self.rows)
        outs: list[list[Var]] = [
            [engine.new_var(f"{s.name}[{i}]") for i in range(n)] for _, s in live
        ]
        partials = [
            [engine.new_var(f"{r.name} partial[{i}]") for i in range(n)] for *_, r in self.sinks
        ]
        for i in range(n):
            lo = i * self.rows
            hi = min(lo + self.rows, self.shape[0]) if self.shape else 1
            args: list[Any] = []
            seen: dict[int, int] = {}
            windows = [
                _window(inp.store, inp.chunks, _restrict(inp.view, self.shape, lo, hi), args, seen)
                for inp in self.inputs
            ]
            space = (hi - lo, *self.shape[1:]) if self.shape else ()
            program = Program(
                space,
                windows,
                self.steps,
                [(STEP, k) for k, _ in live],
                [(part, ref, dtype) for part, _, ref, dtype, _, _ in self.sinks],
            )
            out = [vs[i] for vs in outs] + [ps[i] for ps in partials]
            if len(out) == 1:  # one Dask task per chunk, not one plus a getitem
                engine.submit(run_one, program, *args, out=out[0], ctx=_REMOTE, name=self.name)
            else:
                engine.submit(run, program, *args, out=out, ctx=_REMOTE, name=self.name)
        for (_, store), vs in zip(live, outs, strict=True):
            store.chunks = tuple(vs)
            store.expr = None
        for (_, name, _, dtype, count, result), ps in zip(self.sinks, partials, strict=True):
            var = engine.new_var(f"{result.name}[0]")
            engine.submit(combine, name, dtype, count, *ps, out=var, ctx=_REMOTE, name=name)
            result.chunks = (var,)
            result.expr = None
        self.inputs = []  # the versions are the tasks' now


def _flush_later(ref: weakref.ref[Expr], rctx: object) -> None:
    """The local operation pushed with an Expr's first step: at the loop's next iteration,
    flush it (unless someone did, or its results are all gone, or the engine closes)."""
    expr = ref()
    if expr is not None:
        try:
            expr.flush()
        except EngineClosedError:
            pass  # closing: nothing can read its results any more


def flush_soon(expr: Expr) -> None:
    """Push the local operation that flushes ``expr`` at the loop's next iteration."""
    expr.engine.push_sync(
        functools.partial(_flush_later, weakref.ref(expr)), _CPU, (), (), prop=_ASYNC,
        name="remote chain",
    )  # fmt: skip


def placed(engine: Engine, value: np.ndarray[Any, Any], rows: int, name: str) -> Store:
    """A Store of ``value`` (a NumPy array on the client): each chunk is sent once (the engine
    scatters a local Var's value) and kept on the cluster by a task of its own, so the client
    keeps no copy."""
    store = Store(engine, tuple(value.shape), value.dtype, rows, name)
    chunks = []
    for i in range(store.count):
        piece = value[i * rows : (i + 1) * rows] if value.ndim else value
        # A copy: the caller may change its array at once, before the chunk is sent (and an
        # in-process cluster would keep the caller's memory itself).
        piece = np.array(piece, copy=True, order="C")
        local = engine.new_var(f"{name}[{i}] sent", value=piece)
        var = engine.new_var(f"{name}[{i}]")
        engine.submit(own, local, out=var, ctx=_REMOTE, name="place")
        chunks.append(var)
    store.chunks = tuple(chunks)
    return store


def created(
    engine: Engine,
    kind: str,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    rows: int,
    chunk_args: Callable[[int, int], tuple[Any, ...]],
    name: str,
) -> Store:
    """A Store made on the workers, one task per chunk: ``create(kind, ...)`` with the
    arguments ``chunk_args(lo, hi)`` gives for its rows."""
    store = Store(engine, shape, dtype, rows, name)
    chunks = []
    for i in range(store.count):
        lo = i * rows
        hi = min(lo + rows, shape[0]) if shape else 1
        cshape = (hi - lo, *shape[1:]) if shape else ()
        var = engine.new_var(f"{name}[{i}]")
        engine.submit(
            create, kind, cshape, dtype, chunk_args(lo, hi), out=var, ctx=_REMOTE, name=name
        )
        chunks.append(var)
    store.chunks = tuple(chunks)
    return store


def _target_rows(store: Store, view: View) -> list[tuple[int, int, int]] | None:
    """Per chunk of ``store`` that ``view`` (a write's target) touches: (chunk, first row,
    end row) of the view's leading axis. None if one row of the view spans several rows of
    the Store (a new leading axis): then the whole view is one unit."""
    if not view.shape or 0 in view.shape:
        return None
    inner_lo = inner_hi = 0
    for d, s in zip(view.shape[1:], view.strides[1:], strict=True):
        if s < 0:
            inner_lo += (d - 1) * s
        else:
            inner_hi += (d - 1) * s
    if not store.shape:
        return None
    rb = store.rowbytes
    a = view.offset + inner_lo
    if a // rb != (view.offset + inner_hi) // rb:
        return None
    n, st = view.shape[0], view.strides[0]
    out = []
    for c in range(store.count):
        lo_b, hi_b = c * store.rows * rb, (c + 1) * store.rows * rb
        if st == 0:
            k0, k1 = (0, n) if lo_b <= a < hi_b else (0, 0)
        elif st > 0:
            k0, k1 = -((a - lo_b) // st), -((a - hi_b) // st)
        else:
            k0, k1 = (hi_b - a) // st + 1, (lo_b - a) // st + 1
        k0, k1 = max(k0, 0), min(k1, n)
        if k0 < k1:
            out.append((c, k0, k1))
    return out


def write_into(
    store: Store,
    view: View,
    expr: Expr,
    ref: tuple[int, Any],
) -> None:
    """``store[view] = value``, where ``expr`` (never flushed: a program of the write's own)
    computes the value over the view's shape as step or input ``ref``: one task per chunk the
    view touches, each making a new Var for that chunk (see the module docstring)."""
    engine = store.engine
    chunks = list(store.materialized())
    parts = _target_rows(store, view)
    if parts is None:
        span = view_rows(store, view)
        if span is None:
            return
        c0, c1 = span[0] // store.rows, span[1] // store.rows
        if c0 != c1:
            raise NotImplementedError(
                f"a write into {store.describe()} through a view whose leading axis is new "
                "(x[None][...] = ...) spans several chunks: write through x itself"
            )
        parts = [(c0, 0, view.shape[0] if view.shape else 1)]
        whole = True
    else:
        whole = False
    for c, k0, k1 in parts:
        if whole:
            target, space_view = view, None
        else:
            target = view.rows(k0, k1)
            space_view = (k0, k1)
        args: list[Any] = []
        seen: dict[int, int] = {}
        windows = []
        for inp in expr.inputs:
            v = inp.view if space_view is None else _restrict(inp.view, expr.shape, *space_view)
            windows.append(_window(inp.store, inp.chunks, v, args, seen))
        out = ref
        if space_view is not None and ref[0] == CONST and _along(ref[1], view.shape):
            out = (CONST, np.asarray(ref[1])[k0:k1])  # a NumPy value: this chunk's rows of it
        program = Program(target.shape, windows, expr.steps, [out])
        base = c * store.rows * store.rowbytes
        rows_c = min(store.rows, (store.shape[0] if store.shape else 1) - c * store.rows)
        old = _arg(args, seen, chunks[c])
        twin = Window((old,), 0, rows_c, target.shape, target.strides, target.offset - base,
                      store.dtype)  # fmt: skip
        var = engine.new_var(f"{store.name}[{c}]")
        engine.submit(write, program, twin, *args, out=var, ctx=_REMOTE, name="write")
        chunks[c] = var
    store.chunks = tuple(chunks)


def _along(value: Any, shape: tuple[int, ...]) -> bool:
    """Whether ``value`` (a NumPy value written into a view of ``shape``) runs along the
    view's leading axis (rather than broadcasting over it)."""
    return np.ndim(value) == len(shape) > 0 and np.shape(value)[0] == shape[0] > 1


def gather_parts(store: Store, view: View) -> tuple[list[Var], Window]:
    """The chunk Vars holding ``view`` of ``store``, and how to read it from their values."""
    args: list[Any] = []
    window = _window(store, store.materialized(), view, args, {})
    return args, window


def rows_of(values: Sequence[Any], window: Window) -> Any:
    """``window`` read from ``values`` on the client, after a gather (as a worker reads it),
    as a new array."""
    return np.array(read_window(window, values), copy=True)
