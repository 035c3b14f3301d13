"""What runs on a Dask worker for a remote array: one chunk's program, write, partial or
creation, in NumPy.

Every function here is a remote value operation's function (``Engine.submit(fn, ...,
ctx=ae.remote())``, ``_remote_store.py`` pushes them): it gets the values of the chunk Vars it
reads as NumPy arrays and returns new arrays, never changing its inputs (a version is shared by
every reader). Module-level functions only, so that a worker process imports them by name.

An operand is read through a :class:`Window`: the rows of the base array that a task needs are
the chunks it is given (consecutive ones, trimmed to the rows used; several for a halo: the
neighbour chunk's rows); the operand is a strided view of those rows (basic indexing only: a
view's shape, strides and byte offset, as NumPy's indexing computed them on the client).

A task of more than one block (:data:`BLOCK_ELEMS`, :func:`_block_rows`) evaluates its program
block by block of rows into its result (:func:`_blocked`): temporaries stay small, and a window
of consecutive rows across chunks is read as views of them, concatenated only where a block
straddles two.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._kernel import Applied

__all__ = (
    "BLOCK_ELEMS",
    "CONST",
    "IN",
    "REDUCERS",
    "STEP",
    "Program",
    "Window",
    "combine",
    "create",
    "own",
    "read_window",
    "run",
    "run_one",
    "write",
)

# An operand reference of a step: (kind, index or value).
IN = 0  #: a window of the program, by index into ``windows``
STEP = 1  #: the result of an earlier step, by index
CONST = 2  #: a value as it is (a Python scalar, a small NumPy array)


class Window:
    """How a task reads one operand from the chunk values it is given.

    A class, not a tuple: Dask parses a task's tuple arguments element by element, looking
    for futures (as a NamedTuple it made a write task's arguments 15 calls of that parse,
    about a fifth of the client's cost of a halo write)."""

    __slots__ = ("dtype", "offset", "parts", "shape", "start", "stop", "strides")

    def __init__(
        self,
        parts: tuple[int, ...],
        start: int,
        stop: int,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        offset: int,
        dtype: np.dtype[Any],
    ) -> None:
        #: Its chunks, in row order, as indices of the task's chunk arguments (each chunk is
        #: passed once, however many windows read it); empty: the operand has no element.
        self.parts = parts
        #: Rows taken from the first chunk (from ``start``) and the last (up to ``stop``).
        self.start = start
        self.stop = stop
        #: The operand: a strided view of those rows, concatenated (bytes from their start).
        self.shape = shape
        self.strides = strides
        self.offset = offset
        self.dtype = dtype

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            Window,
            (self.parts, self.start, self.stop, self.shape, self.strides, self.offset, self.dtype),
        )


class Program:
    """A fused chain of elementwise steps over the windows, restricted to one task's rows.

    ``space``: the shape of the task's result (its rows of the program's shape, or of the
    view a write fills); ``steps``: (function, operand references, result dtype); ``outs``:
    the steps whose results the task returns (the arrays someone still holds), then one
    partial per ``sinks`` entry (reducer name, operand reference): each a reduction of that
    operand.
    """

    __slots__ = ("outs", "sinks", "space", "steps", "windows")

    def __init__(
        self,
        space: tuple[int, ...],
        windows: Sequence[Window],
        steps: Sequence[tuple[Callable[..., Any], tuple[tuple[int, Any], ...], np.dtype[Any]]],
        outs: Sequence[tuple[int, Any]],
        sinks: Sequence[tuple[str, tuple[int, Any], np.dtype[Any]]] = (),
    ) -> None:
        self.space = space
        self.windows = tuple(windows)
        self.steps = tuple(steps)
        self.outs = tuple(outs)
        self.sinks = tuple(sinks)


def read_window(window: Window, values: Sequence[Any]) -> Any:
    """The operand ``window`` describes, from the chunk values a task was given."""
    if not window.parts:
        return np.empty(window.shape, window.dtype)
    chunks = [values[i] for i in window.parts]
    if len(chunks) == 1:
        rows = chunks[0] if np.ndim(chunks[0]) == 0 else chunks[0][window.start : window.stop]
    else:
        rows = np.concatenate([chunks[0][window.start :], *chunks[1:-1], chunks[-1][: window.stop]])
    rows = np.ascontiguousarray(rows)
    return np.ndarray(
        window.shape, window.dtype, buffer=rows, offset=window.offset, strides=window.strides
    )


def _evaluate(program: Program, values: Sequence[Any]) -> list[Any]:
    """Every operand the outputs and sinks need, in order: windows, then steps (the whole
    task at once: the path of a task of one block, or whose program cannot be cut in
    blocks: :func:`_cuttable`)."""
    windows = [read_window(w, values) for w in program.windows]
    return [windows, _steps(program, windows, _last_reads(program))]


def _steps(program: Program, windows: list[Any], last: dict[int, int]) -> list[Any]:
    """The steps' results over ``windows`` (the task's operands, or their rows of one block).
    A step's result that nothing later reads is dropped once read (None in its place), so
    that the next step's result reuses its memory."""
    results: list[Any] = []
    for i, (fn, refs, dtype) in enumerate(program.steps):
        args = [_resolve(ref, windows, results) for ref in refs]
        for kind, index in refs:
            if kind == STEP and last.get(index) == i:
                results[index] = None
        result = np.asarray(fn(*args))
        del args
        if result.dtype != dtype:
            result = result.astype(dtype)
        results.append(result)
    return results


#: A task evaluates its program in blocks of rows of about this many elements: every
#: step's result is then a small array (96 KiB of float64) that malloc serves from memory it
#: keeps. A temporary the size of a chunk is mapped fresh from the OS on a Dask worker (Dask
#: sets ``MALLOC_TRIM_THRESHOLD_``, which fixes glibc's mmap threshold at 128 KiB), and its
#: page faults made a stencil step's task 8x slower there than the same NumPy on the client.
BLOCK_ELEMS = 12288


def _block_rows(program: Program) -> int:
    """The rows per block of ``program``'s task; 0 if it is one block, or cannot be cut."""
    space = program.space
    if len(space) == 0 or math.prod(space) == 0:
        return 0
    n = space[0]
    per = max(1, BLOCK_ELEMS // max(1, math.prod(space[1:])))
    return per if n > per and _cuttable(program, n, len(space)) else 0


def _blocked(program: Program, values: Sequence[Any], dests: Sequence[Any], per: int) -> list[Any]:
    """Evaluate ``program``'s outputs into ``dests`` (arrays of its ``space``), ``per`` rows
    at a time (:func:`_block_rows`), and return its reductions' partials (each the combine
    of its blocks', in block order)."""
    n, ndim = program.space[0], len(program.space)
    readers = [_reader(w, values, n, ndim) for w in program.windows]
    last = _last_reads(program)
    outs, sinks = program.outs, program.sinks
    parts: list[list[Any]] = [[] for _ in sinks]
    for r0 in range(0, n, per):
        r1 = min(n, r0 + per)
        windows = [read(r0, r1) for read in readers]
        results = _steps(program, windows, last)
        for dest, ref in zip(dests, outs, strict=True):
            dest[r0:r1] = _resolve(ref, windows, results)
        for blocks, (name, ref, dtype) in zip(parts, sinks, strict=True):
            blocks.append(_partial(name, _resolve(ref, windows, results), dtype))
    return [
        np.asarray(REDUCERS[name][1](np.asarray(blocks), dtype))
        for blocks, (name, _, dtype) in zip(parts, sinks, strict=True)
    ]


def _cuttable(program: Program, n: int, ndim: int) -> bool:
    """Whether the task's program gives the same result computed block by block: every step
    is elementwise (``xp.apply``'s function runs once per chunk, on all of its rows), and no
    value the task carries runs along its leading axis (it would need cutting per block;
    such values are small, and so is the task then)."""
    refs = list(program.outs)
    for fn, operands, _ in program.steps:
        if isinstance(fn, Applied):
            return False
        refs.extend(operands)
    for kind, value in refs:
        carried = kind == CONST and isinstance(value, np.ndarray | np.generic)
        if carried and value.ndim == ndim and value.shape[0] == n:
            return False
    return True


def _reader(window: Window, values: Sequence[Any], n: int, ndim: int) -> Callable[[int, int], Any]:
    """How a block of rows ``r0:r1`` reads ``window`` (of a task of ``n`` rows and ``ndim``
    dimensions): its rows, as views of the chunks where they lie within one chunk (a
    window across chunks, a halo, is never concatenated whole); the whole operand in every
    block if it broadcasts along the leading axis."""
    shape = window.shape
    if not window.parts or len(shape) != ndim or shape[0] != n:
        whole = read_window(window, values)
        return lambda r0, r1: whole
    chunks = [values[i] for i in window.parts]
    # A row's bytes as the client laid the rows out (C order), not a chunk's own stride: a
    # loader may return a strided view, and a one-row chunk may keep any stride.
    rowbytes = window.dtype.itemsize * math.prod(chunks[0].shape[1:]) if chunks[0].ndim else 0
    if len(chunks) == 1 or rowbytes == 0 or window.strides[0] != rowbytes:
        full = read_window(window, values)
        return lambda r0, r1: full[r0:r1]
    # Consecutive rows: row j of the window lies in row ``base + j`` of the chunks' rows
    # (the first from ``start``, the last up to ``stop``), at ``inner`` bytes into it.
    base, inner = divmod(window.offset, rowbytes)
    segments = []  # (first row of the window in it, its chunk, the chunk's row there)
    row = -base
    for k, chunk in enumerate(chunks):
        lo = window.start if k == 0 else 0
        hi = window.stop if k == len(chunks) - 1 else len(chunk)
        segments.append((row, np.ascontiguousarray(chunk), lo))
        row += hi - lo
    dtype, tail, strides = window.dtype, shape[1:], window.strides

    def read(r0: int, r1: int) -> Any:
        parts = []
        for k, (first, chunk, lo) in enumerate(segments):
            end = segments[k + 1][0] if k + 1 < len(segments) else r1
            a, b = max(r0, first), min(r1, end)
            if a < b:
                offset = (lo + a - first) * rowbytes + inner
                parts.append(np.ndarray((b - a, *tail), dtype, chunk, offset, strides))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    return read


def _last_reads(program: Program) -> dict[int, int]:
    """Per step result that no output or sink reads: the last step that reads it."""
    kept = {index for kind, index in program.outs if kind == STEP}
    kept.update(index for _, (kind, index), _ in program.sinks if kind == STEP)
    last: dict[int, int] = {}
    for i, (_, refs, _) in enumerate(program.steps):
        for kind, index in refs:
            if kind == STEP and index not in kept:
                last[index] = i
    return last


def _resolve(ref: tuple[int, Any], windows: list[Any], results: list[Any]) -> Any:
    kind, index = ref
    if kind == IN:
        return windows[index]
    if kind == STEP:
        return results[index]
    return index


#: Per-chunk reductions by name: (partial of one chunk, combine of the partials in order).
REDUCERS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "sum": (lambda x, dtype: np.sum(x, dtype=dtype), lambda p, dtype: np.sum(p, dtype=dtype)),
    "prod": (lambda x, dtype: np.prod(x, dtype=dtype), lambda p, dtype: np.prod(p, dtype=dtype)),
    "max": (lambda x, dtype: np.max(x), lambda p, dtype: np.max(p)),
    "min": (lambda x, dtype: np.min(x), lambda p, dtype: np.min(p)),
}


def _partial(name: str, x: Any, dtype: np.dtype[Any]) -> Any:
    if name in ("max", "min") and x.size == 0:
        return None  # an empty chunk has no extreme: the combine skips it
    part, _ = REDUCERS[name]
    return np.asarray(part(x, dtype))


def _dtype(program: Program, ref: tuple[int, Any]) -> np.dtype[Any]:
    kind, index = ref
    dtype: np.dtype[Any] = program.windows[index].dtype if kind == IN else program.steps[index][2]
    return dtype


def run(program: Program, *values: Any) -> tuple[Any, ...]:
    """One task of a fused chain: the program over the rows of ``values`` (chunk arrays);
    returns the results someone holds (each a new C-contiguous array), then the partials."""
    per = _block_rows(program)
    if per:
        dests = [np.empty(program.space, _dtype(program, ref)) for ref in program.outs]
        return (*dests, *_blocked(program, values, dests, per))
    windows, results = _evaluate(program, values)
    out: list[Any] = []
    for ref in program.outs:
        value = _resolve(ref, windows, results)
        out.append(np.array(value, copy=True, order="C"))
    for name, ref, dtype in program.sinks:
        out.append(_partial(name, _resolve(ref, windows, results), dtype))
    return tuple(out)


def run_one(program: Program, *values: Any) -> Any:
    """:func:`run` of a program with a single output, returned as it is (not in a tuple): the
    task's own result is the chunk, so Dask runs no ``getitem`` task to take it out."""
    return run(program, *values)[0]


def write(program: Program, target: Window, *values: Any) -> Any:
    """One chunk of an in-place write: a copy of the chunk's current value (``values`` at
    ``target``'s one part) with the program's single output assigned to ``target`` (a window
    of that chunk alone); the program reads ``values``, the versions before the write (so
    ``a[0:2] = a[1:3]`` reads what NumPy reads)."""
    old = np.asarray(values[target.parts[0]])
    if target.offset == 0 and target.shape == old.shape and target.strides == old.strides:
        new = np.empty_like(old, order="C")  # the whole chunk is written: no copy of old
    else:
        new = np.array(old, copy=True, order="C")
    dest = np.ndarray(
        target.shape, new.dtype, buffer=new, offset=target.offset, strides=target.strides
    )
    per = _block_rows(program)  # (the program's space is the target's shape)
    if per:
        _blocked(program, values, [dest], per)
        return new
    windows, results = _evaluate(program, values)
    dest[...] = _resolve(program.outs[0], windows, results)
    return new


def combine(name: str, dtype: np.dtype[Any], count: int, *partials: Any) -> Any:
    """A reduction's result from its chunks' partials, combined in chunk order (a sum does not
    depend on which chunk finished first). ``mean`` is a sum over ``count``."""
    parts = [p for p in partials if p is not None]
    if name == "mean":
        total = np.sum(np.asarray(parts), dtype=dtype)
        return np.asarray(np.true_divide(total, count, dtype=dtype), dtype=dtype)
    if not parts:
        raise ValueError(f"zero-size array to reduction operation {name} which has no identity")
    _, comb = REDUCERS[name]
    return np.asarray(comb(np.asarray(parts), dtype), dtype=dtype)


def create(kind: str, shape: tuple[int, ...], dtype: np.dtype[Any], args: tuple[Any, ...]) -> Any:
    """One chunk of a creation function, made on the worker: ``zeros``, ``ones``, ``empty``,
    ``full`` (``args``: the fill value), ``arange`` (``args``: start of the chunk, step) and
    ``linspace`` (``args``: start, step, first index, the last value's index and value or
    None), as NumPy computes them; ``apply`` (``args``: the checked loader, its arguments and
    the chunk's rows), the loader called with ``rows=slice(lo, hi)``."""
    if kind == "zeros":
        return np.zeros(shape, dtype)
    if kind == "ones":
        return np.ones(shape, dtype)
    if kind == "empty":
        return np.empty(shape, dtype)
    if kind == "full":
        return np.full(shape, args[0], dtype)
    if kind == "arange":
        start, step = args
        return (start + np.arange(shape[0]) * step).astype(dtype)
    if kind == "linspace":
        start, step, first, last = args
        value = np.arange(first, first + shape[0], dtype=np.float64) * step + start
        if last is not None:
            value[-1] = last
        return value.astype(dtype)
    if kind == "apply":
        fn, fn_args, lo, hi = args
        return fn(*fn_args, rows=slice(lo, hi))
    raise ValueError(f"unknown creation {kind!r}")


def own(value: Any) -> Any:
    """A value sent from the client, as a chunk of its own (C-contiguous)."""
    return np.ascontiguousarray(value)
