"""Searching, sorting and set functions of the namespace: ``argmax``, ``where``, ``sort``,
``unique_*``, ``nonzero``, ...

The results of ``nonzero`` and ``unique_*`` have data-dependent shapes: their unknown dimension
is None until the value is computed (``unique_inverse``'s indices have the input's shape).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import numpy as np

from . import _meta
from ._array import Array, known_shape
from ._meta import Shape, axis_index
from ._push import Pusher, check_same, elementwise, operand, push, push1, reduction
from ._statistics import check_identity

__all__ = ("Searching", "UniqueAllResult", "UniqueCountsResult", "UniqueInverseResult")


class UniqueAllResult(NamedTuple):
    """What :meth:`Namespace.unique_all` returns."""

    values: Array
    indices: Array
    inverse_indices: Array
    counts: Array


class UniqueCountsResult(NamedTuple):
    """What :meth:`Namespace.unique_counts` returns."""

    values: Array
    counts: Array


class UniqueInverseResult(NamedTuple):
    """What :meth:`Namespace.unique_inverse` returns."""

    values: Array
    inverse_indices: Array


class Searching(Pusher):
    """The standard's searching, sorting and set functions
    (a mixin of :class:`~aioengine.array.Namespace`)."""

    def argmax(self, x: Array, /, *, axis: int | None = None, keepdims: bool = False) -> Array:
        """Indices of the maxima along ``axis`` (of the flattened array if None)."""
        check_identity(x, axis, "attempt to get argmax of an empty sequence")
        return reduction(self, np.argmax, "argmax", x, axis, keepdims, single_axis=True)

    def argmin(self, x: Array, /, *, axis: int | None = None, keepdims: bool = False) -> Array:
        """Indices of the minima along ``axis`` (of the flattened array if None)."""
        check_identity(x, axis, "attempt to get argmin of an empty sequence")
        return reduction(self, np.argmin, "argmin", x, axis, keepdims, single_axis=True)

    def count_nonzero(self, x: Array, /, *, axis: Any = None, keepdims: bool = False) -> Array:
        """The number of non-zero elements along ``axis``."""
        return reduction(self, np.count_nonzero, "count_nonzero", x, axis, keepdims)

    def nonzero(self, x: Array, /) -> tuple[Array, ...]:
        """The indices of the non-zero elements, one array per dimension (their length
        depends on the data: None until the value is known)."""
        if x.ndim == 0:
            raise ValueError("nonzero of a 0-d array is not allowed")
        device = check_same(self, [x])
        n = 0 if 0 in known_shape(x) else None  # no element: no index, a size known now
        outs = tuple(((n,), np.dtype(np.int64)) for _ in range(x.ndim))
        fn = _nonzero if x.ndim > 1 else np.flatnonzero
        return push(self, fn, (x,), outs, device, "nonzero", _meta.prod(known_shape(x)))

    def searchsorted(
        self, x1: Array, x2: Array, /, *, side: str = "left", sorter: Array | None = None
    ) -> Array:
        """Where the elements of ``x2`` would be inserted into the sorted 1-D ``x1``."""
        arrays = [x1, x2] + ([sorter] if sorter is not None else [])
        x2 = operand(self, x2)  # type: ignore[assignment]
        device = check_same(self, [a for a in arrays if isinstance(a, Array)])
        if x1.ndim != 1:
            raise ValueError("searchsorted: x1 must be 1-D")
        if side not in ("left", "right"):
            raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
        fn = partial(_searchsorted, side)
        args = (x1, x2, *([sorter] if sorter is not None else []))
        return push1(self, fn, args, x2.shape, np.dtype(np.int64), device, "searchsorted")

    def where(self, condition: Array, x1: Any, x2: Any, /) -> Array:
        """Elements of ``x1`` where ``condition`` is true, of ``x2`` elsewhere."""
        if not isinstance(condition, Array) or condition.dtype.kind != "b":
            raise TypeError("where: condition must be a boolean array")
        return elementwise(self, np.where, "where", (condition, x1, x2))

    def argsort(
        self, x: Array, /, *, axis: int = -1, descending: bool = False, stable: bool = True
    ) -> Array:
        """The indices that sort ``x`` along ``axis``."""
        ax = axis_index(axis, x.ndim) if x.ndim else axis_index(axis, 1)
        fn = partial(_sort, descending, stable, ax, True)
        return push1(
            self, fn, (x,), known_shape(x), np.dtype(np.int64), check_same(self, [x]), "argsort"
        )

    def sort(
        self, x: Array, /, *, axis: int = -1, descending: bool = False, stable: bool = True
    ) -> Array:
        """``x`` sorted along ``axis``."""
        ax = axis_index(axis, x.ndim) if x.ndim else axis_index(axis, 1)
        fn = partial(_sort, descending, stable, ax, False)
        return push1(self, fn, (x,), known_shape(x), x.dtype, check_same(self, [x]), "sort")

    def _unique(
        self, x: Array, kind: str, outs: tuple[tuple[Shape, np.dtype[Any]], ...]
    ) -> tuple[Array, ...]:
        device = check_same(self, [x])
        # As many unique elements as elements when there are at most one: a size known now.
        shape = known_shape(x)
        size = None if None in shape else _meta.prod(shape)
        if size is not None and size <= 1:
            outs = tuple(((size,), dtype) if s == (None,) else (s, dtype) for s, dtype in outs)
        return push(
            self,
            partial(_unique, kind),
            (x,),
            outs,
            device,
            f"unique_{kind}",
            _meta.prod(known_shape(x)),
        )

    def unique_values(self, x: Array, /) -> Array:
        """The unique elements of ``x``, sorted (their number depends on the data)."""
        return self._unique(x, "values", (((None,), x.dtype),))[0]

    def unique_counts(self, x: Array, /) -> UniqueCountsResult:
        """The unique elements of ``x`` and how often each occurs."""
        i64 = np.dtype(np.int64)
        return UniqueCountsResult(*self._unique(x, "counts", (((None,), x.dtype), ((None,), i64))))

    def unique_inverse(self, x: Array, /) -> UniqueInverseResult:
        """The unique elements of ``x`` and, for each element of ``x``, its index among them."""
        i64 = np.dtype(np.int64)
        return UniqueInverseResult(
            *self._unique(x, "inverse", (((None,), x.dtype), (known_shape(x), i64)))
        )

    def unique_all(self, x: Array, /) -> UniqueAllResult:
        """The unique elements, their first indices, the inverse indices and the counts."""
        i64 = np.dtype(np.int64)
        outs = (((None,), x.dtype), ((None,), i64), (known_shape(x), i64), ((None,), i64))
        return UniqueAllResult(*self._unique(x, "all", outs))


def _sort(descending: bool, stable: bool, axis: int, arg: bool, value: Any) -> Any:
    kind: Any = "stable" if stable else None
    if not descending:
        return (
            np.argsort(value, axis=axis, kind=kind) if arg else np.sort(value, axis=axis, kind=kind)
        )
    if not arg:
        return np.flip(np.sort(value, axis=axis, kind=kind), axis=axis)
    # Stable descending: sort the reversed array stably, then map the indices back.
    n = value.shape[axis]
    idx = np.argsort(np.flip(value, axis=axis), axis=axis, kind=kind)
    return np.flip(n - 1 - idx, axis=axis)


def _nonzero(value: Any) -> Any:
    return tuple(np.nonzero(value))


def _unique(kind: str, value: Any) -> Any:
    if kind == "values":
        # Sorted, as unique_counts' values are (NumPy's unique_values stopped sorting in 2.3;
        # libraries written against the standard, scikit-learn's, rely on the order).
        return np.unique(value, equal_nan=False)
    result = getattr(np, f"unique_{kind}")(value)
    return tuple(result) if kind != "values" else result


def _searchsorted(side: str, x1: Any, x2: Any, sorter: Any = None) -> Any:
    return np.searchsorted(x1, x2, side=side, sorter=sorter)  # type: ignore[call-overload]
