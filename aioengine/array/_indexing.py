"""Indexing: ``x[key]``, ``x[key] = v``, ``take``, ``take_along_axis``.

A key of integers, slices, ``...`` and ``None`` makes a view that shares the buffer and its Var
(NumPy computes its shape on a zero-memory layout dummy, so an index out of range raises at the
call); integer or boolean arrays in the key make a copy operation that reads them too (a boolean
mask's result has an unknown first dimension until computed). An assignment is a write on the
buffer's Var: of a chunked buffer, on the Vars of the chunks the view written touches (all of
them for an integer or boolean array key), as ``_buffer.py`` says.
"""

from __future__ import annotations

import operator
from functools import partial
from typing import Any

import numpy as np

from . import _meta
from ._array import (
    Array,
    buffer_of,
    check_writable,
    concrete_shape,
    known_shape,
    layout_of,
    ready_value,
    view,
)
from ._meta import Shape, axis_index, broadcast, flat_span
from ._push import (
    CPU,
    INLINE_COST,
    Pusher,
    call_with,
    check_same,
    operand,
    push,
    push1,
    size_of,
)

__all__ = ("Indexing",)


class Indexing(Pusher):
    """Indexing and the standard's indexing functions
    (a mixin of :class:`~aioengine.array.Namespace`)."""

    def _key(self, x: Array, key: Any) -> tuple[tuple[Any, ...], list[int], list[Array]]:
        """``key`` as a tuple; the positions and arrays of its array components."""
        if not isinstance(key, tuple):
            key = (key,)
        parts: list[Any] = []
        positions: list[int] = []
        arrays: list[Array] = []
        for i, k in enumerate(key):
            if isinstance(k, Array):
                positions.append(i)
                arrays.append(k)
                parts.append(k)
            elif isinstance(k, np.ndarray):
                arr = self.asarray(k)
                positions.append(i)
                arrays.append(arr)
                parts.append(arr)
            elif k is None or k is Ellipsis or isinstance(k, slice | bool | np.bool_):
                parts.append(k)
            else:
                try:
                    parts.append(operator.index(k))
                except TypeError:
                    raise IndexError(
                        f"only integers, slices, ..., None and integer or boolean arrays are "
                        f"valid indices, got {k!r}"
                    ) from None
        return tuple(parts), positions, arrays

    def _getitem(self, x: Array, key: Any) -> Array:
        parts, positions, arrays = self._key(x, key)
        if not arrays:
            if Ellipsis not in parts:
                parts = (*parts, Ellipsis)  # x[i, j] as a 0-d view, not a copied scalar
            lay = layout_of(self, x)[parts]
            return view(self, x, partial(_index_step, parts), lay)
        device = check_same(self, [x, *arrays])
        if len(arrays) == 1 and arrays[0].dtype.kind == "b":
            mask = arrays[0]
            if len(parts) != 1:
                raise IndexError("a boolean array index must be the only index")
            mshape, xshape = known_shape(mask), known_shape(x)
            if len(mshape) > len(xshape) or any(
                m is not None and d is not None and m != d
                for m, d in zip(mshape, xshape, strict=False)
            ):
                raise IndexError(
                    f"boolean index of shape {mshape} does not match the array's shape {xshape}"
                )
            # The number of true elements: known now for a mask without elements, and for a
            # small mask whose value is ready, which the operation then takes as it is now
            # (what a read pushed now would see) instead of reading its Buffer.
            count = 0 if 0 in mshape else None
            known = None
            if (
                count is None
                and device.device_type is CPU
                and None not in mshape
                and _meta.prod(mshape) <= INLINE_COST
            ):
                known = ready_value(mask)
            if isinstance(known, np.ndarray):
                count = int(np.count_nonzero(known))
                parts, positions, arrays = (known,), [], []
            shape: Shape = (count, *xshape[len(mshape) :])
            # The result has at most the input's elements, a number not known yet.
            cost = size_of(x)
        else:
            for a in arrays:
                if a.dtype.kind not in "iu":
                    raise IndexError(
                        "arrays used as indices must be of integer (or boolean) type, "
                        f"not {a.dtype}"
                    )
            dummy = np.broadcast_to(np.zeros((), np.int8), concrete_shape(self, x, "indexing"))
            probe = list(parts)
            for pos, a in zip(positions, arrays, strict=True):
                probe[pos] = np.broadcast_to(
                    np.zeros((), np.intp), concrete_shape(self, a, "indexing")
                )
            shape = dummy[tuple(probe)].shape
            cost = max(_meta.prod(shape), 1)
        fn = partial(_take_key, parts, tuple(positions))
        return push1(self, fn, (x, *arrays), shape, x.dtype, device, "getitem", cost)

    def _setitem(self, x: Array, key: Any, value: Any) -> None:
        parts, positions, arrays = self._key(x, key)
        src = operand(self, value)
        device = check_same(self, [x, *arrays, *([src] if isinstance(src, Array) else [])])
        check_writable(self, x)
        if isinstance(src, Array):
            vdtype = src.dtype
            if np.result_type(x.dtype, vdtype) != x.dtype:
                raise TypeError(
                    f"cannot assign an array of dtype {vdtype} into an array of dtype {x.dtype}"
                )
        else:
            v = src.value
            kind = x.dtype.kind
            if (
                (type(v) is float and kind in "biu")
                or (type(v) is complex and kind != "c")
                or (type(v) is int and kind == "b")
            ):
                raise TypeError(
                    f"cannot assign a Python {type(v).__name__} into an array of dtype {x.dtype}"
                )
            if type(v) is int and kind in "iu":
                info = np.iinfo(x.dtype)
                if not info.min <= v <= info.max:
                    raise OverflowError(f"Python integer {v} out of bounds for {x.dtype}")
        region = None
        cost = max(_meta.prod(known_shape(x)), 1)
        if not arrays:
            # A 0-d view, never a scalar read from the layout (whose memory is one element:
            # reading x[i]'s would read past it, and may fault).
            whole = parts if Ellipsis in parts else (*parts, Ellipsis)
            lay = layout_of(self, x)[whole]
            target_shape = lay.shape
            broadcast(target_shape, src.shape)  # ValueError if it cannot broadcast
            if len(broadcast(target_shape, src.shape)) > len(target_shape):
                raise ValueError(f"cannot broadcast a value of shape {src.shape} to {target_shape}")
            # It costs the view's elements, and writes the chunks of that view only.
            cost = max(lay.size, size_of(src) if isinstance(src, Array) else 1)
            if len(buffer_of(x).vars) > 1:
                region = flat_span(lay)
        fn = partial(_assign, parts, tuple(positions))
        push(self, fn, (x, src, *arrays), (), device, "setitem", cost, target=x, region=region)

    def take(self, x: Array, indices: Array, /, *, axis: int | None = None) -> Array:
        """Elements of ``x`` at integer ``indices`` along ``axis`` (optional for 1-D ``x``)."""
        device = check_same(self, [x, indices])
        if indices.dtype.kind not in "iu" or indices.ndim != 1:
            raise IndexError("take: indices must be a 1-D integer array")
        if axis is None:
            if x.ndim != 1:
                raise ValueError("take: axis is required for an array of more than one dimension")
            axis = 0
        ax = axis_index(axis, x.ndim)
        xshape = known_shape(x)
        shape = (*xshape[:ax], *known_shape(indices), *xshape[ax + 1 :])
        return push1(
            self,
            partial(call_with, np.take, {"axis": ax}),
            (x, indices),
            shape,
            x.dtype,
            device,
            "take",
        )

    def take_along_axis(self, x: Array, indices: Array, /, *, axis: int = -1) -> Array:
        """Elements of ``x`` at ``indices`` along ``axis``, matched position by position."""
        device = check_same(self, [x, indices])
        if indices.dtype.kind not in "iu":
            raise IndexError("take_along_axis: indices must be an integer array")
        if x.ndim != indices.ndim:
            raise ValueError(
                "take_along_axis: x and indices must have the same number of dimensions"
            )
        ax = axis_index(axis, x.ndim)
        ishape = known_shape(indices)
        xs = tuple(d for i, d in enumerate(known_shape(x)) if i != ax)
        js = tuple(d for i, d in enumerate(ishape) if i != ax)
        b = list(broadcast(xs, js))
        b.insert(ax, ishape[ax])
        return push1(
            self,
            partial(call_with, np.take_along_axis, {"axis": ax}),
            (x, indices),
            tuple(b),
            x.dtype,
            device,
            "take_along_axis",
        )


def _index_step(key: tuple[Any, ...], value: Any) -> Any:
    return value[key]


def _assign(
    key: tuple[Any, ...], positions: tuple[int, ...], target: Any, value: Any, *idx: Any
) -> None:
    if positions:
        parts = list(key)
        for pos, index in zip(positions, idx, strict=True):
            parts[pos] = index
        key = tuple(parts)
    target[key] = value


def _take_key(key: tuple[Any, ...], positions: tuple[int, ...], value: Any, *idx: Any) -> Any:
    parts = list(key)
    for pos, index in zip(positions, idx, strict=True):
        parts[pos] = index
    return value[tuple(parts)]
