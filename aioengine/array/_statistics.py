"""Statistical and utility functions of the namespace: ``sum``, ``mean``, ``var``, ``max``,
``cumulative_sum``, ``all``, ``any``, ``diff``, ...: reductions whose shape follows the axes
reduced and whose dtype NumPy gives (sampled at the call).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from . import _meta
from ._array import Array, buffer_of, is_view, known_shape
from ._meta import as_dtype, axis_index
from ._push import CPU, INLINE_COST, Pusher, call_with, check_same, push1, reduction
from ._scan import scan_chunks

__all__ = ("Statistics", "check_identity")


def check_identity(x: Any, axis: Any, message: str) -> None:
    """ValueError(``message``, NumPy's) if a reduction without an identity (``max``,
    ``argmin``, ...) of ``x`` along ``axis`` reduces an axis of length 0: it depends on the
    shape only, so it raises at the call, not when the operation runs."""
    if not isinstance(x, Array):
        return  # the reduction says what it needs
    shape = known_shape(x)
    if axis is None:
        axes: tuple[int, ...] = tuple(range(len(shape)))
    else:
        try:
            axes = tuple(
                axis_index(a, len(shape))
                for a in (axis if isinstance(axis, tuple | list) else (axis,))
            )
        except (TypeError, ValueError, IndexError):
            return  # a bad axis: the reduction raises its own error
    if any(shape[a] == 0 for a in axes):
        raise ValueError(message)


class Statistics(Pusher):
    """The standard's statistical and utility functions
    (a mixin of :class:`~aioengine.array.Namespace`)."""

    def sum(
        self, x: Array, /, *, axis: Any = None, dtype: Any = None, keepdims: bool = False
    ) -> Array:
        """The sum along ``axis`` (all axes if None)."""
        return reduction(
            self, np.sum, "sum", x, axis, keepdims, dtype=None if dtype is None else as_dtype(dtype)
        )

    def prod(
        self, x: Array, /, *, axis: Any = None, dtype: Any = None, keepdims: bool = False
    ) -> Array:
        """The product along ``axis``."""
        return reduction(
            self,
            np.prod,
            "prod",
            x,
            axis,
            keepdims,
            dtype=None if dtype is None else as_dtype(dtype),
        )

    def mean(self, x: Array, /, *, axis: Any = None, keepdims: bool = False) -> Array:
        """The arithmetic mean along ``axis``."""
        return reduction(self, np.mean, "mean", x, axis, keepdims)

    def var(
        self,
        x: Array,
        /,
        *,
        axis: Any = None,
        correction: int | float = 0.0,
        keepdims: bool = False,
    ) -> Array:
        """The variance along ``axis`` (``correction``: degrees of freedom subtracted)."""
        return reduction(self, np.var, "var", x, axis, keepdims, correction=correction)

    def std(
        self,
        x: Array,
        /,
        *,
        axis: Any = None,
        correction: int | float = 0.0,
        keepdims: bool = False,
    ) -> Array:
        """The standard deviation along ``axis``."""
        return reduction(self, np.std, "std", x, axis, keepdims, correction=correction)

    def max(self, x: Array, /, *, axis: Any = None, keepdims: bool = False) -> Array:
        """The maximum along ``axis``."""
        check_identity(
            x, axis, "zero-size array to reduction operation maximum which has no identity"
        )
        return reduction(self, np.max, "max", x, axis, keepdims)

    def min(self, x: Array, /, *, axis: Any = None, keepdims: bool = False) -> Array:
        """The minimum along ``axis``."""
        check_identity(
            x, axis, "zero-size array to reduction operation minimum which has no identity"
        )
        return reduction(self, np.min, "min", x, axis, keepdims)

    def all(self, x: Array, /, *, axis: Any = None, keepdims: bool = False) -> Array:
        """Whether every element along ``axis`` is true."""
        return reduction(self, np.all, "all", x, axis, keepdims)

    def any(self, x: Array, /, *, axis: Any = None, keepdims: bool = False) -> Array:
        """Whether any element along ``axis`` is true."""
        return reduction(self, np.any, "any", x, axis, keepdims)

    def _cumulative(
        self,
        fn: Callable[..., Any],
        name: str,
        x: Array,
        axis: int | None,
        dtype: Any,
        include_initial: bool,
    ) -> Array:
        device = check_same(self, [x])
        if axis is None:
            if x.ndim > 1:
                raise ValueError(
                    f"{name}: axis is required for an array of more than one dimension"
                )
            axis = 0
        if x.ndim == 0:
            raise ValueError(f"{name} of a 0-d array")
        ax = axis_index(axis, x.ndim)
        kwargs = {
            "axis": ax,
            "dtype": None if dtype is None else as_dtype(dtype),
            "include_initial": include_initial,
        }
        out_dtype = _meta.sample_dtype(fn, [(x.dtype, (1,) * x.ndim)], **kwargs)
        xshape = known_shape(x)
        shape = list(xshape)
        if include_initial and shape[ax] is not None:
            shape[ax] += 1  # type: ignore[operator]
        if (
            device.device_type is CPU
            and None not in xshape
            and _meta.prod(xshape) > INLINE_COST
            and not is_view(x)
            and all(d == 1 for k, d in enumerate(xshape) if k != ax)  # flat order is axis order
        ):
            ufunc = np.add if fn is np.cumulative_sum else np.multiply
            out = scan_chunks(
                self._submit,
                self._engine,
                self._chunk_elems,
                ufunc,
                name,
                buffer_of(x),
                tuple(shape),  # type: ignore[arg-type]
                out_dtype,
                device,
                include_initial,
            )
            return Array(self, out, tuple(shape), out_dtype, device)
        return push1(
            self, partial(call_with, fn, kwargs), (x,), tuple(shape), out_dtype, device, name
        )

    def cumulative_sum(
        self,
        x: Array,
        /,
        *,
        axis: int | None = None,
        dtype: Any = None,
        include_initial: bool = False,
    ) -> Array:
        """The cumulative sum along ``axis``."""
        return self._cumulative(
            np.cumulative_sum, "cumulative_sum", x, axis, dtype, include_initial
        )

    def cumulative_prod(
        self,
        x: Array,
        /,
        *,
        axis: int | None = None,
        dtype: Any = None,
        include_initial: bool = False,
    ) -> Array:
        """The cumulative product along ``axis``."""
        return self._cumulative(
            np.cumulative_prod, "cumulative_prod", x, axis, dtype, include_initial
        )

    def diff(
        self,
        x: Array,
        /,
        *,
        axis: int = -1,
        n: int = 1,
        prepend: Array | None = None,
        append: Array | None = None,
    ) -> Array:
        """The ``n``-th discrete difference along ``axis``."""
        extra = [a for a in (prepend, append) if a is not None]
        device = check_same(self, [x, *extra])
        if x.ndim == 0:
            raise ValueError("diff needs an array of at least one dimension")
        ax = axis_index(axis, x.ndim)
        n = operator.index(n)
        if n < 0:
            raise ValueError(f"diff: order n must be non-negative, got {n}")
        dtype = self.result_type(x, *extra) if extra else x.dtype
        xshape = known_shape(x)
        length = xshape[ax]
        for a in extra:
            if a.ndim != x.ndim:
                raise ValueError("diff: prepend and append must have the dimensions of x")
            more = known_shape(a)[ax]
            length = None if length is None or more is None else length + more
        shape = list(xshape)
        shape[ax] = None if length is None else max(length - n, 0)
        fn = partial(_diff, ax, n, prepend is not None, append is not None)
        return push1(self, fn, (x, *extra), tuple(shape), dtype, device, "diff")


def _diff(axis: int, n: int, has_prepend: bool, has_append: bool, x: Any, *extra: Any) -> Any:
    kwargs: dict[str, Any] = {}
    rest = list(extra)
    if has_prepend:
        kwargs["prepend"] = rest.pop(0)
    if has_append:
        kwargs["append"] = rest.pop(0)
    return np.diff(x, n=n, axis=axis, **kwargs)
