"""The linear algebra functions of the main namespace: ``matmul``, ``tensordot``, ``vecdot``
(``matrix_transpose`` is a view: ``_manipulation.py``). Their cost estimate (elements times
the contracted length) decides inline or pool.

A large 2-D product on the CPU is computed in chunks of whole rows of its result
(:class:`MatmulRows`), a chunked Buffer like a chain's: its rows on every worker, and what
follows (a layer's bias and activation) chunk by chunk as each is done. A product of a
transposed array and a chunked one over their rows, ``a.T @ g`` (a weight gradient), is a
partial product per chunk of rows (:class:`ContractRows`) added in order by a reduction's
``Combine``: it starts with the first rows of ``g`` done. An outer product is the
elementwise product it is (``_outer``), fused with what follows.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import FnProperty
from . import _meta
from ._array import Array, buffer_of, concrete_shape, is_view, known_shape, steps_of
from ._blas import blas_call
from ._buffer import Buffer
from ._chain import Combine, Partials, chunking
from ._kernel import MISSING, inputs_failure
from ._manipulation import transpose_step
from ._meta import axis_index, broadcast
from ._pool import empty as pooled_empty
from ._push import CPU, INLINE_COST, Pusher, blas, call_with, check_same, elementwise, push1

if TYPE_CHECKING:
    from .. import Context, Engine, Operation, RunContext

__all__ = ("Products",)


def _outer(x1: Any, x2: Any, out: Any = None) -> Any:
    """The elementwise product of an outer product (``matmul`` of a length of 1), without the
    floating-point warnings (``inf * 0``, overflow) that a matrix product does not give."""
    with np.errstate(all="ignore"):
        return np.multiply(x1, x2, out=out)


_outer.takes_out = True  # type: ignore[attr-defined]  # (a fused chain passes ``out=``)


class Products(Pusher):
    """``matmul``, ``tensordot`` and ``vecdot``
    (a mixin of :class:`~aioengine.array.Namespace`)."""

    def matmul(self, x1: Any, x2: Any, /) -> Array:
        """The matrix product (NumPy's ``matmul`` rules for 1-D and stacked operands)."""
        if isinstance(x1, np.ndarray):
            x1 = self.asarray(x1)
        if isinstance(x2, np.ndarray):
            x2 = self.asarray(x2)
        if not isinstance(x1, Array) or not isinstance(x2, Array):
            raise TypeError("matmul needs two arrays (Python scalars are not allowed)")
        device = check_same(self, [x1, x2])
        s1 = known_shape(x1)
        shape = _meta.matmul_shape(s1, known_shape(x2))
        dtype = _meta.sample_dtype(
            np.matmul, [(x1.dtype, (1,) * x1.ndim), (x2.dtype, (1,) * x2.ndim)]
        )
        k = s1[-1] or 1  # (for the cost: unknown or 0, as 1)
        cost = _meta.prod(shape) * k
        if (
            s1[-1] == 1
            and x1.ndim >= 2
            and x2.ndim >= 2
            and known_shape(x2)[-2] == 1
            and dtype.kind in "fiu"
            and device.device_type is CPU
            and cost > INLINE_COST
        ):
            # An outer product (a contracted length of 1): each element is one product, so
            # the elementwise product has its values, and runs as a chain over chunks (fused
            # with what follows) instead of a BLAS call on one thread per core. A matrix
            # product adds its products to 0.0: so does this (a -0.0 product is +0.0).
            product = elementwise(self, _outer, "matmul", (x1, x2))
            if dtype.kind != "f":
                return product
            return elementwise(self, np.add, "matmul", (product, 0.0))
        blocks = _contracted_rows(x1, x2, dtype, device, cost)
        if blocks is not None:
            out = _contract_rows(self._submit, self._engine, x1, x2, blocks, dtype, device)
            return Array(self, out, shape, dtype, device)
        rows = _row_chunking(self._chunk_elems, x1, x2, shape, dtype, device, cost)
        if rows is not None:
            n, m, k, elems = rows
            out = _row_chunks(
                self._submit,
                self._engine,
                buffer_of(x1),
                buffer_of(x2),
                (n, m, k),
                dtype,
                device,
                elems,
            )
            return Array(self, out, shape, dtype, device)
        return push1(
            self, blas(np.matmul, cost, device), (x1, x2), shape, dtype, device, "matmul", cost=cost
        )

    def tensordot(
        self, x1: Array, x2: Array, /, *, axes: int | tuple[Sequence[int], Sequence[int]] = 2
    ) -> Array:
        """The sum of products over ``axes`` (the last ``axes`` of x1 and first of x2)."""
        device = check_same(self, [x1, x2])
        s1, s2 = concrete_shape(self, x1, "tensordot"), concrete_shape(self, x2, "tensordot")
        if isinstance(axes, int):
            if axes < 0 or axes > min(len(s1), len(s2)):
                raise ValueError(f"tensordot: axes={axes} is out of range for shapes {s1} and {s2}")
            a1, a2 = list(range(len(s1) - axes, len(s1))), list(range(axes))
        else:
            a1 = [axis_index(a, len(s1)) for a in axes[0]]
            a2 = [axis_index(a, len(s2)) for a in axes[1]]
            if len(a1) != len(a2):
                raise ValueError("tensordot: the two sequences of axes differ in length")
        for i, j in zip(a1, a2, strict=True):
            if s1[i] != s2[j]:
                raise ValueError(f"tensordot: shape mismatch on axes {i} and {j}: {s1} and {s2}")
        shape = tuple(d for i, d in enumerate(s1) if i not in a1) + tuple(
            d for j, d in enumerate(s2) if j not in a2
        )
        dtype = np.result_type(x1.dtype, x2.dtype)
        cost = math.prod(s1) * max(math.prod(s2), 1)
        return push1(
            self,
            blas(partial(call_with, np.tensordot, {"axes": axes}), cost, device),
            (x1, x2),
            shape,
            dtype,
            device,
            "tensordot",
            cost=cost,
        )

    def vecdot(self, x1: Array, x2: Array, /, *, axis: int = -1) -> Array:
        """The dot product of vectors along ``axis`` (complex x1 conjugated)."""
        device = check_same(self, [x1, x2])
        if x1.ndim == 0 or x2.ndim == 0:
            raise ValueError("vecdot needs arrays of at least one dimension")
        s1, s2 = known_shape(x1), known_shape(x2)
        full = broadcast(s1, s2)
        ax = axis_index(axis, len(full))
        n1, n2 = s1[ax - len(full) + x1.ndim], s2[ax - len(full) + x2.ndim]
        if n1 is not None and n2 is not None and n1 != n2:
            raise ValueError(f"vecdot: the sizes along axis {axis} differ: {n1} and {n2}")
        shape = tuple(d for i, d in enumerate(full) if i != ax)
        dtype = np.result_type(x1.dtype, x2.dtype)
        return push1(
            self,
            partial(call_with, np.vecdot, {"axis": axis}),
            (x1, x2),
            shape,
            dtype,
            device,
            "vecdot",
            cost=_meta.prod(full),
        )


#: The fewest rows of a chunk of a product computed in chunks of rows (:func:`_row_chunking`).
MIN_ROWS = 64


class _RowBlock:
    """What the operation of one block of rows of a product holds: its two operands until
    it runs (:meth:`_start`), its rows ``[r0, r1)``, its name, and the ``lock`` the blocks of
    one product share: their result (a Buffer, or the Partials of a contraction) keeps the
    first failure any of them records (:meth:`_fail`), and what they allocate together."""

    __slots__ = ("lock", "name", "r0", "r1", "x1", "x2")

    def __init__(
        self, x1: Buffer, x2: Buffer, r0: int, r1: int, lock: threading.Lock, name: str
    ) -> None:
        self.x1: Buffer | None = x1
        self.x2: Buffer | None = x2
        self.r0 = r0
        self.r1 = r1
        self.lock = lock
        self.name = name

    def _start(self, result: Buffer | Partials) -> tuple[Buffer, Buffer] | None:
        """The operands, taken once (an operation done does not keep the arrays alive); None
        if the block is not computed: another block failed (the whole ``result`` has), or an
        input did (recorded on ``result``)."""
        x1, x2 = self.x1, self.x2
        assert x1 is not None, "a block is computed once"
        assert x2 is not None
        self.x1 = self.x2 = None
        if result.failure is not None:
            return None
        dep = inputs_failure((x1, x2), self.name)
        if dep is not None:
            self._fail(result, dep)
            return None
        return x1, x2

    def _fail(self, result: Buffer | Partials, exc: BaseException) -> None:
        """Record ``exc`` as ``result``'s failure, unless a block recorded one first."""
        with self.lock:
            if result.failure is None:
                result.failure = exc

    def _raised(self, result: Buffer | Partials, exc: BaseException, rctx: RunContext) -> None:
        """The block raised ``exc``: the whole ``result`` failed, whatever the other blocks
        compute; what reads it (a sync point, a chain, a view) learns it from there, as from
        a failed chain kernel. (The caller re-raises, for the engine's record.)"""
        exc.add_note(f"in aioengine.array operation {self.name} on {rctx.ctx}")
        self._fail(result, exc)


class MatmulRows(_RowBlock):
    """The operation that computes rows ``[r0, r1)`` of a row-chunked matrix product: its
    chunk of the result, ``x1[r0:r1] @ x2`` (a BLAS call, counted as one: ``_blas.py``).

    The chunks of one product run at once, on every worker, and whatever reads chunk *i* of
    the result (the bias and activation after a layer's product) starts once chunk *i* is
    done: the product joins the wavefront of the chains around it, where one BLAS call over
    the whole product left what follows it to start after the last row, on one Buffer that
    no chain could cut. The result's memory is allocated by the first chunk that runs (under
    ``lock``, shared by the chunks of one product); its ``failure`` is set by the first chunk
    whose input failed."""

    __slots__ = ("out",)

    def __init__(
        self,
        x1: Buffer,
        x2: Buffer,
        out: Buffer,
        r0: int,
        r1: int,
        lock: threading.Lock,
        name: str,
    ) -> None:
        super().__init__(x1, x2, r0, r1, lock, name)
        self.out = out

    def __call__(self, rctx: RunContext) -> None:
        out = self.out
        operands = self._start(out)
        if operands is None:
            return
        x1, x2 = operands
        rows = slice(self.r0, self.r1)
        try:
            with self.lock:
                value = out.value
                if value is MISSING:
                    value = out.value = pooled_empty(out.shape, out.dtype)  # type: ignore[arg-type]
            blas_call(np.matmul)(x1.value[rows], x2.value, out=value[rows])
        except BaseException as exc:
            self._raised(out, exc, rctx)
            raise


def _row_chunking(
    chunk_elems: int,
    x1: Array,
    x2: Array,
    shape: tuple[int | None, ...],
    dtype: np.dtype[Any],
    device: Context,
    cost: int,
) -> tuple[int, int, int, int] | None:
    """``(n, m, k, elems)`` if ``x1 @ x2`` is computed in chunks of whole rows (of ``elems``
    elements: the namespace's chunks of ``chunk_elems`` for an array of its size), else None.
    On the CPU, two whole (not viewed) 2-D operands of the result's floating dtype (no cast:
    each chunk calls the BLAS routine NumPy calls for the whole), more than one chunk, whole
    rows per chunk, and more work than is computed at the call; a contracted length known (not
    data-dependent) in both; and at least :data:`MIN_ROWS` rows per chunk (each chunk reads
    all of ``x2``: a short, wide product would read it many times over, and one row per
    chunk is a matrix-vector product each, 4-6 times slower than one call)."""
    if (
        device.device_type is not CPU
        or x1.ndim != 2
        or x2.ndim != 2
        or dtype.kind != "f"
        or x1.dtype != dtype
        or x2.dtype != dtype
        or cost <= INLINE_COST
        or is_view(x1)
        or is_view(x2)
    ):
        return None
    n, m = shape
    k = known_shape(x1)[1]
    if n is None or m is None or k is None or m == 0 or known_shape(x2)[0] != k:
        return None
    chunks, elems = chunking(n * m, chunk_elems)
    if chunks < 2 or elems % m or elems // m < MIN_ROWS:
        return None
    return n, m, k, elems


def _row_vars(buf: Buffer, r0: int, r1: int, k: int) -> list[Any]:
    """The Vars of the rows ``[r0, r1)`` of ``buf``, a whole 2-D array of ``k`` columns: its
    one Var, or (chunked) those of the chunks the rows' flat elements are in."""
    chunks, vars_ = buf.chunked, buf.vars
    if chunks is None or len(vars_) == 1:
        return [vars_[0]]
    e = chunks.elems
    return list(vars_[r0 * k // e : (r1 * k - 1) // e + 1]) if r1 * k > 0 else []


def _row_chunks(
    submit: Callable[..., Operation[Any]],
    engine: Engine,
    x1: Buffer,
    x2: Buffer,
    nmk: tuple[int, int, int],
    dtype: np.dtype[Any],
    device: Context,
    elems: int,
) -> Buffer:
    """The chunked Buffer of ``x1 @ x2`` (``(n, k) @ (k, m)``, C-ordered), chunks of
    ``elems`` (whole rows): one :class:`MatmulRows` per chunk, pushed with ``submit`` (the
    namespace's push), reading the chunks of ``x1`` its rows are in and all of ``x2``."""
    n, m, k = nmk
    step = elems // m  # rows per chunk
    out = Buffer(engine, None, (n, m), dtype, MISSING, name="matmul")  # type: ignore[arg-type]
    lock = threading.Lock()
    vars_: list[Any] = []
    writers: list[Any] = []
    for r0 in range(0, n, step):
        r1 = min(r0 + step, n)
        reads = _row_vars(x1, r0, r1, k)
        reads.extend(v for v in x2.vars if v not in reads)
        var = engine.new_var("matmul")
        op = submit(
            MatmulRows(x1, x2, out, r0, r1, lock, "matmul"),
            device,
            reads,
            (var,),
            FnProperty.NORMAL,
            "matmul",
            None,
        )
        vars_.append(var)
        writers.append(op)
    out.cut(elems, vars_, writers)
    return out


class ContractRows(_RowBlock):
    """The operation that computes block ``j`` (rows ``[r0, r1)`` of both operands) of
    ``a.T @ g``: the partial product ``a[r0:r1].T @ g[r0:r1]`` (a BLAS call, counted as one).

    A product over a long contracted axis (a layer's weight gradient ``X.T @ g_h``, over the
    samples) otherwise waits for the last row of ``g`` and then runs as one BLAS call; in
    blocks, it starts with the first rows done, on every worker. The partials go to a
    :class:`~aioengine.array._chain.Partials` (entry ``j``, written by this operation only;
    the first failure wins), which a reduction's :class:`~aioengine.array._chain.Combine`
    adds in block order (:func:`_added`), so the result does not depend on which block
    finished first (it may differ from one BLAS call over all rows in the last bits, as a
    sum in chunks does from NumPy's pairwise one)."""

    __slots__ = ("j", "shared")

    def __init__(
        self,
        a: Buffer,
        g: Buffer,
        shared: Partials,
        j: int,
        r0: int,
        r1: int,
        lock: threading.Lock,
        name: str,
    ) -> None:
        super().__init__(a, g, r0, r1, lock, name)
        self.shared = shared
        self.j = j

    def __call__(self, rctx: RunContext) -> None:
        shared = self.shared
        operands = self._start(shared)
        if operands is None:
            return
        a, g = operands
        rows = slice(self.r0, self.r1)
        try:
            shared.parts[self.j] = [blas_call(np.matmul)(a.value[rows].T, g.value[rows])]
        except BaseException as exc:
            self._raised(shared, exc, rctx)
            raise


def _added(partials: list[Any], count: int, dtype: np.dtype[Any]) -> Any:
    """The sum of a contracted product's partials, in block order (``Combine``'s combine)."""
    total = partials[0]
    for part in partials[1:]:
        np.add(total, part, out=total)
    return total


def _contracted_rows(
    x1: Array, x2: Array, dtype: np.dtype[Any], device: Context, cost: int
) -> tuple[int, int, int, int] | None:
    """``(n, k, m, rows)`` if ``x1 @ x2`` is ``a.T @ g`` contracted over ``n`` rows in blocks
    of ``rows`` (``g``'s chunks), else None: on the CPU, ``x1`` the transpose (``.mT``, a
    view) of a whole 2-D ``(n, k)`` array ``a`` and ``x2`` a whole 2-D ``(n, m)`` array ``g``
    chunked in whole rows (a Var per chunk), at least :data:`MIN_ROWS` of them per chunk, two
    chunks or more and ``k`` at most a quarter of them (the partials, one result-sized array
    per chunk until they are added, stay within a quarter of ``g``'s memory), both of the
    result's floating dtype, and more work than is computed at the call."""
    if (
        device.device_type is not CPU
        or x1.ndim != 2
        or x2.ndim != 2
        or dtype.kind != "f"
        or x1.dtype != dtype
        or x2.dtype != dtype
        or cost <= INLINE_COST
        or is_view(x2)
    ):
        return None
    steps = steps_of(x1)
    if len(steps) != 1:
        return None
    step = steps[0]
    if not (isinstance(step, partial) and step.func is transpose_step and step.args == ((1, 0),)):
        return None
    a, g = buffer_of(x1), buffer_of(x2)
    if a is None or g is None or len(a.shape) != 2 or g.chunked is None:
        return None
    n, k = a.shape
    gn, m = known_shape(x2)
    if n is None or k is None or gn != n or m is None or m == 0:
        return None
    elems = g.chunked.elems
    rows = elems // m
    if elems % m or rows < MIN_ROWS or n <= rows or len(g.vars) != -(-n // rows):
        return None  # (one Var: its chunks were merged, by ``g.var``)
    if 4 * k > rows:
        return None  # the partials, (k, m) per chunk, would take over a quarter of g's memory
    return n, k, m, rows


def _contract_rows(
    submit: Callable[..., Operation[Any]],
    engine: Engine,
    x1: Array,
    x2: Array,
    blocks: tuple[int, int, int, int],
    dtype: np.dtype[Any],
    device: Context,
) -> Buffer:
    """The Buffer of ``a.T @ g`` (:func:`_contracted_rows`): one :class:`ContractRows` per
    chunk of ``g``, pushed with ``submit`` (reading the chunks of ``a`` and ``g`` its rows are
    in), then a :class:`~aioengine.array._chain.Combine` reading them all."""
    n, k, m, rows = blocks
    a, g = buffer_of(x1), buffer_of(x2)
    assert a is not None
    assert g is not None
    count = -(-n // rows)
    shared = Partials(count)
    lock = threading.Lock()

    gvars = g.vars
    block_vars: list[Any] = []
    for j in range(count):
        r0, r1 = j * rows, min((j + 1) * rows, n)
        reads = _row_vars(a, r0, r1, k)
        if gvars[j] not in reads:
            reads.append(gvars[j])
        var = engine.new_var("matmul")
        submit(
            ContractRows(a, g, shared, j, r0, r1, lock, "matmul"),
            device,
            reads,
            (var,),
            FnProperty.NORMAL,
            "matmul",
            None,
        )
        block_vars.append(var)
    out = Buffer(engine, engine.new_var("matmul"), (k, m), dtype, MISSING, name="matmul")
    out.writer = submit(
        Combine(_added, shared, out, dtype, n, "matmul"),
        device,
        block_vars,
        (out.var,),
        FnProperty.NORMAL,
        "matmul",
        None,
    )
    return out
