"""The elementwise functions: which there are, and what each runs where the standard's
special cases differ from NumPy's.

:data:`ELEMENTWISE` lists the standard's elementwise functions (name -> arity): the namespace
builds its functions from it (``_namespace.py``), and the remote arrays their per-chunk forms
(``_remote.py``). :data:`STANDARD` maps a function's name to the function every path of the
namespace runs for it (``xp.floor_divide``, ``x // y`` and ``x //= y`` alike, through
:func:`elementwise_function`): NumPy's, then the standard's value written over NumPy's where
they differ (only where an infinity or a NaN is involved, so the common case costs one check).
Each takes ``out=`` as NumPy's does, for the in-place operators. Arrays of another module
(CuPy's) pass through as NumPy's function leaves them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ("ELEMENTWISE", "STANDARD", "elementwise_function", "expm1", "floor_divide")


def _host(x: Any) -> bool:
    """Whether ``x`` is a NumPy array or scalar or a Python number (not CuPy's array)."""
    return isinstance(x, np.ndarray | np.generic | bool | int | float | complex)


def _writable(result: Any) -> np.ndarray[Any, Any] | None:
    """``result`` as a NumPy array to write special cases into (a 0-d copy of a NumPy scalar);
    None for another module's array."""
    if isinstance(result, np.ndarray):
        return result
    if isinstance(result, np.generic):
        return np.array(result)
    return None


def floor_divide(x1: Any, x2: Any, /, out: Any = None) -> Any:
    """NumPy's ``floor_divide``, with the standard's special cases of floating-point operands:
    an infinity over a finite number (zero included) is an infinity, a finite number over an
    infinity a zero, each signed by the operands' signs (NumPy gives NaN, and -1 for a
    negative quotient)."""
    if not (_host(x1) and _host(x2)):
        return np.floor_divide(x1, x2, out=out)
    a, b = np.asarray(x1), np.asarray(x2)
    if a.dtype.kind not in "fc" and b.dtype.kind not in "fc":
        return np.floor_divide(x1, x2, out=out)
    # Read before computing: ``out`` may be ``x1`` (``x //= y``).
    over_finite = np.isinf(a) & np.isfinite(b)
    under_inf = np.isfinite(a) & np.isinf(b)
    if not (over_finite.any() or under_inf.any()):
        return np.floor_divide(x1, x2, out=out)
    negative = np.signbit(a) ^ np.signbit(b)
    result = np.floor_divide(x1, x2, out=out)
    res = _writable(result)
    if res is None or res.dtype.kind != "f":
        return result
    with np.errstate(all="ignore"):
        np.copyto(res, np.where(negative, -np.inf, np.inf), where=over_finite)
        np.copyto(res, np.where(negative, -0.0, 0.0), where=under_inf)
    return res


def expm1(x: Any, /, out: Any = None) -> Any:
    """NumPy's ``expm1``, with the standard's special cases of complex operands whose real
    part is an infinity or a NaN (NumPy gives NaN + NaN j for most of them)."""
    if not _host(x) or np.asarray(x).dtype.kind != "c":
        return np.expm1(x, out=out)
    z = np.array(x)  # a copy: ``out`` may be ``x``
    a, b = z.real, z.imag
    special = ~np.isfinite(a)
    result = np.expm1(x, out=out)
    if not special.any():
        return result
    res = _writable(result)
    if res is None:
        return result
    with np.errstate(all="ignore"):
        finite_b = np.isfinite(b)
        # +infinity: infinity * cis(b) - 1 (infinity + b j for b = 0; infinity + NaN j for b
        # infinite or NaN); -infinity: -1 + 0 * sin(b) j (signed as b where sin(b) is not a
        # number); NaN: NaN + b j for b = 0, else NaN + NaN j. b = -0 keeps conj symmetry.
        real = np.where(
            a > 0,
            np.where(finite_b & (b != 0), np.inf * np.cos(b), np.inf),
            np.where(a < 0, -1.0, np.nan),
        )
        imag = np.where(
            a > 0,
            np.where(b == 0, b, np.where(finite_b, np.inf * np.sin(b), np.nan)),
            np.where(
                a < 0,
                np.copysign(0.0, np.where(finite_b, np.sin(b), b)),
                np.where(b == 0, b, np.nan),
            ),
        )
        np.copyto(res.real, real, where=special)
        np.copyto(res.imag, imag, where=special)
    return res


#: The elementwise functions: name -> number of array arguments. Each is NumPy's function of
#: the same name, which follows the standard's type promotion (NEP 50) and broadcasting.
ELEMENTWISE: dict[str, int] = {
    **dict.fromkeys(
        [
            "abs",
            "acos",
            "acosh",
            "asin",
            "asinh",
            "atan",
            "atanh",
            "bitwise_invert",
            "ceil",
            "conj",
            "cos",
            "cosh",
            "exp",
            "expm1",
            "floor",
            "imag",
            "isfinite",
            "isinf",
            "isnan",
            "log",
            "log1p",
            "log2",
            "log10",
            "logical_not",
            "negative",
            "positive",
            "real",
            "reciprocal",
            "round",
            "sign",
            "signbit",
            "sin",
            "sinh",
            "square",
            "sqrt",
            "tan",
            "tanh",
            "trunc",
        ],
        1,
    ),
    **dict.fromkeys(
        [
            "add",
            "atan2",
            "bitwise_and",
            "bitwise_left_shift",
            "bitwise_or",
            "bitwise_right_shift",
            "bitwise_xor",
            "copysign",
            "divide",
            "equal",
            "floor_divide",
            "greater",
            "greater_equal",
            "hypot",
            "less",
            "less_equal",
            "logaddexp",
            "logical_and",
            "logical_or",
            "logical_xor",
            "maximum",
            "minimum",
            "multiply",
            "nextafter",
            "not_equal",
            "pow",
            "remainder",
            "subtract",
        ],
        2,
    ),
}


#: The functions run for these names instead of NumPy's of the same name.
STANDARD: dict[str, Callable[..., Any]] = {"floor_divide": floor_divide, "expm1": expm1}


def elementwise_function(name: str) -> Callable[..., Any]:
    """The function an elementwise operation named ``name`` runs: the standard's special cases
    where :data:`STANDARD` has them, else NumPy's function of that name."""
    fn = STANDARD.get(name)
    return fn if fn is not None else getattr(np, name)
