"""What runs on a Dask worker for a remote array: one chunk's program, write, partial or
creation, in NumPy.

Every function here is a remote value operation's function (``Engine.submit(fn, ...,
ctx=ae.remote())``, ``_remote_store.py`` pushes them): it gets the values of the chunk Vars it
reads as NumPy arrays and returns new arrays, never changing its inputs (a version is shared by
every reader). Module-level functions only, so that a worker process imports them by name.

An operand is read through a :class:`Window`: the rows of the base array that a task needs are
the chunks it is given (consecutive ones, trimmed to the rows used), concatenated when there
are several (a halo: the neighbour chunk's rows); the operand is then a strided view of those
rows (basic indexing only: a view's shape, strides and byte offset, as NumPy's indexing
computed them on the client).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = (
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


class Window(NamedTuple):
    """How a task reads one operand from the chunk values it is given."""

    #: Index of its first chunk among the task's chunk arguments, and how many (-1: empty).
    first: int
    nchunks: int
    #: Rows taken from the first chunk (from ``start``) and the last (up to ``stop``).
    start: int
    stop: int
    #: The operand: a strided view of those rows, concatenated (bytes from their start).
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    dtype: np.dtype[Any]


class Program:
    """A fused chain of elementwise steps over the windows, restricted to one task's rows.

    ``steps``: (function, operand references, result dtype); ``outs``: the steps whose
    results the task returns (the arrays someone still holds), then one partial per
    ``sinks`` entry (reducer name, operand reference): each a reduction of that operand.
    """

    __slots__ = ("outs", "sinks", "steps", "windows")

    def __init__(
        self,
        windows: Sequence[Window],
        steps: Sequence[tuple[Callable[..., Any], tuple[tuple[int, Any], ...], np.dtype[Any]]],
        outs: Sequence[tuple[int, Any]],
        sinks: Sequence[tuple[str, tuple[int, Any], np.dtype[Any]]] = (),
    ) -> None:
        self.windows = tuple(windows)
        self.steps = tuple(steps)
        self.outs = tuple(outs)
        self.sinks = tuple(sinks)


def read_window(window: Window, values: Sequence[Any]) -> Any:
    """The operand ``window`` describes, from the chunk values a task was given."""
    if window.nchunks < 0:
        return np.empty(window.shape, window.dtype)
    chunks = values[window.first : window.first + window.nchunks]
    if len(chunks) == 1:
        rows = chunks[0] if np.ndim(chunks[0]) == 0 else chunks[0][window.start : window.stop]
    else:
        rows = np.concatenate([chunks[0][window.start :], *chunks[1:-1], chunks[-1][: window.stop]])
    rows = np.ascontiguousarray(rows)
    return np.ndarray(
        window.shape, window.dtype, buffer=rows, offset=window.offset, strides=window.strides
    )


def _evaluate(program: Program, values: Sequence[Any]) -> list[Any]:
    """Every operand the outputs and sinks need, in order: windows, then steps. A step's
    result that nothing later reads is dropped once read (None in its place), so that the
    next step's result reuses its memory: a chunk's temporaries held to the end cost a
    fresh allocation each (page faults), which made a 5-operation stencil step 3x slower
    than the same NumPy expression."""
    windows = [read_window(w, values) for w in program.windows]
    results: list[Any] = []
    last = _last_reads(program)
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
    return [windows, results]


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


def run(program: Program, *values: Any) -> tuple[Any, ...]:
    """One task of a fused chain: the program over the rows of ``values`` (chunk arrays);
    returns the results someone holds (each a new C-contiguous array), then the partials."""
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


def write(program: Program, target: Window, old: Any, *values: Any) -> Any:
    """One chunk of an in-place write: a copy of ``old`` (the chunk's current value) with the
    program's single output assigned to ``target`` (a window of that chunk alone); the program
    reads ``values``, the versions before the write (so ``a[0:2] = a[1:3]`` reads what NumPy
    reads)."""
    windows, results = _evaluate(program, values)
    value = _resolve(program.outs[0], windows, results)
    old = np.asarray(old)
    if target.offset == 0 and target.shape == old.shape and target.strides == old.strides:
        new = np.empty_like(old, order="C")  # the whole chunk is written: no copy of old
    else:
        new = np.array(old, copy=True, order="C")
    dest = np.ndarray(
        target.shape, new.dtype, buffer=new, offset=target.offset, strides=target.strides
    )
    dest[...] = value
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
