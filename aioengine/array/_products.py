"""The linear algebra functions of the main namespace: ``matmul``, ``tensordot``, ``vecdot``
(``matrix_transpose`` is a view: ``_manipulation.py``). Their cost estimate (elements times
the contracted length) decides inline or pool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from . import _meta
from ._array import Array, concrete_shape, known_shape
from ._meta import axis_index, broadcast
from ._push import CPU, INLINE_COST, Pusher, blas, call_with, check_same, elementwise, push1

__all__ = ("Products",)


def _outer(x1: Any, x2: Any, out: Any = None) -> Any:
    """The elementwise product of an outer product (``matmul`` of a length of 1), without the
    floating-point warnings (``inf * 0``, overflow) that a matrix product does not give."""
    with np.errstate(all="ignore"):
        return np.multiply(x1, x2, out=out)


_outer.takes_out = True  # type: ignore[attr-defined]  # (a fused chain passes ``out=``)


class Products(Pusher):
    """``matmul``, ``tensordot`` and ``vecdot``
    (a mixin of :class:`~aioengine.array.Namespace`)."""

    def matmul(self, x1: Any, x2: Any, /) -> Array:
        """The matrix product (NumPy's ``matmul`` rules for 1-D and stacked operands)."""
        if isinstance(x1, np.ndarray):
            x1 = self.asarray(x1)
        if isinstance(x2, np.ndarray):
            x2 = self.asarray(x2)
        if not isinstance(x1, Array) or not isinstance(x2, Array):
            raise TypeError("matmul needs two arrays (Python scalars are not allowed)")
        device = check_same(self, [x1, x2])
        s1 = known_shape(x1)
        shape = _meta.matmul_shape(s1, known_shape(x2))
        dtype = _meta.sample_dtype(
            np.matmul, [(x1.dtype, (1,) * x1.ndim), (x2.dtype, (1,) * x2.ndim)]
        )
        k = s1[-1] or 1  # (for the cost: unknown or 0, as 1)
        cost = _meta.prod(shape) * k
        if (
            s1[-1] == 1
            and x1.ndim >= 2
            and x2.ndim >= 2
            and known_shape(x2)[-2] == 1
            and dtype.kind in "fiu"
            and device.device_type is CPU
            and cost > INLINE_COST
        ):
            # An outer product (a contracted length of 1): each element is one product, so
            # the elementwise product has its values, and runs as a chain over chunks (fused
            # with what follows) instead of a BLAS call on one thread per core. A matrix
            # product adds its products to 0.0: so does this (a -0.0 product is +0.0).
            product = elementwise(self, _outer, "matmul", (x1, x2))
            if dtype.kind != "f":
                return product
            return elementwise(self, np.add, "matmul", (product, 0.0))
        return push1(
            self, blas(np.matmul, cost, device), (x1, x2), shape, dtype, device, "matmul", cost=cost
        )

    def tensordot(
        self, x1: Array, x2: Array, /, *, axes: int | tuple[Sequence[int], Sequence[int]] = 2
    ) -> Array:
        """The sum of products over ``axes`` (the last ``axes`` of x1 and first of x2)."""
        device = check_same(self, [x1, x2])
        s1, s2 = concrete_shape(self, x1, "tensordot"), concrete_shape(self, x2, "tensordot")
        if isinstance(axes, int):
            if axes < 0 or axes > min(len(s1), len(s2)):
                raise ValueError(f"tensordot: axes={axes} is out of range for shapes {s1} and {s2}")
            a1, a2 = list(range(len(s1) - axes, len(s1))), list(range(axes))
        else:
            a1 = [axis_index(a, len(s1)) for a in axes[0]]
            a2 = [axis_index(a, len(s2)) for a in axes[1]]
            if len(a1) != len(a2):
                raise ValueError("tensordot: the two sequences of axes differ in length")
        for i, j in zip(a1, a2, strict=True):
            if s1[i] != s2[j]:
                raise ValueError(f"tensordot: shape mismatch on axes {i} and {j}: {s1} and {s2}")
        shape = tuple(d for i, d in enumerate(s1) if i not in a1) + tuple(
            d for j, d in enumerate(s2) if j not in a2
        )
        dtype = np.result_type(x1.dtype, x2.dtype)
        cost = math.prod(s1) * max(math.prod(s2), 1)
        return push1(
            self,
            blas(partial(call_with, np.tensordot, {"axes": axes}), cost, device),
            (x1, x2),
            shape,
            dtype,
            device,
            "tensordot",
            cost=cost,
        )

    def vecdot(self, x1: Array, x2: Array, /, *, axis: int = -1) -> Array:
        """The dot product of vectors along ``axis`` (complex x1 conjugated)."""
        device = check_same(self, [x1, x2])
        if x1.ndim == 0 or x2.ndim == 0:
            raise ValueError("vecdot needs arrays of at least one dimension")
        s1, s2 = known_shape(x1), known_shape(x2)
        full = broadcast(s1, s2)
        ax = axis_index(axis, len(full))
        n1, n2 = s1[ax - len(full) + x1.ndim], s2[ax - len(full) + x2.ndim]
        if n1 is not None and n2 is not None and n1 != n2:
            raise ValueError(f"vecdot: the sizes along axis {axis} differ: {n1} and {n2}")
        shape = tuple(d for i, d in enumerate(full) if i != ax)
        dtype = np.result_type(x1.dtype, x2.dtype)
        return push1(
            self,
            partial(call_with, np.vecdot, {"axis": axis}),
            (x1, x2),
            shape,
            dtype,
            device,
            "vecdot",
            cost=_meta.prod(full),
        )
