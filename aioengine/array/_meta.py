"""Push-time metadata: the shape and dtype of an operation's result, on the caller's thread.

Every array operation returns at once with its ``shape`` and ``dtype`` known, so a bad shape,
dtype or axis raises at the line that caused it (MXNet infers on the calling thread too). Three
ways, cheapest first:

* **Broadcasting** (:func:`broadcast`) for elementwise operations, with the standard's unknown
  dimension ``None`` (data-dependent shapes): ``None`` against 1 stays unknown, against ``n`` is
  ``n`` (checked when the operation runs).
* **Sampling** (:func:`sample_dtype`): the result dtype is the dtype NumPy gives when it runs the
  same function, with the same keywords, on one-element arrays of the operands' dtypes (and
  Python scalars as they are, NEP 50's weak scalars). NumPy then raises exactly the errors it
  would raise on the real data (unsupported dtypes, bad axes, integer overflow of a scalar), at
  the call. Results are cached per function, dtypes, scalar types and keywords.
* **Layout dummies** (:func:`layout`) for views: a zero-memory array with the real shape and
  C strides on which NumPy itself computes a view's shape and strides (indexing, reshape,
  transposes), which tells whether the view is still contiguous. Only metadata is ever asked of
  it: it has one element of memory. Its strides and offset also say which elements of the
  base a view can touch (:func:`flat_span`): the chunks a view reads or writes.

Shapes of everything else (reductions, matmul, concatenation, linear algebra, FFTs) are rules
in the functions that need them; :func:`reduced` and :func:`axis_index` are shared.
"""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple
from numpy.lib.stride_tricks import as_strided

__all__ = (
    "Shape",
    "as_dtype",
    "axis_index",
    "broadcast",
    "flat_span",
    "layout",
    "normalize_axes",
    "reduced",
    "sample_dtype",
)

#: A shape: a dimension is an int, or None when it depends on data not computed yet.
Shape = tuple[int | None, ...]


def as_dtype(dtype: object) -> np.dtype[Any]:
    """A dtype argument as a NumPy dtype; ``TypeError`` for anything that is not one."""
    if isinstance(dtype, np.dtype):
        return dtype
    if dtype is None or isinstance(dtype, str | bytes):
        raise TypeError(f"expected a dtype of the namespace (e.g. xp.float64), got {dtype!r}")
    try:
        return np.dtype(dtype)  # type: ignore[call-overload, no-any-return]
    except TypeError:
        raise TypeError(
            f"expected a dtype of the namespace (e.g. xp.float64), got {dtype!r}"
        ) from None


def broadcast(*shapes: Shape) -> Shape:
    """The broadcast shape of ``shapes`` (NumPy's rules and message; ``None`` dimensions
    allowed: against 1 or None they stay None, against ``n`` they are ``n``)."""
    first = shapes[0]
    if all(s == first for s in shapes):
        return first
    if not any(None in s for s in shapes):
        try:
            return np.broadcast_shapes(*shapes)  # type: ignore[arg-type]
        except ValueError:
            raise ValueError(
                "operands could not be broadcast together with shapes "
                + " ".join(str(s) for s in shapes)
            ) from None
    ndim = max(len(s) for s in shapes)
    out: list[int | None] = []
    for i in range(ndim):
        dim: int | None = 1
        for s in shapes:
            j = i - (ndim - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == 1:
                continue
            if d is None:
                if dim == 1:
                    dim = None
            elif dim in (1, None):
                dim = d
            elif dim != d:
                raise ValueError(
                    "operands could not be broadcast together with shapes "
                    + " ".join(str(s) for s in shapes)
                )
        out.append(dim)
    return tuple(out)


# (function, (dtype or scalar type, ...), keywords) -> result dtype(s)
_DTYPES: dict[tuple[Any, ...], Any] = {}


def _sample(operand: Any) -> Any:
    if isinstance(operand, np.dtype):
        return np.ones((), dtype=operand)
    if type(operand) is tuple:  # (dtype, sample shape)
        return np.ones(operand[1], dtype=operand[0])
    return operand


def sample_dtype(fn: Callable[..., Any], operands: Sequence[Any], **kwargs: Any) -> Any:
    """The dtype of ``fn(*operands, **kwargs)`` (a tuple of dtypes if it returns several).

    ``operands`` are NumPy dtypes (standing for 0-d arrays), ``(dtype, shape)`` pairs (for
    functions whose result depends on the number of dimensions) or Python scalars (kept as they are:
    the result may depend on them, e.g. an int out of an unsigned dtype's range raises).
    Whatever NumPy raises for these dtypes and keywords is raised here, at the call.
    """
    key_ops = tuple(op if isinstance(op, np.dtype | tuple) else type(op) for op in operands)
    hashable = True
    try:
        key = (fn, key_ops, tuple(sorted(kwargs.items())) if kwargs else ())
        hash(key)
    except TypeError:
        hashable = False
    # A Python int operand is sampled by value (NumPy raises for one out of an integer
    # dtype's range), so it is never cached.
    if hashable and int not in key_ops:
        try:
            return _DTYPES[key]
        except KeyError:
            pass
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = fn(*map(_sample, operands), **kwargs)
    dtype = _result_dtypes(result)
    if hashable and int not in key_ops:
        _DTYPES[key] = dtype
    return dtype


def _result_dtypes(result: Any) -> Any:
    if isinstance(result, tuple):  # named tuples too: eigh, slogdet, unique_all, ...
        return tuple(_result_dtypes(r) for r in result)
    return np.asarray(result).dtype


def layout(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """A zero-memory stand-in with ``shape``, ``dtype`` and C strides, for view metadata only.

    Never read its elements: it has the memory of one. NumPy's own indexing, reshape and
    transposes on it give a view's shape, strides and contiguity (and their errors).
    """
    strides = []
    step = dtype.itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    base = np.zeros(1, dtype=dtype)
    return as_strided(base, shape, tuple(reversed(strides)))


def flat_span(lay: np.ndarray[Any, Any]) -> tuple[int, int]:
    """The flat (C-order) element offsets ``[first, stop)`` of its base that a view whose layout
    is ``lay`` (derived from a :func:`layout` of the whole base, by NumPy's own view
    operations) can touch: a superset (a view with steps skips elements in between), in one
    pass over its dimensions. An empty view touches nothing: ``first == stop``."""
    root: Any = lay
    while getattr(root, "base", None) is not None:  # down to the layout's one element of memory
        root = root.base
    low = high = lay.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    for n, stride in zip(lay.shape, lay.strides, strict=True):
        if n == 0:
            return 0, 0
        if stride < 0:
            low += (n - 1) * stride
        else:
            high += (n - 1) * stride
    itemsize = lay.itemsize
    return low // itemsize, high // itemsize + 1


def axis_index(axis: object, ndim: int, name: str = "axis") -> int:
    """``axis`` as a non-negative index into ``ndim`` dimensions (AxisError, an IndexError
    and ValueError, if out of range; TypeError if not an int)."""
    try:
        index = operator.index(axis)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, got {axis!r}") from None
    return int(normalize_axis_index(index, ndim))


def normalize_axes(axis: object, ndim: int) -> tuple[int, ...]:
    """``axis`` (an int or a tuple of them) as non-negative indices into ``ndim`` dimensions
    (AxisError if out of range)."""
    if isinstance(axis, list):
        axis = tuple(axis)
    return tuple(normalize_axis_tuple(axis, ndim))  # type: ignore[arg-type]


def reduced(shape: Shape, axis: object, keepdims: bool) -> Shape:
    """The shape left by a reduction of ``shape`` over ``axis`` (None: all axes)."""
    ndim = len(shape)
    if axis is None:
        axes: tuple[int, ...] = tuple(range(ndim))
    else:
        if isinstance(axis, list):
            axis = tuple(axis)
        axes = tuple(normalize_axis_tuple(axis, ndim))  # type: ignore[arg-type]
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def matmul_shape(a: Shape, b: Shape) -> Shape:
    """The shape of ``a @ b`` (NumPy's rules: 1-D operands promoted and the dimension
    dropped); ValueError with NumPy's message on a mismatch."""
    if not a or not b:
        raise ValueError("matmul: Input operand does not have enough dimensions")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    k1, k2 = a2[-1], b2[-2]
    if k1 is not None and k2 is not None and k1 != k2:
        raise ValueError(
            "matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc "
            f"signature (n?,k),(k,m?)->(n?,m?) (size {k2} is different from {k1})"
        )
    batch = broadcast(a2[:-2], b2[:-2])
    out = (*batch, a2[-2], b2[-1])
    if len(b) == 1:
        out = out[:-1]
    if len(a) == 1:
        out = (*out[:-2], out[-1]) if len(b) != 1 else out[:-1]
    return tuple(out)


def prod(shape: Shape) -> int:
    """The element count of a shape, unknown dimensions counted as 1 (a cost estimate)."""
    return math.prod(d if d is not None else 1 for d in shape)
