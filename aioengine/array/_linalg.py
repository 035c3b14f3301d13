"""The ``linalg`` extension of the namespace (``xp.linalg``): NumPy's ``numpy.linalg``, pushed.

Each function computes its result's shape by the rule written beside it and its dtype by
sampling (``_meta.sample_dtype``), then pushes one operation, as the main namespace does.
Runtime failures (``LinAlgError`` for a singular matrix, say) are the result's failure: raised
by ``await`` with a note naming the operation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from . import _meta
from ._array import Array, known_shape
from ._meta import Shape, axis_index, broadcast, reduced
from ._push import blas, check_same, push, push1

if TYPE_CHECKING:
    from ._push import Pusher

__all__ = ("EighResult", "Linalg", "QRResult", "SVDResult", "SlogdetResult")

_la = np.linalg


class EighResult(NamedTuple):
    """What :meth:`Linalg.eigh` returns."""

    eigenvalues: Array
    eigenvectors: Array


class QRResult(NamedTuple):
    """What :meth:`Linalg.qr` returns."""

    Q: Array
    R: Array


class SlogdetResult(NamedTuple):
    """What :meth:`Linalg.slogdet` returns."""

    sign: Array
    logabsdet: Array


class SVDResult(NamedTuple):
    """What :meth:`Linalg.svd` returns."""

    U: Array
    S: Array
    Vh: Array


def _call(fn: Callable[..., Any], kwargs: dict[str, Any], *values: Any) -> Any:
    result = fn(*values, **kwargs)
    return tuple(result) if isinstance(result, tuple) else result


def _pinv_rtol(x: Any, rtol: Any) -> Any:
    return _la.pinv(x, rtol=rtol)


def _matrix_rank_rtol(x: Any, rtol: Any) -> Any:
    return _la.matrix_rank(x, rtol=rtol)


class Linalg:
    """The linear algebra extension bound to one namespace (``xp.linalg``)."""

    def __init__(self, ns: Pusher) -> None:
        self._ns = ns

    def _push(
        self,
        fn: Callable[..., Any],
        name: str,
        arrays: Sequence[Array],
        shapes: Sequence[Shape],
        cost: int,
        **kwargs: Any,
    ) -> tuple[Array, ...]:
        ns = self._ns
        device = check_same(ns, arrays)
        samples = [(a.dtype, (1,) * max(a.ndim, 1)) for a in arrays]
        dtypes = _meta.sample_dtype(fn, samples, **kwargs)
        if not isinstance(dtypes, tuple):
            dtypes = (dtypes,)
        outs = tuple(zip(shapes, dtypes, strict=True))
        return push(
            ns,
            blas(functools.partial(_call, fn, kwargs), cost, device),
            tuple(arrays),
            outs,
            device,
            f"linalg.{name}",
            cost,
        )

    def _matrix(self, x: Array, name: str, square: bool = True) -> tuple[int | None, ...]:
        if x.ndim < 2:
            raise ValueError(
                f"linalg.{name} needs an array of at least two dimensions, got {x.ndim}"
            )
        shape = known_shape(x)
        if square and shape[-1] is not None and shape[-2] is not None and shape[-1] != shape[-2]:
            raise ValueError(
                f"linalg.{name}: last 2 dimensions of the array must be square, got {shape}"
            )
        return shape

    @staticmethod
    def _cube(shape: Shape) -> int:
        n = max(d or 1 for d in shape[-2:])
        return _meta.prod(shape[:-2]) * n * n * n

    def cholesky(self, x: Array, /, *, upper: bool = False) -> Array:
        """The Cholesky factor of each Hermitian positive-definite matrix."""
        s = self._matrix(x, "cholesky")
        return self._push(_la.cholesky, "cholesky", [x], [s], self._cube(s), upper=upper)[0]

    def cross(self, x1: Array, x2: Array, /, *, axis: int = -1) -> Array:
        """The cross product of 3-element vectors along ``axis``."""
        s1, s2 = known_shape(x1), known_shape(x2)
        shape = broadcast(s1, s2)
        ax = axis_index(axis, len(shape))
        if shape[ax] != 3 or s1[axis] != 3 or s2[axis] != 3:
            raise ValueError("linalg.cross: both arrays must have size 3 along axis")
        ns = self._ns
        device = check_same(ns, [x1, x2])
        # Sampled on 3-element vectors: NumPy refuses any other length.
        dtype = _meta.sample_dtype(_la.cross, [(x1.dtype, (3,)), (x2.dtype, (3,))])
        fn = functools.partial(_call, _la.cross, {"axis": axis})
        return push1(ns, fn, (x1, x2), shape, dtype, device, "linalg.cross")

    def det(self, x: Array, /) -> Array:
        """The determinant of each square matrix."""
        s = self._matrix(x, "det")
        return self._push(_la.det, "det", [x], [s[:-2]], self._cube(s))[0]

    def diagonal(self, x: Array, /, *, offset: int = 0) -> Array:
        """The ``offset``-th diagonal of each matrix (a copy)."""
        s = self._matrix(x, "diagonal", square=False)
        m, n = s[-2], s[-1]
        if m is None or n is None:
            length: int | None = None
        else:
            length = max(0, min(m, n - offset) if offset >= 0 else min(m + offset, n))
        return self._push(
            _la.diagonal, "diagonal", [x], [(*s[:-2], length)], _meta.prod(s), offset=offset
        )[0]

    def eigh(self, x: Array, /) -> EighResult:
        """Eigenvalues and eigenvectors of each Hermitian matrix."""
        s = self._matrix(x, "eigh")
        return EighResult(*self._push(_la.eigh, "eigh", [x], [s[:-1], s], self._cube(s)))

    def eigvalsh(self, x: Array, /) -> Array:
        """Eigenvalues of each Hermitian matrix."""
        s = self._matrix(x, "eigvalsh")
        return self._push(_la.eigvalsh, "eigvalsh", [x], [s[:-1]], self._cube(s))[0]

    def inv(self, x: Array, /) -> Array:
        """The inverse of each square matrix (LinAlgError, at ``await``, if singular)."""
        s = self._matrix(x, "inv")
        return self._push(_la.inv, "inv", [x], [s], self._cube(s))[0]

    def matmul(self, x1: Array, x2: Array, /) -> Array:
        """As the main namespace's ``matmul``."""
        return self._ns.matmul(x1, x2)

    def matrix_norm(self, x: Array, /, *, keepdims: bool = False, ord: Any = "fro") -> Array:
        """The matrix norm of each matrix (``ord``: 'fro', 'nuc', ±1, ±2, ±inf)."""
        s = self._matrix(x, "matrix_norm", square=False)
        shape = (*s[:-2], 1, 1) if keepdims else s[:-2]
        return self._push(
            _la.matrix_norm, "matrix_norm", [x], [shape], self._cube(s), keepdims=keepdims, ord=ord
        )[0]

    def matrix_power(self, x: Array, n: int, /) -> Array:
        """Each square matrix raised to the integer power ``n``."""
        s = self._matrix(x, "matrix_power")
        return self._push(
            _la.matrix_power, "matrix_power", [x], [s], self._cube(s) * max(abs(n), 1), n=n
        )[0]

    def matrix_rank(self, x: Array, /, *, rtol: Any = None) -> Array:
        """The rank of each matrix."""
        s = self._matrix(x, "matrix_rank", square=False)
        if isinstance(rtol, Array):  # an operand (one per matrix), not a keyword
            self._rtol_fits(s, rtol, "matrix_rank")
            return self._push(_matrix_rank_rtol, "matrix_rank", [x, rtol], [s[:-2]], self._cube(s))[
                0
            ]
        return self._push(_la.matrix_rank, "matrix_rank", [x], [s[:-2]], self._cube(s), rtol=rtol)[
            0
        ]

    @staticmethod
    def _rtol_fits(s: Shape, rtol: Array, name: str) -> None:
        """ValueError at the call if an array ``rtol`` does not broadcast against the stack
        of matrices of shape ``s`` (one tolerance per matrix)."""
        try:
            broadcast(s[:-2], known_shape(rtol))
        except ValueError:
            raise ValueError(
                f"linalg.{name}: rtol of shape {known_shape(rtol)} does not broadcast against "
                f"the stack of matrices {s[:-2]}"
            ) from None

    def matrix_transpose(self, x: Array, /) -> Array:
        """As the main namespace's ``matrix_transpose``."""
        return self._ns.matrix_transpose(x)

    def outer(self, x1: Array, x2: Array, /) -> Array:
        """The outer product of two 1-D arrays."""
        if x1.ndim != 1 or x2.ndim != 1:
            raise ValueError("linalg.outer needs two 1-D arrays")
        shape = (known_shape(x1)[0], known_shape(x2)[0])
        return self._push(_la.outer, "outer", [x1, x2], [shape], _meta.prod(shape))[0]

    def pinv(self, x: Array, /, *, rtol: Any = None) -> Array:
        """The Moore-Penrose pseudo-inverse of each matrix."""
        s = self._matrix(x, "pinv", square=False)
        if isinstance(rtol, Array):  # an operand (one per matrix), not a keyword
            self._rtol_fits(s, rtol, "pinv")
            return self._push(
                _pinv_rtol, "pinv", [x, rtol], [(*s[:-2], s[-1], s[-2])], self._cube(s)
            )[0]
        return self._push(
            _la.pinv, "pinv", [x], [(*s[:-2], s[-1], s[-2])], self._cube(s), rtol=rtol
        )[0]

    def qr(self, x: Array, /, *, mode: str = "reduced") -> QRResult:
        """The QR decomposition of each matrix (``mode``: 'reduced' or 'complete')."""
        if mode not in ("reduced", "complete"):
            raise ValueError(f"linalg.qr: mode must be 'reduced' or 'complete', got {mode!r}")
        s = self._matrix(x, "qr", square=False)
        m, n = s[-2], s[-1]
        k = None if m is None or n is None else min(m, n)
        batch = s[:-2]
        if mode == "reduced":
            shapes = [(*batch, m, k), (*batch, k, n)]
        else:
            shapes = [(*batch, m, m), (*batch, m, n)]
        return QRResult(*self._push(_la.qr, "qr", [x], shapes, self._cube(s), mode=mode))

    def slogdet(self, x: Array, /) -> SlogdetResult:
        """The sign and the log of the absolute value of each determinant."""
        s = self._matrix(x, "slogdet")
        return SlogdetResult(
            *self._push(_la.slogdet, "slogdet", [x], [s[:-2], s[:-2]], self._cube(s))
        )

    def solve(self, x1: Array, x2: Array, /) -> Array:
        """The solution ``X`` of ``x1 @ X = x2`` (x2 a vector if 1-D, else stacked matrices)."""
        s1 = self._matrix(x1, "solve")
        s2 = known_shape(x2)
        if len(s2) == 1:
            if s2[0] != s1[-1]:
                raise ValueError(f"linalg.solve: shapes {s1} and {s2} do not match")
            shape: Shape = s1[:-1]
        else:
            if s2[-2] != s1[-1]:
                raise ValueError(f"linalg.solve: shapes {s1} and {s2} do not match")
            shape = (*broadcast(s1[:-2], s2[:-2]), s1[-2], s2[-1])
        return self._push(_la.solve, "solve", [x1, x2], [shape], self._cube(s1))[0]

    def svd(self, x: Array, /, *, full_matrices: bool = True) -> SVDResult:
        """The singular value decomposition of each matrix."""
        s = self._matrix(x, "svd", square=False)
        m, n = s[-2], s[-1]
        k = None if m is None or n is None else min(m, n)
        batch = s[:-2]
        if full_matrices:
            shapes = [(*batch, m, m), (*batch, k), (*batch, n, n)]
        else:
            shapes = [(*batch, m, k), (*batch, k), (*batch, k, n)]
        return SVDResult(
            *self._push(_la.svd, "svd", [x], shapes, self._cube(s), full_matrices=full_matrices)
        )

    def svdvals(self, x: Array, /) -> Array:
        """The singular values of each matrix."""
        s = self._matrix(x, "svdvals", square=False)
        m, n = s[-2], s[-1]
        k = None if m is None or n is None else min(m, n)
        return self._push(_la.svdvals, "svdvals", [x], [(*s[:-2], k)], self._cube(s))[0]

    def tensordot(self, x1: Array, x2: Array, /, *, axes: Any = 2) -> Array:
        """As the main namespace's ``tensordot``."""
        return self._ns.tensordot(x1, x2, axes=axes)

    def trace(self, x: Array, /, *, offset: int = 0, dtype: Any = None) -> Array:
        """The sum along the ``offset``-th diagonal of each matrix."""
        s = self._matrix(x, "trace", square=False)
        dt = None if dtype is None else _meta.as_dtype(dtype)
        return self._push(
            _la.trace, "trace", [x], [s[:-2]], _meta.prod(s), offset=offset, dtype=dt
        )[0]

    def vecdot(self, x1: Array, x2: Array, /, *, axis: int = -1) -> Array:
        """As the main namespace's ``vecdot``."""
        return self._ns.vecdot(x1, x2, axis=axis)

    def vector_norm(
        self, x: Array, /, *, axis: Any = None, keepdims: bool = False, ord: Any = 2
    ) -> Array:
        """The vector norm along ``axis`` (all elements if None)."""
        if isinstance(axis, list):
            axis = tuple(axis)
        xshape = known_shape(x)
        shape = reduced(xshape, axis, keepdims)
        return self._push(
            _la.vector_norm,
            "vector_norm",
            [x],
            [shape],
            _meta.prod(xshape),
            axis=axis,
            keepdims=keepdims,
            ord=ord,
        )[0]
