"""The reductions a chunk's kernel computes as partials: what each computes on one block, and
how the partials combine.

A reduction of a whole chunked array (``_chain.reduce_chunks``) is one step per chunk in the
chunk's kernel, which reduces each block of its chunk to a *partial* (``Reducer.block``), and
one operation that combines every partial once the kernels have run (``Reducer.combine``).
The combine reads the partials **in flat order** (chunk by chunk, block by block), never in
the order the chunks finished, so a result does not depend on scheduling: the same array and
chunk size give the same bits every time.

What each result is, against NumPy's own (written once, here):

* ``max``, ``min``, ``argmax``, ``argmin`` and every integer or boolean ``sum``/``prod``:
  exactly NumPy's. ``argmax``/``argmin`` keep NumPy's first occurrence: a tie goes to the
  lowest flat index, across blocks and chunks too, and a NaN wins (the first one), as in
  NumPy.
* Floating-point ``sum``, ``prod``, ``mean``: NumPy sums pairwise, in blocks of its own; the
  partials are ``np.add.reduce`` (``np.multiply.reduce``) of blocks of ``_numpy_fuse.BLOCK``
  elements for float32 and float64 in their own dtype (the same bits whether the compiled
  runner or NumPy calls compute them: which one does depends on the other steps of the
  chunk's program, so on scheduling; but where a program computes on blocks of whole rows
  (a broadcast operand, a reduction along the first axis) and neither a block of whole rows
  and whole BLOCKs nor the whole chunk fits in four times its usual block, which takes a
  chunk above 4 MiB: then a partial per block of rows), of about a mebibyte otherwise,
  then summed pairwise in flat order. The rounding differs from NumPy's;
  both are within a few ulps times ``log2(n)`` of the exact sum relative to the sum of
  magnitudes.
* ``var`` and ``std``: each block's partial is its element count, mean and sum of squared
  deviations from that mean (M2), by NumPy's own two-pass method over the block (in the
  result dtype: float64 for integer and boolean input, the input's otherwise); the partials
  combine with Chan, Golub and LeVeque's pairwise update (``delta = mean_b - mean_a``;
  ``M2 = M2_a + M2_b + delta**2 * n_a * n_b / n``), in float64, and the result is
  ``M2 / max(n - correction, 0)`` cast to the result dtype (``std``: its square root, in that
  dtype, as NumPy takes it). Like NumPy's, it is a two-pass result whose error relative to the
  variance grows with ``log2(n)`` and with ``(mean / std)**2``; measured against exact
  rational arithmetic on 1e6 elements (normal data, mean up to 10 standard deviations), ours
  and NumPy's are each within ``4e-16`` (float64) and ``2e-7`` (float32) of the variance, and
  the tests hold the two to ``1e-12`` and ``1e-5`` of each other. A constant array gives 0, or
  a residue of the order of ``eps * value**2``, as NumPy's does. NaN gives NaN; an infinity
  gives NaN, as in NumPy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, NamedTuple

import numpy as np

__all__ = ("REDUCERS", "ROW_REDUCERS", "Reducer")

_REAL = "biuf"  # the dtype kinds whose partials are plain comparisons and float moments
_ANY = "biufc"


class Reducer(NamedTuple):
    """How a reduction is computed as per-block partials: ``block(dtype, values)`` is one
    block's partial (``dtype``: the result's); ``combine(partials, count, dtype, **options)``
    the result from every partial in flat order (``count``: the elements reduced;
    ``options``: the reduction's keywords other than ``dtype``, ``correction`` for ``var``);
    ``kinds``: the input dtype kinds it fuses for (others reduce the whole array); ``loop``:
    where a block's partial is ``ufunc.reduce`` of the block in the input's own dtype, that
    ufunc and its identity (the compiled runner then computes the partials without the GIL,
    ``_numpy_fuse.Reduce``)."""

    block: Callable[..., Any]
    combine: Callable[..., Any]
    kinds: str
    loop: tuple[np.ufunc, float] | None = None


def _block_sum(dtype: np.dtype[Any], x: Any) -> Any:
    return np.sum(x, dtype=dtype)


def _block_prod(dtype: np.dtype[Any], x: Any) -> Any:
    return np.prod(x, dtype=dtype)


def _block_max(dtype: np.dtype[Any], x: Any) -> Any:
    return np.max(x)


def _block_min(dtype: np.dtype[Any], x: Any) -> Any:
    return np.min(x)


def _sum(values: list[Any], count: int, dtype: np.dtype[Any]) -> Any:
    return np.sum(values, dtype=dtype)


def _prod(values: list[Any], count: int, dtype: np.dtype[Any]) -> Any:
    return np.prod(values, dtype=dtype)


def _max(values: list[Any], count: int, dtype: np.dtype[Any]) -> Any:
    return np.max(values)


def _min(values: list[Any], count: int, dtype: np.dtype[Any]) -> Any:
    return np.min(values)


def _mean(values: list[Any], count: int, dtype: np.dtype[Any]) -> Any:
    return np.true_divide(np.sum(values, dtype=dtype), count, dtype=dtype)


# -- var and std: per-block moments, combined with Chan et al.'s update -------------------------


def _block_moments(dtype: np.dtype[Any], x: Any) -> tuple[int, float, float]:
    """(count, mean, M2) of one block, by NumPy's two passes (its ``_var``) in ``dtype``."""
    n = x.size
    mean = np.true_divide(np.sum(x, dtype=dtype), n, dtype=dtype)
    dev = np.subtract(x, mean, dtype=dtype)
    np.multiply(dev, dev, out=dev)
    return n, float(mean), float(np.sum(dev))


def _moments(values: Iterable[tuple[int, float, float]]) -> tuple[int, float]:
    """The count and M2 of the concatenation of blocks with these moments, in their order."""
    n, mean, m2 = 0, 0.0, 0.0
    for nb, mb, m2b in values:
        if n == 0:
            n, mean, m2 = nb, mb, m2b
            continue
        total = n + nb
        delta = mb - mean
        mean += delta * nb / total
        m2 += m2b + delta * delta * n * nb / total
        n = total
    return n, m2


def _var_value(values: list[Any], correction: float) -> Any:
    n, m2 = _moments(values)
    with np.errstate(divide="ignore", invalid="ignore"):  # NumPy's inf or nan, as NumPy
        return np.true_divide(np.float64(m2), max(n - correction, 0))


def _var(values: list[Any], count: int, dtype: np.dtype[Any], correction: float = 0.0) -> Any:
    return np.asarray(_var_value(values, correction), dtype=dtype)


def _std(values: list[Any], count: int, dtype: np.dtype[Any], correction: float = 0.0) -> Any:
    return np.sqrt(np.asarray(_var_value(values, correction), dtype=dtype))


# -- argmax and argmin: (index in the block, value, block length), first occurrence -------------


def _block_argmax(dtype: np.dtype[Any], x: Any) -> tuple[int, Any, int]:
    i = int(np.argmax(x))
    return i, x[i], x.size


def _block_argmin(dtype: np.dtype[Any], x: Any) -> tuple[int, Any, int]:
    i = int(np.argmin(x))
    return i, x[i], x.size


def _first(values: list[Any], better: Callable[[Any, Any], bool]) -> int:
    """The flat index of the first partial whose value no later one is ``better`` than (a
    NaN is better than any number, and the first NaN stays: NumPy's rule)."""
    best = offset = 0
    best_value: Any = None
    for i, value, size in values:
        if best_value is None or (
            best_value == best_value and (value != value or better(value, best_value))
        ):
            best, best_value = offset + i, value
        offset += size
    return best


def _argmax(values: list[Any], count: int, dtype: np.dtype[Any]) -> Any:
    return _first(values, lambda a, b: bool(a > b))


def _argmin(values: list[Any], count: int, dtype: np.dtype[Any]) -> Any:
    return _first(values, lambda a, b: bool(a < b))


# -- along the first axis: a partial per block of whole rows --------------------------------------
#
# A reduction along axis 0 of an array whose chunks are whole rows: each block's partial is the
# reduction of its rows (a row of its own), and the partials, stacked in flat order, are reduced
# along the first axis again. ``sum``, ``prod`` and ``mean`` of floats round differently from
# NumPy's (which adds the rows in order, in one pass), within a few ulps times the number of
# blocks; ``max``, ``min`` and integer and boolean ``sum``/``prod`` are exact. ``block(dtype,
# tail, values)`` takes the block flat and ``tail``, the shape of a row.


def _rows(
    fn: Callable[..., Any], typed: bool, dtype: np.dtype[Any], tail: tuple[int, ...], x: Any
) -> Any:
    """``fn`` (given ``dtype`` if ``typed``) of the block ``x``'s rows along the first axis."""
    rows = x.reshape(-1, *tail)
    return fn(rows, axis=0, dtype=dtype) if typed else fn(rows, axis=0)


def _stacked(
    fn: Callable[..., Any], typed: bool, values: list[Any], count: int, dtype: np.dtype[Any]
) -> Any:
    """``fn`` (given ``dtype`` if ``typed``) of the stacked partial rows along the first axis."""
    return fn(values, axis=0, dtype=dtype) if typed else fn(values, axis=0)


def _stacked_mean(values: list[Any], count: int, dtype: np.dtype[Any]) -> Any:
    return np.true_divide(np.sum(values, axis=0, dtype=dtype), count, dtype=dtype)


#: The reductions along the first axis a chunk's kernel computes as partials (``count``: the
#: rows), for the input dtype kinds given (float16 and complex reduce the whole array).
ROW_REDUCERS: dict[Any, Reducer] = {
    np.sum: Reducer(partial(_rows, np.sum, True), partial(_stacked, np.sum, True), _REAL),
    np.prod: Reducer(partial(_rows, np.prod, True), partial(_stacked, np.prod, True), _REAL),
    np.max: Reducer(partial(_rows, np.max, False), partial(_stacked, np.max, False), _REAL),
    np.min: Reducer(partial(_rows, np.min, False), partial(_stacked, np.min, False), _REAL),
    np.mean: Reducer(partial(_rows, np.sum, True), _stacked_mean, _REAL),
}

#: The reductions that fuse into chunk kernels, by NumPy's function.
REDUCERS: dict[Any, Reducer] = {
    np.sum: Reducer(_block_sum, _sum, _ANY, (np.add, 0.0)),
    np.prod: Reducer(_block_prod, _prod, _ANY, (np.multiply, 1.0)),
    np.max: Reducer(_block_max, _max, _ANY),
    np.min: Reducer(_block_min, _min, _ANY),
    np.mean: Reducer(_block_sum, _mean, _ANY, (np.add, 0.0)),
    np.var: Reducer(_block_moments, _var, _REAL),
    np.std: Reducer(_block_moments, _std, _REAL),
    np.argmax: Reducer(_block_argmax, _argmax, _REAL),
    np.argmin: Reducer(_block_argmin, _argmin, _REAL),
}
