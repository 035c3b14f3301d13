"""NumPy's protocols: ``np.sin(x)``, ``np.add(a, x, out=...)``, ``np.mean(x)`` on arrays.

* ``__array_ufunc__`` (NEP 13): every ufunc call on an array becomes a push, with the ufunc
  itself as the function (metadata by broadcasting and sampling, as the namespace's elementwise
  functions); ``out=`` an array of the namespace is an in-place write on it; ``reduce``,
  ``accumulate`` and ``outer`` are pushes too. Anything else (``at``, ``reduceat``, ``out=`` a
  NumPy array) returns NotImplemented, and NumPy raises ``TypeError``.
* ``__array_function__`` (NEP 18): a NumPy function with a namespace equivalent (the same name
  in ``numpy``, ``numpy.linalg`` or ``numpy.fft``, or an alias such as ``concatenate`` for
  ``concat``) calls it, its arguments bound by NumPy's signature; a keyword the namespace does
  not take raises ``TypeError`` naming it. Any other NumPy function returns NotImplemented, so
  NumPy raises ``TypeError`` naming the function: never a silent synchronous fallback.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _meta
from ._array import Array, check_writable, known_shape, operand_ok
from ._meta import broadcast
from ._push import check_same, elementwise, operand, push, push1, reduction

if TYPE_CHECKING:
    from ._namespace import Namespace

__all__ = ("array_function", "array_ufunc")

# NumPy's name -> the namespace's, where they differ.
_ALIASES = {
    "concatenate": "concat",
    "transpose": "permute_dims",
    "power": "pow",
    "absolute": "abs",
    "cumsum": "cumulative_sum",
    "cumprod": "cumulative_prod",
    "amax": "max",
    "amin": "min",
}
# NumPy's keyword -> the namespace's.
_KEYWORDS = {"ddof": "correction"}


def _inplace_call(ufunc: np.ufunc, kwargs: dict[str, Any], target: Any, *values: Any) -> None:
    ufunc(*values, out=target, **kwargs)


def _outer(ufunc: np.ufunc, x: Any, y: Any) -> Any:
    return ufunc.outer(x, y)


def array_ufunc(
    ns: Namespace, ufunc: np.ufunc, method: str, inputs: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``__array_ufunc__`` of the arrays of ``ns``."""
    for x in inputs:
        if not operand_ok(x):
            return NotImplemented
    out = kwargs.pop("out", None)
    extra = set(kwargs) - {"dtype", "axis", "keepdims"}
    if extra:
        raise TypeError(
            f"numpy.{ufunc.__name__}.{method} with {', '.join(sorted(extra))}= is not supported "
            "on aioengine arrays"
        )
    name = ufunc.__name__
    if method == "__call__":
        if ufunc.nout != 1:
            return _multi(ns, ufunc, inputs)
        if out is not None:
            (target,) = out
            if not isinstance(target, Array):
                return NotImplemented  # writing into a NumPy array asynchronously: no
            return _into(ns, ufunc, inputs, target, kwargs)
        return elementwise(ns, ufunc, name, inputs, **kwargs)
    if out is not None:
        return NotImplemented
    (x, *rest) = inputs
    x = operand(ns, x)
    if not isinstance(x, Array):
        return NotImplemented
    if method == "reduce" and not rest:
        axis = kwargs.pop("axis", 0)
        keepdims = kwargs.pop("keepdims", False)
        return reduction(ns, ufunc.reduce, f"{name}.reduce", x, axis, keepdims, **kwargs)
    if method == "accumulate" and not rest:
        axis = _meta.axis_index(kwargs.pop("axis", 0), x.ndim)
        fn = functools.partial(ufunc.accumulate, axis=axis, **kwargs)
        dtype = _meta.sample_dtype(
            ufunc.accumulate, [(x.dtype, (1,) * x.ndim)], axis=axis, **kwargs
        )
        return push1(ns, fn, (x,), known_shape(x), dtype, check_same(ns, [x]), f"{name}.accumulate")
    if method == "outer" and len(rest) == 1:
        y = operand(ns, rest[0])
        arrays = [a for a in (x, y) if isinstance(a, Array)]
        device = check_same(ns, arrays)
        dtype = _meta.sample_dtype(ufunc, [x.dtype, y.dtype if isinstance(y, Array) else y.value])
        shape = (*known_shape(x), *y.shape)
        return push1(
            ns, functools.partial(_outer, ufunc), (x, y), shape, dtype, device, f"{name}.outer"
        )
    return NotImplemented


def _into(
    ns: Namespace, ufunc: np.ufunc, inputs: tuple[Any, ...], target: Array, kwargs: dict[str, Any]
) -> Array:
    operands = tuple(operand(ns, a) for a in inputs)
    arrays = [a for a in operands if isinstance(a, Array)]
    device = check_same(ns, [target, *arrays])
    check_writable(ns, target)
    shape = broadcast(*(known_shape(a) for a in arrays))
    dtype = _meta.sample_dtype(
        ufunc, [a.dtype if isinstance(a, Array) else a.value for a in operands], **kwargs
    )
    if dtype != target.dtype:
        raise TypeError(
            f"{ufunc.__name__}(..., out=): the result dtype {dtype} is not out's dtype "
            f"{target.dtype}"
        )
    tshape = known_shape(target)
    if broadcast(shape, tshape) != tshape:
        raise ValueError(
            f"{ufunc.__name__}(..., out=): the result shape {shape} does not fit out's shape "
            f"{tshape}"
        )
    fn = functools.partial(_inplace_call, ufunc, kwargs)
    push(
        ns,
        fn,
        (target, *operands),
        (),
        device,
        ufunc.__name__,
        _meta.prod(tshape),
        target=target,
    )
    return target


def _multi(ns: Namespace, ufunc: np.ufunc, inputs: tuple[Any, ...]) -> tuple[Array, ...]:
    operands = tuple(operand(ns, a) for a in inputs)
    arrays = [a for a in operands if isinstance(a, Array)]
    device = check_same(ns, arrays)
    shape = broadcast(*(known_shape(a) for a in arrays))
    dtypes = _meta.sample_dtype(
        ufunc, [a.dtype if isinstance(a, Array) else a.value for a in operands]
    )
    outs = tuple((shape, d) for d in dtypes)
    return push(ns, ufunc, operands, outs, device, ufunc.__name__, _meta.prod(shape))


_TABLES: dict[type, dict[Callable[..., Any], tuple[str, str]]] = {}


def _table(ns: Namespace) -> dict[Callable[..., Any], tuple[str, str]]:
    """NumPy function -> (namespace path, name): built once per namespace class, from the
    names both have (the classes come from ``ns``: this module is imported by the
    namespace's, not the reverse)."""
    table = _TABLES.get(type(ns))
    if table is None:
        table = _TABLES[type(ns)] = _build_table(type(ns), type(ns.linalg), type(ns.fft))
    return table


def _build_table(
    namespace: type, linalg: type, fft: type
) -> dict[Callable[..., Any], tuple[str, str]]:
    table: dict[Callable[..., Any], tuple[str, str]] = {}
    for module, cls, path in (
        (np, namespace, ""),
        (np.linalg, linalg, "linalg"),
        (np.fft, fft, "fft"),
    ):
        for name in dir(cls):
            if name.startswith("_"):
                continue
            fn = getattr(module, name, None)
            if callable(fn) and not isinstance(fn, np.ufunc | type):
                table[fn] = (path, name)
    for np_name, ns_name in _ALIASES.items():
        fn = getattr(np, np_name, None)
        if callable(fn) and not isinstance(fn, np.ufunc):
            table.setdefault(fn, ("", ns_name))
    return table


def _convert(ns: Namespace, value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ns.asarray(value)
    if isinstance(value, list | tuple) and any(isinstance(v, Array | np.ndarray) for v in value):
        return type(value)(_convert(ns, v) for v in value)
    return value


def array_function(
    ns: Namespace,
    func: Callable[..., Any],
    types: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``__array_function__`` of the arrays of ``ns``."""
    entry = _table(ns).get(func)
    if entry is None:
        return NotImplemented
    path, name = entry
    target = getattr(getattr(ns, path) if path else ns, name)
    try:
        np_sig = inspect.signature(func)
        bound = np_sig.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return target(*(_convert(ns, a) for a in args), **kwargs)
    ns_sig = inspect.signature(target)
    params = list(ns_sig.parameters.values())
    npos = sum(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in params)
    var = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    given = list(bound.arguments.items())
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    for i, (key, value) in enumerate(given):
        kind = np_sig.parameters[key].kind
        if kind is inspect.Parameter.VAR_POSITIONAL and var:
            positional.extend(value)
            continue
        if kind is inspect.Parameter.VAR_KEYWORD:
            keywords.update(value)
            continue
        if i < npos:
            positional.append(value)
            continue
        key = _KEYWORDS.get(key, key)
        if key in ns_sig.parameters:
            keywords[key] = value
        elif value is not None and value is not np._NoValue:
            raise TypeError(
                f"numpy.{func.__name__}(..., {key}=) is not supported on aioengine arrays "
                f"(the namespace's {name} takes {', '.join(ns_sig.parameters)})"
            )
    if name == "permute_dims" and keywords.get("axes") is None and positional:
        keywords["axes"] = tuple(reversed(range(positional[0].ndim)))  # np.transpose(x)
    return target(
        *(_convert(ns, a) for a in positional), **{k: _convert(ns, v) for k, v in keywords.items()}
    )
