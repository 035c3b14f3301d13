"""Creation functions of the namespace: ``asarray``, ``zeros``, ``arange``, ``eye``, ...

A small CPU array (at most ``INLINE_COST`` elements) is computed on the caller's thread, with
no push; a larger one, or one on a GPU, is allocated by an operation of its own, in parallel
with the rest (``_push.create``, which the ``fft`` extension's ``fftfreq`` uses too).
``asarray`` of a NumPy array shares its memory unless a copy is asked for.
"""

from __future__ import annotations

import math
import operator
from functools import partial
from typing import Any

import numpy as np

from .. import Context
from . import _meta
from ._array import SCALARS, Array, buffer_of, concrete_shape, known_shape, namespace_of
from ._meta import as_dtype
from ._push import CPU0, Pusher, check_same, copy_value, create, push, push1, same_shape

__all__ = ("Creation",)


class Creation(Pusher):
    """The standard's creation functions
    (a mixin of :class:`~aioengine.array.Namespace`)."""

    def asarray(
        self,
        obj: Any,
        /,
        *,
        dtype: Any = None,
        device: Context | None = None,
        copy: bool | None = None,
    ) -> Array:
        """An array from ``obj`` (an array, a NumPy array, a scalar, nested sequences, or an
        object with ``__array__``/``__dlpack__``). ``copy=None`` shares a NumPy array's memory
        where possible (as NumPy does), ``True`` always copies, ``False`` never does
        (ValueError if it must). Shared read-only memory (what ``await`` gives) is copied by
        the first in-place write, so the array is writable all the same. An array of this
        namespace with a new dtype or device is a copy operation."""
        if dtype is not None:
            dtype = as_dtype(dtype)
        if isinstance(obj, Array):
            check_same(self, [obj])
            out = obj
            if dtype is not None and dtype != obj.dtype:
                if copy is False:
                    raise ValueError("asarray: a dtype change needs a copy (copy=False)")
                out = self.astype(obj, dtype)
            elif copy:
                out = push1(
                    self, copy_value, (obj,), known_shape(obj), obj.dtype, obj.device, "copy"
                )
            if device is not None and device != out.device:
                if copy is False:
                    raise ValueError("asarray: a device change needs a copy (copy=False)")
                out = out.to_device(device)
            return out
        if copy is False:
            value = np.asarray(obj, dtype=dtype, copy=False)
        elif copy:
            value = np.array(obj, dtype=dtype, copy=True)
        else:
            value = np.asarray(obj, dtype=dtype)
        if value.dtype.kind not in "biufc":
            _check_int_range(value)
            raise TypeError(f"asarray: unsupported dtype {value.dtype} (from {type(obj).__name__})")
        if not value.flags.c_contiguous:
            if copy is False:
                raise ValueError("asarray: a non-C-contiguous array cannot be shared (copy=False)")
            value = np.ascontiguousarray(value)
        if type(value) is not np.ndarray:
            value = value.view(np.ndarray)
        array = self._from_value(value)
        if not value.flags.writeable:
            # Read-only memory (a value ``await`` gave, say): shared, and copied by the first
            # write, inside it (as after ``await``), so writes are accepted and done.
            buffer_of(array).exported = True
        if device is not None and device != CPU0:
            return array.to_device(device)
        return array

    def _dtype_or(self, dtype: Any, default: np.dtype[Any]) -> np.dtype[Any]:
        return default if dtype is None else as_dtype(dtype)

    def zeros(self, shape: Any, *, dtype: Any = None, device: Context | None = None) -> Array:
        """An array of zeros."""
        shape = self._shape_arg(shape)
        dtype = self._dtype_or(dtype, np.dtype(np.float64))
        return create(self, np.zeros, (shape,), {"dtype": dtype}, shape, dtype, device, "zeros")

    def ones(self, shape: Any, *, dtype: Any = None, device: Context | None = None) -> Array:
        """An array of ones."""
        shape = self._shape_arg(shape)
        dtype = self._dtype_or(dtype, np.dtype(np.float64))
        return create(self, np.ones, (shape,), {"dtype": dtype}, shape, dtype, device, "ones")

    def empty(self, shape: Any, *, dtype: Any = None, device: Context | None = None) -> Array:
        """An array whose values are unspecified (allocated, not filled)."""
        shape = self._shape_arg(shape)
        dtype = self._dtype_or(dtype, np.dtype(np.float64))
        return create(self, np.empty, (shape,), {"dtype": dtype}, shape, dtype, device, "empty")

    def full(
        self, shape: Any, fill_value: Any, *, dtype: Any = None, device: Context | None = None
    ) -> Array:
        """An array filled with ``fill_value``."""
        shape = self._shape_arg(shape)
        if isinstance(fill_value, Array):
            fill_value = fill_value.item()
        if type(fill_value) not in SCALARS and not isinstance(fill_value, np.generic):
            raise TypeError(f"fill_value must be a scalar, got {type(fill_value).__name__}")
        if dtype is None:
            dtype = np.asarray(fill_value).dtype
        else:
            dtype = as_dtype(dtype)
            _meta.sample_dtype(np.full, [], shape=(1,), fill_value=fill_value, dtype=dtype)
        return create(
            self, np.full, (shape, fill_value), {"dtype": dtype}, shape, dtype, device, "full"
        )

    def _like(
        self, x: Array, dtype: Any, device: Context | None
    ) -> tuple[tuple[int, ...], np.dtype[Any], Context]:
        if not isinstance(x, Array):
            raise TypeError(f"expected an array, got {type(x).__name__}")
        return (
            concrete_shape(self, x, "*_like"),
            x.dtype if dtype is None else as_dtype(dtype),
            x.device if device is None else device,
        )

    def zeros_like(self, x: Array, /, *, dtype: Any = None, device: Context | None = None) -> Array:
        """Zeros with ``x``'s shape (and dtype and device unless given)."""
        shape, dtype, device = self._like(x, dtype, device)
        return self.zeros(shape, dtype=dtype, device=device)

    def ones_like(self, x: Array, /, *, dtype: Any = None, device: Context | None = None) -> Array:
        """Ones with ``x``'s shape (and dtype and device unless given)."""
        shape, dtype, device = self._like(x, dtype, device)
        return self.ones(shape, dtype=dtype, device=device)

    def empty_like(self, x: Array, /, *, dtype: Any = None, device: Context | None = None) -> Array:
        """An unfilled array with ``x``'s shape (and dtype and device unless given)."""
        shape, dtype, device = self._like(x, dtype, device)
        return self.empty(shape, dtype=dtype, device=device)

    def full_like(
        self, x: Array, /, fill_value: Any, *, dtype: Any = None, device: Context | None = None
    ) -> Array:
        """``fill_value`` with ``x``'s shape (and dtype and device unless given)."""
        shape, dtype, device = self._like(x, dtype, device)
        return self.full(shape, fill_value, dtype=dtype, device=device)

    def arange(
        self,
        start: int | float,
        /,
        stop: int | float | None = None,
        step: int | float = 1,
        *,
        dtype: Any = None,
        device: Context | None = None,
    ) -> Array:
        """Evenly spaced values in ``[start, stop)``."""
        if stop is None:
            start, stop = 0, start
        for v in (start, stop, step):
            if type(v) not in (int, float) and not isinstance(v, np.generic):
                raise TypeError(f"arange: expected int or float arguments, got {v!r}")
        if step == 0:
            raise ValueError("arange: step must not be zero")
        n = max(0, math.ceil((stop - start) / step))
        if dtype is None:
            floating = any(isinstance(v, float | np.floating) for v in (start, stop, step))
            dtype = np.dtype(np.float64 if floating else np.int64)
        else:
            dtype = as_dtype(dtype)
        return create(
            self, np.arange, (start, stop, step), {"dtype": dtype}, (n,), dtype, device, "arange"
        )

    def linspace(
        self,
        start: int | float | complex,
        stop: int | float | complex,
        /,
        num: int,
        *,
        dtype: Any = None,
        device: Context | None = None,
        endpoint: bool = True,
    ) -> Array:
        """``num`` evenly spaced values from ``start`` to ``stop``."""
        num = operator.index(num)
        if num < 0:
            raise ValueError(f"linspace: num must be non-negative, got {num}")
        if dtype is None:
            kind = complex in (type(start), type(stop))
            dtype = np.dtype(np.complex128 if kind else np.float64)
        else:
            dtype = as_dtype(dtype)
        return create(
            self,
            np.linspace,
            (start, stop, num),
            {"dtype": dtype, "endpoint": endpoint},
            (num,),
            dtype,
            device,
            "linspace",
        )

    def eye(
        self,
        n_rows: int,
        n_cols: int | None = None,
        /,
        *,
        k: int = 0,
        dtype: Any = None,
        device: Context | None = None,
    ) -> Array:
        """A 2-D array with ones on the ``k``-th diagonal."""
        n_cols = n_rows if n_cols is None else n_cols
        shape = self._shape_arg((n_rows, n_cols))
        dtype = self._dtype_or(dtype, np.dtype(np.float64))
        return create(self, np.eye, shape, {"k": k, "dtype": dtype}, shape, dtype, device, "eye")

    def from_dlpack(
        self, x: Any, /, *, device: Context | None = None, copy: bool | None = None
    ) -> Array:
        """An array from any object that implements DLPack (a sync point for an Array of
        another engine)."""
        if isinstance(x, Array) and namespace_of(x) is self:
            return self.asarray(x, device=device, copy=copy)
        return self.asarray(np.from_dlpack(x), device=device, copy=copy)

    def tril(self, x: Array, /, *, k: int = 0) -> Array:
        """The lower triangle of the last two axes (zeros above the ``k``-th diagonal)."""
        return same_shape(self, np.tril, "tril", x, min_ndim=2, k=k)

    def triu(self, x: Array, /, *, k: int = 0) -> Array:
        """The upper triangle of the last two axes (zeros below the ``k``-th diagonal)."""
        return same_shape(self, np.triu, "triu", x, min_ndim=2, k=k)

    def meshgrid(self, *arrays: Array, indexing: str = "xy") -> list[Array]:
        """Coordinate matrices from 1-D coordinate arrays."""
        if indexing not in ("xy", "ij"):
            raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
        if not arrays:
            return []
        device = check_same(self, arrays)
        dtype = self.result_type(*arrays)
        sizes = []
        for a in arrays:
            if a.ndim != 1:
                raise ValueError("meshgrid: every array must be 1-D")
            sizes.append(concrete_shape(self, a, "meshgrid")[0])
        shape = list(sizes)
        if indexing == "xy" and len(shape) > 1:
            shape[0], shape[1] = shape[1], shape[0]
        outs = tuple((tuple(shape), dtype) for _ in arrays)
        fn = partial(_meshgrid, indexing, dtype)
        return list(
            push(self, fn, arrays, outs, device, "meshgrid", math.prod(shape) * len(arrays))
        )


def _meshgrid(indexing: str, dtype: np.dtype[Any], *values: Any) -> Any:
    grids: Any = np.meshgrid(*values, indexing=indexing)  # type: ignore[call-overload]
    return tuple(np.ascontiguousarray(v, dtype=dtype) for v in grids)


def _check_int_range(value: np.ndarray[Any, Any]) -> None:
    """OverflowError, as NumPy 2 raises for an integer dtype, if ``value`` (an object array
    NumPy made) holds a Python int that no integer dtype of the namespace holds."""
    if value.dtype != object:
        return
    for v in value.ravel():
        if type(v) is int and not -(2**63) <= v < 2**64:
            raise OverflowError(
                f"asarray: Python int {v} is out of the integer dtypes' range (int64: "
                "[-2**63, 2**63 - 1], uint64: [0, 2**64 - 1])"
            )
