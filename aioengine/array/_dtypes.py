"""Data type functions of the namespace: ``astype``, ``can_cast``, ``finfo``, ``iinfo``,
``isdtype``, ``result_type``. The dtypes themselves are NumPy's
(``xp.float64 == np.dtype('float64')``), and so is type promotion (NEP 50), which follows the
standard's table.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import numpy as np

from .. import Context
from ._array import SCALARS, Array, known_shape
from ._meta import as_dtype
from ._push import Pusher, check_same, push1

__all__ = ("DataTypes", "FInfo", "IInfo")

# The standard's kinds for can_cast: no cast crosses them (bool, integers, floating point).
_KIND_GROUPS = {"b": 0, "i": 1, "u": 1, "f": 2, "c": 2}


class FInfo(NamedTuple):
    """What :meth:`DataTypes.finfo` returns: the standard's fields, as Python numbers (for a
    complex dtype, those of its real components, and ``dtype`` the real dtype)."""

    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    dtype: np.dtype[Any]


class IInfo(NamedTuple):
    """What :meth:`DataTypes.iinfo` returns: the standard's fields, as Python ints."""

    bits: int
    max: int
    min: int
    dtype: np.dtype[Any]


class DataTypes(Pusher):
    """The standard's data type functions
    (a mixin of :class:`~aioengine.array.Namespace`)."""

    def astype(
        self, x: Array, dtype: Any, /, *, copy: bool = True, device: Context | None = None
    ) -> Array:
        """``x`` converted to ``dtype`` (a copy operation unless ``copy=False`` and nothing
        changes)."""
        dtype = as_dtype(dtype)
        out = x
        if dtype != x.dtype or copy:
            check_same(self, [x])
            out = push1(
                self, partial(_astype, dtype), (x,), known_shape(x), dtype, x.device, "astype"
            )
        if device is not None and device != out.device:
            out = out.to_device(device)
        return out

    def can_cast(self, from_: Any, to: Any, /) -> bool:
        """Whether ``from_`` (a dtype or an array) can be cast to ``to`` by the promotion rules:
        the standard's, which promote within bool, the integers, and floating point (real to
        complex included), never across them (NumPy's ``can_cast`` casts an int to a float)."""
        if isinstance(from_, Array):
            from_ = from_.dtype
        src, dst = as_dtype(from_), as_dtype(to)
        if _KIND_GROUPS.get(src.kind) != _KIND_GROUPS.get(dst.kind):
            return False
        return bool(np.can_cast(src, dst))

    def finfo(self, type: Any, /) -> FInfo:
        """Machine limits of a floating-point dtype (or array), as Python floats."""
        info = np.finfo(type.dtype if isinstance(type, Array) else as_dtype(type))
        return FInfo(
            int(info.bits),
            float(info.eps),
            float(info.max),
            float(info.min),
            float(info.smallest_normal),
            np.dtype(info.dtype),
        )

    def iinfo(self, type: Any, /) -> IInfo:
        """Machine limits of an integer dtype (or array), as Python ints."""
        info = np.iinfo(type.dtype if isinstance(type, Array) else as_dtype(type))
        return IInfo(int(info.bits), int(info.max), int(info.min), np.dtype(info.dtype))

    def isdtype(self, dtype: Any, kind: Any) -> bool:
        """Whether ``dtype`` is of ``kind`` (``"real floating"``, a dtype, a tuple, ...)."""
        return bool(np.isdtype(as_dtype(dtype), kind))

    def result_type(self, *arrays_and_dtypes: Any) -> np.dtype[Any]:
        """The dtype that type promotion gives for these arrays, dtypes and scalars."""
        if not arrays_and_dtypes:
            raise ValueError("at least one array or dtype is required")
        args = [
            a.dtype if isinstance(a, Array) else a if type(a) in SCALARS else as_dtype(a)
            for a in arrays_and_dtypes
        ]
        if all(type(a) in SCALARS for a in args):
            raise ValueError("result_type needs at least one array or dtype")
        return np.result_type(*args)


def _astype(dtype: np.dtype[Any], value: Any) -> Any:
    return value.astype(dtype, copy=True)
