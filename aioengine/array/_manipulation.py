"""Manipulation functions of the namespace: ``reshape``, ``permute_dims``, ``concat``, ...

Those NumPy can do as views (``reshape`` of contiguous data, ``permute_dims``, ``expand_dims``,
``squeeze``, ``flip``, ``moveaxis``, ``broadcast_to``, ``unstack``) share the buffer and its Var:
a write through one shows in the base and every other view. The rest are copy operations.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from . import _meta
from ._array import Array, concrete_shape, known_shape, layout_of, view
from ._indexing import Indexing
from ._meta import Shape, axis_index, broadcast
from ._push import call_with, check_same, push1, same_shape

__all__ = ("Manipulation", "transpose_step")


class Manipulation(Indexing):
    """The standard's manipulation functions
    (a mixin of :class:`~aioengine.array.Namespace`)."""

    def reshape(self, x: Array, /, shape: Any, *, copy: bool | None = None) -> Array:
        """``x`` with a new shape: a view of contiguous data (unless ``copy=True``), a copy
        otherwise (ValueError with ``copy=False``)."""
        shape = tuple(operator.index(d) for d in shape)
        lay = layout_of(self, x)
        try:
            new = lay.reshape(shape, copy=False)
        except ValueError as exc:
            if "copy" not in str(exc):
                raise
            if copy is False:
                raise ValueError(
                    "reshape: the data is not contiguous: a view is not possible (copy=False)"
                ) from None
            new = None
        if copy or new is None:
            target = np.reshape(np.broadcast_to(np.zeros((), np.int8), lay.shape), shape).shape
            return push1(
                self, partial(_reshape_copy, target), (x,), target, x.dtype, x.device, "reshape"
            )
        return view(self, x, partial(_reshape_step, new.shape), new)

    def permute_dims(self, x: Array, /, axes: tuple[int, ...]) -> Array:
        """``x`` with its axes permuted (a view)."""
        lay = layout_of(self, x)
        axes = tuple(axes)
        if len(axes) != x.ndim:
            raise ValueError(
                f"permute_dims: axes {axes} do not match an array of {x.ndim} dimensions"
            )
        new = lay.transpose(axes)
        return view(
            self, x, partial(transpose_step, tuple(axis_index(a, x.ndim) for a in axes)), new
        )

    def matrix_transpose(self, x: Array, /) -> Array:
        """The transpose of the last two axes (a view)."""
        if x.ndim < 2:
            raise ValueError("matrix_transpose needs an array of at least two dimensions")
        axes = (*range(x.ndim - 2), x.ndim - 1, x.ndim - 2)
        return self.permute_dims(x, axes)

    def expand_dims(self, x: Array, /, axis: int = 0) -> Array:
        """``x`` with a new axis of size one at ``axis`` (a view). ``axis`` may be passed by
        position or by keyword, as revision 2024.12 (corrected) has it; it keeps the default
        of 0 that earlier revisions gave it."""
        ax = axis_index(axis, x.ndim + 1)
        key = (slice(None),) * ax + (None, Ellipsis)
        return self._getitem(x, key)

    def squeeze(self, x: Array, /, axis: int | tuple[int, ...]) -> Array:
        """``x`` without the size-one axes ``axis`` (a view)."""
        lay = layout_of(self, x)
        new = np.squeeze(lay, axis=axis)
        axes = _meta.reduced(tuple(range(x.ndim)), axis, False)
        return view(self, x, partial(_reshape_step, new.shape), new) if axes is not None else x

    def flip(self, x: Array, /, *, axis: int | tuple[int, ...] | None = None) -> Array:
        """``x`` with the order of elements reversed along ``axis`` (a view)."""
        axes = tuple(range(x.ndim)) if axis is None else _normalize_axes(axis, x.ndim)
        key = tuple(slice(None, None, -1) if i in axes else slice(None) for i in range(x.ndim))
        return self._getitem(x, key)

    def moveaxis(self, x: Array, source: Any, destination: Any, /) -> Array:
        """``x`` with axes moved to new positions (a view)."""
        lay = layout_of(self, x)
        new = np.moveaxis(lay, source, destination)
        src = _normalize_axes(source, x.ndim)
        dst = _normalize_axes(destination, x.ndim)
        order = [n for n in range(x.ndim) if n not in src]
        for d, s in sorted(zip(dst, src, strict=True)):
            order.insert(d, s)
        return view(self, x, partial(transpose_step, tuple(order)), new)

    def broadcast_to(self, x: Array, /, shape: Any) -> Array:
        """``x`` broadcast to ``shape`` (a read-only view)."""
        shape = self._shape_arg(shape)
        lay = np.broadcast_to(layout_of(self, x), shape)
        return view(self, x, partial(_broadcast_step, shape), lay)

    def broadcast_arrays(self, *arrays: Array) -> list[Array]:
        """The arrays broadcast against each other (read-only views)."""
        check_same(self, arrays)
        shape = broadcast(*(tuple(concrete_shape(self, a, "broadcast_arrays")) for a in arrays))
        return [self.broadcast_to(a, shape) for a in arrays]

    def concat(self, arrays: Sequence[Array], /, *, axis: int | None = 0) -> Array:
        """The arrays joined along an existing ``axis`` (flattened first if None)."""
        arrays = tuple(arrays)
        if not arrays:
            raise ValueError("need at least one array to concatenate")
        device = check_same(self, arrays)
        dtype = self.result_type(*arrays)
        shapes = [concrete_shape(self, a, "concat") for a in arrays]
        if axis is None:
            shape: tuple[int, ...] = (sum(math.prod(s) for s in shapes),)
        else:
            ndim = len(shapes[0])
            if ndim == 0:
                raise ValueError("zero-dimensional arrays cannot be concatenated")
            ax = axis_index(axis, ndim)
            for s in shapes:
                if len(s) != ndim or any(
                    d != e for i, (d, e) in enumerate(zip(s, shapes[0], strict=True)) if i != ax
                ):
                    raise ValueError(
                        "all the input array dimensions except for the concatenation axis must "
                        f"match exactly, got shapes {shapes}"
                    )
            shape = (*shapes[0][:ax], sum(s[ax] for s in shapes), *shapes[0][ax + 1 :])
        fn = partial(_concat, axis, dtype)
        return push1(self, fn, arrays, shape, dtype, device, "concat")

    def stack(self, arrays: Sequence[Array], /, *, axis: int = 0) -> Array:
        """The arrays joined along a new ``axis``."""
        arrays = tuple(arrays)
        if not arrays:
            raise ValueError("need at least one array to stack")
        device = check_same(self, arrays)
        dtype = self.result_type(*arrays)
        shapes = {concrete_shape(self, a, "stack") for a in arrays}
        if len(shapes) != 1:
            raise ValueError(f"all input arrays must have the same shape, got {sorted(shapes)}")
        (s,) = shapes
        ax = axis_index(axis, len(s) + 1)
        shape = (*s[:ax], len(arrays), *s[ax:])
        return push1(self, partial(_stack, ax, dtype), arrays, shape, dtype, device, "stack")

    def unstack(self, x: Array, /, *, axis: int = 0) -> tuple[Array, ...]:
        """The slices of ``x`` along ``axis`` (views)."""
        if x.ndim == 0:
            raise ValueError("unstack needs an array of at least one dimension")
        ax = axis_index(axis, x.ndim)
        n = concrete_shape(self, x, "unstack")[ax]
        return tuple(self._getitem(x, (slice(None),) * ax + (i,)) for i in range(n))

    def roll(
        self,
        x: Array,
        /,
        shift: int | tuple[int, ...],
        *,
        axis: int | tuple[int, ...] | None = None,
    ) -> Array:
        """``x`` with elements shifted cyclically along ``axis`` (all, flattened, if None)."""
        if axis is not None:
            np.roll(np.zeros((1,) * x.ndim), shift, axis=axis)  # bad axes and shifts raise here
        return same_shape(self, np.roll, "roll", x, shift=shift, axis=axis)

    def repeat(self, x: Array, repeats: int | Array, /, *, axis: int | None = None) -> Array:
        """Each element of ``x`` repeated ``repeats`` times along ``axis`` (flattened if
        None); with an array of repeats the length depends on its data."""
        device = check_same(self, [x, *([repeats] if isinstance(repeats, Array) else [])])
        shape = concrete_shape(self, x, "repeat")
        base: Shape = (math.prod(shape),) if axis is None else shape
        ax = 0 if axis is None else axis_index(axis, x.ndim)
        if isinstance(repeats, Array):
            if repeats.dtype.kind not in "iu":
                raise TypeError("repeat: repeats must be an integer array")
            n: int | None = 0 if base[ax] == 0 else None  # nothing to repeat: known now
            args: tuple[Any, ...] = (x, repeats)
            fn: Callable[..., Any] = partial(call_with, np.repeat, {"axis": axis})
        else:
            r = operator.index(repeats)
            if r < 0:
                raise ValueError("repeat: repeats may not be negative")
            n = base[ax] * r  # type: ignore[operator]
            args = (x,)
            fn = partial(call_with, np.repeat, {"repeats": r, "axis": axis})
        out = (*base[:ax], n, *base[ax + 1 :])
        return push1(self, fn, args, out, x.dtype, device, "repeat", cost=_meta.prod(base) * 2)

    def tile(self, x: Array, repetitions: tuple[int, ...], /) -> Array:
        """``x`` repeated ``repetitions`` times along each axis."""
        reps = tuple(operator.index(r) for r in repetitions)
        shape = np.tile(
            np.broadcast_to(np.zeros((), np.int8), concrete_shape(self, x, "tile")),
            tuple(min(r, 1) for r in reps),
        ).shape
        ndim = max(len(shape), len(reps))
        reps_full = (1,) * (ndim - len(reps)) + reps
        base = (1,) * (ndim - x.ndim) + tuple(known_shape(x))
        out = tuple(int(b) * r for b, r in zip(base, reps_full, strict=True))  # type: ignore[arg-type]
        return push1(
            self, partial(call_with, np.tile, {"reps": reps}), (x,), out, x.dtype, x.device, "tile"
        )


def _reshape_step(shape: tuple[int, ...], value: Any) -> Any:
    return value.reshape(shape)


def transpose_step(axes: tuple[int, ...], value: Any) -> Any:
    """A view's step that permutes its axes (``permute_dims``, ``matrix_transpose``): a
    product recognises a transposed operand by it (``_products.py``)."""
    return value.transpose(axes)


def _broadcast_step(shape: tuple[int, ...], value: Any) -> Any:
    return np.broadcast_to(value, shape)


def _reshape_copy(shape: tuple[int, ...], value: Any) -> Any:
    return np.reshape(value, shape).copy()


def _concat(axis: int | None, dtype: np.dtype[Any], *values: Any) -> Any:
    return np.concatenate(values, axis=axis, dtype=dtype)


def _stack(axis: int, dtype: np.dtype[Any], *values: Any) -> Any:
    return np.stack(values, axis=axis, dtype=dtype)


def _normalize_axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if isinstance(axis, int | np.integer):
        axis = (axis,)
    return tuple(axis_index(a, ndim) for a in axis)
