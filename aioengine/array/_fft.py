"""The ``fft`` extension of the namespace (``xp.fft``): NumPy's ``numpy.fft``, pushed.

Shapes follow the transform's rule (the transformed axes take the lengths ``n`` / ``s`` given,
``n // 2 + 1`` for the real transforms' outputs, ``2 * (m - 1)`` by default for their
inverses); dtypes come from sampling, so float32 input gives complex64 as NumPy does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _meta
from ._array import known_shape
from ._meta import Shape, axis_index
from ._push import check_same, create, push1, same_shape

if TYPE_CHECKING:
    from .. import Context
    from ._array import Array
    from ._push import Pusher

__all__ = ("FFT",)

_fft = np.fft


def _call(fn: Callable[..., Any], kwargs: dict[str, Any], value: Any) -> Any:
    return fn(value, **kwargs)


class FFT:
    """The FFT extension bound to one namespace (``xp.fft``)."""

    def __init__(self, ns: Pusher) -> None:
        self._ns = ns

    def _push(
        self, fn: Callable[..., Any], name: str, x: Array, shape: Shape, **kwargs: Any
    ) -> Array:
        ns = self._ns
        device = check_same(ns, [x])
        dtype = _meta.sample_dtype(fn, [(x.dtype, (2,) * x.ndim)], **kwargs)
        cost = max(_meta.prod(shape), _meta.prod(known_shape(x))) * 8
        return push1(
            ns,
            functools.partial(_call, fn, kwargs),
            (x,),
            shape,
            dtype,
            device,
            f"fft.{name}",
            cost,
        )

    @staticmethod
    def _check_norm(norm: str) -> None:
        if norm not in ("backward", "ortho", "forward"):
            raise ValueError(f'norm must be "backward", "ortho" or "forward", got {norm!r}')

    def _one(
        self,
        fn: Callable[..., Any],
        name: str,
        x: Array,
        n: int | None,
        axis: int,
        norm: str,
        rule: Callable[[int | None, int | None], int | None],
    ) -> Array:
        self._check_norm(norm)
        if x.ndim == 0:
            raise ValueError(f"fft.{name} needs an array of at least one dimension")
        ax = axis_index(axis, x.ndim)
        if n is not None and n < 1:
            raise ValueError(f"fft.{name}: invalid number of data points ({n})")
        shape = list(known_shape(x))
        shape[ax] = rule(shape[ax], n)
        return self._push(fn, name, x, tuple(shape), n=n, axis=axis, norm=norm)

    def fft(
        self, x: Array, /, *, n: int | None = None, axis: int = -1, norm: str = "backward"
    ) -> Array:
        """The one-dimensional discrete Fourier transform."""
        return self._one(_fft.fft, "fft", x, n, axis, norm, lambda m, n: n if n is not None else m)

    def ifft(
        self, x: Array, /, *, n: int | None = None, axis: int = -1, norm: str = "backward"
    ) -> Array:
        """The one-dimensional inverse discrete Fourier transform."""
        return self._one(
            _fft.ifft, "ifft", x, n, axis, norm, lambda m, n: n if n is not None else m
        )

    def rfft(
        self, x: Array, /, *, n: int | None = None, axis: int = -1, norm: str = "backward"
    ) -> Array:
        """The one-dimensional transform of real input (``n // 2 + 1`` outputs)."""

        def rule(m: int | None, n: int | None) -> int | None:
            size = n if n is not None else m
            return None if size is None else size // 2 + 1

        return self._one(_fft.rfft, "rfft", x, n, axis, norm, rule)

    def irfft(
        self, x: Array, /, *, n: int | None = None, axis: int = -1, norm: str = "backward"
    ) -> Array:
        """The inverse of :meth:`rfft` (``2 * (m - 1)`` outputs by default)."""
        return self._one(
            _fft.irfft,
            "irfft",
            x,
            n,
            axis,
            norm,
            lambda m, n: n if n is not None else None if m is None else 2 * (m - 1),
        )

    def hfft(
        self, x: Array, /, *, n: int | None = None, axis: int = -1, norm: str = "backward"
    ) -> Array:
        """The transform of a Hermitian-symmetric signal (real output)."""
        return self._one(
            _fft.hfft,
            "hfft",
            x,
            n,
            axis,
            norm,
            lambda m, n: n if n is not None else None if m is None else 2 * (m - 1),
        )

    def ihfft(
        self, x: Array, /, *, n: int | None = None, axis: int = -1, norm: str = "backward"
    ) -> Array:
        """The inverse of :meth:`hfft`."""

        def rule(m: int | None, n: int | None) -> int | None:
            size = n if n is not None else m
            return None if size is None else size // 2 + 1

        return self._one(_fft.ihfft, "ihfft", x, n, axis, norm, rule)

    def _many(
        self,
        fn: Callable[..., Any],
        name: str,
        x: Array,
        s: Sequence[int] | None,
        axes: Sequence[int] | None,
        norm: str,
        real: str = "",
    ) -> Array:
        self._check_norm(norm)
        shape = list(known_shape(x))
        if axes is None:
            axes = list(range(x.ndim)) if s is None else list(range(x.ndim - len(s), x.ndim))
        axes = [axis_index(a, x.ndim) for a in axes]
        if s is not None and len(s) != len(axes):
            raise ValueError(f"fft.{name}: s and axes differ in length")
        sizes: list[int | None] = list(s) if s is not None else [shape[a] for a in axes]
        for a, size in zip(axes, sizes, strict=True):
            shape[a] = size
        if real == "forward" and axes:
            last = sizes[-1]
            shape[axes[-1]] = None if last is None else last // 2 + 1
        elif real == "inverse" and axes and s is None:
            m = known_shape(x)[axes[-1]]
            shape[axes[-1]] = None if m is None else 2 * (m - 1)
        return self._push(
            fn,
            name,
            x,
            tuple(shape),
            s=None if s is None else tuple(s),
            axes=tuple(axes),
            norm=norm,
        )

    def fftn(
        self,
        x: Array,
        /,
        *,
        s: Sequence[int] | None = None,
        axes: Sequence[int] | None = None,
        norm: str = "backward",
    ) -> Array:
        """The n-dimensional discrete Fourier transform."""
        return self._many(_fft.fftn, "fftn", x, s, axes, norm)

    def ifftn(
        self,
        x: Array,
        /,
        *,
        s: Sequence[int] | None = None,
        axes: Sequence[int] | None = None,
        norm: str = "backward",
    ) -> Array:
        """The n-dimensional inverse discrete Fourier transform."""
        return self._many(_fft.ifftn, "ifftn", x, s, axes, norm)

    def rfftn(
        self,
        x: Array,
        /,
        *,
        s: Sequence[int] | None = None,
        axes: Sequence[int] | None = None,
        norm: str = "backward",
    ) -> Array:
        """The n-dimensional transform of real input."""
        return self._many(_fft.rfftn, "rfftn", x, s, axes, norm, real="forward")

    def irfftn(
        self,
        x: Array,
        /,
        *,
        s: Sequence[int] | None = None,
        axes: Sequence[int] | None = None,
        norm: str = "backward",
    ) -> Array:
        """The inverse of :meth:`rfftn`."""
        return self._many(_fft.irfftn, "irfftn", x, s, axes, norm, real="inverse")

    def fftfreq(
        self, n: int, /, *, d: float = 1.0, dtype: Any = None, device: Context | None = None
    ) -> Array:
        """The sample frequencies of an ``n``-point transform."""
        dt = np.dtype(np.float64) if dtype is None else _meta.as_dtype(dtype)
        return create(
            self._ns, _freq, (_fft.fftfreq, n, d, dt), {}, (n,), dt, device, "fft.fftfreq"
        )

    def rfftfreq(
        self, n: int, /, *, d: float = 1.0, dtype: Any = None, device: Context | None = None
    ) -> Array:
        """The sample frequencies of an ``n``-point real transform (``n // 2 + 1``)."""
        dt = np.dtype(np.float64) if dtype is None else _meta.as_dtype(dtype)
        return create(
            self._ns,
            _freq,
            (_fft.rfftfreq, n, d, dt),
            {},
            (n // 2 + 1,),
            dt,
            device,
            "fft.rfftfreq",
        )

    def fftshift(self, x: Array, /, *, axes: Any = None) -> Array:
        """The zero-frequency term moved to the centre."""
        return same_shape(self._ns, _fft.fftshift, "fft.fftshift", x, axes=axes)

    def ifftshift(self, x: Array, /, *, axes: Any = None) -> Array:
        """The inverse of :meth:`fftshift`."""
        return same_shape(self._ns, _fft.ifftshift, "fft.ifftshift", x, axes=axes)


def _freq(fn: Callable[..., Any], n: int, d: float, dtype: np.dtype[Any]) -> Any:
    return fn(n, d).astype(dtype)
