"""Scans: ``cumulative_sum`` and ``cumulative_prod`` of a large array, chunk by chunk, each
chunk carrying on from the last element of the one before.

The result is a chunked Buffer (``_chain.py``: one Var per chunk, slices of one allocation).
Its chunk *i* is computed by an operation of its own, a :class:`ScanChunk`, that reads the
input's Vars for the elements it needs and the result's chunk *i - 1* (whose last element is
the carry) and writes the result's chunk *i*. So the chunks of one scan run one after the
other, in order, while whatever reads the result's chunk *i* (a chain, a reduction) starts
as soon as that chunk is done, before the last chunk is: a wavefront, as in a chain.

The values are NumPy's, bit for bit: NumPy's ``cumsum`` is sequential (``out[k] = out[k-1] +
x[k]``, in the result dtype), and chunk *i* computes ``out[lo] = out[lo-1] + x[lo]`` and lets
NumPy's ``accumulate`` go on from there, which are the same operations in the same order. A
two-pass scheme (every chunk's own scan at once, then each chunk adds the total of those
before it) uses every worker where this uses one at a time, but it reads and writes the result
twice and its floating-point results are not NumPy's. Measured (``benchmarks/array_scan.py``,
8e6 float64, 2 workers, on a 2-core machine shared with other work): this scheme 1.09-1.19
times NumPy's ``cumsum``, the two-pass one 1.10-1.16 times (a scan is memory-bound: the second
worker bought nothing), with 94% of its elements differing from NumPy's in the last bits. So
the exact one.

State: a :class:`ScanChunk`'s fields are written before its push and read by its operation
only. The result Buffer's ``value`` is allocated by chunk 0's operation (every other chunk's
runs after it, since it reads the chunk before); its ``failure`` is set by the first chunk
whose input failed, and the chunks after it compute nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import FnProperty
from ._buffer import Buffer
from ._chain import chunking
from ._kernel import MISSING, inputs_failure

if TYPE_CHECKING:
    from .. import Context, Engine, Operation, RunContext

__all__ = ("ScanChunk", "scan_chunks")

_NORMAL = FnProperty.NORMAL


class ScanChunk:
    """The operation that computes chunk ``[lo, hi)`` (flat positions) of a scan's result."""

    __slots__ = ("hi", "initial", "lo", "name", "out", "ufunc", "x")

    def __init__(
        self, ufunc: np.ufunc, x: Buffer, out: Buffer, lo: int, hi: int, initial: int, name: str
    ) -> None:
        self.ufunc = ufunc
        self.x: Buffer | None = x
        self.out: Buffer | None = out
        self.lo = lo
        self.hi = hi
        #: 1 if the result starts with the ufunc's identity (``include_initial``), else 0:
        #: the result's position ``p`` holds the scan up to the input's ``p - initial``.
        self.initial = initial
        self.name = name

    def __call__(self, rctx: RunContext) -> None:
        out, x = self.out, self.x
        assert out is not None, "a chunk is computed once"
        assert x is not None
        self.out = self.x = None  # an operation done does not keep the arrays alive
        if out.failure is not None:
            return  # an earlier chunk's input failed: the whole result has
        dep = inputs_failure((x,), self.name)
        if dep is not None:
            out.failure = dep
            return
        value = out.value
        if value is MISSING:  # chunk 0: every later chunk runs after it
            value = out.value = np.empty(out.shape, out.dtype)
        flat = value.reshape(-1)
        lo, hi, initial, ufunc = self.lo, self.hi, self.initial, self.ufunc
        if initial and lo == 0:
            flat[0] = ufunc.identity
            lo = 1
        if lo >= hi:
            return
        seg = flat[lo:hi]
        try:
            seg[...] = x.value.reshape(-1)[lo - initial : hi - initial]  # cast, as NumPy's first
            if lo > initial:  # carry on from the element before (not at the sequence's start)
                ufunc(flat[lo - 1 : lo], seg[:1], out=seg[:1])
            ufunc.accumulate(seg, dtype=seg.dtype, out=seg)
        except BaseException as exc:  # the engine records it; the later chunks compute nothing
            exc.add_note(f"in aioengine.array operation {self.name} on {rctx.ctx}")
            out.failure = exc
            raise


def scan_chunks(
    submit: Callable[..., Operation[Any]],
    engine: Engine,
    chunk_elems: int,
    ufunc: np.ufunc,
    name: str,
    x: Buffer,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    device: Context,
    include_initial: bool,
) -> Buffer:
    """The chunked Buffer of the scan ``ufunc.accumulate`` of the flat elements of ``x`` (a
    whole Buffer, not a view), of ``shape`` and ``dtype`` (``include_initial``: one more
    element, the identity, first): one :class:`ScanChunk` per chunk of the result, pushed
    with ``submit`` (the namespace's push)."""
    size = math.prod(shape)
    n, elems = chunking(size, chunk_elems)
    xvars = x.vars
    initial = int(include_initial)
    # x's elements, from the result's (x's Buffer may not know a shape its data decided).
    xelems = chunking(size - initial, chunk_elems)[1]
    out = Buffer(engine, None, shape, dtype, MISSING, name=name)  # type: ignore[arg-type]
    vars_: list[Any] = [engine.new_var(name) for _ in range(n)]
    writers: list[Any] = []
    for i in range(n):
        lo = i * elems
        hi = min(lo + elems, size)
        first, last = max(lo - initial, 0), hi - initial  # the input elements it reads
        if len(xvars) == 1:
            reads = [xvars[0]]
        else:
            reads = list(xvars[first // xelems : (last - 1) // xelems + 1]) if last > first else []
        if i:
            reads.append(vars_[i - 1])  # the carry
        op = submit(
            ScanChunk(ufunc, x, out, lo, hi, initial, name),
            device,
            reads,
            (vars_[i],),
            _NORMAL,
            name,
            None,
        )
        writers.append(op)
    out.cut(elems, vars_, writers)
    return out
